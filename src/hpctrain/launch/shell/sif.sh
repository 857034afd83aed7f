# shellcheck shell=bash
if [ ! -f "$HPCTRAIN_IMAGE" ]; then
  echo "hpctrain: image $HPCTRAIN_IMAGE not found (set HPCTRAIN_IMAGE, or CONTAINER=none)" >&2
  exit 1
fi
