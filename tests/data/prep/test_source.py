"""A pack's entries are typed (`source.FileEntry`, ...); plan.json keeps its list rows, so a plan written
before resumes, and a plan's row is read back as the kind it was written from."""

from __future__ import annotations

import json
import tarfile

import pytest

from hpctrain.data.folder import DataError
from hpctrain.data.prep.source import (
    ArchiveEntry,
    ArchiveSpan,
    FileEntry,
    MovedFileEntry,
    ParquetCell,
    ParquetEntry,
    Sample,
    SampleReader,
    check_spec,
    display,
)

ENTRIES = [  # each kind, and the row plan.json has held for it since its format 1: [key, *fields]
    (FileEntry("n01/a.jpg", 3), [7, "n01/a.jpg", 3]),
    (MovedFileEntry("n01/a.jpg", 3, "a.jpg"), [7, "n01/a.jpg", 3, "a.jpg"]),
    (ArchiveEntry("n01/a.jpg", 3, 1536, 99), [7, "n01/a.jpg", 3, 1536, 99]),
    (ParquetEntry("n01/a.jpg", 3, "val-0.parquet", 2, 41), [7, "n01/a.jpg", 3, "val-0.parquet", 2, 41]),
]


@pytest.mark.parametrize(("entry", "row"), ENTRIES, ids=[type(e).__name__ for e, _ in ENTRIES])
def test_a_sample_keeps_its_plan_row_and_reads_back_as_its_kind(entry, row):
    s = Sample(7, entry)
    assert s.row() == row
    back = Sample.of_row(json.loads(json.dumps(s.row())))
    assert back == s and type(back.entry) is type(entry)


def test_a_plan_row_of_no_known_kind_is_refused_in_one_line():
    with pytest.raises(DataError) as e:
        Sample.of_row([7, "n01/a.jpg"])
    assert "a plan sample has 2 fields" in str(e.value) and "remove OUT/.pack and pack again" in str(e.value)
    assert "\n" not in str(e.value)


def test_each_kind_is_read_from_where_its_bytes_lie(tmp_path):
    """A moved file from its own path, an archive member by its span; the decode check gets the same place."""
    (tmp_path / "n01").mkdir()
    (tmp_path / "n01" / "a.jpg").write_bytes(b"at the folder path")
    (tmp_path / "flat.jpg").write_bytes(b"elsewhere")
    member = tmp_path / "member"
    member.write_bytes(b"in the archive")
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        tar.add(member, "n01/b.jpg")
    with tarfile.open(tmp_path / "t.tar") as tar:
        m = tar.getmember("n01/b.jpg")
    folder, moved = FileEntry("n01/a.jpg", 0), MovedFileEntry("n01/a.jpg", 0, "flat.jpg")
    archived = ArchiveEntry("n01/b.jpg", 0, m.offset_data, m.size)
    with SampleReader(str(tmp_path), [folder, moved]) as r:
        assert [r.read(folder), r.read(moved)] == [b"at the folder path", b"elsewhere"]
    with SampleReader(str(tmp_path / "t.tar"), [archived]) as r:
        assert r.read(archived) == b"in the archive"
    assert check_spec(str(tmp_path), moved) == str(tmp_path / "flat.jpg")
    assert check_spec(str(tmp_path / "t.tar"), archived) == ArchiveSpan(str(tmp_path / "t.tar"), m.offset_data, m.size)
    assert display(str(tmp_path / "t.tar"), archived) == f"{tmp_path / 't.tar'} (n01/b.jpg)"
    cell = check_spec(str(tmp_path), ParquetEntry("n01/c.jpg", 0, "val.parquet", 2, 41))
    assert cell == ParquetCell(str(tmp_path / "val.parquet"), 2, 41)
