"""Aggregation ops as objects: what a stage calls for each ``agg(h, kind)`` of its units.

A stage never knows how an aggregation reaches rows it does not hold; it calls one
:class:`AggregationOp` per aggregation of its units (keyed ``(unit, op index)``):

* :meth:`AggregationOp.train` — the op on chunk ``c``'s rows during training, differentiable in ``h``;
* :meth:`AggregationOp.infer` — the exact op for inference (no history read, no autograd).

Three implementations, one per way of executing:

* :class:`HistoryOp` — the pipeline's history-backed chunk op: :class:`~gnnpipe.tasks.nodes.history.ChunkAggregate`
  (forward ``H_in[R_c] ← x_c`` then ``Â[R_c, :] @ H_in``; the pull backward ``Âᵀ[R_c, :] @ G_out``);
  inference is ``Â @ H`` on the whole graph;
* :class:`PeerHistoryOp` — the hybrid's op: the same chunk op plus the exchange of the slot's chunk rows
  with the peers of the stage (:class:`PeerExchange`); inference uses the graph-parallel halo;
* :class:`HaloOp` — graph parallelism: ``Â[own, :] @ [H_own; H_halo]`` with the halo rows exchanged before
  the product and their gradient returned to the owners (exact; no history).

:func:`unit_aggregators` is the one place that numbers a unit's ``agg(h, kind)`` calls and checks them
against the kinds the unit declares.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

from ...core.comm import Comm
from ...errors import ConfigError
from ...models import GNNModel
from .graph import CompactRows, GraphOps, csr_transpose, spmm
from .history import ChunkAggregate, ChunkPushPull, History, PushHistory

#: tag bases of the graph-level exchanges (disjoint from the pipeline's point-to-point tags)
TAG_HALO = 1 << 20
TAG_PEER = 1 << 21
TAG_EVAL = 1 << 22


def op_numbers(model: GNNModel) -> dict[tuple[int, int], int]:
    """``(unit, op index) → k``: the model-wide number of every aggregation op, in execution order (tags use it)."""
    out, k = {}, 0
    for i, u in enumerate(model.units):
        for j, _ in enumerate(u.aggregations):
            out[(i, j)] = k
            k += 1
    return out


def unit_aggregators(units, call: Callable[..., Tensor],
                     push_pull: Callable[[int, int, str], ChunkPushPull | None] | None = None):
    """The ``make_agg`` factory of :meth:`~gnnpipe.models.GNNModel.run_units`: unit ``i`` (of ``units``, e.g.
    ``model.units``; anything indexable by the unit number) gets a callback ``agg(h, kind, layer=None)`` that
    numbers its calls ``j = 0, 1, …`` and returns ``call(i, j, h, kind, layer)`` (``layer``: the message-passing
    layer of a :class:`~gnnpipe.models.MessagePassingUnit`, else ``None``).

    With ``push_pull``, the callback also offers ``agg.push_pull(kind)`` (:mod:`gnnpipe.models.base`): op ``j``
    as ``push_pull(i, j, kind)`` — a :class:`~gnnpipe.tasks.nodes.history.ChunkPushPull` for a unit that fuses its
    chunk step, counted like a call of ``agg`` — or ``None`` (not counted: the unit then calls ``agg``).

    Raises (from the callback):
        ConfigError: a unit calls more aggregations than it declares, or another kind than declared, or passes
            a layer without declaring ``message_passing`` (or the reverse).
    """

    def factory(i: int):
        counter = [0]
        declared = units[i].aggregations

        def next_op(kind: str) -> int:
            j = counter[0]
            if j >= len(declared) or declared[j] != kind:
                raise ConfigError(f"unit {i} called aggregation {kind!r} as op {j}, but declares {declared}")
            return j

        def agg(h: Tensor, kind: str, layer=None) -> Tensor:
            j = next_op(kind)
            if (layer is not None) != bool(getattr(units[i], "message_passing", False)):
                raise ConfigError(f"unit {i}: pass a layer to agg(h, kind, layer) exactly when the unit declares "
                                  f"message_passing = True (it declares {getattr(units[i], 'message_passing', False)})")
            counter[0] += 1
            return call(i, j, h, kind, layer)

        if push_pull is not None:
            def fused(kind: str) -> ChunkPushPull | None:
                op = push_pull(i, next_op(kind), kind)
                if op is not None:
                    counter[0] += 1
                return op

            agg.push_pull = fused
        return agg

    return factory


class AggregationOp(ABC):
    """One aggregation op of a stage (unit ``i``, op ``j``); see the module docstring.

    Attributes:
        history: the op's :class:`History` (``None`` for ops without one, e.g. graph parallelism).
    """

    history: History | None = None

    @abstractmethod
    def train(self, h: Tensor, c: int, rows: tuple[int, int], write: bool, layer=None) -> Tensor:
        """The op on chunk ``c`` (global rows ``rows = (lo, hi)``; ``h`` is ``[hi - lo, d]``) during training.

        ``write=False`` when a chunk is recomputed in its backward: history must not be written twice.
        ``layer``: a message-passing unit's ``layer(x_src, x_dst, edge_index, edge_weight)`` (only the
        halo-gradient ops take one). Returns ``[hi - lo, d_out]``, differentiable in ``h``.
        """

    def push_pull(self, c: int, rows: tuple[int, int], write: bool) -> ChunkPushPull | None:
        """The op on chunk ``c`` as a :class:`~gnnpipe.tasks.nodes.history.ChunkPushPull` (its forward and backward
        halves without autograd) for a unit that fuses its chunk step, or ``None`` (default: not fusable)."""
        return None

    @abstractmethod
    def infer(self, h: Tensor, capture: bool, layer=None) -> Tensor:
        """The exact op for inference on the stage's inference rows (no autograd, no history read).
        ``capture=True`` writes the op's exact input into ``H_in`` (a full refresh of history)."""


