"""A local `hpctrain submit` (submitit's local executor, the README's demo) as a user meets it:
a task's UserError comes back as one line, a crash with its traceback, and a Ctrl-C stops the
ranks with a checkpoint and a stop record, leaving no process behind (launch.failure, launch.localjob)."""

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

from tests.faults.local import wait_for_step
from tests.helpers import DIGITS, WAIT_S, as_typed_at_a_terminal, hpctrain, run_metrics, wait_for

SETS = [
    "train.threads=1",
    "log.every=1",
    "train.eval_every_epochs=0",
    "ckpt.every=0",
    "log.trackers=[]",
]


def local_env() -> dict:
    """No cluster: the submit runs locally ($SLURM_CONF names no file: no Slurm configured, no profile named)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {**env, "SLURM_CONF": "/nonexistent/slurm.conf", "HPCTRAIN_CLUSTER": ""}


def submit_args(digits_root: Path, run_dir: Path, name: str, *sets: str) -> list[str]:
    args = ["-m", "hpctrain", "submit", "--config", str(DIGITS)]
    for s in (f"data.root={digits_root}", f"run.dir={run_dir}", f"run.name={name}", *SETS, *sets):
        args += ["--set", s]
    return args


def submit(digits_root: Path, run_dir: Path, name: str, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *submit_args(digits_root, run_dir, name, *sets)],
        env=local_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_missing_resume_checkpoint_is_refused_before_anything_launches(digits_root, tmp_path):
    """run.resume=nonee (a misspelt `none`) is refused on this machine, in the task's words, before a
    process starts or the run directory is written (it launched a job that failed in the task)."""
    r = submit(digits_root, tmp_path, "typo", "run.resume=nonee")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "hpctrain: error: run.resume='nonee': no such checkpoint; give auto, none or a checkpoint path"
    ]
    assert not (tmp_path / "typo").exists() and "local job" not in r.stdout + r.stderr


@pytest.mark.slow
def test_a_task_user_error_comes_back_as_one_line_with_the_log(digits_root, tmp_path):
    """A resume file that exists but is no checkpoint: only the task, loading it, can tell."""
    bogus = tmp_path / "notes.pt"
    bogus.write_text("not a checkpoint\n")
    r = submit(digits_root, tmp_path, "missing", f"run.resume={bogus}")
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and len(err) == 1, r.stderr
    job = json.loads((tmp_path / "missing" / "job.json").read_text())["job_id"]
    log = tmp_path / "missing" / "submitit" / f"{job}_0_log.err"
    assert err[0].startswith(f"hpctrain: error: checkpoint {bogus} cannot be loaded"), err
    assert err[0].endswith(f"(local job {job}, rank 0; log: {log})"), err
    assert "CheckpointError" in log.read_text()  # the log keeps the whole story


@pytest.mark.slow
def test_a_task_crash_still_shows_its_traceback_and_the_log(digits_root, tmp_path):
    """A checkpoint with the keys hpctrain checks for but no ViT weights: torch's load_state_dict
    raises RuntimeError inside the task (a crash, not a UserError)."""
    import torch

    bogus = tmp_path / "bogus.pt"
    torch.save({"model": {"x": torch.zeros(1)}, "step": 1}, bogus)
    r = submit(digits_root, tmp_path, "crash", f"run.resume={bogus}")
    assert r.returncode != 0
    job = json.loads((tmp_path / "crash" / "job.json").read_text())["job_id"]
    assert r.stderr.count("Traceback") == 1 and "load_state_dict" in r.stderr, r.stderr  # the task's, not ours
    assert r.stderr.strip().splitlines()[-1] == (
        f"hpctrain: error: local job {job} crashed on rank 0 (traceback above; log: "
        f"{tmp_path / 'crash' / 'submitit' / f'{job}_0_log.err'})"
    ), r.stderr


def gone(pid: int) -> bool:
    """No such process, or only a zombie left for its parent to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_ctrl_c_of_a_local_submit_stops_every_rank_with_a_checkpoint(digits_root, tmp_path):
    """Ctrl-C (SIGINT to the terminal's whole process group: `submit`, submitit's controller and, by
    default, the ranks): every rank stops at one step with its checkpoint and stop record, no
    process of the job is left, `submit` exits 130 saying so, and `status` says INTERRUPTED with
    no ETA. (SIGINT to `submit` alone takes the same path: it forwards one SIGINT to each rank.)"""
    run = tmp_path / "cc"
    # long enough that the Ctrl-C below comes while it trains, however slow the refused second submit is
    # on a loaded machine (400 steps ended first there once): the stop, not the length, is the test
    p = subprocess.Popen(
        [sys.executable, *submit_args(digits_root, tmp_path, "cc", "train.max_steps=4000")],
        env=local_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=as_typed_at_a_terminal,
    )  # its own group, as a shell gives a foreground job
    wait_for_step(run, 3, [p])
    job = json.loads((run / "job.json").read_text())["job_id"]
    again = submit(digits_root, tmp_path, "cc")  # the same run while it trains: refused before anything
    assert again.returncode == 2 and again.stderr == (
        f"hpctrain: error: run directory {run} is in use by local job {job}: wait for it (hpctrain logs {run} -f), "
        "stop it (Ctrl-C where it was started: it checkpoints), or give this run another run.name\n"
    ), again.stderr
    assert json.loads((run / "job.json").read_text())["job_id"] == job
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=WAIT_S)
    assert p.returncode == 130, out[-2000:] + err[-3000:]
    (stop,) = run_metrics(run, "stop")
    assert stop["stop_kind"] == "interrupt" and 3 <= stop["step"] < 4000, stop
    assert [r["step"] for r in run_metrics(run, "checkpoint")] == [stop["step"]]
    assert f"local job {job} stopped at step {stop['step']}, checkpoint" in err and "Traceback" not in err, err
    tasks = [json.loads(f.read_text())["pid"] for f in sorted((run / "submitit").glob(f"{job}_*_task.json"))]
    assert len(tasks) == 2
    # the controller may take a poll (1/24 s) to notice its tasks ended
    wait_for(lambda: all(gone(pid) for pid in [int(job), *tasks]), "a process of the job is still alive", poll_s=0.1)
    st = json.loads(hpctrain("status", str(run), "--json").stdout)
    assert (st["state"], st["stopped_at"], st["stop_reason"], st["eta_s"]) == (
        "INTERRUPTED",
        stop["step"],
        "interrupt",
        None,
    ), st


