"""The step-time model: compute + exposed all-reduce + data wait, and what follows from it.

Pure arithmetic (no torch, no files): the CLI and `submit --dry-run` feed it resolved inputs.

* all-reduce of S bytes over n ranks (ring; nccl-tests' busbw convention):
  t = calls × latency + 2(n−1)/n × S / busbw; with the shipped (large-message) bus bandwidths
  each call also pays NCCL's own latency model (`nccl_allreduce_s`)
* DDP overlap: DDP all-reduces a bucket as soon as all its gradients exist, while backward goes
  on (PyTorch DDP design note). With k equal buckets whose gradients appear evenly over the
  backward pass, one stream of all-reduces ends max(c, C − B·(k−1)/k) after backward, where C
  is the whole all-reduce time, c = C/k one bucket's, B the backward time: the last bucket can
  never overlap, the others only with the backward that is still to run.
* backward = 2/3 of the compute time (flops.py: a trained image costs 3 × forward; backward 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GB = 1e9
BACKWARD_SHARE = 2.0 / 3.0


def ring_allreduce_s(nbytes: float, ranks: int, busbw_gbps: float, calls: int = 1, latency_s: float = 0.0) -> float:
    """Seconds to all-reduce `nbytes` over `ranks` at bus bandwidth `busbw_gbps` (GB/s)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    if busbw_gbps <= 0:
        raise ValueError("bus bandwidth must be positive")
    return calls * latency_s + 2.0 * (ranks - 1) / ranks * nbytes / (busbw_gbps * GB)


# NCCL's own cost model (src/graph/tuning.cc, NCCL 2.18-2.19: the one it picks algorithms by):
# per all-reduce call, latency = base + hops × per-hop latency, in µs, per algorithm/protocol;
# ring: 2(n-1) hops of which 2·nodes cross the network (multi-node); tree: 2((ppn-1)·intra +
# log2(nodes)·inter). Bandwidth: ring algbw = busbw·n/(2(n-1)); tree 0.5·busbw·0.92; LL128 at
# 0.92 (ring) or 120/128 (tree, multi-node) of busbw. LL128 only where GPUs share NVLink.
NCCL_BASE_US = {("ring", "simple"): 8.4, ("ring", "ll128"): 10.0, ("tree", "simple"): 0.0, ("tree", "ll128"): 4.4}
NCCL_HOP_US = {  # (link, algorithm, protocol) → µs
    ("nvlink", "ring", "simple"): 3.4,
    ("nvlink", "ring", "ll128"): 1.9,
    ("nvlink", "tree", "simple"): 28.0,
    ("nvlink", "tree", "ll128"): 1.25,
    ("pci", "ring", "simple"): 5.7,
    ("pci", "ring", "ll128"): 2.5,
    ("pci", "tree", "simple"): 28.0,
    ("pci", "tree", "ll128"): 1.9,
    ("net", "ring", "simple"): 9.6,
    ("net", "ring", "ll128"): 4.0,
    ("net", "tree", "simple"): 28.0,
    ("net", "tree", "ll128"): 8.5,
}


def nccl_allreduce_s(nbytes: float, nodes: int, gpus_per_node: int, busbw_gbps: float, nvlink: bool = True) -> float:
    """One all-reduce call's time by NCCL's tuning model: the fastest of ring/tree × Simple/LL128."""
    n = nodes * gpus_per_node
    if n <= 1 or nbytes <= 0:
        return 0.0
    intra = "nvlink" if nvlink else "pci"
    inter_steps = 2 * nodes if nodes > 1 else 0
    best = math.inf
    for algo in ("ring", "tree"):
        if algo == "tree" and nodes == 1:
            continue  # NCCL >= 2.19 leaves tree/Simple out on one node; rings win there anyway
        for proto in ("simple", "ll128"):
            if proto == "ll128" and not nvlink:
                continue
            hop_in = NCCL_HOP_US[(intra, algo, proto)]
            hop_net = NCCL_HOP_US[("net", algo, proto)]
            lat = NCCL_BASE_US[(algo, proto)]
            if algo == "ring":
                steps = 2 * (n - 1)
                lat += (steps - inter_steps) * hop_in + inter_steps * hop_net
                bus = busbw_gbps * (0.92 if proto == "ll128" else 1.0)
                algbw = bus * n / steps
            else:
                lat += 2 * ((gpus_per_node - 1) * hop_in + math.log2(nodes) * hop_net)
                bus = busbw_gbps * 0.92 * (120 / 128 if proto == "ll128" else 1.0)
                algbw = 0.5 * bus
            best = min(best, lat * 1e-6 + nbytes / (algbw * GB))
    return best


def exposed_comm_s(comm_s: float, backward_s: float, buckets: int) -> float:
    """The part of `comm_s` left after DDP overlaps `buckets` all-reduces with `backward_s`."""
    if comm_s <= 0:
        return 0.0
    k = max(1, buckets)
    return max(comm_s / k, comm_s - backward_s * (k - 1) / k)


def bucket_count(nbytes: float, bucket_bytes: float) -> int:
    return max(1, math.ceil(nbytes / bucket_bytes))


@dataclass(frozen=True)
class Link:
    """Bus bandwidth of the slowest hop of the all-reduce, and where the figure comes from.

    `nccl`: add NCCL's latency model per call (shipped large-message figures); a busbw measured at
    the bucket size already holds the latency, so measured links use the plain ring formula."""

    busbw_gbps: float
    source: str
    latency_s: float = 0.0
    nccl: bool = False
    nvlink: bool = True