class HistoryOp(AggregationOp):
    """The pipeline's chunk op: :class:`ChunkAggregate` over the op's history.

    Args:
        history: the op's buffers. kind: the aggregation kind. ops: the graph's :class:`GraphOps`.
        chunk_adj: ``{(kind, c): (Â[R_c, :], Âᵀ[R_c, :])}`` as :class:`CompactRows`, shared by the stage's ops.
    """

    def __init__(self, history: History, kind: str, ops: GraphOps, chunk_adj: dict):
        self.history, self.kind, self.ops, self.chunk_adj = history, kind, ops, chunk_adj
        self.chunk_ranges: dict[int, tuple[int, int]] = {}
        self._push_pull: dict = {}  # (c, rows, write) -> ChunkPushPull or None: built once, not per chunk action

    def adj(self, c: int, rows: tuple[int, int]) -> tuple[CompactRows, CompactRows]:
        key = (self.kind, c)
        if key not in self.chunk_adj:
            self.chunk_adj[key] = self.ops.chunk_rows(self.kind, *rows)
        self.chunk_ranges[c] = (int(rows[0]), int(rows[1]))
        return self.chunk_adj[key]

    def train(self, h, c, rows, write, layer=None):
        a_c, at_c = self.adj(c, rows)
        return ChunkAggregate.apply(h, self.history, a_c, at_c, rows[0], rows[1], write)

    def push_pull(self, c, rows, write):
        """:class:`ChunkPushPull` of chunk ``c`` (the same object for every action of the chunk: it holds no state
        but the chunk's rows of ``Â``/``Âᵀ``); ``None`` for a subclass that adds to the op (the hybrid's peer
        exchange), which must not be bypassed."""
        key = (c, rows, write)
        op = self._push_pull.get(key, False)
        if op is False:
            op = None
            if type(self).train is HistoryOp.train:
                a_c, at_c = self.adj(c, rows)
                op = ChunkPushPull(self.history, a_c, at_c, rows[0], rows[1], write)
            self._push_pull[key] = op
        return op

    @torch.no_grad()
    def infer(self, h, capture, layer=None):
        """``Â @ h`` on the whole graph, chunk by chunk with the chunks' rows of ``Â`` the op already holds (a
        pipeline stage runs every chunk, so they cover every row; the whole ``Â`` is never built)."""
        if layer is not None:
            raise ConfigError("a message-passing unit needs the halo-gradient op (PushHistoryOp)")
        if capture:
            self.history.ensure(h.size(1))
            self.history.H_in.copy_(h)
        out = h.new_empty(h.size(0), h.size(1))
        covered = 0
        for c, (lo, hi) in self.chunk_ranges.items():
            out[lo:hi] = self.chunk_adj[(self.kind, c)][0].mm(h)
            covered += hi - lo
        if covered != h.size(0):
            raise RuntimeError(f"op {self.history.name}: exact inference needs the rows of every chunk of Â "
                               f"({h.size(0)} rows), the op holds {covered}")
        return out


