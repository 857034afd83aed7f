"""`hpctrain cluster init`: a first cluster profile read from the cluster itself, on a login node.

Sources (docs/sweeps.md has the commands' documentation): `scontrol show partition -o` and
`scontrol show node -o` (one record per line, `Key=Value` fields: partitions, default, MaxTime,
OverSubscribe, nodes' CPUEfctv - CPUTot less the cores kept for the system by CoreSpecCount/
CpuSpecList, what a job can have - RealMemory, Gres `gpu:<type>:<n>`), `sacctmgr show assoc` and
`show user` (accounts, QOS, defaults), `sacctmgr show qos` (MaxWall, MaxTRESPerJob, MaxTRESPerUser),
Lmod's `module -t avail` (apptainer, singularity, cuda, nccl), the container runtimes installed
(site/runtimes/: each runtime's `detect`, e.g. `apptainer --version`, `srun --help` for pyxis), and with --probe
`srun -N1 … hpctrain doctor --json` on a node of the chosen partition, under the profile's account
and QOS and inside its image when one is given (HCAs, link layer, the GPU-near ports NCCL would
use, the image's NCCL). Every written value carries a comment naming its source.
No torch: this runs where jobs are submitted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.run.source import package_dir
from hpctrain.site import runtimes as rt
from hpctrain.site import slurm_cli
from hpctrain.site.profile import time_minutes
from hpctrain.site.slurm_cli import default_account, expand_hosts, scontrol_show, tool

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"  # Debian's; sites: $LMOD_PKG/init/bash, $MODULESHOME/init/bash


def parse_gres(text: str) -> tuple[str, int]:
    """`gpu:h100:8(S:0-1),…` or `gpu:4` → (type, count); ("", 0) without GPUs."""
    for item in re.split(r",(?![^()]*\))", text or ""):
        parts = re.sub(r"\(.*\)", "", item).split(":")
        if parts and parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            return (parts[1] if len(parts) == 3 else "", int(parts[-1]))
    return "", 0


@dataclass
class Partition:
    name: str
    default: bool
    max_time: str  # Slurm's text: UNLIMITED, 2-00:00:00, …
    nodes: list[str]
    exclusive: bool  # OverSubscribe=EXCLUSIVE: every job gets whole nodes
    gpus: int = 0  # the fewest GPUs a node of it declares
    gpu_type: str = ""
    cpus: int = 0  # CPUEfctv: what a job can be given (CPUTot less specialised cores)
    mem_mb: int = 0
    cpus_total: int = 0  # CPUTot


@dataclass
class Facts:
    partitions: list[Partition]
    accounts: dict[str, tuple[list[str], str]] = field(default_factory=dict)  # account → (QOS, default QOS)
    default_account: str = ""
    modules: list[str] = field(default_factory=list)
    user: str = ""
    qos_limits: dict[str, dict[str, str]] = field(default_factory=dict)  # QOS → {MaxWall, MaxTRESPerJob, …}
    runtimes: list[rt.Found] = field(default_factory=list)  # container runtimes installed (runtimes.detect)


def read_partitions() -> list[Partition]:
    records = scontrol_show("partition")
    if records is None:
        raise UserError(
            "no Slurm here: `scontrol show partition` does not answer (run `hpctrain cluster init` on "
            "a login node of the cluster, where sinfo/scontrol work)"
        )
    nodes = {kv["NodeName"]: kv for kv in scontrol_show("node") or [] if kv.get("NodeName")}
    parts = []
    for kv in records:
        if not kv.get("PartitionName"):
            continue
        names = expand_hosts(kv["Nodes"]) if kv.get("Nodes") not in (None, "", "(null)") else []
        p = Partition(
            kv["PartitionName"],
            kv.get("Default") == "YES",
            kv.get("MaxTime", "UNLIMITED"),
            names,
            kv.get("OverSubscribe", "").startswith("EXCLUSIVE"),
        )
        info = [nodes[n] for n in names if n in nodes]
        if info:
            gres = [parse_gres(n.get("Gres", "")) for n in info]
            p.gpus = min(g[1] for g in gres)
            p.gpu_type = ",".join(sorted({g[0] for g in gres if g[0]}))
            p.cpus = min(int(n.get("CPUEfctv") or n.get("CPUTot") or 0) for n in info)  # CPUEfctv: 22.05+
            p.cpus_total = min(int(n.get("CPUTot") or 0) for n in info)
            p.mem_mb = min(int(n.get("RealMemory") or 0) for n in info)
        parts.append(p)
    return parts


def read_associations(user: str) -> tuple[dict[str, tuple[list[str], str]], str]:
    """({account: (its QOS, its default QOS)}, the user's default account) from slurmdbd; empty
    without accounting."""
    assoc: dict[str, tuple[list[str], str]] = {}
    text = tool("sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=Account,QOS,DefaultQOS")
    for line in (text or "").splitlines():
        acc, q, dq = (line.split("|") + ["", "", ""])[:3]
        if acc:
            qos, old_dq = assoc.get(acc, ([], ""))
            qos += [name for name in q.split(",") if name and name not in qos]
            assoc[acc] = (qos, old_dq or dq)
    return assoc, default_account(user)


QOS_FIELDS = ("MaxWall", "MaxTRESPerJob", "MaxTRESPerUser")


def read_qos_limits() -> dict[str, dict[str, str]]:
    """{QOS: {MaxWall, MaxTRESPerJob, MaxTRESPerUser}} from `sacctmgr show qos` (parsable; empty
    fields: no limit); {} without accounting."""
    text = tool("sacctmgr", "-n", "-P", "show", "qos", "format=Name," + ",".join(QOS_FIELDS))
    out = {}
    for line in (text or "").splitlines():
        name, *values = line.split("|")
        if name:
            out[name] = {k: v for k, v in zip(QOS_FIELDS, values) if v}
    return out


def module_init() -> str | None:
    """The module system's bash init script ($LMOD_PKG's, $MODULESHOME's or Debian's Lmod), if any."""
    return next(
        (
            p
            for p in (
                os.environ.get("LMOD_PKG", "") and f"{os.environ['LMOD_PKG']}/init/bash",
                os.environ.get("MODULESHOME", "") and f"{os.environ['MODULESHOME']}/init/bash",
                LMOD_INIT,
            )
            if p and Path(p).is_file()
        ),
        None,
    )


def read_modules() -> list[str]:
    """`module -t avail` through Lmod's init (a plain shell lacks the `module` function); Lmod
    writes the list to stderr, one `name/version` per line under `path:` headers."""
    init = module_init()
    if not init:
        return []
    try:
        r = subprocess.run(
            ["bash", "-c", f". {shlex.quote(init)} && module -t avail 2>&1"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [
        re.sub(r"\(.*\)$", "", line.strip())
        for line in r.stdout.splitlines()
        if line.strip() and not line.strip().endswith(":")
    ]


def pick_module(modules: list[str], stem: str) -> str:
    """The newest-looking module named `stem` or `stem/<version>` (natural sort), '' if none."""
    found = [m for m in modules if m == stem or m.startswith(stem + "/")]

    def natural(s: str):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]

    return max(found, key=natural) if found else ""


def gather(user: str | None = None) -> Facts:
    user = user or os.environ.get("USER") or os.environ.get("LOGNAME") or "root"
    parts = read_partitions()
    accounts, default_acc = read_associations(user)
    mods = read_modules()
    cands = [m for m in (pick_module(mods, r.module_stem) for r in rt.image_runtimes() if r.module_stem) if m]
    found = rt.detect(module_init() or "", cands)
    return Facts(parts, accounts, default_acc, mods, user, read_qos_limits(), found)


# --------------------------------------------------------------------------- probe


def probe_command(
    partition: Partition,
    python: str = sys.executable,
    account: str = "",
    qos: str = "",
    image: str = "",
    source_mount: str = "/opt/hpctrain-src",
    runtime: str = "apptainer",
) -> list[str]:
    """One task on one node of the partition (with a GPU where it has them), charged as the profile's
    jobs will be (account, QOS): the doctor's JSON. With `image`, the doctor runs in it (its NCCL,
    its view of /dev/infiniband) through `runtime`, as this hpctrain bound at `source_mount`, the way
    jobs run it."""
    cmd = ["srun", "-N1", "-n1", f"--partition={partition.name}", "--time=5", "--job-name=hpctrain-probe"]
    cmd += [f"--account={account}"] if account else []
    cmd += [f"--qos={qos}"] if qos else []
    if partition.gpus:
        cmd.append("--gpus-per-node=1")
    return [*cmd, *rt.get(runtime if image else "none").probe(image, str(package_dir()), source_mount, python)]


def fabric_from_doctor(report: dict) -> tuple[str, list[str]]:
    """fabric.kind from a doctor --json report, and the comment lines that say what the node has."""
    ports = report.get("ports") or []
    active = [p for p in ports if p.get("state") == "ACTIVE"]
    ib = [p for p in active if p.get("link_layer") == "InfiniBand"]
    roce = [p for p in active if p.get("link_layer") == "Ethernet"]
    kind = "ib" if ib else "roce" if roce else "socket"
    notes = []
    for p in ports:
        gid = f", RoCE v2 GID {p['roce_v2_gid']}" if p.get("roce_v2_gid") is not None else ""
        numa = f", NUMA {p['numa_node']}" if p.get("numa_node", -1) >= 0 else ""
        notes.append(f"{p['device']}:{p['port']} {p.get('state')} {p.get('link_layer')} {p.get('rate')}{numa}{gid}")
    if not ports:
        notes.append("no InfiniBand/RoCE ports (/sys/class/infiniband is empty): NCCL uses TCP sockets")
    for k, v in sorted((report.get("suggested_env") or {}).items()):
        notes.append(f"doctor suggests {k}={v}")
    v = report.get("versions") or {}
    notes.insert(
        0,
        f"{'in the image' if report.get('in_container') else 'on the host Python'}: "
        f"NCCL {v.get('nccl') or 'none (no CUDA torch)'}, torch {v.get('torch') or 'none'}",
    )
    return kind, notes


def probe(
    partition: Partition,
    python: str = sys.executable,
    account: str = "",
    qos: str = "",
    image: str = "",
    runtime: str = "apptainer",
) -> dict:
    """Run the doctor on a compute node; its JSON report (UserError with srun's words on failure)."""
    cmd = probe_command(partition, python, account, qos, image, runtime=runtime)
    r, why = slurm_cli.run(cmd, timeout=300, retry=False)  # a step: never run twice
    if r is None:
        raise UserError(f"--probe: {shlex.join(cmd)} failed: {why}") from None
    start = r.stdout.find("{")
    try:
        return json.loads(r.stdout[start:]) if start >= 0 else {}
    except ValueError:
        raise UserError(
            f"--probe: {shlex.join(cmd)} printed no doctor report (exit {r.returncode}): "
            f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}"
        ) from None


