"""PIL + torch DataLoader over an ImageNet-layout folder.

Workers decode and crop to uint8; normalisation to float happens on the training device, where
it is cheap (docs/data.md "Data": float normalisation in the workers is the PIL path's largest cost).
Each sample's random crop/flip is seeded by (seed, epoch, index), so batches do not depend on
the number of workers, ranks or resumes.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import default_collate

from hpctrain.data import erasing, sampling
from hpctrain.data.augment import AugmentSpec
from hpctrain.data.folder import DataError, Listing
from hpctrain.data.tf_crop import tf_inception_box

log = logging.getLogger("hpctrain")


def random_resized_crop_box(
    w: int, h: int, rng: np.random.Generator, scale: tuple[float, float], ratio: tuple[float, float] = (3 / 4, 4 / 3)
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (10 tries, then a centre crop of the clamped ratio)."""
    area = w * h
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        ar = math.exp(rng.uniform(*log_r))
        cw, ch = int(round(math.sqrt(target * ar))), int(round(math.sqrt(target / ar)))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return x, y, x + cw, y + ch
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        cw, ch = w, h
    x, y = (w - cw) // 2, (h - ch) // 2
    return x, y, x + cw, y + ch


def val_resize_size(img_size: int, crop_pct: float) -> int:
    return int(math.floor(img_size / crop_pct))


def open_rgb(path: Path) -> Image.Image:
    try:
        img = Image.open(path)
        img.load()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DataError(
            f"cannot decode image {path}: {e}. Exclude bad files with "
            "`hpctrain data prepare-imagenet ROOT --exclude-bad` and data.exclude_file"
        ) from None
    return img.convert("RGB")


INTERP = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}  # data.interpolation → PIL filter


def resize_no_antialias(img: Image.Image, box: tuple[int, int, int, int], size: int, interpolation: str) -> np.ndarray:
    """The box resized to size² without antialiasing, as tf.image.resize(antialias=False): PIL widens its
    filter on every downscale, torch's interpolate with half-pixel centres (align_corners=False) does not.
    uint8 in, channels-last: torch's fixed-point kernel, ~8× faster here than float (within 1 of it)."""
    crop = torch.from_numpy(np.array(img.crop(box)))[None].permute(0, 3, 1, 2)
    out = torch.nn.functional.interpolate(
        crop, size=(size, size), mode=interpolation, align_corners=False, antialias=False
    )
    return out[0].permute(1, 2, 0).numpy()


def train_transform(
    img: Image.Image,
    size: int,
    rng: np.random.Generator,
    scale_min: float,
    hflip: float,
    interpolation: str = "bilinear",
    crop: str = "timm",
    antialias: bool = True,
) -> np.ndarray:
    """data.crop picks the box (timm's or TensorFlow's sampler), data.antialias the resize."""
    if crop == "tf_inception":
        box = tf_inception_box(img.width, img.height, rng, (scale_min, 1.0))
    else:
        box = random_resized_crop_box(img.width, img.height, rng, (scale_min, 1.0))
    if antialias:
        out = np.asarray(img.resize((size, size), INTERP[interpolation], box=box), dtype=np.uint8)
    else:
        out = resize_no_antialias(img, box, size, interpolation)
    if rng.random() < hflip:
        out = out[:, ::-1]
    return out


def val_transform(
    img: Image.Image, size: int, crop_pct: float, interpolation: str = "bilinear", resize: str = "crop"
) -> np.ndarray:
    """data.eval_resize: crop (short side, then centre crop) or squash (the whole image to size²)."""
    if resize == "squash":
        return np.asarray(img.resize((size, size), INTERP[interpolation]), dtype=np.uint8)
    short = val_resize_size(size, crop_pct)
    w, h = img.size
    if w <= h:
        nw, nh = short, max(1, int(round(h * short / w)))
    else:
        nw, nh = max(1, int(round(w * short / h))), short
    img = img.resize((nw, nh), INTERP[interpolation])
    x, y = int(round((nw - size) / 2.0)), int(round((nh - size) / 2.0))
    return np.asarray(img.crop((x, y, x + size, y + size)), dtype=np.uint8)


