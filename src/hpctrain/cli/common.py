"""Helpers shared by the sub-commands."""

from __future__ import annotations

import os

from hpctrain.config import Config, load

DEFAULT_CONFIG = "vit_b16_imagenet.yaml"


def load_config(path: str | None, overrides: list[str], default: str | None = None) -> Config:
    """Load a config; HPCTRAIN_CONFIG / HPCTRAIN_SET (';'-separated) add to the command line."""
    path = path or os.environ.get("HPCTRAIN_CONFIG") or default
    env_sets = [s for s in os.environ.get("HPCTRAIN_SET", "").split(";") if s.strip()]
    return load(path, env_sets + list(overrides))
