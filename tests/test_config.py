"""Config loading: overrides, validation with clear messages, resolved copy round-trips."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from hpctrain import config
from hpctrain.config import ConfigError, check_batch, load
from tests.helpers import DIGITS, ROOT


def test_shipped_configs_load_with_their_recipes():
    b16 = load("configs/vit_b16_imagenet.yaml")
    assert (b16.model.arch, b16.data.global_batch, b16.train.epochs) == ("vit_base", 1024, 300)
    assert b16.peak_lr == pytest.approx(5e-4 * 1024 / 512)
    assert (b16.optim.weight_decay, b16.optim.warmup_epochs, b16.aug.label_smoothing) == (0.05, 5, 0.1)
    assert (b16.aug.mixup, b16.aug.cutmix, b16.model.drop_path) == (0.8, 1.0, 0.1)
    s16 = load("configs/vit_s16_imagenet_90ep.yaml")
    assert (s16.model.arch, s16.model.pool, s16.model.pos_embed) == ("vit_small", "avg", "sincos_big_vision")
    assert (s16.train.epochs, s16.optim.warmup_steps, s16.optim.clip_grad) == (90, 10000, 1.0)
    assert (s16.aug.randaugment, s16.aug.mixup, s16.peak_lr) == ("rand-n2-m10-p1", 0.2, 1e-3)
    assert load(DIGITS).model.num_classes == 10


def test_overrides_apply_and_parse_types():
    cfg = load(DIGITS, ["optim.lr=3e-4", "train.amp=bf16", "data.mean=[0.1,0.2,0.3]", "compile.enabled=true"])
    assert cfg.optim.lr == 3e-4 and cfg.train.amp == "bf16" and cfg.compile.enabled is True
    assert cfg.data.mean == (0.1, 0.2, 0.3)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lrr=1"], "unknown config key optim.'lrr': did you mean optim.'lr'"),
        (["optimm.lr=1"], "did you mean the section 'optim'"),
        (["train.epochs=ten"], "train.epochs: expected an integer, got 'ten'"),
        (["optim.lr=-0.1"], "optim.lr=-0.1 is out of range: must be > 0"),
        (["train.amp=bf61"], "train.amp='bf61' is not one of none, bf16, fp16 (did you mean 'bf16'?)"),
        (["compile.enabled=3"], "compile.enabled: expected true or false"),
        (["lr"], "expected section.key=value"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load(DIGITS, overrides)
    assert message in str(e.value)


def test_every_unknown_key_of_a_file_is_named_in_one_error_each_with_its_hint(tmp_path):
    """Issue 56: a file with two unknown keys named only the first (fix, rerun, meet the next)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("optimizer:\n  lr: 0.1\ntrain:\n  epochz: 3\n  lrr: 0.1\ndata:\n  rooot: data/digits\n")
    with pytest.raises(ConfigError) as e:
        load(str(bad))
    assert str(e.value) == (  # in the file's order
        "4 unknown config keys: 'optimizer' (did you mean the section 'optim' (`optim:` in a file, --set optim.… "
        "on the command line)?); train.'epochz' (did you mean train.'epochs'?); train.'lrr'; data.'rooot' (did "
        "you mean data.'root'?): fix or drop each (`hpctrain config --keys` lists every valid key)"
    )


def test_batch_splits_over_any_world_that_gets_a_sample_each():
    with pytest.raises(ConfigError, match="data.global_batch=64 is not divisible by train.accum_steps=3"):
        load(DIGITS, ["data.global_batch=64", "train.accum_steps=3"])  # known at load: no world size needed
    cfg = load(DIGITS, ["data.global_batch=66", "train.accum_steps=3"])  # g = 22
    assert cfg.micro_batch == 22 and cfg.per_rank_batch(2) == 11
    assert [cfg.rank_batch(3, r) for r in range(3)] == [8, 7, 7] and cfg.per_rank_batch(3) == 8  # uneven: fine
    assert load(DIGITS, ["data.global_batch=63", "train.accum_steps=3"]).per_rank_batch(2) == 11
    assert load(DIGITS, ["train.accum_steps=2"]).per_rank_batch(2) == 16


