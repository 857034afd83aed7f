# shellcheck shell=bash
export HPCTRAIN_SOURCE
if [ -n "$HPCTRAIN_SOURCE" ] && [ ! -d "$HPCTRAIN_SOURCE" ]; then
  echo "hpctrain: HPCTRAIN_SOURCE=$HPCTRAIN_SOURCE is not a directory on this node (the job's directory must be" \
    "on a file system the nodes see; HPCTRAIN_SOURCE= runs the hpctrain that the tasks' Python finds)" >&2
  exit 1
fi
