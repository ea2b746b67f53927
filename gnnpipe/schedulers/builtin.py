"""The built-in schedulers: ``gpipe``, ``1f1b`` and ``async-stale`` (registered like any user's).

Notation: ``S`` stages, ``C`` chunks, ``order`` the epoch's chunk order (the order chunks enter
stage 0), ``F(s,c)``/``B(s,c)``/``STEP(s)`` the actions of ``gnnpipe.schedulers.ir``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import ConfigError
from .base import ChunkScheduler, register
from .ir import STEP, Action, B, D, F, G, Schedule, check_chunk_order


@register("gpipe")
class GPipe(ChunkScheduler):
    """All forwards, then all backwards in reverse order, then one optimizer step (GNNPipe's schedule).

    Stage ``s`` runs ``F(s, order[0]) … F(s, order[C-1])``, then ``B(s, order[C-1]) … B(s, order[0])``,
    then ``STEP(s)``. The fill-drain pattern and the per-epoch flush are GPipe's (Huang et al., 2019,
    "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism"); running the
    backward in the *reverse* of the epoch's forward order is GNNPipe's (Chen, Chen, Qian,
    arXiv 2308.10087), so that a chunk's pull backward reads fresh gradients exactly from the chunks
    whose forward read its stale embeddings. With ``second_order`` (conservative forces) the backwards are
    preceded by all ``G`` passes, then all ``D`` passes, each phase in the same reversed order. Weights are never stale
    (``weight_staleness = 0``); every stage holds the activations of all ``C`` chunks at the turn.
    """

    flush = True
    weight_staleness = 0

    def build(self, num_stages: int, chunk_order: Sequence[int]) -> Schedule:
        order = check_chunk_order(num_stages, chunk_order)
        back = list(reversed(order))
        rows = [
            [F(s, c) for c in order]
            + ([G(s, c) for c in back] + [D(s, c) for c in back] if self.second_order else [])
            + [B(s, c) for c in back] + [STEP(s)]
            for s in range(num_stages)
        ]
        return self.schedule_from_orders(num_stages, len(order), rows)


def _one_f_one_b(stage: int, num_stages: int, stream: list[tuple[int, int]], num_chunks: int,
                 second_order: bool = False) -> list[Action]:
    """One stage's 1F1B order over a stream of ``(epoch, chunk)`` micro-batches, with ``STEP(s, e)``
    right after the stage's last backward of epoch ``e`` (every ``num_chunks`` backwards). ``second_order``:
    each backward is the block ``G, D, B`` of its chunk."""
    n = len(stream)
    warm = min(num_stages - 1 - stage, n)
    out = [F(stage, c, e) for e, c in stream[:warm]]

    def backward(i: int) -> None:
        e, c = stream[i]
        if second_order:
            out.extend((G(stage, c, e), D(stage, c, e)))
        out.append(B(stage, c, e))
        if (i + 1) % num_chunks == 0:
            out.append(STEP(stage, e))

    for i in range(n - warm):
        e, c = stream[warm + i]
        out.append(F(stage, c, e))
        backward(i)
    for i in range(n - warm, n):
        backward(i)
    return out


@register("1f1b")
class OneFOneB(ChunkScheduler):
    """PipeDream-Flush: S-1-s warm-up forwards, then one forward / one backward, then drain; one step.

    Stage ``s`` runs ``min(S-1-s, C)`` warm-up forwards, then alternates ``F`` of the next chunk and
    ``B`` of the oldest chunk it holds (backward in forward order, first in first out), then drains the
    remaining backwards and steps (Narayanan et al., 2021, "Memory-Efficient Pipeline-Parallel DNN
    Training", PipeDream-Flush; the same order as torch.distributed.pipelining's ``Schedule1F1B``).
    At most ``min(S-s, C)`` chunks are in flight on stage ``s``. Valid for any ``C``, also ``C < S``.
    With ``second_order`` (conservative forces) each backward is the block ``G, D, B`` of its chunk.
    Weights are never stale (``weight_staleness = 0``).
    """

    flush = True
    weight_staleness = 0

    def build(self, num_stages: int, chunk_order: Sequence[int]) -> Schedule:
        order = check_chunk_order(num_stages, chunk_order)
        stream = [(0, c) for c in order]
        rows = [_one_f_one_b(s, num_stages, stream, len(order), self.second_order) for s in range(num_stages)]
        return self.schedule_from_orders(num_stages, len(order), rows)


@register("async-stale")
class AsyncStale(ChunkScheduler):
    """No flush: 1F1B over a continuous stream of epochs; each stage steps after its own last backward.

    Epochs are concatenated into one micro-batch stream (epoch ``e``'s chunks in ``chunk_orders[e]``)
    and every stage runs the 1F1B order of :class:`OneFOneB` over the whole stream, with ``STEP(s, e)``
    right after stage ``s``'s last backward of epoch ``e``. The warm-up forwards of epoch ``e+1`` thus
    overlap the drain of epoch ``e``, and the pipeline never empties between epochs (asynchronous
    pipelining without flush: PipeDream, Narayanan et al., 2019; PipeGCN, Wan et al., 2022 for GNNs).

    Price: a forward of epoch ``e+1`` that runs on stage ``s`` before ``STEP(s, e)`` uses weights one
    (or more) optimizer steps old. The bound is :meth:`staleness_bound`
    ``= ceil((S-1)/C)`` versions for ``S > 1`` (``1`` whenever ``C >= S-1``; 0 for ``S = 1``); the class
    attribute ``weight_staleness = 1`` is the bound for ``C >= S-1``. Without ``stash_weights`` such a
    chunk's backward runs on the newer weights; with it, on the weights its forward used.

    :meth:`build` returns one epoch (then the pipeline drains, as in 1F1B; the runtime just does not
    add a barrier); :meth:`build_epochs` returns the interleaved multi-epoch stream the runtime should
    run to get the no-drain behaviour.
    """

    flush = False
    weight_staleness = 1

    def __init__(self, *, stash_weights: bool = False):
        super().__init__(stash_weights=stash_weights)  # no second_order: S2EF refuses non-flush schedules

    def staleness_bound(self, num_stages: int, num_chunks: int) -> int:
        if num_stages <= 1:
            return 0
        return math.ceil((num_stages - 1) / num_chunks)

    def build(self, num_stages: int, chunk_order: Sequence[int]) -> Schedule:
        return self.build_epochs(num_stages, [chunk_order])

    def build_epochs(self, num_stages: int, chunk_orders: Sequence[Sequence[int]]) -> Schedule:
        orders = [check_chunk_order(num_stages, o) for o in chunk_orders]
        if not orders:
            raise ConfigError("build_epochs needs at least one epoch's chunk order")
        C = len(orders[0])
        if any(len(o) != C for o in orders):
            raise ConfigError("every epoch needs the same number of chunks")
        stream = [(e, c) for e, o in enumerate(orders) for c in o]
        rows = [_one_f_one_b(s, num_stages, stream, C) for s in range(num_stages)]
        return self.schedule_from_orders(num_stages, C, rows, epochs=len(orders))
