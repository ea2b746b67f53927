"""Small hand-made graphs shared by the partitioner tests."""

from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected


def undirected(pairs, n: int) -> torch.Tensor:
    """``edge_index`` with both directions of every pair in ``pairs`` (list of ``(u, v)``)."""
    if not pairs:
        return torch.empty(2, 0, dtype=torch.long)
    return to_undirected(torch.tensor(pairs, dtype=torch.long).t(), num_nodes=n)


def two_communities(n_per: int = 60, extra_isolated: int = 5, seed: int = 0) -> Data:
    """Two dense random communities joined by 3 edges, a separate triangle, and isolated vertices."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, n_per, (2, 6 * n_per), generator=g)
    b = torch.randint(n_per, 2 * n_per, (2, 6 * n_per), generator=g)
    bridge = torch.tensor([[0, 1, 2], [n_per, n_per + 1, n_per + 2]])
    t0 = 2 * n_per
    tri = torch.tensor([[t0, t0 + 1, t0 + 2], [t0 + 1, t0 + 2, t0]])
    n = 2 * n_per + 3 + extra_isolated
    ei = torch.cat([a, b, bridge, tri], 1)
    ei = ei[:, ei[0] != ei[1]]
    ei = to_undirected(ei, num_nodes=n)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    train = torch.zeros(n, dtype=torch.bool)
    train[::3] = True
    return Data(x=x, y=y, edge_index=ei, train_mask=train, val_mask=~train, num_nodes=n)
