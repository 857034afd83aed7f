"""Typed, validated run configuration: YAML → frozen dataclasses.

Configs are data: every key is declared (schema.py) with a type, a one-line doc and its bounds, so a
typo or a wrong value fails before anything runs (or is submitted), with the fix in the message.
This package imports nothing heavy: login nodes load configs without torch.

One concern per module; each imports only those above it in this list (tests/test_import_graph.py):

- `field`: how a key is declared (`opt`) and the error every check raises (`ConfigError`);
- `text`: checks of one text value (a step window, sbatch's file-name patterns, control characters);
- `rules`: the rules across sections and the shape rules (`rule_problems`, `check_shapes`,
  `check_batch`); it names `Config` in its annotations only;
- `schema`: the sections' frozen dataclasses, with their own rules, and `Config`;
- `synonyms`: unknown keys, each with a "did you mean" (a near key, or ours for another tool's name);
- `coerce`: a nested mapping → the dataclasses, every value checked (`build`), and back (`to_dict`);
- `overrides`: `--set key=value` and `HPCTRAIN_SET`, the variable that carries them into a job;
- `keys`: every key with its default and doc (`hpctrain config --keys`);
- `io`: reading, finding, loading and saving config files (keys moved by config_moves.py on the way).

This face re-exports the names that `hpctrain.config` had as one module, so that every
`from hpctrain.config import X` works as before.
"""

from __future__ import annotations

from hpctrain.config.coerce import build, to_dict
from hpctrain.config.field import ConfigError, opt
from hpctrain.config.io import CONFIG_DIR, find_config, load, read_yaml, save, unreadable, yaml_error
from hpctrain.config.keys import MORE, describe
from hpctrain.config.overrides import SET_ENV, apply_overrides, decode_overrides, encode_overrides, parse_override
from hpctrain.config.rules import check_batch, check_shapes, rule_problems, shape_problems
from hpctrain.config.schema import (
    SECTIONS,
    TRACKERS,
    AugConfig,
    CkptConfig,
    CompileConfig,
    Config,
    DataConfig,
    DistConfig,
    HealthConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
)
from hpctrain.config.synonyms import SYNONYMS, unknown_key_error, unknown_keys, unknown_keys_error
from hpctrain.config.text import (
    PATTERN_CHARS,
    STEP_WINDOW_RE,
    check_pattern_free,
    check_text,
    control_char,
    step_window,
)

__all__ = [
    "CONFIG_DIR",
    "MORE",
    "PATTERN_CHARS",
    "SECTIONS",
    "SET_ENV",
    "STEP_WINDOW_RE",
    "SYNONYMS",
    "TRACKERS",
    "AugConfig",
    "CkptConfig",
    "CompileConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistConfig",
    "HealthConfig",
    "LogConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "build",
    "check_batch",
    "check_pattern_free",
    "check_shapes",
    "check_text",
    "control_char",
    "decode_overrides",
    "describe",
    "encode_overrides",
    "find_config",
    "load",
    "opt",
    "parse_override",
    "read_yaml",
    "rule_problems",
    "save",
    "shape_problems",
    "step_window",
    "to_dict",
    "unknown_key_error",
    "unknown_keys",
    "unknown_keys_error",
    "unreadable",
    "yaml_error",
]
