"""Edge and triplet partitioners for graph parallelism of atomistic GNNs, and the plan every rank derives.

Graph parallelism (Sriram, Das, Wood, Goyal, Zitnick, *Towards Training Billion Parameter Graph Neural
Networks for Atomic Simulations*, ICLR 2022, arXiv 2203.09697) spreads one batch's graph over the ``G`` ranks
of a group: each rank owns a set of **edges**, every **triplet** ``k→j→i`` goes with the edge ``j→i`` it
updates (its ``idx_ji``), so the triplet → edge reduction is local, and every **atom** has one owner rank
(per-atom parameterised ops run there only). The input is replicated, so every rank computes the same
:class:`GraphParallelPlan` from it; nothing is communicated to agree on it.

Two methods, behind one abstract class and registry (the same shape as the vertex partitioners)::

    from gnnpipe import partitioners
    plan = partitioners.plan_graph_parallel(graph, 4, "edge-chunk")                 # the paper's
    plan = partitioners.plan_graph_parallel(graph, 4, "atom-owner", pos=batch.pos)   # fairchem's (morton)
    plan.edges[r], plan.triplets[r], plan.atoms[r], plan.halo[r]; plan.metrics()

* ``edge-chunk``: the edges in their order (sorted by target) cut into contiguous ranges balanced by the
  cost weight ``w_e = α + β·t_e`` (``t_e`` = the edge's triplet count); triplets follow their ``idx_ji`` edge,
  so with triplets sorted by ``idx_ji`` each rank's triplets are a contiguous range too. Atoms: contiguous
  id ranges of near-equal size (per-atom work is balanced; the edge → atom sums are a reduce-scatter anyway).
* ``atom-owner``: atoms partitioned by any registered vertex partitioner (``morton`` by default: the
  Z-order of the positions); an edge goes to the owner of its target atom and a triplet to its edge's owner,
  so edge → atom sums onto the target are local and only the halo (the remote edge rows local triplets read)
  moves.

A rank may own nothing (fewer edges than ranks); it still takes part in every collective.

The graph input (``gnnpipe.data.atoms.AtomGraph`` or anything with these attributes): ``edge_index``
``LongTensor[2, E]`` (row 0 source ``j``, row 1 target ``i``), ``idx_kj`` and ``idx_ji`` ``LongTensor[T]`` (edge
ids of the triplets' in-edge ``k→j`` and updated edge ``j→i``), ``num_nodes``, optionally ``batch``, and for
``morton`` the positions (``pos=`` of :meth:`EdgePartitioner.plan`, or ``graph.pos``). A graph with ``id_swap``
(each edge's reverse, ``build_graph(..., with_reverse=True)``: GemNet reads it) adds the reverse of every owned
edge to the rows a rank reads: the halo, and each rank's ``local_idx_swap_*`` rows of the edge buffer.
"""

from __future__ import annotations

import abc
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, DataValidationError
from ..registry import Registry
from .base import Graph, _is_count, balanced_cuts
from .base import get as get_vertex_partitioner

__all__ = [
    "AtomOwnerPartitioner",
    "EDGE_PARTITIONERS",
    "EdgeChunkPartitioner",
    "EdgePartitioner",
    "GraphParallelMetrics",
    "GraphParallelPlan",
    "TripletGraph",
    "as_triplet_graph",
    "available_edge_partitioners",
    "get_edge_partitioner",
    "plan_graph_parallel",
    "register_edge_partitioner",
]


@attrs.frozen
class TripletGraph:
    """An edge + triplet graph as edge partitioners see it (CPU, ``int64``).

    Attributes:
        edge_index: ``LongTensor[2, E]`` (source ``j``, target ``i``).
        idx_kj, idx_ji: ``LongTensor[T]``: the in-edge ``k→j`` and the updated edge ``j→i`` of each triplet.
        num_nodes: ``N``.
        pos: ``Tensor[N, 3]`` or ``None``.
        batch: ``LongTensor[N]`` (the structure of each atom) or ``None``.
        id_swap: ``LongTensor[E]`` (the reverse of each edge, −1: none) or ``None``.
    """

    edge_index: Tensor
    idx_kj: Tensor
    idx_ji: Tensor
    num_nodes: int
    pos: Tensor | None = None
    batch: Tensor | None = None
    id_swap: Tensor | None = None

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.size(1))

    @property
    def num_triplets(self) -> int:
        return int(self.idx_ji.numel())

    @property
    def triplets_per_edge(self) -> Tensor:
        """``LongTensor[E]``: ``t_e``, the number of triplets whose ``idx_ji`` is ``e``."""
        return torch.bincount(self.idx_ji, minlength=self.num_edges)


