"""Chunk plans: vertex relabelling that makes every chunk (and every way) a contiguous id range.

After relabelling, chunk ``c`` is the id range ``[chunk_ptr[c], chunk_ptr[c+1])`` and
the pipeline's aggregation op slices rows ``Â[R_c, :]`` by range. The paper's
default chunking is METIS with vertex weight ``50 + degree`` into ``4·C`` parts, then a seeded random
grouping of 4 parts per chunk (GNNPipe, arXiv 2308.10087, §4).

In the hybrid mode (``W`` ways × ``S`` stages) chunks are grouped into ``W`` contiguous blocks of
consecutive chunks; way ``w`` owns chunks ``[way_ptr[w], way_ptr[w+1])`` and so the vertex range
``[chunk_ptr[way_ptr[w]], chunk_ptr[way_ptr[w+1]])``. :meth:`ChunkPlan.build` makes those blocks
good graph-parallel parts by partitioning hierarchically (ways first, then chunks inside each way).

Everything the user sees is in original vertex ids: :meth:`ChunkPlan.to_original` maps a per-vertex
tensor in new ids back.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import attrs
import torch
from torch import Tensor

from ..errors import ConfigError, DataValidationError
from .base import GraphPartitioner, as_graph, get, validate_parts
from .metrics import PartitionMetrics, partition_metrics

__all__ = ["ChunkPlan", "relabel_data", "way_bounds"]


def way_bounds(num_chunks: int, num_ways: int) -> Tensor:
    """Group ``C`` consecutive chunks into ``W`` blocks: the first ``C mod W`` ways get one chunk more.

    Returns:
        ``LongTensor[W + 1]`` of chunk-index boundaries, ``0 = way_ptr[0] < … < way_ptr[W] = C``.

    Raises:
        ConfigError: ``W < 1`` or ``W > C``.
    """
    if int(num_ways) != num_ways or num_ways < 1:
        raise ConfigError(f"num_ways must be an integer >= 1; got {num_ways!r}")
    if num_ways > num_chunks:
        raise ConfigError(f"cannot group {num_chunks} chunks into {num_ways} ways; every way needs a chunk")
    base, extra = divmod(int(num_chunks), int(num_ways))
    sizes = [base + (1 if w < extra else 0) for w in range(num_ways)]
    return torch.tensor([0] + sizes, dtype=torch.long).cumsum(0)


def relabel_data(data: Any, perm: Tensor, inv_perm: Tensor) -> Any:
    """A copy of ``data`` with vertex ``perm[i]`` renamed ``i``.

    Node-level tensors (``x``, ``y``, masks of shape ``[N]`` or ``[N, splits]``, …: the attributes PyG's
    ``Data.is_node_attr`` names) are indexed by ``perm``; ``edge_index`` becomes ``inv_perm[edge_index]``
    with the edge order kept, so edge-level tensors (``edge_attr``, ``edge_weight``: ``Data.is_edge_attr``)
    stay aligned and are copied as is. Anything else (graph-level values) is shared unchanged. ``data``
    itself is not modified. Objects without ``is_node_attr`` (not a PyG ``Data``) fall back to "a tensor
    whose first dimension is ``N`` and whose name does not contain ``edge``".
    """
    n = perm.numel()
    out = copy.copy(data)  # PyG: new storages, shared tensors
    is_node = getattr(data, "is_node_attr", None)
    for key in list(data.keys()):
        value = data[key]
        if key == "edge_index":
            out[key] = inv_perm[value]
        elif not isinstance(value, Tensor) or value.dim() < 1 or value.size(0) != n:
            continue
        elif is_node(key) if is_node is not None else "edge" not in key:
            out[key] = value[perm]
    return out


def _instantiate(cls: type, method: str, over: int, options: dict) -> Any:
    """``cls(over=over, **options)``; a user class whose constructor takes no ``over`` gets it set as an
    attribute instead (over-partitioning lives in :meth:`GraphPartitioner.partition`)."""
    params = inspect.signature(cls.__init__).parameters
    takes_over = "over" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    try:
        inst = cls(over=over, **options) if takes_over else cls(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for partitioner {method!r}: {exc}") from None
    if not takes_over:
        if int(over) != over or over < 1:
            raise ConfigError(f"over-partitioning factor must be an integer >= 1; got {over!r}")
        inst.over = int(over)
    return inst


def _levels(chunker: Any, graph: Any, num_parts: int, seed: int) -> tuple[Tensor, Tensor]:
    """``chunker.partition_levels``; a partitioner that overrides ``partition`` itself (not just ``assign``) is
    used as it is, with its parts as the fine parts."""
    if type(chunker).partition is not GraphPartitioner.partition:
        parts = chunker.partition(graph, num_parts, seed=seed)
        return parts, parts
    return chunker.partition_levels(graph, num_parts, seed=seed)


def _num_nodes(data: Any) -> int:
    n = getattr(data, "num_nodes", None)
    if n is None:
        raise DataValidationError("data has no num_nodes; set data.num_nodes or give it node features x")
    return int(n)


@attrs.frozen(eq=False)
class ChunkPlan:
    """A relabelling of the vertices so that every chunk is a contiguous id range.

    Attributes:
        perm: ``LongTensor[N]``, new id → original id (``perm[i]`` is the original vertex now called ``i``).
        inv_perm: ``LongTensor[N]``, original id → new id (``inv_perm[perm] == arange(N)``).
        chunk_ptr: ``LongTensor[C + 1]``; chunk ``c`` is new ids ``[chunk_ptr[c], chunk_ptr[c+1])``.
        way_ptr: ``LongTensor[W + 1]``; way ``w`` owns chunks ``[way_ptr[w], way_ptr[w+1])``.
        data: the relabelled ``Data`` (see :func:`relabel_data`).
        parts: ``LongTensor[N]``, the chunk of every vertex in **original** ids.

    Within a chunk, vertices follow ``within`` (:meth:`from_parts`), else their original relative order.
    """

    perm: Tensor
    inv_perm: Tensor
    chunk_ptr: Tensor
    way_ptr: Tensor
    data: Any
    parts: Tensor

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_parts(cls, data: Any, parts: Tensor, num_ways: int = 1, *, within: Tensor | None = None) -> ChunkPlan:
        """Build the plan for a given chunk assignment.

        Args:
            data: a PyG ``Data`` with ``edge_index`` and ``num_nodes`` (node-level tensors optional).
            parts: ``LongTensor[N]`` of chunk ids in ``[0, C)`` (original vertex ids), ``C = max + 1``;
                every chunk non-empty.
            num_ways: ``W``; chunks are grouped into ``W`` blocks of consecutive chunk ids
                (:func:`way_bounds`). For good graph-parallel ways, number the chunks of a way
                consecutively (as :meth:`build` does).
            within: optional ``LongTensor[N]`` sort key of the vertices inside their chunk (original
                ids; ties keep the original order). ``None``: the original relative order.

        Raises:
            DataValidationError: ``parts`` or ``within`` malformed, or a chunk empty. ConfigError: ``W > C``
                or ``W < 1``.
        """
        n = _num_nodes(data)
        parts = torch.as_tensor(parts)
        c = validate_parts(parts, n)
        parts = parts.to("cpu", torch.long)
        if within is None:
            perm = torch.sort(parts, stable=True).indices
        else:
            within = torch.as_tensor(within).to("cpu")
            if within.shape != (n,) or within.is_floating_point():
                raise DataValidationError(f"within must be an integer tensor of shape [{n}], got "
                                          f"{within.dtype} {tuple(within.shape)}")
            by_key = torch.sort(within, stable=True).indices
            perm = by_key[torch.sort(parts[by_key], stable=True).indices]
        inv_perm = torch.empty_like(perm)
        inv_perm[perm] = torch.arange(n)
        sizes = torch.bincount(parts, minlength=c)
        chunk_ptr = torch.zeros(c + 1, dtype=torch.long)
        chunk_ptr[1:] = sizes.cumsum(0)
        return cls(
            perm=perm,
            inv_perm=inv_perm,
            chunk_ptr=chunk_ptr,
            way_ptr=way_bounds(c, num_ways),
            data=relabel_data(data, perm, inv_perm),
            parts=parts,
        )

    @classmethod
    def build(
        cls,
        data: Any,
        num_chunks: int,
        method: str = "metis",
        *,
        over: int = 4,
        seed: int = 0,
        num_ways: int = 1,
        order: str = "locality",
        **options: Any,
    ) -> ChunkPlan:
        """Partition ``data`` into ``num_chunks`` chunks with a registered method and relabel.

        Defaults are the paper's (GNNPipe §4): METIS, vertex weight ``50 + degree``,
        ``4·C`` parts grouped 4 per chunk by a permutation seeded with ``seed``.

        With ``num_ways = W > 1`` the split is hierarchical: first ``W`` ways with the same method
        and ``over=1`` (as graph parallelism does), then the subgraph induced by each way is cut into
        its share of chunks (``C mod W`` ways get one chunk more) with ``over`` and seed ``seed + 1 + w``;
        way ``w``'s chunks are numbered consecutively, so each way's vertex set is a low-cut part.

        ``order`` sets the vertex order inside a chunk, which changes no result beyond floating-point
        summation order but does change speed: ``"locality"`` (default) keeps each of the fine parts a
        chunk groups contiguous and orders each by reverse Cuthill–McKee (:attr:`Graph.rcm_order`), so
        neighbours get nearby ids and a chunk's gathers and sparse products touch fewer cache lines
        (Amazon Computers, 16 chunks: 10.8 → 9.2 ms per chunk-major op, ``benchmarks/bench_chunk_gather.py``,
        docs/RESULTS.md §5); ``"original"`` keeps the input's relative order.

        Args:
            data: a PyG ``Data`` (``edge_index``, ``num_nodes``, node tensors to relabel).
            num_chunks: ``C`` (``W <= C <= N``).
            method: a registered vertex partitioner (:func:`gnnpipe.partitioners.available`).
            over: over-partitioning factor ``k`` (lowered with a warning if ``k·C > N``).
            seed: integer seed; the plan is deterministic for ``(data, C, method, over, seed, W, order, options)``.
            num_ways: ``W``.
            order: ``"locality"`` or ``"original"`` (above).
            **options: other constructor options of the method (e.g. ``vertex_weight``).

        Raises:
            UnknownComponentError: unknown method. ConfigError: ``C > N``, ``W > C``, bad options or ``order``.
        """
        if order not in ("locality", "original"):
            raise ConfigError(f"unknown within-chunk order {order!r}; use 'locality' or 'original'")
        g = as_graph(data)
        cls_ = get(method)
        chunker = _instantiate(cls_, method, over, options)
        way_partitioner = _instantiate(cls_, method, 1, options) if num_ways > 1 else None
        ways = way_bounds(num_chunks, num_ways)  # validates W <= C
        if num_chunks > g.num_nodes:
            raise ConfigError(
                f"cannot cut a graph of {g.num_nodes} vertices into {num_chunks} non-empty chunks"
            )
        if way_partitioner is None:
            parts, fine = _levels(chunker, g, num_chunks, seed)
        else:
            way_of = way_partitioner.partition(g, num_ways, seed=seed)
            parts = torch.empty(g.num_nodes, dtype=torch.long)
            fine = torch.empty(g.num_nodes, dtype=torch.long)
            for w in range(num_ways):
                members = (way_of == w).nonzero().flatten()
                c_lo, c_hi = int(ways[w]), int(ways[w + 1])
                if members.numel() < c_hi - c_lo:
                    raise ConfigError(
                        f"way {w} holds {members.numel()} vertices, fewer than its {c_hi - c_lo} chunks; "
                        "use fewer chunks"
                    )
                sub, sub_fine = _levels(chunker, g.subgraph(members), c_hi - c_lo, seed + 1 + w)
                parts[members] = sub + c_lo
                fine[members] = sub_fine  # only compared inside a chunk, which never spans two ways
        within = None
        if order == "locality":
            rank = torch.zeros(g.num_nodes, dtype=torch.long)
            if g.csr.nnz < 2**31:  # scipy's RCM takes int32 indices; beyond that, fine parts alone
                rank[torch.from_numpy(g.rcm_order)] = torch.arange(g.num_nodes)
            within = fine * g.num_nodes + rank
        return cls.from_parts(data, parts, num_ways=num_ways, within=within)

    # ------------------------------------------------------------------ queries
    @property
    def num_nodes(self) -> int:
        """``N``."""
        return int(self.perm.numel())

    @property
    def num_chunks(self) -> int:
        """``C``."""
        return int(self.chunk_ptr.numel()) - 1

    @property
    def num_ways(self) -> int:
        """``W``."""
        return int(self.way_ptr.numel()) - 1

    def chunk_rows(self, c: int) -> tuple[int, int]:
        """``(start, end)``: chunk ``c`` is new ids ``[start, end)``.

        Raises:
            ConfigError: ``c`` outside ``[0, C)``.
        """
        if not 0 <= c < self.num_chunks:
            raise ConfigError(f"chunk {c} out of range [0, {self.num_chunks})")
        return int(self.chunk_ptr[c]), int(self.chunk_ptr[c + 1])

    def chunk_sizes(self) -> list[int]:
        """Vertices per chunk, ``list[int]`` of length ``C``."""
        return self.chunk_ptr.diff().tolist()

    def way_chunks(self, w: int) -> range:
        """Chunk indices owned by way ``w``.

        Raises:
            ConfigError: ``w`` outside ``[0, W)``.
        """
        if not 0 <= w < self.num_ways:
            raise ConfigError(f"way {w} out of range [0, {self.num_ways})")
        return range(int(self.way_ptr[w]), int(self.way_ptr[w + 1]))

    def way_rows(self, w: int) -> tuple[int, int]:
        """``(start, end)``: way ``w`` owns new ids ``[start, end)``."""
        r = self.way_chunks(w)
        return int(self.chunk_ptr[r.start]), int(self.chunk_ptr[r.stop])

    def chunk_of(self) -> Tensor:
        """``LongTensor[N]``: the chunk of every vertex in **new** ids (non-decreasing)."""
        return torch.repeat_interleave(torch.arange(self.num_chunks), self.chunk_ptr.diff())

    def way_parts(self) -> Tensor:
        """``LongTensor[N]``: the way of every vertex in **original** ids."""
        chunk_to_way = torch.repeat_interleave(torch.arange(self.num_ways), self.way_ptr.diff())
        return chunk_to_way[self.parts]

    def to_original(self, t: Tensor) -> Tensor:
        """Map a per-vertex tensor in new ids (``[N, …]``) back to original order: ``out[v] = t[inv_perm[v]]``.

        Raises:
            DataValidationError: ``t.size(0) != N``.
        """
        if t.size(0) != self.num_nodes:
            raise DataValidationError(f"expected a tensor with {self.num_nodes} rows (one per vertex); "
                                      f"got {tuple(t.shape)}")
        return t[self.inv_perm.to(t.device)]

    def to_new(self, t: Tensor) -> Tensor:
        """Map a per-vertex tensor in original ids (``[N, …]``) to new ids: ``out[i] = t[perm[i]]``.

        Raises:
            DataValidationError: ``t.size(0) != N``.
        """
        if t.size(0) != self.num_nodes:
            raise DataValidationError(f"expected a tensor with {self.num_nodes} rows (one per vertex); "
                                      f"got {tuple(t.shape)}")
        return t[self.perm.to(t.device)]

    def metrics(self) -> PartitionMetrics:
        """:func:`~gnnpipe.partitioners.partition_metrics` of the chunks (on the relabelled graph; same values)."""
        return partition_metrics(self.data.edge_index, self.num_nodes, self.chunk_of(), self.num_chunks)

    def __repr__(self) -> str:
        return f"ChunkPlan(num_nodes={self.num_nodes}, num_chunks={self.num_chunks}, num_ways={self.num_ways})"
