"""Each corrector's rule on small buffers against a hand computation (DESIGN §5 table)."""

import pytest
import torch

from gnnpipe.correctors import (
    Corrector,
    StageContext,
    available,
    build_correctors,
    get,
    register,
)
from gnnpipe.errors import ConfigError, UnknownComponentError
from gnnpipe.schedulers import FixedOrder, ShuffledOrder
from gnnpipe.tasks.nodes.history import History

N, D = 6, 2
PTR = torch.tensor([0, 2, 4, 6])


def _ctx(stages=2, n_ops=2):
    hs = []
    for _ in range(n_ops):
        h = History(N, torch.float64)
        h.ensure(D)
        hs.append(h)
    return StageContext(stage=0, num_stages=stages, histories=hs, chunk_ptr=PTR)


def test_registry_and_builder():
    assert {"none", "t1", "t2", "t3", "ema", "refresh"} <= set(available())
    ks = build_correctors(["t1", "t3:5", "ema:0.9"])
    assert [type(k).__name__ for k in ks] == ["T1RandomChunkOrder", "T3PeriodicSnapshot", "EMASmoothing"]
    assert ks[1].period == 5 and ks[2].momentum == 0.9
    assert build_correctors(["none"]) == [] and build_correctors(None) == []
    with pytest.raises(UnknownComponentError, match="available"):
        build_correctors(["t7"])
    with pytest.raises(ConfigError, match="number"):
        build_correctors(["ema:fast"])
    with pytest.raises(ConfigError, match="momentum"):
        build_correctors(["ema:1.5"])


def test_t1_selects_a_seeded_shuffle_identical_across_stages():
    pol_a = get("t1")().order_policy(seed=3)
    pol_b = get("t1")().order_policy(seed=3)
    assert isinstance(pol_a, ShuffledOrder)
    orders = [pol_a.order(e, 8) for e in range(5)]
    assert orders == [pol_b.order(e, 8) for e in range(5)]
    assert all(sorted(o) == list(range(8)) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # changes between epochs
    assert get("none")().order_policy(0) is None
    assert list(FixedOrder().order(0, 4)) == [0, 1, 2, 3]


def test_t2_doubles_a_chunks_rows_after_backward_and_zeroes_at_epoch_end():
    ctx = _ctx()
    t2 = get("t2")()
    t2.setup(ctx)
    g0 = torch.arange(N * D, dtype=torch.float64).view(N, D)
    for h in ctx.histories:
        h.G_out.copy_(g0)
    t2.after_backward(0, 1)  # chunk 1 = rows 2..3
    expected = g0.clone()
    expected[2:4] *= 2
    for h in ctx.histories:
        torch.testing.assert_close(h.G_out, expected)
    t2.on_epoch_end(0)
    for h in ctx.histories:
        assert torch.count_nonzero(h.G_out) == 0


def test_t2_leaves_rows_the_pull_doubled_and_doubles_the_others():
    """T2 asks the chunk op's pull to double the rows it writes (History.scale_after_pull); after the chunk's backward
    it doubles only the ops whose pull did not (here: op 1, which the chunk did not reach)."""
    ctx = _ctx()
    t2 = get("t2")()
    t2.setup(ctx)
    assert all(h.scale_after_pull == 2.0 for h in ctx.histories)
    g0 = torch.arange(N * D, dtype=torch.float64).view(N, D)
    for h in ctx.histories:
        h.G_out.copy_(g0)
    ctx.histories[0].scale_grad_rows(2, 4, 2.0)  # what op 0's pull did for chunk 1
    ctx.histories[0]._scaled.add(2)
    t2.after_backward(0, 1)
    expected = g0.clone()
    expected[2:4] *= 2
    for h in ctx.histories:
        torch.testing.assert_close(h.G_out, expected, rtol=0, atol=0)
    one = _ctx(stages=1)
    get("t2")().setup(one)
    assert one.histories[0].scale_after_pull is None  # T2 does nothing with one stage


def test_t2_is_a_no_op_with_one_stage():
    ctx = _ctx(stages=1)
    t2 = get("t2")()
    t2.setup(ctx)
    ctx.histories[0].G_out.fill_(1.0)
    t2.after_backward(0, 0)
    t2.on_epoch_end(0)
    assert torch.all(ctx.histories[0].G_out == 1.0)


def test_t3_restores_and_snapshots_on_the_papers_period():
    """P = 3: restore at the start of epochs e with e mod 3 != 0 (zeros before the first snapshot);
    snapshot at the end of epochs with (e+1) mod 3 == 0."""
    ctx = _ctx(n_ops=1)
    t3 = get("t3")(3)
    t3.setup(ctx)
    hist = ctx.histories[0]
    seen = {}
    for e in range(7):
        hist.H_in.fill_(100.0 + e)  # what the epoch's previous training left
        t3.on_epoch_start(e)
        seen[e] = float(hist.H_in[0, 0])  # (through the property: a restore to zeros only marks the rows zero)
        hist.H_in.fill_(float(e))  # what this epoch's forwards write
        t3.on_epoch_end(e)
    # e=0: no restore; e=1,2: restore the initial zeros; end of e=2 snapshots 2.0;
    # e=3: no restore; e=4,5: restore 2.0; end of e=5 snapshots 5.0; e=6: no restore
    assert seen == {0: 100.0, 1: 0.0, 2: 0.0, 3: 103.0, 4: 2.0, 5: 2.0, 6: 106.0}


def test_ema_smooths_rows_read_stale():
    ctx = _ctx(n_ops=1)
    ema = get("ema")(0.5)
    ema.setup(ctx)
    H = ctx.histories[0].H_in
    # epoch 0: chunk 0 processed with value 4 (first write taken as is)
    ema.on_epoch_start(0)
    H[0:2] = 4.0
    ema.after_forward(0, 0)
    # epoch 1: start sets H_in of seen rows to the average; chunk 0 now writes 8 -> avg 0.5*4 + 0.5*8 = 6
    H.fill_(-1.0)
    ema.on_epoch_start(1)
    assert torch.all(H[0:2] == 4.0) and torch.all(H[2:] == -1.0)  # never-seen rows untouched
    H[0:2] = 8.0
    ema.after_forward(1, 0)
    ema.on_epoch_start(2)
    assert torch.all(H[0:2] == 6.0)


def test_refresh_period():
    r = get("refresh")(4)
    assert [e for e in range(10) if r.wants_refresh(e)] == [4, 8]


def test_user_corrector_registers_through_the_same_door():
    @register("test-count-forwards")
    class Count(Corrector):
        def __init__(self):
            self.n = 0

        def after_forward(self, epoch, chunk):
            self.n += 1

    (k,) = build_correctors(["test-count-forwards"])
    k.setup(_ctx())
    k.after_forward(0, 0)
    assert k.n == 1
