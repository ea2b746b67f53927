"""GCNIILayer's fused chunk step (one autograd node per unit and chunk) equals its plain path (issue #18)."""

import pytest
import torch

from gnnpipe.models.zoo import GCNIILayer
from gnnpipe.tasks.nodes.graph import CompactRows, build_adjacency, csr_row_slice, csr_transpose
from gnnpipe.tasks.nodes.history import ChunkAggregate, ChunkPushPull, History

N, D = 14, 5
CHUNKS = [(0, 5), (5, 9), (9, 14)]



def _backward_chunks(saved: dict, g):
    """gpipe's backward order: each chunk's output gradient ``g[lo:hi]`` back through its saved step, last chunk
    first; returns the gradients of every chunk's inputs ``[h.grad, s.grad, …]`` in that order."""
    grads = []
    for lo, hi in reversed(CHUNKS):
        h, s, out = saved[lo]
        out.backward(g[lo:hi])
        grads += [h.grad, s.grad]
    return grads

def _graph():
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, N, (2, 50), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    ei = torch.cat([ei, ei.flip(0)], 1).unique(dim=1)
    a = build_adjacency(ei, N, "gcn", torch.float64)
    return a, csr_transpose(a)


def _run(fused: bool, p: float, seed: int = 0):
    """Two epochs of one GCNII layer, chunk by chunk (forwards in order, backwards reversed, T2-style zeroing),
    through the fused step or the plain path with ChunkAggregate. Returns outputs and every gradient."""
    a, at = _graph()
    torch.manual_seed(5)
    layer = GCNIILayer(D, layer=3, dropout=p, alpha=0.1, lam=0.5, bias=False, act="relu").double()
    hist = History(N, torch.float64)
    x = torch.randn(N, D, dtype=torch.float64)
    h0 = torch.randn(N, D, dtype=torch.float64)
    g = torch.randn(N, D, dtype=torch.float64)
    torch.manual_seed(seed)
    outs, grads = [], []
    for _ in range(2):
        saved = {}
        for lo, hi in CHUNKS:
            a_c, at_c = CompactRows(csr_row_slice(a, lo, hi)), CompactRows(csr_row_slice(at, lo, hi))
            h = x[lo:hi].clone().requires_grad_()
            s = h0[lo:hi].clone().requires_grad_()

            def agg(t, kind, a_c=a_c, at_c=at_c, lo=lo, hi=hi):
                return ChunkAggregate.apply(t, hist, a_c, at_c, lo, hi, True)

            if fused:
                agg.push_pull = lambda kind, a_c=a_c, at_c=at_c, lo=lo, hi=hi: ChunkPushPull(hist, a_c, at_c, lo, hi)
            out, _ = layer(h, s, agg)
            assert (type(out.grad_fn).__name__ == "_GCNIIChunkBackward") == fused  # one node for the whole step
            outs.append(out.detach().clone())
            saved[lo] = (h, s, out)
        grads += _backward_chunks(saved, g)
        hist.zero_grads()
    grads.append(layer.lin.weight.grad)
    return outs, grads, hist


@pytest.mark.parametrize("p", [0.0, 0.4])
def test_fused_step_equals_plain_path(p):
    layer = GCNIILayer(D, layer=1, dropout=p, alpha=0.1, lam=0.5, bias=False, act="relu")
    assert layer.fusable
    f_out, f_grads, f_hist = _run(True, p)
    u_out, u_grads, u_hist = _run(False, p)
    for a, b in zip(f_out, u_out):
        assert torch.equal(a, b)  # the forward runs the same ATen ops on the same values
    for a, b in zip(f_grads, u_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)  # the backward fuses two ops into one addmm
    assert torch.equal(f_hist.H_in, u_hist.H_in)


def test_fused_step_only_for_the_fusable_form():
    assert not GCNIILayer(D, 1, 0.0, 0.1, 0.5, bias=True, act="relu").fusable
    assert not GCNIILayer(D, 1, 0.0, 0.1, 0.5, bias=False, act="elu").fusable


