# shellcheck shell=bash
export HPCTRAIN_SOURCE
if [ -n "$HPCTRAIN_SOURCE" ] && [ ! -d "$HPCTRAIN_SOURCE" ]; then
  echo "hpctrain: HPCTRAIN_SOURCE=$HPCTRAIN_SOURCE is not a directory on this node (the job's directory must be" \
    "on a file system the nodes see; HPCTRAIN_SOURCE= runs the hpctrain that the tasks' Python finds)" >&2
  exit 1
fi
# A snapshot (run.source: <root>/code/<hash>/hpctrain/_snapshot.json) runs as this job's user before its
# hash is checked: refuse one another user could have changed since submission (run.owner).
if [ -f "$HPCTRAIN_SOURCE/_snapshot.json" ]; then
  hpctrain_snap=$(cd "$HPCTRAIN_SOURCE/.." && pwd -P)
  hpctrain_writer=$(find "${hpctrain_snap%/*}" -maxdepth 0 \( ! -user "$(id -u)" -o -perm /022 \) -print ||
    echo "${hpctrain_snap%/*}")
  hpctrain_writer=${hpctrain_writer:-$(find "$hpctrain_snap" \( ! -user "$(id -u)" -o -perm /022 -o -type l \) \
    -print -quit || echo "$hpctrain_snap")}
  if [ -n "$hpctrain_writer" ]; then
    echo "hpctrain: the code snapshot $HPCTRAIN_SOURCE can be changed by another user ($hpctrain_writer: owner uid" \
      "$(stat -c %u "$hpctrain_writer"), mode $(stat -c %a "$hpctrain_writer")): check who changed it, then" \
      "remove $hpctrain_snap and submit again" >&2
    exit 1
  fi
fi
