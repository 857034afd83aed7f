"""The eval pass masks padded samples instead of indexing them out (no device->host sync per batch on
CUDA): the same figures as the indexing implementation it replaced (kept here as the reference)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hpctrain.train.eval_pass import evaluate


class DataDependentShapes(TorchDispatchMode):
    """Records the ops whose output size depends on tensor values: on CUDA each one waits for the
    device to tell the host that size (a sync), whatever the device here."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name == "index" and any(getattr(i, "dtype", None) == torch.bool for i in args[1] if i is not None)
        if name in ("nonzero", "masked_select", "bincount", "unique", "_unique2") or bool_index:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


class Batches:
    """A loader of fixed batches, the last one padded (label -1), as the sharded loaders pad."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)

    def set_epoch(self, epoch):
        pass


def reference(model, loader, num_classes):
    """The implementation before (logits[keep]), on CPU."""
    sums = torch.zeros(4, dtype=torch.float64)
    conf = torch.zeros(num_classes * num_classes, dtype=torch.int64)
    model.eval()
    for images, labels in loader:
        keep = labels >= 0
        logits = model(images)
        logits, labels = logits[keep].float(), labels[keep]
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hit = top5 == labels[:, None]
        sums += torch.stack(
            [
                hit[:, 0].sum(),
                hit.any(1).sum(),
                keep.sum(),
                torch.nn.functional.cross_entropy(logits, labels, reduction="sum"),
            ]
        ).double()
        conf += torch.bincount(labels * num_classes + top5[:, 0], minlength=num_classes * num_classes)
    c1, c5, n, loss = sums.tolist()
    return {
        "top1": 100.0 * c1 / n,
        "top5": 100.0 * c5 / n,
        "count": int(n),
        "loss": loss / n,
        "confusion": conf.view(num_classes, num_classes),
    }


def test_masked_eval_equals_indexed_eval():
    torch.manual_seed(0)
    nc = 7
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, nc))
    batches = [(torch.randn(16, 3, 2, 2), torch.randint(0, nc, (16,))) for _ in range(3)]
    last = torch.randint(0, nc, (16,))
    last[11:] = -1  # 5 padded samples
    batches.append((torch.randn(16, 3, 2, 2), last))
    loader = Batches(batches)
    want = reference(model, loader, nc)
    with DataDependentShapes() as ops:
        got = evaluate(model, loader, "none", torch.device("cpu"), num_classes=nc)
    assert ops.seen == []  # before: index with the bool mask and bincount, in every batch
    assert got["count"] == want["count"] == 59
    assert (got["top1"], got["top5"]) == (want["top1"], want["top5"])
    assert torch.equal(got["confusion"], want["confusion"])
    assert got["loss"] == want["loss"]  # cross_entropy's ignore_index skips them: the same sum, bit for bit