def test_only_the_plain_history_op_offers_push_pull():
    """The hybrid's op exchanges rows with peers and graph parallelism's exchanges a halo; a fused unit must not
    bypass either: their push_pull is None."""
    from gnnpipe.tasks.nodes.aggregation import HaloOp, HistoryOp, PeerHistoryOp, unit_aggregators
    from gnnpipe.tasks.nodes.graph import GraphOps

    a, at = _graph()
    ei = a.to_sparse_coo().indices().flip(0)
    ops = GraphOps(ei, N, torch.float64)
    plain = HistoryOp(History(N, torch.float64), "gcn", ops, {})
    assert isinstance(plain.push_pull(0, (0, 5), True), ChunkPushPull)
    peer = PeerHistoryOp(History(N, torch.float64), "gcn", ops, {}, peers=None, number=0, halo=lambda: None)
    assert peer.push_pull(0, (0, 5), True) is None
    assert HaloOp.push_pull(object.__new__(HaloOp), 0, (0, 5), True) is None
    # the factory counts an op taken through push_pull like a call of agg, and not when push_pull gives None
    layer = GCNIILayer(D, 1, 0.0, 0.1, 0.5, bias=False, act="relu")
    make = unit_aggregators([layer], lambda i, j, t, kind, layer: t, lambda i, j, kind: None)
    agg = make(0)
    assert agg.push_pull("gcn") is None
    agg(torch.zeros(1), "gcn")  # still op 0
    with pytest.raises(Exception, match="as op 1"):
        agg(torch.zeros(1), "gcn")


def test_unit_falls_back_to_agg_when_push_pull_is_none():
    a, at = _graph()
    layer = GCNIILayer(D, layer=1, dropout=0.0, alpha=0.1, lam=0.5, bias=False, act="relu").double()
    hist = History(N, torch.float64)
    lo, hi = 0, 5
    calls = []

    def agg(t, kind):
        calls.append(kind)
        return ChunkAggregate.apply(t, hist, csr_row_slice(a, lo, hi), csr_row_slice(at, lo, hi), lo, hi, True)

    agg.push_pull = lambda kind: None
    out, _ = layer(torch.randn(hi - lo, D, dtype=torch.float64, requires_grad=True),
                   torch.randn(hi - lo, D, dtype=torch.float64), agg)
    assert calls == ["gcn"] and type(out.grad_fn).__name__ != "_GCNIIChunkBackward"


# ------------------------------------------------------------------ a run of GCNII units as one node (issue #18)
def _units(p: float, k: int = 3):
    torch.manual_seed(7)
    return [GCNIILayer(D, layer=l, dropout=p, alpha=0.1, lam=0.5, bias=False, act="relu").double()
            for l in range(1, k + 1)]


def test_fused_run_passes_gradcheck():
    """One chunk holding every row: the pull-based backward is then the exact gradient of the run, and the
    single node of three units passes gradcheck in h, h0 and every weight (float64)."""
    from gnnpipe.models.zoo import _GCNIIChunk

    a, at = _graph()
    units = _units(0.0)
    hists = [History(N, torch.float64) for _ in units]
    rows = [ChunkPushPull(hist, CompactRows(a), CompactRows(at), 0, N) for hist in hists]
    steps = tuple((r, 0.0, u.alpha, u.theta) for r, u in zip(rows, units))
    h = torch.rand(N, D, dtype=torch.float64, requires_grad=True)
    h0 = torch.rand(N, D, dtype=torch.float64, requires_grad=True)
    weights = [u.lin.weight for u in units]
    assert torch.autograd.gradcheck(lambda h, h0, *w: _GCNIIChunk.apply(h, h0, steps, *w), (h, h0, *weights))


def _run_units(fused: bool, p: float, middle_plain: bool = False):
    """Two epochs of three GCNII units over three chunks through GNNModel.run_units (forwards in order, backwards
    reversed, T2-style zeroing between epochs), with the pipeline's callbacks (fused: agg.push_pull offered)."""
    from gnnpipe.models.base import GNNModel
    from gnnpipe.tasks.nodes.aggregation import unit_aggregators

    a, at = _graph()
    units = _units(p)
    model = GNNModel([torch.nn.Identity(), *units])  # unit 0 is never run
    hists = [History(N, torch.float64) for _ in units]
    x = torch.randn(N, D, dtype=torch.float64)
    h0 = torch.randn(N, D, dtype=torch.float64)
    g = torch.randn(N, D, dtype=torch.float64)
    torch.manual_seed(3)
    outs, grads, nodes = [], [], set()
    for _ in range(2):
        saved = {}
        for lo, hi in CHUNKS:
            a_c, at_c = CompactRows(csr_row_slice(a, lo, hi)), CompactRows(csr_row_slice(at, lo, hi))

            def call(i, j, t, kind, layer, a_c=a_c, at_c=at_c, lo=lo, hi=hi):
                return ChunkAggregate.apply(t, hists[i - 1], a_c, at_c, lo, hi, True)

            def pp(i, j, kind, a_c=a_c, at_c=at_c, lo=lo, hi=hi):
                if middle_plain and i == 2:
                    return None
                return ChunkPushPull(hists[i - 1], a_c, at_c, lo, hi)

            h = x[lo:hi].clone().requires_grad_()
            s = h0[lo:hi].clone().requires_grad_()
            out, _ = model.run_units(1, 4, h, s, unit_aggregators(model.units, call, pp if fused else None))
            nodes.add(type(out.grad_fn).__name__)
            outs.append(out.detach().clone())
            saved[lo] = (h, s, out)
        grads += _backward_chunks(saved, g)
        for hist in hists:
            hist.zero_grads()
    grads += [u.lin.weight.grad for u in units]
    return outs, grads, hists, nodes


