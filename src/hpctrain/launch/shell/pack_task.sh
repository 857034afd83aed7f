# shellcheck shell=bash
# summary: the pack array task: say which group it packs; hpctrain_run starts it (through srun for pyxis)
echo "hpctrain: pack group ${SLURM_ARRAY_TASK_ID:?not an array task} of ${hpctrain_groups:?} on $(hostname) (job ${SLURM_ARRAY_JOB_ID:-?})"
hpctrain_run() {  # the task's command as given; pyxis has no wrapper command: srun puts the task in the image
  if [ "$CONTAINER" = pyxis ]; then srun --ntasks=1 "${HPCTRAIN_SRUN_CONTAINER[@]}" "$@"; else "$@"; fi
}
