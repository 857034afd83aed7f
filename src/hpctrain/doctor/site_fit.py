"""`doctor --cluster P`: does this node fit what profile P's jobs expect of it — the runtime that
starts each task (on PATH or from P's modules), P's image, P's GPUs per node, P's fabric.

A login node fits less than a compute node (no GPU, often no InfiniBand): where this node has no
GPU a shortfall is information, not a warning; where it has GPUs it is taken for a compute node.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.doctor.checks import Check
from hpctrain.doctor.fabric import IBPort
from hpctrain.site import runtimes
from hpctrain.site.cluster_init import module_init, read_modules
from hpctrain.site.profile import ClusterProfile

SECTION = "profile"


def profile_checks(
    profile: ClusterProfile, gpu_names: list[str], ports: list[IBPort], inside: bool = False
) -> list[Check]:
    """Every check of this node against `profile` (`inside` an image: no runtime is asked for)."""
    compute = bool(gpu_names)
    checks = [] if inside else runtime_fit(profile, runtimes.detect(), compute)
    checks += image_fit(profile, compute)
    checks += [gpu_fit(profile, gpu_names), fabric_fit(profile, ports, compute)]
    return checks


def runtime_fit(profile: ClusterProfile, found: list[runtimes.Found], compute: bool) -> list[Check]:
    """The profile's container.runtime here: on PATH, else from one of its container_modules
    (loaded in a throw-away shell, as the batch script loads them); runtime none: the host's
    Python with the profile's modules."""
    want, name = profile.container.runtime, profile.name
    runtime = runtimes.get(want)
    if not runtime.image_kind:
        return [module_fit(profile.modules, f"profile {name} runs tasks on the host's Python", compute)]
    on_path = {f.runtime: f for f in found}
    if want in on_path:
        return [Check(SECTION, "runtime", "ok", f"{want} (container.runtime): {on_path[want].evidence}")]
    init = module_init() or ""
    providers = {r.module_stem for r in runtimes.image_runtimes() if r.module_stem}
    stems = [m for m in profile.container_modules if m.split("/")[0] in providers]
    from_module = {f.runtime: f for f in runtimes.detect(init, stems)} if init and stems else {}
    if want in from_module:
        return [Check(SECTION, "runtime", "ok", f"{want} (container.runtime): {from_module[want].evidence}")]
    others = ", ".join(sorted({*on_path, *from_module})) or "none"
    mods = ", ".join(profile.container_modules) or "none"
    if not runtime.module_stem:
        hint = runtime.not_found_hint
    else:
        hint = (
            f"on a compute node the job fails: add the module that provides {want} to container_modules "
            f"(`module avail {want}`), or set container.runtime to what the nodes have"
        )
    return [
        Check(
            SECTION,
            "runtime",
            "warn" if compute else "info",
            f"profile {name} starts each task with {want} (container.runtime): not on PATH here, nor "
            f"from its container_modules ({mods}); found: {others}",
            hint,
        )
    ]


def module_fit(modules: list[str], what: str, compute: bool) -> Check:
    """The profile's modules against `module -t avail` here (Lmod's init script)."""
    if not modules:
        return Check(SECTION, "modules", "ok", f"{what}; it loads no module")
    if not module_init():
        return Check(
            SECTION,
            "modules",
            "warn" if compute else "info",
            f"{what} with modules {', '.join(modules)}: no module system here (Lmod's init script)",
            "run `hpctrain doctor --cluster` on a node of the cluster, where `module` works",
        )
    have = read_modules()
    missing = [m for m in modules if m not in have and not any(h.startswith(m + "/") for h in have)]
    if missing:
        return Check(
            SECTION,
            "modules",
            "fail",
            f"{what}; modules not available here: {', '.join(missing)}",
            "the batch script's `module load` fails on them: write the names `module -t avail` lists",
        )
    return Check(SECTION, "modules", "ok", f"{what}; modules {', '.join(modules)} available")


