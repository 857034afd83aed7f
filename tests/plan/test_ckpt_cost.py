"""What a checkpoint costs a job, resolved at submission: the MTBF that ckpt.every=auto needs
(from the partition's sacct history) and the check that a stop leaves time for a save."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from hpctrain.plan.ckpt_cost import History
from hpctrain.site.slurm_cli import parse_sacct, read_history
from tests.helpers import wait_for
from tests.launch.jobs import digits_sets, hp, metrics, sbatch_wrap, wait_running
from tests.slurm_cluster import GRACE_TIME, PREEMPTIBLE, URGENT


def parse_history(rows: str, partition: str, days: float) -> History:
    """`State|NNodes|ElapsedRaw` rows, as sacct's rows of slurm_cli.SACCT_FIELDS, → the History."""
    cols = (ln.split("|") for ln in rows.splitlines())
    text = "".join(f"{i}|{s}|{n}|Unknown|Unknown|Unknown|{e}\n" for i, (s, n, e) in enumerate(cols))
    return History.of(parse_sacct(text), partition, days)


def test_parse_history_counts_interruptions_per_node_hour():
    text = "PREEMPTED|2|3600\nNODE_FAIL|1|1800\nCANCELLED by 0|4|900\nTIMEOUT|1|3600\nCOMPLETED|2|0\n"
    h = parse_history(text, "low", 30)
    # a TIMEOUT is the job's own planned stop (USR2 before the limit), not the partition's doing
    assert h.counts == {"PREEMPTED": 1, "NODE_FAIL": 1} and h.node_hours == pytest.approx(4.5)
    assert (
        h.node_mtbf_h() == pytest.approx(2.25)
        and "time limit" not in h.text()
        and parse_history("", "low", 30).node_mtbf_h() is None
    )
    assert parse_history("COMPLETED|1|7200\n", "low", 30).node_mtbf_h() == 2.0  # none seen: a lower bound


def _make_history(cluster) -> list[str]:
    """A node failure and a preemption on the preemptible partition, in ~15 s: a job loses a node
    (`scontrol update state=down`: NODE_FAIL), another is preempted with GraceTime 0 for the while."""
    a = sbatch_wrap(cluster, PREEMPTIBLE, 2, "sleep 600", "--requeue")
    wait_running(cluster, a)
    time.sleep(2)  # some node-hours
    cluster.fail_node("n2", "ckpt_cost test")
    cluster.run("scancel", a)  # requeued, held back by BeginTime: gone
    cluster.run("scontrol", "update", f"partitionname={PREEMPTIBLE}", "gracetime=0")
    try:
        b = sbatch_wrap(cluster, PREEMPTIBLE, 1, "sleep 600", "--requeue")
        wait_running(cluster, b)
        time.sleep(2)
        urgent = sbatch_wrap(cluster, URGENT, 2, "true")
        cluster.wait_done(urgent, 60)
        cluster.run("scancel", b)
    finally:
        cluster.run("scontrol", "update", f"partitionname={PREEMPTIBLE}", f"gracetime={GRACE_TIME}")
    return [a, b]


def _logging_sacct(cluster, tmp_path) -> tuple[dict[str, str], Path]:
    """An environment whose `sacct` logs each call, then execs the cluster's real one, and its log."""
    real = shutil.which("sacct", path=cluster.environ()["PATH"])
    bin_dir, log = tmp_path / "logbin", tmp_path / "sacct.log"
    bin_dir.mkdir()
    wrapper = bin_dir / "sacct"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    path = cluster.environ()["PATH"]
    return {"PATH": f"{bin_dir}{os.pathsep}{path}", "XDG_CACHE_HOME": str(tmp_path / "cache")}, log


# The seconds before this test's jobs in which the partition must have run nothing: the submission's
# window (slurm.mtbf_window_days, counted back from when it reads sacct) starts that much earlier than
# t0, so that a submission slow to start on a busy machine still sees all of this test's jobs, and only them.
QUIET_S = 120  # how late the submission may read sacct after the test sets its window (a loaded machine)
# The quiet span is longer than the window's reach before t0 by this much: with both equal, a job that ended
# 1 s before the quiet span (17:54:15, quiet checked from 17:54:16) was inside the window read at t0 - 121 s.
QUIET_MARGIN_S = 10


def _ended(cluster, jobs: list[str]) -> bool:
    """slurmdbd holds every allocation of `jobs` as ended (an end time, no running row): before that,
    sacct reports a job slurmctld has ended with the elapsed time of one still running."""
    rows = cluster.run("sacct", "-X", "-D", "-n", "-P", "-j", ",".join(jobs), "-o", "State,End").stdout.splitlines()
    return bool(rows) and all(r.split("|")[1] not in ("", "Unknown") for r in rows)


