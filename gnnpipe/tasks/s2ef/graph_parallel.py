"""Graph parallelism's hooks for atomistic models: a rank's local graph view and :class:`GraphParallelComm`.

An atomistic model (``gnnpipe.models.atomistic``) never indexes across shards itself: it calls the hooks of a
``comm`` object (the single-process ``LocalComm`` makes every hook the identity), and reads
its rank's :class:`LocalGraph`. :class:`GraphParallelComm` implements the hooks with the differentiable
collectives of :mod:`gnnpipe.tasks.s2ef.collectives` for a :class:`~gnnpipe.partitioners.GraphParallelPlan`::

    plan = partitioners.plan_graph_parallel(graph, G, "edge-chunk")     # same on every rank
    comm = GraphParallelComm(plan, group=gp_group, mode="halo")
    local = comm.local_graph(graph)                                      # this rank's edges and triplets
    out = model(batch, local, comm)                                      # energy: all-reduced partials

=====================  ===========================================================================================
hook                   what it does
=====================  ===========================================================================================
``atoms_gather(h)``    owned atom rows ``[N_r, d]`` → all atoms ``[N, d]`` (all-gather; backward reduce-scatter)
``atoms_reduce(h)``    partial per-atom sums ``[N, d]`` from local edges → owned atoms ``[N_r, d]`` (reduce-scatter;
                       backward all-gather). When every edge is owned by its target atom's owner (``atom-owner``)
                       and the sums are onto target atoms, a slice (no communication); see ``atoms_reduce``.
``edges_gather(x)``    local edge rows ``[E_r, d]`` → the rows local triplets read ``[E_read, d]`` (``idx_kj`` indexes
                       it; with a graph's ``id_swap`` also the owned edges' reverses, ``idx_swap`` indexes them).
                       ``mode="allgather"``: all ``E`` edges; ``mode="halo"``: local rows then the halo rows.
``sum(x)``             all-reduce sum of partials (partial energies); backward identity
``replicated_grad(g)`` all-reduce of a partial gradient of a replicated input (``∂E_r/∂pos`` → forces' gradient)
=====================  ===========================================================================================
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import Tensor

from ...core.comm import Comm
from ...data.atoms.graph import EdgeGeometry
from ...errors import ConfigError, DataValidationError
from ...partitioners.edges import GraphParallelPlan
from . import collectives as C

__all__ = ["HOOKS", "MODES", "GraphParallelComm", "LocalGraph", "local_graph", "plan_hook_bytes", "reduces_locally"]

MODES = ("allgather", "halo")
#: the hooks of :class:`~gnnpipe.models.atomistic.comm.GraphParallelHooks` that move bytes
HOOKS = ("atoms_gather", "atoms_reduce", "edges_gather", "sum", "replicated_grad")


def reduces_locally(plan: GraphParallelPlan, atoms_reduce: str = "auto") -> bool:
    """Whether ``atoms_reduce`` is a local slice under ``plan`` (see :class:`GraphParallelComm`): ``"local"``, or
    ``"auto"`` when every edge belongs to its target atom's owner (``atom-owner``)."""
    if atoms_reduce == "local":
        return True
    if atoms_reduce != "auto":
        return False
    return bool(torch.equal(plan.edge_owner, plan.atom_owner[plan.edge_targets])) if plan.num_edges else True


