"""The one Slurm client (site/slurm_cli.py): its call log, its retry of a daemon that does not answer
(and of nothing else), its cache. Slurm's clients are stand-ins here that count their calls and
answer as the real ones do (their error texts: Slurm 22.05 and 24.11, docs/spares.md "When slurmctld
hiccups"); the submission budget against the real test cluster is tests/launch/test_submit_budget.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hpctrain.launch import submitit_glue as glue
from hpctrain.site import slurm_cli

CONFIG = "ClusterName = fake\nSlurmctldHost[0] = ctl(10.0.0.1)\nSlurmctldPort = 6817\n"


def fake(bin_dir: Path, name: str, body: str) -> None:
    """A stand-in `name` on PATH that appends its argv to bin_dir/calls, then runs `body` (sh)."""
    p = bin_dir / name
    p.write_text(f'#!/bin/sh\nPATH=/usr/bin:/bin\necho "{name} $*" >> "{bin_dir}/calls"\n{body}\n')
    p.chmod(p.stat().st_mode | stat.S_IXUSR)


def calls(bin_dir: Path) -> list[str]:
    f = bin_dir / "calls"
    return f.read_text().splitlines() if f.exists() else []


def log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """A PATH of stand-ins only, a call log, a fresh user cache; no jitter sleeps longer than 10 ms."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "env").symlink_to("/usr/bin/env")
    fake(bin_dir, "scontrol", f'[ "$1 $2" = "show config" ] && printf "{CONFIG}"; exit 0')
    monkeypatch.setenv("PATH", str(bin_dir))  # the host's own Slurm clients are not found
    monkeypatch.setenv(slurm_cli.CALL_LOG_VAR, str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # configless: the controller names it
    monkeypatch.setattr(slurm_cli, "BACKOFF_S", 0.005)
    slurm_cli.clear_memo()
    yield bin_dir, tmp_path / "calls.jsonl"
    slurm_cli.clear_memo()


def test_each_call_is_one_json_line_of_the_shared_format(slurm, monkeypatch):
    bin_dir, log = slurm
    fake(
        bin_dir, "squeue", 'echo RUNNING; [ "$3" = 7 ] || { echo "slurm_load_jobs error: Invalid job id" >&2; exit 1; }'
    )
    assert slurm_cli.queue_state("7") == "RUNNING"
    monkeypatch.setenv("SLURM_JOB_ID", "99")  # inside a job: the batch shell's side
    assert slurm_cli.ask("squeue", "-h", "-j", "8", "-o", "%T") == (None, "slurm_load_jobs error: Invalid job id")
    first, second = log_lines(log)
    assert set(first) == {"t", "kind", "args", "s", "rc", "where", "cached"}
    assert (first["kind"], first["args"], first["rc"], first["where"], first["cached"]) == (
        "squeue",
        ["-h", "-j", "7", "-o", "%T"],
        0,
        "login",
        False,
    )
    assert (second["rc"], second["where"]) == (1, "batch")
    assert first["s"] >= 0 and first["t"] <= second["t"]
    assert len(calls(bin_dir)) == 2  # the log matches the stand-in's own count


def test_an_env_prefix_is_logged_as_the_slurm_command(slurm):
    bin_dir, log = slurm
    fake(bin_dir, "sbatch", "echo 12")
    assert slurm_cli.tool("env", "-u", "SLURM_MEM_PER_CPU", "sbatch", "--parsable", input="#!/bin/sh\n") == "12\n"
    (line,) = log_lines(log)
    assert (line["kind"], line["args"]) == ("sbatch", ["--parsable"])


def test_no_log_without_the_variable_and_a_missing_client_is_no_answer(slurm, monkeypatch):
    bin_dir, log = slurm
    monkeypatch.delenv(slurm_cli.CALL_LOG_VAR)
    fake(bin_dir, "sinfo", "echo 1/1/0/2")
    assert slurm_cli.node_counts("debug") == [1, 1, 0, 2]
    assert slurm_cli.ask("sacct", "-j", "1") == (None, "no sacct on this machine")
    assert not log.exists()


@pytest.mark.parametrize(
    "error",
    [
        "slurm_load_partitions: Unable to contact slurm controller (connect failure)",
        "slurm_load_jobs error: Socket timed out on send/recv operation",
    ],
)
def test_a_controller_that_does_not_answer_is_asked_again(slurm, error, monkeypatch):
    bin_dir, log = slurm
    waits, backoff = [], slurm_cli.backoff_s
    monkeypatch.setattr(slurm_cli, "backoff_s", lambda attempt: waits.append(attempt) or backoff(attempt))
    # fails twice (the daemon restarting), then answers
    fake(
        bin_dir,
        "sinfo",
        f'n=$(grep -c "^sinfo" "{bin_dir}/calls")\n'
        f'[ "$n" -ge 3 ] && {{ echo 0/2/0/2; exit 0; }}; echo "{error}" >&2; exit 1',
    )
    assert slurm_cli.node_counts("debug") == [0, 2, 0, 2]
    assert [c.split()[0] for c in calls(bin_dir)] == ["sinfo"] * 3
    assert [line["rc"] for line in log_lines(log)] == [1, 1, 0]
    assert waits == [0, 1]  # a jittered wait before each retry, the second one's range twice the first's


def test_retries_give_up_after_retries_and_say_why(slurm):
    bin_dir, _ = slurm
    fake(bin_dir, "squeue", 'echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1')
    out, why = slurm_cli.ask("squeue", "--start", "-h")
    assert out is None and "Unable to contact slurm controller" in why
    assert len(calls(bin_dir)) == 1 + slurm_cli.RETRIES


def test_a_daemon_that_gave_no_answer_is_not_asked_again_for_a_while(slurm, monkeypatch):
    """One plan asks slurmctld many questions; once one got no answer after its retries (or a ping said
    DOWN), the others fail at once instead of each waiting out the client's retries (~9 s a call)."""
    bin_dir, _ = slurm
    fake(bin_dir, "squeue", 'echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1')
    fake(bin_dir, "sinfo", "echo 0/2/0/2")
    fake(bin_dir, "sacct", 'echo "1|COMPLETED"')
    assert slurm_cli.ask("squeue", "-h")[0] is None and len(calls(bin_dir)) == 1 + slurm_cli.RETRIES
    out, why = slurm_cli.ask("sinfo", "-h")  # slurmctld too: not asked
    assert out is None and "Unable to contact slurm controller" in why and "not asked again" in why
    assert slurm_cli.tool("sacct", "-n") == "1|COMPLETED\n"  # slurmdbd is another daemon: asked
    assert [c.split()[0] for c in calls(bin_dir)] == ["squeue"] * 3 + ["sacct"]
    clock = slurm_cli.time.monotonic() + slurm_cli.SILENT_S + 1
    monkeypatch.setattr(slurm_cli.time, "monotonic", lambda: clock)
    assert slurm_cli.tool("sinfo", "-h") == "0/2/0/2\n"  # a while later: asked again


@pytest.mark.parametrize(
    "cmd, error",
    [
        (("squeue", "-h", "-j", "5"), "slurm_load_jobs error: Invalid job id specified"),
        (("sacct", "-j", "5"), "sacct: error: Slurm accounting storage is disabled"),
        # may have been carried out although it timed out: a second sbatch would submit a second job
        (("sbatch", "--parsable", "x.sh"), "sbatch: error: Batch job submission failed: Socket timed out on send/recv"),
        (("scontrol", "requeue", "5"), "Socket timed out on send/recv operation"),
        (("scancel", "5"), "scancel: error: Unable to contact slurm controller (connect failure)"),
    ],
)
def test_a_refusal_or_a_change_is_never_asked_again(slurm, cmd, error):
    bin_dir, _ = slurm
    fake(bin_dir, cmd[0], f'echo "{error}" >&2; exit 1')
    assert slurm_cli.ask(*cmd) == (None, error)
    assert len([c for c in calls(bin_dir) if c.split()[0] == cmd[0]]) == 1


def test_the_backoff_doubles_and_is_jittered():
    for attempt in range(5):
        waits = [slurm_cli.backoff_s(attempt) for _ in range(200)]
        cap = min(slurm_cli.BACKOFF_CAP_S, slurm_cli.BACKOFF_S * 2**attempt)
        assert min(waits) >= 0 and max(waits) <= cap
        assert max(waits) > 0.8 * cap and min(waits) < 0.2 * cap  # spread over the whole range: no two alike
        assert len(set(waits)) == len(waits)


def test_a_cached_answer_is_reused_per_cluster_across_processes_and_counts_no_call(slurm, monkeypatch):
    bin_dir, log = slurm
    fake(bin_dir, "sinfo", "echo 1/1/0/2")
    assert slurm_cli.node_counts("debug", cache_s=600) == [1, 1, 0, 2]
    assert slurm_cli.node_counts("debug", cache_s=600) == [1, 1, 0, 2]  # this process's memo
    slurm_cli.clear_memo()  # the next command: the user's cache
    assert slurm_cli.node_counts("debug", cache_s=600) == [1, 1, 0, 2]
    assert [c for c in calls(bin_dir) if c.startswith("sinfo")] == ["sinfo -h -p debug -o %F"]
    sinfo = [line for line in log_lines(log) if line["kind"] == "sinfo"]
    assert [line["cached"] for line in sinfo] == [False, True, True]
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "hpctrain"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in cache.iterdir())
    # another cluster (another controller) does not get this one's answer
    slurm_cli.clear_memo()
    fake(bin_dir, "scontrol", f'[ "$1 $2" = "show config" ] && printf "{CONFIG.replace("fake", "other")}"; exit 0')
    assert slurm_cli.node_counts("debug", cache_s=600) == [1, 1, 0, 2]
    assert len([c for c in calls(bin_dir) if c.startswith("sinfo")]) == 2
    # past its life it is asked again
    slurm_cli.clear_memo()
    for f in cache.iterdir():
        os.utime(f, (f.stat().st_mtime - 700, f.stat().st_mtime - 700))
    slurm_cli.node_counts("debug", cache_s=600)
    assert len([c for c in calls(bin_dir) if c.startswith("sinfo")]) == 3


