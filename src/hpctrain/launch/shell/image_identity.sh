# shellcheck shell=bash
# summary: HPCTRAIN_IMAGE_DIGEST: a checksum of the image's path, size and mtime (compile cache key)
# hpctrain_image_cksum IMAGE: a checksum of the image's path, size and mtime, a stat, not a hash of
# gigabytes on a shared file system; a registry URI (pyxis; nothing to stat) stands for itself. An
# image rebuilt at the same path gets a new one. Digits only.
hpctrain_image_cksum() {
  printf "%s %s" "$1" "$(stat -Lc "%s %Y" "$1" 2>/dev/null)" | cksum | cut -d " " -f 1
}
# $HPCTRAIN_IMAGE_DIGEST (compile.cache keys its entries by it) unless the site set it.
if [ "$CONTAINER" != none ] && [ -z "${HPCTRAIN_IMAGE_DIGEST:-}" ]; then
  HPCTRAIN_IMAGE_DIGEST=img$(hpctrain_image_cksum "$HPCTRAIN_IMAGE")
  export HPCTRAIN_IMAGE_DIGEST
fi
