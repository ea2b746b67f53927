"""The sizes of one plan that the byte, time and memory predictions read (:func:`plan_geometry`): the chunks' and
ways' rows, halo rows and in-edges, and across ways the mirror rows and the rows each chunk or way exchanges with
its peers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ....partitioners import partition_metrics
from ..parallel import send_lists
from .profile import chunk_features


@dataclass
class Geometry:
    """Sizes of one plan that the predictions need (counts of vertices, edges, features and rows).

    ``N``, ``E``, ``F``: vertices, edges, input features; ``W`` ways, ``S`` stages; ``bounds``: the stages' unit
    bounds; ``chunk_ptr`` / ``way_ptr``: the first vertex of each chunk / first chunk of each way (plus the end);
    ``chunk_feats`` / ``way_feats``: ``(1, rows, halo rows, in-edges)`` per chunk / way
    (:func:`~.profile.chunk_features`).
    """

    N: int
    E: int
    F: int
    W: int
    S: int
    bounds: list
    chunk_ptr: list
    way_ptr: list
    chunk_feats: np.ndarray  # [C, 4]
    way_feats: np.ndarray  # [W, 4]
    mirror_fwd: int = 0
    mirror_bwd: int = 0
    mirror_push: int = 0  # M_C: Σ_c |{v ∈ halo(c) : way(v) ≠ way(c)}| (hybrid halo-gradient pushes)
    peer_rows: dict = field(default_factory=dict)  # chunk -> (sent rows, received rows) per op, forward
    peer_rows_bwd: dict = field(default_factory=dict)
    peer_rows_push: dict = field(default_factory=dict)  # backward of a message-passing unit's op
    way_sent: list = field(default_factory=list)  # GP: rows each way sends per op (its mirrors towards all others)
    way_peers_out: list = field(default_factory=list)  # GP: ways each way sends to / receives from
    way_peers_in: list = field(default_factory=list)
    pair_sent: dict = field(default_factory=dict)  # GP: (way p, way q) -> rows p sends q per op


def plan_geometry(plan, config) -> Geometry:
    """The :class:`Geometry` of ``plan`` (a ``RunPlan``, ``gnnpipe.tasks.nodes.runner``) under ``config``: rows,
    halo rows and in-edges of every chunk and way (:func:`~.profile.chunk_features`); with several ways the mirror
    counts, and per chunk (pipeline, hybrid) or per way and pair of ways (graph parallelism) the rows sent and
    received per aggregation op."""
    data = plan.data
    ei = data.edge_index
    N = int(data.num_nodes)
    ptr = [int(v) for v in plan.chunk_ptr.tolist()]
    wptr = [int(v) for v in plan.way_ptr.tolist()]
    W = len(wptr) - 1
    way_rows = [ptr[w] for w in wptr]
    g = Geometry(N=N, E=int(ei.size(1)), F=int(data.x.size(1)), W=W, S=config.stages, bounds=list(plan.bounds),
                  chunk_ptr=ptr, way_ptr=wptr, chunk_feats=chunk_features(ei, ptr),
                  way_feats=chunk_features(ei, way_rows))
    if W > 1:
        way_of = torch.repeat_interleave(torch.arange(W), torch.tensor(np.diff(way_rows)))
        g.mirror_fwd = int(partition_metrics(ei, N, way_of).mirror_count)
        g.mirror_bwd = int(partition_metrics(ei.flip(0), N, way_of).mirror_count)
        if config.stages == 1:
            lists = send_lists(ei, way_of, way_of, W)
            g.way_sent = [sum(int(t.numel()) for (p, _), t in lists.items() if p == w) for w in range(W)]
            g.way_peers_out = [sum(1 for (p, _) in lists if p == w) for w in range(W)]
            g.way_peers_in = [sum(1 for (_, q) in lists if q == w) for w in range(W)]
            g.pair_sent = {pq: int(t.numel()) for pq, t in lists.items()}
        if config.stages > 1:
            chunk_of = torch.repeat_interleave(torch.arange(len(ptr) - 1), torch.tensor(np.diff(ptr)))
            for backward, dest in ((False, g.peer_rows), (True, g.peer_rows_bwd)):
                lists = send_lists(ei, chunk_of, way_of, W, backward=backward)
                sent: dict[int, int] = {}
                recv: dict[int, int] = {}
                for (c, q), idx in lists.items():
                    sent[c] = sent.get(c, 0) + int(idx.numel())
                    # chunk c's rows go to way q's chunk of the same slot
                    w = int(np.searchsorted(wptr, c, side="right") - 1)
                    peer = wptr[q] + (c - wptr[w])
                    recv[peer] = recv.get(peer, 0) + int(idx.numel())
                for c in range(len(ptr) - 1):
                    dest[c] = (sent.get(c, 0), recv.get(c, 0))
            # the halo-gradient op's backward: chunk c pushes the gradient of each halo row v of another way
            # to way(v), which adds it under c's id (docs/HALO_GRADIENT.md)
            src, dst = ei[0].long(), ei[1].long()
            cut = way_of[src] != way_of[dst]
            pairs = torch.unique(chunk_of[dst[cut]] * N + src[cut])
            pc, pv = (pairs // N).tolist(), (pairs % N).tolist()
            g.mirror_push = len(pc)
            sent_p: dict[int, int] = {}
            recv_p: dict[int, int] = {}
            for c, v in zip(pc, pv):
                sent_p[c] = sent_p.get(c, 0) + 1
                w = int(np.searchsorted(wptr, c, side="right") - 1)
                peer = wptr[int(way_of[v])] + (c - wptr[w])
                recv_p[peer] = recv_p.get(peer, 0) + 1
            for c in range(len(ptr) - 1):
                g.peer_rows_push[c] = (sent_p.get(c, 0), recv_p.get(c, 0))
    return g


def stage_units(bounds, s: int) -> tuple[int, int]:
    """``(first unit, one past the last unit)`` of stage ``s`` under the stage unit ``bounds``."""
    return int(bounds[s]), int(bounds[s + 1])
