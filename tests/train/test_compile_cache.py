"""compile.cache: Inductor's caches keyed by image + torch + model config, on node-local disk during an
attempt and saved as one archive at its end; a second compiled run with the same cache hits Inductor's
FX graph cache."""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest

from hpctrain.config import load
from hpctrain.train import compile_cache as cc
from tests.helpers import digits_args, run_ranks


def test_key_separates_images_torch_versions_and_models():
    a = load("digits_vit", [])
    key = cc.cache_key(a, "sha256:" + "ab" * 32, "2.13.0+cu128")
    assert re.fullmatch(r"abab[0-9a-f]{20}-torch2\.13\.0\+cu128-[0-9a-f]{12}", key)
    assert cc.cache_key(a, "", "2.13.0").startswith("noimage-torch2.13.0-")
    assert cc.cache_key(a, "", "2.13.0") != cc.cache_key(a, "", "2.2.0")
    assert cc.cache_key(a, "", "2.13.0") != cc.cache_key(load("digits_vit", ["model.depth=2"]), "", "2.13.0")
    assert cc.cache_key(a, "", "2.13.0") == cc.cache_key(load("digits_vit", ["optim.lr=0.1"]), "", "2.13.0")
    assert "/" not in cc.cache_key(a, "../x/y", "2.13.0")


def entries(local: Path) -> dict[str, str]:
    return {str(p.relative_to(local)): p.read_text() for p in local.rglob("*") if p.is_file() and p.name != cc.DONE}


def test_the_cache_lives_on_the_node_and_round_trips_through_one_archive_in_the_run(tmp_path):
    """Attempt 1 on node A compiles into A's disk and rank 0 saves ONE archive; attempt 2 on node B
    starts from it (unpacked once per node: the node's second rank finds it done) and adds its own."""
    run_cache = tmp_path / "run" / "compile_cache"
    archive = run_cache / "noimage-torch2.13.0-abc.tar"
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    first = cc.open_cache(archive, str(node_a))
    assert first.dir == node_a / f"hpctrain-{os.getuid()}" / f"compile-{cc.local_name(archive)}"  # the user's own
    assert stat.S_IMODE(first.dir.parent.stat().st_mode) == 0o700
    (first.dir / "fxgraph" / "ab").mkdir(parents=True)  # what Inductor and Triton write during the attempt
    (first.dir / "fxgraph" / "ab" / "entry").write_text("graph")
    (first.dir / "triton" / "k").mkdir(parents=True)
    (first.dir / "triton" / "k" / "kernel.so").write_text("kernel")
    assert not run_cache.exists()  # nothing of the attempt reaches the run directory before its end
    first.save(is_main=False)
    assert not run_cache.exists()  # rank 0 only
    first.save(is_main=True)
    assert sorted(p.name for p in run_cache.iterdir()) == [archive.name]  # one file, no temp file left

    second = cc.open_cache(archive, str(node_b))  # the requeued attempt, on another node
    assert entries(second.dir) == {"fxgraph/ab/entry": "graph", "triton/k/kernel.so": "kernel"}
    assert cc.restore(archive, second.dir) == 0  # the node's next rank: already unpacked
    (second.dir / "fxgraph" / "cd").mkdir()
    (second.dir / "fxgraph" / "cd" / "new").write_text("new")
    second.save(is_main=True)
    third = cc.open_cache(archive, str(tmp_path / "node-c"))
    assert entries(third.dir) == {"fxgraph/ab/entry": "graph", "fxgraph/cd/new": "new", "triton/k/kernel.so": "kernel"}
    assert cc.restore(archive, first.dir) == 1  # a newer archive than the one node A holds: its new entry only


def test_another_run_on_the_node_starts_from_its_own_archive_not_from_this_runs_entries(tmp_path):
    """Two runs with the same model (same key) on one node: separate node-local caches, so a new run
    compiles cold unless its own archive (or a shared compile.cache) says otherwise."""
    node = str(tmp_path / "node")
    one = cc.open_cache(tmp_path / "run1" / "compile_cache" / "k.tar", node)
    (one.dir / "entry").write_text("one")
    two = cc.open_cache(tmp_path / "run2" / "compile_cache" / "k.tar", node)
    assert two.dir != one.dir and entries(two.dir) == {}


