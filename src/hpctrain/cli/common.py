"""Helpers shared by the sub-commands."""

from __future__ import annotations

import os

from hpctrain.config import SET_ENV, Config, decode_overrides, load

DEFAULT_CONFIG = "vit_b16_imagenet.yaml"


def load_config(path: str | None, overrides: list[str], default: str | None = None) -> Config:
    """Load a config; HPCTRAIN_CONFIG and HPCTRAIN_SET (a JSON list of "key=value" strings, or one
    per line) add to the command line, which wins."""
    path = path or os.environ.get("HPCTRAIN_CONFIG") or default
    env_sets = decode_overrides(os.environ.get(SET_ENV, ""))
    return load(path, env_sets + list(overrides))