def _index(t: Any, name: str) -> Tensor:
    if t is None:
        raise DataValidationError(f"the graph has no {name}; build it with gnnpipe.data.atoms.build_graph "
                                  "(edges and triplets) or give edge_index, idx_kj, idx_ji, num_nodes")
    t = torch.as_tensor(t)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise DataValidationError(f"{name} must hold integer ids; got dtype {t.dtype}")
    return t.detach().to("cpu", torch.long).contiguous()


def as_triplet_graph(graph: Any) -> TripletGraph:
    """Normalise an edge partitioner's input (an ``AtomGraph``, a ``Data`` or any object with ``edge_index``,
    ``idx_kj``, ``idx_ji``, ``num_nodes`` and optionally ``pos``) to a :class:`TripletGraph`.

    Raises:
        DataValidationError: a missing attribute, wrong shapes, or ids out of range (the message names it).
    """
    if isinstance(graph, TripletGraph):
        return graph
    ei = _index(getattr(graph, "edge_index", None), "edge_index")
    if ei.dim() != 2 or ei.size(0) != 2:
        raise DataValidationError(f"edge_index must have shape [2, E]; got {tuple(ei.shape)}")
    kj = _index(getattr(graph, "idx_kj", None), "idx_kj").flatten()
    ji = _index(getattr(graph, "idx_ji", None), "idx_ji").flatten()
    if kj.numel() != ji.numel():
        raise DataValidationError(f"idx_kj and idx_ji must have one entry per triplet; "
                                  f"got {kj.numel()} and {ji.numel()}")
    n = getattr(graph, "num_nodes", None)
    if n is None:
        raise DataValidationError("the graph has no num_nodes")
    n = int(n)
    e = ei.size(1)
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise DataValidationError(f"edge_index holds atom ids outside [0, {n}); fix num_nodes or the edge list")
    for name, t in (("idx_kj", kj), ("idx_ji", ji)):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= e):
            raise DataValidationError(f"{name} holds edge ids outside [0, {e}); rebuild the triplets from edge_index")
    pos = getattr(graph, "pos", None)
    if pos is not None:
        pos = torch.as_tensor(pos).detach().to("cpu")
        if pos.shape[:1] != (n,):
            raise DataValidationError(f"pos must have shape [N={n}, 3]; got {tuple(pos.shape)}")
    batch = getattr(graph, "batch", None)
    if batch is not None:
        batch = _index(batch, "batch").flatten()
        if batch.numel() != n:
            raise DataValidationError(f"batch must have one entry per atom ({n}); got {batch.numel()}")
    swap = getattr(graph, "id_swap", None)
    if swap is not None:
        swap = _index(swap, "id_swap").flatten()
        if swap.numel() != e or (e and (int(swap.min()) < -1 or int(swap.max()) >= e)):
            raise DataValidationError(f"id_swap must hold one edge id in [-1, {e}) per edge; rebuild it with "
                                      "gnnpipe.data.atoms.reverse_edges")
    return TripletGraph(ei, kj, ji, n, pos, batch, swap)


def _imbalance(values: list[float]) -> float:
    total = float(sum(values))
    if not values or total == 0:
        return 1.0
    return max(values) / (total / len(values))


@attrs.frozen
class GraphParallelMetrics:
    """Balance and halo of a :class:`GraphParallelPlan` over ``G`` ranks (lists indexed by rank).

    Attributes:
        edges, triplets, atoms: owned counts per rank.
        weight: the cost ``Σ_{e owned} (α + β·t_e)`` per rank (the plan's ``alpha``, ``beta``).
        halo_rows: remote edge rows the rank's triplets read (what halo mode receives per edge gather).
        edge_imbalance, triplet_imbalance, weight_imbalance, halo_imbalance: ``max / mean`` (1.0 when all zero).
    """

    edges: list[int]
    triplets: list[int]
    atoms: list[int]
    weight: list[float]
    halo_rows: list[int]
    edge_imbalance: float
    triplet_imbalance: float
    weight_imbalance: float
    halo_imbalance: float

    def to_dict(self) -> dict:
        """Plain-Python (JSON-serialisable) dict of every field."""
        return attrs.asdict(self)


