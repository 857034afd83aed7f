# shellcheck shell=bash
# summary: apptainer/singularity: stop if the image is not on this node; <tool> exec --nv --cleanenv per task
# The values before it (site/runtimes/sif.py): hpctrain_exec (`<tool> exec --nv --cleanenv --bind ...`),
# hpctrain_prefix (the variables the tool turns into X inside the image under --cleanenv: APPTAINERENV_,
# SINGULARITYENV_), hpctrain_mount (where the submitted hpctrain appears), hpctrain_image_python,
# hpctrain_staged (container.stage_image: 1) and hpctrain_cleanenv (the per-task wrapper: cleanenv.sh).
if [ ! -f "$HPCTRAIN_IMAGE" ]; then
  echo "hpctrain: image $HPCTRAIN_IMAGE not found on this node: put it there, or resubmit with" \
    "--cluster-set container.image=PATH (in slurm/vit.sbatch, HPCTRAIN_IMAGE=PATH or CONTAINER=none)" >&2
  exit 1
fi
if [ -n "${hpctrain_staged-}" ]; then export HPCTRAIN_IMAGE; fi  # each task finds its node's staged copy by it
HPCTRAIN_PYTHON=(bash -c "${hpctrain_cleanenv:?}" hpctrain-task "${hpctrain_exec[@]}")
export "${hpctrain_prefix:?}PYTHONNOUSERSITE=1"
if [ -n "$HPCTRAIN_SOURCE" ]; then  # the submitted hpctrain, ahead of the image's copy
  HPCTRAIN_PYTHON+=(--bind "$HPCTRAIN_SOURCE:${hpctrain_mount:?}/hpctrain:ro")
  export "${hpctrain_prefix}PYTHONPATH=$hpctrain_mount"
fi
HPCTRAIN_PYTHON+=("$HPCTRAIN_IMAGE" "${hpctrain_image_python:?}")
