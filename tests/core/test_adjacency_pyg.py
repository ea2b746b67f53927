"""Every aggregation kind equals its PyG counterpart on graphs with existing self-loops, isolated
vertices and duplicate edges (issue #17 item 6), in float64 to 1e-12.

* ``gcn`` — PyG ``gcn_norm(add_self_loops=True)`` (``add_remaining_self_loops``: a vertex that already
  has a loop keeps one loop, of weight 1, not two);
* ``mean`` — PyG mean aggregation over ``edge_index`` as given (``SAGEConv(aggr="mean")``'s neighbour term);
* ``sum`` — PyG sum aggregation.
The zoo models built on them (gcn, graphsage, gcnii, resgcn+) are checked against the PyG layers on the
same graphs in ``tests/models/test_zoo.py``.
"""

import pytest
import torch
from torch_geometric.nn.aggr import MeanAggregation, SumAggregation
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnpipe.tasks.nodes.graph import build_adjacency

N = 12


def _graphs():
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, N - 2, (2, 30), generator=g)  # vertices 10, 11 isolated
    plain = ei[:, ei[0] != ei[1]]
    loops5 = torch.tensor([[0, 2, 4, 6, 8], [0, 2, 4, 6, 8]])
    return {
        "no-loops": plain,
        "loops-on-5": torch.cat([plain, loops5], 1),
        "duplicate-edges-and-loops": torch.cat([plain, plain[:, :7], loops5, loops5[:, :2]], 1),
        "isolated-vertex-with-loop": torch.cat([plain, torch.tensor([[11], [11]])], 1),
        "only-loops": loops5,
        "no-edges": torch.zeros(2, 0, dtype=torch.long),
    }


GRAPHS = _graphs()


def _dense(ei, w):
    a = torch.zeros(N, N, dtype=torch.float64)
    a.index_put_((ei[1], ei[0]), w, accumulate=True)  # rows = targets
    return a


@pytest.mark.parametrize("name", list(GRAPHS))
def test_gcn_equals_pyg_gcn_norm(name):
    ei = GRAPHS[name]
    ref_ei, ref_w = gcn_norm(ei, None, N, improved=False, add_self_loops=True, dtype=torch.float64)
    ours = build_adjacency(ei, N, "gcn", torch.float64).to_dense()
    torch.testing.assert_close(ours, _dense(ref_ei, ref_w), rtol=0, atol=1e-12)


def test_gcn_looped_vertex_weight_is_one_over_degree_plus_one():
    # the case: with a loop given, the own weight is 1/(d+1), not 2/(d+2)
    ei = torch.tensor([[0, 1, 0], [1, 0, 0]])  # 0 <-> 1 and a loop at 0
    a = build_adjacency(ei, 2, "gcn", torch.float64).to_dense()
    assert a[0, 0].item() == pytest.approx(1 / 2, abs=1e-15)
    assert a[1, 1].item() == pytest.approx(1 / 2, abs=1e-15)


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("kind, aggr", [("mean", MeanAggregation), ("sum", SumAggregation)])
def test_mean_and_sum_equal_pyg_aggregation(name, kind, aggr):
    ei = GRAPHS[name]
    h = torch.randn(N, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ref = aggr()(h[ei[0]], ei[1], dim_size=N)
    ours = build_adjacency(ei, N, kind, torch.float64).to_dense() @ h
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
