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
a --container-name per job attempt and image (site/runtimes/pyxis.py) makes enroot unpack the image
once per node; the batch shell removes those containers (pyxis_clean_lines), which pyxis keeps.
"""

from __future__ import annotations

from hpctrain import shellfile
from hpctrain.site.runtimes.base import image_dir_line, stage_word


def copy_program(stage_image_to: str, keep_days: int = 7) -> str:
    """The copier (shell/stage_copy.sh), a bash program run once on each node with $HPCTRAIN_IMAGE set."""
    needs = shellfile.array("hpctrain_image_dir_needs", stage_word(stage_image_to)[1])  # checked before the copy
    keep = f"hpctrain_keep_days={int(keep_days)}"
    return shellfile.program(["local_image.sh", "stage_copy.sh"], [image_dir_line(stage_image_to), needs, keep])


def pyxis_clean_lines() -> list[str]:
    """pyxis: remove this job's named containers on its nodes (shell/pyxis_clean.sh runs
    shell/pyxis_remove.sh on each) at a requeued attempt's start and as the batch shell ends."""
    return [
        shellfile.assign_program("hpctrain_pyxis_remove", shellfile.program(["pyxis_remove.sh"])),
        *shellfile.lines("pyxis_clean.sh"),
    ]


def batch_lines(stage_image_to: str, keep_days: int = 7) -> list[str]:
    """The batch shell's copy step (apptainer and singularity), or pyxis's clean-up, after spares.sh (a
    node whose copy failed is left out when there are spares) and before the training step."""
    return [
        shellfile.assign_program("hpctrain_stage_image", copy_program(stage_image_to, keep_days)),
        *shellfile.lines("stage_step.sh"),
        *pyxis_clean_lines(),
    ]
