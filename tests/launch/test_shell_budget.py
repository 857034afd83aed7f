"""The batch shell's cost to slurmctld (launch/shell/ctld.sh, guard.sh, clock.sh, spares.sh; docs/spares.md,
"What the batch shell costs slurmctld"): every call goes through hpctrain_slurm, which writes one JSON
line per call to $HPCTRAIN_SLURM_CALL_LOG and asks again through a controller outage at pauses that
grow to 30-60 s with jitter; in steady state a job with spares makes at most 2 calls a minute (the
guard and the clock); after a failed step ONE probe step covers all the candidate nodes.

The parts run under bash as rendered, with stand-ins for the Slurm clients that count their calls and a
stand-in `sleep` that records what it was asked and returns at once: time is simulated (the sum of the
sleeps at the configured default periods), never read from the wall clock."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from hpctrain import shellfile
from hpctrain.launch.inplace import NODE_ERE
from tests.helpers import ROOT

BUDGET_PER_MIN = 2  # issue 55: the batch shell's steady state, spares or not
SIM_S = 1200  # simulated seconds of steady state (20 minutes)
FAKE_GPU = ROOT / "tests" / "launch" / "fake_gpu"
VALUES = [shellfile.assign("hpctrain_node_name", NODE_ERE), "hpctrain_job=7", "hpctrain_spares=0", "hpctrain_tpn=1"]


def stand_ins(tmp_path: Path, bodies: dict[str, str]) -> Path:
    """Executables under tmp_path/bin; each appends its name and arguments to tmp_path/calls first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in bodies.items():
        log = "" if name == "sleep" else f'printf "%s\\n" "$(basename "$0") $*" >> {tmp_path}/calls\n'
        (bin_dir / name).write_text(f"#!/bin/bash\n{log}{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def sim_sleep(tmp_path: Path, limit_s: float, then: str = "exit 1", beat_until_s: float = 1e9) -> str:
    """A `sleep` that records its seconds in tmp_path/slept, rewrites the batch shell's heartbeat
    (tmp_path/alive) while the simulated time is below `beat_until_s`, and once the simulated time
    reaches `limit_s` runs `then` (a loop that sleeps ends)."""
    return (
        f'echo "$1" >> {tmp_path}/slept\n'
        f"t=$(awk '{{s += $1}} END {{print s}}' {tmp_path}/slept)\n"
        f"if awk -v t=\"$t\" 'BEGIN {{exit !(t < {beat_until_s})}}'; then\n"
        f"  wc -l < {tmp_path}/slept > {tmp_path}/alive\n"
        "fi\n"
        f"if awk -v t=\"$t\" 'BEGIN {{exit !(t >= {limit_s})}}'; then {then}; fi\n"
        "exit 0"
    )


def run(tmp_path: Path, files: list[str], script: str, env: dict[str, str], bin_dir: Path, timeout: int = 120):
    prog = shellfile.program(files, VALUES) + script
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", **env}
    for k in ("HPCTRAIN_SLURM_CALL_LOG", "HPCTRAIN_CTLD_WAIT_S", "HPCTRAIN_GUARD_S", "HPCTRAIN_GUARD_ASK_S"):
        if k not in env:
            full.pop(k, None)
    return subprocess.run(["bash", "-c", prog], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=timeout)


def calls(tmp_path: Path, *kinds: str) -> list[str]:
    f = tmp_path / "calls"
    lines = f.read_text().splitlines() if f.exists() else []
    return [ln for ln in lines if not kinds or ln.split(" ", 1)[0] in kinds]


def slept(tmp_path: Path) -> list[float]:
    f = tmp_path / "slept"
    return [float(x) for x in f.read_text().split()] if f.exists() else []


CONTROLLER = ("scontrol", "squeue", "sinfo", "sacct", "sacctmgr", "scancel", "srun")


def test_each_call_is_one_json_line_of_the_shared_call_log(tmp_path):
    """The line bench/site_load.py reads (the format site/slurm_cli.py writes on the login node):
    kind, the arguments exactly (quotes, backslashes, tabs and newlines escaped), seconds, exit status,
    where=batch, cached=false; a step started in the background has rc null; a long argument list
    stays one line under 4 KiB (one write to an O_APPEND file: concurrent writers do not interleave)."""
    bin_dir = stand_ins(tmp_path, {"scontrol": 'echo "answer $1"; exit 3', "srun": "exit 0"})
    log = tmp_path / "calls.jsonl"
    odd = ['a"b\\c', "x\ty\nz", "", "ü"]
    script = (
        "set +e\n"
        "hpctrain_slurm scontrol show job 'a\"b\\c' $'x\\ty\\nz' '' ü; echo \"rc=$?\"\n"
        'hpctrain_slurm -b srun --overlap true; wait "$!"\n'
        'hpctrain_slurm -w 0 scontrol "$(printf "%0500d" 0)" $(seq 40) >/dev/null || true\n'
        'q=(); for i in $(seq 30); do q+=("$(printf \'"%.0s\' $(seq 100))"); done\n'
        'hpctrain_slurm -w 0 scontrol "${q[@]}" >/dev/null || true\n'
    )
    t0 = time.time()
    r = run(
        tmp_path, ["signals.sh", "slurm_call.sh", "ctld.sh"], script, {"HPCTRAIN_SLURM_CALL_LOG": str(log)}, bin_dir
    )
    assert r.returncode == 0 and "answer show\nrc=3" in r.stdout, r.stdout + r.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 4, lines
    first, step, long, quotes = map(json.loads, lines)
    assert first["kind"] == "scontrol" and first["args"] == ["show", "job", *odd], first
    assert first["rc"] == 3 and first["where"] == "batch" and first["cached"] is False, first
    assert t0 - 1 <= first["t"] <= time.time() + 1 and isinstance(first["s"], float) and 0 <= first["s"] < 60
    assert step["kind"] == "srun" and step["args"] == ["--overlap", "true"] and step["rc"] is None, step
    assert len(lines[2].encode()) < 4096 and long["args"][0] == "0" * 100 and long["args"][-1] == "...", long
    assert len(lines[3].encode()) < 4096 and quotes["args"][0] == '"' * 100 and quotes["args"][-1] == "...", quotes
    assert set(first) == {"t", "kind", "args", "s", "rc", "where", "cached"}


def test_no_call_log_without_the_variable(tmp_path):
    bin_dir = stand_ins(tmp_path, {"scontrol": "echo ok"})
    r = run(tmp_path, ["signals.sh", "slurm_call.sh", "ctld.sh"], "hpctrain_scontrol ping\n", {}, bin_dir)
    assert r.returncode == 0 and r.stdout == "ok\n" and sorted(p.name for p in tmp_path.iterdir()) == ["bin", "calls"]


def controller_outage(tmp_path: Path) -> tuple[list[float], subprocess.CompletedProcess, int]:
    """`hpctrain_scontrol show job` against a controller that never answers, at the default give-up time."""
    d = tmp_path / f"try{len(list(tmp_path.glob('try*')))}"
    d.mkdir()
    down = 'echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1'
    bin_dir = stand_ins(d, {"scontrol": down, "sleep": sim_sleep(d, 1e9)})
    r = run(d, ["signals.sh", "slurm_call.sh", "ctld.sh"], "hpctrain_scontrol show job 7\n", {}, bin_dir)
    return slept(d), r, len(calls(d, "scontrol"))


def test_controller_retries_back_off_to_30_s_with_jitter_and_give_up_after_600_s(tmp_path):
    """Before, every job asked again every 2 s for up to 600 s: after a controller restart each job of
    the cluster came back 300 times, all in step. Now the pauses double from 1-2 s to 30-60 s, each drawn
    at random in the upper half of its range, and the give-up time stays HPCTRAIN_CTLD_WAIT_S (600 s)."""
    pauses, r, n = controller_outage(tmp_path)
    assert r.returncode == 1 and "slurmctld did not answer" in r.stderr and "Unable to contact" in r.stderr, r.stderr
    assert n == len(pauses) + 1, (n, pauses)  # a call, then a pause before each next one
    for i, (lo, hi) in enumerate([(1, 2), (2, 4), (4, 8), (8, 16), (16, 32)]):
        assert lo <= pauses[i] <= hi, pauses
    capped = pauses[5:-1]  # the last one is cut to the time left
    assert capped and all(30 <= p <= 60 for p in capped) and max(pauses) >= 30, pauses
    assert 599 <= sum(pauses) <= 601, pauses  # gives up at 600 s of pauses, as before
    assert len(set(capped)) > 1, pauses  # jitter: not one fixed pause
    again, _, _ = controller_outage(tmp_path)
    assert again != pauses, (again, pauses)  # another job (shell) draws other pauses


def test_another_error_is_not_retried(tmp_path):
    bin_dir = stand_ins(tmp_path, {"scontrol": 'echo "Invalid job id specified" >&2; exit 1', "sleep": "exit 0"})
    r = run(tmp_path, ["signals.sh", "slurm_call.sh", "ctld.sh"], "hpctrain_scontrol show job 7\n", {}, bin_dir)
    assert r.returncode == 1 and "Invalid job id" in r.stdout and len(calls(tmp_path)) == 1 and not slept(tmp_path)


# `sinfo -h -N -n NODE -o %T` of a node in 2 partitions (one line each), as 22.05.8 answers
NODE_OK = 'printf "mixed\\nmixed\\n"'
COUNTERS = {"scontrol": "exit 0", "squeue": "exit 0", "sacct": "exit 0", "scancel": "exit 0"}


def per_minute(tmp_path: Path) -> float:
    return len(calls(tmp_path, *CONTROLLER)) / (sum(slept(tmp_path)) / 60)


def test_the_guard_asks_slurm_at_most_once_a_minute_while_the_batch_shell_beats(tmp_path):
    """The guard of a job with spares, at its default periods, over 20 simulated minutes in which the
    batch shell's heartbeat moves: before, one `scontrol show node` every 10 s (6 a minute)."""
    bin_dir = stand_ins(tmp_path, {**COUNTERS, "sinfo": NODE_OK, "sleep": sim_sleep(tmp_path, SIM_S)})
    script = f"hpctrain_alive={tmp_path}/alive\nhpctrain_guard n1\necho guard-ended\n"
    r = run(tmp_path, ["signals.sh", "slurm_call.sh", "ctld.sh", "guard.sh"], script, {}, bin_dir)
    assert r.returncode == 0 and "guard-ended" in r.stdout, r.stdout + r.stderr
    assert sum(slept(tmp_path)) >= SIM_S and set(slept(tmp_path)) == {10.0}, slept(tmp_path)  # HPCTRAIN_GUARD_S
    assert calls(tmp_path) and set(calls(tmp_path)) == {"sinfo -h -N -n n1 -o %T"}, calls(tmp_path)  # one node's record
    guard = per_minute(tmp_path)
    assert guard <= 1.0, guard
    clock = clock_per_minute(tmp_path / "clock")
    assert guard + clock <= BUDGET_PER_MIN, (guard, clock)


def clock_per_minute(tmp_path: Path) -> float:
    """The batch shell's own steady-state calls (any job): the time limit's clock (clock.sh)."""
    tmp_path.mkdir()
    job = 'case "$1 $2" in "show job") echo "JobId=7 JobName=j EndTime=2099-01-01T00:00:00 P=p" ;; esac'
    # the clock's nap runs in its own background shell: the stand-in ends that shell (its TERM trap) at the limit
    bin_dir = stand_ins(tmp_path, {**COUNTERS, "scontrol": job, "sleep": sim_sleep(tmp_path, SIM_S, "kill $PPID")})
    script = 'wait "$hpctrain_clock_pid"\necho clock-ended\n'
    env = {"HPCTRAIN_CONTROL_DIR": str(tmp_path)}
    r = run(tmp_path, ["signals.sh", "slurm_call.sh", "ctld.sh", "clock.sh"], script, env, bin_dir)
    assert r.returncode == 0 and "clock-ended" in r.stdout, r.stdout + r.stderr
    assert sum(slept(tmp_path)) >= SIM_S and calls(tmp_path), (slept(tmp_path), calls(tmp_path))
    return per_minute(tmp_path)


def test_the_batch_shell_without_spares_stays_within_the_budget(tmp_path):
    """No spares, no guard: the clock alone re-reads the job's end at most every 300 s."""
    assert clock_per_minute(tmp_path / "clock") <= BUDGET_PER_MIN / 4


def guard_acts_at(tmp_path: Path, state: str, beat_until_s: float) -> float:
    """The simulated second at which the guard requeues the job: sinfo answers `state` for the batch
    host, whose heartbeat moves until `beat_until_s`."""
    sleep = sim_sleep(tmp_path, SIM_S, beat_until_s=beat_until_s)
    bin_dir = stand_ins(tmp_path, {**COUNTERS, "sinfo": f'printf "{state}\\n{state}\\n"', "sleep": sleep})
    script = (
        f"hpctrain_alive={tmp_path}/alive\n"
        "hpctrain_exclude_add() { :; }\nhpctrain_budget_left() { :; }\n"
        f"hpctrain_requeue_excluding() {{ awk '{{s += $1}} END {{print s}}' {tmp_path}/slept > {tmp_path}/acted; }}\n"
        "hpctrain_guard n1\n"
    )
    r = run(tmp_path, ["signals.sh", "slurm_call.sh", "ctld.sh", "guard.sh"], script, {}, bin_dir)
    assert r.returncode == 0 and "requeueing job 7 without it" in r.stderr, r.stdout + r.stderr
    return float((tmp_path / "acted").read_text())


def test_the_guard_still_acts_within_three_polls_once_the_heartbeat_stops(tmp_path):
    """Asking Slurm less must not make the guard slower where it matters: the heartbeat stops at 300 s
    (the batch host hangs) and the node reads NOT_RESPONDING (sinfo's `mixed*`): it requeues the job
    within 3 polls (30 s), as before."""
    assert 300 < guard_acts_at(tmp_path, "mixed*", 300) <= 330


def test_the_guard_acts_on_a_down_batch_host_whose_shell_still_beats_within_a_minute(tmp_path):
    """A batch host DOWN (`down*`) while its shell's heartbeat still moves: seen at the next question
    to Slurm (HPCTRAIN_GUARD_ASK_S, 60 s); before, within 10 s."""
    assert guard_acts_at(tmp_path, "down*", 1e9) == 60


def probe_stand_in(hang: str = "", fail_launch: str = "", aborted: str = "") -> str:
    """An srun that runs the probe's `bash -c PROGRAM …` once per node of --nodelist, with
    SLURMD_NODENAME set, as one multi-node step would: `hang` never starts (the step times out),
    `fail_launch` fails to launch (srun names it and gives up), `aborted` is killed after it started."""
    return (
        "nodes=\n"
        'while [ "$#" -gt 0 ]; do case $1 in --nodelist=*) nodes=${1#*=} ;; bash) break ;; esac; shift; done\n'
        "rc=0\n"
        "for n in ${nodes//,/ }; do\n"
        f"  case $n in {hang or '-'}) continue ;;\n"
        f'    {fail_launch or "-"}) echo "srun: error: Task launch for StepId=7.3 failed on node $n: Communication'
        ' connection failure" >&2; rc=1; continue ;;\n'
        f'    {aborted or "-"}) echo "hpctrain-probe $n started"; continue ;;\n'
        "  esac\n"
        '  SLURMD_NODENAME=$n "$@" &\n'
        "done\n"
        "wait\n"
        f"{'exec sleep 60' if hang else 'exit $rc'}"
    )


NODES = ["n1", "n2", "n3", "n4", "n5"]


def name_faults(tmp_path: Path, srun: str, env: dict[str, str] | None = None) -> tuple[list[str], list[str], str]:
    """hpctrain_faults after a failed step on 5 nodes, n3's GPU lost: the lines it names, the srun
    calls, stderr."""
    lost = tmp_path / "lost"
    lost.write_text("n3\n")
    job = f'echo "JobId=7 JobName=j JobState=RUNNING NodeList={",".join(NODES)} Restarts=0"'
    nodes = 'for n in ${4//,/ }; do echo "NodeName=$n Arch=x State=ALLOCATED Cores=1"; done'
    hosts = 'printf "%s\\n" "$3" | tr , "\\n"'
    scontrol = f'case "$1 $2" in "show hostnames") {hosts} ;; "show job") {job} ;; "show node") {nodes} ;; esac'
    bin_dir = stand_ins(tmp_path, {"scontrol": scontrol, "srun": srun})
    control = tmp_path / "control"
    control.mkdir()
    env = {
        "PATH": f"{bin_dir}:{FAKE_GPU}:{os.environ['PATH']}",
        "HPCTRAIN_CONTROL_DIR": str(control),
        "HPCTRAIN_PROBE_GPUS": "1",
        "HPCTRAIN_TEST_LOST_GPUS": str(lost),
        "SLURM_JOB_NUM_NODES": "5",
        "SLURM_JOB_NODELIST": ",".join(NODES),
        **(env or {}),
    }
    script = f"hpctrain_rc=1 hpctrain_step_hosts=' {' '.join(NODES)} '\nhpctrain_faults\n"
    r = run(tmp_path, ["signals.sh", "slurm_call.sh", "ctld.sh", "spares.sh"], script, env, bin_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines(), calls(tmp_path, "srun"), r.stderr


def test_a_failed_step_probes_all_its_nodes_in_one_srun_step(tmp_path):
    """Before, one srun step per node, all at once: 2 × N calls to slurmctld in a burst (N = 128: the
    probes of a big allocation hit a site's rl_enable and the start timeout). Now one step of one task
    per node, and the node whose GPU is lost is still the one named, with its own reason."""
    named, sruns, err = name_faults(tmp_path, probe_stand_in())
    assert len(sruns) == 1, sruns
    assert "--nodes=5 --ntasks=5 --ntasks-per-node=1 --nodelist=n1,n2,n3,n4,n5 --kill-on-bad-exit=0" in sruns[0]
    assert named == ["n3\tprobe step failed (exit 2): nvidia-smi -L lists 0 of the 1 GPU(s) the job uses"], err
    # every node ran its checks in that one step (n3 stopped at its GPUs, before the write)
    assert sorted(p.name for p in (tmp_path / "control").iterdir()) == [f"probe-{n}" for n in NODES if n != "n3"]


def test_a_node_the_probe_step_cannot_launch_on_is_named_and_not_the_others(tmp_path):
    """srun names a node it could not launch on and ends the step: that node is named, with srun's
    words; a node whose task was ended with the step (started, no verdict) is not blamed."""
    named, sruns, err = name_faults(tmp_path, probe_stand_in(fail_launch="n4", aborted="n2"))
    assert len(sruns) == 1, sruns
    assert named == [
        "n3\tprobe step failed (exit 2): nvidia-smi -L lists 0 of the 1 GPU(s) the job uses",
        "n4\tprobe step failed (exit 1): srun: error: Task launch for StepId=7.3 failed on node n4: Communication"
        " connection failure",
    ], err


def test_a_node_whose_probe_task_never_starts_is_named_after_the_start_timeout(tmp_path):
    """A node whose task did not start in HPCTRAIN_PROBE_START_S (its Prolog hangs) is named for it;
    the nodes whose checks passed in the same step are not."""
    named, sruns, err = name_faults(tmp_path, probe_stand_in(hang="n5"), {"HPCTRAIN_PROBE_START_S": "3"})
    assert len(sruns) == 1, sruns
    assert named == [
        "n3\tprobe step failed (exit 2): nvidia-smi -L lists 0 of the 1 GPU(s) the job uses",
        "n5\tthe probe step did not start in 3 s (HPCTRAIN_PROBE_START_S)",
    ], err


BARE = re.compile(rf"(?:^|[;&|({{!]|\$\(|\bthen|\bdo|\belse|&&|\|\|)\s*(?:timeout \S+ )?({'|'.join(CONTROLLER)})\s")


def test_every_controller_call_of_the_shell_goes_through_hpctrain_slurm():
    """No file of launch/shell/ runs a Slurm client itself (comments and messages aside); scontrol's
    local subcommands (`show hostnames`, `--version`) make no call to the controller."""
    found = []
    for f in sorted((ROOT / "src" / "hpctrain" / "launch" / "shell").glob("*.sh")):
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = re.sub(r"(^|\s)#.*$", "", line)
            code = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: m[0] if "$(" in m[0] else '""', code)  # messages
            for m in BARE.finditer(code):
                rest = code[m.start(1) :]
                if rest.startswith(("scontrol show hostnames", "scontrol --version")):
                    continue
                found.append(f"{f.name}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
