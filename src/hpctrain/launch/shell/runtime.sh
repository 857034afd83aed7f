# shellcheck shell=bash
# summary: start Python the way $CONTAINER says: the function of that runtime, defined above
# One function per runtime of the registry (site/runtimes/), hpctrain_runtime_<name>, each setting
# $HPCTRAIN_PYTHON (and $HPCTRAIN_SRUN_CONTAINER); hpctrain_runtimes lists them for the error.
if ! declare -F "hpctrain_runtime_$CONTAINER" >/dev/null; then
  echo "hpctrain: CONTAINER=$CONTAINER is not one of ${hpctrain_runtimes:?}" >&2
  exit 1
fi
"hpctrain_runtime_$CONTAINER"
