"""Which run `hpctrain status` / `logs` are asked about (watch/lookup.py): a directory that is no run,
a job id where Slurm cannot answer, a live or remembered local job from any directory, a Slurm job id."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.site.slurm_cli import CALL_LOG_VAR
from hpctrain.watch.lookup import remember_local_job
from tests.helpers import wait_for
from tests.launch.jobs import hp


def one_error_line(capsys) -> str:
    """The one line a refused command printed (nothing on stdout)."""
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, (out, err)
    return err.strip()


def test_status_and_logs_of_a_directory_that_is_no_run_refuse_in_one_line(tmp_path, monkeypatch, capsys):
    """Before, `status runs` (or `data`, `/tmp`) printed `state NOT RUNNING … ETA none`, rc 0, and `logs
    runs` suggested `hpctrain status runs`: a folder without config.yaml, job.json or metrics.jsonl is no
    run. The line names the runs under it (a sweep is one), or what to give."""
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    for name, record in (("a", "config.yaml"), ("b", "job.json"), ("s", "sweep.json")):
        (runs / name).mkdir(parents=True)
        (runs / name / record).write_text("{}\n")
    (runs / "notes").mkdir()  # no run: not listed
    (tmp_path / "data").mkdir()
    listed = "runs is not a run directory (no config.yaml, job.json or metrics.jsonl in it): give one of the runs "
    for argv in (["status", "runs"], ["status", "runs", "--json"], ["logs", "runs"], ["logs", "runs", "-f"]):
        assert main(argv) == 2, argv
        assert one_error_line(capsys) == f"hpctrain: error: {listed}under it: runs/a, runs/b, runs/s", argv
    for argv in (["status", "data"], ["logs", str(tmp_path / "data")]):
        assert main(argv) == 2, argv
        line = one_error_line(capsys)
        assert f"{argv[1]} is not a run directory" in line and "give a run directory (runs/<name>)" in line, line
    assert main(["status", "runs/a", "--json"]) == 0  # a run (config.yaml alone: not started yet) still is one
    assert json.loads(capsys.readouterr().out)["run_dir"] == str(runs / "a")


def test_a_job_id_where_slurm_cannot_answer_is_one_line_after_one_question(tmp_path, monkeypatch, capsys):
    """Before, `status 14210` (a local job's id, from another directory) asked sacct, squeue and scontrol
    again for 15 s (17 s in all), then said the job "is unknown to Slurm". A client without a usable
    configuration (here an empty slurm.conf: "Unable to process configuration file", as a login node
    without Slurm's configuration fails at once) or with no client at all: one question at most, then one
    line saying Slurm cannot be asked, and what to give."""
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv(CALL_LOG_VAR, str(log))
    (tmp_path / "slurm.conf").write_text("")
    (tmp_path / "bin").mkdir()
    client = shutil.which("sacct") is not None  # the test cluster's machines have one; a laptop may not
    cases = [
        ({"SLURM_CONF": str(tmp_path / "slurm.conf")}, "sacct: fatal: Unable to process configuration file"),
        ({"SLURM_CONF": str(tmp_path / "missing.conf")}, f"$SLURM_CONF={tmp_path / 'missing.conf'} does not exist"),
        ({"PATH": str(tmp_path / "bin")}, "no Slurm client on this machine"),
    ]
    asked = []
    for env, why in cases[0 if client else 2 :]:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        for argv in (["status", "14210"], ["logs", "14210"], ["logs", "14210", "-f"]):
            assert main(argv) == 2, argv
            line = one_error_line(capsys)
            assert line.startswith("hpctrain: error: job 14210: no local job of this host has that id (under "), line
            assert f"Slurm cannot be asked ({why}" in line and "give the run directory (runs/<name>)" in line, line
        asked.append([json.loads(x)["kind"] for x in log.read_text().splitlines()] if log.exists() else [])
        log.unlink(missing_ok=True)
    # one question per command, none where no client could answer
    assert asked == ([["sacct"] * 3, [], []] if client else [[]]), asked


def children(pid: int) -> list[int]:
    """The live children of a process of this host (none once it has gone)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_live_local_job_is_found_by_its_id_from_any_directory(tmp_path, monkeypatch, capsys):
    """A local job's id is the pid of submitit's local controller (`python -m submitit.local._local
    <run>/submitit`; submit records it in job.json). From a directory without that run under runs/,
    `status ID` and `logs ID` find it while it lives; once it has ended, the note submit leaves in the
    user's cache (remember_local_job), else one line saying what to give."""
    from hpctrain.launch import submitit_glue as glue  # submitit: the task side's package, not a login node's

    run = tmp_path / "somewhere" / "runs" / "sleeper"
    run.mkdir(parents=True)
    job = glue.local_job(run / "submitit", 1, 5, time.sleep, 600)  # a real local job whose task sleeps
    pid = int(job.job_id)
    try:
        record = {"job_id": str(pid), "executor": "local", "submitit": str(run / "submitit")}
        (run / "job.json").write_text(json.dumps({**record, "tasks": 1, "host": socket.gethostname()}))
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))  # no Slurm to ask
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no note of the job yet
        wait_for(lambda: children(pid), "the local job's controller started no task")
        assert main(["status", str(pid), "--json"]) == 0
        f = json.loads(capsys.readouterr().out)
        assert (f["state"], f["run_dir"], f["job_id"], f["executor"]) == ("RUNNING", str(run), str(pid), "local"), f
        assert main(["logs", str(pid)]) == 0  # no rank log: the task's own stderr (submitit's)
        assert capsys.readouterr().out == (run / "submitit" / f"{pid}_0_log.err").read_text()
    finally:
        wait_for(lambda: children(pid) or job.done(), "the local job's controller started no task")
        for child in children(pid):
            os.kill(child, signal.SIGKILL)  # the sleeping task: its controller then ends
        wait_for(job.done, "the local job's controller did not end after its task")
    assert main(["status", str(pid)]) == 2
    line = one_error_line(capsys)
    assert f"job {pid}: no local job of this host has that id (under runs/ here, alive, or submitted by" in line, line
    remember_local_job(str(pid), run)  # what submit_local notes (tests/launch/test_local_job.py: a real submit)
    assert main(["status", str(pid), "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    assert (f["state"], f["run_dir"], f["job_id"]) == ("NOT RUNNING", str(run), str(pid)), f
    (run / "job.json").write_text(json.dumps({**record, "job_id": "1"}))  # the run trained by another job since
    assert main(["status", str(pid)]) == 2 and "no local job of this host has that id" in one_error_line(capsys)


@pytest.mark.slurm
def test_a_slurm_job_id_from_any_directory_is_one_round_of_questions(slurm_cluster, tmp_path):
    """`status ID` of a job sbatch has just queued (plain sbatch: no run directory) answers at once:
    slurmctld holds a job from the moment sbatch prints its id, so squeue knows it even while sacct
    has no row yet. An id no one knows: one line after one sacct, one squeue and one scontrol (before:
    the three again and again for 15 s)."""
    log = tmp_path / "calls.jsonl"
    env = {CALL_LOG_VAR: str(log), "XDG_CACHE_HOME": str(tmp_path / "cache")}  # no local job noted
    job = slurm_cluster.run(
        "sbatch", "--parsable", f"--chdir={tmp_path}", "--output=/dev/null", "-N1", "--wrap", "sleep 300"
    ).stdout.strip()
    try:
        r = hp(slurm_cluster, "status", job, "--json", env=env, as_root=True)
        assert r.returncode == 0, r.stderr
        f = json.loads(r.stdout)
        assert f["job_id"] == job and f["state"] in ("PENDING", "RUNNING") and f["run_dir"] is None, f
    finally:
        slurm_cluster.run("scancel", job)
    log.unlink()
    unknown = str(int(job) + 100_000)
    r = hp(slurm_cluster, "status", unknown, env=env, as_root=True)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr == (
        f"hpctrain: error: job {unknown} is unknown to Slurm (sacct, squeue, scontrol), and no local job of this "
        "host has that id (under runs/ here, alive, or submitted by you): check the id, or give the run directory "
        "instead (runs/<name>)\n"
    )
    asked = sorted(json.loads(x)["kind"] for x in log.read_text().splitlines())
    assert asked == ["sacct", "scontrol", "squeue"], asked
