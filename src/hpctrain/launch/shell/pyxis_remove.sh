# shellcheck shell=bash
# summary: per node: remove a job's pyxis containers (enroot remove)
# A per-node program (one task of hpctrain_pyxis_clean's step, outside any container): remove job $1's
# pyxis containers on this node, all but the one named $2 if given. `enroot list` prints the names in
# the user's ENROOT_DATA_PATH; pyxis stores --container-name=NAME as pyxis_NAME (container_scope=global)
# or pyxis_<job id>_NAME (container_scope=job), and `enroot remove -f` deletes one (docs/runtimes.md).
node=${SLURMD_NODENAME:-$(hostname)}
job=$1 keep=$2
[[ $job =~ ^[0-9]+$ ]] || { echo "hpctrain: $node: job id '$job' is not a number" >&2; exit 2; }
if ! list=$(enroot list 2>&1); then
  echo "hpctrain: $node: enroot list failed: $(printf '%s' "$list" | tail -n 1 | tr -d '\000-\037' | cut -c1-160)" >&2
  exit 1
fi
rc=0
while IFS= read -r c; do
  [[ $c =~ ^pyxis_(${job}_)?hpctrain-${job}-r[0-9]+-img[0-9]+$ ]] || continue
  if [ -n "$keep" ] && { [ "$c" = "pyxis_$keep" ] || [ "$c" = "pyxis_${job}_$keep" ]; }; then continue; fi
  if out=$(enroot remove -f -- "$c" 2>&1); then
    echo "hpctrain: removed the pyxis container $c on $node"
  else
    echo "hpctrain: $node: enroot remove -f $c failed: $(printf '%s' "$out" | tail -n 1 | tr -d '\000-\037' |
      cut -c1-160)" >&2
    rc=1
  fi
done <<< "$list"
exit "$rc"