def plan_hook_bytes(plan: GraphParallelPlan, rank: int, hook: str, row_numel: int, element_size: int, *,
                    mode: str = "allgather", backend: str = "gloo", backward: bool = False,
                    local_atoms_reduce: bool | None = None) -> float:
    """Bytes rank ``rank`` of ``plan`` sends (kind ``"gp"``) in one call of a :class:`GraphParallelComm` hook on rows
    of ``row_numel`` values (forward; its backward with ``backward=True``), from the plan's shares alone (no process
    group: the cost model calls it).

    ``atoms_gather``: all-gather of the atom shares (backward reduce-scatter); ``atoms_reduce``: reduce-scatter
    (backward all-gather), 0 when it is a local slice (``local_atoms_reduce``; default :func:`reduces_locally`);
    ``edges_gather``: all-gather of the edge shares (``allgather``) or the halo rows others read from this rank
    (``halo``; backward: the rows this rank read go back); ``sum`` / ``replicated_grad``: ring all-reduce of
    ``row_numel`` values (the whole tensor), backward identity (0). Formulas: :mod:`.collectives`
    (``gather_bytes``, ``reduce_scatter_bytes``, ``halo_exchange_bytes``, ``halo_reduce_bytes``, ``all_reduce_bytes``).

    Raises:
        ConfigError: an unknown hook or mode.
    """
    if mode not in MODES:
        raise ConfigError(f"graph-parallel mode must be one of {MODES}; got {mode!r}")
    G = plan.num_ranks
    if hook == "atoms_gather":
        counts = plan.atom_counts
        return (C.reduce_scatter_bytes(counts, row_numel, element_size, backend) if backward
                else C.gather_bytes(counts, row_numel, element_size))
    if hook == "atoms_reduce":
        if local_atoms_reduce is None:
            local_atoms_reduce = reduces_locally(plan)
        if local_atoms_reduce:
            return 0.0
        counts = plan.atom_counts
        return (C.gather_bytes(counts, row_numel, element_size) if backward
                else C.reduce_scatter_bytes(counts, row_numel, element_size, backend))
    if hook == "edges_gather" and mode == "allgather":
        counts = plan.edge_counts
        return (C.reduce_scatter_bytes(counts, row_numel, element_size, backend) if backward
                else C.gather_bytes(counts, row_numel, element_size))
    if hook == "edges_gather":
        send = [int(s.numel()) for q, s in enumerate(plan.halo_send[rank]) if q != rank]
        recv = [c for s, c in enumerate(plan.halo_recv_counts[rank]) if s != rank]
        return (C.halo_reduce_bytes(recv, row_numel, element_size) if backward
                else C.halo_exchange_bytes(send, row_numel, element_size))
    if hook in ("sum", "replicated_grad"):
        return 0.0 if backward else C.all_reduce_bytes(row_numel, element_size, G)
    raise ConfigError(f"unknown hook {hook!r}; the hooks are {', '.join(HOOKS)}")


@attrs.frozen
class LocalGraph(EdgeGeometry):
    """One rank's view of an atomistic graph: ``gnnpipe.data.atoms.AtomGraph``'s attributes and methods, restricted
    to the rank's edges and triplets.

    Atom ids stay global (``[0, N)``): edges read atoms through the all-gathered atom rows.

    Attributes:
        edge_index: ``LongTensor[2, E_r]``: the owned edges (source ``j``, target ``i``), in global order.
        cell_offsets: ``LongTensor[E_r, 3]``: the image of ``j`` of each owned edge (zeros when the graph has none).
        batch: ``LongTensor[N]`` (replicated): the structure of each atom.
        num_nodes: ``N`` (all atoms).
        idx_kj: ``LongTensor[T_r]``: each owned triplet's in-edge as a row of the buffer ``edges_gather`` returns.
        idx_ji: ``LongTensor[T_r]``: each owned triplet's updated edge as a row of the local edges.
        atom_ids, edge_ids, triplet_ids: the owned atoms, edges and triplets (global ids, ascending).
        cutoff, max_neighbors: as the full graph's.
        idx_swap: ``LongTensor[E_r]`` or ``None`` (the graph has no ``id_swap``): each owned edge's reverse as a row
            of the buffer ``edges_gather`` returns, −1 where it has none.
    """

    edge_index: Tensor
    cell_offsets: Tensor
    batch: Tensor
    num_nodes: int
    idx_kj: Tensor
    idx_ji: Tensor
    atom_ids: Tensor
    edge_ids: Tensor
    triplet_ids: Tensor
    cutoff: float = 0.0
    max_neighbors: int | None = None
    idx_swap: Tensor | None = None

    @property
    def num_triplets(self) -> int:
        return int(self.idx_ji.numel())

    @property
    def triplets_per_edge(self) -> Tensor:
        """``LongTensor[E_r]``: owned triplets per owned edge."""
        return torch.bincount(self.idx_ji, minlength=self.num_edges)

    def to(self, device: torch.device | str) -> LocalGraph:
        """A copy with every tensor on ``device``."""
        return attrs.evolve(self, **{f.name: getattr(self, f.name).to(device) for f in attrs.fields(LocalGraph)
                                     if isinstance(getattr(self, f.name), Tensor)})


