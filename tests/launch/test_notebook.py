"""`hpctrain notebook`: the batch script and tunnel command it prints, and its errors."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hpctrain import shellfile
from hpctrain.cli import main
from hpctrain.launch import notebook as nbmod
from hpctrain.launch.notebook import (
    PORT_RANGE,
    NotebookError,
    NotebookJob,
    batch_script,
    submit,
    tensorboard_port,
    tunnel_command,
)
from tests.helpers import free_port, this_python_as
from tests.launch.jobs import hp
from tests.launch.test_container import FAKE_APPTAINER


def test_dry_run_prints_script_and_tunnel(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(
        [
            "notebook",
            "--nodes",
            "1",
            "--dry-run",
            "--image",
            "/scratch/me/ngc.sif",
            "--partition",
            "gpu",
            "--setup",
            "module load apptainer",
            "--login-host",
            "login.example.org",
            "--port",
            "23456",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    script, _, tail = out.partition("# on your laptop")
    assert script.splitlines() == [
        "#!/bin/bash -l",
        "#SBATCH --job-name=hpctrain-notebook",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --time=04:00:00",
        f"#SBATCH --output={tmp_path}/notebook-%j.log",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --partition=gpu",
        "set -euo pipefail",
        "module load apptainer",
        f"cd {tmp_path}",
        f"hpctrain_token_dir={tmp_path}/.hpctrain",
        "hpctrain_port=23456",
        *shellfile.lines("notebook.sh"),  # the token, then PYTHONNOUSERSITE=1 (its lines run below)
        "exec apptainer exec --nv /scratch/me/ngc.sif jupyter lab --no-browser --ip=127.0.0.1 --port=23456 "
        f"--ServerApp.port_retries=0 --ServerApp.root_dir={tmp_path}",
    ]
    assert tail.splitlines()[1] == (
        "ssh -N -J login.example.org -L 23456:127.0.0.1:23456 -L 23457:127.0.0.1:23457 <node>"
    )  # Jupyter, TensorBoard
    # where the token will be, and that it is not printed
    assert tail.splitlines()[2] == (
        f"# the token (the job writes it, mode 0600; never in the log): "
        f"cat '{tmp_path}/.hpctrain/notebook-<job id>.token'"
    )
    assert tail.splitlines()[3] == (
        "# TensorBoard: in a Jupyter terminal run `tensorboard --logdir runs --port 23457` "
        "(or runs/<name>/tb for one run), then open http://localhost:23457/"
    )
    (tmp_path / "nb.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "nb.sh")]).returncode == 0


def test_without_image_and_quoting(tmp_path):
    job = NotebookJob(gpus_per_node=0, workdir=str(tmp_path / "my notebooks"), port=30000, mem="64G")
    s = batch_script(job)
    assert "--gpus-per-node" not in s and "#SBATCH --mem=64G" in s
    assert f"cd '{tmp_path}/my notebooks'" in s
    assert s.rstrip().endswith(
        f"exec python3 -m jupyter lab --no-browser --ip=127.0.0.1 --port=30000 --ServerApp.port_retries=0 "
        f"'--ServerApp.root_dir={tmp_path}/my notebooks'"
    )
    assert tunnel_command(job, "gpu017", "me@login") == (
        "ssh -N -J me@login -L 30000:127.0.0.1:30000 -L 30001:127.0.0.1:30001 gpu017"
    )
    # the TensorBoard forward stays a valid port, off Jupyter's, at the range's ends
    assert tensorboard_port(NotebookJob(port=PORT_RANGE[1] - 1)) == PORT_RANGE[1] - 2
    assert tensorboard_port(NotebookJob(port=65535)) == 65534


def test_bad_values_and_no_sbatch(monkeypatch, tmp_path, capsys):
    with pytest.raises(NotebookError, match="--time '4h': use Slurm's format"):
        batch_script(NotebookJob(time="4h"))
    with pytest.raises(NotebookError, match="--port 80"):
        batch_script(NotebookJob(port=80))
    with pytest.raises(NotebookError, match=r"--qos 'a\\nb' contains a control character \(\\n\)"):
        batch_script(NotebookJob(qos="a\nb"))  # would end the #SBATCH line
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NotebookError, match="sbatch is not on the PATH: run this on a Slurm login node"):
        submit(NotebookJob())
    assert main(["notebook"]) == 2
    assert capsys.readouterr().err.startswith("hpctrain: error: sbatch is not on the PATH")


def test_cluster_profile_supplies_site_defaults(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["notebook", "--cluster", "example-ib", "--dry-run", "--port", "23456"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --partition=gpu" in out
    # Jupyter runs in the image: the profile's container modules, and no purge (it could remove them)
    assert "HPCTRAIN_CONTAINER_MODULES=${HPCTRAIN_CONTAINER_MODULES-apptainer}" in out and "module purge" not in out
    assert "exec apptainer exec --nv /shared/images/hpctrain-pytorch-23.12.sif jupyter lab" in out
    # flags still win over the profile
    assert main(["notebook", "--cluster", "example-ib", "--partition", "debug", "--dry-run"]) == 0
    assert "#SBATCH --partition=debug" in capsys.readouterr().out
    # the profile's QOS and node features too (a site's interactive QOS; GPUs of one kind)
    site = tmp_path / "site.yaml"
    site.write_text("name: site\nslurm:\n  qos: interactive\n  constraint: a100\n")
    assert main(["notebook", "--cluster", str(site), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --qos=interactive" in out and "#SBATCH --constraint=a100" in out
    assert main(["notebook", "--cluster", str(site), "--qos", "debug", "--dry-run"]) == 0
    assert "#SBATCH --qos=debug" in capsys.readouterr().out


# --- the token and the port: nothing another user of the node can read or guess ------------------

JOB_ID = "4242"


def run_batch_script(
    script: str, workdir: Path, path_dir: Path, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.Popen:
    """Run the batch script as Slurm would: bash, SLURM_JOB_ID set, stdout and stderr into the job's
    log under the usual umask 022 (Slurm creates the log with the submitter's umask)."""
    (workdir / "nb.sh").write_text(script)
    log = open(workdir / f"notebook-{JOB_ID}.log", "w")  # noqa: SIM115 - closed when the job ends
    e = {**os.environ, "SLURM_JOB_ID": JOB_ID, "PATH": f"{path_dir}:{os.environ['PATH']}", **(env or {})}
    return subprocess.Popen(
        ["bash", str(workdir / "nb.sh")],
        cwd=workdir,
        env=e,
        stdout=log,
        stderr=log,
        start_new_session=True,
        preexec_fn=lambda: os.umask(0o022),
    )


def stub_python3(bin_dir: Path) -> None:
    """A `python3` that stands in for Jupyter: it says whether JUPYTER_TOKEN is the token file's
    content, without printing either."""
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(
        '#!/bin/sh\nif [ -n "$JUPYTER_TOKEN" ] && [ "$JUPYTER_TOKEN" = "$(cat .hpctrain/notebook-'
        '$SLURM_JOB_ID.token)" ]; then echo "jupyter got the token"; fi\necho "jupyter args: $*"\n'
    )
    stub.chmod(0o755)


def test_token_goes_to_a_0600_file_and_to_jupyter_never_to_the_log(tmp_path):
    workdir = tmp_path / "nb"
    (workdir / ".hpctrain").mkdir(parents=True)
    stale = workdir / ".hpctrain" / f"notebook-{JOB_ID}.token"
    stale.write_text("old")  # a leftover, world-readable: a plain `>` would keep its mode
    stale.chmod(0o644)
    stub_python3(tmp_path / "bin")
    job = NotebookJob(workdir=str(workdir), gpus_per_node=0, port=31234)
    p = run_batch_script(batch_script(job), workdir, tmp_path / "bin")
    assert p.wait(timeout=30) == 0
    token = stale.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token)  # 32 bytes from /dev/urandom, no newline
    assert stat.S_IMODE(stale.stat().st_mode) == 0o600
    log = (workdir / f"notebook-{JOB_ID}.log").read_text()
    assert "jupyter got the token" in log and "--port=31234" in log
    assert token not in log
    assert f"token in {stale}" in log  # where it is, not what it is


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None, reason="jupyterlab is not installed")
def test_real_jupyter_takes_the_token_from_the_job_and_does_not_print_it(tmp_path):
    """Jupyter Server given JUPYTER_TOKEN treats it as not generated: its start-up URL shows
    `token=...`; requests without the token are refused (403), with it accepted."""
    workdir, home = tmp_path / "nb", tmp_path / "home"
    workdir.mkdir()
    (home / "cfg").mkdir(parents=True)
    # tests run as root, which Jupyter refuses unless told; a site's users are not root
    (home / "cfg" / "jupyter_server_config.json").write_text('{"ServerApp": {"allow_root": true}}')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    this_python_as(bin_dir / "python3")  # the interpreter that has jupyterlab
    port = free_port()
    env = {
        "HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(home / "cfg"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "rt"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    p = run_batch_script(
        batch_script(NotebookJob(workdir=str(workdir), gpus_per_node=0, port=port)), workdir, bin_dir, env
    )
    try:
        token_path = workdir / ".hpctrain" / f"notebook-{JOB_ID}.token"
        status = api_status(port, None, p)
        token = token_path.read_text()
        assert status == 403 and api_status(port, token, p) == 200
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        log = (workdir / f"notebook-{JOB_ID}.log").read_text()
        assert f"http://127.0.0.1:{port}/lab?token=..." in log, log[-3000:]
        assert token not in log
    finally:
        with contextlib.suppress(ProcessLookupError):  # a job that ended early: its failure is the news
            os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)


