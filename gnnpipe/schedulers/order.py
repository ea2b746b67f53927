"""Chunk-order policies: which order the chunks enter the pipeline in, epoch by epoch.

GNNPipe's technique T1 (Chen, Chen, Qian, arXiv 2308.10087) shuffles the chunk order every epoch with
a seed shared by the whole pipeline, so every stage sees the same order; the backward of gpipe then
runs in the reverse of that epoch's forward order. :class:`ShuffledOrder` derives each epoch's
permutation from ``(seed, epoch)`` only (SHA-512 string seeding of :class:`random.Random`), so every
process computes it identically without communication.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..errors import ConfigError


class ChunkOrder(ABC):
    """A policy giving, for each epoch, the order in which the chunks are fed to the pipeline."""

    @abstractmethod
    def order(self, epoch: int, num_chunks: int) -> list[int]:
        """A permutation of ``range(num_chunks)``; a pure function of ``(epoch, num_chunks)`` and the
        policy's parameters, so that every stage (process) gets the same one."""

    def orders(self, epochs: int, num_chunks: int, start: int = 0) -> list[list[int]]:
        """``[order(e, num_chunks) for e in range(start, start + epochs)]``."""
        return [self.order(e, num_chunks) for e in range(start, start + epochs)]


class FixedOrder(ChunkOrder):
    """The same order every epoch: ``order`` if given, else ``0, 1, …, C-1``.

    Raises:
        ConfigError: ``order`` is not a permutation of ``range(len(order))``, or (in :meth:`order`) its
            length differs from ``num_chunks``.
    """

    def __init__(self, order: Sequence[int] | None = None):
        if order is not None:
            order = [int(c) for c in order]
            if sorted(order) != list(range(len(order))):
                raise ConfigError(f"a fixed chunk order must be a permutation of 0..{len(order) - 1}, got {order}")
        self._order = order

    def order(self, epoch: int, num_chunks: int) -> list[int]:
        if self._order is None:
            return list(range(num_chunks))
        if len(self._order) != num_chunks:
            raise ConfigError(f"the fixed chunk order has {len(self._order)} chunks, but {num_chunks} were asked for")
        return list(self._order)

    def __repr__(self) -> str:
        return f"FixedOrder({self._order!r})" if self._order is not None else "FixedOrder()"


class ShuffledOrder(ChunkOrder):
    """A seeded uniformly random permutation per epoch (GNNPipe's T1), identical on every stage."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def order(self, epoch: int, num_chunks: int) -> list[int]:
        perm = list(range(num_chunks))
        random.Random(f"gnnpipe.chunk-order:{self.seed}:{int(epoch)}").shuffle(perm)
        return perm

    def __repr__(self) -> str:
        return f"ShuffledOrder(seed={self.seed})"


def order_policy(spec: str | ChunkOrder | None = None, seed: int = 0) -> ChunkOrder:
    """A :class:`ChunkOrder` from ``None``/``"fixed"`` (identity) or ``"shuffle"``/``"random"`` (with ``seed``),
    or the policy itself.

    Raises:
        ConfigError: unknown name.
    """
    if isinstance(spec, ChunkOrder):
        return spec
    if spec is None or spec == "fixed":
        return FixedOrder()
    if spec in ("shuffle", "shuffled", "random"):
        return ShuffledOrder(seed)
    raise ConfigError(f"unknown chunk order {spec!r}; use 'fixed' or 'shuffle'")
