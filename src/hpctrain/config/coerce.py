"""A nested mapping (a file's, with its overrides) → the frozen dataclasses, and back. `build` refuses
unknown keys all at once, checks each value against its field's annotation and puts it in its
canonical form (`_coerce`), refuses control characters in its strings, enforces its choices and
bounds, and runs each section's `validate`; `to_dict` gives the plain nested dict again."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import types
import typing
from typing import Any

from hpctrain.config.field import ConfigError
from hpctrain.config.synonyms import unknown_keys, unknown_keys_error
from hpctrain.config.text import check_text


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    return {type(None): "null", bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it in the field's canonical form."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_describe(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if origin in (tuple, list):
        if isinstance(value, str) and origin is tuple:
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected {_describe(tp)}, got {value!r}")
        inner = typing.get_args(tp)[0]
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of names to values, got {value!r}")
        kt, vt = typing.get_args(tp)
        return {_coerce(k, kt, key): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _check_bounds(value: Any, meta: typing.Mapping, key: str) -> None:
    choices = meta.get("choices")
    if choices and value not in choices:
        near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(map(str, choices))}{hint}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi = meta.get("lo"), meta.get("hi")
        if lo is not None and (value <= lo if meta.get("lo_open") else value < lo):
            bound = f"> {lo:g}" if meta.get("lo_open") else f">= {lo:g}"
            raise ConfigError(f"{key}={value!r} is out of range: must be {bound}")
        if hi is not None and value > hi:
            raise ConfigError(f"{key}={value!r} is out of range: must be <= {hi:g}")


def _check_strings(value: Any, key: str) -> None:
    """`check_text` on every string in a coerced value: list items, mapping keys and values."""
    if isinstance(value, str):
        check_text(value, key)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_strings(v, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_strings(k, f"{key} (key {k!r})")
            _check_strings(v, f"{key}.{k}")


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Make dataclass `cls` from a nested mapping, validating every key and value."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        name = prefix.rstrip(".") or "the config file"
        raise ConfigError(f"{name}: expected a mapping of keys to values, got {data!r}")
    found = unknown_keys(cls, data, prefix)  # the whole tree's: a nested build finds none left
    if found:
        raise unknown_keys_error(found)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        tp, key = hints[name], f"{prefix}{name}"
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, data[name], f"{key}.")
        else:
            value = _coerce(data[name], tp, key)
            _check_strings(value, key)
            _check_bounds(value, f.metadata, key)
            kwargs[name] = value
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if check:
        check()
    return obj


def to_dict(obj: Any) -> dict:
    """Plain nested dict (lists for tuples): YAML-, JSON- and checkpoint-safe."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(obj)
