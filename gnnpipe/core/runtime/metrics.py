"""Metrics of a run: the chunk loss, accuracies of full-graph logits, peak memory (one module for all executors)."""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


def masked_loss(logits: Tensor, y: Tensor, mask: Tensor, num_global: int) -> Tensor:
    """Cross-entropy summed over the masked rows, divided by ``num_global`` (DESIGN §5 "Loss").

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


def return_free_memory() -> None:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim(0)``; a no-op elsewhere).

    glibc keeps memory freed by short-lived tensors: after the first large block it frees, its mmap threshold rises
    to that block's size, so later chunk-sized tensors come from a heap whose freed holes stay resident. Called at
    phase boundaries of a rank (built, each epoch trained, each evaluation), it keeps what one phase freed out of
    the next phase's resident peak (issue #12: ``VmHWM`` is what ``peak_mem_bytes`` reports)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


#: the size from which glibc's ``malloc`` maps each block on its own (:func:`bound_heap_retention`): a tensor of
#: at least this many bytes is returned to the system when freed
MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def bound_heap_retention(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for the rest of the process (``mallopt(M_MMAP_THRESHOLD)``;
    a no-op elsewhere); returns whether it was set.

    By default glibc raises its threshold to the size of each mapped block freed (up to 32 MiB), so once a rank
    has freed one large tensor (a weight matrix of the full model, dropped from a pipeline stage; a gradient) every
    later tensor up to that size comes from the heap, whose freed holes between live blocks stay resident:
    training steps whose weight-sized temporaries (gradients of the second-order pass, AdamW's) land in new holes
    grow the resident size step after step while the live bytes stay flat. With a fixed threshold every block of
    ``threshold`` bytes or more is mapped on its own and unmapped when freed; only small blocks share the heap.
    """
    fn = _mallopt()
    return bool(fn is not None and fn(_M_MMAP_THRESHOLD, int(threshold)) == 1)


def _mallopt():
    global _MALLOPT
    if _MALLOPT is False:
        import ctypes
        import sys

        _MALLOPT = None
        if sys.platform.startswith("linux"):
            try:
                _MALLOPT = ctypes.CDLL(None).mallopt
                _MALLOPT.argtypes, _MALLOPT.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            except (OSError, AttributeError):
                _MALLOPT = None
    return _MALLOPT


_MALLOPT = False


def _malloc_trim():
    global _TRIM
    if _TRIM is False:
        import ctypes
        import sys

        _TRIM = None
        if sys.platform.startswith("linux"):
            try:
                _TRIM = ctypes.CDLL(None).malloc_trim
            except (OSError, AttributeError):
                _TRIM = None
    return _TRIM


_TRIM = False


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process in bytes: CUDA max allocated on a GPU, else the peak resident set size.

    On Linux the peak resident size is ``VmHWM`` of ``/proc/self/status``: ``getrusage``'s ``ru_maxrss`` survives
    ``exec``, so in a rank started with the 'spawn' method it starts at the launcher's resident size at the
    fork (which holds the whole graph and the partitioner's work), not at the rank's own. Elsewhere: ``ru_maxrss``.
    """
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