class GraphParallelPlan:
    """Who owns which edges, triplets and atoms, and the index maps each rank's local view needs.

    Built by :meth:`EdgePartitioner.plan` from the replicated graph: the same input gives the same plan on every
    rank. Edge, triplet and atom ids are the global ones of the input graph; each rank's lists are ascending.

    Attributes:
        num_ranks: ``G``. method: the partitioner's registry name. alpha, beta: the cost weight's coefficients.
        num_nodes, num_edges, num_triplets: ``N``, ``E``, ``T``.
        edge_owner ``LongTensor[E]``, triplet_owner ``LongTensor[T]`` (= ``edge_owner[idx_ji]``), atom_owner
            ``LongTensor[N]``: the owner rank of each.
        edges, triplets, atoms: ``list[LongTensor]`` per rank: owned global ids, ascending.
        halo: ``list[LongTensor]`` per rank: the remote edges (global ids) the rank's triplets read through
            ``idx_kj`` (and, for a graph with ``id_swap``, the reverses of its edges), sorted by (owner rank, id):
            the order in which halo mode's buffer holds them.
        local_idx_ji: ``list[LongTensor]`` per rank ``[T_r]``: each owned triplet's ``idx_ji`` as a position in
            ``edges[r]``.
        local_idx_kj_allgather, local_idx_kj_halo: ``list[LongTensor]`` per rank ``[T_r]``: each owned triplet's
            ``idx_kj`` as a row of the edge buffer of that mode: all-gather mode's buffer is ``edges[0]``, then
            ``edges[1]``, … concatenated (``E`` rows); halo mode's is ``edges[r]`` then ``halo[r]``.
        local_idx_swap_allgather, local_idx_swap_halo: ``list[LongTensor]`` per rank ``[E_r]`` (``None`` for a
            graph without ``id_swap``): each owned edge's reverse as a row of that buffer, −1 where it has none.
        halo_send: ``list[list[LongTensor]]``: ``halo_send[s][q]`` = positions in ``edges[s]`` of the rows rank ``q``
            reads from rank ``s``, in ``halo[q]``'s order (empty for ``q == s``).
        halo_recv_counts: ``list[list[int]]``: ``halo_recv_counts[q][s] = len(halo_send[s][q])``.
        triplets_per_edge: ``LongTensor[E]``. edge_targets: ``LongTensor[E]``, each edge's target atom ``i``.
    """

    def __init__(self, graph: TripletGraph, edge_owner: Tensor, atom_owner: Tensor, num_ranks: int, *,
                 method: str = "?", alpha: float = 1.0, beta: float = 1.0):
        g, e, t, n = int(num_ranks), graph.num_edges, graph.num_triplets, graph.num_nodes
        self.num_ranks, self.method, self.alpha, self.beta = g, method, float(alpha), float(beta)
        self.num_nodes, self.num_edges, self.num_triplets = n, e, t
        self.edge_owner, self.atom_owner = edge_owner, atom_owner
        self.edge_targets = graph.edge_index[1]
        self.triplet_owner = edge_owner[graph.idx_ji]
        self.triplets_per_edge = graph.triplets_per_edge
        ar_e, ar_t, ar_n = torch.arange(e), torch.arange(t), torch.arange(n)
        self.edges = [ar_e[edge_owner == r] for r in range(g)]
        self.triplets = [ar_t[self.triplet_owner == r] for r in range(g)]
        self.atoms = [ar_n[atom_owner == r] for r in range(g)]
        # position of every edge inside its owner's list, and the all-gather buffer's row of every edge
        pos_in_owner = torch.empty(e, dtype=torch.long)
        offsets = [0]
        for r in range(g):
            pos_in_owner[self.edges[r]] = torch.arange(self.edges[r].numel())
            offsets.append(offsets[-1] + self.edges[r].numel())
        gather_row = pos_in_owner + torch.tensor(offsets[:-1], dtype=torch.long)[edge_owner] if e else pos_in_owner
        self.local_idx_ji, self.local_idx_kj_allgather, self.local_idx_kj_halo, self.halo = [], [], [], []
        swap = graph.id_swap
        self.local_idx_swap_allgather = [] if swap is not None else None
        self.local_idx_swap_halo = [] if swap is not None else None
        for r in range(g):
            kj, ji = graph.idx_kj[self.triplets[r]], graph.idx_ji[self.triplets[r]]
            self.local_idx_ji.append(pos_in_owner[ji])
            self.local_idx_kj_allgather.append(gather_row[kj])
            reads = kj
            if swap is not None:
                rev = swap[self.edges[r]]
                has = rev >= 0
                reads = torch.cat([kj, rev[has]])
            remote = torch.unique(reads[edge_owner[reads] != r])
            remote = remote[torch.argsort(edge_owner[remote] * max(e, 1) + remote)]  # by (owner, id)
            self.halo.append(remote)
            row = torch.empty(e, dtype=torch.long)
            row[self.edges[r]] = torch.arange(self.edges[r].numel())
            row[remote] = self.edges[r].numel() + torch.arange(remote.numel())
            self.local_idx_kj_halo.append(row[kj])
            if swap is not None:
                minus = torch.full_like(rev, -1)
                self.local_idx_swap_allgather.append(torch.where(has, gather_row[rev.clamp(min=0)], minus))
                self.local_idx_swap_halo.append(torch.where(has, row[rev.clamp(min=0)], minus))
        self.halo_send = [[pos_in_owner[self.halo[q][edge_owner[self.halo[q]] == s]] if q != s
                           else torch.empty(0, dtype=torch.long) for q in range(g)] for s in range(g)]
        self.halo_recv_counts = [[int(self.halo_send[s][q].numel()) for s in range(g)] for q in range(g)]

    @property
    def edge_counts(self) -> list[int]:
        """Owned edges per rank (the all-gather mode's row counts)."""
        return [int(x.numel()) for x in self.edges]

    @property
    def atom_counts(self) -> list[int]:
        """Owned atoms per rank (the atom gather / reduce-scatter row counts)."""
        return [int(x.numel()) for x in self.atoms]

    def atom_order(self) -> Tensor:
        """``LongTensor[N]``: the atoms in rank order (``atoms[0]``, then ``atoms[1]``, …), the row order of an
        atom all-gather's buffer."""
        return torch.cat(self.atoms) if self.atoms else torch.empty(0, dtype=torch.long)

    def edge_order(self) -> Tensor:
        """``LongTensor[E]``: the edges in rank order, the row order of the all-gather mode's edge buffer."""
        return torch.cat(self.edges) if self.edges else torch.empty(0, dtype=torch.long)

    def metrics(self) -> GraphParallelMetrics:
        """Per-rank edges, triplets, atoms, cost weight and halo rows, and their imbalance (max / mean)."""
        w = self.alpha + self.beta * self.triplets_per_edge.double()
        edges = self.edge_counts
        trip = [int(x.numel()) for x in self.triplets]
        weight = [float(w[x].sum()) for x in self.edges]
        halo = [int(x.numel()) for x in self.halo]
        return GraphParallelMetrics(edges=edges, triplets=trip, atoms=self.atom_counts, weight=weight,
                                    halo_rows=halo, edge_imbalance=_imbalance(edges),
                                    triplet_imbalance=_imbalance(trip),
                                    weight_imbalance=_imbalance(weight), halo_imbalance=_imbalance(halo))

    def __repr__(self) -> str:
        return (f"GraphParallelPlan(method={self.method!r}, ranks={self.num_ranks}, atoms={self.num_nodes}, "
                f"edges={self.num_edges}, triplets={self.num_triplets})")


