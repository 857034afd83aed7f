# shellcheck shell=bash
# summary: print the job's id, restart, nodes, tasks, modules and Python to the job log
echo "hpctrain: job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}:" \
  "${SLURM_NNODES:-?} nodes x $hpctrain_tpn tasks; modules: ${LOADEDMODULES:-none};" \
  "python: ${HPCTRAIN_PYTHON[*]}"
