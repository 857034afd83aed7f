"""The Slurm client on the login node: every `sbatch`, `sacct`, `squeue`, `scontrol`, `sacctmgr`,
`sinfo`, `sshare`, `scancel` (and the login node's `srun`) that hpctrain's Python runs, and the
parsing of what they print. What the figures mean is the callers' (plan/, site/cluster_init.py,
launch/, watch/); the batch shell (launch/shell/*.sh) has its own one function, as the tasks have
no Slurm client. tests/test_one_slurm_client.py fails when another module runs one of them.

Every command goes through `ask` (`tool`: its stdout only): None and why when the client is missing,
fails or times out, so a caller says "no answer" in its own words. On the way it
- logs the call when $HPCTRAIN_SLURM_CALL_LOG names a file (CALL_LOG_VAR: one JSON line per call,
  docs/sites.md "Slurm calls hpctrain makes");
- retries a read while the daemon does not answer (TRANSIENT: Slurm's own words for a controller that
  is restarting, failing over or stalled), RETRIES times after a backoff of BACKOFF_S doubling, each
  with full jitter so that many clients do not come back at once. A refusal is never retried, and
  neither is what may have been carried out although it timed out (sbatch, srun, a change);
- answers a read from a cache when the caller says how long its answer holds (`cache_s`): in this
  process, and in the user's cache (site/user_cache.py) keyed by the cluster (`cluster_key`).
Sources (docs/sweeps.md and docs/plan.md have the commands' documentation): `scontrol show … -o`
(one record per line, `Key=Value` fields), sacct's parsable rows (`-n -P`, `|`-separated, in the
order of `-o`), squeue/sinfo/sshare's `-o` formats.
No torch: this runs where jobs are submitted.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpctrain.site import user_cache

KV_RE = re.compile(r"(\S+?)=(.*?)(?=\s+\S+?=|$)")

STANDARD_TIME = {"SLURM_TIME_FORMAT": "standard"}  # YYYY-MM-DDTHH:MM:SS whatever the user's setting
SACCT_FIELDS = ("JobIDRaw", "State", "NNodes", "Eligible", "Start", "End", "ElapsedRaw")

# the commands hpctrain's Python may run only through this module (tests/test_one_slurm_client.py)
COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "sacctmgr", "sshare", "scancel", "srun", "salloc")
CALL_LOG_VAR = "HPCTRAIN_SLURM_CALL_LOG"

# Slurm's words (slurm_errno.c; measured on 22.05 and 24.11, docs/spares.md "When slurmctld hiccups")
# for a daemon that did not answer: a restart or fail-over ("Unable to contact slurm controller
# (connect failure)" after ~MessageTimeout), a stalled controller ("Socket timed out on send/recv
# operation"), a dropped connection, a backup in standby. Anything else (an invalid job id, a denied
# request, "accounting storage is disabled") is an answer and is never retried.
TRANSIENT = re.compile(
    r"Unable to contact slurm controller|Socket timed out on send/recv|Zero Bytes were transmitted"
    r"|Unable to (send|receive) message (to|from) slurm controller|backup controller in standby mode"
)
RETRIES = 2  # tries after the first: ~3 x MessageTimeout (10 s) at most before "no answer"
BACKOFF_S = 1.0  # the first retry waits up to this, the next up to twice as long (full jitter)
BACKOFF_CAP_S = 8.0
# what is never retried: it may have been carried out although it timed out (a second sbatch
# submits a second job); scontrol/sacctmgr retry only reads
NO_RETRY = ("sbatch", "srun", "salloc", "scancel")
READ_VERBS = ("show", "ping", "list", "version", "--version", "-V")
MEMO_S = 60.0  # a cacheable answer is reused in one process at most this long when the caller gave none


def where() -> str:
    """Where this runs, for the call log: "batch" inside a job (SLURM_JOB_ID set), else "login"."""
    return "batch" if os.environ.get("SLURM_JOB_ID") else "login"


def split_command(cmd: Sequence[str]) -> tuple[str, list[str]]:
    """(the Slurm command, its arguments) of an argv, past an `env -u NAME …` prefix
    (launch/enclosing.outside_job) or a path: ("sbatch", ["--parsable", "x.sh"])."""
    argv, i = list(cmd), 0
    if argv and os.path.basename(argv[0]) == "env":
        i = 1
        while i < len(argv) and (argv[i] == "-u" or argv[i - 1] == "-u" or "=" in argv[i]):
            i += 1
    if i >= len(argv):
        return "", []
    return os.path.basename(argv[i]), argv[i + 1 :]


def log_call(cmd: Sequence[str], seconds: float, rc: int | None, cached: bool = False) -> None:
    """Append one line to $HPCTRAIN_SLURM_CALL_LOG (no variable: nothing): kind, arguments, seconds,
    exit status (None: it did not run to an exit), where, and whether a cache answered. One write of
    one line to a file opened O_APPEND, so that concurrent writers do not interleave; a log that
    cannot be written is skipped (it must never fail a submission)."""
    path = os.environ.get(CALL_LOG_VAR)
    if not path:
        return
    kind, args = split_command(cmd)
    line = {"t": time.time(), "kind": kind, "args": args, "s": round(seconds, 6), "rc": rc}
    line |= {"where": where(), "cached": cached}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        return


def retries_allowed(cmd: Sequence[str]) -> bool:
    """A read may be asked again; what may have been carried out (NO_RETRY, a change) may not."""
    kind, args = split_command(cmd)
    if kind in NO_RETRY:
        return False
    if kind in ("scontrol", "sacctmgr"):
        return bool(args) and next((a for a in args if not a.startswith("-") or a in READ_VERBS), "") in READ_VERBS
    return True


def backoff_s(attempt: int) -> float:
    """The wait before retry `attempt` (0, 1, …): uniform in [0, min(cap, BACKOFF_S x 2^attempt)]
    ("full jitter": clients that failed together do not retry together)."""
    return random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_S * 2**attempt))


def run(
    cmd: Sequence[str],
    timeout: float = 30,
    env: dict[str, str] | None = None,
    input: str | None = None,
    retry: bool | None = None,
) -> tuple[subprocess.CompletedProcess | None, str]:
    """Run a Slurm client command once, or again after a transient failure (`retry` None: when
    `retries_allowed`); every attempt logged. (the completed process, "") or (None, why) when it
    could not be run or timed out."""
    retry = retries_allowed(cmd) if retry is None else retry
    full_env = {**os.environ, **env} if env else None
    for attempt in range(RETRIES + 1):
        t0 = time.monotonic()
        try:
            r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=full_env, input=input)
        except (OSError, subprocess.SubprocessError) as e:  # our own timeout too: the caller's bound holds
            log_call(cmd, time.monotonic() - t0, None)
            return None, f"{split_command(cmd)[0] or cmd[0]}: {e}"
        log_call(cmd, time.monotonic() - t0, r.returncode)
        if r.returncode == 0 or not retry or attempt == RETRIES or not TRANSIENT.search(r.stderr + r.stdout):
            return r, ""
        time.sleep(backoff_s(attempt))
    raise AssertionError("unreachable")


_memo: dict[tuple, tuple[float, str]] = {}
# A daemon that gave no answer (after the retries, or `scontrol ping`: DOWN), per client configuration:
# this process's later reads of it get the same "no answer" at once for SILENT_S, instead of waiting out
# the client's own retries again (~9 s a call, measured: 15 reads of a sweep's plan took 145 s).
_silent: dict[tuple, tuple[float, str]] = {}
SILENT_S = 30.0
DBD_CLIENTS = ("sacct", "sacctmgr", "sshare")  # these ask slurmdbd; the others slurmctld


def _daemon_key(kind: str) -> tuple[str, str, str]:
    """Which daemon a client command asks, and through which client configuration."""
    return (
        os.environ.get("SLURM_CONF", ""),
        os.environ.get("SLURM_CLUSTERS", ""),
        "dbd" if kind in DBD_CLIENTS else "ctld",
    )


def mark_silent(kind: str, why: str) -> None:
    """Remember that the daemon `kind` asks gave no answer (why: the client's words)."""
    _silent[_daemon_key(kind)] = (time.monotonic(), why)


def silent(kind: str) -> str:
    """Why the daemon `kind` asks is known to give no answer now; "" when it is not."""
    hit = _silent.get(_daemon_key(kind))
    return hit[1] if hit and time.monotonic() - hit[0] <= SILENT_S else ""


def cache_name(*key: str) -> str:
    """The user-cache file of a question: readable while short, hashed when it would be long."""
    name = user_cache.entry_name("slurm", *key)
    return name if len(name) <= 160 else f"slurm--{hashlib.sha256(name.encode()).hexdigest()[:32]}.json"


def ask(
    *cmd: str,
    timeout: float = 30,
    env: dict[str, str] | None = None,
    cache_s: float = 0,
    key: Sequence[str] | None = None,
    retry: bool | None = None,
    input: str | None = None,
    shared: bool = True,
    refresh: bool = False,
) -> tuple[str | None, str]:
    """(stdout, "") of a Slurm client command; (None, why) when it is missing, times out or fails:
    the last line of its stderr (e.g. sacct's "Slurm accounting storage is disabled").
    `cache_s` > 0: an answer (not a failure) is reused for that long, in this process and from the
    user's cache for this cluster (`key`: what names the question there, for a command whose argv
    changes every time, e.g. sacct's start time; default the argv). `shared` False: this process
    only (the question that names the cluster). `refresh`: ask, and cache the new answer. `input`: the
    command's stdin."""
    kind, args = split_command(cmd)
    program = cmd[len(cmd) - len(args) - 1] if kind else cmd[0]  # past an `env -u …` prefix
    if not shutil.which(cmd[0]) or not shutil.which(program):
        return None, f"no {kind or cmd[0]} on this machine"
    settings = tuple(f"{k}={v}" for k, v in sorted((env or {}).items()))
    name, question = "", tuple(key) if key is not None else (*cmd, *settings)
    here = (os.environ.get("SLURM_CONF", ""), os.environ.get("SLURM_CLUSTERS", ""))  # which client's answers
    if cache_s > 0:
        hit = None if refresh else _memo.get((*here, *question))
        if hit and time.time() - hit[0] <= cache_s:
            if shared:  # not the bookkeeping questions (the cluster's name): what a caller asked
                log_call(cmd, 0.0, 0, cached=True)
            return hit[1], ""
        cluster = cluster_key() if shared else ()
        name = cache_name(*cluster, *question) if any(cluster) else ""
        stored = user_cache.read(name, cache_s) if name and not refresh else None
        if stored and isinstance(stored[0].get("stdout"), str):
            _memo[(*here, *question)] = (stored[1], stored[0]["stdout"])
            log_call(cmd, 0.0, 0, cached=True)
            return stored[0]["stdout"], ""
    quiet = silent(kind) if kind and retries_allowed(cmd) else ""
    if quiet:  # asked a moment ago in this process, no answer: not asked again
        return None, f"{quiet} (no answer a moment ago: not asked again)"
    r, why = run(cmd, timeout, env, input, retry)
    if r is None:
        return None, why
    if r.returncode != 0 and kind and TRANSIENT.search(r.stderr + r.stdout):
        mark_silent(kind, (r.stderr.strip().splitlines() or [f"{kind} exited {r.returncode}"])[-1].strip())
    if r.returncode == 0:
        if cache_s > 0:
            _memo[(*here, *question)] = (time.time(), r.stdout)
        if name:
            user_cache.write(name, {"argv": list(cmd), "stdout": r.stdout})
        return r.stdout, ""
    lines = r.stderr.strip().splitlines()
    return None, lines[-1].strip() if lines else f"{kind} exited {r.returncode}"


def tool(
    *cmd: str,
    timeout: float = 30,
    env: dict[str, str] | None = None,
    cache_s: float = 0,
    key: Sequence[str] | None = None,
    retry: bool | None = None,
    input: str | None = None,
    shared: bool = True,
) -> str | None:
    """stdout of a Slurm client command (with `env` added to the environment); None when it is
    missing or fails (`ask`)."""
    return ask(*cmd, timeout=timeout, env=env, cache_s=cache_s, key=key, retry=retry, input=input, shared=shared)[0]


def clear_memo() -> None:
    """Forget this process's cached answers and silent daemons (tests; a long-lived caller that must
    ask again)."""
    _memo.clear()
    _silent.clear()


# --------------------------------------------------------------------------- scontrol


def parse_kv(line: str) -> dict[str, str]:
    """One `scontrol show … -o` record → {key: value} (values may hold spaces, e.g. OS=Linux 6.1)."""
    return {k: v.strip() for k, v in KV_RE.findall(line.strip())}


def scontrol_show(kind: str, cache_s: float = 0, refresh: bool = False) -> list[dict[str, str]] | None:
    """`scontrol show <kind> -o` (partition, node, …): one {key: value} per line; None when scontrol
    does not answer. `cache_s`: an answer that young may be reused (`ask`; `refresh`: not, but kept)."""
    text = ask("scontrol", "show", kind, "-o", cache_s=cache_s, refresh=refresh)[0]
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
    None when scontrol does not answer. Asked once per process (MEMO_S): it names the cluster whose
    answers the user's cache holds, so it is never itself answered from that cache."""
    text = tool("scontrol", "show", "config", cache_s=MEMO_S, shared=False)
    if text is None:
        return None
    pairs = (line.split("=", 1) for line in text.splitlines() if " = " in line)
    return {k.strip(): v.strip() for k, v in pairs}


DEFAULT_CONF = "/etc/slurm/slurm.conf"  # the clients' own default without $SLURM_CONF (slurm.conf(5))
CONF_KEYS = ("ClusterName", "SlurmctldHost", "SlurmctldPort")


def conf_file_key(path: str) -> tuple[str, str, str] | None:
    """ClusterName, the first SlurmctldHost and SlurmctldPort as the client's slurm.conf at `path` sets
    them (keys are case-insensitive, `#` starts a comment; slurm.conf(5)); None when the file cannot
    be read or names no cluster (a configless client: ask the controller)."""
    found: dict[str, str] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        for m in re.finditer(r"(\w+)=(\S+)", line.split("#", 1)[0]):
            key = next((k for k in CONF_KEYS if k.lower() == m[1].lower()), "")
            if key and key not in found:
                found[key] = m[2]
    if not found.get("ClusterName"):
        return None
    return found["ClusterName"], found.get("SlurmctldHost", ""), found.get("SlurmctldPort", "")


def cluster_key() -> tuple[str, ...]:
    """What names the cluster this client talks to, for the user's cache: ClusterName, its controller's
    host and port, and $SLURM_CLUSTERS (squeue/sbatch ask those instead). Read from the client's own
    slurm.conf ($SLURM_CONF, else DEFAULT_CONF): no call; a client without one (configless) asks
    `scontrol show config` once per process. All empty when neither answers: then nothing is cached
    across commands."""
    key: tuple[str, ...] | None = conf_file_key(os.environ.get("SLURM_CONF") or DEFAULT_CONF)
    if key is None:
        conf = slurm_config() or {}
        key = tuple(conf.get(k, "") for k in ("ClusterName", "SlurmctldHost[0]", "SlurmctldPort"))
    if not any(key):
        return ("", "", "")
    return (*key, os.environ.get("SLURM_CLUSTERS", ""))


def client_version() -> tuple[tuple[int, int], str] | None:
    """The login node's Slurm release from `sbatch --version` ("slurm 22.05.8"): ((22, 5), that
    text); None when sbatch does not answer."""
    text = (tool("sbatch", "--version", timeout=10, cache_s=MEMO_S, shared=False) or "").strip()
    m = re.search(r"(\d+)\.(\d+)", text)
    return ((int(m[1]), int(m[2])), text) if m else None


def expand_hosts(spec: str) -> list[str]:
    """`scontrol show hostnames`: `n[1-3]` → [n1, n2, n3]; [spec] when scontrol does not answer."""
    out = tool("scontrol", "show", "hostnames", spec, cache_s=MEMO_S, shared=False)  # no RPC: a pure expansion
    return out.split() if out else [spec]


# A partition's configuration (default, limits, GraceTime, PreemptMode) changes when the site edits
# slurm.conf: an hour-old record is good enough for a plan and a submission's checks.
PARTITIONS_CACHE_S = 3600


def partition_record(name: str, cache_s: float = PARTITIONS_CACHE_S) -> dict[str, str]:
    """`scontrol show partition -o` of `name` (empty: the default partition) as {key: value}; {}
    when scontrol does not answer or has no such partition. Read at most every `cache_s`, and again
    when the one read then has no such partition (the site may have added it since)."""
    for refresh in (False, True) if cache_s else (False,):
        for kv in scontrol_show("partition", cache_s, refresh) or []:
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
    r, why = run(("scontrol", "ping"), timeout)
    if r is None:
        mark_silent("scontrol", why)
        return SlurmHere("down", why)
    if r.returncode == 0 and " is UP" in r.stdout:
        return SlurmHere("up")
    err = (r.stderr.strip().splitlines() or [""])[-1].strip()
    if NO_CONFIG_RE.search(err):
        return SlurmHere("unconfigured", err)
    verdict = next((" ".join(ln.split()) for ln in r.stdout.splitlines() if ln.strip()), "")  # "… is DOWN"
    here = SlurmHere("down", err or verdict or f"scontrol exited {r.returncode}")
    mark_silent("scontrol", here.why)
    return here


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


# The states of an allocation that ran or was stopped (sacct(1), JOB STATE CODES; -s with -S/-E: in
# that state during the window): a PENDING row never started, has no wait yet and no node-hours, so
# slurmdbd need not send it (measured, 22.05: without -s sacct lists pending jobs, with it not).
HISTORY_STATES = ("CD", "CA", "F", "TO", "NF", "PR", "OOM", "DL", "R", "RQ")


def read_history(partition: str, days: float, since: str | None = None, cache_s: float = 0) -> tuple[Alloc, ...] | None:
    """The partition's allocations of the last `days` days (or since the sacct time `since`):
    `sacct -X -D -a -r P -S … -E now -s HISTORY_STATES -o SACCT_FIELDS`, one row per allocation
    (-X), every attempt of a requeued job (-D), all users (-a), the fields parse_sacct reads only.
    None when sacct does not answer (no accounting, no client). `cache_s`: a scan of the same
    partition and window that young is reused (the user's cache, per cluster)."""
    start = since or time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - days * 86400))
    key = None if since else ("sacct-history", partition, f"{days:g}d", *HISTORY_STATES, *SACCT_FIELDS)
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
        "-s",
        ",".join(HISTORY_STATES),
        "-o",
        ",".join(SACCT_FIELDS),
        timeout=60,
        env=STANDARD_TIME,
        cache_s=0 if since else cache_s,
        key=key,
    )
    return None if text is None else tuple(parse_sacct(text))


