"""A Jupyter job on a compute node, reached through an SSH tunnel.

It writes its own small batch script (the CLI fills `NotebookJob` from the cluster profile); the
image starts through the site's runtime (`jupyter_command`): apptainer, SingularityCE or pyxis.
Jupyter listens on 127.0.0.1 of the node, which every user of a shared node can reach, so the
token is what keeps them out. The batch script draws it from /dev/urandom into a 0600 file
(`token_file`, umask 077 while it is written) and hands it to Jupyter in JUPYTER_TOKEN, which
Jupyter Server takes as "not generated" and so never prints: the job's log, created by Slurm
with the submitter's umask (often world-readable), holds no token. The port is drawn at random
per job rather than derived from the uid, which anyone can compute. The tunnel jumps through the
login node to the compute node (`ssh -J`).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import time
from dataclasses import dataclass, field

from hpctrain import shellfile
from hpctrain.config import control_char
from hpctrain.errors import LaunchError, UserError
from hpctrain.launch.enclosing import outside_job
from hpctrain.run.layout import CONTROL
from hpctrain.site import runtimes
from hpctrain.site.slurm_cli import ask, queue_field
from hpctrain.train.dist import expand_hostlist
from hpctrain.watch.follow import Pace

# Random ports per job: above hpctrain's MASTER_PORT range (15000 + job id mod 15000) and below
# Linux's ephemeral ports (32768-60999), where outgoing connections would take them.
PORT_RANGE = (30000, 32768)


class NotebookError(UserError):
    """A notebook job that cannot be planned or submitted; the CLI prints it as one line."""


def random_port() -> int:
    """A port no other user can predict (the old 20000 + uid % 10000 was public knowledge)."""
    return PORT_RANGE[0] + secrets.randbelow(PORT_RANGE[1] - PORT_RANGE[0])


@dataclass(frozen=True)
class NotebookJob:
    nodes: int = 1  # nodes allocated; Jupyter runs on the first, srun reaches the others
    gpus_per_node: int = 1  # GPUs per node (0: none requested)
    cpus: int = 8  # CPUs for the notebook task
    mem: str = ""  # e.g. "64G"; empty: the partition default
    time: str = "04:00:00"  # wall-clock limit
    partition: str = ""  # Slurm partition; empty: the default
    account: str = ""  # Slurm account; empty: the default
    qos: str = ""  # Slurm QOS; empty: the default (a site may require one, e.g. for interactive jobs)
    constraint: str = ""  # node features (--constraint), e.g. "a100"; empty: any node of the partition
    image: str = ""  # image to run Jupyter in (a SIF; pyxis: a squashfs or registry URI); empty: the host's python3
    runtime: str = "apptainer"  # what starts the image: apptainer/singularity exec --nv, or pyxis (srun)
    port: int = field(default_factory=random_port)  # Jupyter port on the node: random per job
    workdir: str = field(default_factory=os.getcwd)  # notebook root directory and log location
    setup: tuple[str, ...] = ()  # shell lines before Jupyter starts, e.g. "module load apptainer"
    job_name: str = "hpctrain-notebook"


def check(job: NotebookJob) -> None:
    if job.nodes < 1 or job.gpus_per_node < 0 or job.cpus < 1:
        raise NotebookError("--nodes and --cpus must be ≥ 1 and --gpus-per-node ≥ 0")
    if not 1024 < job.port < 65536:
        raise NotebookError(f"--port {job.port}: pick a port between 1025 and 65535")
    if job.runtime not in runtimes.REGISTRY:
        raise NotebookError(f"--runtime {job.runtime!r}: use one of {', '.join(runtimes.REGISTRY)}")
    rt = runtimes.get(job.runtime)
    if job.image and not rt.image_kind:
        raise NotebookError(
            f"--image {job.image!r} with --runtime {job.runtime}: name the runtime that starts it "
            f"({', '.join(r.name for r in runtimes.image_runtimes())}), or drop --image to use the host's python3"
        )
    try:
        rt.check([job.workdir] if job.image else [])
    except LaunchError as e:
        raise NotebookError(
            f"the notebook directory {job.workdir!r} cannot be mounted: {e}; or start the notebook elsewhere"
        ) from None
    if not re.fullmatch(r"(\d+-)?\d{1,3}(:\d\d){0,2}", job.time):
        raise NotebookError(f"--time {job.time!r}: use Slurm's format, e.g. 04:00:00 or 1-00:00:00")
    for key in ("mem", "partition", "account", "qos", "constraint"):  # each becomes an #SBATCH line
        bad = control_char(getattr(job, key))
        if bad:
            raise NotebookError(f"--{key} {getattr(job, key)!r} contains a control character ({bad}): remove it")


def token_file(job: NotebookJob, job_id: str = "<job id>") -> str:
    """Where the job writes its Jupyter token (0600): `cat` it on the login node (shared file system)."""
    return os.path.join(job.workdir, CONTROL, f"notebook-{job_id}.token")


def token_lines(job: NotebookJob) -> list[str]:
    """The values, then the shell lines (launch/shell/notebook.sh) that write a fresh token to a 0600
    file and export it to Jupyter unprinted."""
    return [
        shellfile.assign("hpctrain_token_dir", os.path.dirname(token_file(job))),
        f"hpctrain_port={int(job.port)}",
        *shellfile.lines("notebook.sh"),
    ]


def batch_script(job: NotebookJob) -> str:
    check(job)
    q = shlex.quote
    sb = [
        f"--job-name={job.job_name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus}",
        f"--time={job.time}",
        f"--output={os.path.join(job.workdir, 'notebook-%j.log')}",
    ]
    if job.gpus_per_node:
        sb.append(f"--gpus-per-node={job.gpus_per_node}")
    sb += [
        f"--{k}={v}"
        for k, v in (
            ("mem", job.mem),
            ("partition", job.partition),
            ("account", job.account),
            ("qos", job.qos),
            ("constraint", job.constraint),
        )
        if v
    ]
    jupyter = [
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={job.port}",
        "--ServerApp.port_retries=0",  # a busy port fails in the log, not on a port the tunnel misses
        f"--ServerApp.root_dir={job.workdir}",
    ]
    cmd = jupyter_command(job, jupyter)
    lines = [
        "#!/bin/bash -l",
        *(f"#SBATCH {q(s)}" for s in sb),
        "set -euo pipefail",
        *job.setup,
        f"cd {q(job.workdir)}",
        *token_lines(job),
        f"exec {cmd}",
    ]
    return "\n".join(lines) + "\n"


def jupyter_command(job: NotebookJob, jupyter: list[str]) -> str:
    """The command that starts Jupyter: the host's python3, or the image through the job's runtime
    (each runtime's `notebook`, site/runtimes/)."""
    rt = runtimes.get(job.runtime if job.image else "none")
    return rt.notebook(job.image, job.workdir, job.cpus, jupyter)


def tensorboard_port(job: NotebookJob) -> int:
    """The port the tunnel also forwards for TensorBoard started in the job: next to Jupyter's."""
    return job.port + 1 if job.port + 1 not in (PORT_RANGE[1], 65536) else job.port - 1


def tunnel_command(job: NotebookJob, node: str = "<node>", login: str = "<login-host>") -> str:
    """What to run on the laptop; then open http://localhost:<port>/ with the token from `token_file`.
    The second forward is for `tensorboard --port <tensorboard_port>` run inside the job."""
    tb = tensorboard_port(job)
    return f"ssh -N -J {login} -L {job.port}:127.0.0.1:{job.port} -L {tb}:127.0.0.1:{tb} {node}"


def tensorboard_hint(job: NotebookJob) -> str:
    """How to watch runs through the same tunnel (TensorBoard listens on 127.0.0.1 by default)."""
    tb = tensorboard_port(job)
    return (
        f"TensorBoard: in a Jupyter terminal run `tensorboard --logdir runs --port {tb}` "
        f"(or runs/<name>/tb for one run), then open http://localhost:{tb}/"
    )


def submit(job: NotebookJob) -> str:
    """sbatch the script (stdin); returns the job id."""
    if shutil.which("sbatch") is None:
        raise NotebookError(
            "sbatch is not on the PATH: run this on a Slurm login node (or use --dry-run to print the batch script)"
        )
    out, why = ask(*outside_job(["sbatch", "--parsable"]), input=batch_script(job), timeout=120)
    if out is None:
        raise NotebookError(f"sbatch failed: {why}")
    return out.strip().split(";")[0]


def wait_for_node(job_id: str, timeout_s: float, pace: Pace | None = None) -> str | None:
    """The first node of the job once it runs, or None when it has not started within the timeout.
    Asks squeue at a follower's pace (watch/follow.py: at once, at 5, 15 and 30 s, then every minute), not
    every 2 s for as long as the job pends."""
    pace = pace or Pace()
    deadline, n = time.monotonic() + timeout_s, 0
    while True:
        line = queue_field(job_id, "%T %N")
        state, _, nodes = (line or "").partition(" ")
        if state == "RUNNING" and nodes:
            return expand_hostlist(nodes)[0]
        if line == "":
            raise NotebookError(f"job {job_id} left the queue before it started: see notebook-{job_id}.log")
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(pace.gap(n), max(0.0, deadline - time.monotonic())))
        n += 1
