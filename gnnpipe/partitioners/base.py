"""The vertex-partitioner family: abstract class, registry, graph input and shared helpers.

A *vertex partitioner* maps every vertex of a graph to one of ``P`` parts.
The result is always a ``LongTensor[N]`` of part ids in ``[0, P)`` in the user's **original** vertex
ids, and every part is non-empty. The same class serves graph parallelism (``P`` = number of ways,
plain METIS) and GNNPipe chunking (``P`` = number of chunks, METIS over-partitioned 4× and grouped).

Over-partitioning (GNNPipe, Chen, Chen & Qian, arXiv 2308.10087, §4 "graph chunking") is
implemented once here, for every method: with ``over = k`` the method first cuts the graph into
``k·P`` parts, then a seeded random permutation groups ``k`` of them into each output part.

Users add their own partitioner through the same door as the built-ins::

    from gnnpipe import partitioners

    @partitioners.register("by-degree")
    class ByDegree(partitioners.GraphPartitioner):
        def assign(self, graph, num_parts, seed):          # graph: Graph (edge_index, num_nodes, csr, …)
            order = torch.from_numpy(graph.degree).argsort(stable=True)
            parts = torch.empty(graph.num_nodes, dtype=torch.long)
            parts[order] = torch.arange(graph.num_nodes) * num_parts // graph.num_nodes
            return parts                                   # LongTensor[N] in [0, num_parts)

    partitioners.partition_graph(data, 8, "by-degree", over=2)
"""

from __future__ import annotations

import abc
import warnings
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import reverse_cuthill_mckee
from torch import Tensor

from ..errors import ConfigError, DataValidationError
from ..registry import Registry

__all__ = [
    "Graph",
    "GraphInput",
    "GraphPartitioner",
    "PartitionWarning",
    "as_graph",
    "available",
    "balanced_cuts",
    "get",
    "partition_graph",
    "register",
    "repair_empty_parts",
    "validate_parts",
]


class PartitionWarning(UserWarning):
    """A partitioner changed its request or its result (empty part repaired, over-partitioning reduced)."""


