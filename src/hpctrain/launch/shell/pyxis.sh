# shellcheck shell=bash
# summary: pyxis: check the image and that the job's paths fit --container-mounts; srun's options for the image
# The values before it (site/runtimes/pyxis.py): hpctrain_mounts (the job's binds as --container-mounts
# entries), hpctrain_mount (where the submitted hpctrain appears), hpctrain_image_python and
# hpctrain_imageenv (the per-task wrapper inside the image: image_env.sh). The job's directory is mounted
# too: it is the tasks' working directory, which Apptainer binds itself.
case $HPCTRAIN_IMAGE in /*|./*|../*)
  if [ ! -f "$HPCTRAIN_IMAGE" ]; then
    echo "hpctrain: image $HPCTRAIN_IMAGE not found (a squashfs made by enroot import, or a registry URI)" >&2
    exit 1
  fi ;;
esac
case $PWD,${HPCTRAIN_SOURCE} in *,*,*|*:*)
  echo "hpctrain: $PWD or $HPCTRAIN_SOURCE holds ',' or ':', which pyxis's --container-mounts cannot take:" \
    "run the job from another directory" >&2
  exit 1 ;;
esac
hpctrain_mounts="${hpctrain_mounts-}${hpctrain_mounts:+,}$PWD"
if [ -n "$HPCTRAIN_SOURCE" ]; then hpctrain_mounts+=",$HPCTRAIN_SOURCE:${hpctrain_mount:?}/hpctrain:ro"; fi
HPCTRAIN_SRUN_CONTAINER=(--container-image="$HPCTRAIN_IMAGE" --container-mounts="$hpctrain_mounts" --container-workdir="$PWD")
HPCTRAIN_PYTHON=(bash -c "${hpctrain_imageenv:?}" hpctrain-task "${hpctrain_image_python:?}")
