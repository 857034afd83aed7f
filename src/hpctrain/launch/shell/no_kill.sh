# shellcheck shell=bash
# summary: refuse HPCTRAIN_SPARE_NODES or HPCTRAIN_MIN_NODES in a script rendered without #SBATCH --no-kill
# Spares need #SBATCH --no-kill (a failed node leaves the job instead of ending it), and this script was
# rendered without it (no slurm.spare_nodes). Nor can the shell see an `sbatch --no-kill`: Slurm sends
# no client the job's kill_on_node_fail (not in `scontrol show job`, 22.05-24.11; docs/spares.md).
if [ "${HPCTRAIN_MIN_NODES:-0}" != 0 ]; then
  echo "hpctrain: HPCTRAIN_MIN_NODES=$HPCTRAIN_MIN_NODES, but this script has no #SBATCH --no-kill: a node failure" \
    "would still end the job, so it cannot go on with fewer nodes; render it with --nodes MIN-MAX" \
    "(hpctrain submit --emit-sbatch), or unset HPCTRAIN_MIN_NODES" >&2
  exit 1
fi
if [ "${HPCTRAIN_SPARE_NODES:-0}" != 0 ]; then
  echo "hpctrain: HPCTRAIN_SPARE_NODES=$HPCTRAIN_SPARE_NODES, but this script has no #SBATCH --no-kill: a node" \
    "failure would still end the job and the spares would only cost; render it with --spare-nodes" \
    "$HPCTRAIN_SPARE_NODES (hpctrain submit --emit-sbatch), or unset HPCTRAIN_SPARE_NODES" >&2
  exit 1
fi
