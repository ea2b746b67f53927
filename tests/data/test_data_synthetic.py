"""synthetic_graph: determinism, sizes, homophily, degree skew, split, speed, and learnability."""

from __future__ import annotations

import time

import pytest
import torch
from torch_geometric.utils import coalesce, degree, is_undirected

from gnnpipe.data import load_dataset, synthetic_graph, validate
from gnnpipe.errors import ConfigError


def edge_homophily(d) -> float:
    return float((d.y[d.edge_index[0]] == d.y[d.edge_index[1]]).float().mean())


@pytest.fixture(scope="module")
def g():
    return synthetic_graph()


def test_deterministic_for_seed(g):
    h = synthetic_graph()
    for key in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(g[key], h[key]), key
    other = synthetic_graph(seed=1)
    assert not torch.equal(g.y, other.y)
    assert g.num_edges != other.num_edges or not torch.equal(g.edge_index, other.edge_index)


def test_does_not_touch_global_rng():
    torch.manual_seed(123)
    a = torch.rand(3)
    torch.manual_seed(123)
    synthetic_graph(num_nodes=300)
    assert torch.equal(torch.rand(3), a)


def test_sizes_dtypes_and_simple_undirected(g):
    assert g.x.shape == (2000, 32) and g.x.dtype == torch.float32
    assert g.y.shape == (2000,) and g.y.dtype == torch.long and int(g.y.max()) == 4 and int(g.y.min()) == 0
    assert g.edge_index.dtype == torch.long and g.edge_index.size(0) == 2
    assert g.name == "synthetic"
    assert is_undirected(g.edge_index, num_nodes=g.num_nodes)
    assert not bool((g.edge_index[0] == g.edge_index[1]).any())
    assert coalesce(g.edge_index, num_nodes=g.num_nodes).size(1) == g.num_edges  # no duplicates
    mean_deg = g.num_edges / g.num_nodes
    assert 0.7 * 10.0 <= mean_deg <= 10.0
    assert validate(g) == []


def test_custom_sizes():
    d = synthetic_graph(num_nodes=500, avg_degree=4, num_classes=3, num_features=7, seed=5)
    assert d.x.shape == (500, 7) and int(d.y.max()) == 2
    assert 0.6 * 4 <= d.num_edges / 500 <= 4


@pytest.mark.parametrize("h", [0.0, 0.65, 1.0])
def test_homophily_roughly_as_asked(h):
    d = synthetic_graph(num_nodes=3000, homophily=h, seed=2)
    expected = h + (1 - h) / 5  # balanced classes: background edges are within-class with prob. 1/C
    assert abs(edge_homophily(d) - expected) < 0.06


def test_degree_skew(g):
    deg = degree(g.edge_index[0], g.num_nodes)
    assert float(deg.max()) > 10 * float(deg.mean())
    assert float(deg.median()) < float(deg.mean())


def test_split_per_class(g):
    for c in range(5):
        in_c = g.y == c
        assert int((g.train_mask & in_c).sum()) == 20
        assert int((g.val_mask & in_c).sum()) == 30
    assert not bool((g.train_mask & g.val_mask).any() or (g.train_mask & g.test_mask).any())
    assert bool((g.train_mask | g.val_mask | g.test_mask).all())


def test_load_dataset_default_is_synthetic():
    d = load_dataset(num_nodes=400, seed=3)
    assert torch.equal(d.edge_index, synthetic_graph(num_nodes=400, seed=3).edge_index)
    d1 = load_dataset("Synthetic", num_nodes=400, seed=3, split=1)
    assert torch.equal(d1.edge_index, d.edge_index) and not torch.equal(d1.train_mask, d.train_mask)


@pytest.mark.parametrize(
    "kwargs",
    [{"num_nodes": 3, "num_classes": 5}, {"homophily": 1.5}, {"gamma": 1.0}, {"avg_degree": 0},
     {"noise": -1}, {"num_features": 0}, {"num_classes": 0}],
)
def test_bad_parameters(kwargs):
    with pytest.raises(ConfigError):
        synthetic_graph(**kwargs)


def test_scale_arxiv_like_in_seconds():
    t = time.perf_counter()
    d = synthetic_graph(169_343, avg_degree=16, num_classes=40, num_features=128)
    elapsed = time.perf_counter() - t
    assert d.num_edges > 2_000_000
    assert elapsed < 20.0  # ~1 s on 2 cores; generous for a loaded CI machine


def test_gcn_learns_but_not_perfectly(g):
    from torch_geometric.nn import GCNConv

    torch.manual_seed(0)
    c1, c2 = GCNConv(32, 32), GCNConv(32, 5)
    opt = torch.optim.Adam([*c1.parameters(), *c2.parameters()], lr=0.01, weight_decay=5e-4)
    best_val, test_at_best = 0.0, 0.0
    for _ in range(100):
        h = torch.nn.functional.dropout(torch.relu(c1(g.x, g.edge_index)), 0.5)
        loss = torch.nn.functional.cross_entropy(c2(h, g.edge_index)[g.train_mask], g.y[g.train_mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            pred = c2(torch.relu(c1(g.x, g.edge_index)), g.edge_index).argmax(1)
        val = float((pred[g.val_mask] == g.y[g.val_mask]).float().mean())
        if val > best_val:
            best_val, test_at_best = val, float((pred[g.test_mask] == g.y[g.test_mask]).float().mean())
    assert 0.4 < test_at_best < 0.95  # chance is 0.2
