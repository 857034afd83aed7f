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
once per node; the batch shell removes those containers (pyxis.clean_lines), which pyxis keeps.
Each runtime says how it stages (its `stage`: the copier is site/runtimes/sif.py's copy_program).
"""

from __future__ import annotations

from hpctrain import shellfile
from hpctrain.site import runtimes
from hpctrain.site.runtimes.base import Container


def batch_lines(c: Container) -> list[str]:
    """What each runtime does to stage `c`'s image (its `stage`: the copy step of apptainer and
    singularity, pyxis's clean-up), after spares.sh (a node whose copy failed is left out when there
    are spares) and before the training step: a function per runtime that stages, hpctrain_stage_<name>,
    called when $CONTAINER names it (shell/stage.sh); runtimes that stage alike share the first one's."""
    first: dict[tuple[str, ...], str] = {}  # each distinct staging: the function that holds it
    out: list[str] = []
    for r in runtimes.REGISTRY.values():
        lines = tuple(r.stage(c))
        if not lines:
            continue
        body = list(lines) if lines not in first else [first[lines]]  # the same steps: call the first's
        first.setdefault(lines, f"hpctrain_stage_{r.name}")
        out += shellfile.function(f"hpctrain_stage_{r.name}", body)
    return [*out, *shellfile.lines("stage.sh")] if out else []
