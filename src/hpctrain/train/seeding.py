"""The random streams of a run: each step's seed on each rank, and the RNG state a checkpoint keeps,
so that a resumed run draws what an uninterrupted one would (drop-path masks, mixup)."""

from __future__ import annotations

import random

import torch


def rng_state(device: torch.device) -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def set_rng_state(st: dict, device: torch.device) -> None:
    """Put back what `rng_state` read (on the same device)."""
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


def step_seed(seed: int, step: int, rank: int) -> int:
    """Global RNG seed of one step on one rank (drop-path masks): resume-exact by construction."""
    return (seed * 1_000_003 + step * 7_919 + rank * 104_729) % (2**63)


def seed_step(seed: int, device: torch.device) -> None:
    """`torch.manual_seed` for the generators a step draws from (CPU, this GPU), without the
    ~0.3 ms it spends seeding every backend: measurable on small models (bench/loop_overhead.py)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
