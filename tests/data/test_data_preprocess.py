"""preprocess() / prepare() / canonicalize(): the paper's preprocessing, each switch, canonical dtypes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import is_undirected

from gnnpipe.data import canonicalize, prepare, preprocess
from gnnpipe.errors import ConfigError, DataValidationError


def raw_graph() -> Data:
    # 0->1 twice (duplicate), 1->2 (no reverse), 2->2 self-loop, 3->0 and 0->3 (already symmetric)
    ei = torch.tensor([[0, 0, 1, 2, 3, 0], [1, 1, 2, 2, 0, 3]])
    n = 5  # vertex 4 is isolated and last
    return Data(
        x=torch.arange(n * 2, dtype=torch.float64).view(n, 2),
        edge_index=ei.int(),
        y=torch.tensor([[0], [1], [0], [1], [0]]),
        train_mask=torch.tensor([1, 1, 0, 0, 0], dtype=torch.uint8),
        val_mask=torch.tensor([0, 0, 1, 0, 0], dtype=torch.uint8),
        test_mask=torch.tensor([0, 0, 0, 1, 1], dtype=torch.uint8),
    )


def edges(ei) -> set:
    return set(map(tuple, ei.t().tolist()))


def test_default_preprocessing():
    d = raw_graph()
    p = preprocess(d)
    assert edges(p.edge_index) == {(0, 1), (1, 0), (1, 2), (2, 1), (0, 3), (3, 0)}
    assert p.edge_index.size(1) == 6  # no duplicates
    assert is_undirected(p.edge_index) and p.num_nodes == 5
    assert p is not d and d.edge_index.size(1) == 6  # input untouched
    assert p.x is d.x  # other tensors shared, not copied


def test_keep_self_loops():
    p = preprocess(raw_graph(), remove_self_loops=False)
    assert (2, 2) in edges(p.edge_index)
    assert p.edge_index.size(1) == 7


def test_directed_with_dedupe():
    p = preprocess(raw_graph(), undirected=False)
    assert edges(p.edge_index) == {(0, 1), (1, 2), (3, 0), (0, 3)}
    assert p.edge_index.size(1) == 4


def test_all_switches_off_keeps_edges():
    d = raw_graph()
    p = preprocess(d, undirected=False, remove_self_loops=False, dedupe=False)
    assert torch.equal(p.edge_index, d.edge_index.long())


def test_edge_weight_carried_along():
    d = raw_graph()
    d.edge_weight = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    p = preprocess(d, undirected=False)
    w = dict(zip(map(tuple, p.edge_index.t().tolist()), p.edge_weight.tolist()))
    assert w[(0, 1)] == 3.0 and w[(1, 2)] == 3.0 and len(w) == 4  # duplicates summed, loop gone


def test_prepare_gives_canonical_form():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = prepare(raw_graph())
    assert p.x.dtype == torch.float32 and p.y.dtype == torch.long and p.y.shape == (5,)
    assert p.edge_index.dtype == torch.long and is_undirected(p.edge_index)
    for k in ("train_mask", "val_mask", "test_mask"):
        assert p[k].dtype == torch.bool and p[k].shape == (5,)
    assert int(p.train_mask.sum()) == 2


def test_prepare_densifies_sparse_x():
    d = raw_graph()
    d.x = d.x.to_sparse()
    p = prepare(d)
    assert p.x.layout == torch.strided and torch.equal(p.x, raw_graph().x.float())


def test_prepare_validates_first():
    d = raw_graph()
    d.edge_index[0, 0] = 7
    with pytest.raises(DataValidationError, match="vertex 7"):
        prepare(d)


def test_prepare_picks_split_column():
    d = raw_graph()
    d.train_mask = torch.stack([d.train_mask, 1 - d.train_mask], 1)
    d.val_mask = torch.stack([d.val_mask, d.val_mask], 1)
    d.test_mask = torch.stack([d.test_mask, d.train_mask[:, 0]], 1)
    assert prepare(d, split=1).train_mask.tolist() == [False, False, True, True, True]
    with pytest.raises(ConfigError, match=r"2 predefined splits.*split=0..1"):
        prepare(d, split=2)


def test_prepare_accepts_dict():
    d = raw_graph()
    p = prepare(d.to_dict())
    assert p.num_edges == 6


def test_canonicalize_single_split_rejects_nonzero():
    with pytest.raises(ConfigError, match="single predefined split"):
        canonicalize(raw_graph(), split=1)