class EdgePartitioner(abc.ABC):
    """Abstract edge/triplet partitioner: ``plan(graph, G, seed=…) → GraphParallelPlan``.

    Subclasses implement :meth:`assign` (an owner rank per edge and per atom); :meth:`plan` validates the input
    and the result and derives the rest, so every method puts each triplet with the edge it updates.

    Args:
        alpha, beta: the cost weight ``w_e = α + β·t_e`` of an edge with ``t_e`` triplets (reported by
            :meth:`GraphParallelPlan.metrics`; ``edge-chunk`` balances it). Non-negative, not both zero.

    Raises:
        ConfigError: negative or all-zero ``alpha``, ``beta``.
    """

    registry_name: str = "?"

    def __init__(self, *, alpha: float = 1.0, beta: float = 1.0):
        try:
            alpha, beta = float(alpha), float(beta)
        except (TypeError, ValueError):
            raise ConfigError(f"alpha and beta must be numbers; got {alpha!r}, {beta!r}") from None
        if not (alpha >= 0 and beta >= 0 and alpha + beta > 0) or not np.isfinite(alpha + beta):
            raise ConfigError(f"the edge cost w_e = alpha + beta * t_e needs alpha, beta >= 0, not both zero; "
                              f"got alpha={alpha}, beta={beta}")
        self.alpha, self.beta = alpha, beta

    def edge_weights(self, graph: TripletGraph) -> np.ndarray:
        """``np.ndarray[E]`` (``float64``): ``w_e = α + β·t_e``."""
        return self.alpha + self.beta * graph.triplets_per_edge.double().numpy()

    @abc.abstractmethod
    def assign(self, graph: TripletGraph, num_ranks: int, seed: int) -> tuple[Tensor, Tensor]:
        """The owner of every edge and every atom.

        Returns:
            ``(edge_owner LongTensor[E], atom_owner LongTensor[N])`` with values in ``[0, num_ranks)``; ranks
            may own nothing.
        """

    def plan(self, graph: Any, num_ranks: int, *, seed: int = 0, pos: Tensor | None = None) -> GraphParallelPlan:
        """Partition ``graph``'s edges, triplets and atoms over ``num_ranks`` ranks.

        Args:
            graph: an ``AtomGraph`` or anything :func:`as_triplet_graph` accepts.
            num_ranks: ``G >= 1`` (may exceed the number of edges or atoms: those ranks own nothing).
            seed: passed to seeded methods; the same ``(graph, G, seed, options)`` always gives the same plan.
            pos: ``[N, 3]`` atom positions (Å) for geometric methods (``atom-owner`` with ``morton``), e.g. the
                batch's ``pos`` (an ``AtomGraph`` does not hold them); default ``graph.pos`` if it has one.

        Raises:
            ConfigError: ``G < 1``. DataValidationError: malformed graph, or an owner outside ``[0, G)``.
        """
        if not _is_count(num_ranks):
            raise ConfigError(f"the number of graph-parallel ranks must be an integer >= 1; got {num_ranks!r}")
        g = as_triplet_graph(graph)
        if pos is not None:
            pos = torch.as_tensor(pos).detach().to("cpu")
            if pos.shape[:1] != (g.num_nodes,):
                raise DataValidationError(f"pos must have shape [N={g.num_nodes}, 3]; got {tuple(pos.shape)}")
            g = attrs.evolve(g, pos=pos)
        num_ranks = int(num_ranks)
        edge_owner, atom_owner = self.assign(g, num_ranks, int(seed))
        for name, own, size in (("edge", edge_owner, g.num_edges), ("atom", atom_owner, g.num_nodes)):
            own = torch.as_tensor(own)
            if own.shape != (size,) or (size and (int(own.min()) < 0 or int(own.max()) >= num_ranks)):
                raise DataValidationError(f"{self.registry_name} returned a bad {name} owner list: need {size} ranks "
                                          f"in [0, {num_ranks})")
        return GraphParallelPlan(g, torch.as_tensor(edge_owner).long(), torch.as_tensor(atom_owner).long(), num_ranks,
                                 method=self.registry_name, alpha=self.alpha, beta=self.beta)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()) if not k.startswith("_"))
        return f"{type(self).__name__}({opts})"