def test_nothing_is_cached_across_commands_without_a_cluster_name(slurm):
    bin_dir, _ = slurm
    fake(bin_dir, "scontrol", '[ "$1 $2" = "show config" ] && echo "AuthType = auth/munge"; exit 0')  # names no cluster
    fake(bin_dir, "sinfo", "echo 1/1/0/2")
    slurm_cli.node_counts("debug", cache_s=600)
    slurm_cli.clear_memo()
    slurm_cli.node_counts("debug", cache_s=600)
    assert len([c for c in calls(bin_dir) if c.startswith("sinfo")]) == 2
    assert not (Path(os.environ["XDG_CACHE_HOME"]) / "hpctrain").exists()


def test_submitits_sbatch_is_logged_with_its_exit_status(slurm, tmp_path):
    bin_dir, log = slurm
    spec = glue.SlurmSpec(tmp_path / "sub", "#!/bin/sh\ntrue\n", 1, 1, 5, "t", 0, "python3")
    fake(bin_dir, "srun", "exit 0")  # submitit's executor looks for it on PATH before it submits
    fake(bin_dir, "sbatch", 'echo "Submitted batch job 4242"')
    job = glue.slurm_job(spec, print, "x")
    assert job.job_id == "4242"
    fake(bin_dir, "sbatch", 'echo "sbatch: error: Batch job submission failed: Invalid partition name" >&2; exit 1')
    with pytest.raises(glue.SUBMIT_ERRORS):
        glue.slurm_job(spec, print, "x")
    ok, refused = [line for line in log_lines(log) if line["kind"] == "sbatch"]
    assert (ok["rc"], refused["rc"]) == (0, 1)
    assert ok["args"][0].endswith(".sh") and len(ok["args"]) == 1  # submitit's `sbatch <file>`
    assert len([c for c in calls(bin_dir) if c.startswith("sbatch")]) == 2


