"""The Slurm client on the login node: every `sacct`, `squeue`, `scontrol`, `sacctmgr` and `sinfo`
that hpctrain runs outside a job, and the parsing of what they print. What the figures mean is the
callers' (plan/, site/cluster_init.py, launch/); the batch shell (launch/shell/*.sh) calls scontrol
itself, as the tasks have no Slurm client.

Every command goes through `tool`: None when the client is missing, fails or times out, so a
caller says "no answer" in its own words. Sources (docs/sweeps.md and docs/plan.md have the
commands' documentation): `scontrol show … -o` (one record per line, `Key=Value` fields), sacct's
parsable rows (`-n -P`, `|`-separated, in the order of `-o`), squeue/sinfo's `-o` formats.
No torch: this runs where jobs are submitted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime

KV_RE = re.compile(r"(\S+?)=(.*?)(?=\s+\S+?=|$)")

STANDARD_TIME = {"SLURM_TIME_FORMAT": "standard"}  # YYYY-MM-DDTHH:MM:SS whatever the user's setting
SACCT_FIELDS = ("JobIDRaw", "State", "NNodes", "Eligible", "Start", "End", "ElapsedRaw")


def tool(*cmd: str, timeout: float = 30, env: dict[str, str] | None = None) -> str | None:
    """stdout of a Slurm client command (with `env` added to the environment); None when it is
    missing or fails."""
    return ask(*cmd, timeout=timeout, env=env)[0]


def ask(*cmd: str, timeout: float = 30, env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(stdout, "") of a Slurm client command; (None, why) when it is missing, times out or fails:
    the last line of its stderr (e.g. sacct's "Slurm accounting storage is disabled")."""
    if not shutil.which(cmd[0]):
        return None, f"no {cmd[0]} on this machine"
    try:
        r = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, env={**os.environ, **env} if env else None
        )
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cmd[0]}: {e}"
    if r.returncode == 0:
        return r.stdout, ""
    lines = r.stderr.strip().splitlines()
    return None, lines[-1].strip() if lines else f"{cmd[0]} exited {r.returncode}"


# --------------------------------------------------------------------------- scontrol


def parse_kv(line: str) -> dict[str, str]:
    """One `scontrol show … -o` record → {key: value} (values may hold spaces, e.g. OS=Linux 6.1)."""
    return {k: v.strip() for k, v in KV_RE.findall(line.strip())}


def scontrol_show(kind: str) -> list[dict[str, str]] | None:
    """`scontrol show <kind> -o` (partition, node, …): one {key: value} per line; None when scontrol
    does not answer."""
    text = tool("scontrol", "show", kind, "-o")
    return None if text is None else [parse_kv(line) for line in text.splitlines()]


def job_record(job_id: str) -> dict[str, str]:
    """`scontrol show job -o ID` as {key: value} (JobState, Restarts, WorkDir, NodeList, …): the
    controller's own view, which also holds a finished job for MinJobAge (default 300 s,
    slurm.conf(5)); {} when scontrol does not answer or no longer knows the job."""
    text = tool("scontrol", "show", "job", "-o", job_id)
    # by its first field: a later one may repeat a key (a job name holding "JobId=…" comes after it)
    line = next((ln for ln in (text or "").splitlines() if ln.startswith(f"JobId={job_id} ")), "")
    return parse_kv(line) if line else {}


def slurm_config() -> dict[str, str] | None:
    """`scontrol show config` (`Key = Value` lines: ClusterName, MaxArraySize, …) as {key: value};
    None when scontrol does not answer."""
    text = tool("scontrol", "show", "config")
    if text is None:
        return None
    pairs = (line.split("=", 1) for line in text.splitlines() if " = " in line)
    return {k.strip(): v.strip() for k, v in pairs}


def client_version() -> tuple[tuple[int, int], str] | None:
    """The login node's Slurm release from `sbatch --version` ("slurm 22.05.8"): ((22, 5), that
    text); None when sbatch does not answer."""
    text = (tool("sbatch", "--version", timeout=10) or "").strip()
    m = re.search(r"(\d+)\.(\d+)", text)
    return ((int(m[1]), int(m[2])), text) if m else None


def expand_hosts(spec: str) -> list[str]:
    """`scontrol show hostnames`: `n[1-3]` → [n1, n2, n3]; [spec] when scontrol does not answer."""
    out = tool("scontrol", "show", "hostnames", spec)
    return out.split() if out else [spec]


def partition_record(name: str) -> dict[str, str]:
    """`scontrol show partition -o` of `name` (empty: the default partition) as {key: value}; {}
    when scontrol does not answer or has no such partition."""
    for kv in scontrol_show("partition") or []:
        if kv.get("PartitionName") and (kv["PartitionName"] == name or (not name and kv.get("Default") == "YES")):
            return kv
    return {}


# scontrol's own words when it has no configuration at all (measured, 22.05): no slurm.conf and no
# configless source ("Could not establish a configuration source", after a failed DNS SRV lookup), or
# an unreadable/empty one ("Unable to process configuration file"). Both exit 1 at once.
NO_CONFIG_RE = re.compile(r"fatal: (Could not establish a configuration source|Unable to process configuration file)")


