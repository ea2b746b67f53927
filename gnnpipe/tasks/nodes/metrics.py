"""Metrics of node classification: the chunk loss and the accuracies of full-graph logits (one module for all its
executors)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


def masked_loss(logits: Tensor, y: Tensor, mask: Tensor, num_global: int) -> Tensor:
    """Cross-entropy summed over the masked rows, divided by ``num_global``: every chunk's share of the full-graph mean.

    With ``num_global`` the number of training vertices of the whole graph, the sum of this loss
    over disjoint chunks equals the full-batch mean loss.

    Args:
        logits: ``[n, C]`` float. y: ``[n]`` long. mask: ``[n]`` bool. num_global: int > 0.

    Returns:
        A 0-dim tensor of ``logits``' dtype (0 with a graph to the logits when the mask is empty).
    """
    if not bool(mask.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[mask], y[mask], reduction="sum") / num_global


@torch.no_grad()
def accuracies(logits: Tensor, data) -> dict:
    """``train_acc``, ``val_acc``, ``test_acc`` (fractions) and ``val_loss`` of full-graph logits ``[N, C]``
    (``nan`` for an empty split)."""
    pred = logits.argmax(-1)
    out = {}
    for split in ("train", "val", "test"):
        m = getattr(data, f"{split}_mask")
        out[f"{split}_acc"] = float((pred[m] == data.y[m]).float().mean()) if bool(m.any()) else float("nan")
    vm = data.val_mask
    out["val_loss"] = float(F.cross_entropy(logits[vm], data.y[vm])) if bool(vm.any()) else float("nan")
    return out


@torch.no_grad()
def gather_accuracies(logits: Tensor | None, y: Tensor, masks: dict[str, Tensor]) -> dict:
    """:func:`accuracies` over rows spread across ranks (graph-parallel ways): each rank passes the logits of
    its own rows (``None`` on ranks that hold none), ``y`` and the ``train``/``val``/``test`` masks of the
    same rows. The counts are all-gathered over the world (control traffic, not counted) and summed in rank
    order, so every rank gets the same dict."""
    vec = torch.zeros(7, dtype=torch.float64)
    if logits is not None:
        pred = logits.argmax(-1)
        for k, split in enumerate(("train", "val", "test")):
            m = masks[split]
            vec[2 * k] = float((pred[m] == y[m]).sum())
            vec[2 * k + 1] = float(m.sum())
        vm = masks["val"]
        if bool(vm.any()):
            vec[6] = float(F.cross_entropy(logits[vm].double(), y[vm], reduction="sum"))
    if dist.get_backend() == "nccl":  # nccl collects device tensors only
        vec = vec.to(torch.device("cuda", torch.cuda.current_device()))
    out = [torch.zeros_like(vec) for _ in range(dist.get_world_size())]
    dist.all_gather(out, vec)
    tot = torch.zeros(7, dtype=torch.float64)
    for t in out:
        tot += t.cpu()
    res = {}
    for k, split in enumerate(("train", "val", "test")):
        n = float(tot[2 * k + 1])
        res[f"{split}_acc"] = float(tot[2 * k]) / n if n else float("nan")
    nv = float(tot[3])
    res["val_loss"] = float(tot[6]) / nv if nv else float("nan")
    return res
