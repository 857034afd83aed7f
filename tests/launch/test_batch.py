"""`submit` shows the per-GPU batch and the resolved lr, warns below 32 images per GPU, and refuses a
per-GPU batch that cannot fit, before anything is written or submitted (no Slurm, no torch)."""

from __future__ import annotations

import pytest

from hpctrain import memory
from hpctrain.config import load
from hpctrain.errors import LaunchError
from hpctrain.launch.batch import MIN_PER_GPU, batch_report
from hpctrain.lr_rule import lr_rule
from tests.launch.test_sbatch import blocked_cli

IB16 = ("--cluster", "example-ib", "--nodes", "16", "--gpus-per-node", "8")


def test_large_batch_recipe_on_16_nodes_has_32_per_gpu_and_its_lr():
    r = blocked_cli("submit", "--config", "configs/vit_b16_imagenet_4k.yaml", *IB16, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "batch: 4096 global = 32 per GPU × 128 GPUs (16 node(s) × 8)" in r.stderr
    assert "lr: 0.003 (optim.lr 0.003 × 4096/4096, linear scaling); adamw" in r.stderr
    assert "memory per GPU (estimate):" in r.stderr and "warning" not in r.stderr
    assert r.stdout.startswith("#!/bin/bash") and "batch:" not in r.stdout  # the script stays clean


def test_small_per_gpu_batch_warns_once_with_the_choices():
    r = blocked_cli("submit", "--config", "configs/vit_b16_imagenet.yaml", *IB16, "--dry-run")
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("hpctrain: warning:")]
    assert len(warnings) == 1, r.stderr
    w = warnings[0]
    assert "8 images per GPU (1024 global / 128 GPUs) is below 32" in w
    assert "--nodes 4: 32 per GPU" in w and "--config configs/vit_b16_imagenet_4k.yaml" in w
    assert "--set data.global_batch=4096" in w
    assert "lr: 0.001 (optim.lr 0.0005 × 1024/512, linear scaling)" in r.stderr
    assert "#SBATCH --nodes=16" in r.stdout  # a warning, not a refusal


@pytest.mark.slow
def test_batch_that_cannot_fit_is_refused_with_the_fix(tmp_path):
    out = tmp_path / "job.sbatch"
    for mode in (("--dry-run",), ("--emit-sbatch", str(out))):
        r = blocked_cli(
            "submit",
            "--config",
            "configs/vit_b16_imagenet_16k_lamb.yaml",
            "--cluster",
            "example-ib",
            "--nodes",
            "1",
            "--gpus-per-node",
            "8",
            *mode,
        )
        assert r.returncode == 2 and r.stdout == "", r.stdout
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("hpctrain: error: 2048 images per GPU need about"), r.stderr
        assert "train.accum_steps=" in err[0] and "model.grad_ckpt=true" in err[0] and "--gpu-mem-gb" in err[0]
    assert not out.exists()
    # the same job fits on GPUs with more memory, or with activation checkpointing
    for fix in (("--gpu-mem-gb", "240"), ("--set", "model.grad_ckpt=true")):  # dropout masks: ~204 GB
        r = blocked_cli(
            "submit",
            "--config",
            "configs/vit_b16_imagenet_16k_lamb.yaml",
            "--cluster",
            "example-ib",
            "--nodes",
            "1",
            "--gpus-per-node",
            "8",
            "--dry-run",
            *fix,
        )
        assert r.returncode == 0, r.stderr
        assert "2048 per GPU × 8 GPUs" in r.stderr


def test_suggested_accumulation_fits():
    cfg = load("configs/vit_b16_imagenet_16k_lamb.yaml")
    rep = batch_report(cfg, 1, 8)
    with pytest.raises(LaunchError, match=r"--set train.accum_steps=(\d+)") as e:
        rep.check(cfg)
    accum = int(e.value.args[0].split("train.accum_steps=")[1].split()[0])
    fixed = load("configs/vit_b16_imagenet_16k_lamb.yaml", [f"train.accum_steps={accum}"])
    batch_report(fixed, 1, 8).check(fixed)  # no error


