"""The fake pyxis SPANK plugin (tests/launch/fake_pyxis.c) for the Slurm test cluster: compiled against
Debian's libslurm-dev (`slurm/spank.h`, the same Slurm release as slurmd: SPANK plugins must be) and
loaded through a plugstack.conf that slurm.conf names (PlugStackConfig). Beside it, bin/enroot: the
fake `enroot list|remove` (tests/launch/fake_enroot.sh) over the node's containers, for a job's PATH."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_pyxis.c")
FAKE_ENROOT = Path(__file__).with_name("fake_enroot.sh")
SPANK_H = Path("/usr/include/slurm/spank.h")


def runtime_path(plugstack: Path) -> Path:
    """Where the plugin keeps each node's containers: <runtime_path>/<uid>/<node>/pyxis_<name>."""
    return plugstack.parent / "run"


def enroot_bin(plugstack: Path) -> Path:
    """The directory holding the fake `enroot` (put it on a job's PATH)."""
    return plugstack.parent / "bin"


def build(dest: Path) -> tuple[Path | None, str]:
    """Compile the plugin into `dest` and write `dest`/plugstack.conf naming it; (that file, "") or
    (None, why not)."""
    if not shutil.which("gcc") or not SPANK_H.is_file():
        return None, "the fake pyxis plugin needs gcc and libslurm-dev (apt-get install gcc libslurm-dev)"
    dest.mkdir(parents=True, exist_ok=True)
    so = dest / "fake_pyxis.so"
    r = subprocess.run(
        ["gcc", "-Wall", "-Werror", "-Wno-unused-parameter", "-shared", "-fPIC", "-o", str(so), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0:
        return None, f"gcc failed on {SOURCE.name}: {r.stderr.strip()[-500:]}"
    conf = dest / "plugstack.conf"
    # required, as pyxis's README installs it: spank(8), a required plugin's failure fails the step (an
    # optional one's is only logged: a failed import ran the tasks on the host, seen only as the image's
    # variables missing from env.json); runtime_path: where images are unpacked
    conf.write_text(f"required {so} runtime_path={runtime_path(conf)}\n")
    # each user's images in runtime_path/<uid>/<node> (enroot's data path is per user): every user makes theirs
    runtime_path(conf).mkdir(mode=0o1777, exist_ok=True)
    runtime_path(conf).chmod(0o1777)
    enroot_bin(conf).mkdir(exist_ok=True)
    enroot = enroot_bin(conf) / "enroot"  # enroot's data path is per node: the node's hostname (n1, n2)
    enroot.write_text(
        f'#!/bin/sh\nENROOT_DATA_PATH={shlex.quote(str(runtime_path(conf)))}/"$(id -u)/$(hostname)"\n'
        f'export ENROOT_DATA_PATH\nexec {shlex.quote(str(FAKE_ENROOT))} "$@"\n'
    )
    enroot.chmod(0o755)
    return conf, ""
