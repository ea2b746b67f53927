"""The halo-gradient (push) history op for message-passing units (docs/HALO_GRADIENT.md): forward values,
the pushed backward against a dense reference (gradcheck in float64), and the T2 rule on pushes."""

import pytest
import torch
from torch_geometric.nn import GATConv

from gnnpipe.tasks.nodes.aggregation import PushHistoryOp
from gnnpipe.tasks.nodes.graph import GraphOps
from gnnpipe.tasks.nodes.history import PushHistory

N, D = 12, 3
PTR = [0, 4, 7, 12]  # three chunks


@pytest.fixture
def graph():
    g = torch.Generator().manual_seed(5)
    ei = torch.randint(0, N, (2, 40), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    return torch.cat([ei, ei.flip(0)], 1).unique(dim=1)


@pytest.fixture
def conv():
    torch.manual_seed(0)
    return GATConv(D, 2, heads=2).double()


def layer_of(conv):
    return lambda xs, xd, ei, w: conv((xs, xd), ei)


def make_op(graph):
    return PushHistoryOp(PushHistory(N, torch.float64), "sum", GraphOps(graph, N, torch.float64), {})


def dense_epoch(conv, graph, h, hist0):
    """The chunks' forward in order 0, 1, 2 as one dense function: chunk c's layer reads the rows of chunks
    ``< c`` and itself from ``h`` and the rows of chunks ``> c`` from ``hist0`` (history)."""
    outs = []
    for c in range(len(PTR) - 1):
        lo, hi = PTR[c], PTR[c + 1]
        x = torch.cat([h[:hi], hist0[hi:]])
        outs.append(conv(x, graph)[lo:hi])
    return torch.cat(outs)


def chunked_epoch(op, conv, h, backward_order, gout):
    """Forward chunks 0, 1, 2 with the op; back-propagate ``gout`` chunk by chunk in ``backward_order``;
    returns (outputs, input gradient assembled from the chunks' own gradients)."""
    outs, hs = [], []
    for c in range(len(PTR) - 1):
        hc = h[PTR[c]:PTR[c + 1]].detach().clone().requires_grad_()
        hs.append(hc)
        outs.append(op.train(hc, c, (PTR[c], PTR[c + 1]), True, layer_of(conv)))
    for c in backward_order:
        outs[c].backward(gout[PTR[c]:PTR[c + 1]])
    grads = [x.grad if x.grad is not None else torch.zeros_like(x) for x in hs]
    return torch.cat([o.detach() for o in outs]), torch.cat(grads)


def test_bipartite_rows_are_the_in_edges_with_local_sources(graph):
    ops = GraphOps(graph, N, torch.float64)
    halo, ei, w = ops.bipartite_rows("sum", 4, 7)
    src_global = torch.where(ei[0] < 3, ei[0] + 4, halo[(ei[0] - 3).clamp(min=0)])
    got = sorted(zip(src_global.tolist(), (ei[1] + 4).tolist()))
    want = sorted((int(s), int(d)) for s, d in graph.t() if 4 <= d < 7)
    assert got == want and bool((w == 1).all())
    assert not bool(((halo >= 4) & (halo < 7)).any())


def test_forward_reads_fresh_rows_and_history(graph, conv):
    """Chunk c's layer sees its own rows and those of chunks processed before it fresh, the rest from
    history (zeros in the first epoch)."""
    op = make_op(graph)
    h = torch.randn(N, D, dtype=torch.float64)
    out, _ = chunked_epoch(op, conv, h, [2, 1, 0], torch.zeros(N, 2 * 2, dtype=torch.float64))
    torch.testing.assert_close(out, dense_epoch(conv, graph, h, torch.zeros_like(h)))
    torch.testing.assert_close(op.history.H_in, h)


def test_reverse_backward_with_pushes_is_the_exact_gradient_of_the_chunked_forward(graph, conv):
    """Backward in the reverse of the forward order (gpipe): every chunk that read chunk d's fresh rows
    back-propagates before d and pushes into ``G_in[R_d]``, so the input gradient equals the dense one."""
    op = make_op(graph)
    h = torch.randn(N, D, dtype=torch.float64)
    gout = torch.randn(N, 4, dtype=torch.float64)
    _, grad = chunked_epoch(op, conv, h, [2, 1, 0], gout)
    hd = h.clone().requires_grad_()
    dense_epoch(conv, graph, hd, torch.zeros_like(h)).backward(gout)
    torch.testing.assert_close(grad, hd.grad)
    # without the pushes the cross-chunk part is lost: the check above can fail
    op2 = make_op(graph)
    op2.history.push = lambda *a: None
    _, lost = chunked_epoch(op2, conv, h, [2, 1, 0], gout)
    assert not torch.allclose(lost, hd.grad)


def test_gradcheck_against_dense_reference_including_pushes(graph, conv):
    """``torch.autograd.gradcheck`` (float64) of one epoch of the chunked forward. The op keeps state (its
    pushes), so every backward gradcheck asks for runs on a fresh op: the chunks' forward in order, then
    their backward in reverse order with the pushes; its result must be the numerical Jacobian's product."""
    conv.eval()

    class Epoch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h):
            ctx.save_for_backward(h)
            with torch.enable_grad():
                return chunked_epoch(make_op(graph), conv, h, [], None)[0]

        @staticmethod
        def backward(ctx, gout):
            (h,) = ctx.saved_tensors
            with torch.enable_grad():
                return chunked_epoch(make_op(graph), conv, h, [2, 1, 0], gout)[1]

    h = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(Epoch.apply(h),
                               dense_epoch(conv, graph, h.detach(), torch.zeros(N, D, dtype=torch.float64)))
    assert torch.autograd.gradcheck(Epoch.apply, (h,))


