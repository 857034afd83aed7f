"""What both loaders do to an image (crop, flip, resize, RandAugment, erasing, eval resize), as one value.

Built once from the config (`data/build.py: augment_spec`) and handed to the torch loader and the DALI
loader alike, so the two cannot read a data.* option differently (tests/data/test_dali.py compares
their batches). Torch- and DALI-free: data.build imports it light.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.config import Config
from hpctrain.randaug_spec import RandAugSpec, parse_randaugment


@dataclass(frozen=True)
class AugmentSpec:
    img_size: int  # model.img_size: the side of the square the loaders yield
    crop_pct: float  # data.crop_pct: eval centre crop / resized short side
    scale_min: float  # data.scale_min: the train crop's smallest area fraction
    hflip: float  # aug.hflip: probability of a horizontal flip (train)
    mean: tuple[float, ...]  # data.mean: per-channel mean (0-1 scale), subtracted after the crop
    std: tuple[float, ...]  # data.std: per-channel std (0-1 scale)
    randaugment: RandAugSpec | None  # aug.randaugment parsed (DALI only; None: off)
    interpolation: str = "bilinear"  # data.interpolation: of every resize
    reprob: float = 0.0  # aug.erase_prob: random erasing's probability, after normalisation (train)
    remode: str = "pixel"  # aug.erase_mode: what fills an erased box
    recount: int = 1  # aug.erase_count: boxes per erased image
    eval_resize: str = "crop"  # data.eval_resize: crop (short side, centre crop) or squash (whole image)
    crop: str = "timm"  # data.crop: timm (random resized crop) or tf_inception (data/tf_crop.py)
    antialias: bool = True  # data.antialias: of the train crop's resize


def augment_spec(cfg: Config) -> AugmentSpec:
    """The spec a config asks for: model.img_size and the data.* options above."""
    d = cfg.data
    return AugmentSpec(
        cfg.model.img_size,
        d.crop_pct,
        d.scale_min,
        cfg.aug.hflip,
        tuple(d.mean),
        tuple(d.std),
        parse_randaugment(cfg.aug.randaugment),
        interpolation=d.interpolation,
        reprob=cfg.aug.erase_prob,
        remode=cfg.aug.erase_mode,
        recount=cfg.aug.erase_count,
        eval_resize=d.eval_resize,
        crop=d.crop,
        antialias=d.antialias,
    )
