"""data/prep/once.py: a first try that fails leaves no folder and no lock behind (a missing package,
a Ctrl-C), so the next try starts clean; a folder that was there stays."""

from __future__ import annotations

import pytest

from hpctrain.data.prep.once import make_once


def fail() -> str:
    raise ModuleNotFoundError("No module named 'numpy'", name="numpy")


def test_a_failed_first_make_leaves_no_folder_and_a_second_makes_it(tmp_path):
    target = tmp_path / "data" / "digits"
    with pytest.raises(ModuleNotFoundError):
        make_once(target / ".done", target / ".lock", fail)
    assert list(tmp_path.iterdir()) == []
    assert make_once(target / ".done", target / ".lock", lambda: "made") is True
    assert (target / ".done").read_text() == "made"
    assert make_once(target / ".done", target / ".lock", fail) is False  # done: not made again


def test_a_failed_make_in_a_folder_that_was_there_keeps_the_folder(tmp_path):
    (tmp_path / "mine.txt").write_text("kept")
    with pytest.raises(ModuleNotFoundError):
        make_once(tmp_path / ".done", tmp_path / ".lock", fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "mine.txt"]
