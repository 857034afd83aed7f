"""`hpctrain status`: ETA, speed, straggler, last eval and checkpoint age, as text and --json."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hpctrain.cli import main
from hpctrain.site.slurm_cli import CALL_LOG_VAR
from hpctrain.watch.progress import duration, iso
from hpctrain.watch.status import TERMINAL, job_state, remember_local_job, run_status, sacct_rows
from tests.helpers import DIGITS, ROOT, WAIT_S, digits_args, hpctrain, run_metrics, run_ranks, wait_for
from tests.launch.jobs import hp, sacct_states
from tests.slurm_cluster import PREEMPTIBLE, URGENT

T0 = 1_700_000_000.0


def test_status_of_a_stopped_run_waiting_for_its_requeue(tmp_path):
    """Two stops; the first one's queue wait (600 s) predicts the second's; straggler and hang shown."""
    recs = [
        {"kind": "train", "time": T0 + 5 * i, "step": 10 * i, "epoch": i / 2, "loss": 2.0, "images_per_s": 128.0}
        for i in range(1, 5)
    ]  # 2 steps/s, 20 steps per epoch
    recs += [
        {"kind": "eval", "time": T0 + 21, "step": 40, "epoch": 2.0, "top1": 61.0, "top5": 93.5, "loss": 1.2},
        {"kind": "checkpoint", "time": T0 + 22, "step": 40, "path": "ck/step-40"},
        {"kind": "stop", "time": T0 + 22, "step": 40, "reason": "preempted", "stop_kind": "time_limit"},
        {"kind": "requeue", "time": T0 + 22, "step": 40, "requeue": True, "reason": "time_limit"},
    ]
    resumed = T0 + 22 + 600  # back after 600 s in the queue, then 10 steps to the next record
    recs += [
        {
            "kind": "train",
            "time": resumed + 5 * i,
            "step": 40 + 10 * i,
            "epoch": 2 + i / 2,
            "loss": 1.5,
            "images_per_s": 128.0,
            "mfu": 0.35,
        }
        for i in range(1, 3)
    ]
    recs += [
        {
            "kind": "straggler",
            "time": resumed + 10,
            "step": 60,
            "rank": 3,
            "host": "n2",
            "gpu": 1,
            "step_time_s": 0.7,
            "median_s": 0.5,
            "slower_pct": 40.0,
            "cause": "data",
            "data_wait_s": 0.2,
        },
        {
            "kind": "hang",
            "time": resumed + 70,
            "step": 60,
            "ranks": [3],
            "where": ["loader.py:88"],
            "files": ["logs/stack-rank-3.txt"],
        },
        {"kind": "stop", "time": resumed + 80, "step": 60, "reason": "preempted", "stop_kind": "preemption"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "config.yaml").write_text("train:\n  epochs: 10\n  max_steps: 0\ndata:\n  batch_size: 64\n")
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "7", "executor": "local"}))
    now = resumed + 180  # the queue wait of the second stop is 100 s old
    st = run_status(str(tmp_path), now=now)
    f = st.facts()
    left = (200 - 60) / 2.0
    assert f["total_steps"] == 200 and f["steps_per_s"] == 2.0 and f["stopped_at"] == 60
    at = resumed + 80 + 600 + left  # the second stop + the first one's queue wait + the steps left
    assert f["eta_s"] == pytest.approx(at - now) and f["eta_at"] == iso(at)
    assert f["checkpoint_age_s"] == now - (T0 + 22) and f["last_eval"]["top5"] == 93.5
    assert f["mfu"] == 0.35 and f["straggler"]["rank"] == 3 and f["hang"]["ranks"] == [3]
    text = st.text()
    assert (
        f"ETA            {duration(f['eta_s'])} (at {f['eta_at']}), counting the mean queue wait of its 1 earlier "
        "requeue(s), 10m00s" in text
    )
    assert "speed          128 images/s, 2 steps/s, MFU 35.0 %" in text
    assert "straggler      rank 3 (host n2, GPU 1) 40 % slower than the median at step 60: data" in text
    assert (
        "hang           at step 60: rank 3 at loader.py:88 not at the latest step; dumps: logs/stack-rank-3.txt" in text
    )
    assert "last eval      top-1 61.00 %, top-5 93.50 % at step 40" in text
    assert f"checkpoint     ck/step-40 (step 40, {duration(now - T0 - 22)} ago)" in text
    assert "last step      60/200 (30 %), epoch 3.00" in text


def test_a_local_run_stopped_by_ctrl_c_twice_then_killed_counts_no_node_failure_and_has_no_eta(tmp_path):
    """Two Ctrl-C stops, each resumed, then the process killed (no stop record, no job): its stops
    are counted as Ctrl-C's, not as node failures, and a run with no live process has no ETA."""
    recs = []
    for i, step in enumerate((10, 20)):
        recs.append({"kind": "train", "time": T0 + 10 * i, "step": step - 5, "epoch": 0.1, "loss": 2.0})
        recs.append(
            {"kind": "stop", "time": T0 + 10 * i + 1, "step": step, "reason": "interrupted", "stop_kind": "interrupt"}
        )
    recs.append({"kind": "train", "time": T0 + 30, "step": 25, "epoch": 0.5, "loss": 1.9, "images_per_s": 90.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "config.yaml").write_text("train:\n  epochs: 1\n  max_steps: 50\ndata:\n  batch_size: 64\n")
    st = run_status(str(tmp_path), now=T0 + 40)
    f = st.facts()
    assert st.state == "NOT RUNNING" and f["eta_s"] is None and f["eta_at"] is None, f
    text = st.text()
    assert "stops          2 (2 after Ctrl-C)\n" in text and "node failure" not in text, text
    assert "ETA            none: no process of this run is alive" in text, text


@pytest.mark.slow
def test_status_json_of_a_finished_local_run(digits_root, tmp_path):
    run_ranks(1, digits_args(digits_root, tmp_path, "st", "train.max_steps=6", "log.every=2", "ckpt.every=3"))
    run = tmp_path / "st"
    r = hpctrain("status", str(run), "--json")
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)
    train, (end,) = run_metrics(run, "train"), run_metrics(run, "end")
    ckpt = run_metrics(run, "checkpoint")[-1]
    assert (f["state"], f["step"], f["total_steps"], f["loss"]) == ("COMPLETED", 6, 6, train[-1]["loss"])
    assert f["images_per_s"] == train[-1]["images_per_s"] and f["mfu"] == train[-1].get("mfu")
    assert (f["eta_s"], f["eta_note"], f["eta_at"]) == (0.0, "finished", iso(end["time"]))
    assert f["last_eval"]["step"] == 6 and f["last_eval"]["top1"] == end["top1"]
    assert (f["checkpoint"], f["checkpoint_step"]) == (ckpt["path"], 6) and f["checkpoint_age_s"] >= 0
    assert f["straggler"] is None and f["requeues"] == 0
    code = (
        "import sys; sys.modules['torch'] = None\n"  # a login node's status: no torch
        f"from hpctrain.cli import main; raise SystemExit(main(['status', {str(run)!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"ETA            finished at {iso(end['time'])}" in r.stdout, r.stdout + r.stderr


def test_status_json_is_strict_json_with_a_diverged_loss(tmp_path, capsys):
    import argparse

    from hpctrain.cli.status import status

    rec = {"kind": "train", "time": T0, "step": 3, "epoch": 0.1, "loss": float("nan"), "images_per_s": 10.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rec) + "\n")  # Python writes NaN, as the Trainer would
    assert status(argparse.Namespace(target=str(tmp_path), json=True)) == 0
    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))["loss"] is None


