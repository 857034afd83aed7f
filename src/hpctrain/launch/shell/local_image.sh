# shellcheck shell=bash
# summary: container.stage_image: where the node's copy of the image lives (this user's own directory)
# The node's copy of $HPCTRAIN_IMAGE lives in a directory of this user's own under the staging
# directory (/tmp is shared by every user of the node): <dir>/hpctrain-<uid>/<cksum of path>-<name>.
hpctrain_uid=$(id -u)
hpctrain_udir=$hpctrain_image_dir/hpctrain-$hpctrain_uid
hpctrain_local=$hpctrain_udir/"$(printf %s "$HPCTRAIN_IMAGE" | cksum | cut -d " " -f 1)-${HPCTRAIN_IMAGE##*/}"
hpctrain_dir_problem() {  # why $1 is not a directory that only this user can write ('' when it is)
  local owner mode
  if [ -L "$1" ] || [ ! -d "$1" ]; then echo "$1 is not a directory"; return; fi
  read -r owner mode < <(stat -c '%u %a' -- "$1")
  if [ "$owner" != "$hpctrain_uid" ]; then echo "$1 belongs to uid $owner, not to this job's uid $hpctrain_uid"
  elif (( 8#$mode & 8#022 )); then echo "$1 is group- or other-writable (mode $mode)"; fi
}
hpctrain_image_id() {  # the image's identity: the site's HPCTRAIN_IMAGE_DIGEST, else image_identity.sh's stat checksum
  printf '%s\n' "${HPCTRAIN_IMAGE_DIGEST:-img$(printf "%s %s" "$HPCTRAIN_IMAGE" \
    "$(stat -Lc "%s %Y" "$HPCTRAIN_IMAGE" 2>/dev/null)" | cksum | cut -d " " -f 1)}"
}
hpctrain_copy_problem() {  # why $hpctrain_local is not this user's copy of $HPCTRAIN_IMAGE ('' when it is)
  local why src got
  why=$(hpctrain_dir_problem "$hpctrain_udir")
  if [ -n "$why" ]; then echo "$why"; return; fi
  if [ -L "$hpctrain_local" ] || [ ! -f "$hpctrain_local" ]; then echo "no staged copy $hpctrain_local"; return; fi
  src=$(stat -L -c '%s %Y' -- "$HPCTRAIN_IMAGE" 2>/dev/null)
  got=$(stat -c '%u %s %Y' -- "$hpctrain_local")
  if [ "$got" != "$hpctrain_uid $src" ]; then
    echo "$hpctrain_local (uid, size, mtime: $got) is not this uid's copy of $HPCTRAIN_IMAGE (size, mtime: $src)"
  elif [ "$(cat -- "$hpctrain_local.id" 2>/dev/null)" != "$(hpctrain_image_id)" ]; then
    echo "$hpctrain_local.id does not hold the image identity $(hpctrain_image_id)"
  fi
}
