"""A real Slurm test cluster on this machine: munged, MariaDB + slurmdbd, slurmctld, 3× slurmd.

Everything lives under one temp directory and listens on loopback ports picked at random; each
slurmd runs under `unshare --uts --mount` with its own hostname (n1, n2, n3) and a hosts file
bind-mounted over /etc/hosts. `stop()` ends exactly the processes `start()` began (settings:
the slurm.conf written below, docs/sweeps.md "The test cluster"). For fault tests, `kill_node(n)` SIGKILLs every
process in node n's UTS namespace (slurmd, slurmstepds, tasks) and `revive_node(n)` boots its
slurmd again; SlurmdTimeout=10 and ReturnToService=2 make Slurm notice both within seconds.
With `cgroups=True`, cgroups as sites run them (task/cgroup, proctrack/cgroup, jobacct_gather/cgroup,
memory a consumable resource): a job over its --mem is a real cgroup OOM kill (docs/sweeps.md).

The host's Slurm is Debian 12's 22.05. With `sysroot=` (a Debian 13 root from `.ci/slurm24`), every
Slurm daemon and client, and munged, runs from that root instead (Slurm 24.11): its root (pivot_root), in a private
mount namespace that binds the host paths a job uses at the same paths (`SYSROOT_BINDS`, the cluster's
directory, the checkout, the host Python's prefix); `bin/` holds wrappers for the clients, first on
the cluster's PATH, so `hpctrain` on the "login node" and the jobs' batch shells use 24.11's
sbatch/scontrol/sacct. MariaDB stays the host's (slurmdbd talks to it over TCP on loopback).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import WAIT_S, free_port
from tests.site_users import LOGIN_PATH, SiteUsers, login_env

NODES = ("n1", "n2")
# A third node (n3; more with SlurmCluster(spare_nodes=…)) only in SPARE_PARTITION (docs/spares.md, hot
# spares: a 3-node allocation training on 2): the other partitions keep n1 and n2, so what every other
# test schedules on is unchanged.
SPARE_PARTITION = "spares"
CPUS_PER_NODE = 4
# A node whose slurmd stops answering is DOWN after this many seconds (its jobs: NODE_FAIL and,
# with --requeue, requeued); the controller pings every third of it. Default 300 s.
SLURMD_TIMEOUT = 10
# Partition-priority preemption as sites configure it: a job in URGENT takes the nodes of jobs in
# PREEMPTIBLE, which get SIGCONT+SIGTERM, GRACE_TIME seconds, SIGKILL, and are requeued by Slurm.
# Jobs in the default partition are never preempted.
PREEMPTIBLE, URGENT, GRACE_TIME = "low", "high", 30
# Site-shaped partitions over the same nodes, for `hpctrain cluster init`: GPU_PARTITION holds the
# node that declares GPUs as a GRES (no devices behind them: gres.conf AutoDetect=off, Count only),
# CPU_PARTITION the node that declares none. Jobs asking for no GPUs schedule as before on both.
GPU_PARTITION, CPU_PARTITION, GPU_NODE, CPU_NODE = "gpu", "cpu", "n2", "n1"
GPU_TYPE, GPUS_PER_NODE = "tesla", 2
# Host paths bound into a `sysroot` at the same paths (besides the cluster's own directory, the
# checkout and the host Python's prefix): what a daemon, a job's batch shell and its tasks touch.
SYSROOT_BINDS = ("/proc", "/dev", "/sys", "/tmp")
# A Python installed in these is the system's: its prefix cannot be bound into the root.
SYSTEM_PREFIXES = ("/", "/usr", "/usr/local")
# Slurm's clients, run from the sysroot through bin/<name> wrappers.
CLIENTS = (
    "sbatch",
    "srun",
    "salloc",
    "scontrol",
    "sacct",
    "sacctmgr",
    "scancel",
    "squeue",
    "sinfo",
    "sstat",
    "sprio",
    "sshare",
    "sreport",
    "sattach",
    "sbcast",
    "sdiag",
)
CHECKOUT = Path(__file__).resolve().parents[1]
# Site shapes (docs/sites.md, "Sites differ"). A site whose login shells set SBATCH_EXPORT=NONE: the
# submitting environment is enough, no cluster change. A site that announces preemption with the
# job's --signal (USR2) instead of SIGTERM: `SlurmCluster.reconfigured(**cluster.send_user_signal())`
# (the key is version-dependent, see there). A site with a default memory per CPU: every batch job
# without --mem gets SLURM_MEM_PER_CPU in its environment (22.05, measured: a batch shell and its steps
# do; an salloc's command and steps do not); `SlurmCluster.reconfigured(**DEF_MEM_PER_CPU)` applies it.
EXPORT_NONE = {"SBATCH_EXPORT": "NONE"}
# SlurmCluster(cgroups=True): cgroup.conf, in the same directory as slurm.conf (cgroup.conf(5)). This
# machine mounts cgroup v1 read-write, one hierarchy per controller under /sys/fs/cgroup; both Slurm
# builds (Debian's 22.05, the 24.11 root) are built for several slurmd per host, so each node's cgroups
# are /sys/fs/cgroup/<controller>/slurm_<node>/uid_<uid>/job_<id>/step_<id> (the "/slurm_%n" prefix).
# (No CgroupAutomount: 22.05's default is no, 24.11 logs it as "defunct".)
CGROUP_CONF = "CgroupPlugin=cgroup/v1\nConstrainRAMSpace=yes\nConstrainDevices=yes\n"
# what task/cgroup, proctrack/cgroup and jobacct_gather/cgroup use of cgroup v1
CGROUP_CONTROLLERS = ("memory", "devices", "freezer", "cpuacct")
# how often (s) jobacct_gather samples a task's memory (default 30): sacct's MaxRSS is the largest sample
GATHER_S = 1
FAKE_GPU_MAJOR = 240
DEF_MEM_PER_CPU = {"DefMemPerCPU": "100"}
PACKAGES = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmdbd": "slurmdbd",
    "munged": "munge",
    "mariadbd": "mariadb-server",
    "sbatch": "slurm-client",
    "unshare": "util-linux",
}


def missing() -> str | None:
    """Why this machine cannot run the cluster (None: it can)."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd, unshare --uts --mount)"
    gone = sorted({pkg for exe, pkg in PACKAGES.items() if not (shutil.which(exe) or Path("/usr/sbin", exe).exists())})
    if gone:
        return f"missing Debian packages: {' '.join(gone)} (apt-get install them, see .ci/run)"
    r = subprocess.run(["unshare", "--uts", "--mount", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`unshare --uts --mount` is not allowed here ({r.stderr.strip()}): slurmd nodes need it"
    return None


def cgroups_missing() -> str | None:
    """Why `SlurmCluster(cgroups=True)` cannot run here (None: it can): Slurm's cgroup/v1 plugin
    needs each controller it uses mounted read-write at /sys/fs/cgroup/<controller>."""
    mounts = Path("/proc/mounts").read_text().splitlines()
    for c in CGROUP_CONTROLLERS:
        where = f"/sys/fs/cgroup/{c}"
        m = [line.split() for line in mounts if len(line.split()) > 3 and line.split()[1] == where]
        if not m or m[0][2] != "cgroup" or "rw" not in m[0][3].split(","):
            return f"cgroup v1 `{c}` is not mounted read-write at {where} (Slurm's cgroup/v1 needs it)"
        if not os.access(where, os.W_OK):
            return f"{where} is not writable here: this machine does not delegate cgroups"
    return None


def _wait(
    what: str, check, timeout: float = 30.0, proc: subprocess.Popen | None = None, log: Path | None = None
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"test cluster: {what} did not come up\n{tail}")


@dataclass
class SlurmCluster:
    root: Path
    partition: str = "debug"
    procs: list[subprocess.Popen] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    slurmd: dict[str, subprocess.Popen] = field(default_factory=dict)
    sysroot: Path | None = None  # run Slurm and munge from this root (another Slurm version), see above
    # Site shapes (docs/sites.md): extra `NodeName` keys per node (e.g. {"n1": "CoreSpecCount=1"}) and
    # extra slurm.conf lines (e.g. "AccountingStorageEnforce=limits,qos").
    node_options: dict[str, str] = field(default_factory=dict)
    conf_extra: str = ""
    plugstack: Path | None = None  # a plugstack.conf (SPANK plugins: the fake pyxis, tests/launch/pyxis.py)
    # Cgroups as sites run them (docs/sweeps.md "The test cluster"): proctrack/cgroup, task/cgroup with
    # ConstrainRAMSpace and ConstrainDevices (a job over its --mem is a real cgroup OOM kill, its step
    # OUT_OF_MEMORY; memory a consumable resource, CR_CPU_Memory, for --mem to be a limit at all),
    # jobacct_gather/cgroup (sacct's MaxRSS per step). Off: linuxproc, task/none, no gather, CR_CPU.
    cgroups: bool = False
    # Parts real sites have (docs/sweeps.md, "Site parts"), off by default so that no other test changes:
    # a Prolog that sleeps this long on each node (a node's first step in a job waits for it; logged in
    # log/prolog.log); SlurmctldParameters=rl_enable (Slurm >= 23.02: needs a 24.11 `sysroot`); KillWait
    # (Slurm's default is 30 s). `restart_slurmctld()` restarts the controller under running jobs.
    prolog_s: float = 0
    rate_limit: bool = False
    kill_wait: int = 5
    # nodes only in SPARE_PARTITION (n3, n4, …): a job there that lost a node and is requeued without it
    # (ExcNodeList) needs one more than its size (tests/faults/test_campaign.py)
    spare_nodes: int = 1
    # SlurmdTimeout (SLURMD_TIMEOUT, 10 s, by default: node deaths noticed within seconds). A site's is
    # longer (Slurm's default 300 s): a test of what a hung node does before Slurm declares it DOWN
    # needs one above 2 × MessageTimeout + the ping interval (docs/spares.md, "The guard on Slurm 24.11").
    slurmd_timeout: int = SLURMD_TIMEOUT
    # The site's ordinary users (tests/site_users.py), made before the cluster starts: with a sysroot,
    # the host's /etc/passwd and /etc/group are bound into it (useradd replaces the files: a bind made
    # earlier would keep the old ones), and the sysroot's own directories above the bound paths get the
    # search bit they need.
    users: SiteUsers | None = None

    @property
    def all_nodes(self) -> tuple[str, ...]:
        return (*NODES, *(f"n{len(NODES) + 1 + i}" for i in range(self.spare_nodes)))

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    # -------------------------------------------------------------- start

    def start(self) -> SlurmCluster:
        r = self.root
        for d in ("etc", "log", "state", "spool", "run", "munge", "db", "tmp"):
            (r / d).mkdir(parents=True, exist_ok=True)
        self.cluster_name = f"hpct{random.randrange(10**6)}"
        ports = {k: free_port() for k in ("ctld", "dbd", "db", *self.all_nodes)}
        munge_sock = r / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        if self.sysroot is not None:
            self._enter_sysroot()
        try:
            self._start_munge(munge_sock)
            self._start_mariadb(ports["db"])
            self._write_conf(ports, munge_sock)
            self._start(
                "slurmdbd",
                self._cmd("/usr/sbin/slurmdbd", "-D"),
                lambda: _port_open(ports["dbd"]),
                r / "log" / "slurmdbd.log",
            )
            self._start(
                "slurmctld",
                self._cmd("/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)),
                lambda: self._scontrol_ok("ping"),
                r / "log" / "slurmctld.log",
            )
            self._write_hosts()
            for n in self.all_nodes:
                self._start_slurmd(n)
            _wait("the slurmd nodes", self._nodes_idle, 40, log=r / "log" / "slurmctld.log")
        except BaseException:
            self.stop()
            raise
        return self

    def _write_hosts(self) -> None:
        """The nodes' /etc/hosts (every name on loopback)."""
        names = " ".join((*self.all_nodes, socket.gethostname()))
        (self.root / "etc" / "hosts").write_text(f"127.0.0.1 localhost {names}\n::1 localhost ip6-localhost\n")

    def _start_slurmd(self, node: str) -> subprocess.Popen:
        hosts = self.root / "etc" / "hosts"
        inner = (
            f"hostname {node} && mount --bind {hosts} /etc/hosts && "
            f"exec {' '.join(self._cmd('/usr/sbin/slurmd'))} -D -N {node} -f {self.conf}"
        )
        p = self._start(
            f"slurmd {node}",
            ["unshare", "--uts", "--mount", "sh", "-c", inner],
            lambda: True,
            self.root / "log" / f"slurmd-{node}.log",
        )
        self.slurmd[node] = p
        return p

    def _start(self, name: str, cmd: list[str], ready, log: Path) -> subprocess.Popen:
        with open(self.root / "log" / f"{name.replace(' ', '-')}.stdout", "wb") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs.append(p)
        _wait(name, ready, 30, p, log)
        if p.poll() is not None:
            raise RuntimeError(f"test cluster: {name} exited with {p.returncode}; see {log}")
        return p

    def _start_munge(self, sock: Path) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        cmd = [
            *self._cmd("/usr/sbin/munged"),
            "-F",
            "--force",
            f"--socket={sock}",
            f"--key-file={key}",
            f"--pid-file={self.root / 'munge' / 'munged.pid'}",
            f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={self.root / 'munge' / 'seed'}",
        ]
        self._start("munged", cmd, sock.exists, self.root / "log" / "munged.log")

    def _start_mariadb(self, port: int) -> None:
        data = self.root / "db" / "data"
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                # its own temp directory: clusters started at once clashed on a temp table in /tmp
                f"--tmpdir={self.root / 'tmp'}",
            ],
            check=True,
            capture_output=True,
            env=self.env,
        )
        sock = self.root / "db" / "mysqld.sock"
        cmd = [
            "/usr/sbin/mariadbd",
            "--no-defaults",
            f"--datadir={data}",
            "--user=root",
            f"--socket={sock}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            "--skip-grant-tables",
            f"--tmpdir={self.root / 'tmp'}",
            f"--pid-file={self.root / 'db' / 'mysqld.pid'}",
            f"--log-error={self.root / 'log' / 'mariadb.log'}",
            "--innodb-buffer-pool-size=16M",
            "--skip-log-bin",
        ]
        self._start("mariadbd", cmd, lambda: _port_open(port), self.root / "log" / "mariadb.log")

    def _write_conf(self, ports: dict[str, int], munge_sock: Path) -> None:
        r = self.root
        auth = f"socket={munge_sock},cred_expire=10"
        nodes_list = ",".join(NODES)
        preempt = f"PreemptMode=REQUEUE GraceTime={GRACE_TIME}"
        gres = {GPU_NODE: f" Gres=gpu:{GPU_TYPE}:{GPUS_PER_NODE}"}
        nodes = "\n".join(
            f"NodeName={n} NodeAddr=127.0.0.1 Port={ports[n]} CPUs={CPUS_PER_NODE} "
            f"RealMemory=4000{gres.get(n, '')} {self.node_options.get(n, '')} State=UNKNOWN"
            for n in self.all_nodes
        )
        (r / "dev").mkdir(exist_ok=True)
        for i in range(GPUS_PER_NODE):  # stand-ins for /dev/nvidia<i> (slurmd wants character devices)
            # as /dev/null; with ConstrainDevices, a number no driver has (a job without the GPU is denied
            # it, and /dev/null with it): major 240, "LOCAL/EXPERIMENTAL USE" (the kernel's devices.txt)
            dev = os.makedev(FAKE_GPU_MAJOR, i) if self.cgroups else os.makedev(1, 3)
            with contextlib.suppress(FileExistsError):
                os.mknod(r / "dev" / f"gpu{i}", 0o600 | stat.S_IFCHR, dev)
        (r / "etc" / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={GPU_NODE} Name=gpu Type={GPU_TYPE} File={r}/dev/gpu[0-{GPUS_PER_NODE - 1}]\n"
        )
        self.conf.write_text(f"""\
ClusterName={self.cluster_name}
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={ports["ctld"]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo={auth}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType={"proctrack/cgroup" if self.cgroups else "proctrack/linuxproc"}
TaskPlugin={"task/cgroup" if self.cgroups else "task/none"}
SelectType=select/cons_tres
SelectTypeParameters={"CR_CPU_Memory" if self.cgroups else "CR_CPU"}
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout={self.slurmd_timeout}
FirstJobId={random.randrange(1000, 900000)}
SchedulerParameters=sched_interval=1,bf_interval=1
JobRequeue=1
KillWait={self.kill_wait}
InactiveLimit=0
MinJobAge=300
JobAcctGatherType={"jobacct_gather/cgroup" if self.cgroups else "jobacct_gather/none"}
{f"JobAcctGatherFrequency=task={GATHER_S}" if self.cgroups else ""}
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports["dbd"]}
AccountingStoragePass={munge_sock}
{nodes}
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName={self.partition} Nodes={nodes_list} Default=YES MaxTime=INFINITE State=UP PreemptMode=OFF
PartitionName={PREEMPTIBLE} Nodes={nodes_list} MaxTime=INFINITE State=UP PriorityTier=1 {preempt}
PartitionName={URGENT} Nodes={nodes_list} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
PartitionName={GPU_PARTITION} Nodes={GPU_NODE} MaxTime=2-00:00:00 State=UP PreemptMode=OFF
PartitionName={CPU_PARTITION} Nodes={CPU_NODE} MaxTime=04:00:00 State=UP PreemptMode=OFF
PartitionName={SPARE_PARTITION} Nodes={",".join(self.all_nodes)} MaxTime=INFINITE State=UP PreemptMode=OFF
{f"PlugStackConfig={self.plugstack}" if self.plugstack else ""}
{self._site_parts()}
{self.conf_extra}
""")
        if self.cgroups:
            (r / "etc" / "cgroup.conf").write_text(CGROUP_CONF)
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={munge_sock}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports["dbd"]}
SlurmUser=root
PidFile={r}/run/slurmdbd.pid
LogFile={r}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports["db"]}
StorageUser=root
StorageLoc=slurm_{self.cluster_name}
""")
        dbd.chmod(0o600)

    def _site_parts(self) -> str:
        """The slurm.conf lines of the site parts asked for (prolog_s, rate_limit); writes the Prolog."""
        lines = []
        if self.prolog_s:
            log = self.root / "log" / "prolog.log"
            _script(
                self.root / "etc" / "prolog",
                f'#!/bin/sh\necho "$(date +%s.%N) start job $SLURM_JOB_ID on $SLURMD_NODENAME" >> {log}\n'
                f'sleep {self.prolog_s:g}\necho "$(date +%s.%N) end job $SLURM_JOB_ID on $SLURMD_NODENAME" >> {log}\n',
            )
            lines.append(f"Prolog={self.root / 'etc' / 'prolog'}")
        if self.rate_limit:
            v = subprocess.run(self._cmd("/usr/sbin/slurmctld", "-V"), capture_output=True, text=True).stdout
            if "22.05" in v:
                raise ValueError(
                    f"rate_limit=True: SlurmctldParameters=rl_enable came in Slurm 23.02 and this cluster's "
                    f"Slurm is {v.strip()}: give sysroot=slurm24_root()[0] (Slurm 24.11)"
                )
            lines.append("SlurmctldParameters=rl_enable")
        return "\n".join(lines)

    def _scontrol_ok(self, *args: str) -> bool:
        r = subprocess.run(["scontrol", *args], capture_output=True, text=True, env=self.env, timeout=20)
        return r.returncode == 0

    def _nodes_idle(self) -> bool:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env, timeout=20
        )
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.all_nodes)

    # -------------------------------------------------------------- another Slurm version

    def _cmd(self, *cmd: str) -> list[str]:
        """A daemon's command line: in the sysroot when there is one."""
        return [str(self.root / "bin" / "enter"), *cmd] if self.sysroot is not None else list(cmd)

    def _enter_sysroot(self) -> None:
        """bin/enter (run a command in the sysroot, from the same working directory) and a wrapper
        per Slurm client; the cluster's PATH finds the wrappers first."""
        r, root = self.root, self.sysroot
        assert root is not None
        if sys.base_prefix in SYSTEM_PREFIXES:  # binding it would cover the root's own /usr
            raise RuntimeError(
                f"the suite's Python {sys.executable} is a venv of the system's Python ({sys.base_prefix}), "
                f"which the Slurm root {root} cannot be given without covering its own {sys.base_prefix}: run the "
                "suite from a venv of another Python (python3 on PATH: pyenv's, uv's), as .ci/run does"
            )
        binds = [*SYSROOT_BINDS, str(r), str(CHECKOUT), sys.prefix, sys.base_prefix]
        binds = sorted({b for b in binds if not any(Path(b).is_relative_to(o) and b != o for o in binds)})
        for b in binds:  # mount points (a bind needs one; in the shared root, harmless)
            (root / b.lstrip("/")).mkdir(parents=True, exist_ok=True)
            if self.users is not None:  # e.g. the root's own /root (0700) above the host Python
                self.users.reach(root / b.lstrip("/"))
        (root / "etc" / "hosts").touch()
        (root / ".oldroot").mkdir(exist_ok=True)  # where pivot_root puts the host's root (then unmounted)
        self._write_hosts()  # bound over the sysroot's /etc/hosts by every command
        (r / "bin").mkdir(exist_ok=True)
        q = shlex.quote
        mounts = "\n".join(f"mount --rbind {q(b)} {q(str(root) + b)}" for b in binds)
        _script(
            r / "bin" / "enter-ns",
            f"""\
#!/bin/sh
# The second half of bin/enter, in its private mount namespace: bind, pivot_root, cd back.
set -e
cwd=$1; shift
# the root a mount point of its own: `unshare --mount` in it (a job's fake apptainer) can then
# make its mounts private
mount --bind {q(str(root))} {q(str(root))}
{mounts}
mount --bind {q(str(r / "etc" / "hosts"))} {q(str(root / "etc" / "hosts"))}
mount --bind /etc/passwd {q(str(root / "etc" / "passwd"))}
mount --bind /etc/group {q(str(root / "etc" / "group"))}
# pivot_root, not chroot: in a chroot the kernel refuses a user namespace, which an ordinary user's
# (fake) apptainer makes (unshare(2), EPERM "the caller is in a chroot environment")
cd {q(str(root))}
/usr/sbin/pivot_root . .oldroot  # sbin: not on a user's PATH
umount -l /.oldroot
exec /bin/sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$cwd" "$@"
""",
        )
        _script(
            r / "bin" / "enter",
            f"""\
#!/bin/sh
# Run a command in the Slurm root {root} (already there: run it as it is).
[ -f /etc/hpctrain-slurm24 ] && exec "$@"
exec unshare --mount --propagation private {q(str(r / "bin" / "enter-ns"))} "$PWD" "$@"
""",
        )
        for c in CLIENTS:
            _script(r / "bin" / c, f'#!/bin/sh\nexec {q(str(r / "bin" / "enter"))} /usr/bin/{c} "$@"\n')
        self.env["PATH"] = f"{r / 'bin'}{os.pathsep}{self.env.get('PATH', os.defpath)}"

    def version(self) -> str:
        """`scontrol --version` of this cluster, e.g. 'slurm-wlm 24.11.5'."""
        return self.run("scontrol", "--version").stdout.strip()

    def send_user_signal(self) -> dict[str, str]:
        """The slurm.conf setting that makes preemption send the job's --signal instead of SIGTERM:
        22.05 spells it SlurmctldParameters=preempt_send_user_signal (and refuses the later key),
        24.11 PreemptParameters=send_user_signal (slurm.conf(5) of each; docs/sites.md)."""
        if "22.05" in self.version():
            return {"SlurmctldParameters": "preempt_send_user_signal"}
        return {"PreemptParameters": "send_user_signal"}

    # -------------------------------------------------------------- use

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The cluster's environment plus `extra`; with a sysroot, its client wrappers stay first on a
        PATH that `extra` replaces (e.g. a fake `apptainer` directory before the host's PATH)."""
        env = {**self.env, **(extra or {})}
        wrappers = str(self.root / "bin")
        if self.sysroot is not None and env.get("PATH", "").split(os.pathsep)[0] != wrappers:
            env["PATH"] = f"{wrappers}{os.pathsep}{env.get('PATH', os.defpath)}"
        return env

    def run(self, *cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        env = self.environ(kw.pop("env", {}))
        return subprocess.run(
            list(cmd), capture_output=True, text=True, env=env, check=check, timeout=kw.pop("timeout", 60), **kw
        )

    def user_run(
        self, cmd: list[str], user=None, env: dict[str, str] | None = None, **kw
    ) -> subprocess.CompletedProcess:
        """`cmd` as a site user runs it from a login shell (tests/site_users.py; the first user by
        default): their uid, groups and umask 002, a clean environment plus what the site's login
        profile sets (SLURM_CONF; on 24.11 the client wrappers first on PATH) and `env`. On 24.11 the
        command starts in the sysroot as root (its clients need that root), then becomes the user."""
        assert self.users is not None, "this cluster was started without users (SlurmCluster(users=…))"
        user = user or self.users.users[0]
        site = {"SLURM_CONF": str(self.conf)}
        if self.sysroot is not None:
            site["PATH"] = f"{self.root / 'bin'}{os.pathsep}{LOGIN_PATH}"
        wrap = [str(self.root / "bin" / "enter")] if self.sysroot is not None else None
        return subprocess.run(
            self.users.command(user, cmd, wrap),
            capture_output=True,
            text=True,
            env=login_env(user, {**site, **(env or {})}),
            timeout=kw.pop("timeout", 60),
            **kw,
        )

    def state(self, job_id: str) -> str:
        """The job's state from sacct (first line: the allocation), '' when unknown yet. A `--no-kill`
        job that lost a node has a RESIZING row first (its allocation before it shrank): skipped."""
        r = self.run("sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State", check=False)
        return ([s for s in r.stdout.split() if s != "RESIZING"] or [""])[0]

    def wait_done(self, job_id: str, timeout: float) -> str:
        """The job's final state: waits on sacct for at least `timeout` s and WAIT_S (a loaded machine
        is slow; the wait ends at the state), then fails with Slurm's rows for the job."""
        timeout = max(timeout, WAIT_S)
        end = time.monotonic() + timeout
        done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
        st = ""
        while time.monotonic() < end:
            st = self.state(job_id)
            if st.split()[0:1] and st.split()[0] in done:
                return st
            time.sleep(1)
        rows = self.run(
            "sacct", "-n", "-P", "-D", "-j", str(job_id), "-o", "JobID,State,ExitCode,NodeList", check=False
        ).stdout.strip()
        raise TimeoutError(f"job {job_id} still {st or 'unknown'} after {timeout:.0f} s; sacct: {rows}")

    @contextlib.contextmanager
    def reconfigured(self, **settings: str):
        """The cluster in another site's shape for a while: these slurm.conf keys set (replacing the
        same keys) and `scontrol reconfigure`d; the file as it was, reconfigured again, afterwards.
        Cheaper than a second cluster; slurmctld applies this way (measured) SlurmctldParameters (22.05)
        and PreemptParameters (24.11) (`scontrol show config` shows them, the preemption signal follows)
        and DefMemPerCPU (22.05: the next job gets MinMemoryCPU and, in a batch job, SLURM_MEM_PER_CPU)."""
        before = self.conf.read_text()
        settings = dict(settings)
        for line in before.splitlines():  # SlurmctldParameters merge (rate_limit's rl_enable stays)
            k, _, v = line.partition("=")
            if k == "SlurmctldParameters" and k in settings:
                settings[k] = f"{v},{settings[k]}"
        kept = [line for line in before.splitlines() if line.split("=", 1)[0] not in settings]
        at = next(i for i, line in enumerate(kept) if line.startswith("NodeName="))
        kept[at:at] = [f"{k}={v}" for k, v in settings.items()]
        self.conf.write_text("\n".join(kept) + "\n")
        try:
            self.run("scontrol", "reconfigure")
            yield self
        finally:
            self.conf.write_text(before)
            self.run("scontrol", "reconfigure")

    # -------------------------------------------------------------- faults

    def restart_slurmctld(self, down_s: float = 0, while_down: Callable[[], object] | None = None) -> None:
        """Restart the controller under running jobs, as a site does (`systemctl restart slurmctld`):
        SIGTERM (it saves its state to StateSaveLocation and exits), `down_s` seconds without one (in
        which `while_down` runs), then a plain `slurmctld -D` (no `-i`: a restart must read its saved
        state, and a state it cannot read is an error here) that recovers the jobs; returns once
        `scontrol ping` answers."""
        (old,) = [p for p in self.procs if "/usr/sbin/slurmctld" in p.args]
        os.killpg(old.pid, signal.SIGTERM)
        old.wait(60)
        self.procs.remove(old)
        up_at = time.monotonic() + down_s
        if while_down is not None:
            while_down()
        time.sleep(max(0.0, up_at - time.monotonic()))
        self._start(
            "slurmctld restarted",
            [a for a in old.args if a != "-i"],
            lambda: self._scontrol_ok("ping"),
            self.root / "log" / "slurmctld.log",
        )

    def reset_job_ids(self, first_job_id: int) -> None:
        """The controller loses its state (StateSaveLocation wiped, as on a controller rebuilt without
        it) and counts job ids from `first_job_id` again (FirstJobId), as after MaxJobId wrapped
        around: the next job gets an id that older jobs in slurmdbd already have. slurmdbd keeps
        both (`sacct -D -j ID` lists each; measured, 22.05). Returns once `scontrol ping` answers."""
        (old,) = [p for p in self.procs if "/usr/sbin/slurmctld" in p.args]
        os.killpg(old.pid, signal.SIGTERM)
        old.wait(60)
        self.procs.remove(old)
        shutil.rmtree(self.root / "state")
        (self.root / "state").mkdir()
        self.conf.write_text(re.sub(r"(?m)^FirstJobId=\d+$", f"FirstJobId={first_job_id}", self.conf.read_text()))
        self._start(  # with -i as at start(): no state to recover
            "slurmctld without its state",
            list(old.args),
            lambda: self._scontrol_ok("ping"),
            self.root / "log" / "slurmctld.log",
        )
        _wait("the slurmd nodes", self._nodes_idle, 60, log=self.root / "log" / "slurmctld.log")

    @contextlib.contextmanager
    def slurmdbd_down(self):
        """slurmdbd stopped for the block (SIGTERM; the controller queues its messages meanwhile:
        sacct fails with "Problem talking to the database"), started again afterwards."""
        (old,) = [p for p in self.procs if "/usr/sbin/slurmdbd" in p.args]
        os.killpg(old.pid, signal.SIGTERM)
        old.wait(60)
        self.procs.remove(old)
        try:
            yield self
        finally:
            port = int(re.search(r"(?m)^AccountingStoragePort=(\d+)$", self.conf.read_text()).group(1))
            self._start(
                "slurmdbd restarted", list(old.args), lambda: _port_open(port), self.root / "log" / "slurmdbd.log"
            )

    def pause_slurmctld(self, seconds: float) -> None:
        """The controller stalls (swapping, a long lock): SIGSTOP for `seconds`, then SIGCONT. Its
        socket still takes connections, so clients wait MessageTimeout and fail with "Socket timed
        out on send/recv operation" (measured, 22.05), and the requests queued meanwhile are carried
        out once it wakes."""
        (ctld,) = [p for p in self.procs if "/usr/sbin/slurmctld" in p.args]
        os.killpg(ctld.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.killpg(ctld.pid, signal.SIGCONT)

    def node_pids(self, node: str) -> list[int]:
        """Every process in the node's UTS namespace: its slurmd, slurmstepds, batch shells, tasks."""
        p = self.slurmd[node]
        try:
            ns = os.readlink(f"/proc/{p.pid}/ns/uts")
        except OSError:
            return []
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(d / "ns" / "uts") == ns:
                        pids.append(int(d.name))
        return pids

    def kill_node(self, node: str) -> int:
        """The node dies: SIGKILL its slurmd and every process on it at once (no goodbye to the
        controller, no epilog). Returns how many processes were killed."""
        victims = self.node_pids(node)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.slurmd[node].wait(10)
        end = time.monotonic() + 10  # reparented survivors (stepds, tasks) are reaped by init
        while time.monotonic() < end and any(map(_alive, victims)):
            time.sleep(0.1)
        return len(victims)

    def freeze_node(self, node: str) -> int:
        """The node hangs (a kernel panic, a hard lockup): SIGSTOP every process on it at once. Its
        sockets stay open and silent, as a dead machine's do; after kill_node the shared kernel closes
        them (a reset no dead machine sends), which ends the steps whose srun ran there at once.
        Returns how many processes were stopped; kill_node and revive_node bring it back."""
        victims = self.node_pids(node)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return len(victims)

    def node_state(self, node: str) -> str:
        r = self.run("sinfo", "-h", "-n", node, "-o", "%t", check=False)
        return r.stdout.strip()

    def fail_node(self, node: str, reason: str, timeout: float = 30) -> None:
        """Take `node` down under its jobs (they end NODE_FAIL) and wait until it serves again.
        ReturnToService=2 may have put it back already (its slurmd answers): then resume is refused."""
        self.run("scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}")
        self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        end = time.monotonic() + timeout
        while self.node_state(node).rstrip("*~#") not in ("idle", "mix", "alloc"):
            assert time.monotonic() < end, f"{node} did not come back: {self.node_state(node)}"
            time.sleep(0.3)

    def revive_node(self, node: str, timeout: float = 60) -> None:
        """Boot the node again: a fresh slurmd as start() runs it; wait until Slurm uses it
        again (ReturnToService=2: it returns as soon as its slurmd registers)."""
        old = self.slurmd.pop(node, None)
        if old in self.procs:
            self.procs.remove(old)
        self._start_slurmd(node)
        _wait(
            f"node {node} back in service",
            lambda: self.node_state(node).rstrip("*") in ("idle", "mix", "alloc"),
            timeout,
            log=self.root / "log" / "slurmctld.log",
        )

    # -------------------------------------------------------------- stop

    def stop(self) -> None:
        """Cancel this cluster's jobs, then end the daemons it started (their own sessions)."""
        if self.procs and self.env:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                jobs = self.run("squeue", "-h", "-o", "%A", check=False, timeout=20).stdout.split()
                if jobs:  # every user's
                    self.run("scancel", "--full", *jobs, check=False, timeout=20)
                end = time.monotonic() + 20
                while time.monotonic() < end and self.run("squeue", "-h", check=False).stdout.strip():
                    time.sleep(0.5)
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self.procs.clear()


def slurm24_root(wait_s: float = 600) -> tuple[Path | None, str]:
    """The Slurm 24.11 root that `.ci/slurm24 --prepare` builds, once built; waits while another
    process builds it (its lock is held). (None, why) when it is not there."""
    r = subprocess.run(
        ["bash", str(CHECKOUT / ".ci" / "slurm24"), "--path"], capture_output=True, text=True, check=True
    )
    root = Path(r.stdout.strip())
    ready = root / "etc" / "hpctrain-slurm24"
    lock = Path(f"{root}.lock")
    if not ready.exists() and lock.exists():
        with open(lock) as f:
            end = time.monotonic() + wait_s
            while True:  # a build in progress holds the lock: wait for it
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > end:
                        return None, f"the Slurm 24.11 root at {root} is still being built after {wait_s:.0f} s"
                    time.sleep(1)
    if ready.exists():
        return root, ""
    return None, (
        f"no Slurm 24.11 root at {root}: build it with `bash .ci/slurm24 --prepare` "
        "(debootstrap of Debian 13, ~2 min, ~300 MB)"
    )


def slurm24_sysroot() -> Path:
    """The 24.11 root for a test's own cluster (`SlurmCluster(..., sysroot=)`). Skipped where the
    cluster cannot run or the root is not built, except in CI (CI set), where a missing root fails
    the test: the 24.11 tests must run there."""
    why = missing()
    if why:
        pytest.skip(why)
    root, why = slurm24_root()
    if root is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI: {why} (.ci/run builds it: see .ci-slurm24-prepare.log)")
        pytest.skip(why)
    return root


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    """Running (a zombie left for its parent or init to reap counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
