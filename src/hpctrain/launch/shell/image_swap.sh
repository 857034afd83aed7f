# shellcheck shell=bash disable=SC2154  # a per-task program: local_image.sh comes before it
# container.stage_image: the image argument becomes the staged copy on this node; a node without one
# (the copy step never ran there) reads the shared image, and says so
if [ -f "$hpctrain_local" ]; then
  a=("$@") p=""
  for i in "${!a[@]}"; do
    if [ "$p" != --bind ] && [ "${a[i]}" = "$HPCTRAIN_IMAGE" ]; then a[i]=$hpctrain_local; break; fi
    p=${a[i]}
  done
  set -- "${a[@]}"
else
  echo "hpctrain: no staged image $hpctrain_local on $(hostname): this task reads $HPCTRAIN_IMAGE" >&2
fi