def test_a_save_keeps_what_another_job_sharing_the_archive_saved_meanwhile(tmp_path):
    """Two sweep members with the same model share `<sweep>/compile_cache/<key>.tar`: the second save
    takes in the first's entries instead of replacing them."""
    archive = tmp_path / "sweep" / "compile_cache" / "k.tar"
    a, b = cc.open_cache(archive, str(tmp_path / "n1")), cc.open_cache(archive, str(tmp_path / "n2"))
    (a.dir / "from-a").write_text("a")
    (b.dir / "from-b").write_text("b")
    a.save(is_main=True)
    b.save(is_main=True)
    with tarfile.open(archive) as tar:
        assert sorted(Path(m.name).name for m in tar.getmembers() if m.isfile()) == ["from-a", "from-b"]


def test_an_older_cache_directory_is_taken_in_once(tmp_path):
    """An earlier hpctrain kept `<cache>/<key>/` as a directory of files: its entries reach the node too."""
    archive = tmp_path / "cc" / "k.tar"
    (tmp_path / "cc" / "k" / "fxgraph").mkdir(parents=True)
    (tmp_path / "cc" / "k" / "fxgraph" / "old").write_text("old")
    assert entries(cc.open_cache(archive, str(tmp_path / "node")).dir) == {"fxgraph/old": "old"}


def test_an_archive_reaching_outside_its_directory_is_not_unpacked(tmp_path, hpctrain_log):
    archive = tmp_path / "cc" / "k.tar"
    archive.parent.mkdir()
    with tarfile.open(archive, "w") as tar:
        data = b"x"
        info = tarfile.TarInfo("../../escaped")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    cache = cc.open_cache(archive, str(tmp_path / "node"))
    assert not list(tmp_path.rglob("escaped")) and entries(cache.dir) == {}
    assert any("not restored" in r.getMessage() for r in hpctrain_log.records if r.levelname == "WARNING")


def test_a_node_whose_user_directory_is_another_users_gets_a_private_directory(tmp_path, hpctrain_log):
    """<node>/hpctrain-<uid> made first by another uid: one warning, and this rank's own private temp
    directory (still node-local, never the shared file system)."""
    node = tmp_path / "node"
    (node / f"hpctrain-{os.getuid()}").mkdir(parents=True)
    os.chown(node / f"hpctrain-{os.getuid()}", 54321, -1)
    cache = cc.open_cache(tmp_path / "cc" / "k.tar", str(node))
    try:
        assert cache.dir.parent == Path(tempfile.gettempdir()) and stat.S_IMODE(cache.dir.stat().st_mode) == 0o700
        assert [r.getMessage() for r in hpctrain_log.records if r.levelname == "WARNING"] == [
            f"compile cache: not in {node}: {node}/hpctrain-{os.getuid()} belongs to uid 54321, not to this job's "
            f"uid {os.getuid()}; this rank uses a private temp directory of its own"
        ]
    finally:
        shutil.rmtree(cache.dir)


@pytest.mark.slow  # two compiled runs: ~1-2 min of Inductor on 2 cores
def test_second_compiled_run_hits_the_fx_graph_cache(digits_root, tmp_path):
    cache = tmp_path / "cache"
    sets = ["train.max_steps=1", "compile.enabled=true", f"compile.cache={cache}", "model.depth=1"]
    for name in ("first", "second"):  # each on its own "node" (TMPDIR): the second is warm through the archive only
        (tmp_path / f"node-{name}").mkdir()
        run_ranks(
            1,
            digits_args(digits_root, tmp_path, name, *sets),
            timeout=600,
            env={"TMPDIR": str(tmp_path / f"node-{name}")},
        )
    assert any((tmp_path / "node-first").rglob("fxgraph"))  # the attempt compiled on its node's disk
    [archive] = cache.iterdir()  # one archive, saved by rank 0 at the end of the attempt
    assert archive.name.startswith("noimage-torch") and archive.suffix == ".tar"
    with tarfile.open(archive) as tar:
        assert any(m.isfile() and m.name.startswith("./fxgraph/") for m in tar.getmembers())
    first = (tmp_path / "first" / "logs" / "rank-0.log").read_text()
    second = (tmp_path / "second" / "logs" / "rank-0.log").read_text()
    hits = lambda text: [int(x) for x in re.findall(r"FX graph cache (\d+) hits, (\d+) misses", text)[0]]  # noqa: E731
    assert hits(first)[0] == 0 and hits(first)[1] > 0
    assert hits(second)[0] > 0 and hits(second)[1] == 0
