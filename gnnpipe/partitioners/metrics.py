"""Quality metrics of a vertex partition and the communication-volume predictions of graph parallelism and GNNPipe.

Conventions (``edge_index`` read as given, directed, PyG ``source → target``):

* an edge ``u → v`` *belongs* to the part of its destination ``v`` (rows of ``Â`` are destinations);
* an edge is *cut* (crosses parts) when ``parts[u] != parts[v]``; :attr:`PartitionMetrics.edge_cut`
  counts **directed** cut edges, so for a symmetric ``edge_index`` (each undirected edge stored in
  both directions, as PyG datasets are) it is twice the undirected cut METIS reports, which is
  :attr:`PartitionMetrics.undirected_edge_cut`;
* vertex ``u`` of part ``p`` is *mirrored* on part ``q ≠ p`` when it has an edge ``u → v`` with
  ``v`` in ``q``: graph parallelism must ship ``u``'s embedding to ``q`` before each aggregation
  and ``q``'s gradient for it back afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch import Tensor

from ..errors import ConfigError
from .base import as_graph, validate_parts

__all__ = ["PartitionMetrics", "partition_metrics", "predict_gp_bytes", "predict_pipeline_bytes"]

#: bytes per value (fp32)
FP32_BYTES = 4


def _imbalance(counts: list[int]) -> float:
    total = sum(counts)
    if not counts or total == 0:
        return 1.0
    return max(counts) / (total / len(counts))


@attrs.frozen
class PartitionMetrics:
    """Quality of a partition of ``N`` vertices and ``E`` directed edges into ``P`` parts.

    Attributes:
        num_nodes: ``N``. num_edges: ``E`` (directed entries of ``edge_index``). num_parts: ``P``.
        vertices_per_part: ``list[int]`` of length ``P``.
        edges_per_part: ``list[int]`` of length ``P``: edges whose *destination* is in the part.
        vertex_imbalance: ``max / mean`` of ``vertices_per_part`` (1.0 = perfect).
        edge_imbalance: ``max / mean`` of ``edges_per_part`` (1.0 when ``E = 0``).
        edge_cut: number of directed edges ``u → v`` with ``parts[u] != parts[v]``.
        undirected_edge_cut: number of distinct unordered pairs ``{u, v}`` (``u ≠ v``) joined by an
            edge in either direction and lying in different parts (METIS's objective).
        mirror_count: ``M = Σ_p Σ_{q≠p} |{u ∈ p : u has an edge into q}|``.
        boundary_vertices: vertices with at least one edge into another part.
        cross_chunk_edge_fraction: ``edge_cut / E`` (0.0 when ``E = 0``): the share of aggregation
            inputs that a chunk reads from other chunks, i.e. from history in the pipeline.
    """

    num_nodes: int
    num_edges: int
    num_parts: int
    vertices_per_part: list[int]
    edges_per_part: list[int]
    vertex_imbalance: float
    edge_imbalance: float
    edge_cut: int
    undirected_edge_cut: int
    mirror_count: int
    boundary_vertices: int
    cross_chunk_edge_fraction: float

    def to_dict(self) -> dict:
        """Plain-Python (JSON-serialisable) dict of every field."""
        return attrs.asdict(self)


def partition_metrics(edge_index: Tensor, num_nodes: int, parts: Tensor,
                      num_parts: int | None = None) -> PartitionMetrics:
    """Compute :class:`PartitionMetrics` of ``parts`` on the directed graph ``edge_index``.

    Args:
        edge_index: ``LongTensor[2, E]`` (``source → target``), read as given (duplicates and
            self-loops count as edges; a self-loop is never cut).
        num_nodes: ``N``.
        parts: ``LongTensor[N]`` of part ids in ``[0, P)``, indexed by the same vertex ids as ``edge_index``.
        num_parts: ``P``; default ``parts.max() + 1``. Empty parts are allowed (they count in the means).

    Raises:
        DataValidationError: malformed ``edge_index`` or ``parts``.
    """
    g = as_graph((edge_index, num_nodes))
    n = g.num_nodes
    parts = torch.as_tensor(parts)
    p = validate_parts(parts, n, num_parts, allow_empty=True)
    parts = parts.to("cpu", torch.long)
    src, dst = g.edge_index[0], g.edge_index[1]
    ps, pd = parts[src], parts[dst]
    vertices = torch.bincount(parts, minlength=p).tolist()
    edges = torch.bincount(pd, minlength=p).tolist()
    cut_mask = ps != pd
    edge_cut = int(cut_mask.sum())
    cs, cd = src[cut_mask], dst[cut_mask]
    # mirrors: distinct (source vertex, destination part) pairs over cut edges
    mirror_keys = torch.unique(cs * p + pd[cut_mask])
    boundary = int(torch.unique(cs).numel())
    lo, hi = torch.minimum(cs, cd), torch.maximum(cs, cd)
    undirected = int(torch.unique(lo * n + hi).numel())
    e = int(src.numel())
    return PartitionMetrics(
        num_nodes=n,
        num_edges=e,
        num_parts=p,
        vertices_per_part=[int(v) for v in vertices],
        edges_per_part=[int(v) for v in edges],
        vertex_imbalance=_imbalance(vertices),
        edge_imbalance=_imbalance(edges),
        edge_cut=edge_cut,
        undirected_edge_cut=undirected,
        mirror_count=int(mirror_keys.numel()),
        boundary_vertices=boundary,
        cross_chunk_edge_fraction=(edge_cut / e) if e else 0.0,
    )


def predict_gp_bytes(mirror_count: int, agg_dims: Sequence[int], backward_dims: Sequence[int] | None = None) -> int:
    """Predicted bytes per epoch of graph parallelism's halo exchange (GP formula, extended in
    docs/HALO_GRADIENT.md).

    ``4 · M · (Σ_aggregations d + Σ_backward d)``: before every aggregation each mirror copy's fp32 embedding
    (width ``d`` of that aggregation's input) is sent forward, and its gradient is sent back to its owner —
    for a linear ``Â`` and for a message-passing layer alike (the halo gradient of the same rows) — except
    where the aggregation's input needs no gradient (a layer reading the raw features): nothing goes back.
    With ``backward_dims = agg_dims`` (the default) this is ``2 · 4 · M · Σ d``. Excludes the weight-gradient
    all-reduce.

    Args:
        mirror_count: ``M`` (:attr:`PartitionMetrics.mirror_count`).
        agg_dims: the input width of every aggregation op in one forward pass, in any order (e.g.
            ``[d] * L`` for an ``L``-layer GCN of hidden width ``d``; see
            ``GNNModel.aggregation_dims``).
        backward_dims: the widths of the ops whose input gradient is sent back (default ``agg_dims``; see
            ``GNNModel.backward_aggregation_dims``).

    Raises:
        ConfigError: negative ``M`` or width.
    """
    back = agg_dims if backward_dims is None else backward_dims
    if mirror_count < 0 or any(d < 0 for d in list(agg_dims) + list(back)):
        raise ConfigError("mirror_count and aggregation widths must be non-negative")
    return FP32_BYTES * int(mirror_count) * (int(sum(int(d) for d in agg_dims)) + int(sum(int(d) for d in back)))


def predict_pipeline_bytes(num_nodes: int, num_stages: int, d_boundary: int, shared: bool = False) -> int:
    """Predicted bytes per epoch of a GNNPipe pipeline's stage-boundary traffic (GNNPipe formula).

    ``2 · 4 · (S − 1) · N · d_boundary``, doubled when the model ships a global shared tensor of the
    same width with the boundary (GCNII's ``h0``): every vertex's boundary embedding crosses each of
    the ``S − 1`` stage boundaries once forward and its gradient once backward. Independent of the
    number of layers and of the chunking.

    Args:
        num_nodes: ``N``. num_stages: ``S >= 1``. d_boundary: width of the stage-boundary embeddings.
        shared: the model ships a shared tensor (``GNNModel.shared_tensor is not None``).

    Raises:
        ConfigError: ``S < 1`` or negative sizes.
    """
    if num_stages < 1 or num_nodes < 0 or d_boundary < 0:
        raise ConfigError("need num_stages >= 1 and non-negative num_nodes, d_boundary")
    return 2 * FP32_BYTES * (int(num_stages) - 1) * int(num_nodes) * int(d_boundary) * (2 if shared else 1)
