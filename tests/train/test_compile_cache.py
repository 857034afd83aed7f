"""compile.cache: Inductor's caches keyed by image + torch + model config, staged to node-local
disk and copied back; a second compiled run with the same cache hits Inductor's FX graph cache."""

from __future__ import annotations

import os
import re

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


def test_staged_cache_is_copied_to_the_node_once_and_new_entries_go_back(tmp_path):
    shared, node = tmp_path / "shared" / "k", tmp_path / "node"
    (shared / "fxgraph" / "ab").mkdir(parents=True)
    (shared / "fxgraph" / "ab" / "entry").write_text("old")
    local = cc.stage(shared, str(node))
    assert local == node / f"hpctrain-{os.getuid()}" / "compile-k"  # the user's own directory, as the data's
    assert (local / "fxgraph" / "ab" / "entry").read_text() == "old"
    (shared / "late").write_text("x")  # another attempt's entry, added after this node's copy
    assert cc.stage(shared, str(node)) == local and not (local / "late").exists()  # copied once per node
    (local / "fxgraph" / "cd").mkdir()
    (local / "fxgraph" / "cd" / "new").write_text("new")
    (local / "fxgraph" / "ab" / "entry").write_text("changed")
    cc.CompileCache(shared, local).save(is_main=False)
    assert not (shared / "fxgraph" / "cd").exists()  # rank 0 only
    cc.CompileCache(shared, local).save(is_main=True)
    assert (shared / "fxgraph" / "cd" / "new").read_text() == "new"
    assert (shared / "fxgraph" / "ab" / "entry").read_text() == "old"  # existing entries are left alone
    assert not (shared / cc.DONE).exists() and not list(shared.rglob("*.tmp"))


def test_a_node_whose_user_directory_is_another_users_uses_the_shared_cache(tmp_path, hpctrain_log):
    """<stage_to>/hpctrain-<uid> made first by another uid: not staged, one warning, the shared cache."""
    shared, node = tmp_path / "shared" / "k", tmp_path / "node"
    shared.mkdir(parents=True)
    (node / f"hpctrain-{os.getuid()}").mkdir(parents=True)
    os.chown(node / f"hpctrain-{os.getuid()}", 54321, -1)
    assert cc.stage(shared, str(node)) is None
    assert [r.getMessage() for r in hpctrain_log.records if r.levelname == "WARNING"] == [
        f"compile cache: not staged: {node}/hpctrain-{os.getuid()} belongs to uid 54321, not to this job's uid "
        f"{os.getuid()}; the ranks use the shared {shared}"
    ]


@pytest.mark.slow  # two compiled runs: ~1-2 min of Inductor on 2 cores
def test_second_compiled_run_hits_the_fx_graph_cache(digits_root, tmp_path):
    cache = tmp_path / "cache"
    sets = ["train.max_steps=1", "compile.enabled=true", f"compile.cache={cache}", "model.depth=1"]
    for name in ("first", "second"):
        run_ranks(1, digits_args(digits_root, tmp_path, name, *sets), timeout=600)
    [keyed] = cache.iterdir()
    assert keyed.name.startswith("noimage-torch") and any((keyed / "fxgraph").rglob("*"))
    first = (tmp_path / "first" / "logs" / "rank-0.log").read_text()
    second = (tmp_path / "second" / "logs" / "rank-0.log").read_text()
    hits = lambda text: [int(x) for x in re.findall(r"FX graph cache (\d+) hits, (\d+) misses", text)[0]]  # noqa: E731
    assert hits(first)[0] == 0 and hits(first)[1] > 0
    assert hits(second)[0] > 0 and hits(second)[1] == 0