class PushGather(torch.autograd.Function):
    """The halo-gradient op's gather (docs/HALO_GRADIENT.md): forward writes ``H_in[R_c] ← h`` and returns
    ``x_src = [h ; H_in[halo(c)]]`` (``[n + |halo|, d]``: fresh own rows, history for the halo, up-cast to
    ``h``'s dtype when ``H_in`` is stored narrower, ``--history-dtype``); backward pushes the halo rows'
    gradient into ``G_in`` (:meth:`~gnnpipe.tasks.nodes.history.PushHistory.push`) and returns the own rows' gradient
    plus ``G_in[R_c]`` (what the other chunks pushed into this chunk)."""

    @staticmethod
    def forward(ctx, h: Tensor, hist, halo: Tensor, c: int, start: int, end: int,
                write: bool = True) -> Tensor:  # type: ignore[override]
        hist.ensure(h.size(1))
        if write:
            hist.H_in[start:end] = h.detach()
        ctx.hist, ctx.halo, ctx.c, ctx.start, ctx.end = hist, halo, c, start, end
        return torch.cat([h.detach(), hist.recall(start, write, lambda: hist.H_in[halo].to(h.dtype))])

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        hist, n = ctx.hist, ctx.end - ctx.start
        hist.push(ctx.c, ctx.halo, g[n:], ctx.start)
        return g[:n] + hist.G_in[ctx.start: ctx.end], None, None, None, None, None, None


class PushHistoryOp(AggregationOp):
    """The halo-gradient history op of a message-passing unit (pipeline; docs/HALO_GRADIENT.md).

    Training, chunk ``c``: ``x_src = PushGather(h)`` (``[h ; H_in[halo(c)]]``), then
    ``layer(x_src, h, edge_index_c, edge_weight_c)`` on the chunk's in-edges (the non-zeros of
    ``Â[R_c, :]`` of ``kind``) in bipartite form. The layer may be any differentiable function of them;
    autograd gives the halo rows' gradient, which is pushed to their chunks (see :class:`PushGather`).
    Inference: the layer on the whole graph, whose edges are put together from the chunks' in-edges the op
    holds (a pipeline stage runs every chunk; the whole ``Â`` is never built).

    Args:
        history: a :class:`~gnnpipe.tasks.nodes.history.PushHistory`. kind: the kind whose ``Â`` gives the edges
            (``sum`` for the plain graph). ops: the graph's :class:`GraphOps`.
        chunk_edges: ``{("push", kind, c): (halo, edge_index, edge_weight)}`` shared by the stage's ops.
    """

    def __init__(self, history, kind: str, ops: GraphOps, chunk_edges: dict):
        self.history, self.kind, self.ops, self.chunk_edges = history, kind, ops, chunk_edges
        self.chunk_ranges: dict[int, tuple[int, int]] = {}

    def adj(self, c: int, rows: tuple[int, int]):
        key = ("push", self.kind, c)
        if key not in self.chunk_edges:
            self.chunk_edges[key] = self.ops.bipartite_rows(self.kind, *rows)
        self.chunk_ranges[c] = (int(rows[0]), int(rows[1]))
        return self.chunk_edges[key]

    def train(self, h, c, rows, write, layer=None):
        if layer is None:
            raise ConfigError("the halo-gradient op runs a message-passing layer: call agg(h, kind, layer)")
        halo, edge_index, weight = self.adj(c, rows)
        x_src = PushGather.apply(h, self.history, halo, c, rows[0], rows[1], write)
        return layer(x_src, h, edge_index, weight)

    def edges(self) -> tuple[Tensor, Tensor]:
        """The edges of ``Â`` of the op's kind as :meth:`GraphOps.edges` gives them (global ids, destinations
        ascending, sources ascending within a row, the same weights), put together from the chunks' in-edges.

        Raises:
            RuntimeError: the op's chunks do not cover every row.
        """
        srcs, dsts, ws, covered = [], [], [], 0
        for c, (lo, hi) in sorted(self.chunk_ranges.items(), key=lambda kv: kv[1][0]):
            halo, edge_index, weight = self.chunk_edges[("push", self.kind, c)]
            n, src = hi - lo, edge_index[0]
            own = src < n
            glob = torch.where(own, src + lo, halo[(src - n).clamp(min=0)] if halo.numel() else src + lo)
            srcs.append(glob)
            dsts.append(edge_index[1] + lo)
            ws.append(weight)
            covered += n
        if covered != self.ops.num_nodes:
            raise RuntimeError(f"op {self.history.name}: exact inference needs the in-edges of every chunk "
                               f"({self.ops.num_nodes} rows), the op holds {covered}")
        return torch.stack([torch.cat(srcs), torch.cat(dsts)]), torch.cat(ws)

    @torch.no_grad()
    def infer(self, h, capture, layer=None):
        if capture:
            self.history.ensure(h.size(1))
            self.history.H_in.copy_(h)
        edge_index, weight = self.edges()
        return layer(h, h, edge_index, weight)


