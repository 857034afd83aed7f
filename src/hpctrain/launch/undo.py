"""What a submission wrote before sbatch refused it, removed again: a refused job leaves its run
directory as it found it. A new run leaves no directory; an earlier attempt's run keeps every file
it had (its snapshots, its submitit logs, `code/latest`), and loses only what this one added."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hpctrain.run.layout import CODE
from hpctrain.run.source import LATEST, make_removable


@dataclass(frozen=True)
class Before:
    """A run directory's parts as a submission found them."""

    new: Path | None  # the highest directory on the way to the run directory that did not exist yet
    entries: dict[Path, frozenset[str] | None]  # each part's entries (None: the part did not exist)
    latest: str | None  # `code/latest`'s text (None: no such file)


def entries(d: Path) -> frozenset[str] | None:
    """The names in `d` (None: no directory)."""
    return frozenset(p.name for p in d.iterdir()) if d.is_dir() else None


def first_missing(d: Path) -> Path | None:
    """The highest of `d` and its parents that does not exist (None: `d` exists)."""
    new = None
    while not d.exists():
        new, d = d, d.parent
    return new


def remove(path: Path) -> None:
    """Remove a file or a tree, read-only snapshot directories included (ours only)."""
    if path.is_dir() and not path.is_symlink():
        make_removable(path)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def look(run_dir: Path, parts: tuple[str, ...]) -> Before:
    latest = run_dir / CODE / LATEST
    return Before(
        first_missing(run_dir),
        {run_dir / part: entries(run_dir / part) for part in parts},
        latest.read_text() if latest.is_file() else None,
    )


def put_back(run_dir: Path, before: Before) -> None:
    """Remove what appeared since `before`; `code/latest` names the snapshot it named."""
    if before.new is not None:
        remove(before.new)
        return
    for part, had in before.entries.items():
        if had is None:
            remove(part)
            continue
        for name in (entries(part) or frozenset()) - had:
            remove(part / name)
    if before.latest is not None:
        (run_dir / CODE / LATEST).write_text(before.latest)


@contextmanager
def undone_on(errors: tuple[type[BaseException], ...], run_dir: Path, parts: tuple[str, ...]) -> Iterator[None]:
    """Run the block; when it raises one of `errors` (sbatch refused: nothing was submitted), remove
    what it wrote in `run_dir`'s `parts` (and `run_dir` itself, or the parents it created)."""
    before = look(run_dir, parts)
    try:
        yield
    except errors:
        put_back(run_dir, before)
        raise
