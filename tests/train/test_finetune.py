"""Start from weights (`model.init_from`) and evaluate them (`hpctrain eval`), on one digits run.

The module trains digits once at 32² (the demo's patch 8 and sin-cos table, a 2-block ViT for
speed) and exports it; every test starts from that run or its export.
"""

from __future__ import annotations

import csv
import json
import logging

import pytest
import torch

from hpctrain.config import ConfigError, load
from hpctrain.models.vit import build_vit
from hpctrain.train import finetune
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.ckpt.export import export
from tests.helpers import DIGITS, digits_args, run_metrics, run_ranks

# The cheapest base that is already good (≥ 95 % at 32², measured in docs/finetune.md).
MODEL = ["model.depth=2", "model.width=128", "model.heads=4"]
BASE = [
    *MODEL,
    "train.epochs=15",
    "optim.lr=2e-3",
    "optim.warmup_epochs=1",
    "data.scale_min=0.8",
    "aug.label_smoothing=0",
]


@pytest.fixture(scope="module")
def base(digits_root, tmp_path_factory):
    """(runs folder, the finished 32² run, its export as .safetensors)."""
    pytest.importorskip("safetensors")
    d = tmp_path_factory.mktemp("finetune")
    run_ranks(1, digits_args(digits_root, d, "base", *BASE))
    _, out = export(d / "base", d / "base.safetensors")
    return d, d / "base", out


def cfg_of(digits_root, *sets: str):
    return load(DIGITS, [f"data.root={digits_root}", *MODEL, *sets])


@pytest.mark.slow
def test_finetune_at_48_from_the_export_resamples_pos_embed(base, digits_root):
    d, run, weights = base
    base_top1 = run_metrics(run, "eval")[-1]["top1"]
    assert base_top1 >= 95.0
    sets = [
        *BASE,
        "model.img_size=48",
        f"model.init_from={weights}",
        "train.epochs=4",
        "optim.lr=5e-4",
        "optim.warmup_epochs=0.5",
    ]
    out = run_ranks(1, digits_args(digits_root, d, "ft48", *sets))[0].stdout
    resampled = "position embedding resampled from a 4×4 to a 6×6 grid (bicubic)"
    assert f"initialised the model from {weights}; {resampled}" in out
    top1 = run_metrics(d / "ft48", "eval")[-1]["top1"]
    assert top1 >= 95.0, out[-3000:]
    # one step more (a finished run is not resumed): the run's checkpoint wins over model.init_from
    again = run_ranks(1, digits_args(digits_root, d, "ft48", *sets, "train.max_steps=89"))[0].stdout
    assert f"model.init_from={weights} ignored: this run resumes from" in again
    assert "initialised the model from" not in again


@pytest.mark.slow
def test_other_class_count_gets_a_new_head_and_says_so(base, digits_root, hpctrain_log):
    _, _, weights = base
    model = build_vit(cfg_of(digits_root, "model.num_classes=7").model)
    with hpctrain_log.at_level(logging.INFO, logger="hpctrain"):
        finetune.load_into(model, weights)
    assert (
        "new head: the checkpoint's has 10 classes, model.num_classes=7; re-initialised (model.head_init=zero)"
        in hpctrain_log.text
    )
    sd = finetune.read_weights(weights)[0]
    got = model.state_dict()
    assert torch.count_nonzero(got["head.weight"]) == 0 and got["head.weight"].shape == (7, 128)
    assert all(torch.equal(got[k], v) for k, v in sd.items() if not k.startswith("head."))
    with pytest.raises(finetune.InitError, match="10-class head but model.num_classes=7: evaluate with"):
        finetune.load_into(build_vit(cfg_of(digits_root, "model.num_classes=7").model), weights, new_head=False)


@pytest.mark.slow
def test_mismatched_model_fails_listing_keys_and_shapes(base, digits_root):
    _, _, weights = base
    with pytest.raises(finetune.InitError) as e:
        finetune.load_into(build_vit(cfg_of(digits_root, "model.depth=3").model), weights)
    msg = str(e.value)
    assert "does not fit this model: missing from the file: blocks.2.norm1.weight 128, blocks.2.norm1.bias 128" in msg
    assert "blocks.2.attn.qkv.weight 384×128" in msg and "… and 4 more" in msg and "model.* keys" in msg
    with pytest.raises(
        finetune.InitError,
        match=r"shapes differ: patch_embed.proj.weight 128×3×8×8 in the file vs "
        r"128×3×4×4 in the model",
    ):
        finetune.load_into(build_vit(cfg_of(digits_root, "model.patch_size=4").model), weights)
    with pytest.raises(ConfigError, match="reads no network at run time"):
        cfg_of(digits_root, "model.init_from=https://example.org/vit.safetensors")
    with pytest.raises(finetune.InitError, match="no such file or directory"):
        finetune.load_into(build_vit(cfg_of(digits_root).model), "timm/vit_base_patch16_224")