def test_the_clients_slurm_conf_names_the_cluster_without_a_call(slurm, tmp_path, monkeypatch):
    bin_dir, _ = slurm
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "# site\nclustername=site1  # ours\nSlurmctldHost=ctl1(10.0.0.1)\nSlurmctldHost=ctl2\nSlurmctldPort=6817\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert slurm_cli.cluster_key() == ("site1", "ctl1(10.0.0.1)", "6817", "")
    fake(bin_dir, "sinfo", "echo 1/1/0/2")
    slurm_cli.node_counts("debug", cache_s=600)
    slurm_cli.clear_memo()
    slurm_cli.node_counts("debug", cache_s=600)  # from the user's cache: no scontrol asked for the name
    assert calls(bin_dir) == ["sinfo -h -p debug -o %F"]
    # another file, another cluster; a file that names none: the controller is asked
    conf.write_text("ClusterName=site2\n")
    slurm_cli.clear_memo()
    slurm_cli.node_counts("debug", cache_s=600)
    assert len(calls(bin_dir)) == 2
    conf.write_text("Include /elsewhere/slurm.conf\n")
    assert slurm_cli.cluster_key() == ("fake", "ctl(10.0.0.1)", "6817", "")
    assert calls(bin_dir)[-1] == "scontrol show config"


def test_a_partition_the_cached_list_lacks_is_asked_for_again(slurm):
    bin_dir, _ = slurm
    parts = bin_dir / "partitions"
    parts.write_text("PartitionName=a Default=YES GraceTime=0\n")
    fake(
        bin_dir,
        "scontrol",
        f'[ "$1 $2" = "show config" ] && printf "{CONFIG}"; [ "$2" = partition ] && cat "{parts}"; exit 0',
    )
    assert slurm_cli.partition_record("")["PartitionName"] == "a"
    assert slurm_cli.partition_record("a")["GraceTime"] == "0"  # the cached list
    assert len([c for c in calls(bin_dir) if "partition" in c]) == 1
    parts.write_text("PartitionName=a Default=YES GraceTime=0\nPartitionName=b GraceTime=30\n")  # the site adds b
    assert slurm_cli.partition_record("b")["GraceTime"] == "30"
    assert len([c for c in calls(bin_dir) if "partition" in c]) == 2  # not in the cached list: asked again
    slurm_cli.clear_memo()  # the next command: the new list from the user's cache
    assert slurm_cli.partition_record("b")["GraceTime"] == "30"
    assert slurm_cli.partition_record("c") == {}  # none such: asked once more, in vain
    assert len([c for c in calls(bin_dir) if "partition" in c]) == 3