@pytest.mark.parametrize("p", [0.0, 0.4])
@pytest.mark.parametrize("middle_plain", [False, True])
def test_fused_run_equals_the_units_one_by_one(p, middle_plain):
    """The run as one node (or split around a unit whose op is not fusable) computes what the units' plain paths
    compute: the same forward bit for bit (same dropout draws), the same history, the same gradients."""
    f_out, f_grads, f_hists, f_nodes = _run_units(True, p, middle_plain)
    u_out, u_grads, u_hists, u_nodes = _run_units(False, p)
    assert f_nodes == {"_GCNIIChunkBackward"} and "_GCNIIChunkBackward" not in u_nodes
    for a, b in zip(f_out, u_out):
        assert torch.equal(a, b)
    for a, b in zip(f_grads, u_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for fh, uh in zip(f_hists, u_hists):
        assert torch.equal(fh.H_in, uh.H_in)


def test_run_units_makes_one_node_for_a_run_and_counts_each_op_once():
    """Three fusable units are one autograd node; a unit whose op is not fusable splits the run and runs its plain
    path with the callback made for it (its op counted once)."""
    from gnnpipe.models.base import GNNModel
    from gnnpipe.tasks.nodes.aggregation import unit_aggregators

    a, at = _graph()
    units = _units(0.0)
    model = GNNModel([torch.nn.Identity(), *units])
    hists = [History(N, torch.float64) for _ in units]
    for plain in (set(), {2}):
        calls = []

        def call(i, j, t, kind, layer, calls=calls):
            calls.append(i)
            return ChunkAggregate.apply(t, hists[i - 1], CompactRows(a), CompactRows(at), 0, N, True)

        def pp(i, j, kind, plain=plain):
            return None if i in plain else ChunkPushPull(hists[i - 1], CompactRows(a), CompactRows(at), 0, N)

        h = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
        out, _ = model.run_units(1, 4, h, torch.randn(N, D, dtype=torch.float64),
                                 unit_aggregators(model.units, call, pp))
        seen, todo = set(), [out.grad_fn]
        while todo:
            n = todo.pop()
            if n is None or n in seen:
                continue
            seen.add(n)
            todo += [f for f, _ in n.next_functions]
        assert sum(type(n).__name__ == "_GCNIIChunkBackward" for n in seen) == (1 if not plain else 2)
        assert calls == sorted(plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_run_masks_in_one_call_are_the_units_draws_one_by_one(dtype):
    """A fused run draws its K dropout masks in one call (issue #18); they are the K masks of
    ``gnnpipe.models.base.dropout`` one after the other, number for number, and the generator ends in the same state."""
    from gnnpipe.models.base import dropout
    from gnnpipe.models.zoo import _run_masks

    h = torch.ones(37, 11, dtype=dtype)
    steps = tuple((None, 0.3, 0.1, 0.5) for _ in range(4))
    torch.manual_seed(5)
    one_by_one = [dropout(h, 0.3, True) for _ in steps]
    after = torch.rand(3)
    torch.manual_seed(5)
    masks = _run_masks(h, steps)
    assert masks.shape == (4, 37, 11)
    for k, ref in enumerate(one_by_one):
        assert torch.equal(h * masks[k], ref)
    assert torch.equal(torch.rand(3), after)
    assert _run_masks(h, steps[:1]) is None  # one unit: drawn as the plain path draws it
    assert _run_masks(h, ((None, 0.3, 0.1, 0.5), (None, 0.2, 0.1, 0.5))) is None  # different probabilities
