"""MessagePassingUnit and the zoo models on PyG convolutions (gat, gat-res, gatv2, gin), single process."""

import pytest
import torch
from torch_geometric.nn import GATConv, GINConv

from gnnpipe.errors import ConfigError
from gnnpipe.models import MessagePassingUnit, available, build_model
from gnnpipe.models.zoo import GCNLayer
from gnnpipe.tasks.nodes.aggregation import unit_aggregators
from gnnpipe.tasks.nodes.graph import GraphOps

N, F = 30, 5


@pytest.fixture
def graph():
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, N, (2, 120), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    return torch.cat([ei, ei.flip(0)], 1).unique(dim=1)


def test_registered():
    assert {"gat", "gat-res", "gatv2", "gin"} <= set(available())


def test_gat_equals_a_plain_pyg_gatconv_stack(graph):
    """The paper-form ``gat`` (eval mode) is GATConv(F, 8×8) → ELU → GATConv(64, C) on the graph."""
    torch.manual_seed(0)
    model = build_model("gat", F, 3, num_layers=2, hidden=8, heads=8, dropout=0.6).double().eval()
    c1, c2 = model.units[1].conv, model.units[2].conv
    assert isinstance(c1, GATConv) and c1.heads == 8 and c1.out_channels == 8 and c2.heads == 1
    x = torch.randn(N, F, dtype=torch.float64)
    ops = GraphOps(graph, N, torch.float64)
    out = model(x, ops.aggregator())
    want = c2(torch.nn.functional.elu(c1(x, graph)), graph)
    torch.testing.assert_close(out, want)


def test_gin_layer_equals_pyg_gin(graph):
    torch.manual_seed(0)
    model = build_model("gin", F, 3, num_layers=1, hidden=6, dropout=0.0).double().eval()
    conv = model.units[1].conv
    assert isinstance(conv, GINConv)
    with torch.no_grad():
        conv.eps.fill_(0.3)
    h = torch.randn(N, 6, dtype=torch.float64)
    out, _ = model.units[1](h, None, GraphOps(graph, N, torch.float64).aggregator())
    torch.testing.assert_close(out, torch.relu(conv(h, graph)))


def test_deep_residual_gat_shapes_and_residual():
    m = build_model("gat-res", F, 3, num_layers=16, hidden=8, heads=8)
    assert m.num_units == 18 and all(u.residual for u in m.units[1:-1])
    assert m.units[1].in_dim == m.units[1].out_dim == 64


def test_bad_unit_arguments():
    with pytest.raises(ConfigError, match="in_dim == out_dim"):
        MessagePassingUnit(GATConv(4, 4), 4, 8, residual=True)
    with pytest.raises(ConfigError, match="norm"):
        MessagePassingUnit(GATConv(4, 4), 4, 4, norm="batch")


def test_agg_contract_layer_only_for_message_passing_units(graph):
    """A plain unit passing a layer, or a message-passing unit passing none, is a clear ConfigError."""
    ops = GraphOps(graph, N)
    plain = GCNLayer(4, 0.0, False, "relu")
    mp = MessagePassingUnit(GATConv(4, 4), 4, 4)
    make = unit_aggregators([plain, mp], lambda i, j, h, kind, layer: ops.aggregate(h, kind, layer))
    h = torch.randn(N, 4)
    with pytest.raises(ConfigError, match="message_passing"):
        make(0)(h, "gcn", lambda *a: None)
    with pytest.raises(ConfigError, match="message_passing"):
        make(1)(h, "sum")
    assert make(1)(h, "sum", mp.layer).shape == (N, 4)