def history_op(unit, kind: str, num_nodes: int, dtype: torch.dtype, device, name: str, ops: GraphOps,
               adj: dict, hist_dtype: torch.dtype | None = None) -> AggregationOp:
    """The pipeline's op for one aggregation of ``unit``: :class:`PushHistoryOp` over a new
    :class:`~gnnpipe.tasks.nodes.history.PushHistory` when the unit declares ``message_passing``, else
    :class:`HistoryOp` over a new :class:`History` (``adj`` is the stage's shared cache of chunk rows).
    ``hist_dtype``: the storage dtype of the history (``--history-dtype``; default ``dtype``); a push op's
    gradient sums stay in ``dtype`` (:class:`~gnnpipe.tasks.nodes.history.PushHistory`)."""
    if getattr(unit, "message_passing", False):
        return PushHistoryOp(PushHistory(num_nodes, hist_dtype or dtype, name, device, grad_dtype=dtype),
                             kind, ops, adj)
    return HistoryOp(History(num_nodes, hist_dtype or dtype, name, device), kind, ops, adj)


# ---------------------------------------------------------------------------------------------- GP halo
class HaloExchange:
    """One way's view of the graph-parallel halo: own rows, halo rows, local CSR, exchange lists.

    Args:
        ops: the graph's :class:`GraphOps` (relabelled ids).
        way: this way ``w``. num_ways: ``W``. lo, hi: own rows ``[lo, hi)``.
        fwd: forward send lists keyed by ``(way, q)`` (:func:`gnnpipe.tasks.nodes.parallel.send_lists`).
        peer_ranks: global rank of each way's peer in the exchange (index = way).
        comm: the byte-counting facade.

    Attributes:
        send_idx: ``{q: LongTensor}`` local (own-row) indices sent to way ``q`` (this way's mirrors towards ``q``).
        recv_sizes: ``{q: int}`` rows received from ``q`` (in halo order: ways ascending).
        halo: ``LongTensor[n_halo]`` global ids of the halo rows, in the order of the local columns ``n_own:``.
    """

    def __init__(self, ops: GraphOps, way: int, num_ways: int, lo: int, hi: int,
                 fwd: dict[tuple[int, int], Tensor], peer_ranks: list[int], comm: Comm):
        self.ops, self.w, self.W, self.lo, self.hi = ops, way, num_ways, lo, hi
        self.n_own = hi - lo
        self.peer_ranks = list(peer_ranks)
        self.comm = comm
        self.peers = [q for q in range(num_ways) if q != way]
        self.send_idx = {q: (fwd[(way, q)] - lo).to(ops.device) for q in self.peers if (way, q) in fwd}
        recv = [(q, fwd[(q, way)]) for q in self.peers if (q, way) in fwd]
        self.recv_sizes = {q: int(t.numel()) for q, t in recv}
        self.halo = torch.cat([t for _, t in recv]) if recv else torch.zeros(0, dtype=torch.long)
        self.n_halo = int(self.halo.numel())
        self._local = torch.full((ops.num_nodes,), -1, dtype=torch.long)
        self._local[lo:hi] = torch.arange(self.n_own)
        self._local[self.halo] = torch.arange(self.n_own, self.n_own + self.n_halo)
        self._local = self._local.to(ops.device)
        self._adj: dict[str, tuple[Tensor, Tensor]] = {}

    @property
    def mirrors_sent(self) -> int:
        """Rows this way sends per aggregation (its share of ``M``)."""
        return int(sum(t.numel() for t in self.send_idx.values()))

    def adj(self, kind: str) -> tuple[Tensor, Tensor]:
        """``(Â_local, Â_localᵀ)``: ``n_own × (n_own + n_halo)`` rows ``[lo, hi)`` of ``Â`` with local columns, and its
        transpose."""
        if kind not in self._adj:
            a = self.ops.rows(kind, [(self.lo, self.hi)])[0]  # the way's rows only, from the edge list
            cols = self._local[a.col_indices()]
            if bool((cols < 0).any()):
                raise RuntimeError(f"way {self.w}: Â[{kind}] reads a vertex that is neither owned nor a halo row")
            # own copies of the arrays: accessors of a CSR tensor keep the whole tensor (its global columns) alive
            a_loc = torch.sparse_csr_tensor(a.crow_indices().clone(), cols, a.values().clone(),
                                            (self.n_own, self.n_own + self.n_halo), dtype=a.dtype)
            del a
            self._adj[kind] = (a_loc, csr_transpose(a_loc))
        return self._adj[kind]

    def gather(self, h_own: Tensor, tag: int, kind: str = "graph") -> Tensor:
        """Forward exchange: send mirror rows of ``h_own``, return the halo rows ``[n_halo, d]``."""
        d = h_own.size(1)
        h_own = h_own.detach()
        sends = [(h_own[idx], self.peer_ranks[q]) for q, idx in self.send_idx.items()]
        bufs = [(torch.empty(n, d, dtype=h_own.dtype, device=h_own.device), self.peer_ranks[q])
                for q, n in self.recv_sizes.items()]
        self.comm.exchange(sends, bufs, tag, kind)
        if not bufs:
            return h_own.new_zeros(0, d)
        return torch.cat([b for b, _ in bufs])

    def scatter_grad(self, g_local: Tensor, tag: int, kind: str = "graph") -> Tensor:
        """Backward exchange: send the halo part of ``g_local`` (``[n_own + n_halo, d]``) to the owners,
        receive the gradients of this way's mirrors and add them; returns the own-row gradient ``[n_own, d]``."""
        d = g_local.size(1)
        g_own = g_local[: self.n_own].clone()
        parts = torch.split(g_local[self.n_own:], list(self.recv_sizes.values())) if self.recv_sizes else []
        sends = [(p, self.peer_ranks[q]) for q, p in zip(self.recv_sizes, parts)]
        bufs = [(torch.empty(idx.numel(), d, dtype=g_local.dtype, device=g_local.device), self.peer_ranks[q], idx)
                for q, idx in self.send_idx.items()]
        self.comm.exchange(sends, [(b, r) for b, r, _ in bufs], tag, kind)
        for b, _, idx in bufs:
            g_own.index_add_(0, idx, b)
        return g_own

    @torch.no_grad()
    def aggregate_nograd(self, h_own: Tensor, kind: str, tag: int, comm_kind: str = "eval") -> tuple[Tensor, Tensor]:
        """Exact ``Â[lo:hi, :] @ H`` without autograd; returns ``(out [n_own, d], halo rows [n_halo, d])``."""
        halo = self.gather(h_own, tag, comm_kind)
        a, _ = self.adj(kind)
        return spmm(a, torch.cat([h_own, halo])), halo


