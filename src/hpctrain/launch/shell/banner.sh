# shellcheck shell=bash
echo "hpctrain: job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}:" \
  "${SLURM_NNODES:-?} nodes x ${SLURM_NTASKS_PER_NODE:-?} tasks; modules: ${LOADEDMODULES:-none};" \
  "python: ${HPCTRAIN_PYTHON[*]}"
