# shellcheck shell=bash
# summary: fakert (a test's runtime): stop if the image is missing, start Python through `fakert run`
if [ ! -f "$HPCTRAIN_IMAGE" ]; then
  echo "hpctrain: fakert image $HPCTRAIN_IMAGE not found on this node" >&2
  exit 1
fi
HPCTRAIN_PYTHON=(fakert run)
for hpctrain_b in ${hpctrain_fakert_binds[@]+"${hpctrain_fakert_binds[@]}"}; do
  HPCTRAIN_PYTHON+=(--bind "$hpctrain_b")
done
if [ -n "$HPCTRAIN_SOURCE" ]; then
  HPCTRAIN_PYTHON+=(--bind "$HPCTRAIN_SOURCE:${hpctrain_fakert_mount:?}/hpctrain:ro")
fi
HPCTRAIN_PYTHON+=("$HPCTRAIN_IMAGE" "${hpctrain_fakert_python:?}")