def local_edges(halo: HaloExchange, kind: str) -> tuple[Tensor, Tensor]:
    """``(edge_index, edge_weight)``: the non-zeros of a way's local ``Â`` of ``kind`` as PyG edges, sources in
    local numbering (own rows ``0 … n_own−1``, then the halo rows), destinations the own rows."""
    a, _ = halo.adj(kind)
    crow = a.crow_indices()
    dst = torch.repeat_interleave(torch.arange(halo.n_own, device=crow.device), crow.diff())
    return torch.stack([a.col_indices(), dst]), a.values()


class HaloAggregate(torch.autograd.Function):
    """``Â[own, :] @ H`` on one way: forward exchanges mirror rows, backward returns the halo gradient to
    the owners (graph parallelism). Exact."""

    @staticmethod
    def forward(ctx, h_own: Tensor, halo: HaloExchange, kind: str, tag: int) -> Tensor:  # type: ignore[override]
        rows = halo.gather(h_own, tag)
        a, at = halo.adj(kind)
        ctx.halo, ctx.at, ctx.tag = halo, at, tag
        return spmm(a, torch.cat([h_own.detach(), rows]))

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        g_local = spmm(ctx.at, g.contiguous())
        return ctx.halo.scatter_grad(g_local, ctx.tag + 1), None, None, None


