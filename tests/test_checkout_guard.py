"""The checkout guard (tests/checkout_guard.py) tells a test's writes from its owner's."""

from __future__ import annotations

from tests.checkout_guard import changes, snapshot


def test_a_run_written_into_the_checkout_is_caught_and_a_users_log_is_not(tmp_path):
    (tmp_path / "runs" / "digits_vit").mkdir(parents=True)
    (tmp_path / "runs" / "digits_vit" / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "ci.log").write_text("x\n")  # `bash .ci/run > ci.log`: its owner's
    (tmp_path / ".ci-main.log").write_text("x\n")
    before = snapshot(tmp_path)
    (tmp_path / "ci.log").write_text("x\ny\n")
    (tmp_path / ".ci-main.log").write_text("x\ny\n")
    assert changes(before, snapshot(tmp_path)) == []
    (tmp_path / "runs" / "digits_vit" / "metrics.jsonl").write_text("{}\n{}\n")  # a resumed demo run
    (tmp_path / "runs" / "other").mkdir()
    (tmp_path / "__pycache__").mkdir()  # a tool's cache
    assert changes(before, snapshot(tmp_path)) == ["added runs/other/", "changed runs/digits_vit/metrics.jsonl"]
