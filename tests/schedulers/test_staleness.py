"""The staleness report: fresh vs stale cross-chunk reads in the forward and the pull backward."""

import numpy as np
import pytest
import torch

from gnnpipe import schedulers as gs
from gnnpipe.errors import ConfigError
from gnnpipe.schedulers import Schedule

# three chunks of one vertex each, complete undirected graph: every chunk has 2 cross in- and out-edges
PTR = [0, 1, 2, 3]
EI = [[0, 1, 0, 2, 1, 2], [1, 0, 2, 0, 2, 1]]


def test_chunk_edge_counts():
    m = gs.chunk_edge_counts([0, 2, 3], [[0, 1, 2, 2, 0], [1, 2, 0, 1, 0]])
    # edges (src→dst): 0→1 (0→0 chunk), 1→2 (c0→c1), 2→0 (c1→c0), 2→1 (c1→c0), 0→0 (c0→c0)
    assert m.tolist() == [[2, 2], [1, 0]]  # M[dst chunk, src chunk]


def test_gpipe_fixed_order_forward_and_reverse_backward():
    rep = gs.staleness_report(gs.build_schedule("gpipe", 2, 3), PTR, EI)
    # forward order 0,1,2: chunk i reads i of its 2 neighbours fresh
    assert rep.forward_fresh().tolist() == [[0.0, 0.5, 1.0]] * 2
    # backward order 2,1,0: chunk 2 reads nothing fresh, chunk 0 everything
    assert rep.backward_fresh().tolist() == [[1.0, 0.5, 0.0]] * 2
    assert rep.fwd_total.tolist() == [2, 2, 2] and rep.bwd_total.tolist() == [2, 2, 2]
    sm = rep.summary()
    assert sm["forward_fresh"] == pytest.approx(0.5) and sm["backward_fresh"] == pytest.approx(0.5)
    assert sm["forward_fresh_chunk_range"] == (0.0, 1.0)
    assert np.allclose(rep.forward_stale(), 1 - rep.forward_fresh())


def test_1f1b_backward_in_forward_order():
    rep = gs.staleness_report(gs.build_schedule("1f1b", 3, 3, order=gs.FixedOrder([2, 0, 1])), PTR, EI)
    assert rep.forward_fresh().tolist() == [[0.5, 1.0, 0.0]] * 3
    assert rep.backward_fresh().tolist() == [[0.5, 1.0, 0.0]] * 3


def test_directed_edges_count_in_for_forward_and_out_for_backward():
    # one edge 0 → 1 (chunk 0 → chunk 1): an in-edge of chunk 1, an out-edge of chunk 0
    rep = gs.staleness_report(gs.build_schedule("gpipe", 1, 2), [0, 1, 2], torch.tensor([[0], [1]]))
    assert rep.fwd_total.tolist() == [0, 1] and rep.bwd_total.tolist() == [1, 0]
    f, b = rep.forward_fresh(), rep.backward_fresh()
    assert np.isnan(f[0, 0]) and f[0, 1] == 1.0  # F(1) after F(0): fresh
    assert b[0, 0] == 1.0 and np.isnan(b[0, 1])  # B(0) after B(1) (reverse): fresh
    assert "-" in rep.to_text()


def test_custom_schedule_with_different_orders_per_stage():
    orders = [["0F0", "0F1", "0F2", "0B2", "0B1", "0B0", "0S"], ["1F2", "1F1", "1F0", "1B0", "1B1", "1B2", "1S"]]
    sch = gs.validate(Schedule.from_orders(2, 3, orders))
    assert gs.to_csv(sch).splitlines()[0] == "0F0,0F1,0F2,,,,,,,0B2,0B1,0B0,0S"
    rep = gs.staleness_report(sch, PTR, EI)
    assert rep.forward_fresh().tolist() == [[0.0, 0.5, 1.0], [1.0, 0.5, 0.0]]
    assert rep.backward_fresh().tolist() == [[1.0, 0.5, 0.0], [0.0, 0.5, 1.0]]


def random_graph(n=60, e=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    return torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])


def test_shuffled_epochs_are_unbiased_on_average():
    ptr = [0, 15, 30, 45, 60]
    ei = random_graph()
    fixed = gs.staleness_report(gs.build_schedule("gpipe", 2, 4), ptr, ei).forward_fresh()[0]
    assert fixed[0] == 0.0 and fixed[3] == 1.0  # a fixed order always starves the first chunk
    rep = gs.shuffled_staleness("gpipe", 2, ptr, ei, epochs=300, seed=4)
    assert rep.epochs == 300 and rep.fwd_fresh.shape == (300, 2, 4)
    # under a uniform random order each neighbour chunk comes first half the time (GNNPipe T1)
    assert np.allclose(rep.forward_fresh(), 0.5, atol=0.08)
    assert np.allclose(rep.backward_fresh(), 0.5, atol=0.08)
    one = rep.summary(epoch=7)
    assert one["epochs"] == 1 and 0 <= one["forward_fresh"] <= 1
    # one epoch of the pooled report is the report of that epoch's schedule
    e7 = gs.build_schedule("gpipe", 2, 4, order=gs.ShuffledOrder(4), start_epoch=7)
    assert np.array_equal(rep.forward_fresh(epoch=7), gs.staleness_report(e7, ptr, ei).forward_fresh())


def test_multi_epoch_schedule_is_reported_per_epoch():
    ptr, ei = [0, 15, 30, 45, 60], random_graph(seed=1)
    multi = gs.build_schedule("async-stale", 3, 4, epochs=3, order="shuffle", seed=2)
    rep = gs.staleness_report(multi, ptr, ei)
    assert rep.epochs == 3
    for e in range(3):
        single = gs.build_schedule("1f1b", 3, 4, order=gs.ShuffledOrder(2), start_epoch=e)
        ref = gs.staleness_report(single, ptr, ei)
        assert np.array_equal(rep.fwd_fresh[e], ref.fwd_fresh[0])
        assert np.array_equal(rep.bwd_fresh[e], ref.bwd_fresh[0])
    assert "3 epoch(s) pooled" in rep.to_text()


def test_errors():
    sch = gs.build_schedule("gpipe", 2, 3)
    with pytest.raises(ConfigError, match="describes 2 chunks"):
        gs.staleness_report(sch, [0, 1, 3], EI)
    with pytest.raises(ConfigError, match="shape"):
        gs.staleness_report(sch, PTR, [0, 1, 2])
    with pytest.raises(ConfigError, match="outside"):
        gs.staleness_report(sch, PTR, [[0], [7]])
    with pytest.raises(ConfigError, match="non-decreasing"):
        gs.staleness_report(sch, [0, 2, 1, 3], EI)
    with pytest.raises(ConfigError):
        gs.staleness_report([sch, gs.build_schedule("gpipe", 3, 3)], PTR, EI)
