"""Apptainer (the Linux Foundation's continuation of Singularity): `apptainer exec` of a .sif; it
reads APPTAINERENV_* (and SINGULARITYENV_*) under --cleanenv, and installs `singularity` as a link
to itself (site/runtimes/sif.py)."""

from __future__ import annotations

from hpctrain.site.runtimes.sif import SifRuntime

RUNTIME = SifRuntime(
    "apptainer",
    "APPTAINERENV_",
    help="apptainer exec of a .sif",
    not_found_hint="`module load` the site's apptainer first",
)
