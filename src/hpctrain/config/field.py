"""How a config key is declared (`opt`: its default, one-line doc, choices and numeric bounds) and
the error every check of the config raises (`ConfigError`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import field
from typing import Any

from hpctrain.errors import UserError


class ConfigError(UserError, ValueError):
    """A config problem, phrased for the person who wrote the config."""


def opt(
    default: Any,
    doc: str,
    *,
    choices: Collection[Any] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    more: bool = False,
) -> Any:
    """A config field: default, one-line doc, allowed choices and numeric bounds. `more`: the key has
    a longer explanation under its own heading in docs/configs.md ("Keys in full")."""
    meta = {"doc": doc, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "more": more}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)