def started_in_the_background() -> None:
    """`preexec_fn`: what bash gives a background job of a script (`hpctrain submit … &` in a
    non-interactive shell): SIGINT and SIGQUIT ignored, which every child inherits across exec."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, words",
    [
        (
            signal.SIGINT,
            "hpctrain: interrupted: local job {job} stops at the next step (checkpoint, stop record); "
            "Ctrl-C again to kill it now",
        ),
        (
            signal.SIGTERM,
            "hpctrain: got SIGTERM: local job {job} stops at the next step (checkpoint, stop record); "
            "SIGTERM again (or Ctrl-C) to kill it now",
        ),
    ],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_submit_started_with_sigint_ignored_stops_on_sigint_and_sigterm_saying_which(
    sig, words, digits_root, tmp_path
):
    """The submitter takes SIGINT back (launch.localjob.take_sigint): a script's `kill -INT` stops the
    job as a Ctrl-C does; a SIGTERM stops it too, and its words name SIGTERM, not a Ctrl-C."""
    run = tmp_path / "bg"
    p = subprocess.Popen(
        [sys.executable, *submit_args(digits_root, tmp_path, "bg", "train.max_steps=4000")],
        env=local_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=started_in_the_background,
    )
    wait_for_step(run, 3, [p])
    job = json.loads((run / "job.json").read_text())["job_id"]
    os.kill(p.pid, sig)  # to `submit` alone, as a script's `kill` sends it
    out, err = p.communicate(timeout=WAIT_S)
    assert p.returncode == 128 + sig, out[-2000:] + err[-3000:]  # 130 for SIGINT, 143 for SIGTERM
    (stop,) = run_metrics(run, "stop")
    assert stop["stop_kind"] == "interrupt" and 3 <= stop["step"] < 4000, stop
    assert words.format(job=job) in err, err
    assert f"local job {job} stopped at step {stop['step']}, checkpoint" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_a_local_run_by_name_and_job_id_and_logs_f_ends_with_it(digits_root, tmp_path):
    """From the directory a local submit ran in: `status NAME` (run.dir's default runs/) and
    `status/logs <the job id submit printed>` name the run (the id also from another directory, after
    the end); `logs NAME -f`, started while it trains, returns once the run has ended, its summary printed."""
    p = subprocess.Popen(
        [sys.executable, *submit_args(digits_root, Path("runs"), "named", "train.max_steps=12")],
        cwd=tmp_path,
        env=local_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = tmp_path / "runs" / "named"
    wait_for_step(run, 1, [p])
    follow = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "logs", "named", "-f"],
        cwd=tmp_path,
        env=local_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, out[-2000:] + err[-2000:]
    ended = time.monotonic()
    followed, ferr = follow.communicate(timeout=30)  # before: never returned for a local run
    assert follow.returncode == 0 and time.monotonic() - ended < 10, ferr
    assert "hpctrain summary" in followed and "stopped" not in followed, followed[-2000:]
    job = json.loads((run / "job.json").read_text())["job_id"]
    assert f"submitted local job {job} " in out
    (tmp_path / "elsewhere").mkdir()
    for target, cwd in (("named", tmp_path), (job, tmp_path), (job, tmp_path / "elsewhere")):
        # before: "not a run directory" / "unknown to Slurm"; from elsewhere: submit's note in the user's cache
        st = hpctrain("status", target, "--json", cwd=cwd, env=local_env())
        assert st.returncode == 0, st.stderr
        f = json.loads(st.stdout)
        assert (f["state"], f["run_dir"], f["job_id"], f["executor"]) == ("COMPLETED", str(run), job, "local"), f
    logs = hpctrain("logs", job, cwd=tmp_path, env=local_env())
    assert logs.returncode == 0 and logs.stdout == (run / "logs" / "rank-0.log").read_text(), logs.stderr


@pytest.mark.slow
def test_a_failing_local_eval_job_says_why_in_one_line(digits_root, tmp_path):
    """`hpctrain eval --nodes 1` (a local job): the task's UserError (weights that are a directory
    without checkpoints) comes back as its one line."""
    (tmp_path / "empty").mkdir()
    r = hpctrain(
        "eval",
        str(tmp_path / "empty"),
        "--config",
        str(DIGITS),
        "--set",
        f"data.root={digits_root}",
        "--nodes",
        "1",
        "--local-tasks",
        "1",
        "-o",
        str(tmp_path / "ev"),
        env=local_env(),
        timeout=300,
    )
    job = re.search(r"submitted local job (\d+)", r.stdout).group(1)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"hpctrain: error: weights={tmp_path / 'empty'} is a directory without checkpoints/")
    assert r.stderr.endswith(f"(local job {job}, rank 0; log: {tmp_path / 'ev' / 'submitit' / f'{job}_0_log.err'})\n")
