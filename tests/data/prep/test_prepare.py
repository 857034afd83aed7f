"""`data.prepare: digits` fills the demo's own folder only: a mistyped data.root or a shard folder
gets nothing written into it, and the error names the path and the fix in one line."""

from __future__ import annotations

import pytest

from hpctrain.config import ConfigError, load, save
from hpctrain.data.prep.prepare import DEMO_ROOT, ensure_dataset, input_problems
from tests.helpers import DIGITS, hpctrain


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
