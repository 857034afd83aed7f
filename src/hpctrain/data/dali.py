"""NVIDIA DALI loaders: GPU (nvJPEG, `mixed`) decoding on GPU nodes, the same pipeline on CPUs elsewhere.

Sampling is the rule of `data/sampling.py`, shared with the PIL loader: every epoch has one
permutation per (seed, epoch); rank r reads its share of each micro-step's chunk (its own batch size,
the same every micro-step: uneven over ranks where the world does not divide it). Each rank's file list
for the epoch goes to `fn.readers.file`, so the torch and DALI loaders put the same images in the
same optimizer steps, for any world size, and exclusions and class order come from `list_split`.
WebDataset shards (`data pack`) are read by `fn.readers.webdataset`, sharded by the global rank.

One pipeline per epoch, seeded by (seed, epoch, rank): epochs do not depend on each other, so a
resume at batch k of an epoch rebuilds that epoch's pipeline and discards its first k batches
(decode cost at most one epoch of this rank's share, paid once per resume) and then continues
bit for bit as the uninterrupted run would. The graph is traced from Python once per loader and
each epoch's pipeline deserialised from it with the epoch's seed and file list (a built DALI
pipeline cannot be reseeded; the trace is most of a build: docs/data.md).

Evaluation shards the sorted val list by the global rank with `pad_last_batch`; the padded
samples get label -1 and are not counted, so top-1 is exact for any world size.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from hpctrain.config import Config, ConfigError
from hpctrain.data import dali_compat, erasing, randaug, sampling
from hpctrain.data.augment import AugmentSpec
from hpctrain.data.folder import DataError, Listing, class_mismatch, read_exclusions, train_eval_listings
from hpctrain.data.stage import stage
from hpctrain.data.tf_crop import dali_tf_inception_box
from hpctrain.data.torch_loader import val_resize_size
from hpctrain.data.wds import WdsShards, find_shards

log = logging.getLogger("hpctrain")
PREFETCH = 2  # batches decoded ahead
IMAGE_EXTS_WDS = "jpg;jpeg;png;bmp;webp;tif;tiff"
ERASE_INPUTS = ("erase_anchor", "erase_shape")  # the erase boxes' external sources, fed per run
FIX_HINT = "exclude bad files with `hpctrain data prepare-imagenet ROOT --exclude-bad FILE` and data.exclude_file=FILE"
WDS_FIX_HINT = (
    "pack the shards again: `hpctrain data pack ROOT OUT` checks every image and, with "
    "--exclude-bad FILE, leaves the bad ones out"
)


def pipeline_seed(*parts: int) -> int:
    """A DALI seed (31-bit) from several integers."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def shard_range(n: int, shard: int, shards: int) -> tuple[int, int]:
    """DALI's contiguous shard of n samples (`start = n * shard // shards`)."""
    return n * shard // shards, n * (shard + 1) // shards


def interp_type(aug: AugmentSpec):
    """DALI's interpolation for `aug.interpolation` (data.interpolation)."""
    from nvidia.dali import types  # DALI: optional (the torch loader runs without it)

    return types.INTERP_CUBIC if aug.interpolation == "bicubic" else types.INTERP_LINEAR


# ----------------------------------------------------------------------------- pipelines


def _read(src, reader: dict):
    from nvidia.dali import fn, types  # DALI: optional (the torch loader runs without it)

    if src == "folder":
        return fn.readers.file(name="Reader", **reader)
    jpegs, labels = fn.readers.webdataset(
        name="Reader",
        ext=[IMAGE_EXTS_WDS, "lbl"],
        dtypes=[types.UINT8, types.INT64],
        missing_component_behavior="error",
        **reader,
    )
    return jpegs, labels


def crop_args(scale_min: float) -> dict:
    """fn.decoders.image_random_crop's sampling as timm's RandomResizedCrop: area fraction uniform in
    [scale_min, 1], aspect log-uniform in [3/4, 4/3], 10 attempts, then the whole image with its ratio
    clamped into range, centred (docs/recipes.md has the measured match)."""
    return dict(random_area=[scale_min, 1.0], random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)


