"""The run directory's shared writes and reads (hpctrain.run.layout): whole files or none, and
records that fall back to the caller's default."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hpctrain.run.layout import atomic_write, read_json, run_dir_named, slurm_job_run_dir


def test_a_reader_never_sees_a_half_written_file(tmp_path):
    path = tmp_path / "rec.json"
    old, new = "a" * 100_000, "b" * 100_000
    atomic_write(path, old)
    seen: set[str] = set()
    started, done = threading.Event(), threading.Event()

    def slow_write(f):
        f.write(new[:50_000].encode())
        f.flush()
        started.set()
        assert done.wait(10)  # the reader looks while half the new text is on disk
        f.write(new[50_000:].encode())

    writer = threading.Thread(target=atomic_write, args=(path, slow_write))
    writer.start()
    assert started.wait(10)
    seen.add(path.read_text())
    done.set()
    writer.join()
    seen.add(path.read_text())
    assert seen == {old, new}
    assert [p.name for p in tmp_path.iterdir()] == ["rec.json"]  # the temp file was renamed


@pytest.mark.parametrize("sync", [False, True])
def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, sync):
    path = tmp_path / "step-00000001.pt"
    atomic_write(path, b"old", sync=sync)

    def fails(f):
        f.write(b"half")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError, match="disk gone"):
        atomic_write(path, fails, sync=sync)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_temp_name_is_one_the_cleanups_find(tmp_path):
    """checkpoint.clear_stale removes `.step-*.pt.tmp-*`, the watchdog `*.tmp`: a killed writer's
    temp file matches both."""
    path = tmp_path / "step-00000002.pt"
    names = []
    atomic_write(path, lambda f: names.extend(p.name for p in tmp_path.iterdir()))
    assert len(names) == 1
    assert Path(names[0]).match(".step-*.pt.tmp-*") and names[0].endswith(".tmp")


def test_read_json_gives_the_default_for_a_missing_cut_or_foreign_file(tmp_path):
    p = tmp_path / "job.json"
    assert read_json(p, {}) == {} and read_json(p, None) is None  # missing
    p.write_text('{"job_id": "12')  # cut short by a writer that died
    assert read_json(p, None) is None
    p.write_text("[1, 2]")  # JSON, but not a record
    assert read_json(p, {}) == {}
    p.write_text('{"job_id": "12"}')
    assert read_json(p, None) == {"job_id": "12"}


def test_the_two_ways_to_find_a_run(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / ".hpctrain").mkdir(parents=True)
    run = tmp_path / "runs" / "vit"
    run.mkdir(parents=True)
    assert slurm_job_run_dir(work, "7") is None
    (work / ".hpctrain" / "job-7.json").write_text(f'{{"run_dir": "{run}"}}')
    assert slurm_job_run_dir(work, "7") == run  # plain sbatch: rank 0's record
    (work / "job.json").write_text("{}")
    assert slurm_job_run_dir(work, "7") == work  # `hpctrain submit` made the working directory the run

    monkeypatch.chdir(tmp_path)
    assert run_dir_named("vit") is None  # no config.yaml: not a run
    (run / "config.yaml").write_text("{}\n")
    assert run_dir_named("vit") == run.resolve() == run_dir_named(str(run))