class FolderDataset(torch.utils.data.Dataset):
    """Items are (index, epoch, repeat) → (uint8 HWC array, label, bad path, erased-pixel mask, their values,
    the item itself: the batch carries the samples it holds to the main process, log.sample_hashes)."""

    def __init__(self, listing: Listing, train: bool, aug: AugmentSpec, seed: int, skip_bad: bool = False):
        self.listing, self.train, self.size, self.seed = listing, train, aug.img_size, seed
        self.eval_resize, self.crop, self.antialias = aug.eval_resize, aug.crop, aug.antialias
        self.crop_pct, self.scale_min, self.hflip, self.skip_bad = aug.crop_pct, aug.scale_min, aug.hflip, skip_bad
        self.interpolation, self.recount, self.remode = aug.interpolation, aug.recount, aug.remode
        self.reprob = aug.reprob if train else 0.0  # random erasing: train only

    def __len__(self) -> int:
        return len(self.listing)

    def __getitem__(
        self, item: tuple[int, int, int]
    ) -> tuple[torch.Tensor, int, str, torch.Tensor, torch.Tensor, tuple[int, int, int]]:
        """(index, epoch, repeat) → (image, label, path of a bad file skipped for it or '', the (H, W) mask
        of erased pixels and their values: erasing.erase_fill, here in the worker, not per box on the device;
        the item)."""
        index, epoch, copy = item
        bad = ""
        for attempt in range(len(self.listing)):
            rel, label = self.listing.samples[(index + attempt) % len(self.listing)]
            try:
                img = open_rgb(self.listing.root / rel)
                break
            except DataError:
                if not self.skip_bad:
                    raise
                bad = bad or str(self.listing.root / rel)  # stand in the next sample, deterministically
        mask, values = torch.zeros(0, 0, dtype=torch.bool), torch.zeros(0)
        if self.train:
            rng = np.random.default_rng(sampling.sample_seed(self.seed, epoch, index, copy))
            arr = train_transform(
                img, self.size, rng, self.scale_min, self.hflip, self.interpolation, self.crop, self.antialias
            )
            if self.reprob > 0:  # drawn after the crop/flip: reprob=0 leaves those draws as they were
                boxes = erasing.erase_boxes(self.size, self.size, rng, self.reprob, self.recount)
                noise_seed = int(rng.integers(0, 2**62))
                mask, values = erasing.erase_fill(
                    torch.from_numpy(boxes), noise_seed, self.remode, 3, self.size, self.size
                )
        else:
            arr = val_transform(img, self.size, self.crop_pct, self.interpolation, self.eval_resize)
        return torch.from_numpy(arr.copy()), label, bad, mask, values, item


def collate(items: list[tuple]) -> list:
    """[images, labels, bad paths] as default_collate makes them, the batch's erasing packed into one
    buffer (erasing.pack; empty without erasing), so the main thread makes one copy of it to the device,
    and the (index, epoch, repeat) of its samples (N, 3): which samples the batch holds, as read."""
    out = default_collate([item[:3] for item in items])
    masks = [item[3] for item in items]
    packed = (
        erasing.pack(torch.stack(masks), torch.cat([item[4] for item in items]))
        if masks[0].numel()
        else torch.zeros(0, dtype=torch.uint8)
    )
    return [*out, packed, torch.tensor([item[5] for item in items], dtype=torch.int64).reshape(-1, 3)]


class _BatchSampler:
    """Yields lists of (index, epoch, repeat) for the current epoch, from a start batch."""

    def __init__(self, loader: TorchLoader):
        self.loader = loader

    def __iter__(self):
        ld = self.loader
        if ld.train:
            batches = sampling.train_batches(
                len(ld.dataset), ld.chunk, ld.rank, ld.world, ld.seed, ld.epoch, ld.start, ld.repeats
            )
            copies = sampling.train_copies(len(ld.dataset), ld.chunk, ld.rank, ld.world, ld.start, ld.repeats)
        else:
            idx = sampling.eval_indices(len(ld.dataset), ld.rank, ld.world)
            batches = [idx[i : i + ld.batch_size] for i in range(0, len(idx), ld.batch_size)]
            copies = [np.zeros(len(b), dtype=np.int64) for b in batches]
        for b, c in zip(batches, copies):
            yield [(int(i), ld.epoch, int(k)) for i, k in zip(b, c)]

    def __len__(self) -> int:
        return len(self.loader) - self.loader.start