EDGE_PARTITIONERS: Registry = Registry("edge partitioner", base=EdgePartitioner)
register_edge_partitioner = EDGE_PARTITIONERS.register
get_edge_partitioner = EDGE_PARTITIONERS.get
available_edge_partitioners = EDGE_PARTITIONERS.available


def _contiguous_owner(weights: np.ndarray, num_ranks: int) -> Tensor:
    """Owners of ``n`` items cut into contiguous ranges of near-equal weight; with ``n < G`` the first ``n`` ranks
    get one item each and the rest none."""
    n = int(weights.size)
    if n == 0:
        return torch.zeros(0, dtype=torch.long)
    parts = min(num_ranks, n)
    sizes = np.diff(balanced_cuts(weights, parts))
    return torch.from_numpy(np.repeat(np.arange(parts, dtype=np.int64), sizes))


@register_edge_partitioner("edge-chunk")
class EdgeChunkPartitioner(EdgePartitioner):
    """The paper's partitioner (Sriram et al. 2022, §3): contiguous edge ranges of near-equal cost.

    The edges, in the graph's order (sorted by target atom), are cut into ``min(G, E)`` contiguous ranges whose
    cost ``Σ w_e``, ``w_e = α + β·t_e``, is near ``Σ w / G`` (:func:`~gnnpipe.partitioners.balanced_cuts`: each
    boundary at the prefix sum closest to its target, so a range is within one edge's weight of it); ranks past
    ``E`` own nothing. Triplets go with their ``idx_ji`` edge. Atoms: ``min(G, N)`` contiguous id ranges whose
    sizes differ by at most one.

    Args:
        alpha, beta: see :class:`EdgePartitioner` (default ``1, 1``: an edge costs one unit plus one per triplet).

    Ignores ``seed``.
    """

    def assign(self, graph: TripletGraph, num_ranks: int, seed: int) -> tuple[Tensor, Tensor]:
        edge_owner = _contiguous_owner(self.edge_weights(graph), num_ranks)
        atom_owner = _contiguous_owner(np.ones(graph.num_nodes), num_ranks)
        return edge_owner, atom_owner


