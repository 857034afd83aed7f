# shellcheck shell=bash
# $HPCTRAIN_IMAGE_DIGEST (train.compile_cache keys its entries by it) unless the site set it: a
# checksum of the image's path, size and mtime, a stat, not a hash of gigabytes on a shared file
# system; a registry URI (pyxis) stands for itself. A rebuilt image at the same path gets a new key.
if [ "$CONTAINER" != none ] && [ -z "${HPCTRAIN_IMAGE_DIGEST:-}" ]; then
  HPCTRAIN_IMAGE_DIGEST=img$(printf "%s %s" "$HPCTRAIN_IMAGE" "$(stat -Lc "%s %Y" "$HPCTRAIN_IMAGE" 2>/dev/null)" | cksum | cut -d " " -f 1)
  export HPCTRAIN_IMAGE_DIGEST
fi