class Normalizer:
    """uint8 NHWC batch → normalised float NCHW on the device (channels_last memory)."""

    def __init__(self, mean, std, device: torch.device):
        self.device = device
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1) * 255.0
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1) * 255.0

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float()
        return (x - self.mean) / self.std


class TorchLoader:
    """A `data.loader.Loader` (docs/data.md, "The loader contract") over a PIL DataLoader. Train: `chunk`
    is the micro-step's global batch the ranks split (data.sampling; 0: batch_size × world, even), and
    `batch_size` this rank's share of it."""

    def __init__(
        self,
        listing: Listing,
        *,
        train: bool,
        batch_size: int,
        rank: int,
        world: int,
        seed: int,
        workers: int,
        device: torch.device,
        aug: AugmentSpec,
        skip_bad: bool = False,
        repeats: int = 0,
        chunk: int = 0,
    ):
        self.chunk = chunk or batch_size * world
        if train and sampling.rank_batch(self.chunk, rank, world) != batch_size:
            raise ValueError(
                f"rank {rank} of {world} takes {sampling.rank_batch(self.chunk, rank, world)} of a "
                f"chunk of {self.chunk}, not batch_size={batch_size}"
            )
        self.train, self.batch_size, self.rank, self.world, self.seed = train, batch_size, rank, world, seed
        self.last_samples: sampling.BatchSamples | None = None
        self.epoch, self.start, self.repeats, self.aug = 0, 0, repeats, aug
        self.dataset = FolderDataset(listing, train, aug, seed, skip_bad)
        self.skipped: list[str] = []  # bad files skipped so far (data.on_bad_sample=skip)
        self.normalize = Normalizer(aug.mean, aug.std, device)
        self.device = device
        gen = torch.Generator().manual_seed(seed)  # iterators must not draw from the global RNG
        self._dl = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=_BatchSampler(self),
            num_workers=workers,
            pin_memory=device.type == "cuda",
            persistent_workers=workers > 0,
            generator=gen,
            collate_fn=collate,
            prefetch_factor=4 if workers > 0 else None,
            # workers start from a fresh interpreter, not a fork of this one: a fork copies a trainer's
            # threads' locks and half-done state (DALI, gloo/NCCL, the watchdog) and its workers can
            # die of it (SIGSEGV in a worker, seen in CI); Python 3.14 makes forkserver the default
            multiprocessing_context="forkserver" if workers > 0 else None,
        )
        if train and len(self) == 0:
            raise DataError(
                f"{listing.root}: {len(listing)} images make no full global batch of "
                f"{self.chunk}; lower data.global_batch"
            )

    def __len__(self) -> int:
        if self.train:
            return sampling.train_len(len(self.dataset), self.chunk, self.repeats)
        n = len(sampling.eval_indices(len(self.dataset), self.rank, self.world))
        return math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Next iteration reads epoch `epoch` from batch `start` (resume position)."""
        self.epoch, self.start = epoch, start

    def __iter__(self):
        for images, labels, bad, packed, keys in self._dl:
            for path in filter(None, bad):
                self.skipped.append(path)
                log.warning(
                    "skipped unreadable image %s (%d skipped so far; data.on_bad_sample=skip)", path, len(self.skipped)
                )
            self.last_samples = sampling.BatchSamples(int(keys[0, 1]), keys[:, 0].numpy(), keys[:, 2].numpy())
            x = self.normalize(images)
            if packed.numel():
                erasing.fill_packed(x, packed)
            yield x, labels.to(self.device, non_blocking=True)
