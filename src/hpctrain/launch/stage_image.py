"""`container.stage_image`: every task starts from a node-local copy of the SIF, not from the shared one.

128 `apptainer exec` of one SIF on Lustre read it 128 times at once; with staging one copier per
node reads it (16 reads for 16 nodes), and a node that holds an up-to-date copy reads nothing.
The batch shell runs the copier as one srun step with one task per node before the training step:
it runs on each node, so it can check that node's own disk (free space, an earlier copy) and expand
the directory with that node's variables ($TMPDIR); sbcast, which sends the file from the batch
host, can do neither (docs/runtimes.md, "Staging the image").

The copier follows data.stage_to's rules (data/stage.py) in bash, since the host may have no Python
that runs hpctrain (its Python is the image's): a lock file per copy (`flock`: two jobs on a node
copy once), a copy is up to date when its size and mtime equal the source's (the copy keeps the
source's mtime, so clocks do not matter), free space is checked before the first byte, the copy is
written to `.part` and renamed, and sizes print as data.meter.fmt_bytes does. pyxis needs no copy:
a per-job --container-name (container.pyxis_lines) makes enroot unpack the image once per node.
"""

from __future__ import annotations

import shlex

from hpctrain.launch.container import local_image_line, stage_word

# Run on each node by `bash -c`; @CHECKS@ and @LOCAL@ are filled by copy_program.
COPY = r"""node=${SLURMD_NODENAME:-$(hostname)}
fail() { echo "hpctrain: container.stage_image on $node: $*" >&2; exit 1; }
fmt() { awk -v n="$1" 'BEGIN { if (n >= 1e9) printf "%.1f GB", n / 1e9; else if (n >= 1e6) printf "%.1f MB", n / 1e6;
  else if (n >= 1e3) printf "%.1f kB", n / 1e3; else printf "%d B", n }'; }
@CHECKS@
src=$HPCTRAIN_IMAGE
@LOCAL@
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
"""


def copy_program(stage_image_to: str) -> str:
    """The copier, a bash program run once on each node with $HPCTRAIN_IMAGE set."""
    _, names = stage_word(stage_image_to)
    checks = "".join(f'[ -n "${{{n}:-}}" ] || fail "container.stage_image_to names \\${n}, which is not set here: '
                     f'set it, or give another directory"\n' for n in names)
    return COPY.replace("@CHECKS@\n", checks).replace("@LOCAL@", local_image_line(stage_image_to))


def batch_lines(stage_image_to: str) -> list[str]:
    """The batch shell's copy step (apptainer and singularity only), before the training step."""
    return [
        "# Image staging (container.stage_image): one task per node copies the SIF to node-local disk",
        "# (skipped where an up-to-date copy is), and each task starts from its node's copy: the shared",
        "# file system sees one read per node, not one per task (launch/stage_image.py).",
        "case $CONTAINER in apptainer|singularity)",
        f"  hpctrain_stage_image={shlex.quote(copy_program(stage_image_to))}",
        '  srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 '
        '--kill-on-bad-exit=1 bash -c "$hpctrain_stage_image" hpctrain-stage-image || { echo "hpctrain: staging '
        '$HPCTRAIN_IMAGE to node-local disk failed (above); set container.stage_image false to read it in place" >&2; '
        "exit 1; } ;;",
        "esac",
    ]
