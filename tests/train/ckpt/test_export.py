"""`hpctrain export`: one timm-named state_dict from a single-file or a sharded checkpoint, that
loads strictly into the model."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config import load
from hpctrain.errors import UserError
from hpctrain.models.vit import build_vit
from hpctrain.train import compat
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.ckpt.export import export
from tests.helpers import DIGITS, digits_args, hpctrain, run_ranks

SETS = ["train.max_steps=2", "ckpt.every=1", "train.ema=0.9", "aug.mixup=0"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["single", "sharded"])
def test_export_both_formats(fmt, digits_root, tmp_path):
    if fmt == "sharded" and compat.version_tuple() < compat.SHARDED_MIN_TORCH:
        pytest.skip(f"sharded checkpoints need torch >= 2.4; this is {torch.__version__}")
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file

    run_ranks(1, digits_args(digits_root, tmp_path, "r", *SETS, f"ckpt.format={fmt}"))
    run = tmp_path / "r"
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(run)] == [2, 1]
    assert all(ckpt.is_sharded(p) == (fmt == "sharded") for p in ckpt.list_checkpoints(run))
    model = build_vit(load(DIGITS, [f"data.root={digits_root}"]).model)

    (tmp_path / "m.safetensors").write_bytes(b"an earlier export")
    r = hpctrain("export", str(run), "-o", str(tmp_path / "m.safetensors"))
    assert r.returncode == 2 and "already exists: pass --force" in r.stderr, r.stdout + r.stderr
    r = hpctrain("export", str(run), "-o", str(tmp_path / "m.safetensors"), "--force")
    assert r.returncode == 0 and f"{ckpt.name(2, fmt)} to {tmp_path / 'm.safetensors'}" in r.stdout, r.stderr
    export(run, tmp_path / "e.pt", step=1, ema=True)  # the library the command is a thin layer over
    newest, older = (ckpt.load(p) for p in ckpt.list_checkpoints(run))
    for got, want in [
        (load_file(tmp_path / "m.safetensors"), newest["model"]),
        (torch.load(tmp_path / "e.pt", weights_only=True), older["ema"]),
    ]:
        model.load_state_dict(got, strict=True)  # every key of the model, in its shapes (timm's names)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert not all(torch.equal(newest["model"][k], older["ema"][k]) for k in older["ema"])

    with pytest.raises(UserError, match="has no checkpoint of step 7; it has steps 2, 1"):
        export(run, tmp_path / "x.pt", step=7)
    with pytest.raises(UserError, match="must end in .safetensors or .pt"):
        export(run, tmp_path / "x.bin")


def test_an_output_folder_that_does_not_exist_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"the folder .*nowhere does not exist: create it"):
        export(tmp_path, tmp_path / "nowhere" / "x.pt")


def test_export_o_refuses_an_existing_file_before_reading_a_checkpoint(tmp_path):
    """As `sbatch-template` does: `-o` over an existing file needs --force (the weights there may be
    the only copy); refused before torch loads anything."""
    out = tmp_path / "model.pt"
    out.write_bytes(b"weights exported last week")
    r = hpctrain("export", str(tmp_path), "-o", str(out))
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == f"hpctrain: error: {out} already exists: pass --force to overwrite it, or give another path\n"
    assert out.read_bytes() == b"weights exported last week"