def test_second_epoch_reads_stale_pushes_and_replaces_them(graph, conv):
    """Epoch 2, backward in forward order 0, 1, 2: chunk d sees this epoch's pushes of the chunks before it
    and the last epoch's pushes of the rest; a chunk's new push replaces its old one."""
    op = make_op(graph)
    h1, h2 = torch.randn(N, D, dtype=torch.float64), torch.randn(N, D, dtype=torch.float64)
    g1, g2 = torch.randn(N, 4, dtype=torch.float64), torch.randn(N, 4, dtype=torch.float64)
    chunked_epoch(op, conv, h1, [2, 1, 0], g1)
    pushes1 = {c: p.clone() for c, (_, p) in op.history.pushes.items()}
    _, grad = chunked_epoch(op, conv, h2, [0, 1, 2], g2)
    pushes2 = {c: p for c, (_, p) in op.history.pushes.items()}
    # expected: own gradient + fresh pushes of chunks c < d + stale pushes of chunks c > d
    for d in range(3):
        lo, hi = PTR[d], PTR[d + 1]
        want = torch.zeros(hi - lo, D, dtype=torch.float64)
        for c in range(3):
            if c == d:
                continue
            halo, _ = op.history.pushes[c]
            p = pushes2[c] if c < d else pushes1[c]
            m = (halo >= lo) & (halo < hi)
            want.index_add_(0, halo[m] - lo, p[m])
        op_own = make_op(graph)  # the chunk's own gradient: same reads, no pushes received
        op_own.history.H_in = torch.cat([h2[:hi], h1[hi:]])  # history as chunk d's forward read it
        op_own.history.G_in = torch.zeros(N, D, dtype=torch.float64)
        hc = h2[lo:hi].clone().requires_grad_()
        op_own.train(hc, d, (lo, hi), False, layer_of(conv)).backward(g2[lo:hi])
        torch.testing.assert_close(grad[lo:hi], hc.grad + want)
    torch.testing.assert_close(op.history.G_in.sum(0), sum(p.sum(0) for p in pushes2.values()))


def test_t2_rule_on_pushes(graph, conv):
    """T2: a fresh push counts twice; at epoch end ``G_in`` and the stored pushes are cleared."""
    op = make_op(graph)
    h, g = torch.randn(N, D, dtype=torch.float64), torch.randn(N, 4, dtype=torch.float64)
    chunked_epoch(op, conv, h, [2], g)  # only chunk 2 back-propagates
    hist = op.history
    before = hist.G_in.clone()
    hist.scale_grad_rows(PTR[2], PTR[3], 2.0)
    torch.testing.assert_close(hist.G_in, 2 * before)
    hist.zero_grads()
    assert not hist.G_in.any() and not hist.pushes
