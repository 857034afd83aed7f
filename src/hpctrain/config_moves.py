"""Config keys that moved, and how an old file, `--set` or run directory keeps working (issue 37).

A moved key is read under its new name, with one line saying so; `hpctrain config migrate FILE`
rewrites a file in the new names, keeping its comments and layout. Each move names the release that
made it (the CHANGELOG's section says why). A move may cross sections (`train.ckpt_every` is
`ckpt.every`); one whose value changes form has a rule that computes the new value from the old one
and the config read so far (`train.tensorboard: false` is `log.trackers` without tensorboard); a key
that left the schema has no new name, and its note says where the thing it held went.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from hpctrain.errors import UserError


class MoveError(UserError, ValueError):
    """An old and a new name given together, or a file that cannot be rewritten in place."""


GONE = object()  # a rule's answer when the old value leaves no key behind (it was the default)


@dataclass(frozen=True)
class Move:
    old: str  # the dotted key as an earlier release named it
    new: str  # its name now ("": it left the schema)
    version: str  # the release that moved it
    rule: Callable[[Any, dict], Any] | None = None  # new value from the old one and the config so far, or GONE
    why: str = ""  # said in the note when the value changes form or the key left
    merges: bool = False  # the rule reads the new key's value too: both names at once are not an error


def _names(value: Any) -> list:
    """A list-valued key as written: a YAML list, or the comma- or space-separated text --set allows."""
    return [v for v in value.replace(",", " ").split() if v] if isinstance(value, str) else list(value or [])


def _trackers(value: Any, cfg: dict) -> Any:
    """train.tensorboard=false turned TensorBoard off even when train.trackers named it."""
    if value is not False:
        return GONE
    have = _mapping(cfg.get("log")).get("trackers", ["tensorboard"])
    return [t for t in _names(have) if t != "tensorboard"]


def _splits(value: Any, cfg: dict) -> Any:
    """data.val_split chose the one eval split unless data.eval_splits listed them (its first is the headline)."""
    have = _mapping(cfg.get("data")).get("eval_splits")
    if have:
        if value not in ("val", _names(have)[0]):
            raise MoveError(
                f"data.val_split={value} and data.eval_splits={_names(have)} both choose the eval split: "
                "drop data.val_split (the first of data.eval_splits is the headline one)"
            )
        return have
    return GONE if value == "val" else [value]


def _fraction(value: Any, cfg: dict) -> Any:
    """A percentage as the fraction the health thresholds beside it are (preflight_min_frac, _tolerance)."""
    return round(value / 100, 12) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _gone(value: Any, cfg: dict) -> Any:
    return GONE


def _where_norm(new: str, cfg: dict, old: str) -> str:
    """model.final_norm from an old key, refused when the other old key (moved first) or final_norm itself
    says otherwise; one that says the same (0.3.0's saved configs name both) is no conflict."""
    have = _mapping(cfg.get("model")).get("final_norm")
    if have not in (None, new):
        raise MoveError(
            f"model.{old} and model.final_norm={have} place the final LayerNorm apart: "
            "keep model.final_norm (tokens: before the pool; pooled: after it)"
        )
    return new


def _fc_norm(value: Any, cfg: dict) -> Any:
    """timm's fc_norm: true is the norm on the pooled features, false on the tokens, null timm's rule."""
    if value is None:
        return GONE
    if not isinstance(value, bool):
        raise MoveError(f"model.fc_norm={value!r} was true, false or null: set model.final_norm=pooled, tokens or auto")
    if value and _mapping(cfg.get("model")).get("gap_norm") == "before":
        raise MoveError(
            "model.fc_norm=true puts the final norm after the pool, model.gap_norm=before on the tokens "
            "before it: set model.final_norm=pooled or tokens instead of both"
        )
    return _where_norm("pooled" if value else "tokens", cfg, "fc_norm")


def _gap_norm(value: Any, cfg: dict) -> Any:
    """big_vision's order (before: the norm on every token, then the average); after was timm's default."""
    if value == "after":
        return GONE  # the default, and what final_norm=auto does for pool=avg; a fc_norm beside it decided
    if value != "before":
        raise MoveError(f"model.gap_norm={value!r} was after or before: set model.final_norm=pooled or tokens")
    return _where_norm("tokens", cfg, "gap_norm")


def _section(old: str, new: str, keys: str, version: str = "0.3.0") -> tuple[Move, ...]:
    """Moves of `keys` ("a b=c": a keeps its name, b is renamed c) from section `old` to `new`."""
    out = []
    for k in keys.split():
        a, _, b = k.partition("=")
        out.append(Move(f"{old}.{a}", f"{new}.{b or a}", version))
    return tuple(out)


MOVES = (
    # timm's command-line shorthand (DeiT's --reprob/--remode/--recount) for random erasing: data.erase_*
    # in 0.2.0, aug.erase_* since 0.3.0 (read as the newest name at once)
    Move("data.reprob", "aug.erase_prob", "0.2.0"),
    Move("data.remode", "aug.erase_mode", "0.2.0"),
    Move("data.recount", "aug.erase_count", "0.2.0"),
    # counted epochs beside ckpt.every and log.every, which count steps: the unit goes into the name
    Move("train.eval_every", "train.eval_every_epochs", "0.2.0"),
    # train's 60 flat keys, prefixes standing in for sections, get sections of their own
    *_section(
        "train",
        "compile",
        "compile=enabled compile_mode=mode compile_cache=cache compile_warmup=warmup compile_timeout_s=timeout_s",
    ),
    *_section("data", "aug", "hflip randaugment erase_prob erase_mode erase_count repeated_aug"),
    *_section("train", "aug", "mixup cutmix mix_prob switch_prob label_smoothing"),
    *_section(
        "train",
        "ckpt",
        "ckpt_every=every ckpt_auto_first=auto_first mtbf_h keep_ckpts=keep keep_best "
        "on_ckpt_error=on_error ckpt_format=format ckpt_async=async_save",
    ),
    *_section(
        "train",
        "dist",
        "parallel pg_timeout_s ddp_bucket_mb ddp_bucket_view ddp_static_graph fsdp_reshard grad_reduce_dtype",
    ),
    *_section(
        "train",
        "health",
        "hang_timeout_s on_nonfinite max_rollbacks rollback_skip_batches spike_factor "
        "spike_window preflight preflight_min_frac preflight_tolerance "
        "preflight_busbw_gbps",
    ),
    *_section(
        "train",
        "log",
        "log_every=every peak_tflops trackers mlflow_uri mlflow_experiment wandb_project "
        "wandb_mode profile_steps profile_ranks profile_with_stack memory_snapshot_steps",
    ),
    # one global batch, one per-rank eval batch: the names say which
    Move("data.batch_size", "data.global_batch", "0.3.0"),
    Move("data.eval_batch_size", "data.eval_batch_per_rank", "0.3.0"),
    # the same unit for the same kind of thing: health's thresholds are fractions
    Move(
        "train.straggler_pct", "health.straggler_frac", "0.3.0", _fraction, "a percentage, now a fraction: 15 is 0.15"
    ),
    Move(
        "train.exclude_straggler_pct",
        "health.exclude_straggler_frac",
        "0.3.0",
        _fraction,
        "a percentage, now a fraction",
    ),
    # two switches for one thing: one is left
    Move("train.tensorboard", "log.trackers", "0.3.0", _trackers, "false: log.trackers without tensorboard", True),
    Move("data.val_split", "data.eval_splits", "0.3.0", _splits, "minival: data.eval_splits=[minival]", True),
    # not settings: provenance and a test knob
    Move("train.mtbf_source", "", "0.3.0", _gone, "hpctrain submit keeps it in env.json's resolved record"),
    Move("train.halt_at", "", "0.3.0", _gone, "a test knob: HPCTRAIN_HALT_AT=N in the task's environment"),
    # two keys for where the final LayerNorm goes (timm's fc_norm, and big_vision's order under pool=avg)
    Move("model.fc_norm", "model.final_norm", "0.4.0", _fc_norm, "true: pooled, false: tokens, null: auto"),
    Move("model.gap_norm", "model.final_norm", "0.4.0", _gap_norm, "before: tokens, after: auto"),
)
BY_OLD = {m.old: m for m in MOVES}


def note(m: Move, where: str) -> str:
    head, tail = f"hpctrain: note: {where}: config key {m.old}", "(`hpctrain config migrate FILE` rewrites a file)"
    if not m.new:
        return f"{head} left the config in hpctrain {m.version} ({m.why}): ignored {tail}"
    how = f" ({m.why})" if m.why else ""
    return f"{head} is {m.new} since hpctrain {m.version}{how}, read as {m.new} {tail}"


def _mapping(value: Any) -> dict:
    """A section as read: a mapping, or nothing (`section:` with no keys is null in YAML)."""
    return value if isinstance(value, dict) else {}


def flow(value: Any) -> str:
    """A value as YAML writes it on one line (`[mlflow]`, `0.2`: no end-of-document mark)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _split(key: str) -> tuple[str, str]:
    section, _, name = key.partition(".")
    return section, name


def migrate_data(data: Any, where: str) -> tuple[Any, list[str]]:
    """`data` (a config mapping, not changed) with every moved key under its new name, and one note
    per key moved. Both names at once is an error: which one was meant cannot be told. A section
    the moves leave empty is left out."""
    out, notes, _, _ = _migrate(data, where)
    return out, notes


def _migrate(data: Any, where: str) -> tuple[Any, list[str], dict[str, str], set[str]]:
    """migrate_data's work, which old key's value each new key holds (the last move that wrote it:
    two old keys may land on one new key, as model.fc_norm and model.gap_norm do), and the old keys
    whose rule left nothing (their value was the new key's default)."""
    if not isinstance(data, dict):
        return data, [], {}, set()
    out, notes, emptied = dict(data), [], set()  # a moved key's section is replaced by a new mapping, never edited
    writers: dict[str, str] = {}
    defaults: set[str] = set()
    for m in MOVES:
        section, old = _split(m.old)
        keys = out.get(section)
        if not isinstance(keys, dict) or old not in keys:
            continue
        value = keys[old]
        out[section] = {k: v for k, v in keys.items() if k != old}
        emptied |= {section} if not out[section] else set()
        new = m.rule(value, out) if m.rule else value
        if m.new and new is not GONE:
            to, name = _split(m.new)
            have = _mapping(out.get(to))
            if name in have and not m.merges and m.new not in writers:  # set by the file, not by a move before
                raise MoveError(
                    f"{where}: both {m.old} (its name before hpctrain {m.version}) and {m.new} are set: keep {m.new}"
                )
            out[to] = {**have, name: new}
            writers[m.new] = m.old
        elif m.new:
            defaults.add(m.old)
        notes.append(note(m, where))
    for section in emptied:
        if not out.get(section):
            del out[section]
    return (out, notes, writers, defaults) if notes else (data, [], {}, set())


def present(data: Any) -> list[Move]:
    """The moves whose old key `data` (a config mapping as read) sets."""
    return [m for m in MOVES if isinstance(data, dict) and _split(m.old)[1] in _mapping(data.get(_split(m.old)[0]))]


def removed(m: Move, data: dict) -> str:
    """Why migrating `data` (a config mapping as read, which sets m.old) leaves no key for m.old
    ("": it is renamed): the key left the schema, or its value is the new key's default."""
    if not m.new:
        return f"it left the config in hpctrain {m.version}: {m.why}"
    if m.old not in _migrate(data, "")[3]:
        return ""
    section, old = _split(m.old)
    value = flow(_mapping(data.get(section))[old])
    return f"{value} is what its new name {m.new} does by default (hpctrain {m.version})"


def outcome(m: Move, data: dict) -> str:
    """What migrating `data` does with m.old, as `hpctrain config migrate` says it: renamed, or removed and why."""
    why = removed(m, data)
    if why:
        return f"{m.old} removed: {why}"
    return f"{m.old} → {m.new} (hpctrain {m.version}{': ' + m.why if m.why else ''})"


def current(data: dict) -> dict:
    """A run directory's saved config (plain data, read without the schema: `hpctrain status`, the
    finished-run check) in today's names, without notes; one that names a key twice, as it is."""
    try:
        return migrate_data(data, "")[0]
    except MoveError:
        return data


def migrate_override(item: str, data: dict) -> tuple[str | None, str | None]:
    """A `--set key=value` item under the key's new name (None: it sets nothing now), and the note
    (None: the key did not move). `data`: the config so far, for a move whose value changes form."""
    key, sep, value = item.partition("=")
    m = BY_OLD.get(key.strip()) if sep else None
    if not m:
        return item, None
    if not m.rule:
        return f"{m.new}={value}", note(m, f"--set {key.strip()}")
    section, old = _split(m.old)
    parsed = yaml.safe_load(value) if value.strip() else ""
    base = dict(data)
    if not m.merges and m.new:  # the --set overrides the file's value under the new name, as any --set does
        to, name = _split(m.new)
        base[to] = {k: v for k, v in _mapping(base.get(to)).items() if k != name}
    new, _ = migrate_data({**base, section: {**_mapping(base.get(section)), old: parsed}}, f"--set {key.strip()}")
    if not m.new or _split(m.new)[1] not in (new.get(_split(m.new)[0]) or {}):
        return None, note(m, f"--set {key.strip()}")
    to, name = _split(m.new)
    return f"{m.new}={flow(new[to][name])}", note(m, f"--set {key.strip()}")


SECTION = re.compile(r"^([A-Za-z_]\w*)\s*:")
KEY = re.compile(r"^(\s+)([A-Za-z_]\w*)(\s*:)")


@dataclass
class Entry:
    """One key of a section as written: its leading comment lines, its line, and the lines under it."""

    key: str
    lines: list[str]
    at: int  # index of the key's own line in `lines`
    moved: bool = False  # renamed by a move: it wins over a key of the same name the section had


@dataclass
class Block:
    """A top-level section as written: its header line, its keys, and what follows the last one."""

    name: str
    header: str
    entries: list[Entry]
    tail: list[str]


def _parse(text: str) -> tuple[list[str], list[Block]]:
    lines = text.splitlines(keepends=True)
    head: list[str] = []
    blocks: list[Block] = []
    pending: list[str] = []
    indent = None
    for line in lines:
        top = SECTION.match(line)
        if top:
            if blocks:
                blocks[-1].tail = pending
            elif pending:
                head += pending
            pending, indent = [], None
            blocks.append(Block(top.group(1), line, [], []))
            continue
        if not blocks:
            head.append(line)
            continue
        k = KEY.match(line)
        depth = len(line) - len(line.lstrip(" "))
        if k and (indent is None or depth == indent):
            indent = depth
            blocks[-1].entries.append(Entry(k.group(2), [*pending, line], len(pending)))
            pending = []
        elif blocks[-1].entries and line.strip() and indent is not None and depth > indent:
            blocks[-1].entries[-1].lines += [*pending, line]
            pending = []
        else:
            pending.append(line)
    if blocks:
        blocks[-1].tail = pending
    else:
        head += pending
    return head, blocks


def _renamed(line: str, new: str, value: Any = GONE) -> str:
    """The key's line under its new name (and value), a trailing comment kept in its column."""
    k = KEY.match(line)
    assert k
    body, comment, column = line[k.end(2) :].rstrip("\n"), "", 0
    hit = re.search(r"\s+(#.*)$", body)
    if hit:
        body, comment, column = body[: hit.start()], hit.group(1), k.end(2) + hit.start(1)
    if value is not GONE:
        body = f": {flow(value)}"
    out = k.group(1) + new + body
    if comment:  # at the column it had, or one space after a line that grew past it
        out += " " * max(1, column - len(out)) + comment
    return out + "\n"


def migrate_text(text: str, order: tuple[str, ...] = ()) -> tuple[str, list[Move]]:
    """A config file's text with moved keys renamed, and moved to their new section, where they stand
    there: comments, order and layout kept (a key's comment lines go with it; a comment after it keeps
    its column). A new section is placed in `order` (the schema's); a section left empty goes. Reads
    the block layout YAML configs are written in (`section:`, then its keys indented); the caller
    checks that the result loads to what the old text migrates to. Also returns the moves made."""
    want, _, writers, _ = _migrate(yaml.safe_load(text) or {}, "")
    head, blocks = _parse(text)
    moved: list[Move] = []
    arriving: dict[str, list[Entry]] = {}
    for b in blocks:
        kept = []
        for e in b.entries:
            m = BY_OLD.get(f"{b.name}.{e.key}")
            if not m:
                kept.append(e)
                continue
            moved.append(m)
            to, name = _split(m.new) if m.new else ("", "")
            value = (want.get(to) or {}).get(name, GONE) if m.rule and writers.get(m.new) == m.old else GONE
            if not m.new or (m.rule and value is GONE):
                continue  # the key leaves (or another old key beside it gave the value): its comment lines with it
            e.lines[e.at] = _renamed(e.lines[e.at], name, value)
            e.lines[-1] += "" if e.lines[-1].endswith("\n") else "\n"
            e.key, e.moved = name, True
            if to == b.name:
                kept.append(e)
            else:
                arriving.setdefault(to, []).append(e)
        b.entries = [e for e in kept if e.moved or not any(x.moved and x.key == e.key for x in kept)]
    names = [b.name for b in blocks]
    for to, entries in arriving.items():
        if to not in names:
            later = [
                i
                for i, b in enumerate(blocks)
                if to in order and b.name in order and order.index(b.name) > order.index(to)
            ]
            at = later[0] if later else len(blocks)
            blocks.insert(at, Block(to, f"{to}:\n", [], []))
            names.insert(at, to)
        block = blocks[names.index(to)]
        for e in entries:  # a rule's new value replaces the key the section had
            block.entries = [x for x in block.entries if x.key != e.key] + [e]
    out = list(head)
    for b in blocks:
        if not b.entries and b.name in {_split(m.old)[0] for m in moved}:
            out += b.tail  # the section the moves emptied goes; what stood after its keys stays
            continue
        out += [b.header, *(line for e in b.entries for line in e.lines), *b.tail]
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    return "".join(out), moved
