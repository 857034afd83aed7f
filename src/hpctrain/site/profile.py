"""Cluster profiles (`configs/clusters/<site>.yaml`): what a site's scheduler, nodes, modules,
fabric and container look like, as validated frozen dataclasses (same machinery as run configs).

A profile is data: every value that reaches the batch script is checked here (control characters
by config.build, for every string) and quoted by the renderer; nothing in a profile runs as code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.config import ConfigError, apply_overrides, build, opt, read_yaml, unreadable
from hpctrain.shipped import CLUSTER_DIR
from hpctrain.site import runtimes

MODULE_RE = re.compile(r"^[A-Za-z0-9_.+/@-]+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
HCA_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*(?::[1-9][0-9]*)?$")  # mlx5_0, mlx5_0:2
IFNAME_RE = re.compile(r"^\^?=?[A-Za-z0-9_.:@-]+(?:,[A-Za-z0-9_.:@-]+)*$")  # ibp, =ib0, ^docker,lo


def time_minutes(value: str) -> int:
    """Slurm time ('90', 'MM:SS', 'HH:MM:SS', 'D-HH[:MM[:SS]]') → whole minutes (rounded up)."""
    m = TIME_RE.match(str(value).strip())
    if not m:
        raise ConfigError(
            f"time {value!r} is not a Slurm time limit: use minutes (90), HH:MM:SS "
            "(24:00:00) or D-HH:MM:SS (2-00:00:00)"
        )
    d, a, b, c = m.groups()
    if d is not None:  # D-HH[:MM[:SS]]
        secs = int(d) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MM:SS
        secs = int(a) * 60 + int(b)
    else:
        secs = int(a) * 60
    return max(1, -(-secs // 60))


def parse_tres(text: str) -> dict[str, int]:
    """A TRES list as sacctmgr prints it (`cpu=64,gres/gpu=16,node=2,mem=512G`) → {name: count};
    memory and billing are skipped (jobs here ask for whole nodes' memory)."""
    out: dict[str, int] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")
        if not value.isdigit():
            if name in ("mem", "billing") or name.startswith("fs/") or name.startswith("license/"):
                continue
            raise ConfigError(
                f"TRES {item!r} is not name=count (as `sacctmgr show qos` prints them, e.g. cpu=64,gres/gpu=16,node=2)"
            )
        out[name.removesuffix(":")] = int(value)
    return out


@dataclass(frozen=True)
class LimitsSection:
    """Limits the site enforces, as `hpctrain cluster init` read them: `submit` (and sweep, eval
    --nodes) refuses a request over one before sbatch does, or before the job pends forever. Each
    limit holds for the partition or QOS it was read from; empty: none known."""

    partition: str = opt("", "the partition max_time was read from")
    max_time: str = opt("", "that partition's MaxTime (scontrol show partition): the longest --time it takes")
    qos: str = opt("", "the QOS the qos_* limits were read from")
    qos_max_wall: str = opt("", "that QOS's MaxWall (sacctmgr show qos): the longest --time it lets run")
    qos_max_tres_per_job: str = opt("", "that QOS's MaxTRESPerJob, e.g. cpu=256,gres/gpu=16,node=2")
    qos_max_tres_per_user: str = opt("", "that QOS's MaxTRESPerUser: a job over it alone never starts")

    def validate(self) -> None:
        for key in ("max_time", "qos_max_wall"):
            if getattr(self, key):
                time_minutes(getattr(self, key))
        parse_tres(self.qos_max_tres_per_job)
        parse_tres(self.qos_max_tres_per_user)


@dataclass(frozen=True)
class BadNodeReport:
    """Who hears of a node a job leaves out for a fault (ExcNodeList, docs/spares.md): the batch shell
    runs the site's command and/or appends a line to a file, bounded by timeout_s; a report that
    fails or hangs is one warning line in the job's log, never the job's end (docs/sites.md)."""

    command: list[str] = opt(
        [], "a program (absolute path) and its first arguments; the shell adds three: node, evidence, job id"
    )
    file: str = opt("", "an absolute path the shell appends a line to: time, job id, node, user, evidence (tabs)")
    timeout_s: int = opt(30, "seconds the command, or the append to the file, may take before it is abandoned", lo=1)

    def validate(self) -> None:
        if self.command and (not self.command[0].startswith("/") or not all(self.command)):
            raise ConfigError(
                f"slurm.report_bad_node.command={self.command!r}: give the program's absolute path first and no "
                "empty word, e.g. [/usr/local/sbin/report-node, --site, mysite]"
            )
        if self.file and not self.file.startswith("/"):
            raise ConfigError(
                f"slurm.report_bad_node.file={self.file!r}: give an absolute path on a file system the nodes "
                "see, e.g. /shared/admin/bad-nodes.log"
            )


@dataclass(frozen=True)
class SlurmSection:
    partition: str = opt("", "partition (--partition); empty: the cluster's default")
    account: str = opt("", "account to charge (--account); empty: your default")
    qos: str = opt("", "quality of service (--qos); empty: the default")
    time: str = opt("24:00:00", "wall-clock limit: minutes, HH:MM:SS or D-HH:MM:SS")
    constraint: str = opt("", "node features (--constraint), e.g. 'h100&ib'")
    exclusive: bool = opt(False, "whole nodes only (--exclusive)")
    gpus_per_node: int = opt(8, "GPUs (= tasks) per node unless --gpus-per-node says otherwise", lo=0)
    max_gpus_per_node: int = opt(8, "GPUs a node of this cluster has: more cannot be requested", lo=0)
    request_gpus: bool = opt(True, "ask Slurm for the GPUs (--gpus-per-node); false on CPU-only clusters")
    cpus_per_node: int = opt(0, "CPUs a node gives jobs; a task asks its GPU's share (0: Slurm's default)", lo=0)
    cpu_bind: str = opt(
        "cores",
        "srun --cpu-bind of the training tasks when they ask CPUs (cpus_per_node set); '': the site's binding",
        choices=("cores", "threads", "sockets", "ldoms", "none", ""),
    )
    mem_per_node: str = opt("0", "memory per node for --mem (e.g. 480G; 0: all of it)")
    signal_lead_s: int = opt(180, "seconds before the time limit that USR2 arrives (checkpoint time)", lo=1)
    node_mtbf_hours: float = opt(
        0.0,
        "ckpt.every=auto: node-hours between interruptions (preemption, node "
        "failure, time limit) on this partition, divided by the job's nodes; 0: from "
        "the partition's sacct history at submission",
        lo=0,
    )
    mtbf_window_days: float = opt(
        30.0, "days of sacct history that node_mtbf_hours is read from when it is 0", lo=0, lo_open=True
    )
    ckpt_write_gbps: float = opt(
        1.0,
        "GB/s a job's checkpoint is written at, for submit's check that a stop has "
        "time to save (until a run has measured its own save)",
        lo=0,
        lo_open=True,
    )
    max_requeues: int = opt(3, "requeues of attempts that wrote no newer checkpoint (0: none at all)", lo=0)
    max_preemptions: int = opt(
        -1, "requeues after a preemption (SIGTERM) before the job gives up; -1: unlimited", lo=-1
    )
    max_restarts: int = opt(
        3,
        "in-job restarts on the same nodes after a failed step that named no faulty node "
        "(a crashed rank), per allocation; 0: the job ends (docs/spares.md)",
        lo=0,
    )
    min_nodes: int = opt(
        0,
        "node ranges: the fewest nodes a job of --nodes N starts or goes on with (sbatch --nodes=MIN-N, "
        "--no-kill; docs/launch.md); 0: exactly N",
        lo=0,
    )
    spare_nodes: int = opt(
        0,
        "hot spares: allocate this many nodes more (--no-kill), idle while the job trains; "
        "a failed node is replaced in the same job without a requeue",
        lo=0,
    )
    limits: LimitsSection = field(
        default_factory=LimitsSection, metadata={"doc": "the partition's and QOS's limits (cluster init reads them)"}
    )
    report_bad_node: BadNodeReport = field(
        default_factory=BadNodeReport, metadata={"doc": "tell the site's admins of each node a job leaves out"}
    )

    def validate(self) -> None:
        time_minutes(self.time)
        if not re.match(r"^\d+[KMGT]?$", self.mem_per_node):
            raise ConfigError(
                f"slurm.mem_per_node={self.mem_per_node!r}: use a number with an optional "
                "K/M/G/T suffix, e.g. 480G (0: all of the node's memory)"
            )


@dataclass(frozen=True)
class FabricSection:
    """What NCCL is told about the node's network. Everything the site does not name stays
    unset, so that NCCL chooses (site/fabric.py says why each default is "unset")."""

    kind: str = opt(
        "socket", "interconnect for NCCL: InfiniBand, RoCE, or plain TCP sockets", choices=("ib", "roce", "socket")
    )
    hcas: list[str] = opt(
        [],
        "HCA ports for NCCL_IB_HCA, written exact (=mlx5_0:1,…; port 1 unless "
        "dev:port); empty: NCCL picks the HCAs nearest each GPU",
    )
    ifname: str = opt(
        "",
        "NCCL_SOCKET_IFNAME pattern (ibp, =ibp24s0, ^docker,lo); empty: NCCL picks. "
        "gloo gets a plain interface name derived from it on each node",
    )
    gid_index: int = opt(
        -1,
        "NCCL_IB_GID_INDEX; -1: unset (NCCL >= 2.21 finds the RoCE v2 GID "
        "itself; older NCCL: the index `hpctrain doctor` reports)",
        lo=-1,
    )
    ib_timeout: int = opt(22, "NCCL_IB_TIMEOUT (4.096 µs × 2^value per retry)", lo=1, hi=31)
    retry_cnt: int = opt(7, "NCCL_IB_RETRY_CNT", lo=0, hi=7)
    nccl_debug: str = opt("WARN", "NCCL_DEBUG", choices=("", "VERSION", "WARN", "INFO", "TRACE"))
    async_error_handling: int = opt(
        3,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING (3, torch >= 2.2's default: a failed or timed-out collective ends "
        "the process without ncclCommAbort, which can itself hang on a dead peer; 1 aborts first)",
        choices=(0, 1, 2, 3),
    )

    def validate(self) -> None:
        for h in self.hcas:
            if not HCA_RE.match(h):
                raise ConfigError(
                    f"fabric.hcas: {h!r} is not an HCA port: write a device as "
                    "/sys/class/infiniband names it, optionally with its port (mlx5_0 or "
                    "mlx5_0:2); hpctrain writes NCCL's exact form (=mlx5_0:1) itself"
                )
        if self.ifname and not IFNAME_RE.match(self.ifname):
            raise ConfigError(
                f"fabric.ifname={self.ifname!r} is not an NCCL_SOCKET_IFNAME pattern: "
                "prefixes (ibp), exact names (=ibp24s0) or an exclude list (^docker,lo), "
                "comma-separated, no spaces"
            )


@dataclass(frozen=True)
class ContainerSection:
    runtime: str = opt(
        "none",
        "what starts each task in the image: apptainer, singularity (SingularityCE), "
        "pyxis (srun --container-image, enroot), or none (the host's Python); site/runtimes/",
        choices=runtimes.CHOICES,
    )
    image: str = opt(
        "",
        "the image: a .sif (apptainer, singularity); an enroot .sqsh or a registry URI "
        "such as nvcr.io#nvidia/pytorch:23.12-py3 (pyxis)",
    )
    binds: list[str] = opt([], "extra bind mounts (src[:dst[:opts]]); data root and run dir are added")
    python: str = opt("python3", "Python inside the image (or on the host when runtime is none)")
    bind_source: bool = opt(
        True,
        "run the submitting hpctrain: a snapshot of its package, taken at submission, "
        "bound into the image first on PYTHONPATH (the image supplies torch, DALI, NCCL)",
    )
    source_mount: str = opt(
        "/opt/hpctrain-src", "where the bound package appears in the image (<source_mount>/hpctrain)"
    )
    pass_env: list[str] = opt(
        [],
        "more host variables for the task (names or NAME_* prefixes); the image "
        "starts from a clean environment (--cleanenv)",
    )
    stage_image: bool = opt(
        False,
        "start from a node-local image: apptainer/singularity copy the SIF once per node "
        "to stage_image_to; pyxis names the container per job (unpacked once per node)",
    )
    stage_image_to: str = opt(
        "/tmp",
        "node-local directory for the staged SIF; $NAME expands on each node "
        "(as data.stage_to), e.g. $TMPDIR or /localscratch/$USER; the copy goes in a "
        "directory of the user's own in it (hpctrain-<uid>, mode 0700)",
    )
    stage_image_keep_days: int = opt(
        7,
        "a staged copy that no job of the user has staged for this many days is removed "
        "at the user's next staging on that node (0: every copy but the one staged)",
    )


@dataclass(frozen=True)
class ClusterProfile:
    name: str = opt("local", "profile name (shown in the job's banner)")
    slurm: SlurmSection = field(default_factory=SlurmSection, metadata={"doc": "scheduler defaults"})
    modules: list[str] = opt(
        [], "modules to load before srun when the tasks run on the host's Python (container.runtime none)"
    )
    container_modules: list[str] = opt(
        [],
        "modules to load before srun when the tasks run in the image "
        "(e.g. apptainer); cuda/nccl modules do nothing inside it",
    )
    module_purge: bool = opt(
        False,
        "`module purge` first (it can remove site defaults the job needs: apptainer, or slurm on Bright clusters)",
    )
    module_use: list[str] = opt([], "extra module paths (`module use`) before loading")
    env: dict[str, str] = opt({}, "extra environment for every task; overrides fabric-derived NCCL_*")
    fabric: FabricSection = field(default_factory=FabricSection, metadata={"doc": "interconnect"})
    container: ContainerSection = field(default_factory=ContainerSection, metadata={"doc": "image"})

    def validate(self) -> None:
        for m in (*self.modules, *self.container_modules):
            if not MODULE_RE.match(m):
                raise ConfigError(f"modules: {m!r} is not a module name (letters, digits, . _ + / @ -)")
        for k in self.env:
            if not ENV_NAME_RE.match(k):
                raise ConfigError(f"env: {k!r} is not a valid environment variable name")
        for name in self.container.pass_env:
            if not ENV_NAME_RE.match(name.removesuffix("*")):
                raise ConfigError(f"container.pass_env: {name!r} is not a variable name or NAME_* prefix")
        if not self.container.source_mount.startswith("/") or " " in self.container.source_mount:
            raise ConfigError(
                f"container.source_mount={self.container.source_mount!r}: use an absolute path "
                "without spaces inside the image, e.g. /opt/hpctrain-src"
            )
        c = self.container
        if c.stage_image and not runtimes.get(c.runtime).image_kind:
            raise ConfigError(
                "container.stage_image copies the image to each node, but container.runtime is none "
                "(no image): set container.stage_image false, or a runtime and its image"
            )
        if c.stage_image and not c.stage_image_to.startswith(("/", "$", "~")):
            raise ConfigError(
                f"container.stage_image_to={c.stage_image_to!r}: give an absolute node-local "
                "directory, e.g. /tmp or $TMPDIR"
            )
        if c.stage_image_keep_days < 0:
            raise ConfigError(f"container.stage_image_keep_days={c.stage_image_keep_days}: use 0 or more days")
        if runtimes.get(c.runtime).image_kind and not c.image:
            raise ConfigError(
                f"container.runtime is {self.container.runtime} but container.image is empty: set "
                "the image (container.image) or use container.runtime: none"
            )


def user_cluster_dir() -> Path:
    """Profiles written by `hpctrain cluster init`: $XDG_CONFIG_HOME/hpctrain/clusters (default
    ~/.config/hpctrain/clusters, the XDG base directory rule)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "hpctrain" / "clusters"


def find_profile(name: str | Path) -> Path:
    """A path as given, else the user's profile (user_cluster_dir()/<name>[.yaml]), else a shipped
    one (configs/clusters/<name>[.yaml])."""
    p = Path(name)
    for cand in (p, *(d / q for d in (user_cluster_dir(), CLUSTER_DIR) for q in (p.name, f"{p.name}.yaml"))):
        try:
            if cand.is_file():
                return cand
        except PermissionError:  # a directory above it is another user's
            raise ConfigError(f"cluster profile {str(name)!r}: {unreadable(cand)}") from None
    shipped = ", ".join(sorted(q.stem for q in CLUSTER_DIR.glob("*.yaml")))
    raise ConfigError(
        f"cluster profile {str(name)!r} not found: give a path, a name written by `hpctrain cluster "
        f"init` (in {user_cluster_dir()}) or one of: {shipped}"
    )


def load_profile(name: str | Path | None, overrides: Iterable[str] = ()) -> ClusterProfile:
    """Load a profile (None: the built-in local defaults) and apply `key=value` overrides."""
    data = read_yaml(find_profile(name)) if name else {}
    if name and "name" not in data:
        data["name"] = Path(name).stem
    return build(ClusterProfile, apply_overrides(data, overrides))
