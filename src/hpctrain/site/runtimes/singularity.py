"""SingularityCE (Sylabs): `singularity exec` of a .sif; it has no `apptainer` command and reads only
SINGULARITYENV_* under --cleanenv. On an Apptainer site `singularity` is a link to apptainer, which
`--version` tells apart (site/runtimes/sif.py)."""

from __future__ import annotations

from hpctrain.site.runtimes.sif import SifRuntime

RUNTIME = SifRuntime(
    "singularity",
    "SINGULARITYENV_",
    help="SingularityCE's singularity exec of a .sif",
    not_found_hint="`module load` the site's singularity first",
)