class HaloOp(AggregationOp):
    """Graph parallelism's op ``k``: :class:`HaloAggregate` in training, the halo exchange of kind ``eval``
    in inference. Exact; chunk ids are ignored (a way's rows are one chunk).

    For a message-passing unit (``layer`` given) the op is the halo-gradient op of graph parallelism:
    :class:`HaloGather` returns ``[H_own ; H_halo]`` (halo rows exchanged forward) and the layer runs on the
    way's in-edges in bipartite form; the halo rows' gradient goes back to their owners (the same rows, so
    the same bytes as the linear op's backward)."""

    def __init__(self, halo: HaloExchange, kind: str, number: int):
        self.halo, self.kind, self.number = halo, kind, number
        halo.adj(kind)  # build the local matrices up front

    def edges(self) -> tuple[Tensor, Tensor]:
        """``(edge_index, edge_weight)`` of the way's local ``Â`` (sources local: own rows, then halo rows)."""
        return local_edges(self.halo, self.kind)

    def train(self, h, c, rows, write, layer=None):
        if layer is not None:
            edge_index, weight = self.edges()
            return layer(HaloGather.apply(h, self.halo, TAG_HALO + 2 * self.number), h, edge_index, weight)
        return HaloAggregate.apply(h, self.halo, self.kind, TAG_HALO + 2 * self.number)

    def infer(self, h, capture, layer=None):
        if layer is not None:
            edge_index, weight = self.edges()
            rows = self.halo.gather(h, TAG_EVAL + self.number, "eval")
            return layer(torch.cat([h, rows]), h, edge_index, weight)
        return self.halo.aggregate_nograd(h, self.kind, TAG_EVAL + self.number)[0]


class HaloGather(torch.autograd.Function):
    """``[H_own ; H_halo]`` on one way (forward: the mirror rows exchanged); backward returns the halo rows'
    gradient to their owners and adds the gradients of this way's mirrors (exact)."""

    @staticmethod
    def forward(ctx, h_own: Tensor, halo: HaloExchange, tag: int) -> Tensor:  # type: ignore[override]
        ctx.halo, ctx.tag = halo, tag
        return torch.cat([h_own.detach(), halo.gather(h_own, tag)])

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        return ctx.halo.scatter_grad(g.contiguous(), ctx.tag + 1), None, None


# ---------------------------------------------------------------------------------------------- hybrid
class PeerExchange:
    """The hybrid's exchange of one slot's chunk rows among the ``W`` peers of a stage (module docstring of
    :mod:`gnnpipe.tasks.nodes.parallel`).

    Args:
        way: this way ``w``. num_ways: ``W``. way_base: first global chunk id of each way.
        fwd_lists, bwd_lists: :func:`~gnnpipe.tasks.nodes.parallel.send_lists` by ``(chunk, way)``, forward / backward.
        peer_ranks: global rank of each way's peer. comm: the byte-counting facade.
    """

    def __init__(self, way: int, num_ways: int, way_base: list[int], fwd_lists: dict, bwd_lists: dict,
                 peer_ranks: list[int], comm: Comm):
        self.w, self.W, self.way_base = way, num_ways, list(way_base)
        self.fwd_lists, self.bwd_lists = fwd_lists, bwd_lists
        self.peer_ranks, self.comm = list(peer_ranks), comm

    def peer_chunks(self, c: int) -> list[int]:
        """The global chunks the other ways process in the slot where this way processes global chunk ``c``."""
        local = c - self.way_base[self.w]
        return [self.way_base[q] + local for q in range(self.W) if q != self.w]

    def exchange(self, buf: Tensor, c: int, number: int, backward: bool) -> None:
        """Send this way's rows of chunk ``c`` that peers read from ``buf`` (``H_in`` forward, ``G_out``
        backward) and write the rows the peers send into ``buf``."""
        lists = self.bwd_lists if backward else self.fwd_lists
        local = c - self.way_base[self.w]
        sends, recvs = [], []
        for q in range(self.W):
            if q == self.w:
                continue
            idx = lists.get((c, q))
            if idx is not None:
                sends.append((buf[idx], self.peer_ranks[q]))
            ridx = lists.get((self.way_base[q] + local, self.w))
            if ridx is not None:
                recvs.append((torch.empty(ridx.numel(), buf.size(1), dtype=buf.dtype, device=buf.device),
                              self.peer_ranks[q], ridx))
        self.comm.exchange(sends, [(b, r) for b, r, _ in recvs], TAG_PEER + 2 * number + int(backward), "graph")
        for b, _, ridx in recvs:
            buf[ridx] = b


