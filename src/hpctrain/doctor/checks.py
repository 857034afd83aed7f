"""A finding of `hpctrain doctor`: what was looked at, how it stands, and what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    section: str
    name: str
    status: str  # ok | info | warn | fail
    value: str
    hint: str = ""