@pytest.mark.parametrize(
    "sets, world, fine, message",
    [
        (
            ["data.global_batch=64", "train.accum_steps=4"],
            32,
            16,
            "data.global_batch=64 / train.accum_steps=4 gives 16 samples per micro-step, fewer than the 32 ranks "
            "(each needs one): set train.accum_steps=2, use at most 16 ranks, or raise data.global_batch",
        ),
        (
            ["data.global_batch=8"],
            12,
            8,
            "data.global_batch=8 / train.accum_steps=1 gives 8 samples per micro-step, fewer than the 12 ranks "
            "(each needs one): use at most 8 ranks, or raise data.global_batch",
        ),
    ],
)
def test_batch_refuses_a_rank_without_a_sample_and_names_the_fix(sets, world, fine, message):
    cfg = load(DIGITS, sets)
    with pytest.raises(ConfigError) as e:
        check_batch(cfg, world)
    assert str(e.value) == message
    check_batch(cfg, fine)  # as many ranks as samples per micro-step: one each


def test_batch_refuses_global_batch_not_divisible_by_accum_whatever_the_world():
    cfg = dataclasses.replace(load(DIGITS), train=dataclasses.replace(load(DIGITS).train, accum_steps=3))
    with pytest.raises(ConfigError) as e:
        check_batch(cfg, 2)
    assert str(e.value) == (
        "data.global_batch=64 is not divisible by train.accum_steps=3: use data.global_batch=63 or another "
        "train.accum_steps"
    )


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ["model.img_size=30"],
            "model.img_size=30 is not a multiple of model.patch_size=8 (the image is cut into "
            "patch_size × patch_size patches): use model.img_size=24 or 32",
        ),
        (
            ["model.heads=5"],
            "model width 128 is not divisible by model.heads=5 (each head takes width/heads channels): "
            "set model.heads=4",
        ),
        (["model.width=null", "model.heads=5"], "model width 192 is not divisible by model.heads=5"),  # vit_tiny's
        (["model.width=130", "model.heads=2"], "model.pos_embed=sincos needs a width divisible by 4"),
        (["model.width=4", "model.heads=1", "model.pos_embed=sincos_big_vision"], "and at least 8"),
        (["model.mlp_ratio=0.001"], "gives an MLP of 0 units"),
        (["data.mean=[0.5]"], "data.mean has 1 values; images have 3 channels"),
        (["data.std=[0.5,0,0.5]"], "every value must be > 0"),
        (["optim.betas=[0.9]"], "optim.betas=[0.9]: expected two values in [0, 1)"),
    ],
)
def test_shape_rules_fail_when_the_config_loads(sets, message):
    """What models/vit.py and the loaders would refuse in the job's first step is refused here."""
    with pytest.raises(ConfigError) as e:
        load(DIGITS, sets)
    assert message in str(e.value)


@pytest.mark.slow
def test_img_size_not_a_multiple_of_the_patch_fails_in_plan_and_dry_run(tmp_path, digits_root):
    base = ["--config", str(DIGITS), "--set", "model.img_size=30", "--set", f"run.dir={tmp_path}/runs"]
    for argv in (["plan", *base, "--nodes", "1"], ["submit", *base, "--dry-run"]):
        r = subprocess.run(
            [sys.executable, "-m", "hpctrain", *argv], capture_output=True, text=True, cwd=tmp_path, timeout=120
        )
        assert r.returncode == 2 and r.stdout == "", (argv, r.stdout, r.stderr)
        assert r.stderr.startswith("hpctrain: error: model.img_size=30 is not a multiple of model.patch_size=8")
        assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_resolved_config_round_trips(tmp_path):
    cfg = load(DIGITS, ["optim.lr=1e-3"])
    config.save(cfg, tmp_path / "config.yaml")
    assert load(tmp_path / "config.yaml") == cfg


def test_every_field_has_a_doc():
    rows = config.describe()
    assert len(rows) > 50
    assert all(doc for _, _, doc in rows), [k for k, _, d in rows if not d]