def api_status(port: int, token: str | None, proc: subprocess.Popen, timeout: float = 90) -> int:
    """HTTP status of Jupyter's /api/status, once the server listens."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/status", headers={"Authorization": f"token {token}"} if token else {}
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            assert proc.poll() is None, "the notebook job ended before Jupyter listened"
            assert time.monotonic() < deadline, "Jupyter did not listen"
            time.sleep(0.3)


def test_port_is_random_per_job_and_port_flag_wins(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ports = []
    for _ in range(10):
        assert main(["notebook", "--dry-run"]) == 0
        ports.append(int(re.search(r"--port=(\d+)", capsys.readouterr().out).group(1)))
    assert len(set(ports)) > 1 and all(PORT_RANGE[0] <= p < PORT_RANGE[1] for p in ports)
    assert main(["notebook", "--dry-run", "--port", "23456"]) == 0
    out = capsys.readouterr().out
    assert "--port=23456 " in out and "-L 23456:127.0.0.1:23456" in out


# --- the image's runtime: SingularityCE and pyxis sites, not Apptainer only -----------------------


def stub_jupyter(bin_dir: Path) -> None:
    """A `jupyter` in the image: whether it got the job's token, which container it runs in, where, and
    whether a Slurm client works there (it must not: the image has none)."""
    bin_dir.mkdir()
    stub = bin_dir / "jupyter"
    stub.write_text(
        '#!/bin/sh\nif [ -n "$JUPYTER_TOKEN" ] && [ "$JUPYTER_TOKEN" = "$(cat .hpctrain/notebook-'
        '$SLURM_JOB_ID.token)" ]; then echo "jupyter got the token"; fi\n'
        'echo "in image: ${SINGULARITY_CONTAINER:-}${FROM_IMAGE:-} cwd: $(pwd) args: $*"\n'
        'scontrol version >/dev/null 2>&1 || echo "no slurm here"\n'
        'sleep "${STUB_SERVE_S:-0}"\n'
    )  # serving, as long as the test needs the job to run
    stub.chmod(0o755)


def test_dry_run_starts_the_image_with_the_runtime_named(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["notebook", "--image", "/i/nb.sif", "--runtime", "singularity", "--dry-run", "--port", "23456"]) == 0
    assert "exec singularity exec --nv /i/nb.sif jupyter lab --no-browser" in capsys.readouterr().out
    assert main(["notebook", "--image", "/i/nb.sqsh", "--runtime", "pyxis", "--cpus", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        f"exec srun --nodes=1 --ntasks=1 --cpus-per-task=4 --container-image=/i/nb.sqsh "
        f"--container-mounts={tmp_path}:{tmp_path} --container-workdir={tmp_path} jupyter lab"
    ) in out
    site = tmp_path / "site.yaml"  # a SingularityCE site's profile: its runtime and image by default
    site.write_text("name: site\ncontainer:\n  runtime: singularity\n  image: /shared/nb.sif\n")
    assert main(["notebook", "--cluster", str(site), "--dry-run"]) == 0
    assert "exec singularity exec --nv /shared/nb.sif jupyter lab" in capsys.readouterr().out
    assert main(["notebook", "--cluster", str(site), "--runtime", "none", "--dry-run"]) == 0
    assert "exec python3 -m jupyter lab" in capsys.readouterr().out
    with pytest.raises(NotebookError, match="with --runtime none: name the runtime that starts it"):
        batch_script(NotebookJob(image="/i/nb.sif", runtime="none", workdir=str(tmp_path)))
    with pytest.raises(NotebookError, match="holds ',', which pyxis"):
        batch_script(NotebookJob(image="/i/nb.sqsh", runtime="pyxis", workdir="/a,b"))


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake singularity needs unshare --mount (root)")
def test_notebook_on_a_singularityce_site_starts_jupyter_in_the_image_with_the_token(tmp_path):
    """SingularityCE has no `apptainer` command: the job starts Jupyter through `singularity exec`, and
    the token reaches it from the job's environment without a SINGULARITYENV_ copy."""
    workdir, host_bin, image = tmp_path / "nb", tmp_path / "bin", tmp_path / "nb.sif"
    workdir.mkdir()
    host_bin.mkdir()
    (host_bin / "singularity").symlink_to(FAKE_APPTAINER)
    stub_jupyter(tmp_path / "imgbin")
    image.write_bytes(b"sif")
    job = NotebookJob(workdir=str(workdir), gpus_per_node=0, port=31234, image=str(image), runtime="singularity")
    p = run_batch_script(
        batch_script(job),
        workdir,
        host_bin,
        env={"FAKE_APPTAINER_BIN": str(tmp_path / "imgbin"), "FAKE_APPTAINER_PYTHON": sys.executable},
    )
    assert p.wait(timeout=60) == 0, (workdir / f"notebook-{JOB_ID}.log").read_text()
    log = (workdir / f"notebook-{JOB_ID}.log").read_text()
    assert "jupyter got the token" in log and f"in image: {image} cwd: {workdir}" in log, log
    assert "--port=31234" in log and "no slurm here" in log


