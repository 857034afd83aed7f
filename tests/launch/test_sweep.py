"""`hpctrain sweep` and `hpctrain status SWEEP`: members from grids and files, refusals before
anything is submitted, a 4-member job array on the Slurm test cluster with one member preempted
and resumed, and the local fallback."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from hpctrain.config import ConfigError
from hpctrain.launch import sweep
from hpctrain.run.source import commit_of, source_hash
from tests.helpers import hpctrain
from tests.launch.jobs import ROOT, hp, metrics, sacct_states, wait_for_step

DIGITS = str(ROOT / "configs" / "digits_vit.yaml")


def test_members_from_grids_and_a_sweep_file(tmp_path):
    grid = sweep.parse_grid(["optim.lr=1e-3,5e-4", "model.drop_path=0,0.1"])
    f = tmp_path / "s.yaml"
    f.write_text(
        'grid:\n  train.epochs: [2]\nruns:\n  - {optim.lr: 3.0e-4, aug.hflip: 0.5}\n  - ["optim.warmup_epochs=1"]\n'
    )
    fgrid, runs = sweep.read_sweep_file(f)
    sets = sweep.expand({**grid, **fgrid}, runs)
    assert sets[0] == ["optim.lr=1e-3", "model.drop_path=0", "train.epochs=2"] and len(sets) == 6
    assert sets[4] == ["optim.lr=0.0003", "aug.hflip=0.5"] and sets[5] == ["optim.warmup_epochs=1"]
    members = sweep.plan_members(DIGITS, ["train.max_steps=3"], sets, tmp_path / "sw")
    assert [m.name for m in members[:2]] == ["00-lr1e-3_drop_path0_epochs2", "01-lr1e-3_drop_path0.1_epochs2"]
    assert members[1].cfg.model.drop_path == 0.1 and members[4].cfg.optim.lr == 3e-4
    assert {m.cfg.train.max_steps for m in members} == {3}
    assert members[3].cfg.run_dir == tmp_path / "sw" / members[3].name
    assert sweep.split_values("[1,2],3") == ["[1,2]", "3"]


@pytest.mark.parametrize(
    "sets, max_runs, words",
    [
        ([["optim.lr=1e-3"], ["optim.lrr=1e-3"]], 64, ["sweep member 1 (optim.lrr=1e-3)", "optim.lr"]),
        ([["optim.lr=1e-3"], ["model.drop_path=oops"]], 64, ["sweep member 1", "model.drop_path"]),
        ([], 64, ["the sweep is empty"]),
        ([[f"optim.lr={i}e-4"] for i in range(1, 5)], 3, ["4 members", "--max-runs 4"]),
        ([["run.name=x"]], 64, ["sweep member 0", "run.name is set by the sweep"]),
    ],
)
def test_bad_sweeps_refused_naming_the_member(tmp_path, sets, max_runs, words):
    with pytest.raises(ConfigError) as e:
        sweep.plan_members(DIGITS, [], sets, tmp_path / "sw", max_runs)
    assert all(w in str(e.value) for w in words), str(e.value)
    assert not (tmp_path / "sw").exists()


def test_bad_grid_flags_one_line():
    for bad in (["--grid", "optim.lr="], ["--grid", "optim.lr=1,,2"]):
        r = hpctrain("sweep", "--config", DIGITS, *bad, "--dry-run")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--grid" in r.stderr, r.stderr


@pytest.mark.slow
def test_local_sweep_runs_members_one_after_another(digits_root, tmp_path):
    """No Slurm controller: both members through the local executor, then the table."""
    r = hpctrain(
        "sweep",
        "--config",
        DIGITS,
        "--set",
        f"data.root={digits_root}",
        "--set",
        f"run.dir={tmp_path}",
        "--set",
        "train.max_steps=2",
        "--set",
        "train.eval_every_epochs=0",
        "--grid",
        "optim.lr=1e-3,5e-4",
        "--name",
        "loc",
        "--local-tasks",
        "1",
        "--max-parallel",
        "2",
        "--cluster-set",
        "slurm.qos=x",
        env={"SLURM_CONF": str(tmp_path / "none.conf"), "HPCTRAIN_CLUSTER": ""},
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no Slurm: 2 runs one after another" in r.stdout
    assert (
        "hpctrain: note: a local sweep (--local, or no Slurm here): the members "
        "run one after another on this machine, so --max-parallel, --cluster-set (for a Slurm sweep) are "
        "ignored\n"
    ) in r.stderr
    rec = json.loads((tmp_path / "loc" / "sweep.json").read_text())
    assert rec["executor"] == "local" and [m["name"] for m in rec["members"]] == ["00-lr1e-3", "01-lr5e-4"]
    ends = [metrics(tmp_path / "loc" / m["name"], "end")[-1] for m in rec["members"]]
    assert [e["status"] for e in ends] == ["finished", "finished"] and all(e["step"] == 2 for e in ends)
    # one after another: the second started after the first ended
    first_end = ends[0]["time"]
    assert min(x["time"] for x in metrics(tmp_path / "loc" / "01-lr5e-4")) >= first_end
    assert re.search(r"00-lr1e-3 +optim.lr=1e-3 +COMPLETED", r.stdout), r.stdout
    logs = hpctrain("logs", str(tmp_path / "loc"))  # a sweep has no log of its own: name a member
    assert logs.returncode == 2 and logs.stderr == (
        f"hpctrain: error: {tmp_path / 'loc'} is a sweep of 2 runs, each with its own logs: name one, e.g. hpctrain "
        f"logs {tmp_path / 'loc' / '00-lr1e-3'} (all of them: hpctrain status {tmp_path / 'loc'})\n"
    ), logs.stderr


@pytest.mark.slurm
def test_bad_member_refused_before_submission(slurm_cluster, digits_root, tmp_path):
    r = hp(
        slurm_cluster,
        "sweep",
        "--config",
        DIGITS,
        "--set",
        f"data.root={digits_root}",
        "--set",
        f"run.dir={tmp_path}",
        "--grid",
        "optim.lr=1e-3,5e-4,-1",
        "--name",
        "badsweep",
        "--cluster-set",
        "slurm.request_gpus=false",
        "--gpus-per-node",
        "1",
    )
    assert r.returncode == 2 and "sweep member 2 (optim.lr=-1)" in r.stderr, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and not r.stdout
    assert not list(tmp_path.iterdir())  # no sweep dir, no run dirs
    for cmd in (("squeue", "-h", "-n", "badsweep"), ("sacct", "-n", "-X", "--name=badsweep")):
        assert slurm_cluster.run(*cmd).stdout.strip() == ""


@pytest.mark.slurm
def test_sweep_over_max_array_size_refused_before_submission(slurm_cluster, digits_root, tmp_path):
    """A site whose MaxArraySize is 3 (slurm.conf(5): array indices below it): 4 members cannot be one
    array; refused in one line naming the limit, the count and the fix, nothing submitted."""
    with slurm_cluster.reconfigured(MaxArraySize="3"):
        conf = slurm_cluster.run("scontrol", "show", "config").stdout
        assert re.search(r"^MaxArraySize\s*=\s*3$", conf, re.M), conf  # reconfigure applies it
        sets = ["--set", f"data.root={digits_root}", "--set", f"run.dir={tmp_path}", "--name", "bigsweep"]
        grid = ["--grid", "optim.lr=1e-3,5e-4,2e-4,1e-4", "--cluster-set", "slurm.request_gpus=false"]
        r = hp(slurm_cluster, "sweep", "--config", DIGITS, *sets, *grid, "--gpus-per-node", "1")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and not r.stdout, r.stdout + r.stderr
        for words in ("4 members", "MaxArraySize is 3", "split the grid into sweeps of at most 3"):
            assert words in r.stderr, r.stderr
        assert not list(tmp_path.iterdir())
        assert slurm_cluster.run("squeue", "-h", "-n", "bigsweep").stdout.strip() == ""


@pytest.mark.slurm
def test_sweep_array_member_preempted_and_resumed(slurm_cluster, digits_root, tmp_path):
    """4 members, 2 at a time; member 3 gets USR2 (`scancel --signal=USR2 <array>_3`), checkpoints,
    is requeued by its batch shell and resumes at its step while the others finish; then the table."""
    steps = 16
    r = hp(
        slurm_cluster,
        "sweep",
        "--config",
        DIGITS,
        "--set",
        f"data.root={digits_root}",
        "--set",
        f"run.dir={tmp_path}",
        "--set",
        f"train.max_steps={steps}",
        "--set",
        "log.every=1",
        "--set",
        "train.threads=1",
        "--set",
        "ckpt.every=0",
        "--grid",
        "optim.lr=1e-3,5e-4",
        "--grid",
        "model.drop_path=0,0.1",
        "--max-parallel",
        "2",
        "--gpus-per-node",
        "1",
        "--name",
        "sw",
        "--cluster-set",
        "slurm.request_gpus=false",
        "--cluster-set",
        "slurm.time=10",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    array = re.search(r"submitted Slurm job array (\d+): 4 runs, 2 at a time", r.stdout).group(1)
    sw = tmp_path / "sw"
    rec = json.loads((sw / "sweep.json").read_text())
    assert [m["job_id"] for m in rec["members"]] == [f"{array}_{i}" for i in range(4)]
    code = sw / "code" / source_hash() / "hpctrain"  # one code snapshot for the sweep's runs
    assert f"code: {code} (source {source_hash()})" in r.stdout and rec["code"] == str(code)
    # member 3 starts last, when no element is pending: while some are, `scancel --signal=USR2 <array>_<i>`
    # (or the raw id, which scancel turns into that) is answered "Job can not be altered now" although
    # the element got the signal, and scancel retries, signalling again after the requeue (measured)
    run0 = Path(rec["members"][3]["run_dir"])
    stopped_at = wait_for_step(run0, 2, 240)
    slurm_cluster.run("scancel", "--signal=USR2", f"{array}_3")
    end = time.monotonic() + 300
    while time.monotonic() < end and any(slurm_cluster.state(f"{array}_{i}") != "COMPLETED" for i in range(4)):
        time.sleep(1)
    assert sacct_states(slurm_cluster, f"{array}_3") == ["REQUEUED", "COMPLETED"]
    for i in (0, 1, 2):
        assert sacct_states(slurm_cluster, f"{array}_{i}") == ["COMPLETED"]
    req = metrics(run0, "requeue")
    assert len(req) == 1 and req[0]["requeue"] and req[0]["reason"] == "time_limit", req
    stop = req[0]["step"]
    assert stop >= stopped_at
    train = [x["step"] for x in metrics(run0, "train")]
    assert train == list(range(1, steps + 1)), train  # resumed at its step: none repeated, none lost
    assert metrics(run0, "end")[-1]["status"] == "finished"
    st = hp(slurm_cluster, "status", str(sw))
    assert st.returncode == 0, st.stdout + st.stderr
    lines = st.stdout.splitlines()
    assert "4 runs" in lines[0] and lines[1].split()[:3] == ["run", "overrides", "state"]
    assert all(" COMPLETED " in line for line in lines[2:6]), st.stdout
    js = json.loads(hp(slurm_cluster, "status", str(sw), "--json").stdout)["runs"]
    assert {x["run"]: x["requeues"] for x in js} == {m["name"]: int(m["index"] == 3) for m in rec["members"]}
    best = [x["top1_best"] for x in js]
    assert all(b is not None for b in best) and best == sorted(best, reverse=True)
    assert all(x["step"] == steps for x in js)
    envs = [json.loads((Path(m["run_dir"]) / "env.json").read_text()) for m in rec["members"]]
    assert {e["source"]["snapshot"]["path"] for e in envs} == {str(code)}  # runtime none: first on PYTHONPATH
    assert {e["source"]["running"] for e in envs} == {source_hash()}
    assert {e["git_commit"] for e in envs} == {commit_of(ROOT / "src" / "hpctrain")}  # the submitting checkout's


def test_compiled_members_share_the_sweeps_compile_cache(tmp_path):
    members = sweep.plan_members(
        DIGITS, ["compile.enabled=true"], [["optim.lr=1e-3"], ["optim.lr=5e-4"]], tmp_path / "sw"
    )
    assert {m.cfg.compile.cache for m in members} == {str((tmp_path / "sw" / "compile_cache").resolve())}
    mine = sweep.plan_members(
        DIGITS, ["compile.enabled=true", "compile.cache=/scratch/cc"], [["optim.lr=1e-3"]], tmp_path / "sw"
    )
    assert mine[0].cfg.compile.cache == "/scratch/cc"
    plain = sweep.plan_members(DIGITS, [], [["optim.lr=1e-3"]], tmp_path / "sw")
    assert plain[0].cfg.compile.cache == ""
