"""Memory of a process, the same for every kind of work: the C heap's free memory given back to the system, its
retention bounded, and the peak of a device (the runs report it per rank)."""

from __future__ import annotations

import ctypes
import resource
import sys

import torch

__all__ = ["MMAP_THRESHOLD_BYTES", "bound_heap_retention", "peak_memory_bytes", "return_free_memory"]


def return_free_memory() -> None:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim(0)``; a no-op elsewhere).

    glibc keeps memory freed by short-lived tensors: after the first large block it frees, its mmap threshold rises
    to that block's size, so later chunk-sized tensors come from a heap whose freed holes stay resident. Called at
    phase boundaries of a rank (built, each epoch trained, each evaluation), it keeps what one phase freed out of
    the next phase's resident peak (``VmHWM`` is what ``peak_mem_bytes`` reports)."""
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