@pytest.mark.parametrize(
    "sets, message",
    [
        (["optim.lrr=1"], "did you mean optim.'lr'"),
        (["optim.lr=-1"], "must be > 0"),
        (["data.global_batch=1"], "fewer than the 2 ranks"),
        (["model.img_size=30"], "not a multiple of model.patch_size=8"),
        (["data.root=/nonexistent/digts"], "data.root=/nonexistent/digts does not exist"),
        (
            ["data.prepare=none", "model.init_from=/nonexistent/w.pt"],
            "model.init_from=/nonexistent/w.pt does not exist",
        ),
    ],
)
def test_cli_bad_config_is_one_line_and_runs_nothing(tmp_path, digits_root, sets, message):
    args = [
        sys.executable,
        "-m",
        "hpctrain",
        "submit",
        "--config",
        str(DIGITS),
        "--set",
        f"data.root={digits_root}",
        "--set",
        f"run.dir={tmp_path}/runs",
    ]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_large_batch_recipes_resolve_their_lr():
    """The 4k recipe is the ViT paper's Adam at its own batch; the LAMB recipe moves its lr by the
    square-root rule; both refuse nothing and keep their sources' values."""
    k4 = load("configs/vit_b16_imagenet_4k.yaml")
    assert (k4.data.global_batch, k4.optim.name, k4.peak_lr) == (4096, "adamw", pytest.approx(3e-3))
    assert (k4.optim.weight_decay, k4.optim.warmup_steps, k4.optim.clip_grad, k4.train.epochs) == (0.3, 10000, 1.0, 300)
    lamb = load("configs/vit_b16_imagenet_16k_lamb.yaml")
    assert (lamb.data.global_batch, lamb.optim.name, lamb.optim.lr_scaling) == (16384, "lamb", "sqrt")
    assert lamb.peak_lr == pytest.approx(1.8e-2 * (16384 / 32768) ** 0.5)
    assert load("configs/vit_b16_imagenet_16k_lamb.yaml", ["data.global_batch=8192"]).peak_lr == pytest.approx(9e-3)


@pytest.mark.parametrize("scaling, expected", [("linear", 5e-4 * 4096 / 512), ("sqrt", 5e-4 * 8**0.5), ("none", 5e-4)])
def test_lr_follows_the_global_batch_by_the_rule(scaling, expected):
    cfg = load("configs/vit_b16_imagenet.yaml", ["data.global_batch=4096", f"optim.lr_scaling={scaling}"])
    assert cfg.peak_lr == pytest.approx(expected)


def test_default_scaling_keeps_existing_configs_as_they_were():
    """linear is the default: lr × batch / lr_ref_batch with a reference batch, lr as written without."""
    assert config.OptimConfig().lr_scaling == "linear" and config.OptimConfig().name == "adamw"
    b16 = load("configs/vit_b16_imagenet.yaml", ["data.global_batch=2048"])
    assert b16.peak_lr == pytest.approx(5e-4 * 2048 / 512)
    assert load(DIGITS, ["data.global_batch=128"]).peak_lr == load(DIGITS).optim.lr  # no reference batch


