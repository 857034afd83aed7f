"""Overrides: `--set section.key=value` items (each value read as YAML) applied to a config's mapping
before it is built, and `HPCTRAIN_SET`, the variable that carries them into a job: a JSON list of
"key=value" strings, or one per line typed by hand (the old `;`-joined form is refused)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
import typing
from typing import Any

import yaml

from hpctrain.config.field import ConfigError
from hpctrain.config.schema import Config


def parse_override(item: str) -> tuple[list[str], Any]:
    """`section.key=value` → (["section", "key"], value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. optim.lr=1e-3")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. optim.lr=1e-3")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (dict, list)) and not raw.strip().startswith(("[", "{")):
        value = raw
    if isinstance(value, (str, int, float, bool, list)) or value is None:
        return key.split("."), value
    return key.split("."), raw  # dates, sets and other YAML types: take the text as written


def apply_overrides(data: dict, overrides: typing.Iterable[str]) -> dict:
    """Apply `--set` items to a nested mapping (copied); unknown keys are caught by `build`."""
    data = copy.deepcopy(data) if data else {}
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return data


SET_ENV = "HPCTRAIN_SET"


def encode_overrides(items: typing.Sequence[str]) -> str:
    """`HPCTRAIN_SET` text for overrides: a JSON list of "key=value" strings, so any value (with
    `;`, `=`, quotes, spaces, non-ASCII) round-trips; no overrides: empty."""
    return json.dumps(list(items), ensure_ascii=False) if items else ""


def _legacy_joined(line: str) -> bool:
    """`a.b=1;c.d=2`: the old `;`-joined form, which would now set a.b to `1;c.d=2` silently."""
    sections = "|".join(f.name for f in dataclasses.fields(Config))
    return re.search(rf";\s*(?:{sections})(?:\.[^=;\s]+)+\s*=", line) is not None


def decode_overrides(text: str) -> list[str]:
    """Overrides from `HPCTRAIN_SET`: a JSON list (what the generator writes), or one override per
    line (typed by hand). The old `;`-joined form is refused, not misread."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"{SET_ENV}: not a JSON list ({e.msg} at character {e.pos}); write it as "
                f'{SET_ENV}=\'["optim.lr=1e-3", "train.epochs=5"]\''
            ) from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigError(
                f'{SET_ENV}: expected a JSON list of "key=value" strings, got {stripped!r}; '
                f'e.g. {SET_ENV}=\'["optim.lr=1e-3", "train.epochs=5"]\''
            )
        return items
    items = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    for line in items:
        if _legacy_joined(line):
            fix = json.dumps([p.strip() for p in line.split(";") if p.strip()])  # ASCII: one line
            raise ConfigError(
                f"{SET_ENV}: {line!r} looks like ';'-separated overrides, which are no "
                f"longer split (a value may contain ';'); use a JSON list: "
                f"{SET_ENV}={shlex.quote(fix)} (or one override per line)"
            )
    return items