class PeerChunkAggregate(torch.autograd.Function):
    """The pipeline's chunk aggregation op plus the hybrid peer exchange: forward writes
    ``H_in[R_c] ← x_c``, exchanges the slot's chunk rows with the peers, returns ``Â[R_c, :] @ H_in``;
    backward writes ``G_out[R_c] ← g``, exchanges, returns the pull ``Âᵀ[R_c, :] @ G_out``."""

    @staticmethod
    def forward(ctx, x_c: Tensor, op: PeerHistoryOp, a_c, at_c, start: int, end: int, c: int,
                write: bool = True) -> Tensor:  # type: ignore[override]
        hist = op.history
        hist.ensure(x_c.size(1))
        if write:
            hist.H_in[start:end] = x_c.detach()
            op.peers.exchange(hist.H_in, c, op.number, backward=False)
        ctx.op, ctx.at_c, ctx.start, ctx.end, ctx.c = op, at_c, start, end, c
        return hist.recall(start, write, lambda: spmm(a_c, hist.H_in), copy=True)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        op = ctx.op
        hist = op.history
        hist.G_out[ctx.start: ctx.end] = g
        op.peers.exchange(hist.G_out, ctx.c, op.number, backward=True)
        return spmm(ctx.at_c, hist.G_out), None, None, None, None, None, None, None


class PeerHistoryOp(HistoryOp):
    """The hybrid's op: :class:`PeerChunkAggregate` in training; in inference the exact graph-parallel halo
    exchange among the stage's peers over this way's rows (``capture`` writes own and halo rows — every row
    this way's aggregations read — into ``H_in``).

    Args:
        history, kind, ops, chunk_adj: as :class:`HistoryOp`. peers: the stage's :class:`PeerExchange`.
        number: the model-wide op number (tags). halo: a callable returning the way's :class:`HaloExchange`
            (built on first inference).
    """

    def __init__(self, history: History, kind: str, ops: GraphOps, chunk_adj: dict, peers: PeerExchange,
                 number: int, halo: Callable[[], HaloExchange]):
        super().__init__(history, kind, ops, chunk_adj)
        self.peers, self.number, self._halo = peers, number, halo

    def train(self, h, c, rows, write, layer=None):
        if layer is not None:
            raise ConfigError("a message-passing unit needs the halo-gradient op (PeerPushOp) in a hybrid")
        a_c, at_c = self.adj(c, rows)
        return PeerChunkAggregate.apply(h, self, a_c, at_c, rows[0], rows[1], c, write)

    @torch.no_grad()
    def infer(self, h, capture, layer=None):
        halo = self._halo()
        out, rows = halo.aggregate_nograd(h, self.kind, TAG_EVAL + self.number)
        if capture:
            self.history.ensure(h.size(1))
            self.history.H_in[halo.lo:halo.hi] = h
            self.history.H_in[halo.halo] = rows
        return out


class PeerPushGather(torch.autograd.Function):
    """:class:`PushGather` in a hybrid way: forward also exchanges the slot's chunk rows of ``H_in`` with the
    peers (as :class:`PeerChunkAggregate`); backward pushes the halo rows' gradient into this way's ``G_in``
    for its own rows and sends the rows of other ways' chunks to those ways, which push them into theirs
    (keyed by the sending chunk), before adding ``G_in[R_c]``."""

    @staticmethod
    def forward(ctx, h: Tensor, op: PeerPushOp, c: int, start: int, end: int,
                write: bool = True) -> Tensor:  # type: ignore[override]
        hist = op.history
        hist.ensure(h.size(1))
        if write:
            hist.H_in[start:end] = h.detach()
            op.peers.exchange(hist.H_in, c, op.number, backward=False)
        ctx.op, ctx.c, ctx.start, ctx.end = op, c, start, end
        return torch.cat([h.detach(), hist.recall(start, write, lambda: hist.H_in[op.bipartite(c)[0]].to(h.dtype))])

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        op, n = ctx.op, ctx.end - ctx.start
        op.push(ctx.c, g[n:])
        return g[:n] + op.history.G_in[ctx.start: ctx.end], None, None, None, None, None


