"""train.ckpt.resume_checks: a checkpoint of another model or global batch is refused before anything is
overwritten."""

from __future__ import annotations

import pytest

from hpctrain.config import load, to_dict
from hpctrain.train.ckpt.resume_checks import ResumeError, check_compatible


def test_a_checkpoint_from_before_the_dropout_keys_still_resumes(tmp_path):
    """Its config has no model.drop_rate / attn_drop_rate: it built the rate-0 model, so a run at the
    defaults resumes from it, and one with dropout on is refused naming the key."""
    cfg = load("digits_vit")
    old = to_dict(cfg)
    for k in ("drop_rate", "attn_drop_rate"):
        del old["model"][k]
    st = {"config": old, "global_batch": cfg.data.global_batch}
    check_compatible(cfg, st, tmp_path / "step-1.pt")
    with pytest.raises(ResumeError, match=r"differs in model\.drop_rate"):
        check_compatible(load("digits_vit", ["model.drop_rate=0.1"]), st, tmp_path / "step-1.pt")


def test_a_checkpoint_naming_the_final_norms_old_keys_resumes_under_model_final_norm(tmp_path):
    """A 0.3.0 checkpoint's config has model.fc_norm and model.gap_norm (every key, as saved), no
    model.final_norm: read through the moves, big_vision's order (gap_norm=before) resumes a run with
    final_norm=tokens, and one whose norm was after the pool is refused, naming the key."""
    cfg = load("digits_vit", ["model.pool=avg", "model.final_norm=tokens"])
    old = to_dict(cfg)
    del old["model"]["final_norm"]
    old["model"].update(fc_norm=None, gap_norm="before")
    st = {"config": old, "global_batch": cfg.data.global_batch}
    check_compatible(cfg, st, tmp_path / "step-1.pt")
    old["model"].update(gap_norm="after")
    with pytest.raises(ResumeError, match=r"differs in model\.final_norm"):
        check_compatible(cfg, st, tmp_path / "step-1.pt")
