"""Aggregation kinds: which normalised adjacency ``Â`` an aggregation op multiplies with.

A kind turns the directed edges ``j → i`` (``edge_index[0] = j``, ``edge_index[1] = i``; rows of ``Â`` are
destinations) and optional per-edge weights into the non-zeros of ``Â``. Built-ins (each accepts
``edge_weight``; without weights every edge weighs 1, which gives exactly the unweighted matrices):

* ``gcn``  — ``D̃^{-1/2} Ã D̃^{-1/2}``, ``Ã[i, j] = w_ji`` with exactly one self-loop per vertex: a vertex's
  existing loop keeps its weight, a missing one is added with weight 1 (PyG ``add_remaining_self_loops``; so
  loops are never doubled); ``D̃`` the weighted in-degree of ``Ã`` (Kipf & Welling, ICLR 2017, eq. 2; PyG
  ``gcn_norm`` with ``edge_weight``);
* ``mean`` — ``D^{-1} A`` (weighted in-degree, no self term; rows of isolated vertices are zero);
* ``sum``  — ``A``.

A new kind is one subclass with one method, registered through the same door as the built-ins::

    from gnnpipe.tasks.nodes import kinds

    @kinds.register("rw")
    class RandomWalk(kinds.AggregationKind):
        def values(self, src, dst, weight, num_nodes):
            deg = torch.zeros(num_nodes, dtype=weight.dtype).index_add_(0, src, weight)
            return src, dst, weight / deg[src]

A model's units then name it in ``aggregations = ("rw",)``; every executor (single process, pipeline,
graph-parallel, hybrid) builds ``Â`` (and ``Âᵀ``) of that kind from the graph and ``data.edge_weight``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from ...registry import Registry


class AggregationKind(ABC):
    """One normalisation of the adjacency. Subclasses implement :meth:`values`."""

    registry_name: str = ""

    @abstractmethod
    def values(self, src: Tensor, dst: Tensor, weight: Tensor, num_nodes: int) -> tuple[Tensor, Tensor, Tensor]:
        """The non-zeros of ``Â``: entry ``Â[dst[e], src[e]] = value[e]`` (duplicates are summed).

        Args:
            src, dst: ``LongTensor[E]`` edge sources and targets. weight: ``[E]`` edge weights (ones when the
                graph has none) in the run's floating dtype. num_nodes: ``N``.

        Returns:
            ``(src', dst', value)``, three ``[E']`` tensors (a kind may add entries, e.g. self-loops).
        """


AGGREGATION_KINDS: Registry = Registry("aggregation kind", base=AggregationKind)
register = AGGREGATION_KINDS.register
get = AGGREGATION_KINDS.get
available = AGGREGATION_KINDS.available


def _weighted_in_degree(dst: Tensor, weight: Tensor, num_nodes: int) -> Tensor:
    return torch.zeros(num_nodes, dtype=weight.dtype).index_add_(0, dst, weight)


@register("gcn")
class SymmetricNorm(AggregationKind):
    """``D̃^{-1/2} Ã D̃^{-1/2}``: only the missing self-loops are added (weight 1); existing ones keep their weight."""

    def values(self, src, dst, weight, num_nodes):
        is_loop = src == dst
        loop_weight = torch.ones(num_nodes, dtype=weight.dtype)
        loop_weight[src[is_loop]] = weight[is_loop]  # PyG add_remaining_self_loops: an existing loop's weight wins
        keep = ~is_loop
        loop = torch.arange(num_nodes, dtype=torch.long)
        src, dst = torch.cat([src[keep], loop]), torch.cat([dst[keep], loop])
        weight = torch.cat([weight[keep], loop_weight])
        dinv = _weighted_in_degree(dst, weight, num_nodes).pow(-0.5)
        dinv[torch.isinf(dinv)] = 0
        return src, dst, weight * dinv[src] * dinv[dst]


@register("mean")
class MeanNorm(AggregationKind):
    """``D^{-1} A``: the weighted mean over in-neighbours (no self term)."""

    def values(self, src, dst, weight, num_nodes):
        dinv = _weighted_in_degree(dst, weight, num_nodes).reciprocal()
        dinv[torch.isinf(dinv)] = 0
        return src, dst, weight * dinv[dst]


@register("sum")
class SumAgg(AggregationKind):
    """``A``: the (weighted) sum over in-neighbours."""

    def values(self, src, dst, weight, num_nodes):
        return src, dst, weight


__all__ = ["AGGREGATION_KINDS", "AggregationKind", "MeanNorm", "SumAgg", "SymmetricNorm", "available", "get",
           "register"]