def _erase(images, aug: AugmentSpec, boxes):
    """timm's RandomErasing on normalised CHW images. DALI's fn.erase fills a box with one constant, so
    it erases a mask of ones instead and the images take N(0,1) noise (fn.random.normal, per value for
    `pixel`, per channel for `rand`) where the mask is 0: x·keep + noise·(1 − keep), exact outside.
    The noise's shape is the configured one, not `images.shape()`: on GPU images that is a GPU→CPU
    edge the executor orders after the batch's GPU work (docs/data.md); the draws are the same."""
    from nvidia.dali import fn, types  # DALI: optional (the torch loader runs without it)

    anchor, shape = boxes
    keep = fn.erase(images * 0.0 + 1.0, anchor=anchor, shape=shape, axis_names="HW", fill_value=0.0)
    if aug.remode == "const":
        return images * keep
    dev = "gpu" if images.device == "gpu" else "cpu"
    size = [3, aug.img_size, aug.img_size] if aug.remode == "pixel" else [3, 1, 1]
    noise = fn.random.normal(device=dev, shape=size, dtype=types.FLOAT)
    return images * keep + noise * (1.0 - keep)


def _train_graph(src: str, reader: dict, aug: AugmentSpec, decoder: str, erase_source=None):
    from nvidia.dali import fn, types  # DALI: optional (the torch loader runs without it)

    jpegs, labels = _read(src, reader)
    if aug.crop == "tf_inception":  # DALI's sampler is timm's: TF's box drawn in the graph, ROI-decoded
        anchor, size = dali_tf_inception_box(fn.peek_image_shape(jpegs), (aug.scale_min, 1.0))
        images = fn.decoders.image_slice(
            jpegs,
            anchor,
            size,
            device=decoder,
            output_type=types.RGB,
            axis_names="WH",
            normalized_anchor=False,
            normalized_shape=False,
        )
    else:
        images = fn.decoders.image_random_crop(jpegs, device=decoder, output_type=types.RGB, **crop_args(aug.scale_min))
    images = fn.resize(images, size=[aug.img_size, aug.img_size], interp_type=interp_type(aug), antialias=aug.antialias)
    if aug.randaugment:  # timm's RandAugment (magnitudes, op set, noise): data/randaug.py
        images = randaug.apply(images, aug.randaugment, aug.img_size)
    mirror = fn.random.coin_flip(probability=aug.hflip) if aug.hflip > 0 else 0
    images = fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        output_layout="CHW",
        mirror=mirror,
        mean=[255.0 * m for m in aug.mean],
        std=[255.0 * s for s in aug.std],
    )
    if aug.reprob > 0:
        if erase_source is None:  # fed before each run (a deserialised pipeline keeps no Python callback)
            boxes = tuple(fn.external_source(name=n, batch=True, dtype=types.FLOAT) for n in ERASE_INPUTS)
        else:
            boxes = fn.external_source(source=erase_source, num_outputs=2, batch=True, dtype=types.FLOAT)
        images = _erase(images, aug, boxes)
    return images, labels


def _val_graph(src: str, reader: dict, aug: AugmentSpec, decoder: str, erase_source=None):
    from nvidia.dali import fn, types  # DALI: optional (the torch loader runs without it)

    jpegs, labels = _read(src, reader)
    images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
    norm = dict(mean=[255.0 * m for m in aug.mean], std=[255.0 * s for s in aug.std])
    if aug.eval_resize == "squash":  # the whole image to img_size², as vit_jax's tf.image.resize
        images = fn.resize(images, size=[aug.img_size, aug.img_size], interp_type=interp_type(aug), antialias=True)
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", **norm), labels
    images = fn.resize(
        images, resize_shorter=val_resize_size(aug.img_size, aug.crop_pct), interp_type=interp_type(aug), antialias=True
    )
    images = fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        output_layout="CHW",
        crop=[aug.img_size, aug.img_size],
        crop_pos_x=0.5,
        crop_pos_y=0.5,
        **norm,
    )
    return images, labels