@pytest.mark.slow
def test_export_then_init_from_gives_the_same_logits(base, digits_root, tmp_path):
    _, run, weights = base
    cfg = cfg_of(digits_root)
    trained = build_vit(cfg.model)
    trained.load_state_dict(ckpt.load(ckpt.list_checkpoints(run)[0])["model"])
    sd = finetune.read_weights(weights)[0]
    wrapped = tmp_path / "timm_train_checkpoint.pth"  # timm's train.py layout, DDP-prefixed names
    torch.save({"epoch": 9, "state_dict": {f"module.{k}": v for k, v in sd.items()}}, wrapped)
    x = torch.randn(4, 3, 32, 32)
    want = trained.eval()(x)
    for source in (weights, wrapped, run):
        model = build_vit(cfg.model)
        assert finetune.load_into(model, source) == []  # nothing adapted
        assert torch.equal(model.eval()(x), want), source


@pytest.mark.slow
def test_eval_equals_the_runs_last_eval_on_1_and_2_processes(base, digits_root, tmp_path):
    d, run, weights = base
    last = run_metrics(run, "eval")[-1]
    run_ranks(1, ["-m", "hpctrain", "eval", str(run), "-o", str(tmp_path / "w1")])
    args = [
        "-m",
        "hpctrain",
        "eval",
        "--weights",
        str(weights),
        "--config",
        str(DIGITS),
        "--data",
        str(digits_root),
        "-o",
        str(tmp_path / "w2"),
    ] + [a for s in BASE for a in ("--set", s)]
    run_ranks(2, args)
    for name in ("w1", "w2"):
        s = json.loads((tmp_path / name / "summary.json").read_text())
        assert (s["top1"], s["top5"]) == (last["top1"], last["top5"]) and s["count"] == last["count"] == 359
        rows = list(csv.DictReader((tmp_path / name / "per_class.csv").read_text().splitlines()))
        assert [r["class"] for r in rows] == [str(i) for i in range(10)]
        assert sum(int(r["count"]) for r in rows) == 359
        assert sum(int(r["correct"]) for r in rows) == round(last["top1"] * 359 / 100)
        assert len(s["most_confused"]) <= 10 and all(p["true"] != p["predicted"] for p in s["most_confused"])
    one = json.loads((tmp_path / "w1" / "summary.json").read_text())
    two = json.loads((tmp_path / "w2" / "summary.json").read_text())
    assert one["loss"] == last["loss"] and abs(two["loss"] - last["loss"]) < 1e-6
    assert one["world_size"] == 1 and two["world_size"] == 2


@pytest.mark.slow
def test_init_ema_takes_the_ema_weights_of_each_checkpoint_layout(base, digits_root, tmp_path):
    _, _, weights = base
    sd = finetune.read_weights(weights)[0]
    ema = {k: v + 1.0 for k, v in sd.items()}  # told apart from the trained weights
    layouts = {
        "hpctrain.pt": {"step": 3, "model": sd, "ema": ema},  # an hpctrain checkpoint renamed
        "timm.pth": {"state_dict": sd, "state_dict_ema": ema},
    }  # timm train.py's layout
    for name, obj in layouts.items():
        torch.save(obj, tmp_path / name)
        for use_ema, want in ((False, sd), (True, ema)):
            got = finetune.read_weights(tmp_path / name, use_ema)[0]
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), (name, use_ema)
    with pytest.raises(
        finetune.InitError, match="is a plain state_dict .*: it has no EMA weights; set model.init_ema=false"
    ):
        finetune.read_weights(weights, ema=True)
    torch.save({"model": sd, "epoch": 1}, tmp_path / "deit.pth")  # DeiT/MAE: no EMA entry
    with pytest.raises(finetune.InitError, match="has no EMA weights"):
        finetune.read_weights(tmp_path / "deit.pth", ema=True)