def image_fit(profile: ClusterProfile, compute: bool) -> list[Check]:
    """The profile's container.image: a SIF or squashfs must be a file the nodes see; a registry
    URI (pyxis) is pulled at job start."""
    c = profile.container
    if not runtimes.get(c.runtime).image_kind:
        return []
    if not c.image:
        return [
            Check(
                SECTION,
                "image",
                "fail",
                f"container.runtime {c.runtime} but no container.image",
                "set container.image (a .sif from `hpctrain image build`, or a registry URI for pyxis)",
            )
        ]
    if "#" in c.image or "://" in c.image:
        return [Check(SECTION, "image", "info", f"{c.image} (a registry image: pulled when the job starts)")]
    path = Path(c.image)
    if path.is_file():
        return [Check(SECTION, "image", "ok", f"{c.image} ({path.stat().st_size / 2**30:.1f} GiB)")]
    return [
        Check(
            SECTION,
            "image",
            "fail" if compute else "warn",
            f"{c.image} not on this node",
            "every job of this profile fails unless its nodes see it: build it "
            "(`hpctrain image build RECIPE -o PATH`) on the shared file system, or set container.image",
        )
    ]


def gpu_fit(profile: ClusterProfile, gpu_names: list[str]) -> Check:
    """The GPUs here against slurm.gpus_per_node (a job asks for that many on every node)."""
    s = profile.slurm
    if not s.request_gpus:
        return Check(SECTION, "gpus", "ok", f"profile {profile.name} asks for no GPUs (slurm.request_gpus false)")
    if not gpu_names:
        return Check(
            SECTION,
            "gpus",
            "info",
            f"none here; profile {profile.name}'s jobs ask for {s.gpus_per_node} per node (slurm.gpus_per_node)",
            "fine on a login node; on a compute node check the allocation (--gpus) and the driver",
        )
    n = len(gpu_names)
    if n < s.gpus_per_node:
        return Check(
            SECTION,
            "gpus",
            "warn",
            f"{n} here; profile {profile.name}'s jobs ask for {s.gpus_per_node} per node",
            f"if this node is a whole compute node: set slurm.gpus_per_node: {n} (or --gpus-per-node {n}), "
            "or the job never starts on such nodes",
        )
    return Check(SECTION, "gpus", "ok", f"{n} here; profile {profile.name}'s jobs use {s.gpus_per_node} per node")


def fabric_fit(profile: ClusterProfile, ports: list[IBPort], compute: bool) -> Check:
    """fabric.kind against the ports here: ib/roce wants an ACTIVE port of that link layer; socket
    with ACTIVE InfiniBand ports leaves them unused (NCCL_IB_DISABLE=1)."""
    kind = profile.fabric.kind
    active = [p for p in ports if p.state == "ACTIVE"]
    layer = {"ib": "InfiniBand", "roce": "Ethernet"}
    if kind == "socket":
        if active:
            return Check(
                SECTION,
                "fabric",
                "warn",
                f"fabric.kind socket, but {', '.join(p.name for p in active)} ACTIVE here",
                "the profile exports NCCL_IB_DISABLE=1, so NCCL sends over TCP: set fabric.kind to ib or roce",
            )
        return Check(SECTION, "fabric", "ok", "fabric.kind socket: NCCL over TCP sockets")
    fit = [p for p in active if p.link_layer == layer[kind]]
    if fit:
        return Check(SECTION, "fabric", "ok", f"fabric.kind {kind}: {', '.join(p.name for p in fit)} ACTIVE")
    return Check(
        SECTION,
        "fabric",
        "warn" if compute else "info",
        f"fabric.kind {kind}, but no ACTIVE {layer[kind]} port here",
        "fine on a login node; on a compute node NCCL falls back to TCP sockets: check the ports "
        "(ibstat) and /sys/class/infiniband",
    )
