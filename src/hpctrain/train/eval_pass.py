"""One exact eval pass over a split, sharded over every rank: the evaluator the training loop and
`hpctrain eval` (train/evaluate.py) share."""

from __future__ import annotations

import torch
import torch.distributed as td

from hpctrain.data.loader import Loader
from hpctrain.train.amp import autocast_ctx

IGNORE = -100  # cross_entropy's default ignore_index: a padded sample's target (no class, no loss)


@torch.no_grad()
def eval_rounds(loader: Loader, device: torch.device) -> int:
    """The most eval batches any rank has: every rank runs that many forwards. Under FSDP each
    forward all-gathers, so a rank with one batch more than the others (12,812 images on 16 ranks
    at 32: 25 or 26 batches) would wait forever on a collective the others never join."""
    n = len(loader)
    if not td.is_initialized() or td.get_world_size() == 1:
        return n
    t = torch.tensor([n], dtype=torch.int64, device=device)
    td.all_reduce(t, op=td.ReduceOp.MAX)
    return int(t.item())


def blank_input(model: torch.nn.Module, device: torch.device) -> torch.Tensor:
    """One black image the size `model` (a ViT) takes: the padding forward of a rank with no batch."""
    pe = model.patch_embed
    side = pe.grid * pe.proj.kernel_size[0]
    return torch.zeros(1, 3, side, side, device=device)


def evaluate(
    model: torch.nn.Module, loader: Loader | None, amp: str, device: torch.device, num_classes: int = 0
) -> dict:
    """Exact top-1/top-5 and mean loss over the whole split, summed over every rank: padded samples
    (label < 0) never count. With `num_classes`, also the confusion matrix ("confusion": rows the
    true class, columns the top-1 prediction; int64 counts). `hpctrain eval` and training share it.

    Every rank runs the same number of forwards (`eval_rounds`): a rank whose shard has fewer
    batches runs padding forwards on one image of its last batch, counted nowhere."""
    if loader is None:
        return {}
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # correct1, correct5, n, loss
    # the confusion counts, and one last cell the padded samples go to (dropped at the end)
    conf = torch.zeros(num_classes * num_classes + 1, dtype=torch.int64, device=device) if num_classes else None
    rounds = eval_rounds(loader, device)
    loader.set_epoch(0)
    seen, last = 0, None
    for images, labels in loader:
        seen += 1
        last = images[:1]
        # padded samples are masked, not indexed out: logits[keep] needs the count on the host (a
        # device->host sync per batch on CUDA); every row is computed and the padded ones weigh 0
        keep = labels >= 0
        with autocast_ctx(amp, device):
            logits = model(images)
        logits, target = logits.float(), labels.masked_fill(~keep, IGNORE)  # IGNORE: no class, no loss
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hit = top5 == target[:, None]
        sums += torch.stack(
            [
                hit[:, 0].sum(),
                hit.any(1).sum(),
                keep.sum(),
                torch.nn.functional.cross_entropy(logits, target, reduction="sum", ignore_index=IGNORE),
            ]
        ).double()
        if conf is not None:  # index_add_ into a fixed size (bincount reads the max on the host); padding: last cell
            cell = torch.where(keep, labels * num_classes + top5[:, 0], num_classes * num_classes)
            conf.index_add_(0, cell, torch.ones_like(cell))
    for _ in range(rounds - seen):  # padding forwards: the collectives of the others' last batches
        with autocast_ctx(amp, device):
            model(last if last is not None else blank_input(model, device))
    if td.is_initialized() and td.get_world_size() > 1:  # a world of one (FSDP on one GPU): nothing to reduce
        td.all_reduce(sums)
        if conf is not None:
            td.all_reduce(conf)
    model.train(was_training)
    c1, c5, n, loss = sums.tolist()
    out = {"top1": 100.0 * c1 / max(n, 1), "top5": 100.0 * c5 / max(n, 1), "count": int(n), "loss": loss / max(n, 1)}
    if conf is not None:
        out["confusion"] = conf[:-1].view(num_classes, num_classes).cpu()
    return out
