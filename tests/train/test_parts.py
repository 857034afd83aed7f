"""train.parts: what build_parts wraps and builds from the config, and the step plan's refusal."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config import load
from hpctrain.models.vit import build_vit
from hpctrain.train.dist import DistInfo
from hpctrain.train.parts import StepPlan, build_parts
from tests.helpers import DIGITS

BASE = ["data.loader=synthetic", "train.threads=0"]


def test_one_rank_gets_the_model_itself_and_fp16_alone_a_scaler_and_ema_its_copy():
    cfg = load(DIGITS, BASE)
    p = build_parts(cfg, DistInfo(), torch.device("cpu"), build_vit(cfg.model))
    assert p.fwd_model is p.model and p.ddp is None and p.reduce_hook is None and not p.fsdp
    assert p.scaler is None and p.step_amp == cfg.train.amp
    trained = {id(x) for x in p.model.parameters() if x.requires_grad}  # the optimizer updates the model's own
    assert {id(x) for g in p.optimizer.param_groups for x in g["params"]} == trained
    cfg16 = load(DIGITS, [*BASE, "train.amp=fp16", "train.ema=0.99"])
    p16 = build_parts(cfg16, DistInfo(), torch.device("cpu"), build_vit(cfg16.model))
    assert p16.scaler is not None and p16.ema is not None and p16.ema.module is not p16.model


def test_a_loader_shorter_than_one_step_names_the_settings_to_change():
    cfg = load(DIGITS, [*BASE, "train.accum_steps=4"])
    with pytest.raises(ValueError, match="lower data.global_batch or train.accum_steps"):
        StepPlan.of(cfg, 3)
    plan = StepPlan.of(cfg, 10)
    assert (plan.accum, plan.steps_per_epoch) == (4, 2) and plan.total_steps >= plan.steps_per_epoch