@pytest.mark.slurm
def test_a_preempted_job_that_slurm_requeues_is_not_reported_ended(slurm24_cluster, tmp_path, monkeypatch):
    """A --requeue job in the preemptible partition ignores SIGTERM and is killed at the end of its
    GraceTime; Slurm requeues it. Its last sacct row is PREEMPTED for seconds before the next run's
    row appears, while squeue holds it: `job_state` (status, submit --wait) must not call that an
    end. Same on 22.05 (measured); run on 24.11 only, where our batch shell leaves preempted jobs'
    requeues to Slurm (docs/slurm-versions.md)."""
    cluster = slurm24_cluster
    for k, v in cluster.environ().items():  # job_state runs sacct/squeue from this environment
        monkeypatch.setenv(k, v)
    job = cluster.run(
        "sbatch",
        "--parsable",
        f"--partition={PREEMPTIBLE}",
        "-N2",
        "--requeue",
        f"--output={tmp_path}/%j.out",
        "--wrap",
        "trap '' TERM; sleep 300",
        cwd=tmp_path,
    ).stdout.strip()
    wait_for(lambda: cluster.state(job) == "RUNNING", f"job {job} never ran", show=lambda: sacct_rows(job), poll_s=0.2)
    t0 = time.monotonic()
    cluster.run(
        "sbatch",
        f"--partition={URGENT}",
        "-N2",
        "--exclusive",
        f"--output={tmp_path}/%j.out",
        "--wrap",
        "sleep 2",
        cwd=tmp_path,
    )
    seen, window = [], False
    while not (seen and seen[-1] == "RUNNING" and len(sacct_states(cluster, job)) == 2):
        assert time.monotonic() - t0 < WAIT_S, seen  # a cap on the wait (generous), not a timing
        rows = [r["State"] for r in sacct_rows(job)]
        window |= rows[-1:] == ["PREEMPTED"]
        st = job_state(job)
        seen += [st] if not seen or seen[-1] != st else []
        assert st not in TERMINAL, (seen, rows)
        time.sleep(0.1)
    cluster.run("scancel", job)
    assert sacct_states(cluster, job)[0] == "PREEMPTED" and window, seen


