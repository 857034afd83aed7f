# shellcheck shell=bash disable=SC2154  # a per-node program: its values and local_image.sh come before it (launch/stage_image.py)
node=${SLURMD_NODENAME:-$(hostname)}
fail() { echo "hpctrain: container.stage_image on $node: $*" >&2; exit 1; }
fmt() { awk -v n="$1" 'BEGIN { if (n >= 1e9) printf "%.1f GB", n / 1e9; else if (n >= 1e6) printf "%.1f MB", n / 1e6;
  else if (n >= 1e3) printf "%.1f kB", n / 1e3; else printf "%d B", n }'; }
for n in "${hpctrain_image_dir_needs[@]}"; do
  [ -n "${!n:-}" ] || fail "container.stage_image_to names \$$n, which is not set here: set it, or give another directory"
done
src=$HPCTRAIN_IMAGE
dir=${hpctrain_local%/*}
mkdir -p -- "$dir" || fail "cannot create $dir: point container.stage_image_to at a writable node-local directory"
read -r size mtime < <(stat -L -c '%s %Y' -- "$src") || fail "cannot read $src (HPCTRAIN_IMAGE)"
exec 9> "$hpctrain_local.lock" || fail "cannot write $hpctrain_local.lock"
flock 9 || fail "$dir refuses file locks: stage to a node-local disk such as /tmp, not a shared file system"
if [ -f "$hpctrain_local" ] && [ "$(stat -c '%s %Y' -- "$hpctrain_local")" = "$size $mtime" ]; then
  echo "hpctrain: image staging skipped on $node: $hpctrain_local is a copy of $src ($(fmt "$size"); size and \
mtime match)"
  exit 0
fi
rm -f -- "$hpctrain_local" "$hpctrain_local.part"
free=$(df -P -B1 -- "$dir" | awk 'NR == 2 { print $4 }')
[ "$size" -le "${free:-0}" ] || fail "$dir needs $size bytes ($(fmt "$size")) for $src but its file system has \
${free:-0} bytes ($(fmt "${free:-0}")) free: point container.stage_image_to at a larger node-local disk, free \
space there, or set container.stage_image false to read the image in place"
echo "hpctrain: staging $src to $hpctrain_local on $node: $(fmt "$size"), $(fmt "$free") free there"
t0=$(date +%s%N)
cp -- "$src" "$hpctrain_local.part" || fail "copying $src to $hpctrain_local.part failed"
got=$(stat -c %s -- "$hpctrain_local.part")
[ "$got" = "$size" ] || fail "$src changed size while it was staged ($size -> $got bytes): is the image being rebuilt?"
touch -d "@$mtime" -- "$hpctrain_local.part" && mv -f -- "$hpctrain_local.part" "$hpctrain_local" || fail "cannot \
finish $hpctrain_local"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "hpctrain: staged $(fmt "$size") to $hpctrain_local on $node in $(awk -v t="$ms" 'BEGIN { printf "%.1f", \
t / 1000 }') s"