# --------------------------------------------------------------------------- the profile


def choose_partition(parts: list[Partition], wanted: str | None) -> Partition:
    if wanted:
        for p in parts:
            if p.name == wanted:
                return p
        raise UserError(
            f"--partition {wanted}: no such partition (scontrol show partition lists: "
            f"{', '.join(p.name for p in parts)})"
        )
    if not parts:
        raise UserError("scontrol show partition lists no partition: nothing to write a profile for")
    gpu = [p for p in parts if p.gpus]
    default = [p for p in parts if p.default]
    if default and default[0].gpus:
        return default[0]
    return (gpu or default or parts)[0]


SEEN = {"ib": "active InfiniBand ports", "roce": "active RoCE ports", "socket": "no active IB/RoCE port"}


def yaml_value(v) -> str:
    return json.dumps(v)  # JSON scalars and flow lists are YAML


def slurm_time(max_time: str) -> str | None:
    """A partition's MaxTime as a job --time ('UNLIMITED'/'INFINITE': None)."""
    return None if max_time.upper() in ("UNLIMITED", "INFINITE", "") else max_time


def account_and_qos(facts: Facts) -> tuple[str, str]:
    """The account (the user's default, else the first) and its QOS (DefaultQOS, else the first)."""
    accs = facts.accounts
    acc = facts.default_account if facts.default_account in accs else next(iter(accs), "")
    qos_list, def_qos = accs.get(acc, ([], ""))
    return acc, def_qos or (qos_list[0] if qos_list else "")