class PeerPushOp(AggregationOp):
    """The hybrid's halo-gradient op of a message-passing unit: :class:`PeerPushGather` and the layer on the
    chunk's in-edges in training; in inference the graph-parallel halo exchange over the way's rows and the
    layer on the way's local edges (``capture`` writes own and halo rows into ``H_in``).

    Args:
        history: a :class:`~gnnpipe.tasks.nodes.history.PushHistory`. kind, ops, chunk_edges: as :class:`PushHistoryOp`.
        peers: the stage's :class:`PeerExchange`. number: the model-wide op number (tags). halo: a callable
            returning the way's :class:`HaloExchange`. way_of: ``LongTensor[N]``, the way owning each vertex.
    """

    def __init__(self, history, kind: str, ops: GraphOps, chunk_edges: dict, peers: PeerExchange, number: int,
                 halo: Callable[[], HaloExchange], way_of: Tensor, rows: Callable[[int], tuple[int, int]]):
        self.history, self.kind, self.ops, self.chunk_edges = history, kind, ops, chunk_edges
        self.peers, self.number, self._halo, self.way_of, self.rows = peers, number, halo, way_of, rows

    def bipartite(self, c: int):
        """``(halo, edge_index, edge_weight)`` of chunk ``c`` of this way (:meth:`GraphOps.bipartite_rows`)."""
        key = ("push", self.kind, c)
        if key not in self.chunk_edges:
            self.chunk_edges[key] = self.ops.bipartite_rows(self.kind, *self.rows(c))
        return self.chunk_edges[key]

    def halo_of(self, c: int) -> Tensor:
        """The halo rows (sorted global ids) of chunk ``c``, of any way: for a peer way's chunk only these ids
        are kept, not its edges (a lean rank holds the in-edges of its own chunks only)."""
        key = ("push", self.kind, c)
        if key in self.chunk_edges:
            return self.chunk_edges[key][0]
        hkey = ("push-halo", self.kind, c)
        if hkey not in self.chunk_edges:
            self.chunk_edges[hkey] = self.ops.bipartite_rows(self.kind, *self.rows(c))[0]
        return self.chunk_edges[hkey]

    def adj(self, c: int, rows: tuple[int, int]):
        """The chunk's bipartite edges, built now (what a stage factory calls up front)."""
        return self.bipartite(c)

    def push(self, c: int, g_halo: Tensor) -> None:
        """Chunk ``c``'s halo gradient: own-way rows into ``G_in``; the others sent to their ways, whose
        peer chunks of this slot send theirs here (pushed under the sending chunk's id)."""
        w = self.peers.w
        halo = self.bipartite(c)[0]
        owner = self.way_of[halo]
        mine = owner == w
        self.history.push(c, halo[mine], g_halo[mine], self.rows(c)[0])
        sends, recvs = [], []
        for q, cq in zip([q for q in range(self.peers.W) if q != w], self.peers.peer_chunks(c)):
            m = owner == q
            if bool(m.any()):
                sends.append((g_halo[m].contiguous(), self.peers.peer_ranks[q]))
            hq = self.halo_of(cq)
            rq = hq[self.way_of[hq] == w]
            if rq.numel():
                recvs.append((torch.empty(rq.numel(), g_halo.size(1), dtype=g_halo.dtype, device=g_halo.device),
                              self.peers.peer_ranks[q], cq, rq))
        self.peers.comm.exchange(sends, [(b, r) for b, r, _, _ in recvs], TAG_PEER + 2 * self.number + 1, "graph")
        for b, _, cq, rq in recvs:
            self.history.push(cq, rq, b, self.rows(cq)[0])

    def train(self, h, c, rows, write, layer=None):
        if layer is None:
            raise ConfigError("the halo-gradient op runs a message-passing layer: call agg(h, kind, layer)")
        _, edge_index, weight = self.bipartite(c)
        return layer(PeerPushGather.apply(h, self, c, rows[0], rows[1], write), h, edge_index, weight)

    @torch.no_grad()
    def infer(self, h, capture, layer=None):
        halo = self._halo()
        rows = halo.gather(h, TAG_EVAL + self.number, "eval")
        if capture:
            self.history.ensure(h.size(1))
            self.history.H_in[halo.lo:halo.hi] = h
            self.history.H_in[halo.halo] = rows
        edge_index, weight = local_edges(halo, self.kind)
        return layer(torch.cat([h, rows]), h, edge_index, weight)


__all__ = [
    "TAG_EVAL",
    "TAG_HALO",
    "TAG_PEER",
    "AggregationOp",
    "HaloAggregate",
    "HaloExchange",
    "HaloGather",
    "HaloOp",
    "HistoryOp",
    "PeerChunkAggregate",
    "PeerExchange",
    "PeerHistoryOp",
    "PeerPushGather",
    "PeerPushOp",
    "PushGather",
    "PushHistoryOp",
    "history_op",
    "local_edges",
    "op_numbers",
    "unit_aggregators",
]