@pytest.mark.slurm
def test_notebook_through_pyxis_runs_jupyter_in_the_image_on_the_test_cluster(slurm_cluster, tmp_path):
    """pyxis (the test cluster's SPANK plugin): the batch script starts Jupyter as a step in the image
    named by --container-image, in the notebook directory (mounted at its own path), with the token."""
    assert slurm_cluster.plugstack, "the fake pyxis plugin was not built: apt-get install gcc libslurm-dev"
    workdir = tmp_path / "nb"
    workdir.mkdir()
    slurm_cluster.users.share(workdir)  # the user's notebook directory: the job writes its log there
    stub_jupyter(tmp_path / "imgbin")
    image = tmp_path / "nb.sqsh"  # the fake image: its environment, one variable a line
    image.write_text(f"PATH={tmp_path / 'imgbin'}:/usr/bin:/bin\nFROM_IMAGE=pyxis\nSTUB_SERVE_S=6\n")
    r = hp(
        slurm_cluster,
        "notebook",
        "--image",
        str(image),
        "--runtime",
        "pyxis",
        "--gpus-per-node",
        "0",
        "--cpus",
        "1",
        "--port",
        "31235",
        "--wait",
        "60",
        cwd=workdir,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job = re.search(r"submitted notebook job (\d+)", r.stdout).group(1)
    assert slurm_cluster.wait_done(job, 60) == "COMPLETED"
    log = (workdir / f"notebook-{job}.log").read_text()
    assert "jupyter got the token" in log and f"in image: pyxis cwd: {workdir}" in log, log
    assert "--port=31235" in log and "no slurm here" in log


def test_waiting_for_the_node_asks_squeue_at_a_followers_pace(monkeypatch):
    """A notebook job that pends 10 minutes: squeue asked at 0, 5, 15, 30 s and then every minute
    (≤ 2 calls a minute, not one every 2 s), and the node named at the first ask after it started."""
    now = [0.0]
    asks = []

    def field(job_id: str, fmt: str) -> str:
        asks.append(now[0])
        return "RUNNING n7" if now[0] >= 600 else "PENDING "

    monkeypatch.setattr(nbmod, "queue_field", field)
    monkeypatch.setattr(nbmod.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(nbmod.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    assert nbmod.wait_for_node("42", timeout_s=3600) == "n7"
    assert asks[:5] == [0.0, 5.0, 15.0, 30.0, 90.0] and len(asks) <= 2 * 11, asks
