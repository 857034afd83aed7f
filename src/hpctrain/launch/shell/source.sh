# shellcheck shell=bash
# summary: the code snapshot the tasks run: export HPCTRAIN_SOURCE, no bytecode, refuse a snapshot others can change
export HPCTRAIN_SOURCE
# No task writes bytecode (__pycache__/) anywhere, the code snapshot least: whatever the user's
# environment and umask, an attempt leaves the snapshot as it was hashed (run.source).
export PYTHONDONTWRITEBYTECODE=1
if [ -n "$HPCTRAIN_SOURCE" ] && [ ! -d "$HPCTRAIN_SOURCE" ]; then
  echo "hpctrain: HPCTRAIN_SOURCE=$HPCTRAIN_SOURCE is not a directory on this node (the job's directory must be" \
    "on a file system the nodes see; in slurm/vit.sbatch HPCTRAIN_SOURCE= runs the hpctrain the tasks' Python finds)" >&2
  exit 1
fi
# The resolved path is what the tasks import and the image binds: a link on the way, changed after
# this check, cannot point them elsewhere. Its last name stays (Python imports the package by it; in a
# snapshot it is a directory, the check below refuses a link).
if [ -n "$HPCTRAIN_SOURCE" ]; then
  HPCTRAIN_SOURCE=${HPCTRAIN_SOURCE%/}
  hpctrain_up=$(cd "$HPCTRAIN_SOURCE/.." && pwd -P)
  HPCTRAIN_SOURCE=${hpctrain_up%/}/${HPCTRAIN_SOURCE##*/}
fi
# A snapshot (run.source: <root>/code/<hash>/hpctrain/_snapshot.json) runs as this job's user before its
# hash is checked: refuse one another user could have changed since submission (run.owner), one that
# holds a file Python could import that the hash does not cover (a .pyc, a __pycache__/, an extension
# module), and one under a directory every user may write without the sticky bit (they could rename
# its way to the snapshot and put their own in place). Run at every attempt and before every
# in-job restart (step_start.sh); 0 for a directory that is no snapshot.
hpctrain_check_snapshot() {
  local snap writer why fix
  [ -f "$HPCTRAIN_SOURCE/_snapshot.json" ] || return 0
  snap=${HPCTRAIN_SOURCE%/*}
  writer=$(find "${snap%/*}" -maxdepth 0 \( ! -user "$(id -u)" -o -perm /022 \) -print || echo "${snap%/*}")
  writer=${writer:-$(find "$snap" \( ! -user "$(id -u)" -o -perm /022 -o -type l \) -print -quit || echo "$snap")}
  if [ -n "$writer" ]; then
    why="$writer: owner uid $(stat -c %u "$writer"), mode $(stat -c %a "$writer")"
  else
    writer=$(find "$snap" -mindepth 1 -maxdepth 1 ! -name hpctrain -print -quit || echo "$snap")  # on PYTHONPATH
    writer=${writer:-$(find "$HPCTRAIN_SOURCE" \( -name __pycache__ -o ! -type d \( ! -type f -o ! \( -name '*.py' -o -name '*.yaml' \
      -o -name '*.yml' -o -name _snapshot.json \) \) \) -print -quit || echo "$snap")}
    if [ -n "$writer" ]; then why="$writer: not a source file of the snapshot, which its hash would not cover"; fi
  fi
  fix="check who changed it, then remove $snap (chmod -R u+w $snap && rm -r $snap) and submit again"
  writer=${snap%/*}  # code/, then each directory above it
  while [ -z "$why" ] && [ "$writer" != / ]; do
    writer=${writer%/*} && writer=${writer:-/}
    if [ -n "$(find "$writer" -maxdepth 0 -perm -0002 ! -perm -1000 -print)" ]; then
      why="$writer: mode $(stat -c %a "$writer"), every user may rename what is in it (no sticky bit)"
      fix="chmod o-w (or +t) $writer, or choose a run.dir under directories other users cannot write"
    fi
  done
  if [ -n "$why" ]; then
    echo "hpctrain: the code snapshot $HPCTRAIN_SOURCE can be changed by another user ($why): $fix" >&2
    exit 1
  fi
}
hpctrain_check_snapshot
