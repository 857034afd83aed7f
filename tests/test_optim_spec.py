"""The optimizer registry (optim_spec.py) is what the config's rules read: its names are optim.name's
choices, and an entry's flags decide what is refused with it when the config loads (no torch here)."""

from __future__ import annotations

import dataclasses

import pytest

from hpctrain import optim_spec
from hpctrain.config import ConfigError, load
from hpctrain.errors import UserError
from hpctrain.optim_spec import OPTIMIZERS, OptimSpec
from tests.helpers import DIGITS

FAKE = OptimSpec("fake", "Fake", "hpctrain.train.optim.build:build_sgd", lambda o: 12)  # built: tests/train/optim


def test_an_unknown_name_is_refused_at_load_with_every_known_name(monkeypatch):
    monkeypatch.setitem(OPTIMIZERS, "fake", FAKE)
    with pytest.raises(ConfigError) as e:
        load(DIGITS, ["optim.name=lars"])
    assert str(e.value).startswith("optim.name='lars' is not one of adamw, lamb, sgd, fake")
    assert load(DIGITS, ["optim.name=fake"]).optim.name == "fake"  # a registered spec is a choice at once


def test_spec_refuses_a_name_without_an_entry_and_names_the_known_ones():
    with pytest.raises(UserError, match="optim.name='lars' is not an optimizer hpctrain knows: use one of adamw, lamb"):
        optim_spec.spec("lars")


def test_lamb_under_fsdp_is_refused_when_the_config_loads():
    """The rule is LAMB's spec's, read by the config: refused before submit or the task builds anything."""
    with pytest.raises(ConfigError, match="optim.name=lamb takes each tensor's norm whole, which FSDP shards"):
        load(DIGITS, ["optim.name=lamb", "dist.parallel=fsdp", "train.ema=0"])
    assert load(DIGITS, ["optim.name=adamw", "dist.parallel=fsdp", "train.ema=0"]).dist.parallel == "fsdp"


@pytest.mark.parametrize(
    "flags, sets, message",
    [
        (
            {"fsdp_refusal": "shards badly; use dist.parallel=ddp"},
            ["dist.parallel=fsdp", "train.ema=0"],
            "optim.name=fake shards badly",
        ),
        ({"grad_scaler": False}, ["train.amp=fp16"], "optim.name=fake does not step under train.amp=fp16's GradScaler"),
        ({}, ["optim.fused=always"], "optim.fused=always is for AdamW: fake has no fused kernel"),
        ({}, ["optim.mu_dtype=bf16"], "optim.mu_dtype=bf16 is for optim.name=adamw; fake keeps its moments in fp32"),
        ({"fused": True}, ["optim.fused=always"], "optim.fused=always is for AdamW or Fake: lamb has no fused kernel"),
    ],
)
def test_a_specs_flags_decide_what_the_config_refuses_with_it(monkeypatch, flags, sets, message):
    monkeypatch.setitem(OPTIMIZERS, "fake", dataclasses.replace(FAKE, **flags))
    name = "lamb" if "lamb" in message else "fake"
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load(DIGITS, [f"optim.name={name}", *sets])
    if flags:  # without the refusing setting the same optimizer loads
        assert load(DIGITS, [f"optim.name={name}"]).optim.name == name
