# shellcheck shell=bash disable=SC2154  # a part of the batch script: hpctrain_stage_image comes before it
# Image staging (container.stage_image): one task per node copies the SIF to node-local disk
# (skipped where an up-to-date copy is), and each task starts from its node's copy: the shared
# file system sees one read per node, not one per task (launch/stage_image.py).
case $CONTAINER in apptainer|singularity)
  srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
    bash -c "$hpctrain_stage_image" hpctrain-stage-image || {
    echo "hpctrain: staging $HPCTRAIN_IMAGE to node-local disk failed (above);" \
      "set container.stage_image false to read it in place" >&2
    exit 1
  } ;;
esac
