"""The sparse product every aggregation runs through (gnnpipe.tasks.nodes.graph.csr_mm): on CPU the fused
gather-and-multiply (embedding_bag), elsewhere the CSR product; both give Â @ H (issue #18)."""

import pytest
import torch

from gnnpipe.tasks.nodes.graph import CompactRows, GraphOps, build_adjacency, csr_mm, csr_row_slice, spmm

N = 30


def _adj(dtype, seed=0, n=N, e=150):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    ei = torch.cat([ei, ei.flip(0)], 1).unique(dim=1)
    return build_adjacency(ei, n, "gcn", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("idx", [torch.int32, torch.int64])
def test_csr_mm_equals_the_dense_product(dtype, idx):
    a = _adj(dtype)
    h = torch.randn(N, 7, dtype=dtype)
    got = csr_mm(a.crow_indices().to(idx), a.col_indices().to(idx), a.values(), h)
    assert got.dtype == dtype and got.shape == (N, 7)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, a.to_dense() @ h, rtol=tol, atol=tol)
    torch.testing.assert_close(spmm(a, h), torch.sparse.mm(a, h), rtol=tol, atol=tol)


def test_csr_mm_takes_non_contiguous_rows_and_empty_inputs():
    a = _adj(torch.float32)
    h = torch.randn(7, N).t()  # a transposed view
    assert not h.is_contiguous()
    torch.testing.assert_close(spmm(a, h), a.to_dense() @ h)
    assert torch.equal(spmm(a, torch.randn(N, 0)), torch.zeros(N, 0))
    empty = csr_row_slice(build_adjacency(torch.tensor([[0, 1], [1, 0]]), 4, "mean"), 2, 4)  # no non-zeros
    assert torch.equal(CompactRows(empty).mm(torch.randn(4, 3)), torch.zeros(2, 3))


@pytest.mark.parametrize("lo,hi", [(0, 10), (10, 23), (23, 30)])
def test_compact_rows_fused_and_gathered_paths_agree(lo, hi):
    """The fused path (CPU, same dtype) and the gather + compacted product (what CUDA and a narrower history
    take) compute the same rows; a history stored in bfloat16 is up-cast when read."""
    a = _adj(torch.float32, seed=1)
    rows = CompactRows(csr_row_slice(a, lo, hi))
    assert rows.col.dtype == torch.int32 and rows.crow.dtype == torch.int32
    h = torch.randn(N, 5)
    fused = rows.mm(h)
    gathered = torch.mm(rows.local, h.index_select(0, rows.cols))
    torch.testing.assert_close(fused, gathered, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fused, (a.to_dense() @ h)[lo:hi], rtol=1e-6, atol=1e-6)
    hb = h.to(torch.bfloat16)
    torch.testing.assert_close(rows.mm(hb), (a.to_dense() @ hb.float())[lo:hi], rtol=1e-6, atol=1e-6)


def test_known_zero_rows_are_read_from_the_zero_row_bit_for_bit():
    a = _adj(torch.float32, seed=2)
    rows = CompactRows(csr_row_slice(a, 5, 20))
    g = torch.randn(N + 1, 4)
    zero = torch.zeros(N, dtype=torch.bool)
    zero[::3] = True
    g[:N][zero] = 0.0
    g[N] = 0.0
    plain = rows.mm(g[:N].contiguous())
    g_stale = g.clone()
    g_stale[:N][zero] = 123.0  # what lies there is never read: those rows are known to be zero
    redirect = torch.where(zero, N, torch.arange(N))  # what History.pull_source keeps
    assert torch.equal(rows.mm(g_stale, redirect=redirect), plain)


def test_whole_graph_aggregation_gradient_is_the_transposed_product():
    a = _adj(torch.float64, seed=3)
    ei = a.to_sparse_coo().indices().flip(0)  # rows are destinations: edge j → i for Â[i, j]
    ops = GraphOps(ei, N, dtype=torch.float64)
    h = torch.randn(N, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: ops.aggregate(x, "sum"), (h,))
