"""The relabelled graph written once by the launcher and read by every rank through a memory map.

The launcher saves the partitioned graph's tensors with ``torch.save`` into the run's temporary folder and ships
every rank a :class:`GraphFile` — the file's path, not the graph: pickling it to a rank costs a few bytes. A rank
opens the file with ``torch.load(mmap=True)``: the tensors are views of the mapped file, and only the pages a
rank reads (its rows of ``x``, the labels of the last stage, the edge list it builds its rows of ``Â`` from)
become resident in it.
"""

from __future__ import annotations

import ctypes
import os
import sys

import torch
from torch import Tensor

#: ``madvise`` advice: the pages may be dropped (Linux ``<sys/mman.h>``)
MADV_DONTNEED = 4
#: the ``Data`` attributes a rank may read (``edge_weight`` only when the graph has one)
FIELDS = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask", "edge_weight")


class GraphFile:
    """A graph stored by :meth:`write`, loaded lazily (memory-mapped) on first attribute access.

    Reads like a PyG ``Data`` for what the executors use: ``x`` ``[N, F]``, ``y`` ``[N]``, ``edge_index``
    ``[2, E]``, the three bool masks ``[N]``, ``edge_weight`` ``[E]`` or ``None``, and ``num_nodes``.

    Args:
        path: the file written by :meth:`write`. num_nodes: ``N``.
    """

    def __init__(self, path: str, num_nodes: int):
        self.path = str(path)
        self.num_nodes = int(num_nodes)
        self._tensors: dict[str, Tensor] | None = None

    @classmethod
    def write(cls, data, path: str) -> GraphFile:
        """Save ``data``'s :data:`FIELDS` (contiguous) to ``path`` with ``torch.save``; returns its
        :class:`GraphFile`."""
        tensors = {k: getattr(data, k).contiguous() for k in FIELDS if getattr(data, k, None) is not None}
        torch.save(tensors, path)
        return cls(path, data.num_nodes)

    def _load(self) -> dict[str, Tensor]:
        if self._tensors is None:
            if not os.path.exists(self.path):
                raise FileNotFoundError(f"the run's graph file {self.path} is gone (the launcher removes it when "
                                        f"the run ends); start the ranks from the launcher that wrote it")
            self._tensors = torch.load(self.path, mmap=True, weights_only=True)
        return self._tensors

    def release(self, *names: str) -> int:
        """Drop this process's resident pages of the named tensors (e.g. ``"edge_index"`` once a rank has built its
        rows of ``Â`` from it): ``madvise(MADV_DONTNEED)`` on the whole pages inside each tensor's bytes. The
        tensors stay valid: the mapping is private and read-only in use, so a later read faults the same bytes
        back in from the file. Resident file pages count in a rank's peak (``VmHWM``), and a rank that keeps
        reading from the mapping (its rows of ``x``) would otherwise keep the edge list resident too.

        Returns:
            the bytes advised (0 off Linux, before the file is loaded, or for names it does not hold).
        """
        if self._tensors is None or not sys.platform.startswith("linux"):
            return 0

        libc = ctypes.CDLL(None, use_errno=True)
        page = os.sysconf("SC_PAGE_SIZE")
        done = 0
        for name in names:
            t = self._tensors.get(name)
            if t is None or t.numel() == 0:
                continue
            start = t.data_ptr()
            lo = -(-start // page) * page  # whole pages only: a neighbouring tensor's bytes stay untouched
            hi = (start + t.numel() * t.element_size()) // page * page
            if hi > lo and libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_DONTNEED) == 0:
                done += hi - lo
        return done

    def __getattr__(self, name: str):
        if name in FIELDS:
            return self._load().get(name)
        raise AttributeError(name)

    def __getstate__(self) -> dict:  # the path travels, never the tensors
        return {"path": self.path, "num_nodes": self.num_nodes, "_tensors": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"GraphFile({self.path!r}, num_nodes={self.num_nodes})"


def release_edge_pages(data) -> None:
    """Drop this rank's resident pages of a memory-mapped graph file's edge list (:meth:`GraphFile.release`; no-op
    for a graph in memory): once its rows of ``Â`` are built a rank does not read it again (a hybrid's first
    evaluation reads it once more to build its halo, then drops it again)."""
    if isinstance(data, GraphFile):
        data.release("edge_index", "edge_weight")


__all__ = ["FIELDS", "GraphFile", "release_edge_pages"]
