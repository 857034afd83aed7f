"""Inside an image: what leaks in from the host (~/.local), whether RDMA devices and a verbs
provider are visible; outside: which container runtimes this node has."""

from __future__ import annotations

import glob
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from hpctrain.doctor.checks import Check
from hpctrain.doctor.fabric import IBPort
from hpctrain.site import runtimes


def in_container(env: Mapping[str, str]) -> bool:
    return bool(env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER")) or Path("/.singularity.d").is_dir()


def container_checks(env: Mapping[str, str], ports: list[IBPort], inside: bool, root: str = "/") -> list[Check]:
    """~/.local leaks, /dev/infiniband and the verbs provider (checked outside too when IB is up)."""
    checks = []
    home = env.get("HOME", "")
    user_site = Path(home, ".local/lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
    leaked = sorted(p.name for p in user_site.glob("*")) if home and user_site.is_dir() else []
    if inside:
        if leaked and env.get("PYTHONNOUSERSITE", "") in ("", "0"):
            checks.append(
                Check(
                    "container",
                    "~/.local",
                    "warn",
                    f"{len(leaked)} entries in {user_site} shadow the image: {', '.join(leaked[:5])}",
                    "export PYTHONNOUSERSITE=1 (the hpctrain recipes set it) or run with --no-home",
                )
            )
        else:
            checks.append(
                Check("container", "~/.local", "ok", "PYTHONNOUSERSITE=1" if leaked else "no user site-packages")
            )
    active = any(p.state == "ACTIVE" for p in ports)
    dev = sorted(Path(root, "dev/infiniband").glob("uverbs*"))
    if inside or active:
        if dev:
            checks.append(Check("container", "/dev/infiniband", "ok", ", ".join(d.name for d in dev)))
        else:
            checks.append(
                Check(
                    "container",
                    "/dev/infiniband",
                    "warn" if active else "info",
                    "not visible",
                    "RDMA devices are not reachable here: NCCL will use TCP; apptainer binds "
                    "/dev by default — check `--contain`/`--no-mount dev`"
                    if inside
                    else "RDMA devices are not reachable here: NCCL will use TCP",
                )
            )
        providers = (
            glob.glob(str(Path(root, "usr/lib/*/libibverbs/lib*-rdmav*.so")))
            + glob.glob(str(Path(root, "usr/lib64/libibverbs/lib*-rdmav*.so")))
            + glob.glob(str(Path(root, "etc/libibverbs.d/*.driver")))
        )
        names = sorted({re.sub(r"^lib|-rdmav\d+\.so$|\.driver$", "", Path(p).name) for p in providers})
        if names:
            mlx = [n for n in names if n.startswith("mlx")]
            checks.append(
                Check(
                    "container",
                    "verbs provider",
                    "ok" if mlx or not active else "warn",
                    ", ".join(names),
                    "" if mlx or not active else "no mlx4/mlx5 provider",
                )
            )
        else:
            checks.append(
                Check(
                    "container",
                    "verbs provider",
                    "fail" if active else "info",
                    "none",
                    "install rdma-core's ibverbs-providers in the image (NGC images have it); "
                    "without it NCCL silently falls back to TCP sockets",
                )
            )
    return checks


def runtime_checks() -> list[Check]:
    """The container runtimes this node has (each runtime's `detect`, site/runtimes/): what
    container.runtime can be here."""
    found = runtimes.detect()
    if not found:
        return [
            Check(
                "container",
                "runtime",
                "info",
                f"none of {', '.join(r.name for r in runtimes.image_runtimes())} on PATH",
                "tasks run on the host's Python (container.runtime none), or `module load` the "
                "site's apptainer/singularity first",
            )
        ]
    return [Check("container", f"runtime {f.runtime}", "ok", f.evidence) for f in found]
