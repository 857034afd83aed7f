"""Every key in words: its dotted name, default and one-line doc (`describe`), for `hpctrain config
--keys` and docs/configs.md."""

from __future__ import annotations

import dataclasses
import typing

from hpctrain.config.schema import Config

MORE = " (docs/configs.md)"  # after the doc of a key with more to say there


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, doc) for every field: `hpctrain config --keys`, one line each (the doc of a key
    with a longer explanation ends with MORE)."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, f"{prefix}{f.name}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            doc = f.metadata.get("doc", "") + (MORE if f.metadata.get("more") else "")
            rows.append((f"{prefix}{f.name}", repr(default), doc))
    return rows
