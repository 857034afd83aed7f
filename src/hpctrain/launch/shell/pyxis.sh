# shellcheck shell=bash
# summary: pyxis: check the image and that the job's paths fit --container-mounts
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
