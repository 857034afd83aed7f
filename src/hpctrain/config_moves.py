"""Config keys that moved, and how an old file, `--set` or run directory keeps working (issue 37).

A moved key is read under its new name, with one line saying so; `hpctrain config migrate FILE`
rewrites a file in the new names, keeping its comments and layout. Each move names the release that
made it (the CHANGELOG's section says why). Only renames within a section for now: a move across
sections or with a change of unit would need a value rule here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import UserError


class MoveError(UserError, ValueError):
    """An old and a new name given together, or a file that cannot be rewritten in place."""


@dataclass(frozen=True)
class Move:
    old: str  # the dotted key as an earlier release named it
    new: str  # its name now, in the same section
    version: str  # the release that moved it


MOVES = (
    # timm's command-line shorthand (DeiT's --reprob/--remode/--recount) for random erasing
    Move("data.reprob", "data.erase_prob", "0.2.0"),
    Move("data.remode", "data.erase_mode", "0.2.0"),
    Move("data.recount", "data.erase_count", "0.2.0"),
    # counted epochs beside ckpt_every and log_every, which count steps: the unit goes into the name
    Move("train.eval_every", "train.eval_every_epochs", "0.2.0"),
)
BY_OLD = {m.old: m for m in MOVES}


def note(m: Move, where: str) -> str:
    return (
        f"hpctrain: note: {where}: config key {m.old} is {m.new} since hpctrain {m.version}, read as "
        f"{m.new} (`hpctrain config migrate FILE` rewrites a file)"
    )


def migrate_data(data: Any, where: str) -> tuple[Any, list[str]]:
    """`data` (a config mapping, not changed) with every moved key under its new name, and one note
    per key moved. Both names at once is an error: which one was meant cannot be told."""
    if not isinstance(data, dict):
        return data, []
    out, notes = dict(data), []  # a moved key's section is replaced by a new mapping, never edited
    for m in MOVES:
        (section, old), new = m.old.split("."), m.new.split(".")[1]
        keys = out.get(section)
        if not isinstance(keys, dict) or old not in keys:
            continue
        if new in keys:
            raise MoveError(
                f"{where}: both {m.old} (its name before hpctrain {m.version}) and {m.new} are set: keep {m.new}"
            )
        out[section] = {new if k == old else k: v for k, v in keys.items()}
        notes.append(note(m, where))
    return (out, notes) if notes else (data, [])


def migrate_override(item: str) -> tuple[str, str | None]:
    """A `--set key=value` item under the key's new name, and the note (None: the key did not move)."""
    key, sep, value = item.partition("=")
    m = BY_OLD.get(key.strip()) if sep else None
    return (f"{m.new}={value}", note(m, f"--set {key.strip()}")) if m else (item, None)


SECTION = re.compile(r"^([A-Za-z_]\w*)\s*:")
KEY = re.compile(r"^(\s+)([A-Za-z_]\w*)(\s*:)")


def migrate_text(text: str) -> tuple[str, list[Move]]:
    """A config file's text with moved keys renamed where they stand: comments, order and layout kept
    (a comment that followed a renamed key keeps its column where there is room). Reads the block
    layout YAML configs are written in (`section:`, then its keys indented); the caller checks that
    the result loads to what the old text migrates to. Also returns the moves made, in file order."""
    lines = text.splitlines(keepends=True)
    section, moved = None, []
    for i, line in enumerate(lines):
        top = SECTION.match(line)
        if top:
            section = top.group(1)
            continue
        k = KEY.match(line)
        m = BY_OLD.get(f"{section}.{k.group(2)}") if k and section else None
        if not (k and m):
            continue
        new = m.new.split(".")[1]
        rest = line[k.end(2) :]
        grow = len(new) - len(k.group(2))
        pad = re.match(r"^(\s*:\s*\S+)( +)(#.*)$", rest, re.S)
        if pad and len(pad.group(2)) > grow > 0:  # keep the comment's column
            rest = pad.group(1) + pad.group(2)[grow:] + pad.group(3)
        lines[i] = k.group(1) + new + rest
        moved.append(m)
    return "".join(lines), moved