def pipeline_args(*, batch_size: int, threads: int, device: torch.device, seed: int) -> dict:
    """The Pipeline's and Pipeline.deserialize's keyword arguments; the executor's are named by this
    DALI's version (dali_compat.executor_args: 1.32 has no exec_dynamic)."""
    gpu = device.type == "cuda"
    device_id = (device.index if device.index is not None else torch.cuda.current_device()) if gpu else None
    return dict(
        batch_size=batch_size,
        num_threads=max(1, threads),
        seed=seed,
        device_id=device_id,
        prefetch_queue_depth=PREFETCH,
        **dali_compat.executor_args(),
    )


def trace_pipeline(train: bool, src: str, reader: dict, aug: AugmentSpec, args: dict, erase_source=None):
    """The pipeline defined from Python, not built: with RandAugment (a conditional graph, traced by
    DALI's autograph) this is most of a build's cost (docs/data.md). erase_source: as build_pipeline's;
    None feeds the boxes through the ERASE_INPUTS external sources."""
    from nvidia.dali import pipeline_def  # DALI: optional (the torch loader runs without it)

    graph = _train_graph if train else _val_graph
    decoder = "mixed" if args["device_id"] is not None else "cpu"

    @pipeline_def(enable_conditionals=bool(train and aug.randaugment))
    def pipe():
        return graph(src, reader, aug, decoder, erase_source)

    with warnings.catch_warnings():  # RandAugment warns from inside DALI's own code
        warnings.simplefilter("ignore", DeprecationWarning)
        return pipe(**args)


def build_pipeline(
    train: bool,
    src: str,
    reader: dict,
    aug: AugmentSpec,
    *,
    batch_size: int,
    threads: int,
    device: torch.device,
    seed: int,
    erase_source=None,
):
    """A built DALI pipeline: outputs (float CHW images, labels). erase_source: iteration → (anchors,
    shapes) of the batch's erase boxes (train with aug.erase_prob > 0)."""
    p = trace_pipeline(
        train,
        src,
        reader,
        aug,
        pipeline_args(batch_size=batch_size, threads=threads, device=device, seed=seed),
        erase_source,
    )
    with warnings.catch_warnings():  # as in trace_pipeline
        warnings.simplefilter("ignore", DeprecationWarning)
        p.build()
    return p


def _outputs(pipe, device: torch.device):
    """The next batch. On CUDA with DALI's dynamic executor it is bound to torch's current stream (the
    copy in _to_torch is ordered after DALI's work on the GPU); outputs() without a stream waits on
    the host for that work (DALI 2.4 pipeline.py, docs/data.md). The legacy executor (DALI 1.32) has
    no stream-bound outputs: its outputs() waits on the host for the batch's GPU work (docs/data.md)."""
    if device.type == "cuda" and getattr(pipe, "exec_dynamic", False):
        return pipe.outputs(cuda_stream=torch.cuda.current_stream(device))
    return pipe.outputs()


def _to_torch(out, device: torch.device) -> torch.Tensor:
    """A DALI TensorList (dense batch) → torch tensor on `device`."""
    if device.type == "cuda":
        # DALI: optional (the torch loader runs without it)
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        t = out.as_tensor()
        buf = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=device)
        feed_ndarray(t, buf, cuda_stream=torch.cuda.current_stream(device))
        return buf
    return torch.from_numpy(out.as_array())


# ----------------------------------------------------------------------------- bad files


