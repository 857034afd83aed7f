"""Make sure the configured dataset exists before a run (only the demo set is made on demand)."""

from __future__ import annotations

from pathlib import Path

from hpctrain.config import Config
from hpctrain.data.once import make_once


def ensure_dataset(cfg: Config) -> None:
    """With `data.prepare: digits`, write the digits folder at data.root once (locked)."""
    if cfg.data.prepare != "digits" or cfg.data.loader == "synthetic":
        return
    root = Path(cfg.data.root)
    if (root / "train").is_dir() and (root / "val").is_dir():
        return

    def make() -> str:
        from hpctrain.data.digits import write_digits

        counts = write_digits(root)
        print(f"wrote the digits dataset to {root}: {counts['train']} train, {counts['val']} val images")
        return f"{counts}\n"

    make_once(root / ".complete", root / ".lock", make)
