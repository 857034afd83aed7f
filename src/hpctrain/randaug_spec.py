"""The RandAugment spec (`aug.randaugment`): parsing and checking only, without numpy, torch or DALI,
so config validation runs on a login node with the base dependencies (`hpctrain.data.randaug` runs it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LEVEL_DENOM = 10.0  # timm _LEVEL_DENOM: M10 is the strongest


@dataclass(frozen=True)
class RandAugSpec:
    n: int  # ops per image
    m: float  # magnitude, 0-10
    mstd: float = 0.0  # std of the per-op magnitude noise (0: none)
    inc: bool = True  # timm's increasing-severity op variants
    p: float = 0.5  # probability that a chosen op applies (timm 0.5; big_vision's randaug: 1)


def parse_randaugment(spec: str) -> RandAugSpec | None:
    """'N,M' (= timm rand-nN-mM-inc1) or a timm string 'rand-m9-mstd0.5-inc1' (sections m, n, mstd, inc,
    p as timm's rand_augment_transform reads them); empty → None.

    Raises ValueError with a one-line message (DataConfig.validate turns it into a ConfigError).
    """
    s = spec.strip()
    if not s:
        return None
    hint = (
        "give 'N,M' (e.g. '2,9') or timm's string (e.g. 'rand-m9-mstd0.5-inc1'); leave it empty to turn RandAugment off"
    )
    if s.startswith("rand"):
        parts = s.split("-")
        if parts[0] != "rand":
            raise ValueError(f"aug.randaugment={spec!r} is not a RandAugment spec: {hint}")
        n, m, mstd, inc, prob = 2, LEVEL_DENOM, 0.0, False, 0.5  # timm's defaults (rand_augment_transform)
        for part in parts[1:]:
            key, val = re.match(r"([a-z]*)(.*)", part).groups()
            if key not in ("m", "n", "mstd", "inc", "p"):
                raise ValueError(
                    f"aug.randaugment={spec!r}: section {part!r} is not supported (m, n, mstd, inc, p are); drop it"
                )
            try:
                num = float(val)
            except ValueError:
                raise ValueError(f"aug.randaugment={spec!r}: section {part!r} has no number; {hint}") from None
            if key == "m":
                m = num
            elif key == "n":
                n = int(num)
            elif key == "mstd":
                mstd = num
            elif key == "p":
                prob = num
            else:
                inc = bool(num)
    else:
        try:
            n_s, m_s = s.split(",")
            n, m, mstd, inc, prob = int(n_s), float(m_s), 0.0, True, 0.5
        except ValueError:
            raise ValueError(f"aug.randaugment={spec!r} is not 'N,M': {hint}") from None
    if n < 1:
        raise ValueError(f"aug.randaugment={spec!r}: N (ops per image) must be >= 1; leave it empty for none")
    if not 0 <= m <= LEVEL_DENOM:
        raise ValueError(
            f"aug.randaugment={spec!r}: M={m:g} is outside 0..10 (timm's scale: M9 rotates "
            "by up to 27°, M10 is the strongest); e.g. '2,9'"
        )
    if not 0 <= mstd <= 100:
        raise ValueError(f"aug.randaugment={spec!r}: mstd must be in 0..100 (e.g. mstd0.5)")
    if not 0 < prob <= 1:
        raise ValueError(f"aug.randaugment={spec!r}: p must be in (0, 1] (e.g. p0.5)")
    return RandAugSpec(n, m, mstd, inc, prob)
