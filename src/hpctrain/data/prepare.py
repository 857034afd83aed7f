"""Make sure the configured dataset exists before a run (only the demo set is made on demand)."""

from __future__ import annotations

import fcntl
from pathlib import Path

from hpctrain.config import Config


def ensure_dataset(cfg: Config) -> None:
    """With `data.prepare: digits`, write the digits folder at data.root once (locked)."""
    if cfg.data.prepare != "digits" or cfg.data.loader == "synthetic":
        return
    root = Path(cfg.data.root)
    done = root / ".complete"
    if done.exists() or ((root / "train").is_dir() and (root / "val").is_dir()):
        return
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            from hpctrain.data.digits import write_digits

            counts = write_digits(root)
            done.write_text(f"{counts}\n")
            print(f"wrote the digits dataset to {root}: {counts['train']} train, {counts['val']} val images")