def render(
    name: str, facts: Facts, part: Partition, fabric: tuple[str, list[str]] | None = None, image: str = ""
) -> tuple[str, list[str]]:
    """The profile's YAML text, every value with its source, and the review notes."""
    src_part = f"scontrol show partition {part.name}"
    src_node = f"scontrol show node {','.join(part.nodes) or '-'}"
    others = [p for p in facts.partitions if p is not part]
    lines = [
        f"# Cluster profile {name}, written by `hpctrain cluster init {name}` for user {facts.user}.",
        "# Partitions seen: "
        + "; ".join(
            f"{p.name}{' (default)' if p.default else ''}: {len(p.nodes)} nodes, "
            f"{f'{p.gpus} GPUs {p.gpu_type}'.strip() if p.gpus else 'no GPUs'}, {p.cpus} CPUs, "
            f"{p.mem_mb} MB, MaxTime {p.max_time}"
            for p in facts.partitions
        ),
        "# Review the choices marked REVIEW before the first big job.",
        f"name: {yaml_value(name)}",
        "slurm:",
    ]
    notes = []
    why = (
        "the default partition"
        if part.default
        else ("the first partition whose nodes declare GPUs" if part.gpus else "the first partition")
    )
    lines.append(
        f"  partition: {yaml_value(part.name)}  # {src_part}: {why}; REVIEW (others: "
        f"{', '.join(p.name for p in others) or 'none'})"
    )
    notes.append(f"partition {part.name} ({why}); others: {', '.join(p.name for p in others) or 'none'}")
    accs = facts.accounts
    acc, qos = account_and_qos(facts)
    acc_src = (
        "sacctmgr show user: DefaultAccount"
        if acc == facts.default_account and acc
        else "sacctmgr show assoc: first account"
        if acc
        else "sacctmgr: no association (Slurm's default)"
    )
    lines.append(f"  account: {yaml_value(acc)}  # {acc_src}; associations: {', '.join(accs) or 'none'}; REVIEW")
    if len(accs) > 1:
        notes.append(f"account {acc}; also: {', '.join(a for a in accs if a != acc)}")
    qos_list, def_qos = accs.get(acc, ([], ""))
    which = "DefaultQOS" if def_qos else "first QOS" if qos else "none"
    lines.append(
        f"  qos: {yaml_value(qos)}  # sacctmgr show assoc user={facts.user} account={acc or '-'}: "
        f"{which} of QOS={','.join(qos_list) or '-'}; REVIEW"
    )
    if len(qos_list) > 1:
        notes.append(f"qos {qos}; account {acc} may also use: {', '.join(q for q in qos_list if q != qos)}")
    t = slurm_time(part.max_time)
    qlim = facts.qos_limits.get(qos, {}) if qos else {}
    wall = qlim.get("MaxWall", "")
    if wall and (not t or time_minutes(wall) < time_minutes(t)):
        lines.append(
            f"  time: {yaml_value(wall)}  # sacctmgr show qos {qos}: MaxWall={wall} (partition MaxTime={part.max_time})"
        )
    else:
        lines.append(
            f"  time: {yaml_value(t or '24:00:00')}  # {src_part}: MaxTime={part.max_time}"
            f"{'' if t else ' (no limit: 24 h chosen)'}"
        )
    whole = "; whole 8-GPU nodes for multi-node runs" if part.gpus >= 8 and not part.exclusive else ""
    lines.append(
        f"  exclusive: {yaml_value(part.exclusive or part.gpus >= 8)}  # {src_part}: OverSubscribe"
        f"{'=EXCLUSIVE' if part.exclusive else ' not EXCLUSIVE'}{whole}; REVIEW"
    )
    notes.append(f"exclusive: {part.exclusive or part.gpus >= 8} (whole nodes; shared nodes slow multi-node jobs)")
    if part.gpus:
        gtype = f"{part.gpu_type}:" if part.gpu_type else ""
        lines += [
            f"  gpus_per_node: {part.gpus}  # {src_node}: Gres=gpu:{gtype}{part.gpus}",
            f"  max_gpus_per_node: {part.gpus}  # the same",
            f"  request_gpus: true  # GPU type: {part.gpu_type or 'not named'} ({src_node})",
        ]
    else:
        lines += [
            "  gpus_per_node: 1  # one task per node: no GPU GRES on these nodes",
            f"  max_gpus_per_node: {max(1, part.cpus)}  # tasks per node at most: CPUs ({src_node})",
            f"  request_gpus: false  # {src_node}: no Gres=gpu",
        ]
        notes.append(f"partition {part.name} declares no GPUs: CPU-only jobs (request_gpus false)")
    spec = f", CPUTot={part.cpus_total} less specialised cores" if part.cpus_total > part.cpus else ""
    share = f"; {part.cpus // part.gpus} per GPU: each task's --cpus-per-task" if part.gpus and part.cpus else ""
    lines.append(f"  cpus_per_node: {part.cpus}  # {src_node}: CPUEfctv{spec} (fewest in the partition){share}")
    lines.append('  cpu_bind: "cores"  # srun --cpu-bind: each task on cores of its own (docs/sites.md)')
    lines.append(f'  mem_per_node: "0"  # all of a node\'s memory; {src_node}: RealMemory={part.mem_mb} MB')
    src_qos = f"sacctmgr show qos {qos or '-'}"
    lines += [
        "  limits:  # submit refuses a request over these (empty: none known)",
        f"    partition: {yaml_value(part.name)}  # {src_part}",
        f"    max_time: {yaml_value(t or '')}  # {src_part}: MaxTime={part.max_time}",
        f"    qos: {yaml_value(qos)}  # the QOS above",
        *[
            f"    {key}: {yaml_value(qlim.get(field, ''))}  # {src_qos}: {field}={qlim.get(field) or 'none'}"
            for key, field in (
                ("qos_max_wall", "MaxWall"),
                ("qos_max_tres_per_job", "MaxTRESPerJob"),
                ("qos_max_tres_per_user", "MaxTRESPerUser"),
            )
        ],
    ]
    lines += [  # not on the cluster to read: the site's admins say where they want to hear of bad nodes
        "  # report_bad_node:  # each node a job leaves out for a fault, to the admins (docs/sites.md); ASK THEM",
        "  #   command: [/usr/local/sbin/report-node]  # gets: node, evidence, job id",
        "  #   file: /shared/admin/hpctrain-bad-nodes.log  # or: a line appended per node",
    ]
    if qlim:
        notes.append(f"QOS {qos} limits: " + ", ".join(f"{k}={v}" for k, v in qlim.items()))
    mods = facts.modules
    runtime, found = rt.choose(facts.runtimes, image)
    # the module of the runtime the profile uses (or, without an image yet, of the first one found):
    # never one runtime's module for another's command (a SingularityCE module gives no `apptainer`)
    starter = found or (facts.runtimes[0] if facts.runtimes and not image else None)
    app = starter.module if starter else ""
    cuda, nccl = pick_module(mods, "cuda"), pick_module(mods, "nccl")
    host = [m for m in (cuda, nccl) if m]
    lines.append(
        f"modules: {yaml_value(host)}  # module -t avail: "
        f"{cuda or 'no cuda'}, {nccl or 'no nccl'}"
        " (tasks on the host's Python)"
    )
    lines.append(
        f"container_modules: {yaml_value([app] if app else [])}  # "
        + (
            f"{starter.evidence}: what starts the image"
            if app
            else f"{starter.runtime} needs no module here"
            if starter
            else "no container runtime found"
        )
    )
    lines.append("module_purge: false  # a purge can remove apptainer (or slurm on Bright clusters)")
    if fabric:
        kind, fnotes = fabric
        lines += [
            "# --probe: `hpctrain doctor --json` on a node of the partition saw:",
            *[f"#   {n}" for n in fnotes],
            "# hcas/ifname stay unset: NCCL then picks the GPU-near HCAs and an interface itself; name them",
            "# only when NCCL's choice is wrong (docs/launch.md, 'What a site sets in fabric:').",
            "fabric:",
            f"  kind: {kind}  # --probe: {SEEN[kind]}",
        ]
    else:
        lines += [
            "fabric:",
            "  kind: socket  # not probed: run `hpctrain cluster init NAME --probe --force` on the "
            "login node (one srun of the doctor on a compute node); REVIEW",
        ]
        notes.append("fabric not probed (--probe): kind socket until then")
    names = ", ".join(r.name for r in rt.image_runtimes())
    seen = "; ".join(f.evidence for f in facts.runtimes) or f"none of {names} found"
    if image and found:
        lines += [
            "container:",
            f"  runtime: {runtime}  # --image; {found.evidence}",
            f"  image: {yaml_value(image)}  # --image",
        ]
    elif image:
        lines += [
            "container:",
            f"  runtime: {runtime}  # --image ({rt.image_kind(image)} image), but {seen} on this node; REVIEW",
            f"  image: {yaml_value(image)}  # --image",
        ]
        notes.append(f"container.runtime {runtime}: not found here ({seen}); check what the compute nodes have")
    else:
        lines += [
            "container:",
            f"  runtime: none  # no --image given; found: {seen}: tasks run on the host's Python; REVIEW",
        ]
        if facts.runtimes:
            notes.append(
                f"{', '.join(f.runtime for f in facts.runtimes)} found: pass --image (a .sif, or an "
                "enroot .sqsh/URI for pyxis) to train in an image"
            )
    return "\n".join(lines) + "\n", notes