def test_the_docs_status_sample_agrees_with_itself():
    """The `status` sample of the digits demo (docs/observability.md, "Status: when will it end"; the
    README's until issue 37): images/s ÷ the demo's global batch is its steps/s within 10 % (the
    speed is the last record's, the steps/s the last intervals'), and the ETA is the steps left at
    that rate."""
    page = (ROOT / "docs" / "observability.md").read_text()
    sample = page.split("$ hpctrain status runs/digits_vit", 1)[1].split("```", 1)[0]
    speed = re.search(r"speed\s+([\d,.]+) images/s, ([\d.]+) steps/s", sample)
    step = re.search(r"last step\s+(\d+)/(\d+)", sample)
    eta = re.search(r"ETA\s+(?:(\d+)m)?(\d+)s", sample)
    assert speed and step and eta, sample
    batch = yaml.safe_load(DIGITS.read_text())["data"]["global_batch"]
    images_per_s, steps_per_s = float(speed.group(1).replace(",", "")), float(speed.group(2))
    assert images_per_s / batch == pytest.approx(steps_per_s, rel=0.1), (images_per_s, steps_per_s)
    left_s = (int(step.group(2)) - int(step.group(1))) / steps_per_s
    assert int(eta.group(1) or 0) * 60 + int(eta.group(2)) == pytest.approx(left_s, rel=0.1, abs=2), left_s


def test_status_names_the_nodes_the_batch_shell_left_out_before_any_rank_records_them(tmp_path):
    """The batch shell writes `.hpctrain/excluded-<job>` as it leaves a node out (exclude.sh); a job
    requeued without the node waits in the queue, and no rank has recorded the exclusion yet (metrics
    has none). `status` names each node with its own evidence from that file; a node whose `exclude`
    record is in metrics keeps the record's evidence."""
    why = (
        "n3: probe step failed (exit 2): nvidia-smi -L lists 0 of the 1 GPU(s) the job uses; "
        "n4: left the job's allocation (Slurm: node failure)"
    )
    (tmp_path / ".hpctrain").mkdir()
    (tmp_path / ".hpctrain" / "excluded-77").write_text(
        f"{int(T0)}\tn3\t{why}\n{int(T0)}\tn4\t{why}\n{int(T0)}\tn1\tn1: batch host n1 DOWN\ngarbage\n"
    )
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "77", "executor": "slurm"}))
    rec = {"kind": "exclude", "time": T0, "job": "77", "attempt": 0, "nodes": ["n1"], "why": "n1: recorded by rank 0"}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    st = run_status(str(tmp_path), now=T0 + 60)
    assert st.facts()["excluded_nodes"] == {
        "n1": "recorded by rank 0",
        "n3": "probe step failed (exit 2): nvidia-smi -L lists 0 of the 1 GPU(s) the job uses",
        "n4": "left the job's allocation (Slurm: node failure)",
    }
    assert re.search(
        r"excluded +n1 \(recorded by rank 0\); n3 \(probe step failed \(exit 2\): nvidia-smi -L lists 0 of the 1 "
        r"GPU\(s\) the job uses\); n4 \(left the job's allocation \(Slurm: node failure\)\)",
        st.text(),
    ), st.text()


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
