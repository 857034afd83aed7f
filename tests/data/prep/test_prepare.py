"""`data.prepare: digits` fills the demo's own folder only: a mistyped data.root or a shard folder
gets nothing written into it, and the error names the path and the fix in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from hpctrain.config import ConfigError, load, save, to_dict
from hpctrain.data.prep.pack import plan_pack, write_meta
from hpctrain.data.prep.prepare import DEMO_ROOT, class_problem, ensure_dataset, input_problems
from tests.helpers import DIGITS, hpctrain


def no_slurm(tmp_path: Path) -> dict:
    """A machine without Slurm, so `submit` takes the local executor: no profile named, an empty
    slurm.conf (`scontrol ping` fails at once; with a missing one each Slurm command waits out its timeout)."""
    conf = tmp_path / "empty-slurm.conf"
    conf.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {**env, "SLURM_CONF": str(conf), "HPCTRAIN_CLUSTER": ""}


def test_typo_in_data_root_writes_nothing_and_errors_in_one_line(tmp_path):
    typo = tmp_path / "x" / "digts_bda"
    r = hpctrain(
        "train",
        "--config",
        str(DIGITS),
        "--set",
        f"data.root={typo}",
        "--set",
        "run.dir=runs",
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(
        f"hpctrain: error: data.root={typo} does not exist; data.prepare=digits writes "
        f"only the demo's own folder {DEMO_ROOT}"
    )
    assert f"`hpctrain data digits {typo}`" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # no dataset, no run directory


def test_a_shard_folder_never_gets_images_written_into_it(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "train-00000.tar").write_bytes(b"")  # a pack that never finished: no meta.json
    cfg = load(DIGITS, [f"data.root={shards}", "data.format=wds", "data.loader=dali"])
    with pytest.raises(
        ConfigError,
        match=r"holds no shards \(no meta.json\); data.prepare=digits writes an image "
        "folder, never shards",
    ):
        ensure_dataset(cfg)
    (shards / "meta.json").write_text("{}")
    ensure_dataset(cfg)  # a finished pack: nothing to make
    assert sorted(p.name for p in shards.iterdir()) == ["meta.json", "train-00000.tar"]


def test_the_demo_folder_is_written_once_under_the_working_directory(tmp_path, monkeypatch, capsys):
    assert load(DIGITS).data.root == DEMO_ROOT  # the shipped demo config names the folder prepare fills
    monkeypatch.chdir(tmp_path)
    ensure_dataset(load(DIGITS))
    assert "wrote the digits dataset to data/digits: 1438 train, 359 val images" in capsys.readouterr().out
    assert (tmp_path / DEMO_ROOT / "train" / "9").is_dir() and (tmp_path / DEMO_ROOT / "val").is_dir()
    ensure_dataset(load(DIGITS, [f"data.root={tmp_path / DEMO_ROOT}"]))  # the same folder, absolute: there
    assert capsys.readouterr().out == ""


def test_init_from_a_run_whose_weights_cannot_fit_is_known_before_the_job(tmp_path, digits_root):
    """An hpctrain run's config.yaml tells its weights' shapes: another patch size or width is refused
    by `input_problems` (what a local submit refuses and a Slurm submit notes); img_size and
    num_classes are adapted in the job, so they pass."""
    src = tmp_path / "pretrained"
    (src / "checkpoints").mkdir(parents=True)
    (src / "checkpoints" / "step-00000010.pt").write_bytes(b"")  # only its run's config.yaml is read
    save(load(DIGITS, ["model.patch_size=4", "model.width=64"]), src / "config.yaml")
    sets = [f"data.root={digits_root}", "data.prepare=none"]
    [problem] = input_problems(load(DIGITS, [*sets, f"model.init_from={src}/checkpoints/step-00000010.pt"]))
    assert problem.startswith(
        f"model.init_from={src}/checkpoints/step-00000010.pt: its weights do not fit this "
        "model (model.patch_size=4 there, 8 here; model width 64 there, 128 here; "
    )
    fits = load(
        DIGITS,
        [
            *sets,
            f"model.init_from={src}",
            "model.patch_size=4",
            "model.width=64",
            "model.img_size=48",
            "model.num_classes=5",
        ],
    )
    assert input_problems(fits) == []


def test_a_class_count_the_data_lacks_is_refused_before_any_job_starts(tmp_path, digits_root):
    """The digits have 10 classes: `submit` refuses a 5-class head in the loaders' one line before a
    run directory or a process exists (it used to start both local ranks, which then refused)."""
    runs = tmp_path / "runs"
    r = hpctrain(
        "submit",
        "--config",
        str(DIGITS),
        "--set",
        f"data.root={digits_root}",
        "--set",
        "model.num_classes=5",
        "--set",
        f"run.dir={runs}",
        "--set",
        "run.name=x",
        cwd=tmp_path,
        env=no_slurm(tmp_path),
        timeout=300,
    )
    assert r.returncode == 2, r.stdout + r.stderr[-3000:]
    assert r.stderr == (
        f"hpctrain: error: {digits_root / 'train'} has 10 classes but model.num_classes=5; "
        "set --set model.num_classes=10\n"
    )
    assert "submitted local job" not in r.stdout  # no process launched (submitit's folder is in the run dir)
    assert not runs.exists() and [p.name for p in tmp_path.iterdir()] == ["empty-slurm.conf"]


def test_shards_are_counted_from_their_index_and_unseen_data_is_not_counted(tmp_path, digits_root):
    """wds: the classes of the shard index `data pack` writes; a data.root this machine does not see
    (a cluster's) has no count here: a dry run plans it, and only input_problems notes it."""
    shards = tmp_path / "shards"
    shards.mkdir()
    write_meta(plan_pack(digits_root, shards, shard_size=500, log=lambda _: None))  # the index alone, no tar
    wds = ["data.format=wds", "data.loader=dali", f"data.root={shards}"]
    assert class_problem(load(DIGITS, wds)) is None
    assert class_problem(load(DIGITS, [*wds, "model.num_classes=12"])) == (
        f"{shards} has 10 classes but model.num_classes=12; set --set model.num_classes=10"
    )
    unseen = load(DIGITS, [f"data.root={tmp_path / 'cluster' / 'digits'}", "model.num_classes=5"])
    assert class_problem(unseen) is None and len(input_problems(unseen)) == 1
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    assert class_problem(load(DIGITS, [f"data.root={empty}"])) == (
        f"{empty / 'train'} has no class folders: expected train/<class>/<images>"
    )


def test_a_dry_run_notes_the_class_count_and_still_prints_the_script(tmp_path, digits_root):
    """A dry run may plan for another machine's data: what a submission refuses is a note there."""
    r = hpctrain(
        "submit",
        "--config",
        str(DIGITS),
        "--set",
        f"data.root={digits_root}",
        "--set",
        "model.num_classes=5",
        "--dry-run",
        cwd=tmp_path,
        env=no_slurm(tmp_path),
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.startswith("#!"), r.stderr[-3000:]
    assert (
        f"hpctrain: note: {digits_root / 'train'} has 10 classes but model.num_classes=5; "
        "set --set model.num_classes=10\n" in r.stderr
    )


def test_a_resume_path_that_is_no_file_is_an_input_problem(tmp_path, digits_root):
    """run.resume names auto, none or a checkpoint: a misspelt `none` is named with the choices
    (the task raised it after launch); auto, none and an existing path are no problem."""
    sets = [f"data.root={digits_root}", f"run.dir={tmp_path}"]
    assert input_problems(load(DIGITS, [*sets, "run.resume=nonee"])) == [
        "run.resume='nonee': no such checkpoint; give auto, none or a checkpoint path"
    ]
    (ckpt := tmp_path / "step-00000010.pt").write_bytes(b"x")
    for ok in ("auto", "none", str(ckpt)):
        assert input_problems(load(DIGITS, [*sets, f"run.resume={ok}"])) == [], ok


def test_init_from_a_run_an_older_release_wrote_reads_its_final_norm_under_todays_name(tmp_path, digits_root):
    """A 0.3.0 run's config.yaml names model.fc_norm (no model.final_norm): it is read through the moves,
    so weights with the norm after the pool are still refused for a model that norms the tokens (and
    were not let through because the old file did not load under today's schema)."""
    src = tmp_path / "pretrained"
    src.mkdir()
    old = to_dict(load(DIGITS, ["model.pool=avg", "model.final_norm=pooled"]))
    del old["model"]["final_norm"]
    old["model"].update(fc_norm=True, gap_norm="after")
    (src / "config.yaml").write_text(yaml.safe_dump(old))
    sets = [f"data.root={digits_root}", "data.prepare=none", f"model.init_from={src}", "model.pool=avg"]
    [problem] = input_problems(load(DIGITS, [*sets, "model.final_norm=tokens"]))
    assert "model.final_norm=pooled there, tokens here" in problem
    assert input_problems(load(DIGITS, sets)) == []  # auto with pool=avg: pooled, as the source
