"""Config files: YAML read with errors that name the file, line and column (`read_yaml`), a config
found by path or shipped name (`find_config`), `load` (read, keys an earlier release named otherwise
moved, overrides applied, built) and `save`."""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from hpctrain import shipped
from hpctrain.config.coerce import build, to_dict
from hpctrain.config.field import ConfigError
from hpctrain.config.overrides import apply_overrides
from hpctrain.config.schema import Config
from hpctrain.config_moves import MoveError, migrate_data, migrate_override

CONFIG_DIR = shipped.CONFIG_DIR


def yaml_error(p: Path, e: yaml.YAMLError) -> ConfigError:
    """One line: `FILE:LINE:COLUMN: not valid YAML: <problem> (<context>)`, 1-based as editors count."""
    mark = getattr(e, "problem_mark", None)
    where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and cmark and (not mark or cmark.line != mark.line):
        context += f" that starts at line {cmark.line + 1}, column {cmark.column + 1}"
    return ConfigError(f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else ""))


def unreadable(p: Path) -> str:
    """The one line for a file this user may not read (it or a directory above it)."""
    return (
        f"cannot read {str(p)!r}: permission denied (the file, or a directory above it, is not readable by "
        "you): ask its owner to share it, or give a copy of your own"
    )


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    try:
        if p.is_dir():
            raise ConfigError(f"{str(p)!r} is a directory: give a YAML config file (e.g. configs/digits_vit.yaml)")
        if not p.is_file():
            raise ConfigError(f"file {str(p)!r} does not exist")
        data = yaml.safe_load(p.read_text())
    except PermissionError:  # the file, or a directory above it, is another user's (a shared site)
        raise ConfigError(unreadable(p)) from None
    except yaml.YAMLError as e:
        raise yaml_error(p, e) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of sections (model:, data:, …) at the top level")
    return data


def find_config(name: str | Path) -> Path:
    """A path as given, else a shipped config by name (`vit_b16_imagenet_4k`, `.yaml` optional, or the
    checkout's `configs/<name>.yaml` from any directory)."""
    p = Path(name)
    if p.exists():
        return p
    found = shipped.lookup(p, CONFIG_DIR, (".yaml",))
    if found is None:
        raise ConfigError(
            f"config {str(name)!r} not found: give a YAML file or a shipped config: "
            f"{shipped.names(shipped.configs())} (`hpctrain config show NAME` prints one)"
        )
    return found


def load(path: str | Path | None = None, overrides: typing.Iterable[str] = (), data: dict | None = None) -> Config:
    """Load a config file (or a mapping), apply overrides, validate. Keys an earlier release named
    otherwise (config_moves.MOVES) are read under their new names, with a note on stderr each."""
    raw = data if data is not None else (read_yaml(find_config(path)) if path else {})
    try:
        raw, notes = migrate_data(raw, str(path) if path else "the config")
        for item in overrides:
            new, moved = migrate_override(item, raw)
            raw = apply_overrides(raw, [new] if new else [])
            notes += [moved] if moved else []
    except MoveError as e:
        raise ConfigError(str(e)) from None
    for line in notes:
        print(line, file=sys.stderr)
    return build(Config, raw)


def save(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
