"""A brute-force neighbour graph with triplets for the graph-parallel tests (the AtomGraph contract of
ATOMISTIC.md, non-periodic): edges j→i within a cutoff sorted by (target, distance, source); triplets k→j→i
for every in-edge k→j of j with k ≠ i, sorted by (idx_ji, idx_kj)."""

from __future__ import annotations

from types import SimpleNamespace

import torch


def build_triplet_graph(pos: torch.Tensor, batch: torch.Tensor, cutoff: float) -> SimpleNamespace:
    n = pos.size(0)
    d = torch.cdist(pos.double(), pos.double())
    same = batch[:, None] == batch[None, :]
    adj = (d <= cutoff) & same & ~torch.eye(n, dtype=torch.bool)
    edges = []
    for i in range(n):
        for j in adj[i].nonzero().flatten().tolist():
            edges.append((i, float(d[i, j]), j))
    edges.sort()
    edge_index = torch.tensor([[j for _, _, j in edges], [i for i, _, _ in edges]], dtype=torch.long).reshape(2, -1)
    in_edges = {a: [] for a in range(n)}
    for e, (i, _, j) in enumerate(edges):
        in_edges[i].append((e, j))
    kj, ji = [], []
    for e, (i, _, j) in enumerate(edges):
        for e2, k in in_edges[j]:
            if k != i:
                kj.append(e2)
                ji.append(e)
    return SimpleNamespace(edge_index=edge_index, idx_kj=torch.tensor(kj, dtype=torch.long),
                           idx_ji=torch.tensor(ji, dtype=torch.long), num_nodes=n, pos=pos, batch=batch,
                           cell_offsets=torch.zeros(len(edges), 3, dtype=torch.long))


def random_batch(sizes=(14, 9), seed=0, box=4.0, cutoff=2.6, dtype=torch.float64) -> SimpleNamespace:
    """Structures of ``sizes`` atoms with random positions in a cube of side ``box`` (Å); ``z`` in 1..4."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.cat([torch.rand(n, 3, generator=g, dtype=dtype) * box for n in sizes])
    batch = torch.cat([torch.full((n,), b, dtype=torch.long) for b, n in enumerate(sizes)])
    graph = build_triplet_graph(pos, batch, cutoff)
    graph.z = torch.randint(1, 5, (pos.size(0),), generator=g)
    graph.num_graphs = len(sizes)
    return graph
