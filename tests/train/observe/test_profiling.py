"""log.profile_steps: a torch.profiler window over global steps, its traces and the summary in the
rank log; nothing built when off; a resumed attempt keeps counting global steps."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from hpctrain.config import ConfigError, load
from hpctrain.train.observe.profiling import exposed, plan_schedule
from tests.helpers import digits_args, run_ranks


def trace_steps(path) -> int:
    """ProfilerStep spans in a chrome trace (one per recorded step)."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X")


@pytest.mark.slow
def test_profile_window_writes_traces_and_summary_for_rank_0_and_the_last(digits_root, tmp_path):
    run_ranks(2, digits_args(digits_root, tmp_path, "prof", "train.max_steps=5", "log.profile_steps=3-4"))
    prof = tmp_path / "prof" / "profile"
    assert sorted(p.name for p in prof.iterdir()) == [
        "rank-0-step-3.pt.trace.json.gz",
        "rank-1-step-3.pt.trace.json.gz",
    ]
    for rank in (0, 1):
        assert trace_steps(prof / f"rank-{rank}-step-3.pt.trace.json.gz") == 2
        text = (tmp_path / "prof" / "logs" / f"rank-{rank}.log").read_text()
        assert f"profile of steps 3-4 on rank {rank}" in text
        assert "data wait" in text and "top ops by self CPU time" in text and "aten::" in text
        assert "exposed communication" in text


@pytest.mark.slow
def test_profile_ranks_picks_the_ranks(digits_root, tmp_path):
    run_ranks(
        2,
        digits_args(
            digits_root, tmp_path, "prof", "train.max_steps=3", "log.profile_steps=2-2", "log.profile_ranks=[1]"
        ),
    )
    assert [p.name for p in (tmp_path / "prof" / "profile").iterdir()] == ["rank-1-step-2.pt.trace.json.gz"]


@pytest.mark.slow
def test_no_profiler_is_built_when_profile_steps_is_empty(digits_root, tmp_path):
    """torch.profiler.profile raises if constructed: the run still trains, so none was."""
    code = (
        "import sys, torch.profiler\n"
        "def boom(*a, **k): raise AssertionError('a profiler was built')\n"
        "torch.profiler.profile.__init__ = boom\n"
        "from hpctrain.cli import main\n"
        "sys.argv = ['hpctrain', *sys.argv[1:]]\n"
        "sys.exit(main())\n"
    )
    args = digits_args(digits_root, tmp_path, "noprof", "train.max_steps=2")
    r = subprocess.run([sys.executable, "-c", code, *args[2:]], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not (tmp_path / "noprof" / "profile").exists()
    # the same patch fails a run that asks for a window (the patch is what the test relies on)
    args = digits_args(digits_root, tmp_path, "withprof", "train.max_steps=2", "log.profile_steps=1-1")
    r = subprocess.run([sys.executable, "-c", code, *args[2:]], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "a profiler was built" in r.stdout + r.stderr


@pytest.mark.slow  # two runs, ~1.5 min on 2 busy cores
def test_resumed_attempt_profiles_the_rest_of_the_window_by_global_step(digits_root, tmp_path):
    """Stopped at step 4 inside the window 3-6: the first attempt leaves steps 3-4, the resumed one 5-6."""
    sets = ["train.max_steps=7", "log.profile_steps=3-6"]
    run_ranks(1, digits_args(digits_root, tmp_path, "split", *sets, "--halt-at=4"))
    prof = tmp_path / "split" / "profile"
    assert [p.name for p in prof.iterdir()] == ["rank-0-step-3.pt.trace.json.gz"]
    assert trace_steps(prof / "rank-0-step-3.pt.trace.json.gz") == 3  # steps 3, 4 and the moment up to the stop
    out = run_ranks(1, digits_args(digits_root, tmp_path, "split", *sets))
    assert "at step 4" in out[0].stdout
    assert trace_steps(prof / "rank-0-step-5.pt.trace.json.gz") == 2
    text = (tmp_path / "split" / "logs" / "rank-0.log").read_text()
    assert "profile of steps 3-4 on rank 0" in text and "profile of steps 5-6 on rank 0" in text
    assert "this attempt starts at step 5, profiling steps 5-6" in text


def test_plan_schedule_counts_from_the_start_step():
    assert plan_schedule((20, 25), 0) == (18, 1, 6, 20)  # steps 1-18 wait, 19 warms up, 20-25 record
    assert plan_schedule((20, 25), 10) == (8, 1, 6, 20)  # resumed at 10: step 11 is the schedule's 0
    assert plan_schedule((20, 25), 19) == (0, 0, 6, 20)
    assert plan_schedule((20, 25), 22) == (0, 0, 3, 23)
    assert plan_schedule((20, 25), 25) is None


def test_exposed_communication_is_the_part_no_compute_covers():
    assert exposed([(0, 10)], [(2, 4), (3, 6)]) == 6  # 0-2 and 6-10
    assert exposed([(0, 5), (4, 8)], []) == 8
    assert exposed([(1, 2)], [(0, 10)]) == 0


@pytest.mark.parametrize("bad", ["5-3", "0-2", "3", "a-b"])
def test_bad_window_is_one_line_error(bad):
    with pytest.raises(ConfigError, match="is not a step window: use A-B"):
        load("digits_vit", [f"log.profile_steps={bad}"])
