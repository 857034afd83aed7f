# shellcheck shell=bash
# summary: container.stage_image, per node: copy the image to node-local disk and report
node=${SLURMD_NODENAME:-$(hostname)}
report() {  # this node's outcome for the batch shell (stage_step.sh): "ok" or why not
  if [ -n "${HPCTRAIN_STAGE_REPORT:-}" ]; then printf '%s\n' "$1" > "$HPCTRAIN_STAGE_REPORT/$node" || true; fi
}
fail() { echo "hpctrain: container.stage_image on $node: $*" >&2; report "$*"; exit 1; }
skip() {  # no staging on this node, and no failed job: its tasks read the shared image (image_swap.sh)
  echo "hpctrain: image staging skipped on $node: $*" >&2; report "skip $*"; exit 0
}
fmt() { awk -v n="$1" 'BEGIN { if (n >= 1e9) printf "%.1f GB", n / 1e9; else if (n >= 1e6) printf "%.1f MB", n / 1e6;
  else if (n >= 1e3) printf "%.1f kB", n / 1e3; else printf "%d B", n }'; }
for n in "${hpctrain_image_dir_needs[@]}"; do
  [ -n "${!n:-}" ] || fail "container.stage_image_to names \$$n, which is not set here: set it, or give another directory"
done
src=$HPCTRAIN_IMAGE
dir=$hpctrain_image_dir
mkdir -p -- "$dir" || fail "cannot create $dir: point container.stage_image_to at a writable node-local directory"
# this user's own directory (/tmp is every user's): made 0700 here; one that another user made first,
# or that others can write, is not used (a file planted there would run as this user's image): any
# user can make that name on a node, so it skips staging there rather than failing the job
mkdir -m 700 -- "$hpctrain_udir" 2>/dev/null || true
why=$(hpctrain_dir_problem "$hpctrain_udir")
[ -z "$why" ] || skip "$why: the staged image must be in a directory only you can write, so this node's tasks \
read $src; to stage there, have $hpctrain_udir removed (its owner or root), or point container.stage_image_to \
at a directory of your own"
read -r size mtime < <(stat -L -c '%s %Y' -- "$src") || fail "cannot read $src (HPCTRAIN_IMAGE)"
exec 9>> "$hpctrain_local.lock" || fail "cannot write $hpctrain_local.lock"
flock 9 || fail "$dir refuses file locks: stage to a node-local disk such as /tmp, not a shared file system"
# the lock holds the bytes this copy takes (other copiers count them) and its mtime is the copy's last use
printf '%s\n' "$size" > "$hpctrain_local.lock"
# The directory's lock, for the clean-up and the free-space check: a copy whose last staging is
# container.stage_image_keep_days old (no job of this user has staged it since; none holds its lock
# now) is removed; a .part whose copier is gone is removed; a .part in progress counts as the bytes it
# still needs, so two jobs staging different images do not both pass the check and then run out of space.
exec 8>> "$hpctrain_udir/.lock" && flock 8 || fail "cannot lock $hpctrain_udir/.lock"
now=$(date +%s)
for l in "$hpctrain_udir"/*.lock; do
  c=${l%.lock}
  [ -f "$l" ] && [ "$c" != "$hpctrain_local" ] || continue
  age=$(( now - $(stat -c %Y -- "$l") ))
  [ "$age" -ge $(( hpctrain_keep_days * 86400 )) ] || continue
  if flock -n "$l" rm -f -- "$c" "$c.id" "$c.part" "$l"; then
    echo "hpctrain: removed the staged image $c on $node: not staged for $(( age / 86400 )) day(s)" \
      "(container.stage_image_keep_days=$hpctrain_keep_days)"
  fi
done
why=$(hpctrain_copy_problem)
if [ -z "$why" ]; then
  report ok
  echo "hpctrain: image staging skipped on $node: $hpctrain_local is a copy of $src ($(fmt "$size"); size, \
mtime and identity match)"
  exit 0
fi
rm -f -- "$hpctrain_local" "$hpctrain_local.id" "$hpctrain_local.part"
busy=0
for part in "$hpctrain_udir"/*.part; do
  [ -f "$part" ] || continue
  l=${part%.part}.lock
  flock -n "$l" rm -f -- "$part" && continue  # its copier is gone
  want=$(head -c 32 -- "$l" 2>/dev/null) cur=$(stat -c %s -- "$part" 2>/dev/null || echo 0)
  if [[ $want =~ ^[0-9]+$ ]] && [ "$want" -gt "$cur" ]; then busy=$(( busy + want - cur )); fi
done
free=$(df -P -B1 -- "$dir" | awk 'NR == 2 { print $4 }')
free=${free:-0}
[ "$size" -le $(( free - busy )) ] || fail "$dir needs $size bytes ($(fmt "$size")) for $src but its file system has \
$free bytes ($(fmt "$free")) free$( [ "$busy" = 0 ] || echo ", $busy ($(fmt "$busy")) of them promised to copies \
in progress"): point container.stage_image_to at a larger node-local disk, free space there, or set \
container.stage_image false to read the image in place"
: > "$hpctrain_local.part"  # counted by the next copier's check from here on
exec 8>&-
echo "hpctrain: staging $src to $hpctrain_local on $node: $(fmt "$size"), $(fmt "$((free - busy))") free there"
if [ "$(stat -f -c %T -- "$hpctrain_udir")" = tmpfs ]; then
  mem=${SLURM_MEM_PER_NODE:+$(( SLURM_MEM_PER_NODE * 1048576 ))}
  echo "hpctrain: note: $dir on $node is a tmpfs: the copy ($(fmt "$size")) is RAM, charged to this job's memory \
cgroup${mem:+ (the job may use $(fmt "$mem") on this node)}, and it stays in RAM after the job until a later \
staging removes it (container.stage_image_keep_days); container.stage_image_to on a local disk avoids both"
fi
t0=$(date +%s%N)
cp -- "$src" "$hpctrain_local.part" || { rm -f -- "$hpctrain_local.part"; fail "copying $src to $hpctrain_local.part failed"; }
got=$(stat -c %s -- "$hpctrain_local.part")
[ "$got" = "$size" ] || fail "$src changed size while it was staged ($size -> $got bytes): is the image being rebuilt?"
touch -d "@$mtime" -- "$hpctrain_local.part" && hpctrain_image_id > "$hpctrain_local.id" &&
  mv -f -- "$hpctrain_local.part" "$hpctrain_local" || fail "cannot finish $hpctrain_local"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
report ok
echo "hpctrain: staged $(fmt "$size") to $hpctrain_local on $node in $(awk -v t="$ms" 'BEGIN { printf "%.1f", \
t / 1000 }') s"
