"""Graph-parallel (GP) and hybrid executors.

**Graph parallelism** (``W`` ways × 1 stage, :func:`make_graph_parallel_way`). After relabelling, way ``w``
owns the contiguous vertex rows ``[lo_w, hi_w)`` (its part of the way partition, default plain METIS
with one part per rank) and holds *all* layer units. Before every aggregation it exchanges exactly the
**mirror rows**: way ``p`` sends way ``q`` the embeddings of its vertices ``j`` with an edge ``j → i``
into ``q`` (rows of ``Â`` are destinations, so ``q``'s aggregation reads ``j``); ``q`` appends them as
*halo* rows to its own and multiplies by its CSR slice ``Â[lo_q:hi_q, :]`` with columns remapped to
``[own; halo]``. In the backward the gradient of the halo rows (``Â_localᵀ @ g``) goes back to the owners
and is added to their rows' gradient. Both directions are one batched point-to-point exchange
(:meth:`~gnnpipe.core.comm.Comm.exchange`, kind ``graph``) over index lists computed once, inside a
custom autograd function (:class:`~gnnpipe.tasks.nodes.aggregation.HaloAggregate`, behind the op object
:class:`~gnnpipe.tasks.nodes.aggregation.HaloOp`), so autograd drives it and the models run unchanged through the
aggregation callback. A way is a one-stage :class:`~gnnpipe.tasks.nodes.stage.Stage` over its rows, run by the same
schedule interpreter as the pipeline (one chunk, ``F``, ``B``, ``STEP``). Weight gradients are summed with one
all-reduce of the flattened gradient per epoch (kind ``weight``), then every way takes the same Adam step. GP is exact:
no history, no staleness; it keeps no chunk structure (chunks beyond one per way are ignored).

**Hybrid** (``W`` ways × ``S`` stages, :func:`make_hybrid_member`). Rank layout: ``rank = way · S + stage``
(the layout string :func:`~gnnpipe.tasks.nodes.runner.build_plan` stores). A member is the pipeline's stage with
another aggregation op (:class:`~gnnpipe.tasks.nodes.aggregation.PeerHistoryOp`: the chunk op plus the peer
exchange) and a gradient all-reduce before each step; it overrides nothing of the stage or the interpreter. Process
groups: one per pipeline (ranks of one way) and one per peer group (ranks of one stage). The ``C`` chunks form ``W``
contiguous blocks of ``C / W`` chunks (``C`` must be divisible by ``W``); way ``w`` pipelines its block exactly as
:func:`~gnnpipe.tasks.nodes.pipeline.make_pipeline_stage` does (same scheduler, same order policy, so in every slot
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
from torch import Tensor

from ... import schedulers
from ...core.comm import Comm, all_reduce_gradients
from ...core.grid import RankGrid
from ...core.settings.config import TrainConfig
from ...models import GNNModel
from .aggregation import (  # noqa: F401  (HaloAggregate, HaloExchange, PeerChunkAggregate: re-exported)
    TAG_EVAL,
    TAG_HALO,
    TAG_PEER,
    HaloAggregate,
    HaloExchange,
    HaloOp,
    PeerChunkAggregate,
    PeerExchange,
    PeerHistoryOp,
    PeerPushOp,
    op_numbers,
)
from .executor import NodeExecutor
from .graph import GraphOps
from .graphfile import release_edge_pages
from .history import PushHistory
from .pipeline import chunk_rows, history_ops
from .stage import Stage

__all__ = [
    "HaloExchange",
    "make_graph_parallel_way",
    "make_hybrid_member",
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
        the forward lists' lengths is the mirror count ``M`` of :func:`gnnpipe.partitioners.metrics.partition_metrics`.
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


# ---------------------------------------------------------------------------------------------- GP
def make_graph_parallel_way(config: TrainConfig, model: GNNModel, plan, way: int, comm: Comm, group=None,
                            ranks: list[int] | None = None, device: torch.device | str = "cpu") -> NodeExecutor:
    """One way of graph-parallel training (``W`` ranks × 1 stage); see the module docstring.

    Args:
        config: resolved configuration. model: the full model (same seed on every rank).
        plan: the :class:`~gnnpipe.tasks.nodes.runner.RunPlan` (way ``w`` owns the rows of its chunk block).
        way: ``w`` (= rank). comm: byte-counting facade. group: process group of the ``W`` ways
            (``None`` = the world). ranks: global rank of each way (default ``0 … W−1``).

    Returns:
        A :class:`NodeExecutor` of a one-stage, one-chunk schedule (gpipe): forward and backward of the way's rows
        with the halo op, the weight-gradient all-reduce and one Adam step per epoch. Correctors do not apply
        (exact: no history).
    """
    device = torch.device(device)
    W = len(plan.way_ptr) - 1
    data = plan.data
    lo, hi = _way_rows(plan, way)
    ops = GraphOps(data.edge_index, data.num_nodes, config.torch_dtype, device,
                   edge_weight=getattr(data, "edge_weight", None))
    way_of = _way_of(plan)
    halo = HaloExchange(ops, way, W, lo, hi, send_lists(data.edge_index, way_of, way_of, W), ranks or list(range(W)),
                        comm)
    numbers = op_numbers(model)
    agg = {(i, j): HaloOp(halo, kind, numbers[(i, j)])
           for i, u in enumerate(model.units) for j, kind in enumerate(u.aggregations)}
    st = Stage(config, model, data, [0, model.num_units], 0, lambda c: (lo, hi), agg, recompute=False, device=device,
               row_range=(lo, hi))
    return NodeExecutor(st, config=config, num_stages=1, ranks=[way], chunks=[0],
                        scheduler=schedulers.make_scheduler("gpipe"), order_policy=schedulers.FixedOrder(),
                        correctors=[], comm=comm, data=data, chunk_ptr=plan.chunk_ptr,
                        sync_grads=lambda: all_reduce_gradients(st.params, comm, group), inference_rows=(lo, hi))


# ---------------------------------------------------------------------------------------------- hybrid
def make_hybrid_member(config: TrainConfig, model: GNNModel, plan, way: int, stage: int, scheduler, order_policy,
                       correctors, comm: Comm, peer_group, pipe_group,
                       device: torch.device | str = "cpu") -> NodeExecutor:
    """Stage ``s`` of way ``w``'s pipeline in a ``W × S`` hybrid (module docstring).

    Chunk ids are global (``0 … C−1``); this way's chunks are ``base … base + C/W − 1``, and the scheduler and
    order policy run on local ids ``0 … C/W − 1`` (identical on every way, so slot ``t`` of every peer handles
    its ``t``-th chunk).
    """
    device = torch.device(device)
    W, S = config.ways, config.stages
    data = plan.data
    grid = RankGrid.of(way=W, stage=S)
    me = grid.rank(way=way, stage=stage)
    ranks = grid.members(("stage",), me)
    way_base = [int(plan.way_ptr[q]) for q in range(W)]
    own = range(int(plan.way_ptr[way]), int(plan.way_ptr[way + 1]))
    peer_ranks = grid.members(("way",), me)
    way_of = _way_of(plan)
    chunk_of = torch.repeat_interleave(torch.arange(len(plan.chunk_ptr) - 1), plan.chunk_ptr.diff())
    peers = PeerExchange(way, W, way_base, send_lists(data.edge_index, chunk_of, way_of, W),
                         send_lists(data.edge_index, chunk_of, way_of, W, backward=True), peer_ranks, comm)
    lo, hi = _way_rows(plan, way)
    numbers = op_numbers(model)
    cache: dict = {}

    def halo_of(ops: GraphOps):
        def get() -> HaloExchange:
            if "halo" not in cache:
                fwd = send_lists(data.edge_index, way_of, way_of, W)
                cache["halo"] = HaloExchange(ops, way, W, lo, hi, fwd, peer_ranks, comm)
                for kind in {k for i in units for k in model.units[i].aggregations}:
                    cache["halo"].adj(kind)  # built now, while the edge list is read anyway
                release_edge_pages(data)
            return cache["halo"]

        return get

    rows = chunk_rows(plan.chunk_ptr)

    def make(hist, kind, ops, adj, i, j):
        if getattr(model.units[i], "message_passing", False):  # the halo-gradient op (docs/HALO_GRADIENT.md)
            push = PushHistory(hist.num_nodes, hist.dtype, hist.name, hist.device, grad_dtype=config.torch_dtype)
            return PeerPushOp(push, kind, ops, adj, peers, numbers[(i, j)], halo_of(ops), way_of, rows)
        return PeerHistoryOp(hist, kind, ops, adj, peers, numbers[(i, j)], halo_of(ops))

    units = range(int(plan.bounds[stage]), int(plan.bounds[stage + 1]))
    agg = history_ops(model, data, units, own, rows, config.torch_dtype, device, make=make,
                      hist_dtype=config.torch_history_dtype)
    st = Stage(config, model, data, plan.bounds, stage, rows, agg, flush=bool(getattr(scheduler, "flush", True)),
               stash=bool(getattr(scheduler, "stash_weights", False)), device=device, row_range=(lo, hi))
    return NodeExecutor(st, config=config, num_stages=S, ranks=ranks, chunks=own, scheduler=scheduler,
                        order_policy=order_policy, correctors=correctors, comm=comm, data=data,
                        chunk_ptr=plan.chunk_ptr, sync_grads=lambda: all_reduce_gradients(st.params, comm, peer_group),
                        peer_chunks=peers.peer_chunks, eval_group=pipe_group, inference_rows=(lo, hi),
                        eval_tag=TAG_EVAL + 4096)