def test_partition_history_sets_the_jobs_mtbf(slurm_cluster, digits_root, tmp_path, monkeypatch):
    for key, value in slurm_cluster.environ().items():  # read_history's sacct: this cluster's
        monkeypatch.setenv(key, value)
    quiet = QUIET_S + QUIET_MARGIN_S  # longer than the window reaches back before t0 (its + 1 s, sacct's seconds)
    wait_for(lambda: not read_history(PREEMPTIBLE, quiet / 86400), f"{PREEMPTIBLE} quiet for {quiet} s")
    t0 = time.time() - 1
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0))
    jobs = _make_history(slurm_cluster)
    wait_for(lambda: _ended(slurm_cluster, jobs), f"slurmdbd records the end of jobs {jobs}")
    hist = History.of(read_history(PREEMPTIBLE, 1, since=since), PREEMPTIBLE, 1)
    assert hist.counts == {"PREEMPTED": 1, "NODE_FAIL": 1}, hist
    rows = slurm_cluster.run("sacct", "-X", "-D", "-n", "-P", "-j", ",".join(jobs), "-o", "NNodes,ElapsedRaw").stdout
    node_s = sum(int(n) * int(e) for n, e in (r.split("|") for r in rows.split()))
    assert hist.node_hours == pytest.approx(node_s / 3600) and 4 <= node_s < 120  # only these jobs: one window
    node_mtbf = hist.node_hours / 2
    # the submission reads the same window (slurm.mtbf_window_days) and hands the job its MTBF: 2 nodes → half
    days = f"slurm.mtbf_window_days={(time.time() - t0 + 1 + QUIET_S) / 86400:.8f}"
    sets = digits_sets(
        digits_root,
        tmp_path,
        "auto",
        "ckpt.every=auto",
        "ckpt.auto_first=2",
        "train.max_steps=4",
        "log.every=1",
        "train.eval_every_epochs=0",
    )
    env, sacct_log = _logging_sacct(slurm_cluster, tmp_path)

    def window_reads() -> list[str]:  # the MTBF window's history reads (plan's 7-day queue read aside)
        calls = [c for c in sacct_log.read_text().splitlines() if f"-r {PREEMPTIBLE} " in c]
        return [c for c in calls if datetime.fromisoformat(re.search(r"-S (\S+)", c).group(1)).timestamp() > t0 - 600]

    args = ["--partition", PREEMPTIBLE, "--nodes", "2", "--gpus-per-node", "1", "--cluster-set", days, *sets]
    r = hp(slurm_cluster, "submit", "--config", "configs/digits_vit.yaml", *args, "--wait", env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(window_reads()) == 1, sacct_log.read_text()  # the MTBF window's history, read once
    cache = list((tmp_path / "cache" / "hpctrain").iterdir())  # and the plan's queue answers (site/slurm_cli.py)
    mtbf = [f for f in cache if f.name.startswith("sacct-history")]
    assert len(mtbf) == 1 and all(f.stat().st_mode & 0o777 == 0o600 for f in cache), cache
    # a second submission of the same window reuses it: no sacct call, the same figure, said where from
    again = hp(slurm_cluster, "submit", "--config", "configs/digits_vit.yaml", *args, "--dry-run", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(window_reads()) == 1, sacct_log.read_text()
    out = again.stdout + again.stderr
    assert f"job MTBF {node_mtbf / 2:.3g} h (sacct: partition {PREEMPTIBLE}" in out and "(cached at " in out, out
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("checkpoints: ckpt.every=auto"))
    assert f"job MTBF {node_mtbf / 2:.3g} h (sacct: partition {PREEMPTIBLE}" in line
    assert "1 preemptions, 1 node failures in" in line and " / 2 nodes" in line, line
    cfg = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())
    assert cfg["ckpt"]["mtbf_h"] == pytest.approx(node_mtbf / 2) and "mtbf_source" not in cfg["ckpt"]
    # where it came from is provenance: the batch script exports it, env.json keeps it
    resolved = json.loads((tmp_path / "auto" / "env.json").read_text())["resolved"]
    assert resolved["mtbf_h"] == cfg["ckpt"]["mtbf_h"] and resolved["mtbf_source"].startswith("sacct"), resolved
    rec = metrics(tmp_path / "auto", "ckpt_interval")[0]
    assert rec["step"] == 2 and rec["mtbf_h"] == cfg["ckpt"]["mtbf_h"] and rec["mtbf_source"] == resolved["mtbf_source"]


