"""Real multi-node jobs on the session's Slurm test cluster (2 nodes n1, n2; gloo on loopback)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import run_metrics

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
ACC_EPOCHS = 14


def hp(cluster, *args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 120):
    """`hpctrain …` against the test cluster ($SLURM_CONF set, no $HPCTRAIN_CLUSTER)."""
    e = {k: v for k, v in cluster.env.items() if k != "HPCTRAIN_CLUSTER"}
    e.update(OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True,
                          cwd=cwd, env=e, timeout=timeout)


def digits_sets(root: Path, run_dir: Path, name: str, *extra: str) -> list[str]:
    out = []
    for s in (f"data.root={root}", f"run.dir={run_dir}", f"run.name={name}", "train.threads=1", *extra):
        out += ["--set", s]
    return out


def submit(cluster, *args: str) -> str:
    r = hp(cluster, "submit", "--config", "configs/digits_vit.yaml", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return re.search(r"submitted Slurm job (\d+)", r.stdout).group(1)


def rank_hosts(run_dir: Path) -> dict[int, tuple[int, str]]:
    """rank → (world size, host) from each rank's log."""
    out = {}
    for log in sorted((run_dir / "logs").glob("rank-*.log")):
        m = re.search(r"world size (\d+) .* rank (\d+) on host (\S+)", log.read_text())
        if m:
            out[int(m.group(2))] = (int(m.group(1)), m.group(3))
    return out


metrics = run_metrics


def wait_for_step(run_dir: Path, step: int, timeout: float) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        steps = [r["step"] for r in metrics(run_dir, "train")]
        if steps and steps[-1] >= step:
            return steps[-1]
        time.sleep(0.5)
    raise TimeoutError(f"{run_dir} did not reach step {step} in {timeout} s")


def check_run_dir(run_dir: Path, world: int) -> None:
    assert (run_dir / "config.yaml").is_file() and (run_dir / "env.json").is_file()
    assert metrics(run_dir, "end") and metrics(run_dir, "eval")
    assert (run_dir / "checkpoints" / "latest").is_file()
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [f"rank-{r}.log" for r in range(world)]
    hosts = rank_hosts(run_dir)
    assert sorted(hosts) == list(range(world)) and {w for w, _ in hosts.values()} == {world}
    assert {h for _, h in hosts.values()} == {"n1", "n2"}


@pytest.mark.slow
def test_submit_two_nodes_trains_digits_to_95(slurm_cluster, digits_root, tmp_path):
    """The must-show run: `hpctrain submit --nodes 2 --gpus-per-node 2` picks Slurm by itself."""
    job = submit(slurm_cluster, "--nodes", "2", "--gpus-per-node", "2",
                 *digits_sets(digits_root, tmp_path, "acc", f"train.epochs={ACC_EPOCHS}"))
    assert slurm_cluster.wait_done(job, 400) == "COMPLETED"
    run = tmp_path / "acc"
    check_run_dir(run, 4)
    end = metrics(run, "end")[-1]
    assert end["status"] == "finished" and end["top1"] >= 95.0, end
    assert json.loads((run / "job.json").read_text())["job_id"] == job
    st = hp(slurm_cluster, "status", job)
    assert st.returncode == 0 and "COMPLETED" in st.stdout and str(run) in st.stdout, st.stdout
    assert "requeues       0" in st.stdout
    logs = hp(slurm_cluster, "logs", str(run), "--rank", "3")
    assert "rank 3 on host n2" in logs.stdout
    follow = hp(slurm_cluster, "logs", job, "-f")  # the job has ended: prints rank 0's log, returns
    assert follow.returncode == 0 and "rank 0 on host n1" in follow.stdout and "eval step" in follow.stdout
    print(f"2 nodes x 2 tasks, {ACC_EPOCHS} epochs: val top-1 {end['top1']:.2f} %")


