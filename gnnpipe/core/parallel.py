"""Graph-parallel (GP) and hybrid executors (DESIGN §1, §5, §6).

**Graph parallelism** (``W`` ways × 1 stage, :class:`GraphParallelWay`). After relabelling, way ``w``
owns the contiguous vertex rows ``[lo_w, hi_w)`` (its part of the way partition, default plain METIS
with one part per rank) and holds *all* layer units. Before every aggregation it exchanges exactly the
**mirror rows**: way ``p`` sends way ``q`` the embeddings of its vertices ``j`` with an edge ``j → i``
into ``q`` (rows of ``Â`` are destinations, so ``q``'s aggregation reads ``j``); ``q`` appends them as
*halo* rows to its own and multiplies by its CSR slice ``Â[lo_q:hi_q, :]`` with columns remapped to
``[own; halo]``. In the backward the gradient of the halo rows (``Â_localᵀ @ g``) goes back to the owners
and is added to their rows' gradient. Both directions are one batched point-to-point exchange
(:meth:`~gnnpipe.core.comm.Comm.exchange`, kind ``graph``) over index lists computed once, inside a
custom autograd function (:class:`HaloAggregate`), so autograd drives it and the models run unchanged
through the aggregation callback. Weight gradients are summed with one all-reduce of the flattened
gradient per epoch (kind ``weight``), then every way takes the same Adam step. GP is exact: no history,
no staleness; it keeps no chunk structure (chunks beyond one per way are ignored).

**Hybrid** (``W`` ways × ``S`` stages, :class:`HybridMember`). Rank layout: ``rank = way · S + stage``
(the layout string :func:`~gnnpipe.core.runner.build_plan` stores). Process groups: one per pipeline
(ranks of one way) and one per peer group (ranks of one stage). The ``C`` chunks form ``W`` contiguous
blocks of ``C / W`` chunks (``C`` must be divisible by ``W``); way ``w`` pipelines its block exactly as
:class:`~gnnpipe.core.pipeline.PipelineStage` does (same scheduler, same order policy, so in every slot
all peers of a stage process their ``t``-th chunk of the epoch order). At every aggregation op the peers
of a stage exchange, for the chunk each processes in that slot:

* forward: the ``H_in`` rows of its chunk that the other way's vertices read (vertices ``j`` of the
  chunk with an edge into the other way); the receiver writes them into its ``H_in``, so they are fresh;
* backward: the ``G_out`` rows of its chunk whose aggregation reads the other way's vertices (vertices
  ``i`` of the chunk with an edge from the other way), so the other way's pull reads them fresh.

Summed over a way's chunks the forward lists are exactly that way's GP mirror lists, so the graph-level
bytes per epoch are the GP term ``2·4·M·Σd`` for an undirected graph (directed graphs: forward ``M``,
backward the reverse mirror count). With one chunk per way everything is fresh and the hybrid equals
single-process training. Weight gradients are all-reduced within each peer group at the stage's
optimizer step. Correctors see the whole chunk structure (``StageContext.chunk_ptr`` is the global one):
their ``after_forward`` / ``after_backward`` hooks also fire for the peers' chunks of the slot (whose rows
were just exchanged; e.g. T2 doubles those ``G_out`` rows too), and ``StageContext.fresh_chunks`` lists
the peer chunks exchanged so far in the epoch.

Evaluation in both modes is exact full-graph inference with the GP halo exchange (kind ``eval``); the
correct counts are gathered from every rank, so every rank returns the same metrics dict.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..models import GNNModel
from .comm import Comm
from .config import TrainConfig
from .graph import GraphOps, csr_row_slice, csr_transpose, spmm
from .history import History
from .pipeline import PipelineStage, make_optimizer_for
from .trainer import DTYPES, masked_loss

#: tag bases (peer exchanges never share a (source, destination) pair with pipeline p2p; disjoint anyway)
TAG_HALO = 1 << 20
TAG_PEER = 1 << 21
TAG_EVAL = 1 << 22

__all__ = [
    "GraphParallelWay",
    "HaloExchange",
    "HybridMember",
    "check_parallel_config",
    "hybrid_rank",
    "make_parallel_member",
    "send_lists",
]


# ---------------------------------------------------------------------------------------------- index lists
def send_lists(edge_index: Tensor, owner_of: Tensor, way_of: Tensor, num_ways: int,
               backward: bool = False) -> dict[tuple[int, int], Tensor]:
    """Rows a group of vertices must send to each other way, from the directed ``edge_index`` (``j → i``).

    Forward (``backward=False``): for every group ``g`` (a way, or a chunk) and way ``q``, the sorted
    vertices ``j`` of ``g`` with an edge ``j → i`` into ``q ≠ way(j)`` (``q`` reads ``j``'s embedding).
    Backward: the sorted vertices ``i`` of ``g`` with an edge ``j → i`` from ``q ≠ way(i)`` (``q``'s pull
    reads ``i``'s output gradient).

    Args:
        edge_index: ``LongTensor[2, E]`` (relabelled ids). owner_of: ``LongTensor[N]``, the group of
            each vertex (non-decreasing, groups contiguous). way_of: ``LongTensor[N]``. num_ways: ``W``.

    Returns:
        ``{(group, q): LongTensor}`` with only non-empty lists. With ``owner_of = way_of`` the sum of
        the forward lists' lengths is the mirror count ``M`` of DESIGN §6.
    """
    src, dst = edge_index[0].long(), edge_index[1].long()
    v, other = (dst, src) if backward else (src, dst)
    wv, wo = way_of[v], way_of[other]
    cut = wv != wo
    keys = torch.unique(v[cut] * num_ways + wo[cut])  # sorted by vertex, then way
    verts, q = keys // num_ways, keys % num_ways
    g = owner_of[verts]
    gk = g * num_ways + q
    order = torch.sort(gk, stable=True).indices  # vertices stay sorted within a (group, way) pair
    verts, gk = verts[order], gk[order]
    uniq, counts = torch.unique_consecutive(gk, return_counts=True)
    out = {}
    for key, part in zip(uniq.tolist(), torch.split(verts, counts.tolist())):
        out[(key // num_ways, key % num_ways)] = part.clone()
    return out


def _way_of(plan) -> Tensor:
    N = plan.data.num_nodes
    way_of = torch.empty(N, dtype=torch.long)
    for w in range(len(plan.way_ptr) - 1):
        way_of[_way_rows(plan, w)[0]:_way_rows(plan, w)[1]] = w
    return way_of


def _way_rows(plan, w: int) -> tuple[int, int]:
    return int(plan.chunk_ptr[int(plan.way_ptr[w])]), int(plan.chunk_ptr[int(plan.way_ptr[w + 1])])


# ---------------------------------------------------------------------------------------------- GP halo
class HaloExchange:
    """One way's view of the graph-parallel halo: own rows, halo rows, local CSR, exchange lists.

    Args:
        ops: the graph's :class:`GraphOps` (relabelled ids).
        way: this way ``w``. num_ways: ``W``. lo, hi: own rows ``[lo, hi)``.
        fwd: :func:`send_lists` keyed by ``(way, q)``.
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
        self.send_idx = {q: fwd[(way, q)] - lo for q in self.peers if (way, q) in fwd}
        recv = [(q, fwd[(q, way)]) for q in self.peers if (q, way) in fwd]
        self.recv_sizes = {q: int(t.numel()) for q, t in recv}
        self.halo = torch.cat([t for _, t in recv]) if recv else torch.zeros(0, dtype=torch.long)
        self.n_halo = int(self.halo.numel())
        self._local = torch.full((ops.num_nodes,), -1, dtype=torch.long)
        self._local[lo:hi] = torch.arange(self.n_own)
        self._local[self.halo] = torch.arange(self.n_own, self.n_own + self.n_halo)
        self._adj: dict[str, tuple[Tensor, Tensor]] = {}

    @property
    def mirrors_sent(self) -> int:
        """Rows this way sends per aggregation (its share of ``M``)."""
        return int(sum(t.numel() for t in self.send_idx.values()))

    def adj(self, kind: str) -> tuple[Tensor, Tensor]:
        """``(Â_local, Â_localᵀ)``: ``n_own × (n_own + n_halo)`` rows ``[lo, hi)`` of ``Â`` with local columns, and its transpose."""
        if kind not in self._adj:
            a = csr_row_slice(self.ops.adj(kind)[0], self.lo, self.hi)
            cols = self._local[a.col_indices()]
            if bool((cols < 0).any()):
                raise RuntimeError(f"way {self.w}: Â[{kind}] reads a vertex that is neither owned nor a halo row")
            a_loc = torch.sparse_csr_tensor(a.crow_indices(), cols, a.values(),
                                            (self.n_own, self.n_own + self.n_halo), dtype=a.dtype)
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


class HaloAggregate(torch.autograd.Function):
    """``Â[own, :] @ H`` on one way: forward exchanges mirror rows, backward returns the halo gradient to
    the owners (DESIGN §1 graph parallelism). Exact."""

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


def _op_counter_factory(model: GNNModel, make_op):
    """``unit index → agg(h, kind)`` that numbers aggregation ops globally (for tags) and checks kinds."""
    offsets, k = [], 0
    for u in model.units:
        offsets.append(k)
        k += len(u.aggregations)

    def factory(i: int):
        counter = [0]
        kinds = model.units[i].aggregations

        def agg(h: Tensor, kind: str) -> Tensor:
            j = counter[0]
            counter[0] += 1
            if j >= len(kinds) or kinds[j] != kind:
                raise ConfigError(f"unit {i} called aggregation {kind!r} as op {j}, but declares {kinds}")
            return make_op(i, j, offsets[i] + j, h, kind)

        return agg

    return factory


def _gather_accuracy(logits: Tensor | None, y: Tensor, masks: dict[str, Tensor]) -> dict:
    """Exact metrics from each rank's own rows (``logits`` ``None`` on ranks that hold none): counts are
    all-gathered (control traffic, not counted) and summed in rank order, so every rank gets the same dict."""
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


def _allreduce_grads(params: list, comm: Comm, group) -> None:
    """Sum the gradients of ``params`` over ``group`` with one all-reduce of the flattened gradient."""
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.all_reduce(flat, group=group, kind="weight")
    off = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[off: off + n].view_as(p))
        off += n


# ---------------------------------------------------------------------------------------------- GP executor
class GraphParallelWay:
    """One way of graph-parallel training (``W`` ranks × 1 stage); see the module docstring.

    Args:
        config: resolved configuration. model: the full model (same seed on every rank).
        plan: the :class:`~gnnpipe.core.runner.RunPlan` (way ``w`` owns rows of its chunk block).
        way: ``w`` (= rank). comm: byte-counting facade. group: process group of the ``W`` ways
            (``None`` = the world).
    """

    def __init__(self, config: TrainConfig, model: GNNModel, plan, way: int, comm: Comm, group=None,
                 ranks: list[int] | None = None, device: torch.device | str = "cpu"):
        self.config = config
        self.device = torch.device(device)
        self.dtype = DTYPES[config.dtype]
        self.comm = comm
        self.group = group
        self.model = model.to(self.device)
        self.W = len(plan.way_ptr) - 1
        self.w = way
        data = plan.data
        self.lo, self.hi = _way_rows(plan, way)
        self.x = data.x[self.lo:self.hi].to(self.device, self.dtype)
        self.y = data.y[self.lo:self.hi].to(self.device)
        self.masks = {s: getattr(data, f"{s}_mask")[self.lo:self.hi].to(self.device) for s in ("train", "val", "test")}
        self.num_train = int(data.train_mask.sum())
        ops = GraphOps(data.edge_index, data.num_nodes, self.dtype, self.device)
        way_of = _way_of(plan)
        fwd = send_lists(data.edge_index, way_of, way_of, self.W)
        self.halo = HaloExchange(ops, way, self.W, self.lo, self.hi, fwd, ranks or list(range(self.W)), comm)
        for _, kind, _ in model.aggregation_dims():
            self.halo.adj(kind)
        self.units = range(model.num_units)
        self.optimizer = make_optimizer_for(model, config, self.units)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def _factory(self, train: bool):
        def op(i, j, k, h, kind):
            if train:
                return HaloAggregate.apply(h, self.halo, kind, TAG_HALO + 2 * k)
            return self.halo.aggregate_nograd(h, kind, TAG_EVAL + k)[0]

        return _op_counter_factory(self.model, op)

    def train_epoch(self, epoch: int) -> dict:
        """Forward + backward of this way's part, one all-reduce of the weight gradient, one Adam step.
        Returns ``{"loss": …}``: this part's loss sum / global number of training vertices."""
        self.optimizer.zero_grad(set_to_none=False)
        self.model.train()
        out = self.model(self.x, self._factory(True), per_unit=True)
        loss = masked_loss(out, self.y, self.masks["train"], self.num_train)
        loss.backward()
        _allreduce_grads(self.params, self.comm, self.group)
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Exact full-graph inference (GP halo exchange, kind ``eval``); the same dict on every rank."""
        self.model.eval()
        logits = self.model(self.x, self._factory(False), per_unit=True)
        return _gather_accuracy(logits, self.y, self.masks)

    def history_bytes(self) -> int:
        return 0

    def named_grads(self) -> dict[str, Tensor]:
        """Gradients keyed ``units.{i}.{param}`` (after the all-reduce: the full gradient on every way)."""
        out = {}
        for i in self.units:
            for name, p in self.model.units[i].named_parameters():
                out[f"units.{i}.{name}"] = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        return out


# ---------------------------------------------------------------------------------------------- hybrid
class _PeerOp:
    """One aggregation op of a hybrid stage: its history and the peer exchange of the slot's chunk rows."""

    def __init__(self, member: HybridMember, hist: History, number: int):
        self.m, self.hist, self.number = member, hist, number

    def exchange(self, buf: Tensor, c: int, backward: bool) -> None:
        m = self.m
        lists = m.bwd_lists if backward else m.fwd_lists
        local = c - m.base
        sends, recvs = [], []
        for q in range(m.W):
            if q == m.w:
                continue
            idx = lists.get((c, q))
            if idx is not None:
                sends.append((buf[idx], m.peer_ranks[q]))
            ridx = lists.get((m.way_base[q] + local, m.w))
            if ridx is not None:
                recvs.append((torch.empty(ridx.numel(), buf.size(1), dtype=buf.dtype, device=buf.device),
                              m.peer_ranks[q], ridx))
        m.comm.exchange(sends, [(b, r) for b, r, _ in recvs], TAG_PEER + 2 * self.number + int(backward), "graph")
        for b, _, ridx in recvs:
            buf[ridx] = b


class PeerChunkAggregate(torch.autograd.Function):
    """The pipeline's chunk aggregation op (DESIGN §5) plus the hybrid peer exchange: forward writes
    ``H_in[R_c] ← x_c``, exchanges the slot's chunk rows with the peers, returns ``Â[R_c, :] @ H_in``;
    backward writes ``G_out[R_c] ← g``, exchanges, returns the pull ``Âᵀ[R_c, :] @ G_out``."""

    @staticmethod
    def forward(ctx, x_c: Tensor, op: _PeerOp, a_c: Tensor, at_c: Tensor, start: int, end: int, c: int,
                write: bool = True) -> Tensor:  # type: ignore[override]
        hist = op.hist
        hist.ensure(x_c.size(1))
        if write:
            hist.H_in[start:end] = x_c.detach()
            op.exchange(hist.H_in, c, backward=False)
        ctx.op, ctx.at_c, ctx.start, ctx.end, ctx.c = op, at_c, start, end, c
        return spmm(a_c, hist.H_in)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        hist = ctx.op.hist
        hist.G_out[ctx.start: ctx.end] = g
        ctx.op.exchange(hist.G_out, ctx.c, backward=True)
        return spmm(ctx.at_c, hist.G_out), None, None, None, None, None, None, None


class HybridMember(PipelineStage):
    """Stage ``s`` of way ``w``'s pipeline in a ``W × S`` hybrid (module docstring).

    Chunk ids are global (``0 … C−1``); this way's chunks are ``base … base + C/W − 1``, and the scheduler
    and order policy run on local ids ``0 … C/W − 1`` (identical on every way, so slot ``t`` of every peer
    handles its ``t``-th chunk).
    """

    def __init__(self, config: TrainConfig, model: GNNModel, plan, way: int, stage: int, scheduler, order_policy,
                 correctors, comm: Comm, peer_group, pipe_group, device: torch.device | str = "cpu"):
        W, S = config.ways, config.stages
        self.W, self.w = W, way
        ranks = [hybrid_rank(way, s, S) for s in range(S)]
        data = plan.data
        data.x = data.x.to(DTYPES[config.dtype])
        self.way_base = [int(plan.way_ptr[q]) for q in range(W)]
        self.base = self.way_base[way]
        self.own_chunks = range(int(plan.way_ptr[way]), int(plan.way_ptr[way + 1]))
        super().__init__(config, model, data, plan.chunk_ptr, plan.bounds, stage, ranks, scheduler, order_policy,
                         correctors, comm, eval_group=pipe_group, device=device)
        self.num_chunks = len(self.own_chunks)
        self.peer_group = peer_group
        self.peer_ranks = [hybrid_rank(q, stage, S) for q in range(W)]
        way_of = _way_of(plan)
        chunk_of = torch.repeat_interleave(torch.arange(len(plan.chunk_ptr) - 1), plan.chunk_ptr.diff())
        self.fwd_lists = send_lists(data.edge_index, chunk_of, way_of, W)
        self.bwd_lists = send_lists(data.edge_index, chunk_of, way_of, W, backward=True)
        self.way_rows = _way_rows(plan, way)
        self._plan_way_of = way_of
        self._halo: HaloExchange | None = None
        offsets, k = {}, 0
        for i, u in enumerate(model.units):
            for j, _ in enumerate(u.aggregations):
                offsets[(i, j)] = k
                k += 1
        self._ops = {key: _PeerOp(self, h, offsets[key]) for key, h in self.histories.items()}
        self._op_number = offsets
        self.params = [p for i in self.units for p in model.units[i].parameters() if p.requires_grad]
        ys = data
        lo, hi = self.way_rows
        self.masks_own = {s: getattr(ys, f"{s}_mask")[lo:hi] for s in ("train", "val", "test")}

    # ------------------------------------------------------------------ chunk ids
    def _owns_chunk(self, c: int) -> bool:
        """Only this way's chunks are run (and sliced) here."""
        return c in self.own_chunks

    def _peer_chunks(self, c: int) -> list[int]:
        local = c - self.base
        return [self.way_base[q] + local for q in range(self.W) if q != self.w]

    def _chunk_op(self, i: int, j: int, kind: str, h: Tensor, c: int, write: bool) -> Tensor:
        """The chunk aggregation with the peers' exchange of this slot's rows (module docstring)."""
        lo, hi = self.rows(c)
        a_c, at_c = self._chunk_adj[(kind, c)]
        return PeerChunkAggregate.apply(h, self._ops[(i, j)], a_c, at_c, lo, hi, c, write)

    def _action_chunk(self, c: int) -> int:
        """Schedule entries are local chunk ids; actions run global ``base + c``."""
        return self.base + c

    def forward_chunk(self, c: int, epoch: int | None = None) -> None:
        """Forward of this way's local chunk ``c`` (global ``base + c``); the correctors' ``after_forward``
        then also fires for the peers' chunks of the slot."""
        e = self.epoch if epoch is None else epoch
        g = self.base + c
        super().forward_chunk(g, e)
        for p in self._peer_chunks(g):
            self.ctx.fresh_chunks.add(p)
            for k in self.correctors:
                k.after_forward(e, p)

    def backward_chunk(self, c: int, epoch: int | None = None) -> None:
        """Backward of local chunk ``c``; ``after_backward`` also fires for the peers' chunks of the slot."""
        e = self.epoch if epoch is None else epoch
        g = self.base + c
        super().backward_chunk(g, e)
        for p in self._peer_chunks(g):
            for k in self.correctors:
                k.after_backward(e, p)

    def step(self) -> None:
        """Sum the weight gradients over the stage's peers, then the stage's step (new weight version)."""
        _allreduce_grads(self.params, self.comm, self.peer_group)
        super().step()

    def train_epoch(self, epoch: int) -> dict:
        self.ctx.fresh_chunks.clear()
        return super().train_epoch(epoch)

    # ------------------------------------------------------------------ exact inference
    def _halo_exchange(self) -> HaloExchange:
        if self._halo is None:
            lo, hi = self.way_rows
            fwd = send_lists(self.data.edge_index, self._plan_way_of, self._plan_way_of, self.W)
            self._halo = HaloExchange(self.ops, self.w, self.W, lo, hi, fwd, self.peer_ranks, self.comm)
        return self._halo

    @torch.no_grad()
    def infer(self, capture: bool = False) -> Tensor | None:
        """Exact inference of this way's rows through its pipeline, with the GP halo exchange among the
        peers of each stage (kind ``eval``). ``capture=True`` writes each op's exact input (own and halo
        rows — every row this way's aggregations read) into ``H_in``. Returns the way's logits on the last stage."""
        self.model.eval()
        halo = self._halo_exchange()
        lo, hi = self.way_rows
        n = hi - lo
        tag = TAG_EVAL + 4096
        if self.is_first:
            h, sh = self.x[lo:hi], None
        else:
            buf = self.comm.recv((n, self.in_dim + self.shared_dim), self.dtype, self.ranks[self.s - 1], tag)
            h = buf[:, : self.in_dim]
            sh = buf[:, self.in_dim:] if self.shared_dim else None

        def op(i, j, k, t, kind):
            out, rows = halo.aggregate_nograd(t, kind, TAG_EVAL + k)
            if capture:
                hist = self.histories[(i, j)]
                hist.ensure(t.size(1))
                hist.H_in[lo:hi] = t
                hist.H_in[halo.halo] = rows
            return out

        out, sh = self.model.run_units(self.lo_unit, self.hi_unit, h, sh, _op_counter_factory(self.model, op))
        return self._pass_on_inference(out, sh, tag)

    def evaluate(self) -> dict:
        """Exact evaluation; every rank of the world gets the same metrics dict."""
        logits = self.infer()
        lo, hi = self.way_rows
        return _gather_accuracy(logits, self.y[lo:hi], self.masks_own)


# ---------------------------------------------------------------------------------------------- factory
def hybrid_rank(way: int, stage: int, num_stages: int) -> int:
    """Global rank of ``(way, stage)``: ``way · S + stage`` (each pipeline is a block of consecutive ranks)."""
    return way * num_stages + stage


def check_parallel_config(config: TrainConfig, num_chunks: int) -> None:
    """Reject W × S layouts the executors cannot run.

    Raises:
        ConfigError: hybrid (``W > 1`` and ``S > 1``) with ``C`` not divisible by ``W``.
    """
    if config.ways > 1 and config.stages > 1 and num_chunks % config.ways:
        raise ConfigError(f"the hybrid mode needs the same number of chunks on every way: {num_chunks} chunks "
                          f"cannot be split evenly over {config.ways} ways; use a multiple of {config.ways}")


def make_parallel_member(config: TrainConfig, model: GNNModel, plan, rank: int, world: int, correctors,
                         comm: Comm, order_policy, device: torch.device | str = "cpu"):
    """This rank's executor for ``config.ways > 1``: a :class:`GraphParallelWay` (``S = 1``) or a
    :class:`HybridMember` (``S > 1``). Creates the process groups (every rank creates every group, in
    the same order). Correctors are unused in GP (exact: no history)."""
    from .runner import make_scheduler

    W, S = config.ways, config.stages
    if W * S != world:
        raise ConfigError(f"world size {world} does not match ways x stages = {W * S}")
    if len(plan.way_ptr) - 1 != W:
        raise ConfigError(f"the plan has {len(plan.way_ptr) - 1} ways, the configuration {W}")
    C = len(plan.chunk_ptr) - 1
    check_parallel_config(config, C)
    if S == 1:
        plan.data.x = plan.data.x.to(DTYPES[config.dtype])
        return GraphParallelWay(config, model, plan, rank, comm, group=None, ranks=list(range(W)), device=device)
    peer_groups = [dist.new_group([hybrid_rank(w, s, S) for w in range(W)]) for s in range(S)]
    pipe_groups = [dist.new_group([hybrid_rank(w, s, S) for s in range(S)]) for w in range(W)]
    way, stage = divmod(rank, S)
    return HybridMember(config, model, plan, way, stage, make_scheduler(config), order_policy,
                        correctors, comm, peer_groups[stage], pipe_groups[way], device=device)