def mae_pretrained(width: int = 64, depth: int = 2, seed: int = 0) -> dict:
    """A checkpoint in the layout of MAE's released pre-trained encoders (mae_pretrain_vit_*.pth):
    `{"model": state_dict}` of models_mae.py's encoder, keys written out from it (cls_token, a
    1 + 14×14 = 197 position table, patch_embed, timm Blocks, norm; no head, no fc_norm)."""
    gen = torch.Generator().manual_seed(seed)
    d, h = width, 4 * width
    shapes = {
        "cls_token": (1, 1, d),
        "pos_embed": (1, 197, d),
        "patch_embed.proj.weight": (d, 3, 16, 16),
        "patch_embed.proj.bias": (d,),
    }
    for i in range(depth):
        for k, s in (
            ("norm1.weight", (d,)),
            ("norm1.bias", (d,)),
            ("attn.qkv.weight", (3 * d, d)),
            ("attn.qkv.bias", (3 * d,)),
            ("attn.proj.weight", (d, d)),
            ("attn.proj.bias", (d,)),
            ("norm2.weight", (d,)),
            ("norm2.bias", (d,)),
            ("mlp.fc1.weight", (h, d)),
            ("mlp.fc1.bias", (h,)),
            ("mlp.fc2.weight", (d, h)),
            ("mlp.fc2.bias", (d,)),
        ):
            shapes[f"blocks.{i}.{k}"] = s
    shapes |= {"norm.weight": (d,), "norm.bias": (d,)}
    return {"model": {k: torch.randn(s, generator=gen) for k, s in shapes.items()}}


def mae_model(*sets: str) -> torch.nn.Module:
    return build_vit(
        load(
            None,
            [
                "model.depth=2",
                "model.width=64",
                "model.heads=2",
                "model.num_classes=10",
                "model.pool=avg",
                "model.class_token=true",
                "model.final_norm=pooled",
                *sets,
            ],
        ).model
    )


def test_mae_pretrained_layout_loads_naming_what_starts_fresh(tmp_path, hpctrain_log):
    """MAE's pre-trained encoder into MAE's fine-tuning model (main_finetune.py:248-254: non-strict load,
    missing exactly head and fc_norm): every encoder weight loaded, head and fc_norm as initialised, the
    token norm unused, all named in one log line. Any other missing key is still refused with its shape."""
    path = tmp_path / "mae_pretrain_vit_tiny.pth"
    ckpt_obj = mae_pretrained()
    torch.save(ckpt_obj, path)
    model = mae_model()
    with hpctrain_log.at_level(logging.INFO, logger="hpctrain"):
        finetune.load_into(model, path)
    lines = [r.getMessage() for r in hpctrain_log.records if "initialised the model from" in r.getMessage()]
    assert lines == [
        f"initialised the model from {path}; not in the file, left as initialised: head.weight, "
        "head.bias, fc_norm.weight, fc_norm.bias; unused (the model normalises after the pool): "
        "norm.weight, norm.bias"
    ]
    got = model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in ckpt_obj["model"].items() if not k.startswith("norm."))
    assert torch.count_nonzero(got["head.weight"]) == 0  # model.head_init=zero (MAE: trunc_normal 2e-5)
    assert torch.equal(got["fc_norm.weight"], torch.ones(64)) and torch.equal(got["fc_norm.bias"], torch.zeros(64))
    # MAE's --cls_token fine-tuning (global_pool off): only the head is missing, the token norm is used
    token = build_vit(load(None, ["model.depth=2", "model.width=64", "model.heads=2", "model.num_classes=10"]).model)
    assert finetune.load_into(token, path) == ["not in the file, left as initialised: head.weight, head.bias"]
    assert torch.equal(token.state_dict()["norm.weight"], ckpt_obj["model"]["norm.weight"])
    # evaluation never starts a head from nothing
    with pytest.raises(
        finetune.InitError,
        match="missing from the file: fc_norm.weight 64, fc_norm.bias 64, "
        "head.weight 10×64, head.bias 10; not in the model: norm.weight 64",
    ):
        finetune.load_into(mae_model(), path, new_head=False)
    # any other missing key is refused, named with its shape
    del ckpt_obj["model"]["blocks.1.norm1.weight"]
    torch.save(ckpt_obj, path)
    with pytest.raises(
        finetune.InitError,
        match=r"does not fit this model: missing from the file: "
        r"blocks.1.norm1.weight 64\. Set the model",
    ):
        finetune.load_into(mae_model(), path)


@pytest.mark.slow
def test_a_start_refused_for_a_missing_init_from_leaves_no_run_directory(digits_root, tmp_path):
    """Before, the refused start left runs/<name>/ with its config, env, lock and log, which `status`
    could not read and a corrected rerun found; a run directory that was there is kept."""
    missing = digits_args(digits_root, tmp_path, "mist2", f"model.init_from={tmp_path / 'nosuch.safetensors'}")
    (r,) = run_ranks(1, missing, check=False)
    assert r.returncode == 2 and "nosuch.safetensors" in r.stdout.strip().splitlines()[-1], r.stdout[-2000:]
    assert not (tmp_path / "mist2").exists() and list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    (r,) = run_ranks(1, [*missing[:-2], "--set", "run.name=kept", *missing[-2:]], check=False)
    assert r.returncode == 2 and (kept / "notes.txt").read_text() == "mine"