@pytest.mark.parametrize(
    "sets, message",
    [
        (["optim.lr_scaling=sqrt", "optim.lr_ref_batch=0"], "optim.lr_scaling=sqrt needs optim.lr_ref_batch"),
        (["optim.lr_scaling=square"], "optim.lr_scaling='square' is not one of linear, sqrt, none"),
        (["optim.name=lamb", "optim.fused=always"], "optim.fused=always is for AdamW"),
        (["optim.name=lars"], "optim.name='lars' is not one of adamw, lamb"),
    ],
)
def test_bad_scaling_and_optimizer_are_refused(sets, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load(DIGITS, sets)


@pytest.mark.parametrize(
    "key, ours",
    [
        ("learning_rate", "optim.lr"),
        ("lr", "optim.lr"),
        ("weight_decay", "optim.weight_decay"),
        ("epochs", "train.epochs"),
        ("batch_size", "data.global_batch"),
        ("warmup_epochs", "optim.warmup_epochs"),
        ("optim.learning_rate", "optim.lr"),
        ("train.lr", "optim.lr"),
        ("optim.epochs", "train.epochs"),
        ("data.img_size", "model.img_size"),
        ("train.num_workers", "data.workers"),
    ],
)
def test_keys_named_as_other_tools_name_them_point_at_ours(key, ours):
    with pytest.raises(ConfigError) as e:
        load(None, [f"{key}=1"])
    section, name = ours.split(".")
    assert f"did you mean {ours!r} (`{section}: {{{name}: …}}` in a file, --set {ours}=… on the command line)?" in str(
        e.value
    )


def test_every_synonym_names_a_real_key():
    keys = {k for k, _, _ in config.describe()}
    assert not {v for v in config.SYNONYMS.values() if v not in keys}


@pytest.mark.parametrize(
    "text, where, problem",
    [
        ("optim:\n  lr: 1\n name: adamw\n", ":3:2: not valid YAML: expected <block end>, but found", "block mapping"),
        (
            "optim:\n  lr: [1,\n  name: x\n",
            ":4:1: not valid YAML: expected ',' or ']'",
            "while parsing a flow sequence that starts at line 2, column 7",
        ),
        (
            "model:\n\tarch: vit_tiny\n",
            ":2:1: not valid YAML: found character '\\t' that cannot start any token",
            "while scanning for the next token",
        ),
    ],
)
def test_invalid_yaml_names_line_and_column(tmp_path, text, where, problem):
    from hpctrain.site.profile import load_profile

    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    for loader in (lambda: load(bad), lambda: load_profile(bad)):  # run configs and cluster profiles alike
        with pytest.raises(ConfigError) as e:
            loader()
        msg = str(e.value)
        assert msg.startswith(f"{bad}{where}") and problem in msg and "\n" not in msg, msg


def test_unknown_config_name_lists_the_shipped_ones(tmp_path):
    with pytest.raises(ConfigError) as e:
        load("vit_b16_imagenet_4kk")
    assert str(e.value).startswith(
        "config 'vit_b16_imagenet_4kk' not found: give a YAML file or a shipped config: bench_vit_b16, digits_vit, "
    )
    assert "vit_b16_imagenet_4k, " in str(e.value) and "`hpctrain config show NAME`" in str(e.value)
    assert load("vit_b16_imagenet_4k") == load("configs/vit_b16_imagenet_4k.yaml")  # a name from any directory


def test_validation_imports_no_numpy():
    """Config validation runs on login nodes (base dependencies: no numpy): aug.randaugment is parsed
    by hpctrain.randaug_spec, not by the DALI module."""
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "from hpctrain.config import ConfigError, load\n"
        "assert load(None, ['aug.randaugment=rand-m9-mstd0.5-inc1']).aug.randaugment\n"
        "try:\n    load(None, ['aug.randaugment=rand-m11'])\nexcept ConfigError as e:\n    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "M=11 is outside 0..10" in r.stdout


def test_a_misnamed_section_is_told_to_be_renamed_and_a_directory_is_not_a_missing_file(tmp_path):
    """`optimizer:` holding keys is the `optim` section misnamed (not timm's `--opt`, optim.name, as
    `optimizer: adamw` would be);
    `--config /tmp` names a directory."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(DIGITS.read_text().replace("optim:", "optimizer:", 1))
    with pytest.raises(
        ConfigError, match=r"unknown config key 'optimizer': did you mean the section 'optim' \(`optim:` in a file"
    ):
        load(str(bad))
    with pytest.raises(ConfigError, match=r"is a directory: give a YAML config file"):
        load(str(tmp_path))


def test_shards_with_the_torch_loader_are_refused_when_the_config_loads():
    """The torch loader reads folders only: refused here, before `submit` starts a job whose every
    rank would refuse it."""
    with pytest.raises(ConfigError, match=r"^data.format=wds needs data.loader=dali \(the torch loader reads folders"):
        load(DIGITS, ["data.format=wds", "data.loader=torch"])
    assert load(DIGITS, ["data.format=wds", "data.loader=auto"]).data.format == "wds"  # DALI decides in the task


def test_config_keys_prints_one_line_per_key_and_the_longer_explanations_live_in_docs_configs():
    """`hpctrain config --keys` fits one line per key (at most 160 characters, issue 37); a key whose
    line points at docs/configs.md has its own heading there under "Keys in full", and every heading
    there is such a key's."""
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain", "config", "--keys"], capture_output=True, text=True, check=True
    )
    lines = r.stdout.splitlines()
    assert len(lines) == len(config.describe()) and lines[0].startswith("model.arch ")
    assert [line for line in lines if len(line) > 160] == []
    more = {key for key, _, doc in config.describe() if doc.endswith(config.MORE)}
    page = (ROOT / "docs" / "configs.md").read_text().split("\n## Keys in full\n", 1)[1]
    headings = set(re.findall(r"^### (\S+)$", page, re.M))
    assert more and headings == more, (sorted(more - headings), sorted(headings - more))