def test_cpu_tasks_skip_the_gpu_checks():
    """The local profile asks Slurm for no GPUs: the batch is shown, nothing is estimated or warned."""
    r = blocked_cli(
        "submit",
        "--config",
        "configs/vit_b16_imagenet_4k.yaml",
        "--cluster",
        "local",
        "--dry-run",
        "--set",
        "data.global_batch=64",
    )
    assert r.returncode == 0, r.stderr
    assert "batch: 64 global = 32 per GPU × 2 GPUs" in r.stderr
    assert "memory per GPU" not in r.stderr and "warning" not in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (("--gpu-mem-gb", "0"), "--gpu-mem-gb=0: give the memory of one GPU in GB"),
        (("--set", "optim.name=lamb", "--set", "dist.parallel=fsdp"), "optim.name=lamb takes each tensor's norm"),
    ],
)
def test_bad_requests_are_one_line(args, message):
    r = blocked_cli("submit", "--config", "configs/vit_b16_imagenet_4k.yaml", *IB16, "--dry-run", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and message in r.stderr, r.stderr


def test_emit_shows_the_batch_and_keeps_the_gpu_memory_in_its_command(tmp_path):
    out = tmp_path / "vit.sbatch"
    r = blocked_cli(
        "submit",
        "--config",
        "configs/vit_b16_imagenet_16k_lamb.yaml",
        *IB16,
        "--gpu-mem-gb",
        "141",
        "--emit-sbatch",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "batch: 16384 global = 128 per GPU × 128 GPUs" in r.stdout
    assert "lr: 0.01273 (optim.lr 0.018 × sqrt(16384/32768), sqrt scaling); lamb" in r.stdout
    assert "--gpu-mem-gb 141 --emit-sbatch" in out.read_text()


def test_lr_rule_names_the_rule():
    digits = lr_rule(load("configs/digits_vit.yaml"))
    assert digits == "0.002 (optim.lr, no batch scaling (optim.lr_ref_batch 0)); adamw"
    none = load("configs/vit_b16_imagenet.yaml", ["optim.lr_scaling=none"])
    assert lr_rule(none).startswith("0.0005 (optim.lr as written")
    assert MIN_PER_GPU == 32


def test_model_too_large_for_one_gpu_suggests_fsdp():
    cfg = load("configs/vit_b16_imagenet_4k.yaml", ["model.arch=vit_huge", "model.depth=400"])
    rep = batch_report(cfg, 16, 8)
    assert rep.memory.max_batch(rep.gpu_mem_bytes) == 0
    with pytest.raises(
        LaunchError,
        match=r"\(0 images fit\): use --set model.grad_ckpt=true, or --set "
        r"dist.parallel=fsdp",
    ) as e:
        rep.check(cfg)
    assert "accum_steps" not in str(e.value)
    sharded = load(
        "configs/vit_b16_imagenet_4k.yaml",
        ["model.arch=vit_huge", "model.depth=400", "dist.parallel=fsdp", "model.grad_ckpt=true"],
    )
    batch_report(sharded, 16, 8).check(sharded)  # sharded over 128 GPUs it fits


def test_a_range_notes_the_accumulation_its_tasks_take_at_its_fewest_nodes():
    """`--nodes 1-16` of the 4k recipe on 40 GB GPUs: 32 per GPU fit on 16 nodes; on 1 node 512 would
    not, and the note names the accumulation the tasks take there (memory.fit_accum: a divisor of the
    global batch that fits); nothing that fits at any accumulation says how to get out."""
    cfg = load("configs/vit_b16_imagenet_4k.yaml")
    assert batch_report(cfg, 16, 8, 40).range_note(cfg) is None
    note = batch_report(cfg, 1, 8, 40).range_note(cfg)
    acc = memory.fit_accum(cfg, 8, int(40e9))
    assert acc > 1, acc
    assert f"the tasks take train.accum_steps={acc} there ({4096 // (8 * acc)} per micro-step)" in note, note
    assert "512 images per GPU would not fit" in note
    none = batch_report(cfg, 1, 8, 2.5).range_note(cfg)
    assert "at any accumulation: raise the range's MIN" in none, none
