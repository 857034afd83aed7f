# shellcheck shell=bash disable=SC2034,SC2154  # a part of a per-node program: hpctrain_image_dir comes before it
hpctrain_local=$hpctrain_image_dir/hpctrain-"$(printf %s "$HPCTRAIN_IMAGE" | cksum | cut -d " " -f 1)-${HPCTRAIN_IMAGE##*/}"