class _CpuDecoder:
    """DALI's CPU image decoder on one encoded image at a time: after a failed batch, to find the
    sample that failed (a batch's error names none). Built once, rebuilt after a failure (a failed
    run leaves a pipeline unusable)."""

    def __init__(self):
        self.pipe = None

    @staticmethod
    def _build():
        from nvidia.dali import fn, pipeline_def  # DALI: optional (the torch loader runs without it)

        @pipeline_def(
            batch_size=1, num_threads=1, device_id=None, exec_pipelined=False, exec_async=False, prefetch_queue_depth=1
        )
        def one():
            return fn.decoders.image(fn.external_source(name="raw", dtype=None, ndim=1), device="cpu")

        p = one()
        p.build()
        return p

    def decodes(self, data: np.ndarray) -> bool:
        if data.size == 0:
            return False
        try:
            if self.pipe is None:
                self.pipe = self._build()
            self.pipe.feed_input("raw", [data])
            self.pipe.run()
            return True
        except Exception:  # noqa: BLE001 - any decoder failure marks the sample
            self.pipe = None
            return False


def first_undecodable(paths: list[Path]) -> Path | None:
    """The first file DALI cannot decode, tried one by one on the CPU (used only after a failure)."""
    dec, seen = _CpuDecoder(), set()
    for path in paths:
        if path in seen:
            continue
        seen.add(path)
        try:
            data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        except OSError:
            return path
        if not dec.decodes(data):
            return path
    return None


def wds_samples(shards: WdsShards):
    """(tar, key, image member, offset, size) of every sample, in the order DALI's webdataset reader
    numbers them (tars in order, each in its index's order): DALI's shards are ranges of it."""
    exts = set(IMAGE_EXTS_WDS.split(";"))
    for tar, idx in zip(shards.tars, shards.indices):
        for line in Path(idx).read_text().splitlines()[1:]:  # first line: `v1.2 <samples>`
            parts = line.split()
            comps = [parts[i : i + 4] for i in range(0, len(parts) - 3, 4)]  # ext offset size name
            img = next((c for c in comps if c[0] in exts), None)
            if img is not None:
                yield tar, img[3].rsplit(".", 1)[0], img[3], int(img[1]), int(img[2])


def first_undecodable_wds(shards: WdsShards, lo: int, hi: int) -> tuple[str, str, str] | None:
    """(tar, key, member) of the first sample in DALI's sample range [lo, hi) that does not decode."""
    dec = _CpuDecoder()
    with contextlib.ExitStack() as stack:
        handles: dict[str, BinaryIO] = {}
        for i, (tar, key, member, off, size) in enumerate(wds_samples(shards)):
            if i < lo:
                continue
            if i >= hi:
                break
            if tar not in handles:
                handles[tar] = stack.enter_context(open(tar, "rb"))
            handles[tar].seek(off)
            if not dec.decodes(np.frombuffer(handles[tar].read(size), dtype=np.uint8)):
                return tar, key, member
    return None


# ----------------------------------------------------------------------------- the loader


class _Epoch:
    """One epoch's pipeline; runs are scheduled only up to the epoch's end (no wasted decode).
    boxes: iteration → the erase boxes fed to the ERASE_INPUTS before that run (None: no erasing)."""

    def __init__(self, epoch: int, pipe, files, real: int, boxes=None, samples=None):
        self.epoch, self.pipe, self.files, self.real, self.boxes = epoch, pipe, files, real, boxes
        self.samples = samples  # (indices, repeats) in the order the reader's file list holds them (folder train)
        self.scheduled = 0

    def schedule(self, n: int) -> None:
        runs = PREFETCH if self.scheduled == 0 else int(self.scheduled < n)  # the first fills the queue
        if not runs:
            return
        if self.boxes is not None:
            for it in range(self.scheduled, self.scheduled + runs):
                for name, data in zip(ERASE_INPUTS, self.boxes(it)):
                    self.pipe.feed_input(name, data)
        self.pipe.schedule_run()
        self.scheduled += runs


