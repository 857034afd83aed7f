"""<run>/sample_hashes.jsonl read back: a resume writes the steps after its checkpoint again, and the
last line of a step is the one the run kept; a torn last line (a killed writer) is skipped."""

from __future__ import annotations

import json

import pytest

from hpctrain.config import ConfigError, load
from hpctrain.run.sample_hashes import read_last
from tests.helpers import DIGITS


def test_last_line_per_step_wins_and_a_torn_line_is_skipped(tmp_path):
    path = tmp_path / "sample_hashes.jsonl"
    lines = [{"step": s, "epoch": 0, "n": 64, "hash": f"{s:016x}"} for s in (1, 2, 3)]
    lines += [{"step": 3, "epoch": 0, "n": 64, "hash": "f" * 16}, {"step": 4, "epoch": 0, "n": 64, "hash": "e" * 16}]
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines) + '{"step": 5, "ha')
    got = read_last(path)
    assert list(got) == [1, 2, 3, 4] and got[3]["hash"] == "f" * 16 and got[1]["hash"] == f"{1:016x}"


@pytest.mark.parametrize("sets", [["data.loader=synthetic"], ["data.loader=dali", "data.format=wds"]])
def test_a_loader_that_cannot_name_its_samples_is_refused(sets):
    with pytest.raises(ConfigError) as e:
        load(DIGITS, ["log.sample_hashes=true", *sets])
    assert str(e.value).startswith("log.sample_hashes needs a loader that names its samples")
    assert "set log.sample_hashes=false" in str(e.value) and "\n" not in str(e.value)
