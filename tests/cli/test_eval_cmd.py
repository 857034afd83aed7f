"""`hpctrain eval RUN --split minival`: minival is 1 % of root/train, held out only by a run whose
data.eval_splits names it; for any other run those images were trained on, and
the evaluation says so (it printed their accuracy as if held out)."""

from __future__ import annotations

import argparse

import pytest

from hpctrain.cli import eval_cmd
from hpctrain.config import load, save
from tests.helpers import DIGITS


def run_args(run: str, split: str | None = None) -> argparse.Namespace:
    """`hpctrain eval RUN [--split S]` as its parser leaves it, every other flag unset."""
    return argparse.Namespace(
        run=run,
        weights=None,
        overrides=[],
        data=None,
        split=split,
        img_size=None,
        crop_pct=None,
        config=None,
        output=None,
    )


def resolve_run(run, split: str | None) -> None:
    eval_cmd.resolve(run_args(str(run), split))


@pytest.mark.parametrize(
    "trained, warned",
    [([], True), (["data.eval_splits=[minival]"], False), (["data.eval_splits=[val,minival]"], False)],
)
def test_minival_of_a_run_that_trained_on_it_is_a_warning(tmp_path, capsys, trained, warned):
    run = tmp_path / "r"
    run.mkdir()
    save(load(DIGITS, trained), run / "config.yaml")
    resolve_run(run, "minival")
    err = capsys.readouterr().err
    if warned:
        assert err.count("\n") == 1 and err.startswith("hpctrain: warning: --split minival: ")
        assert "trained on all of root/train" in err and "data.eval_splits=[minival]" in err
    else:
        assert err == ""
    resolve_run(run, "val")
    assert capsys.readouterr().err == ""  # val is never in train


def test_a_run_that_does_not_exist_is_said_so_with_the_closest_run_names(tmp_path, monkeypatch):
    """Issue 56: `eval runs/digits_vt` (a typo) said `has no config.yaml: is it a run directory?`."""
    monkeypatch.chdir(tmp_path)
    for name in ("digits_vit", "digits_vit2", "imagenet"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        save(load(DIGITS), tmp_path / "runs" / name / "config.yaml")
    (tmp_path / "runs" / "digits_vit3").mkdir()  # not a run: no config.yaml
    rest = "Otherwise give a run directory, or --weights FILE --config C"
    for typed, near in (
        ("runs/digits_vt", "runs/digits_vit or runs/digits_vit2"),
        ("digits_vt", "digits_vit or digits_vit2"),
    ):
        with pytest.raises(eval_cmd.CLIError) as e:
            resolve_run(typed, None)
        assert str(e.value) == (
            f"{typed} does not exist (not a run directory, nor a run name under runs/): did you mean {near}? {rest}"
        )
    with pytest.raises(eval_cmd.CLIError, match=r"^zzz does not exist \(.*\): give a run directory, or --weights"):
        resolve_run("zzz", None)
    with pytest.raises(eval_cmd.CLIError, match=r"^runs/digits_vit/checkpoints/step-9.pt does not exist: give runs/"):
        resolve_run("runs/digits_vit/checkpoints/step-9.pt", None)
    with pytest.raises(eval_cmd.CLIError, match=r"has no config.yaml: is it a run directory\?"):  # it exists
        resolve_run("runs/digits_vit3", None)
