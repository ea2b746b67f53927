"""Atomistic structures for S2EF training: structures as PyG data, readers, validation, splits, a generated
dataset labelled by ASE's EMT calculator, and the neighbour graph with triplets (ATOMISTIC §1).

Public API::

    build_graph(data, cutoff, max_neighbors=None, *, with_triplets=True, method="auto") -> AtomGraph
    triplets(edge_index, cell_offsets, num_nodes) -> (idx_kj, idx_ji)
    neighbor_pairs(pos, cell, pbc, cutoff, method="ase") -> (i, j, offsets, dist)
"""

from .graph import AtomGraph, build_graph, neighbor_pairs, triplets

__all__ = ["AtomGraph", "build_graph", "neighbor_pairs", "triplets"]
