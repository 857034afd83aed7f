# shellcheck shell=bash
# summary: apptainer/singularity: stop if the image is not on this node
if [ ! -f "$HPCTRAIN_IMAGE" ]; then
  echo "hpctrain: image $HPCTRAIN_IMAGE not found on this node: put it there, or resubmit with" \
    "--cluster-set container.image=PATH (in slurm/vit.sbatch, HPCTRAIN_IMAGE=PATH or CONTAINER=none)" >&2
  exit 1
fi