class DaliLoader:
    """A `data.loader.Loader` (docs/data.md, "The loader contract") over DALI pipelines; one pipeline per
    epoch. Train: `chunk` is the micro-step's global batch the ranks split (data.sampling; 0: batch_size ×
    world, even), and `batch_size` this rank's share of it (its pipelines' batch size)."""

    def __init__(
        self,
        *,
        train: bool,
        aug: AugmentSpec,
        batch_size: int,
        rank: int,
        world: int,
        seed: int,
        threads: int,
        device: torch.device,
        listing: Listing | None = None,
        shards: WdsShards | None = None,
        repeats: int = 0,
        chunk: int = 0,
    ):
        if (listing is None) == (shards is None):
            raise ValueError("give a folder listing or WebDataset shards")
        self.chunk = chunk or batch_size * world
        if train and sampling.rank_batch(self.chunk, rank, world) != batch_size:
            raise ValueError(
                f"rank {rank} of {world} takes {sampling.rank_batch(self.chunk, rank, world)} of a chunk of "
                f"{self.chunk}, not batch_size={batch_size}"
            )
        self.last_samples: sampling.BatchSamples | None = None
        self.train, self.aug, self.batch_size, self.rank, self.world = train, aug, batch_size, rank, world
        self.seed, self.threads, self.device = seed, threads, device
        self.listing, self.shards, self.repeats = listing, shards, repeats
        self.size = len(listing) if listing is not None else shards.size
        self.epoch, self.start = 0, 0
        self.skipped: list[str] = []  # never grows: a bad file stops the run, named (data.on_bad_sample: torch loader)
        self._next: _Epoch | None = None  # the next epoch's pipeline, built ahead
        self._next_thread: threading.Thread | None = None
        self._graph: tuple[str, str] | None = None  # (reader arguments, serialised graph) last traced
        self._lists: tempfile.TemporaryDirectory | None = None  # the reader's file_list, rewritten per epoch
        self.traces = 0  # graphs traced from Python (the costly part of a build): 1 for a folder
        self._build_s = 0.0  # the last deserialised pipeline's build: how early the next one starts
        if train and len(self) == 0:
            where = listing.root if listing is not None else shards.tars[0]
            raise DataError(
                f"{where}: {self.size} images make no full global batch of {self.chunk}; lower data.global_batch"
            )

    # -- contract
    def __len__(self) -> int:
        if self.train:
            return sampling.train_len(self.size, self.chunk, self.repeats)
        lo, hi = shard_range(self.size, self.rank, self.world)
        return math.ceil((hi - lo) / self.batch_size)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Next iteration reads epoch `epoch` from batch `start` (resume position)."""
        self.epoch, self.start = epoch, start

    # -- what this rank reads
    def epoch_files(self, epoch: int) -> list[tuple[str, int]]:
        """(relative path, label) in the order this rank reads them (folder format)."""
        s = self.listing.samples
        return [s[int(i)] for i in self.epoch_indices(epoch)]

    def epoch_indices(self, epoch: int):
        """Sample indices in the order this rank reads them (folder format)."""
        if self.train:
            return np.concatenate(
                sampling.train_batches(
                    self.size, self.chunk, self.rank, self.world, self.seed, epoch, repeats=self.repeats
                )
            )
        return range(*shard_range(self.size, self.rank, self.world))

    def erase_source(self, epoch: int):
        """iteration → the batch's erase boxes (anchors, shapes as DALI's fn.erase takes them), drawn
        per sample from (seed, epoch, sample index, copy) in folder format, so they do not depend on the
        world size or a resume; WebDataset (order unknown here) and padding: from (seed, epoch, rank,
        position). One vectorised draw per batch (erasing.erase_boxes_batch), no generator per sample."""
        a, n = self.aug, self.batch_size
        idx = np.asarray(self.epoch_indices(epoch)) if self.listing is not None else np.zeros(0, np.int64)
        copies = (
            np.concatenate(sampling.train_copies(self.size, self.chunk, self.rank, self.world, repeats=self.repeats))
            if len(idx)
            else idx
        )

        def boxes(iteration: int):
            pos = iteration * n + np.arange(n)
            real = pos < len(idx)
            at = np.minimum(pos, max(len(idx) - 1, 0))
            keys = np.stack(
                [
                    np.where(real, 1, 2),
                    np.full(n, self.seed),
                    np.full(n, epoch),
                    np.where(real, idx[at] if len(idx) else 0, self.rank),
                    np.where(real, copies[at] if len(idx) else 0, pos),
                ],
                axis=1,
            )
            b = erasing.erase_boxes_batch(a.img_size, a.img_size, keys, a.reprob, a.recount).astype(np.float32)
            return list(b[..., :2].reshape(n, -1)), list(b[..., 2:].reshape(n, -1))

        return boxes

    def _reader(self, epoch: int) -> tuple[dict, list[tuple[str, int]] | None, int]:
        """fn.readers.* arguments, the file order (folder) and the number of real samples."""
        common = dict(pad_last_batch=True, random_shuffle=False, stick_to_shard=True)
        if self.listing is not None:
            if self.train:  # this rank's own list: shard 0 of 1, already shuffled
                files = self.epoch_files(epoch)
                common.update(shard_id=0, num_shards=1)
            else:  # the sorted val list, sharded by the global rank
                files = list(self.listing.samples)
                common.update(shard_id=self.rank, num_shards=self.world)
            reader = dict(
                file_root=str(self.listing.root),
                files=[f for f, _ in files],
                labels=[lab for _, lab in files],
                **common,
            )
            real = len(files) if self.train else len(self.epoch_files(epoch))
            return reader, (files if self.train else self.epoch_files(epoch)), real
        sh = self.shards
        reader = dict(paths=list(sh.tars), index_paths=list(sh.indices), **common)
        if self.train:  # shards move by one rank per epoch; the shuffle buffer mixes within
            reader.update(
                shard_id=(self.rank + epoch) % self.world,
                num_shards=self.world,
                random_shuffle=True,
                initial_fill=min(4096, max(1, sh.size // self.world)),
            )
            return reader, None, len(self) * self.batch_size
        reader.update(shard_id=self.rank, num_shards=self.world)
        lo, hi = shard_range(sh.size, self.rank, self.world)
        return reader, None, hi - lo

    def _open(self, epoch: int) -> _Epoch:
        """Build epoch `epoch`'s pipeline and start decoding its first batches."""
        reader, files, real = self._reader(epoch)
        src = "folder" if self.listing is not None else "wds"
        args = pipeline_args(
            batch_size=self.batch_size,
            threads=self.threads,
            device=self.device,
            seed=pipeline_seed(self.seed, epoch, self.rank, int(self.train)),
        )
        pipe = self._pipeline(src, self._listed(reader), args)
        meta = pipe.reader_meta("Reader")
        if self.train and src == "folder" and meta["epoch_size"] != real:
            raise RuntimeError(f"DALI reader holds {meta['epoch_size']} samples, expected {real}")
        if src == "wds" and meta["epoch_size"] != self.size:
            raise DataError(
                f"the shard indices list {meta['epoch_size']} samples but meta.json says "
                f"{self.size}: re-run `hpctrain data pack`"
            )
        samples = None
        if self.train and src == "folder":  # the indices the reader's file list was made from, in its order
            samples = (
                np.asarray(self.epoch_indices(epoch), dtype=np.int64),
                np.concatenate(
                    sampling.train_copies(self.size, self.chunk, self.rank, self.world, repeats=self.repeats)
                ),
            )
        boxes = self.erase_source(epoch) if self.train and self.aug.reprob > 0 else None
        ep = _Epoch(epoch, pipe, files, real, boxes, samples)
        ep.schedule(len(self))
        return ep

    def _listed(self, reader: dict) -> dict:
        """The folder reader's files and labels as a `file_list` at one path, rewritten each epoch, so
        that the graph (which holds the path, not the list) stays the same. Names DALI's list format
        cannot hold (a space at either end, a line break) stay in the graph: traced per epoch."""
        if "files" not in reader or any(f != f.strip() or "\n" in f or "\r" in f for f in reader["files"]):
            return reader
        if self._lists is None:
            self._lists = tempfile.TemporaryDirectory(prefix="hpctrain-dali-")
        path = Path(self._lists.name) / "files.txt"
        tmp = path.with_suffix(f".{threading.get_ident()}")
        tmp.write_text("".join(f"{f} {lab}\n" for f, lab in zip(reader["files"], reader["labels"])))
        os.replace(tmp, path)
        rest = {k: v for k, v in reader.items() if k not in ("files", "labels")}
        return {**rest, "file_list": str(path)}

    def _pipeline(self, src: str, reader: dict, args: dict):
        """A built pipeline for these reader arguments: deserialised from the graph traced last when
        the arguments are the same (only the seed differs: fact and measure in docs/data.md), and the
        DALI's deserialize takes the seed (dali_compat: not 1.32)."""
        from nvidia.dali import Pipeline  # DALI: optional (the torch loader runs without it)

        key = repr(sorted(reader.items()))
        with warnings.catch_warnings():  # RandAugment's operators warn from inside DALI's own code
            warnings.simplefilter("ignore", DeprecationWarning)
            if self._graph is not None and self._graph[0] == key and dali_compat.deserialize_takes_seed():
                t0 = time.perf_counter()
                pipe = Pipeline.deserialize(self._graph[1], **args)
                self._build_s = time.perf_counter() - t0
                return pipe
            pipe = trace_pipeline(self.train, src, reader, self.aug, args)
            self.traces += 1
            self._graph = (key, pipe.serialize())
            pipe.build()
        return pipe

    def _prebuild(self, epoch: int) -> None:
        """Open the next epoch in a thread while this one's last batches are trained on."""

        def work():
            try:
                self._next = self._open(epoch)
            except Exception:  # noqa: BLE001 - built again (and raised) in the foreground
                self._next = None

        self._next_thread = threading.Thread(target=work, daemon=True)
        self._next_thread.start()

    def _lead(self, gap: float | None) -> int:
        """Batches before the epoch's last at which the next epoch's build starts: its last build time
        over the batch interval, plus one (1 until both are measured)."""
        return 1 if gap is None or gap <= 0 else math.ceil(self._build_s / gap) + 1

    def _take(self, epoch: int, start: int) -> _Epoch:
        if self._next_thread is not None:
            self._next_thread.join()
            self._next_thread = None
        nxt, self._next = self._next, None
        if nxt is not None and nxt.epoch == epoch:
            return nxt
        del nxt
        return self._open(epoch)

    def __iter__(self):
        epoch, start = self.epoch, (self.start if self.train else 0)
        ep = self._take(epoch, start)
        n = len(self)
        gap, last, ahead = None, None, False  # batch interval (moving average), last yield, next epoch started
        try:
            for b in range(n):
                try:
                    images, labels = _outputs(ep.pipe, self.device)
                except RuntimeError as e:
                    raise self._decode_error(e, ep.files, b, epoch) from None
                ep.schedule(n)
                if self.train and not ahead and b >= n - 1 - self._lead(gap):
                    self._prebuild(epoch + 1)
                    ahead = True
                if b < start:
                    continue
                now = time.perf_counter()
                if last is not None:
                    gap = now - last if gap is None else 0.8 * gap + 0.2 * (now - last)
                last = now
                x = _to_torch(images, self.device)
                y = torch.from_numpy(labels.as_array().reshape(-1).astype(np.int64))
                if ep.samples is not None:
                    at = slice(b * self.batch_size, (b + 1) * self.batch_size)
                    self.last_samples = sampling.BatchSamples(epoch, ep.samples[0][at], ep.samples[1][at])
                pad = (b + 1) * self.batch_size - ep.real
                if pad > 0:
                    y[self.batch_size - pad :] = -1  # padding from pad_last_batch: not counted
                yield x, y.to(self.device, non_blocking=True)
        finally:
            del ep

    def _decode_error(self, err: Exception, files, batch: int, epoch: int) -> DataError:
        """The failing image named: DALI's batch error names no file (a WebDataset one not even the
        shard), so the samples this rank reads are decoded one by one until one fails."""
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        msg = next(
            (
                ln
                for words in (("failure", "failed"), ("decode",), ("error",))
                for ln in lines
                if any(w in ln.lower() for w in words) and "in pipeline" not in ln.lower()
            ),
            lines[-1] if lines else repr(err),
        )
        if self.shards is not None:
            shard = (self.rank + epoch) % self.world if self.train else self.rank
            found = first_undecodable_wds(self.shards, *shard_range(self.shards.size, shard, self.world))
            if found is not None:
                tar, key, member = found
                return DataError(f"cannot decode sample {key} ({member}) in shard {tar} (DALI: {msg}); {WDS_FIX_HINT}")
        if files is not None:
            lo = batch * self.batch_size
            root = self.listing.root
            cand = [root / f for f, _ in files[lo : lo + 3 * self.batch_size]]  # this batch + prefetch
            bad = first_undecodable(cand)
            if bad is not None:
                return DataError(f"cannot decode image {bad} (DALI: {msg}); {FIX_HINT}")
        if self.listing is not None:
            return DataError(f"DALI failed to read {self.listing.root}: {msg}; {FIX_HINT}")
        return DataError(f"DALI failed to read {', '.join(self.shards.tars[:3])}: {msg}; {WDS_FIX_HINT}")