class Graph:
    """A graph as partitioners see it: the directed ``edge_index`` plus a lazily built symmetric CSR.

    Args:
        edge_index: ``LongTensor[2, E]`` of directed edges ``source → target`` (PyG convention).
        num_nodes: ``N``.
        pos: optional ``Tensor[N, D]`` of vertex coordinates (atom positions in Å); read by geometric
            methods (``morton``), ignored by the others.
        batch: optional ``LongTensor[N]``, the structure (graph of a batch) of each vertex; ``morton`` orders
            structure by structure.

    Attributes:
        edge_index, num_nodes, pos, batch: as given (``edge_index`` on CPU, ``int64``; ``pos``, ``batch`` on CPU or
            ``None``).
        csr: ``scipy.sparse.csr_matrix`` (``N × N``, ``int64`` indices) of the *simple undirected*
            graph: both directions of every edge, no self-loops, no duplicates, sorted column indices.
            This is the graph METIS, KaHIP, BFS and RCM operate on.
        degree: ``np.ndarray[N]`` (``int64``), the vertex degrees of ``csr`` (number of distinct neighbours).
        in_degree: ``np.ndarray[N]`` (``int64``), the number of entries of ``edge_index`` whose target is
            the vertex (edges counted as given, duplicates and self-loops included).
        rcm_order: ``np.ndarray[N]`` (``int64``), the reverse Cuthill–McKee order of ``csr`` (vertex ids,
            first to last): a BFS-like low-bandwidth order (Cuthill & McKee, ACM 1969; reversed per
            George 1971), from :func:`scipy.sparse.csgraph.reverse_cuthill_mckee`.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, pos: Tensor | None = None, batch: Tensor | None = None):
        self.edge_index = edge_index
        self.num_nodes = int(num_nodes)
        self.pos = pos
        self.batch = batch

    @cached_property
    def csr(self) -> sp.csr_matrix:
        n = self.num_nodes
        ei = self.edge_index.numpy()
        src, dst = ei[0], ei[1]
        keep = src != dst
        src, dst = src[keep], dst[keep]
        row = np.concatenate([src, dst])
        col = np.concatenate([dst, src])
        a = sp.csr_matrix((np.ones(row.size, dtype=np.int8), (row, col)), shape=(n, n))
        a.sum_duplicates()
        a.data[:] = 1
        a.sort_indices()
        a.indptr = a.indptr.astype(np.int64, copy=False)
        a.indices = a.indices.astype(np.int64, copy=False)
        return a

    @cached_property
    def degree(self) -> np.ndarray:
        return np.diff(self.csr.indptr).astype(np.int64)

    @cached_property
    def in_degree(self) -> np.ndarray:
        return np.bincount(self.edge_index[1].numpy(), minlength=self.num_nodes).astype(np.int64)

    @cached_property
    def rcm_order(self) -> np.ndarray:
        csr = self.csr.copy()
        csr.indices = csr.indices.astype(np.int32)
        csr.indptr = csr.indptr.astype(np.int32)
        return np.asarray(reverse_cuthill_mckee(csr, symmetric_mode=True), dtype=np.int64)

    def subgraph(self, vertices: Tensor) -> Graph:
        """The subgraph induced by ``vertices`` (``LongTensor[n]``, distinct), relabelled to ``0..n-1`` in the given
        order."""
        vertices = vertices.long()
        relabel = torch.full((self.num_nodes,), -1, dtype=torch.long)
        relabel[vertices] = torch.arange(vertices.numel())
        ei = relabel[self.edge_index]
        ei = ei[:, (ei >= 0).all(0)]
        return Graph(ei.contiguous(), vertices.numel(), None if self.pos is None else self.pos[vertices],
                     None if self.batch is None else self.batch[vertices])


#: what :func:`as_graph` accepts: a PyG ``Data`` (uses ``edge_index``, ``num_nodes``, and ``pos``, ``batch`` if
#: present), a ``(edge_index, num_nodes)`` pair, or a :class:`Graph`.
GraphInput = Any  # Data | tuple[Tensor, int | None] | Graph


def as_graph(graph: GraphInput) -> Graph:
    """Normalise a partitioner's graph argument to a :class:`Graph`.

    Args:
        graph: a ``torch_geometric.data.Data`` (its ``edge_index``, ``num_nodes`` and, if present, ``pos`` and
            ``batch``), a pair
            ``(edge_index, num_nodes)`` with ``edge_index`` a ``LongTensor[2, E]``, or a :class:`Graph`.

    Raises:
        DataValidationError: no ``edge_index``, wrong shape or dtype, ids outside ``[0, N)``,
            or ``N < 1``.
    """
    if isinstance(graph, Graph):
        return graph
    if isinstance(graph, (tuple, list)):
        if len(graph) != 2:
            raise DataValidationError(
                "a graph given as a tuple must be (edge_index, num_nodes); "
                f"got a {type(graph).__name__} of length {len(graph)}"
            )
        edge_index, num_nodes = graph
        pos = batch = None
    else:
        pos, batch = getattr(graph, "pos", None), getattr(graph, "batch", None)
        edge_index = getattr(graph, "edge_index", None)
        num_nodes = getattr(graph, "num_nodes", None)
        if edge_index is None:
            raise DataValidationError(
                f"cannot partition a {type(graph).__name__}: pass a torch_geometric Data with edge_index "
                "or a tuple (edge_index, num_nodes)"
            )
    if not isinstance(edge_index, Tensor):
        edge_index = torch.as_tensor(edge_index)
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise DataValidationError(
            f"edge_index must have shape [2, E]; got {tuple(edge_index.shape)} (transpose an [E, 2] list with .t())"
        )
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise DataValidationError(f"edge_index must hold integer vertex ids; got dtype {edge_index.dtype}")
    edge_index = edge_index.detach().to("cpu", torch.long).contiguous()
    if num_nodes is None:
        num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 0
    num_nodes = int(num_nodes)
    if num_nodes < 1:
        raise DataValidationError(f"cannot partition a graph with {num_nodes} vertices; it needs at least one")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise DataValidationError(
            f"edge_index holds vertex ids outside [0, {num_nodes}) (min {int(edge_index.min())}, "
            f"max {int(edge_index.max())}); fix num_nodes or the edge list"
        )
    if pos is not None:
        pos = torch.as_tensor(pos).detach().to("cpu")
        if pos.dim() != 2 or pos.size(0) != num_nodes:
            raise DataValidationError(f"pos must have shape [N={num_nodes}, D]; got {tuple(pos.shape)}")
    if batch is not None:
        batch = torch.as_tensor(batch).detach().to("cpu", torch.long).flatten()
        if batch.numel() != num_nodes:
            raise DataValidationError(f"batch must have one entry per vertex ({num_nodes}); got {batch.numel()}")
    return Graph(edge_index, num_nodes, pos, batch)


def validate_parts(parts: Tensor, num_nodes: int, num_parts: int | None = None, *, allow_empty: bool = False) -> int:
    """Check a part assignment and return its number of parts.

    Args:
        parts: ``LongTensor[N]`` of part ids.
        num_nodes: ``N``.
        num_parts: ``P``; ``None`` means ``parts.max() + 1``.
        allow_empty: accept parts without vertices.

    Raises:
        DataValidationError: wrong shape/dtype, ids outside ``[0, P)``, or an empty part (unless allowed).
    """
    if not isinstance(parts, Tensor) or parts.dim() != 1 or parts.numel() != num_nodes:
        shape = tuple(parts.shape) if isinstance(parts, Tensor) else type(parts).__name__
        raise DataValidationError(f"parts must be a 1-D tensor with one entry per vertex ({num_nodes}); got {shape}")
    if parts.dtype.is_floating_point or parts.dtype == torch.bool:
        raise DataValidationError(f"parts must hold integer part ids; got dtype {parts.dtype}")
    if num_nodes == 0:
        return int(num_parts or 0)
    lo, hi = int(parts.min()), int(parts.max())
    p = hi + 1 if num_parts is None else int(num_parts)
    if lo < 0 or hi >= p:
        raise DataValidationError(f"part ids must lie in [0, {p}); got min {lo}, max {hi}")
    if not allow_empty:
        sizes = torch.bincount(parts.long(), minlength=p)
        empty = (sizes == 0).nonzero().flatten().tolist()
        if empty:
            raise DataValidationError(
                f"parts {empty[:10]}{'…' if len(empty) > 10 else ''} of {p} are empty; every part needs a vertex"
            )
    return p


def repair_empty_parts(parts: Tensor, num_parts: int, degree: np.ndarray | None = None, *, who: str = "partitioner",
                       stacklevel: int = 3) -> Tensor:
    """Make every part non-empty by moving single vertices out of the largest parts.

    For each empty part (in increasing id) one vertex moves from the currently largest part (lowest
    id on ties): the vertex of that part with the smallest ``degree`` (lowest id on ties), so that the
    edge cut grows as little as possible. Emits a :class:`PartitionWarning` naming the empty parts.

    Args:
        parts: ``LongTensor[N]`` in ``[0, num_parts)``; not modified.
        num_parts: ``P <= N``.
        degree: ``np.ndarray[N]`` used to pick the vertex to move; ``None`` = all equal.
        who: name used in the warning (e.g. ``"metis"``).

    Returns:
        A new ``LongTensor[N]`` with every part non-empty (``parts`` itself if none was empty).
    """
    sizes = torch.bincount(parts, minlength=num_parts)
    empty = (sizes == 0).nonzero().flatten().tolist()
    if not empty:
        return parts
    parts = parts.clone()
    deg = torch.zeros(parts.numel(), dtype=torch.long) if degree is None else torch.as_tensor(degree, dtype=torch.long)
    for q in empty:
        big = int(torch.argmax(sizes))  # first maximum on ties
        members = (parts == big).nonzero().flatten()
        v = members[torch.argmin(deg[members])]  # first minimum → lowest id among the smallest degree
        parts[v] = q
        sizes[big] -= 1
        sizes[q] += 1
    warnings.warn(
        f"{who} returned {len(empty)} empty part(s) {empty[:10]}{'…' if len(empty) > 10 else ''} of {num_parts}; "
        "repaired by moving one low-degree vertex from the largest part into each",
        PartitionWarning,
        stacklevel=stacklevel,
    )
    return parts


def balanced_cuts(weights: np.ndarray, num_parts: int) -> np.ndarray:
    """Cut a sequence of ``n`` non-negative weights into ``P`` non-empty contiguous ranges of near-equal sum.

    Boundary ``i`` (``0 < i < P``) is the first position whose prefix sum reaches ``i · total / P``,
    then clamped so that every range holds at least one element. With unit weights this gives the
    ranges ``[⌊i·n/P⌉ …)`` whose sizes differ by at most one.

    Args:
        weights: ``np.ndarray[n]`` of non-negative weights (``n >= P``).
        num_parts: ``P >= 1``.

    Returns:
        ``np.ndarray[P + 1]`` (``int64``) of boundaries, ``0 = b_0 < b_1 < … < b_P = n``.
    """
    n = int(weights.size)
    w = np.asarray(weights, dtype=np.float64)
    if np.all(w == w[0]) if n else True:
        b = (np.arange(num_parts + 1, dtype=np.int64) * n) // num_parts
        return b
    cum = np.concatenate([[0.0], np.cumsum(w)])
    total = cum[-1]
    targets = np.arange(1, num_parts, dtype=np.float64) * total / num_parts
    # boundary = number of leading elements whose prefix sum is closest to the target
    hi = np.searchsorted(cum, targets, side="left")
    lo = np.maximum(hi - 1, 0)
    pick = np.where(np.abs(cum[lo] - targets) <= np.abs(cum[np.minimum(hi, n)] - targets), lo, hi)
    b = np.concatenate([[0], pick, [n]]).astype(np.int64)
    for i in range(1, num_parts):  # strictly increasing, room for the remaining parts
        b[i] = min(max(b[i], b[i - 1] + 1), n - (num_parts - i))
    return b


def _ranges_to_parts(order: np.ndarray, bounds: np.ndarray) -> Tensor:
    """Vertex ``order[j]`` gets the part ``i`` with ``bounds[i] <= j < bounds[i+1]``."""
    n = order.size
    sizes = np.diff(bounds)
    parts = np.empty(n, dtype=np.int64)
    parts[order] = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    return torch.from_numpy(parts)


def _is_count(value: Any) -> bool:
    """``value`` is an integer (not a bool) ``>= 1``, possibly a float or numpy scalar with an integer value."""
    if isinstance(value, (bool, str)):
        return False
    try:
        return int(value) == value and value >= 1
    except (TypeError, ValueError):
        return False


class GraphPartitioner(abc.ABC):
    """Abstract vertex partitioner: ``partition(graph, P, seed=…) → LongTensor[N]`` of part ids.

    Subclasses implement :meth:`assign`; :meth:`partition` adds input validation, the ``P = 1`` and
    ``P > N`` cases, over-partitioning with random grouping (GNNPipe §4), empty-part repair and output
    validation, so every registered method behaves the same at the edges.

    Args:
        over: over-partitioning factor ``k >= 1``: cut into ``k·P`` parts with :meth:`assign`, then
            group ``k`` of them (chosen by a permutation seeded with ``seed``) into each output part.
            ``k = 1`` (default) is plain partitioning. If ``k·P > N``, ``k`` is lowered to ``N // P``
            with a :class:`PartitionWarning`.

    Raises:
        ConfigError: ``over < 1``.

    Class attributes:
        deterministic_in_seed: ``True`` when the result depends on ``seed``; methods that ignore it
            (``contiguous``, ``rcm``) say ``False``.
    """

    registry_name: str = "?"
    deterministic_in_seed: bool = True
    over: int = 1

    def __init__(self, *, over: int = 1):
        if not _is_count(over):
            raise ConfigError(f"over-partitioning factor must be an integer >= 1; got {over!r}")
        self.over = int(over)

    @abc.abstractmethod
    def assign(self, graph: Graph, num_parts: int, seed: int) -> Tensor:
        """Assign each vertex of ``graph`` to one of ``num_parts`` parts (``2 <= num_parts <= N``).

        Returns:
            ``LongTensor[N]`` in ``[0, num_parts)``. Empty parts are allowed here (they are repaired
            with a warning by :meth:`GraphPartitioner.partition`), ids outside the range are not.
        """

    def partition(self, graph: GraphInput, num_parts: int, *, seed: int = 0) -> Tensor:
        """Partition the vertices of ``graph`` into ``num_parts`` non-empty parts.

        Args:
            graph: a PyG ``Data`` (``edge_index``, ``num_nodes``), ``(edge_index, num_nodes)`` or a
                :class:`Graph`. Edges are read as given; methods that need an undirected graph use
                its symmetrisation (:attr:`Graph.csr`). Disconnected graphs and isolated vertices are fine.
            num_parts: ``P``, ``1 <= P <= N``. ``P = 1`` returns all zeros without calling the method.
            seed: integer seed; the same ``(graph, P, seed, options)`` always gives the same result.

        Returns:
            ``LongTensor[N]`` (CPU) of part ids in ``[0, P)``, indexed by original vertex id; every
            part holds at least one vertex.

        Raises:
            DataValidationError: malformed graph, or the method returned ids outside ``[0, P)``.
            ConfigError: ``P < 1`` or ``P > N``.
        """
        return self._levels(graph, num_parts, seed)[0]

    def partition_levels(self, graph: GraphInput, num_parts: int, *, seed: int = 0) -> tuple[Tensor, Tensor]:
        """:meth:`partition`, also returning the fine parts the output parts group.

        Returns:
            ``(parts, fine)``: ``parts`` as :meth:`partition` returns it; ``fine`` (``LongTensor[N]``) the
            part of every vertex among the ``k·P`` parts the method cut before the random grouping
            (``fine == parts`` when ``over = 1`` or ``P = 1``). :meth:`ChunkPlan.build
            <gnnpipe.partitioners.ChunkPlan.build>` keeps each fine part contiguous inside its chunk.

        Raises:
            as :meth:`partition`.
        """
        return self._levels(graph, num_parts, seed)

    def _levels(self, graph: GraphInput, num_parts: int, seed: int) -> tuple[Tensor, Tensor]:
        # called directly by partition / partition_levels: warnings point at their caller (stacklevel)
        g = as_graph(graph)
        n = g.num_nodes
        if not _is_count(num_parts):
            raise ConfigError(f"num_parts must be an integer >= 1; got {num_parts!r}")
        num_parts = int(num_parts)
        if num_parts > n:
            raise ConfigError(
                f"cannot cut a graph of {n} vertices into {num_parts} non-empty parts; use at most {n} parts"
            )
        if num_parts == 1:
            zeros = torch.zeros(n, dtype=torch.long)
            return zeros, zeros
        k = self.over
        if k * num_parts > n:
            k_new = n // num_parts
            warnings.warn(
                f"over-partitioning {k}×{num_parts} = {k * num_parts} parts exceeds the {n} vertices; "
                f"using over={k_new}",
                PartitionWarning,
                stacklevel=3,
            )
            k = k_new
        fine_parts = k * num_parts
        raw = self.assign(g, fine_parts, int(seed))
        raw = torch.as_tensor(raw).to("cpu", torch.long).flatten()
        validate_parts(raw, n, fine_parts, allow_empty=True)
        fine = None
        if k > 1:
            raw = fine = repair_empty_parts(raw, fine_parts, g.degree, who=self.registry_name, stacklevel=4)
            gen = torch.Generator().manual_seed(int(seed) + 0x5EED)
            perm = torch.randperm(fine_parts, generator=gen)
            group = torch.empty(fine_parts, dtype=torch.long)
            group[perm] = torch.arange(fine_parts) // k  # fine part perm[j] → output part j // k
            raw = group[raw]
        parts = repair_empty_parts(raw, num_parts, g.degree, who=self.registry_name, stacklevel=4)
        validate_parts(parts, n, num_parts)
        return parts, (parts if fine is None else fine)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()) if not k.startswith("_"))
        return f"{type(self).__name__}({opts})"


PARTITIONERS: Registry = Registry("vertex partitioner", base=GraphPartitioner)
register = PARTITIONERS.register
get = PARTITIONERS.get
available = PARTITIONERS.available


def partition_graph(
    data_or_edge_index: GraphInput, num_parts: int, method: str = "metis", *, seed: int = 0, **options: Any
) -> Tensor:
    """Partition a graph with a registered method in one call.

    ``partition_graph(data, 8, "metis", over=4)`` is ``get("metis")(over=4).partition(data, 8, seed=0)``.

    Args:
        data_or_edge_index: a PyG ``Data``, ``(edge_index, num_nodes)``, or a bare ``edge_index``
            (``LongTensor[2, E]``; ``N = max id + 1``).
        num_parts: ``P`` (``1 <= P <= N``).
        method: a name in :func:`available`.
        seed: integer seed.
        **options: constructor options of the method (e.g. ``over``, ``vertex_weight``, ``balance``).

    Returns:
        ``LongTensor[N]`` of part ids in ``[0, P)``, every part non-empty.

    Raises:
        UnknownComponentError: unknown ``method`` (the message lists the available ones).
        ConfigError, DataValidationError: see :meth:`GraphPartitioner.partition`; bad options.
    """
    if isinstance(data_or_edge_index, Tensor):
        data_or_edge_index = (data_or_edge_index, None)
    cls = get(method)
    try:
        part = cls(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for partitioner {method!r}: {exc}") from None
    return part.partition(data_or_edge_index, num_parts, seed=seed)