def local_graph(graph: Any, plan: GraphParallelPlan, rank: int, mode: str = "allgather") -> LocalGraph:
    """Rank ``rank``'s :class:`LocalGraph` of ``graph`` under ``plan`` (``mode`` picks ``idx_kj``'s buffer).

    Args:
        graph: the replicated ``AtomGraph`` (``edge_index``, ``idx_kj``, ``idx_ji``, ``num_nodes``; optional
            ``cell_offsets`` and ``batch``, zeros when absent; ``cutoff``, ``max_neighbors``) the plan was built from.
        plan: its :class:`~gnnpipe.partitioners.GraphParallelPlan`.
        rank: the rank in the graph-parallel group.
        mode: ``"allgather"`` or ``"halo"``.

    Raises:
        DataValidationError: the graph's sizes differ from the plan's. ConfigError: bad ``mode`` or ``rank``.
    """
    if mode not in MODES:
        raise ConfigError(f"graph-parallel mode must be one of {MODES}; got {mode!r}")
    if not 0 <= int(rank) < plan.num_ranks:
        raise ConfigError(f"rank {rank} outside the plan's {plan.num_ranks} ranks")
    ei = graph.edge_index
    t = int(graph.idx_ji.numel())
    if (int(graph.num_nodes), int(ei.size(1)), t) != (plan.num_nodes, plan.num_edges, plan.num_triplets):
        raise DataValidationError(
            f"the graph ({int(graph.num_nodes)} atoms, {int(ei.size(1))} edges, {t} triplets) is not the one the plan "
            f"was built for ({plan.num_nodes}, {plan.num_edges}, {plan.num_triplets}); rebuild the plan for this batch")
    dev = ei.device
    edges = plan.edges[rank].to(dev)
    offsets = getattr(graph, "cell_offsets", None)
    offsets = torch.zeros(ei.size(1), 3, dtype=torch.long, device=dev) if offsets is None else offsets
    batch = getattr(graph, "batch", None)
    batch = torch.zeros(plan.num_nodes, dtype=torch.long, device=dev) if batch is None else batch
    kj = plan.local_idx_kj_allgather[rank] if mode == "allgather" else plan.local_idx_kj_halo[rank]
    swaps = plan.local_idx_swap_allgather if mode == "allgather" else plan.local_idx_swap_halo
    swap = None if swaps is None or getattr(graph, "id_swap", None) is None else swaps[rank].to(dev)
    return LocalGraph(edge_index=ei.index_select(1, edges), cell_offsets=offsets.index_select(0, edges), batch=batch,
                      num_nodes=plan.num_nodes, idx_kj=kj.to(dev), idx_ji=plan.local_idx_ji[rank].to(dev),
                      atom_ids=plan.atoms[rank].to(dev), edge_ids=edges, triplet_ids=plan.triplets[rank].to(dev),
                      cutoff=float(getattr(graph, "cutoff", 0.0) or 0.0),
                      max_neighbors=getattr(graph, "max_neighbors", None), idx_swap=swap)


