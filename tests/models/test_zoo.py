"""Our layer units equal the PyG layers of the same name (float64, same weights, same normalisation)."""

import pytest
import torch
from torch_geometric.nn import GCN2Conv, GCNConv, SAGEConv

from gnnpipe.errors import ConfigError, UnknownComponentError
from gnnpipe.models import GNNModel, LayerUnit, available, build_model, get, register
from gnnpipe.tasks.nodes.graph import GraphOps

N, F_IN, H, C = 40, 7, 12, 3


@pytest.fixture(params=["plain", "loops-isolated-duplicates"])
def graph(request):
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, N - 3, (2, 160), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    ei = torch.cat([ei, ei.flip(0)], 1).unique(dim=1)
    if request.param != "plain":  # issue #17 item 6: loops on some vertices (one isolated), repeated edges
        loops = torch.tensor([0, 3, 5, 11, N - 1]).repeat(2, 1)
        ei = torch.cat([ei, loops, ei[:, :9], loops[:, :2]], 1)
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    return ei, x, GraphOps(ei, N, torch.float64)


def _relu(t):
    return torch.relu(t)


def test_registry_lists_builtins():
    assert {"gcn", "graphsage", "gcnii", "resgcn+"} <= set(available())
    with pytest.raises(UnknownComponentError, match="available: .*gcn"):
        get("nope")


@pytest.mark.parametrize("bias", [False, True])
def test_gcn_equals_pyg_gcnconv(graph, bias):
    ei, x, ops = graph
    m = build_model("gcn", F_IN, C, num_layers=3, hidden=H, dropout=0.0, bias=bias).double().eval()
    h = _relu(m.units[0].lin(x))
    for unit in m.units[1:-1]:
        conv = GCNConv(H, H, bias=bias).double()
        conv.lin.weight.data.copy_(unit.lin.weight)
        if bias:
            conv.bias.data.copy_(unit.lin.bias)
        h = _relu(conv(h, ei))
    ref = m.units[-1].lin(h)
    torch.testing.assert_close(m(x, ops.aggregate), ref, rtol=1e-10, atol=1e-10)


def test_graphsage_equals_pyg_sageconv(graph):
    ei, x, ops = graph
    m = build_model("graphsage", F_IN, C, num_layers=3, hidden=H, dropout=0.0, bias=True).double().eval()
    h = _relu(m.units[0].lin(x))
    for unit in m.units[1:-1]:
        conv = SAGEConv(H, H, aggr="mean").double()
        conv.lin_l.weight.data.copy_(unit.lin_neigh.weight)
        conv.lin_l.bias.data.copy_(unit.lin_neigh.bias)
        conv.lin_r.weight.data.copy_(unit.lin_root.weight)
        h = _relu(conv(h, ei))
    torch.testing.assert_close(m(x, ops.aggregate), m.units[-1].lin(h), rtol=1e-10, atol=1e-10)


def test_gcnii_equals_pyg_gcn2conv(graph):
    ei, x, ops = graph
    L = 5
    m = build_model("gcnii", F_IN, C, num_layers=L, hidden=H, dropout=0.0).double().eval()
    h0 = _relu(m.units[0].lin(x))
    h = h0
    for ell, unit in enumerate(m.units[1:-1], start=1):
        conv = GCN2Conv(H, alpha=0.1, theta=0.5, layer=ell, shared_weights=True).double()
        conv.weight1.data.copy_(unit.lin.weight.t())
        h = _relu(conv(h, h0, ei))
    torch.testing.assert_close(m(x, ops.aggregate), m.units[-1].lin(h), rtol=1e-10, atol=1e-10)


def test_resgcn_plus_structure_and_reference(graph):
    ei, x, ops = graph
    m = build_model("resgcn+", F_IN, C, num_layers=4, hidden=H, dropout=0.0).double().eval()
    assert m.num_units == 4 + 2
    # reference with PyG SAGEConv(mean) as the conv (root Linear has the bias, neighbour Linear none)
    def conv(unit, h):
        c = SAGEConv(H, H, aggr="mean", bias=False, root_weight=True).double()
        c.lin_l.weight.data.copy_(unit.lin_neigh.weight)
        c.lin_r.weight.data.copy_(unit.lin_root.weight)
        return c(h, ei)

    h = m.units[0].lin(x)
    h = conv(m.units[1], h)
    for unit in m.units[2:-1]:
        h = h + conv(unit, torch.relu(unit.norm(h)))
    head = m.units[-1]
    ref = head.lin(torch.relu(head.norm(h)))
    torch.testing.assert_close(m(x, ops.aggregate), ref, rtol=1e-10, atol=1e-10)


def test_units_declare_aggregations_and_groups():
    m = build_model("gcnii", F_IN, C, num_layers=3, hidden=H)
    assert m.shared_tensor == "h0"
    assert [u.aggregations for u in m.units] == [(), ("gcn",), ("gcn",), ("gcn",), ()]
    groups = m.param_groups(5e-4, 0.01)
    assert [g["weight_decay"] for g in groups] == [5e-4, 0.01]
    assert sum(len(g["params"]) for g in groups) == len(list(m.parameters()))


def test_bad_sizes_raise_config_error():
    with pytest.raises(ConfigError, match="num_layers"):
        build_model("gcn", 4, 2, num_layers=0)
    with pytest.raises(ConfigError, match="dropout"):
        build_model("gcn", 4, 2, dropout=1.5)
    with pytest.raises(ConfigError, match="activation"):
        build_model("gcn", 4, 2, activation="swishy")


def test_user_model_registers_through_the_same_door():
    class Plain(LayerUnit):
        aggregations = ("sum",)

        def forward(self, h, shared, agg):
            return agg(h, "sum"), shared

    @register("test-sum-model")
    class SumModel(GNNModel):
        def __init__(self, in_channels, out_channels, **kw):
            from gnnpipe.models.zoo import Encoder, Head

            super().__init__([Encoder(in_channels, 4, 0.0), Plain(4, 4), Head(4, out_channels)])

    assert "test-sum-model" in available()
    m = build_model("test-sum-model", 3, 2)
    ops = GraphOps(torch.tensor([[0, 1], [1, 0]]), 2)
    assert m(torch.randn(2, 3), ops.aggregate).shape == (2, 2)


def test_dropout_is_seeded():
    from gnnpipe.models.base import dropout

    h = torch.ones(1000, 4)
    torch.manual_seed(1)
    a = dropout(h, 0.5, True)
    torch.manual_seed(1)
    b = dropout(h, 0.5, True)
    assert torch.equal(a, b)
    assert 0.4 < float((a == 0).float().mean()) < 0.6
    assert set(a.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(dropout(h, 0.5, False), h)