@dataclass(frozen=True)
class SlurmHere:
    """What this machine's Slurm is, for choosing where a job without a site profile goes:
    "none" (no sbatch on PATH), "unconfigured" (a client with no configuration: no controller to
    submit to), "up" (`scontrol ping` says UP) or "down" (configured, but no UP within 10 s: a
    stalled, restarting, stopped or unreachable controller). `why`: scontrol's words, for the last three."""

    state: str
    why: str = ""

    @property
    def local(self) -> bool:
        """No Slurm to submit to, unambiguously: the job may run on this machine."""
        return self.state in ("none", "unconfigured")


def slurm_here(timeout: float = 10) -> SlurmHere:
    """Classify this machine's Slurm (SlurmHere). $SLURM_CONF naming a file that does not exist is
    "unconfigured" without asking: scontrol would retry reading it for 60 s (measured, 22.05), then fail."""
    if not shutil.which("sbatch"):
        return SlurmHere("none")
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        return SlurmHere("unconfigured", f"$SLURM_CONF={conf} does not exist")
    out, why = ask("scontrol", "ping", timeout=timeout)
    if out is not None and " is UP" in out:
        return SlurmHere("up")
    if out is None and NO_CONFIG_RE.search(why):
        return SlurmHere("unconfigured", why)
    return SlurmHere("down", why or " ".join((out or "").split()) or "no answer")


# --------------------------------------------------------------------------- sacct


@dataclass(frozen=True)
class Alloc:
    """One allocation (one attempt of a job) as sacct holds it."""

    job: str
    state: str  # first word: "CANCELLED by 0" → CANCELLED
    nodes: int
    eligible: datetime | None
    start: datetime | None  # None: never started (still pending, or cancelled while pending)
    end: datetime | None
    elapsed_s: int


def when(text: str) -> datetime | None:
    """A time Slurm prints under STANDARD_TIME; None for Unknown, None, N/A."""
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:  # Unknown, None, N/A
        return None


def parse_sacct(text: str) -> list[Alloc]:
    """`sacct -n -P -o JobIDRaw,State,NNodes,Eligible,Start,End,ElapsedRaw` lines → allocations."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != len(SACCT_FIELDS) or not parts[2].isdigit():
            continue
        job, state, nodes, eligible, start, end, elapsed = parts
        out.append(
            Alloc(
                job,
                (state.split() or [""])[0],
                int(nodes),
                when(eligible),
                when(start),
                when(end),
                int(elapsed) if elapsed.isdigit() else 0,
            )
        )
    return out


def read_history(partition: str, days: float, since: str | None = None) -> tuple[Alloc, ...] | None:
    """The partition's allocations of the last `days` days (or since the sacct time `since`):
    `sacct -X -D -a -r P -S … -E now`, one row per allocation (-X), every attempt of a requeued job
    (-D), all users (-a). None when sacct does not answer (no accounting, no client)."""
    start = since or time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - days * 86400))
    text = tool(
        "sacct",
        "-X",
        "-D",
        "-a",
        "-n",
        "-P",
        "-S",
        start,
        "-E",
        "now",
        "-r",
        partition,
        "-o",
        ",".join(SACCT_FIELDS),
        timeout=60,
        env=STANDARD_TIME,
    )
    return None if text is None else tuple(parse_sacct(text))


# --------------------------------------------------------------------------- sacctmgr


def default_account(user: str) -> str:
    """The user's default account (`sacctmgr show user`); "" without accounting."""
    return (tool("sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount") or "").strip()


# --------------------------------------------------------------------------- squeue and sinfo


def node_counts(partition: str) -> list[int] | None:
    """sinfo's allocated/idle/other/total nodes of the partition (summed over its lines); None: no
    answer."""
    counts: list[int] | None = None
    for line in (tool("sinfo", "-h", "-p", partition, "-o", "%F") or "").split():
        vals = line.split("/")
        if len(vals) == 4 and all(v.isdigit() for v in vals):
            counts = [c + int(v) for c, v in zip(counts or [0, 0, 0, 0], vals)]
    return counts


def pending_starts(partition: str) -> tuple[tuple[int, datetime | None], ...] | None:
    """`squeue --start`: (nodes, Slurm's expected start) of each pending job of the partition;
    None: no answer."""
    text = tool("squeue", "--start", "-h", "-p", partition, "-o", "%i|%D|%S", env=STANDARD_TIME)
    if text is None:
        return None
    return tuple(
        (int(n), when(s)) for _, n, s in (ln.split("|") for ln in text.split() if ln.count("|") == 2) if n.isdigit()
    )


def queue_state(job_id: str) -> str | None:
    """The state squeue gives a job still in the queue (None: not there)."""
    out = tool("squeue", "-h", "-j", job_id, "-o", "%T")
    return out.split()[0] if out and out.strip() else None


def in_queue(job: str) -> bool:
    """squeue lists the job (for an array: some task of it is still pending or running)."""
    return bool((tool("squeue", "-h", "-j", job, "-o", "%i", timeout=60) or "").strip())