@register_edge_partitioner("atom-owner")
class AtomOwnerPartitioner(EdgePartitioner):
    """Atoms partitioned by a vertex partitioner; each edge goes to the owner of its target atom, each triplet
    to its edge's owner (fairchem's graph-parallel layout).

    Edge → atom sums onto target atoms need no communication, and an edge gather needs only the halo: the
    remote in-edges ``k→j`` of the source atoms ``j`` of owned edges.

    Args:
        vertex: a registered vertex partitioner (:func:`gnnpipe.partitioners.available`); ``morton`` (default)
            reads the positions (``graph.pos``).
        vertex_options: constructor options of that partitioner (e.g. ``{"balance": "edges"}``).
        alpha, beta: see :class:`EdgePartitioner`.

    With ``N < G`` atoms, the atoms are cut into ``N`` parts and ranks ``N..G−1`` own nothing. The vertex partitioner
    sees ``graph.batch`` (``morton`` orders a batch structure by structure, so that a part does not mix structures that
    overlap in space).

    Raises:
        UnknownComponentError: unknown ``vertex``. ConfigError: bad ``vertex_options``.
    """

    def __init__(self, *, vertex: str = "morton", vertex_options: dict | None = None, alpha: float = 1.0,
                 beta: float = 1.0):
        super().__init__(alpha=alpha, beta=beta)
        self.vertex = vertex
        self.vertex_options = dict(vertex_options or {})
        try:
            self._vertex = get_vertex_partitioner(vertex)(**self.vertex_options)
        except TypeError as exc:
            raise ConfigError(f"bad vertex_options for vertex partitioner {vertex!r}: {exc}") from None

    def assign(self, graph: TripletGraph, num_ranks: int, seed: int) -> tuple[Tensor, Tensor]:
        n = graph.num_nodes
        if n == 0:
            return torch.zeros(graph.num_edges, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        parts = min(num_ranks, n)
        atom_owner = self._vertex.partition(Graph(graph.edge_index, n, graph.pos, graph.batch), parts, seed=seed)
        edge_owner = atom_owner[graph.edge_index[1]]
        return edge_owner, atom_owner


def plan_graph_parallel(graph: Any, num_ranks: int, method: str = "edge-chunk", *, seed: int = 0,
                        pos: Tensor | None = None, **options: Any) -> GraphParallelPlan:
    """Partition a graph's edges, triplets and atoms for graph parallelism in one call.

    ``plan_graph_parallel(graph, 4, "atom-owner", vertex="metis")`` is
    ``get_edge_partitioner("atom-owner")(vertex="metis").plan(graph, 4, seed=0)``; ``pos`` (the batch's
    positions, for ``morton``) as in :meth:`EdgePartitioner.plan`.

    Raises:
        UnknownComponentError: unknown ``method`` (the message lists the available ones).
        ConfigError, DataValidationError: see :meth:`EdgePartitioner.plan`; bad options.
    """
    cls = get_edge_partitioner(method)
    try:
        part = cls(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for edge partitioner {method!r}: {exc}") from None
    return part.plan(graph, num_ranks, seed=seed, pos=pos)
