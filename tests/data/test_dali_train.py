"""Training through the DALI loaders: digits accuracy (packed shards) and exact resume."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config import load
from hpctrain.data.prep.pack import pack
from hpctrain.train.entry import run
from tests.helpers import halt_at

pytest.importorskip("nvidia.dali")


def digits_cfg(root, tmp_path, name: str, *sets: str):
    base = [
        f"data.root={root}",
        "data.prepare=none",
        "data.loader=dali",
        "data.workers=1",
        f"run.dir={tmp_path}",
        f"run.name={name}",
        "run.resume=auto",
    ]
    return load("digits_vit", base + list(sets))


def weights(summary) -> dict:
    return torch.load(summary["checkpoint"], map_location="cpu", weights_only=True)["model"]


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["dali", "torch"])
def test_resume_is_exact(digits_root, tmp_path, loader):
    """14 steps straight vs 7 steps, halt, resume (mid-epoch: 11 steps per epoch) → equal weights."""
    sets = [
        f"data.loader={loader}",
        "data.global_batch=128",
        "train.max_steps=14",
        "train.eval_every_epochs=0",
        "ckpt.every=0",
    ]
    full = run(digits_cfg(digits_root, tmp_path, "full", *sets))
    with halt_at(7):
        half = run(digits_cfg(digits_root, tmp_path, "split", *sets))
    assert half["status"] == "halted" and half["step"] == 7
    rest = run(digits_cfg(digits_root, tmp_path, "split", *sets))
    assert rest["resumed_from"] == 7 and rest["step"] == full["step"] == 14
    a, b = weights(full), weights(rest)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# One accuracy run, on the path ImageNet takes (packed shards): the folder reader gives the torch
# loader's labels and the PIL loader's validation images (tests/data/test_dali.py), so a second run
# to 95 % from the folder would prove nothing more for 100 s of CI.
@pytest.mark.slow
def test_digits_trains_to_95_with_dali_from_packed_shards(digits_root, tmp_path):
    sets = ["train.epochs=15", "train.eval_every_epochs=0", "ckpt.every=0"]
    shards = tmp_path / "shards"
    pack(digits_root, shards, shard_size=250, log=lambda *_: None)
    wds = run(digits_cfg(shards, tmp_path, "wds", *sets, "data.format=wds"))
    assert wds["val_count"] == 359
    assert wds["top1"] >= 95.0, wds["top1"]