# --------------------------------------------------------------------------- sacctmgr


def default_account(user: str, cache_s: float = 0) -> str:
    """The user's default account (`sacctmgr show user`); "" without accounting."""
    return (tool("sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount", cache_s=cache_s) or "").strip()


# --------------------------------------------------------------------------- squeue and sinfo


def node_counts(partition: str, cache_s: float = 0) -> list[int] | None:
    """sinfo's allocated/idle/other/total nodes of the partition (summed over its lines); None: no
    answer."""
    counts: list[int] | None = None
    for line in (tool("sinfo", "-h", "-p", partition, "-o", "%F", cache_s=cache_s) or "").split():
        vals = line.split("/")
        if len(vals) == 4 and all(v.isdigit() for v in vals):
            counts = [c + int(v) for c, v in zip(counts or [0, 0, 0, 0], vals)]
    return counts


def pending_starts(partition: str, cache_s: float = 0) -> tuple[tuple[int, datetime | None], ...] | None:
    """`squeue --start`: (nodes, Slurm's expected start) of each pending job of the partition;
    None: no answer."""
    text = tool("squeue", "--start", "-h", "-p", partition, "-o", "%i|%D|%S", env=STANDARD_TIME, cache_s=cache_s)
    if text is None:
        return None
    return tuple(
        (int(n), when(s)) for _, n, s in (ln.split("|") for ln in text.split() if ln.count("|") == 2) if n.isdigit()
    )


def queue_state(job_id: str) -> str | None:
    """The state squeue gives a job still in the queue (None: not there, or no answer)."""
    line = queue_field(job_id, "%T")
    return line.split()[0] if line else None


def queue_workdir(job_id: str) -> str | None:
    """The working directory of a job still in the queue (sacct may not list it yet); "" when it is
    not in the queue, None when squeue does not answer."""
    out = queue_field(job_id, "%Z")
    return out.splitlines()[0] if out else out


# `squeue -j` of a job slurmctld no longer holds (past MinJobAge) fails with this; one it still holds
# after its end prints nothing, exit 0 (measured, 22.05): both mean "not in the queue"
GONE = "slurm_load_jobs error: Invalid job id specified"


def queue_field(job_id: str, fmt: str) -> str | None:
    """squeue's `-o FMT` line of a job still in the queue ("" when it is not there; None: no answer)."""
    out, why = ask("squeue", "-h", "-j", job_id, "-o", fmt)
    if out is None:
        return "" if GONE in why else None
    return out.strip()


def in_queue(job: str) -> bool:
    """squeue lists the job (for an array: some task of it is still pending or running)."""
    return bool((tool("squeue", "-h", "-j", job, "-o", "%i", timeout=60) or "").strip())
