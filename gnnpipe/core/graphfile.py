"""The relabelled graph written once by the launcher and read by every rank through a memory map (issue #12).

The launcher saves the partitioned graph's tensors with ``torch.save`` into the run's temporary folder and ships
every rank a :class:`GraphFile` — the file's path, not the graph: pickling it to a rank costs a few bytes. A rank
opens the file with ``torch.load(mmap=True)``: the tensors are views of the mapped file, and only the pages a
rank reads (its rows of ``x``, the labels of the last stage, the edge list it builds its rows of ``Â`` from)
become resident in it.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from torch import Tensor

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
        self._tensors: Optional[dict[str, Tensor]] = None

    @classmethod
    def write(cls, data, path: str) -> "GraphFile":
        """Save ``data``'s :data:`FIELDS` (contiguous) to ``path`` with ``torch.save``; returns its :class:`GraphFile`."""
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


__all__ = ["FIELDS", "GraphFile"]