@dataclass(frozen=True)
class Compute:
    """Per-GPU speed: achieved model TFLOP/s in training, and data wait per image (seconds)."""

    tflops: float
    source: str
    data_wait_per_image_s: float = 0.0


@dataclass(frozen=True)
class Workload:
    """What one optimizer step of the recipe asks of every GPU."""

    train_flops_per_image: float
    grad_bytes: float  # bytes all-reduced per optimizer step
    bucket_bytes: float  # DDP bucket cap
    global_batch: int
    accum_steps: int = 1
    images_per_epoch: int = 0
    epochs: int = 1
    max_steps: int = 0

    def per_gpu_batch(self, gpus: int) -> int | None:
        """The largest micro-batch of a GPU (⌈g/gpus⌉: the shares may be uneven, data.sampling), None where the
        batch cannot split (config/rules.py's check_batch: accumulation does not divide it, or a GPU gets none)."""
        g, left = divmod(self.global_batch, self.accum_steps)
        return None if left or g < gpus else -(-g // gpus)

    @property
    def steps_per_epoch(self) -> int:
        return self.images_per_epoch // self.global_batch  # incomplete global batches are dropped

    @property
    def total_steps(self) -> int:
        return self.max_steps or self.epochs * self.steps_per_epoch


@dataclass(frozen=True)
class Step:
    """One optimizer step at a node count."""

    nodes: int
    gpus_per_node: int
    per_gpu_batch: int
    compute_s: float
    comm_s: float  # the whole all-reduce, as if nothing overlapped it
    exposed_s: float  # what DDP's overlap leaves on the critical path
    data_wait_s: float
    global_batch: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s + self.data_wait_s

    @property
    def images_per_s(self) -> float:
        return self.global_batch / self.step_s


def step_time(
    work: Workload, nodes: int, gpus_per_node: int, compute: Compute, intra: Link, inter: Link, overlap: bool = True
) -> Step | None:
    """Predicted step at `nodes` × `gpus_per_node` GPUs; None when the batch does not split."""
    b = work.per_gpu_batch(nodes * gpus_per_node)
    if b is None:
        return None
    return _step(work, nodes, gpus_per_node, b, work.accum_steps, compute, intra, inter, overlap)


def uneven_step_time(
    work: Workload,
    nodes: int,
    gpus_per_node: int,
    accum: int,
    compute: Compute,
    intra: Link,
    inter: Link,
    overlap: bool = True,
) -> Step:
    """The step at `nodes` when the global batch need not split evenly (a node range's size: 4096 over
    96 GPUs gives some ranks 43 images, some 42): every rank waits for the busiest, so the step is
    that of the largest micro-batch, ceil(global / (GPUs × accum))."""
    b = -(-work.global_batch // (nodes * gpus_per_node * accum))
    return _step(work, nodes, gpus_per_node, b, accum, compute, intra, inter, overlap)


def _step(
    work: Workload,
    nodes: int,
    gpus_per_node: int,
    b: int,
    accum: int,
    compute: Compute,
    intra: Link,
    inter: Link,
    overlap: bool,
) -> Step:
    """One step of `accum` micro-batches of `b` images per GPU."""
    gpus = nodes * gpus_per_node
    micro_s = b * work.train_flops_per_image / (compute.tflops * 1e12)
    link = intra if nodes == 1 else inter
    k = bucket_count(work.grad_bytes, work.bucket_bytes)
    if link.nccl:
        comm = k * nccl_allreduce_s(work.grad_bytes / k, nodes, gpus_per_node, link.busbw_gbps, link.nvlink)
    else:
        comm = ring_allreduce_s(work.grad_bytes, gpus, link.busbw_gbps, calls=k, latency_s=link.latency_s)
    # gradients are reduced once per step, overlapping the backward of the last micro-batch only
    exposed = exposed_comm_s(comm, BACKWARD_SHARE * micro_s, k) if overlap else comm
    wait = b * accum * compute.data_wait_per_image_s
    return Step(nodes, gpus_per_node, b, micro_s * accum, comm, exposed, wait, work.global_batch)


@dataclass(frozen=True)
class Row:
    step: Step
    efficiency: float | None  # images/s over nodes × the 1-node images/s of the same recipe
    epoch_s: float
    total_s: float
    gpu_hours: float


@dataclass
class Plan:
    work: Workload
    target: Row | None
    rows: list[Row]
    skipped: list[int] = field(default_factory=list)  # node counts whose batch does not split


def node_counts(nodes: int) -> list[int]:
    """1, the target, and the powers of two from a quarter of it to twice it (at least 2 to 4)."""
    lo, hi = max(2, nodes / 4), max(4, 2 * nodes)
    out = {1, nodes} | {2**k for k in range(0, 16) if lo <= 2**k <= hi}
    return sorted(out)


def make_plan(
    work: Workload,
    nodes: int,
    gpus_per_node: int,
    compute: Compute,
    intra: Link,
    inter: Link,
    counts: list[int] | None = None,
    overlap: bool = True,
) -> Plan:
    base = step_time(work, 1, gpus_per_node, compute, intra, inter, overlap)
    rows, skipped, target = [], [], None
    for n in counts or node_counts(nodes):
        st = step_time(work, n, gpus_per_node, compute, intra, inter, overlap)
        if st is None:
            skipped.append(n)
            continue
        eff = st.images_per_s / (n * base.images_per_s) if base else None
        total = work.total_steps * st.step_s
        row = Row(st, eff, work.steps_per_epoch * st.step_s, total, total / 3600 * st.gpus)
        rows.append(row)
        if n == nodes:
            target = row
    return Plan(work, target, rows, skipped)