@pytest.fixture(scope="module")
def modulefiles(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("modulefiles")
    (d / "hpctest.lua").write_text('setenv("HPCTRAIN_MODULE_MARK", "loaded by Lmod: hpctest")\n')
    return d


def test_sbatch_script_with_overrides(slurm_cluster, digits_root, tmp_path, modulefiles):
    """`sbatch slurm/vit.sbatch` as committed: nodes/tasks/GPUs on the command line, the rest from
    the environment; the test modulefile's variable reaches every task."""
    sets = f"data.root={digits_root};run.dir={tmp_path};run.name=sb;train.epochs=1;train.threads=1"
    env = {"CONTAINER": "none", "HPCTRAIN_MODULES": "hpctest", "MODULEPATH": str(modulefiles),
           "HPCTRAIN_CONFIG": "configs/digits_vit.yaml", "HPCTRAIN_SET": sets, "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1"}
    r = slurm_cluster.run("sbatch", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=0",
                          "--cpus-per-task=1", f"--partition={slurm_cluster.partition}",
                          f"--output={tmp_path}/slurm-%j.out", str(ROOT / "slurm" / "vit.sbatch"),
                          env=env, cwd=ROOT)
    job = r.stdout.split()[-1]
    assert slurm_cluster.wait_done(job, 300) == "COMPLETED", (tmp_path / f"slurm-{job}.out").read_text()
    run = tmp_path / "sb"
    check_run_dir(run, 4)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert f"hpctrain: job {job} (restart 0) on n[1-2]: 2 nodes x 2 tasks; modules: hpctest" in out
    rec = json.loads((run / "env.json").read_text())["env"]
    assert rec["HPCTRAIN_MODULE_MARK"] == "loaded by Lmod: hpctest" and rec["LOADEDMODULES"] == "hpctest"
    assert rec["SLURM_JOB_ID"] == job
    st = hp(slurm_cluster, "status", str(run))
    assert "COMPLETED" in st.stdout and f"{job} (slurm)" in st.stdout, st.stdout


def test_preempted_job_requeues_and_resumes_exactly(slurm_cluster, digits_root, tmp_path):
    """USR2 to every task mid-run: one checkpoint at that step, requeue, resume there; the final
    weights equal an uninterrupted run's (2 nodes × 1 task, threads pinned)."""
    import torch

    common = ["--nodes", "2", "--gpus-per-node", "1"]
    extra = ("train.epochs=3", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0")
    ref = submit(slurm_cluster, *common, *digits_sets(digits_root, tmp_path, "ref", *extra))
    pre = submit(slurm_cluster, *common, *digits_sets(digits_root, tmp_path, "pre", *extra))
    wait_for_step(tmp_path / "pre", 5, 180)
    slurm_cluster.run("scancel", "--signal=USR2", pre)
    assert slurm_cluster.wait_done(pre, 300) == "COMPLETED"
    assert slurm_cluster.wait_done(ref, 300) == "COMPLETED"
    run = tmp_path / "pre"
    stops = metrics(run, "stop")
    assert len(stops) == 1 and stops[0]["reason"] == "preempted"
    k = stops[0]["step"]
    assert 5 <= k < 66
    log0 = (run / "logs" / "rank-0.log").read_text()
    assert f"resumed from {run}/checkpoints/step-{k:08d}.pt at step {k}" in log0
    st = hp(slurm_cluster, "status", pre)
    assert "COMPLETED" in st.stdout and "requeues       1" in st.stdout, st.stdout
    a = torch.load(tmp_path / "ref" / "checkpoints" / "step-00000066.pt", weights_only=True)["model"]
    b = torch.load(run / "checkpoints" / "step-00000066.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def task_pid(job: str, rank: int) -> int | None:
    """The Python process of one task of our job (found by its Slurm environment)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = dict(x.split("=", 1) for x in (d / "environ").read_text().split("\0") if "=" in x)
            argv0 = (d / "cmdline").read_text().split("\0")[0]
        except OSError:
            continue
        if (env.get("SLURM_JOB_ID") == job and env.get("SLURM_PROCID") == str(rank) and "SLURM_STEP_ID" in env
                and Path(argv0).name.startswith("python")):
            return int(d.name)
    return None


def test_killed_rank_fails_the_job_quickly(slurm_cluster, digits_root, tmp_path):
    job = submit(slurm_cluster, "--nodes", "2", "--gpus-per-node", "2",
                 *digits_sets(digits_root, tmp_path, "kill", "train.epochs=30", "train.log_every=1"))
    wait_for_step(tmp_path / "kill", 2, 180)
    pid = task_pid(job, 1)
    assert pid
    os.kill(pid, signal.SIGKILL)
    assert slurm_cluster.wait_done(job, 90) == "FAILED"  # the bound: srun --kill-on-bad-exit
    st = hp(slurm_cluster, "status", str(tmp_path / "kill"))
    assert st.returncode == 1 and "FAILED" in st.stdout, st.stdout


HOSTILE = "it's a \"run\" $(touch PWNED) `touch PWNED2`; touch PWNED3 & x"


def test_hostile_names_and_values_arrive_intact(slurm_cluster, digits_root, tmp_path):
    import yaml

    prof = tmp_path / "evil.yaml"
    prof.write_text(yaml.safe_dump({"slurm": {"request_gpus": False, "gpus_per_node": 1, "time": "10"},
                                    "env": {"HPCTRAIN_EVIL": HOSTILE}}))
    parent = tmp_path / f"dir {HOSTILE}"
    job = submit(slurm_cluster, "--cluster", str(prof), "--nodes", "1",
                 *digits_sets(digits_root, parent, HOSTILE, "train.max_steps=1"))
    assert slurm_cluster.wait_done(job, 120) == "COMPLETED"
    run = parent / HOSTILE
    assert json.loads((run / "env.json").read_text())["env"]["HPCTRAIN_EVIL"] == HOSTILE
    # the controller holds the name as given (accounting shows `"` as a backquote: Slurm's own doing)
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job).stdout
    assert re.search(r"JobName=(.*) UserId=", shown).group(1) == HOSTILE
    assert not [p for p in tmp_path.rglob("PWNED*")] and not list(ROOT.glob("PWNED*"))
