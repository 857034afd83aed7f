# shellcheck shell=bash
# summary: the pack array task: say which group it packs; hpctrain_run starts it (through srun where the runtime asks)
echo "hpctrain: pack group ${SLURM_ARRAY_TASK_ID:?not an array task} of ${hpctrain_groups:?} on $(hostname) (job ${SLURM_ARRAY_JOB_ID:-?})"
hpctrain_run() {  # the task's command as given; a runtime with srun options (pyxis): srun puts the task in the image
  if [ "${#HPCTRAIN_SRUN_CONTAINER[@]}" -gt 0 ]; then
    hpctrain_slurm -1 srun --ntasks=1 "${HPCTRAIN_SRUN_CONTAINER[@]}" "$@"  # ctld.sh: logged, as every call
  else
    "$@"
  fi
}