# ----------------------------------------------------------------------------- building


def build_dali_loaders(
    cfg: Config, rank: int, world: int, device: torch.device, batch: int, eval_batch: int, aug: AugmentSpec
):
    """(train, {split: eval loader}) DALI loaders for this rank (data.build.build_eval_loaders); `batch`: this
    rank's share of cfg.micro_batch."""
    d = cfg.data
    common = dict(aug=aug, rank=rank, world=world, seed=cfg.train.seed, threads=max(1, int(d.workers)), device=device)
    if d.format == "wds":
        if "minival" in d.eval_splits:
            raise ConfigError(
                "data.eval_splits with minival holds out train images from a folder; shards from "
                "`data pack` have no minival: use data.format=folder with minival, or "
                "data.eval_splits=[val]"
            )
        if cfg.aug.repeated_aug > 1:
            raise ConfigError(
                "aug.repeated_aug needs the sample order of data.format=folder; WebDataset shards "
                "stream in shard order: set aug.repeated_aug=0 or data.format=folder"
            )
        root = (
            stage(
                d.root,
                d.stage_to,
                log=log.info,
                warn=log.warning,
                keep_days=d.stage_keep_days,
                remove_at_end=d.stage_remove_at_end,
            )
            if d.stage_to
            else Path(d.root)
        )
        train_sh = find_shards(root, "train")
        _check_classes(len(train_sh.classes), cfg, root)
        train = DaliLoader(train=True, batch_size=batch, chunk=cfg.micro_batch, shards=train_sh, **common)
        try:
            val_sh = find_shards(root, "val")
        except FileNotFoundError:
            return train, {}
        return train, {"val": DaliLoader(train=False, batch_size=eval_batch, shards=val_sh, **common)}
    if d.stage_to:
        raise ConfigError(
            "data.stage_to copies WebDataset shards: pack the folder with `hpctrain data "
            "pack ROOT OUT` and set data.format=wds data.root=OUT, or clear data.stage_to"
        )
    train_list, eval_lists = train_eval_listings(d.root, d.eval_splits, read_exclusions(d.exclude_file))
    _check_classes(len(train_list.classes), cfg, train_list.root)
    train = DaliLoader(
        train=True, batch_size=batch, chunk=cfg.micro_batch, listing=train_list, repeats=cfg.aug.repeated_aug, **common
    )
    return train, {
        split: DaliLoader(train=False, batch_size=eval_batch, listing=lst, **common)
        for split, lst in eval_lists.items()
    }


def _check_classes(n: int, cfg: Config, where) -> None:
    mismatch = class_mismatch(where, n, cfg.model.num_classes)
    if mismatch:
        raise ConfigError(mismatch)