class GraphParallelComm:
    """The graph-parallel hooks an atomistic model calls, for one rank of a group.

    Args:
        plan: the :class:`~gnnpipe.partitioners.GraphParallelPlan` every rank of the group built.
        rank: this rank in the group (default: ``torch.distributed.get_rank(group)``).
        group: the graph-parallel process group (``None``: the default group).
        mode: ``"allgather"`` (every edge row to every rank) or ``"halo"`` (only the rows local triplets read).
        comm: the :class:`~gnnpipe.core.comm.Comm` counting bytes (kind ``"gp"``); default a new ``Comm(device)``
            (which stages CUDA tensors through host memory under gloo).
        atoms_reduce: ``"auto"`` (a local slice when every edge belongs to its target atom's owner, as under
            ``atom-owner``; else reduce-scatter), ``"reduce-scatter"`` or ``"local"``. The slice is exact when the
            model's edge → atom sums go onto the edges' target atoms (``scatter(..., edge_index[1])``), as SchNet's
            and DimeNet++'s do; a model summing onto source atoms needs ``"reduce-scatter"``.
        device: where the activations and index tensors live (default CPU).
        dtype: the floating dtype every hook communicates in (``None``: its input's). Under ``--amp`` the training
            dtype (float32): a bfloat16 activation is cast up before it travels, so the bytes are those of the cost
            model (:func:`plan_hook_bytes` with the training dtype's element size) and the reduced sums are exact.

    Raises:
        ConfigError: the group's size differs from the plan's, bad ``mode`` / ``atoms_reduce``.
    """

    def __init__(self, plan: GraphParallelPlan, rank: int | None = None, group=None, mode: str = "allgather",
                 comm: Comm | None = None, atoms_reduce: str = "auto", device: torch.device | str = "cpu",
                 dtype: torch.dtype | None = None):
        if mode not in MODES:
            raise ConfigError(f"graph-parallel mode must be one of {MODES}; got {mode!r}")
        if atoms_reduce not in ("auto", "reduce-scatter", "local"):
            raise ConfigError(f"atoms_reduce must be 'auto', 'reduce-scatter' or 'local'; got {atoms_reduce!r}")
        device = torch.device(device)
        self.gp = C.GPGroup(group, comm if comm is not None else Comm(device))
        if rank is not None and int(rank) != self.gp.rank:
            raise ConfigError(f"rank {rank} is not this process's rank {self.gp.rank} in the graph-parallel group")
        if plan.num_ranks != self.gp.size:
            raise ConfigError(f"the plan is for {plan.num_ranks} ranks; the graph-parallel group has {self.gp.size}")
        self.plan, self.mode, self.rank = plan, mode, self.gp.rank
        self.dtype = dtype
        r = self.rank
        self.atom_counts, self.edge_counts = plan.atom_counts, plan.edge_counts
        self.atom_ids = plan.atoms[r].to(device)
        order = plan.atom_order()
        self._atom_identity = bool(torch.equal(order, torch.arange(plan.num_nodes)))
        self._atoms_to_global = torch.argsort(order).to(device)  # row of each atom in the rank-ordered buffer
        self._atoms_to_ranks = order.to(device)
        self.local_atoms_reduce = reduces_locally(plan, atoms_reduce)
        self._send = [s.to(device) for s in plan.halo_send[r]]
        self._recv = plan.halo_recv_counts[r]

    @property
    def comm(self) -> Comm:
        return self.gp.comm

    def local_graph(self, graph: Any) -> LocalGraph:
        """This rank's :class:`LocalGraph` of ``graph`` for this comm's mode (:func:`local_graph`)."""
        return local_graph(graph, self.plan, self.rank, self.mode)

    # ------------------------------------------------------------------ the hooks
    def _wire(self, x: Tensor) -> Tensor:
        """``x`` in the dtype the hooks communicate in (:attr:`dtype`; ``x`` itself without one)."""
        if self.dtype is None or x.dtype == self.dtype or not x.is_floating_point():
            return x
        return x.to(self.dtype)

    def atoms_gather(self, h: Tensor) -> Tensor:
        """Owned atom rows ``[N_r, d]`` (in ``atom_ids`` order) → ``[N, d]`` for all atoms (global order).
        Backward: the ranks' gradients summed, own rows kept."""
        h = self._wire(h)
        out = C.gather(h, self.atom_counts, self.gp)
        return out if self._atom_identity else out.index_select(0, self._atoms_to_global)

    def atoms_reduce(self, h: Tensor) -> Tensor:
        """Partial per-atom sums ``[N, d]`` (this rank's edges' contributions) → owned atoms' totals ``[N_r, d]``.
        Backward: the owned rows' gradients all-gathered."""
        h = self._wire(h)
        if self.local_atoms_reduce:
            return C.split(h, self.atom_ids)
        x = h if self._atom_identity else h.index_select(0, self._atoms_to_ranks)
        return C.reduce_scatter(x, self.atom_counts, self.gp)

    def edges_gather(self, x: Tensor) -> Tensor:
        """Local edge rows ``[E_r, d]`` → the buffer ``LocalGraph.idx_kj`` indexes: all edges in rank order
        (``allgather``) or the local rows followed by the halo rows (``halo``). Backward: gradient rows summed
        onto their owners."""
        x = self._wire(x)
        if self.mode == "allgather":
            return C.gather(x, self.edge_counts, self.gp)
        return torch.cat([x, C.halo_exchange(x, self._send, self._recv, self.gp)])

    def sum(self, x: Tensor) -> Tensor:
        """All-reduce sum of partials (e.g. per-structure partial energies ``[B]``); backward identity."""
        return C.all_reduce(self._wire(x), self.gp)

    def replicated_grad(self, g: Tensor) -> Tensor:
        """All-reduce of this rank's partial gradient of a replicated input (``∂E_r/∂pos`` → ``∂E/∂pos``);
        backward identity, so a force loss's second backward reaches every rank's partial graph once."""
        return C.all_reduce(self._wire(g), self.gp)

    # ------------------------------------------------------------------ byte formulas
    def hook_bytes(self, hook: str, row_numel: int, element_size: int, *, backward: bool = False) -> float:
        """Bytes this rank sends (kind ``"gp"``) in one call of ``hook`` on rows of ``row_numel`` values
        (forward, or its backward with ``backward=True``); :func:`plan_hook_bytes` for this comm's plan, rank,
        mode, backend and ``atoms_reduce`` choice."""
        return plan_hook_bytes(self.plan, self.rank, hook, row_numel, element_size, mode=self.mode,
                               backend=self.gp.backend, backward=backward, local_atoms_reduce=self.local_atoms_reduce)

    def __repr__(self) -> str:
        return f"GraphParallelComm(rank={self.rank}, size={self.gp.size}, mode={self.mode!r}, plan={self.plan!r})"
