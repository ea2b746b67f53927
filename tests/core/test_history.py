"""The chunk aggregation op: forward values and the pull backward against a dense reference (DESIGN §5)."""

import pytest
import torch

from gnnpipe.tasks.nodes.graph import (
    CompactRows,
    GraphOps,
    build_adjacency,
    csr_row_slice,
    csr_rows,
    csr_transpose,
    spmm,
)
from gnnpipe.tasks.nodes.history import ChunkAggregate, History

N, D = 12, 3


@pytest.fixture
def adj():
    g = torch.Generator().manual_seed(3)
    ei = torch.randint(0, N, (2, 40), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    ei = torch.cat([ei, ei.flip(0)], 1).unique(dim=1)
    a = build_adjacency(ei, N, "gcn", torch.float64)
    return ei, a, csr_transpose(a)


def test_adjacency_kinds_match_formulas():
    ei = torch.tensor([[0, 1, 1, 2, 3], [1, 0, 2, 1, 1]])  # 3 -> 1 is one-directional
    A = torch.zeros(4, 4, dtype=torch.float64)
    A[ei[1], ei[0]] = 1.0
    torch.testing.assert_close(build_adjacency(ei, 4, "sum", torch.float64).to_dense(), A)
    deg = A.sum(1)
    mean = A / deg.clamp(min=1).unsqueeze(1)
    torch.testing.assert_close(build_adjacency(ei, 4, "mean", torch.float64).to_dense(), mean)
    At = A + torch.eye(4, dtype=torch.float64)
    d = At.sum(1).pow(-0.5)
    torch.testing.assert_close(build_adjacency(ei, 4, "gcn", torch.float64).to_dense(), d[:, None] * At * d[None, :])


def test_row_slices(adj):
    _, a, _ = adj
    dense = a.to_dense()
    torch.testing.assert_close(csr_row_slice(a, 3, 9).to_dense(), dense[3:9])
    rows = torch.tensor([7, 0, 11])
    torch.testing.assert_close(csr_rows(a, rows).to_dense(), dense[rows])


def test_compact_rows_equal_the_row_slice_product_bitwise(adj):
    _, a, at = adj
    h = torch.randn(N, D, dtype=torch.float64)
    for lo, hi in [(0, 4), (4, 9), (9, 12), (0, N)]:
        for m in (a, at):
            rows = csr_row_slice(m, lo, hi)
            comp = CompactRows(rows)
            assert comp.cols.tolist() == sorted(set(rows.col_indices().tolist()))
            assert comp.local.size(1) == comp.cols.numel() <= N
            # bit for bit against the same fused kernel on the CSR rows; against PyTorch's own sparse product to
            # rounding only (its CPU kernel's summation order depends on the vector width: AVX2 vs AVX-512)
            assert torch.equal(spmm(comp, h), spmm(rows, h))
            torch.testing.assert_close(spmm(comp, h), torch.sparse.mm(rows, h), rtol=1e-13, atol=1e-13)


def test_compact_rows_without_nonzeros_give_zeros():
    ei = torch.tensor([[0, 1], [1, 0]])  # vertices 2, 3 isolated: their "mean" rows are empty
    a = build_adjacency(ei, 4, "mean", torch.float64)
    comp = CompactRows(csr_row_slice(a, 2, 4))
    assert comp.cols.numel() == 0
    assert torch.equal(spmm(comp, torch.randn(4, 5, dtype=torch.float64)), torch.zeros(2, 5, dtype=torch.float64))


def _slice(m, lo, hi, form):
    """Rows [lo, hi) of m as the chunk op takes them: a CSR row slice or (as the pipeline builds them) CompactRows."""
    rows = csr_row_slice(m, lo, hi)
    return CompactRows(rows) if form == "compact" else rows


FORMS = pytest.mark.parametrize("form", ["slice", "compact"])


def _chunks():
    return [(0, 4), (4, 9), (9, 12)]


@FORMS
def test_forward_reads_fresh_processed_rows_and_history_for_the_rest(adj, form):
    _, a, at = adj
    dense = a.to_dense()
    hist = History(N, torch.float64)
    hist.ensure(D)
    stale = torch.randn(N, D, dtype=torch.float64)
    hist.H_in.copy_(stale)
    x = torch.randn(N, D, dtype=torch.float64)
    expected_buf = stale.clone()
    for lo, hi in _chunks():
        out = ChunkAggregate.apply(x[lo:hi], hist, _slice(a, lo, hi, form), _slice(at, lo, hi, form), lo, hi, True)
        expected_buf[lo:hi] = x[lo:hi]
        torch.testing.assert_close(out, dense[lo:hi] @ expected_buf)
    torch.testing.assert_close(hist.H_in, x)


@FORMS
def test_backward_is_the_pull_over_all_out_neighbours(adj, form):
    """After every chunk's backward, chunk c's input gradient = Âᵀ[R_c,:] @ G_out with G_out holding
    the fresh gradients of chunks already back-propagated and the old ones of the rest."""
    _, a, at = adj
    dense_t = a.to_dense().t()
    hist = History(N, torch.float64)
    hist.ensure(D)
    old_g = torch.randn(N, D, dtype=torch.float64)
    hist.G_out.copy_(old_g)
    gbuf = old_g.clone()
    g_all = torch.randn(N, D, dtype=torch.float64)
    for lo, hi in reversed(_chunks()):
        x = torch.randn(hi - lo, D, dtype=torch.float64, requires_grad=True)
        out = ChunkAggregate.apply(x, hist, _slice(a, lo, hi, form), _slice(at, lo, hi, form), lo, hi, True)
        out.backward(g_all[lo:hi])
        gbuf[lo:hi] = g_all[lo:hi]
        torch.testing.assert_close(x.grad, dense_t[lo:hi] @ gbuf)


def test_single_chunk_equals_exact_autograd(adj):
    _, a, at = adj
    x = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    hist = History(N, torch.float64)
    out = ChunkAggregate.apply(x, hist, a, at, 0, N, True)
    w = torch.randn(N, D, dtype=torch.float64)
    (out * w).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ((a.to_dense() @ x2) * w).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


@FORMS
def test_gradcheck_against_dense_reference_including_cross_chunk_pull(adj, form):
    """gradcheck (float64) of the chunk op: with the other chunks' output gradients held in G_out
    as constants, the op's backward is the exact vector-Jacobian product of the function
    x_c ↦ Σ_rows (Â[R_c,:] @ H)·W_c + Σ_{c'≠c} <Â[R_c', R_c] x_c, G_out[R_c']>, i.e. of the chunk's own
    output plus the cross-chunk terms it feeds (the pull)."""
    _, a, at = adj
    dense = a.to_dense()
    lo, hi = 4, 9
    base = torch.randn(N, D, dtype=torch.float64)
    other_g = torch.randn(N, D, dtype=torch.float64)
    other_g[lo:hi] = 0

    def op(x):
        hist = History(N, torch.float64)
        hist.ensure(D)
        hist.H_in.copy_(base)
        hist.G_out.copy_(other_g)
        out = ChunkAggregate.apply(x, hist, _slice(a, lo, hi, form), _slice(at, lo, hi, form), lo, hi, True)
        return out

    def reference(x):
        H = base.clone()
        H[lo:hi] = x
        own = dense[lo:hi] @ H
        return own, (dense[:, lo:hi] @ x * other_g).sum()

    x = torch.randn(hi - lo, D, dtype=torch.float64, requires_grad=True)
    g = torch.randn(hi - lo, D, dtype=torch.float64)
    # pull gradient of the op = gradient of own output (with g) + cross-chunk term
    (gx,) = torch.autograd.grad(op(x), x, g)
    own, cross = reference(x)
    (rx,) = torch.autograd.grad((own * g).sum() + cross, x)
    torch.testing.assert_close(gx, rx)
    # and torch.autograd.gradcheck on the op itself with an empty cross term
    other_g.zero_()
    assert torch.autograd.gradcheck(op, (x,), eps=1e-6, atol=1e-8)


def test_write_false_leaves_history_untouched(adj):
    _, a, at = adj
    hist = History(N, torch.float64)
    hist.ensure(D)
    before = hist.H_in.clone()
    ChunkAggregate.apply(torch.randn(3, D, dtype=torch.float64), hist, csr_row_slice(a, 0, 3), csr_row_slice(at, 0, 3),
                         0, 3, False)
    assert torch.equal(hist.H_in, before)


def test_graph_ops_aggregate_gradient(adj):
    ei, a, _ = adj
    ops = GraphOps(ei, N, torch.float64)
    assert torch.autograd.gradcheck(lambda h: ops.aggregate(h, "mean"),
                                    (torch.randn(N, D, dtype=torch.float64, requires_grad=True),))


def test_pull_reads_known_zero_rows_from_the_zero_row_bitwise(adj):
    """After zero_grads (T2's epoch-end zeroing) the pull skips fetching rows known to be zero; its result is
    the full pull's, bit for bit, chunk after chunk, with T2's doubling in between."""
    _, a, at = adj
    g_all = torch.randn(N, D, dtype=torch.float64)
    results = {}
    for skip in (True, False):
        hist = History(N, torch.float64)
        hist.ensure(D)
        hist.G_out.copy_(torch.randn(N, D, dtype=torch.float64))  # stale gradients of the previous epoch
        hist.zero_grads()
        if not skip:
            hist.G_out.add_(0.0)  # a change behind the history's back: nothing is known zero any more
            assert hist.grad_source()[1] is None
        else:
            assert bool(hist.grad_source()[1].all())
        grads = []
        for lo, hi in reversed(_chunks()):
            x = torch.randn(hi - lo, D, dtype=torch.float64, requires_grad=True)
            ChunkAggregate.apply(x, hist, _slice(a, lo, hi, "compact"), _slice(at, lo, hi, "compact"), lo, hi,
                                 True).backward(g_all[lo:hi])
            hist.scale_grad_rows(lo, hi, 2.0)
            grads.append(x.grad)
        if skip:
            _, zero = hist.grad_source()
            assert zero is not None and not bool(zero.any())  # every chunk written since the zeroing
        results[skip] = grads
    for fast, full in zip(results[True], results[False]):
        assert torch.equal(fast, full)


def test_direct_writes_to_g_out_are_read(adj):
    """A change of G_out that bypasses the History methods must not be hidden by the known-zero rows."""
    _, a, at = adj
    hist = History(N, torch.float64)
    hist.ensure(D)
    hist.zero_grads()
    hist.G_out[9:12] = 1.0  # e.g. a user's corrector
    lo, hi = 4, 9
    x = torch.randn(hi - lo, D, dtype=torch.float64, requires_grad=True)
    g = torch.randn(hi - lo, D, dtype=torch.float64)
    ChunkAggregate.apply(x, hist, _slice(a, lo, hi, "compact"), _slice(at, lo, hi, "compact"), lo, hi, True).backward(g)
    expected = hist.G_out.clone()
    torch.testing.assert_close(x.grad, at.to_dense()[lo:hi] @ expected)
    assert bool((expected[9:12] == 1.0).all())


def test_zero_grads_writes_no_zeros_until_g_out_is_read(adj):
    """T2's epoch-end zeroing only marks the rows known zero (issue #18: no pass over the buffer); the pull reads
    them as zeros, a chunk's write replaces them, and reading ``G_out`` gives zeros where nothing was written."""
    _, a, at = adj
    hist = History(N, torch.float64)
    hist.ensure(D)
    old = torch.randn(N, D, dtype=torch.float64)
    hist.G_out.copy_(old)  # last epoch's gradients
    version = hist._g_view._version
    hist.zero_grads()
    assert hist._g_view._version == version  # nothing written
    lo, hi = 4, 9
    x = torch.randn(hi - lo, D, dtype=torch.float64, requires_grad=True)
    g = torch.randn(hi - lo, D, dtype=torch.float64)
    ChunkAggregate.apply(x, hist, _slice(a, lo, hi, "compact"), _slice(at, lo, hi, "compact"), lo, hi, True).backward(g)
    expected = torch.zeros(N, D, dtype=torch.float64)
    expected[lo:hi] = g
    assert torch.equal(x.grad, spmm(_slice(at, lo, hi, "slice"), expected))  # the stale rows read as zeros
    assert torch.equal(hist.G_out, expected)  # reading G_out writes the zeros
    assert torch.equal(hist.state_tensors()["G_out"], expected)


def test_scale_after_pull_equals_scaling_after_the_chunks_backward_bitwise(adj):
    """T2's doubling applied by the pull right after its product (History.scale_after_pull) gives the pulls and
    the G_out of doubling after each chunk's backward, bit for bit, over two epochs of reversed chunk order."""
    _, a, at = adj
    torch.manual_seed(0)
    gs = {(e, lo): torch.randn(hi - lo, D, dtype=torch.float64) for e in range(2) for lo, hi in _chunks()}
    results = {}
    for in_pull in (True, False):
        hist = History(N, torch.float64)
        hist.ensure(D)
        hist.scale_after_pull = 2.0 if in_pull else None
        out = []
        for e in range(2):
            for lo, hi in reversed(_chunks()):
                x = torch.randn(hi - lo, D, dtype=torch.float64, requires_grad=True)
                ChunkAggregate.apply(x, hist, _slice(a, lo, hi, "compact"), _slice(at, lo, hi, "compact"), lo, hi,
                                     True).backward(gs[(e, lo)])
                assert hist.take_scaled(lo) is in_pull
                if not in_pull:
                    hist.scale_grad_rows(lo, hi, 2.0)
                out.append(x.grad)
            out.append(hist.G_out.clone())
            hist.zero_grads()
        results[in_pull] = out
    for fast, ref in zip(results[True], results[False]):
        assert torch.equal(fast, ref)


def test_zero_inputs_reads_known_zero_rows_from_the_zero_row_bitwise(adj):
    """T3's restore to zeros (History.zero_inputs) writes nothing: until a chunk writes its rows, the push reads
    them as zeros, bit for bit what a history zeroed in memory gives, over two epochs; H_in read through the
    property is zero where nothing was written, and the redirect is dropped once every row was written."""
    _, a, at = adj
    torch.manual_seed(1)
    xs = {(e, lo): torch.randn(hi - lo, D, dtype=torch.float64) for e in range(2) for lo, hi in _chunks()}
    lazy, ref = History(N, torch.float64), History(N, torch.float64)
    for h in (lazy, ref):
        h.ensure(D)
        h.H_in.copy_(torch.randn(N, D, dtype=torch.float64))  # last epoch's rows
    for e in range(2):
        version = lazy._h_view._version
        lazy.zero_inputs()
        assert lazy._h_view._version == version  # nothing written
        ref.H_in.zero_()
        for i, (lo, hi) in enumerate(_chunks()):
            outs = [ChunkAggregate.apply(xs[(e, lo)], h, _slice(a, lo, hi, "compact"), _slice(at, lo, hi, "compact"),
                                         lo, hi, True) for h in (lazy, ref)]
            assert torch.equal(outs[0], outs[1])
            assert lazy.push_source()[1] is (None if i == len(_chunks()) - 1 else lazy._h_redirect)
    lazy.zero_inputs()
    ChunkAggregate.apply(xs[(0, 4)], lazy, _slice(a, 4, 9, "compact"), _slice(at, 4, 9, "compact"), 4, 9, True)
    expected = torch.zeros(N, D, dtype=torch.float64)
    expected[4:9] = xs[(0, 4)]
    assert torch.equal(lazy.H_in, expected) and lazy.push_source()[1] is None  # read: the zeros are written
    assert torch.equal(lazy.state_tensors()["H_in"], expected)


def test_ops_sharing_chunk_rows_renumber_their_columns_once_per_state_bitwise(adj):
    """The ops of a stage share each chunk's rows (CompactRows) and are written chunk by chunk alike, so a chunk's
    pull through k ops renumbers the columns through the redirect table once (CompactRows.redirected_col, keyed by
    History.grads_in_place) and the push before T3's first snapshot likewise; the results are bit for bit those of
    histories that read everything in place, over two epochs in different chunk orders (the state changes every
    chunk: no column renumbered for another state is reused), and at most REDIRECTED_CACHED rows keep columns."""
    from gnnpipe.tasks.nodes import graph

    _, a, at = adj
    rows = {lo: (_slice(a, lo, hi, "compact"), _slice(at, lo, hi, "compact")) for lo, hi in _chunks()}
    torch.manual_seed(2)
    K = 3
    fast, ref = [History(N, torch.float64) for _ in range(K)], [History(N, torch.float64) for _ in range(K)]
    for h in fast + ref:
        h.ensure(D)
    for e, order in enumerate([[0, 1, 2], [2, 0, 1]]):
        chunks = [_chunks()[i] for i in order]
        for h in fast:
            h.zero_inputs()
            h.zero_grads()
        for h in ref:
            h.H_in.zero_()
            h.G_out.zero_()
            h.G_out.add_(0.0)  # behind the history's back: nothing known zero, every row read in place
        for lo, hi in chunks:
            x = torch.randn(hi - lo, D, dtype=torch.float64)
            g = torch.randn(hi - lo, D, dtype=torch.float64)
            cols = set()
            for k in range(K):
                xs = [x.clone().requires_grad_() for _ in range(2)]
                a_c, at_c = rows[lo]
                outs = [ChunkAggregate.apply(xs[0], fast[k], a_c, at_c, lo, hi, True),
                        ChunkAggregate.apply(xs[1], ref[k], _slice(a, lo, hi, "compact"),
                                             _slice(at, lo, hi, "compact"), lo, hi, True)]
                assert torch.equal(outs[0], outs[1])
                for o, xk in zip(outs, xs):
                    o.backward(g)
                assert torch.equal(xs[0].grad, xs[1].grad)
                assert fast[k].grads_in_place == fast[0].grads_in_place
                if at_c._redirected is not None:
                    cols.add(id(at_c._redirected[1]))
            assert len(cols) == 1  # one renumbering for the K pulls of this chunk
            assert len(graph._REDIRECTED) <= graph.REDIRECTED_CACHED
        assert fast[0].grads_in_place == frozenset(_chunks())