LONG = ["--gpus-per-node", "1", "--set", "data.global_batch=32768", "--set", "train.accum_steps=256"]
SHORT = ["--gpus-per-node", "1", "--set", "data.global_batch=256"]
GRACE_LINE = re.compile(
    rf"hpctrain: warning: partition {PREEMPTIBLE} preempts \(PreemptMode=REQUEUE\) with "
    rf"GraceTime={GRACE_TIME} s from SIGTERM to SIGKILL, less than two steps plus a save "
    r"\(2 x (\S+) s step, hpctrain plan's estimate; (\S+) s save, [\d.]+ GB at "
    r"slurm\.ckpt_write_gbps=1\) = (\d+) s: .*ask the site for a GraceTime of at least \d+ s"
)


def _dry(cluster, tmp_path, partition: str, *args: str, gpus: bool = True):
    gpu = ["--cluster-set", "slurm.request_gpus=true"] if gpus else []  # the plan models GPU steps
    return hp(
        cluster,
        "submit",
        "--config",
        "configs/vit_b16_imagenet.yaml",
        "--dry-run",
        "--partition",
        partition,
        *gpu,
        "--set",
        "data.loader=synthetic",
        "--set",
        f"run.dir={tmp_path}",
        *args,
    )


def test_grace_time_shorter_than_two_steps_and_a_save_is_flagged(slurm_cluster, tmp_path):
    """The test cluster's preemptible partition gives 30 s from SIGTERM to SIGKILL: a ViT-B step of
    32,768 images on one GPU (~22 s by the plan) cannot stop and save in it; a step of 256 can, and
    a partition that does not preempt has no GraceTime to check."""
    r = _dry(slurm_cluster, tmp_path, PREEMPTIBLE, *LONG)
    assert r.returncode == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("hpctrain: warning:")]
    assert len(warned) == 1 and GRACE_LINE.match(warned[0]), r.stderr
    step, save, need = GRACE_LINE.match(warned[0]).groups()
    assert int(need) == round(2 * float(step) + float(save)) > GRACE_TIME
    for partition, args in ((PREEMPTIBLE, SHORT), (slurm_cluster.partition, LONG)):
        r = _dry(slurm_cluster, tmp_path, partition, *args)
        assert r.returncode == 0 and "hpctrain: warning" not in r.stderr, r.stderr


def test_a_resumed_runs_measured_step_time_is_used(slurm_cluster, tmp_path):
    """Resuming: the step and save times an earlier attempt measured (its metrics.jsonl) decide, on a
    CPU cluster too (no plan there); 40 s steps leave neither the profile's 60 s signal lead nor
    GraceTime 30 s enough."""
    run = tmp_path / "run"
    run.mkdir()
    recs = [{"kind": "train", "step": s, "step_time_s": 40.0} for s in range(1, 4)]
    recs.append({"kind": "ckpt_interval", "step": 2, "save_s": 5.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = _dry(slurm_cluster, tmp_path, PREEMPTIBLE, "--set", "run.name=run", gpus=False)
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("hpctrain: warning:")]
    what = "two steps plus a save (2 x 40 s step, measured by this run; 5 s save, measured by this run) = 85 s"
    assert len(warned) == 2 and all(what in ln for ln in warned), r.stderr
    assert "slurm.signal_lead_s=60 s" in warned[0] and "--cluster-set slurm.signal_lead_s=130" in warned[0]
    assert f"GraceTime={GRACE_TIME} s" in warned[1]


def test_the_stop_check_budgets_two_agreement_periods_when_the_ranks_agree_every_k_steps(slurm_cluster, tmp_path):
    """dist.stop_every=4: a signal just after a round was posted goes with the next round, 4 steps on,
    which is read 4 steps later: the stop needs 8 steps plus the save (plan.stop_cost)."""
    run = tmp_path / "run"
    run.mkdir()
    recs = [{"kind": "train", "step": s, "step_time_s": 40.0} for s in range(1, 4)]
    recs.append({"kind": "ckpt_interval", "step": 2, "save_s": 5.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = _dry(slurm_cluster, tmp_path, PREEMPTIBLE, "--set", "run.name=run", "--set", "dist.stop_every=4", gpus=False)
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("hpctrain: warning:")]
    what = "8 steps (2 x dist.stop_every=4) plus a save (8 x 40 s step, measured by this run; 5 s save, "
    assert len(warned) == 2 and all(what in ln and ") = 325 s" in ln for ln in warned), r.stderr
    assert "stop agreement: every 4 steps (dist.stop_every)" in r.stdout + r.stderr
