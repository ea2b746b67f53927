"""Normalised adjacency matrices as CSR tensors, and the full-graph aggregation op.

An *aggregation op* is the sparse product ``Â[rows, :] @ H`` with ``Â`` of a registered
aggregation kind (:mod:`gnnpipe.tasks.nodes.kinds`, which also takes edge weights); the built-ins:

* ``gcn``  — ``D̃^{-1/2} Ã D̃^{-1/2}`` with ``Ã`` = ``A`` with exactly one self-loop of weight 1 per
  vertex and ``D̃`` the in-degree of ``Ã`` (Kipf & Welling, ICLR 2017, eq. 2). Existing self-loops are
  *replaced*, not doubled: only the missing loops are added (PyG's ``add_remaining_self_loops``), so
  ``Â`` equals PyG ``gcn_norm(edge_index, add_self_loops=True)`` — the normalisation of ``GCNConv`` and
  ``GCN2Conv`` — also for graphs that keep their self-loops (``--keep-self-loops``);
* ``mean`` — ``D^{-1} A`` (1 / in-degree; no self term is added, an existing self-loop counts as a
  neighbour like any other edge, as in PyG ``SAGEConv(aggr="mean")``; rows of isolated vertices are zero);
* ``sum``  — ``A``.

Duplicate edges are kept and counted (in ``A`` and in the degrees), as PyG does when it is given them.

Rows are *destinations*: for an edge ``j → i`` in ``edge_index`` (PyG's ``source_to_target``
flow, ``edge_index[0] = j``, ``edge_index[1] = i``) the entry ``Â[i, j]`` is non-zero. Every op
keeps the transpose ``Âᵀ`` too, because the backward of ``Â @ H`` is ``Âᵀ @ G``.
"""

from __future__ import annotations

import collections
import warnings

import torch
from torch import Tensor

from ...errors import ConfigError
from ...models.base import set_graph_ops_factory
from . import kinds

warnings.filterwarnings("ignore", message=r"Sparse CSR tensor support is in beta")
warnings.filterwarnings("ignore", message=r"Sparse invariant checks are implicitly disabled")


def normalised_edges(edge_index: Tensor, num_nodes: int, kind: str, dtype: torch.dtype = torch.float32,
                     edge_weight: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The non-zeros of ``Â`` of one aggregation kind as coordinates: ``(dst, src, value)`` (duplicates not yet
    summed; a kind may add entries, e.g. ``gcn``'s self-loops). Arguments and errors as :func:`build_adjacency`."""
    agg = kinds.get(kind)()
    src, dst = edge_index[0].long(), edge_index[1].long()
    if edge_weight is None:
        w = torch.ones(src.numel(), dtype=dtype)
    else:
        if edge_weight.dim() != 1 or edge_weight.numel() != src.numel():
            raise ConfigError(f"edge_weight must have one value per edge ([{src.numel()}]), got shape "
                              f"{list(edge_weight.shape)}; pass a 1-D edge_weight aligned with edge_index")
        w = edge_weight.detach().cpu().to(dtype)
    src, dst, w = agg.values(src, dst, w, num_nodes)
    return dst, src, w.to(dtype)


def csr_blocks(row: Tensor, col: Tensor, val: Tensor, num_nodes: int,
               ranges: list[tuple[int, int]]) -> list[Tensor]:
    """Row blocks of the ``N × N`` matrix given by coordinates, each built alone, never the whole matrix.

    Args:
        row, col: ``LongTensor[nnz]`` coordinates (duplicates are summed, as ``coalesce`` does). val: ``[nnz]``.
        num_nodes: ``N``. ranges: ``[(lo, hi), …]`` row ranges.

    Returns:
        One ``(hi - lo) × N`` CSR tensor per range, columns ascending within each row (the layout of
        ``coalesce().to_sparse_csr()``, hence the same floating-point row sums as the whole matrix).
    """
    N = int(num_nodes)
    inside = torch.zeros(N, dtype=torch.bool)
    for lo, hi in ranges:
        inside[lo:hi] = True
    sel = inside[row]
    key = row[sel] * N + col[sel]
    v = val[sel]
    del sel
    key, perm = torch.sort(key)
    v = v[perm]
    del perm
    key, inv = torch.unique_consecutive(key, return_inverse=True)
    vals = torch.zeros(key.numel(), dtype=val.dtype).index_add_(0, inv, v)
    del inv, v
    r, c = key // N, key % N
    del key
    crow = torch.zeros(N + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(r, minlength=N), 0, out=crow[1:])
    out = []
    for lo, hi in ranges:
        a, b = int(crow[lo]), int(crow[hi])
        out.append(torch.sparse_csr_tensor(crow[lo:hi + 1] - a, c[a:b].clone(), vals[a:b].clone(), (hi - lo, N),
                                           dtype=val.dtype))
    return out


def build_adjacency(edge_index: Tensor, num_nodes: int, kind: str, dtype: torch.dtype = torch.float32,
                    edge_weight: Tensor | None = None) -> Tensor:
    """Build the normalised adjacency ``Â`` of one aggregation kind as a sparse CSR tensor.

    Args:
        edge_index: ``LongTensor[2, E]`` of directed edges ``source → target`` (duplicates are summed;
            for ``gcn`` existing self-loops are replaced by one loop of weight 1 per vertex).
        num_nodes: ``N``.
        kind: a registered aggregation kind (:mod:`gnnpipe.tasks.nodes.kinds`: ``"gcn"``, ``"mean"``, ``"sum"``, …).
        dtype: floating dtype of the values.
        edge_weight: optional ``[E]`` edge weights (default: every edge weighs 1).

    Returns:
        ``N × N`` sparse CSR tensor, rows = destinations.

    Raises:
        UnknownComponentError: unknown ``kind`` (lists the registered ones).
        ConfigError: ``edge_weight`` not of shape ``[E]``.
    """
    dst, src, w = normalised_edges(edge_index, num_nodes, kind, dtype, edge_weight)
    coo = torch.sparse_coo_tensor(torch.stack([dst, src]), w, (num_nodes, num_nodes),
                                  check_invariants=False).coalesce()
    del dst, src, w
    return own_csr(coo.to_sparse_csr())


def own_csr(a: Tensor) -> Tensor:
    """``a`` (CSR) as a CSR tensor that holds only its own row pointers, columns and values.

    ``to_sparse_csr()`` of a COO tensor returns columns that alias the COO tensor's ``[2, nnz]`` 64-bit indices,
    and the accessors of a CSR tensor return aliases that keep the whole tensor alive: measured, ``Â`` and ``Âᵀ``
    built through COO held 20 bytes per non-zero each instead of 12. Copies the three arrays."""
    if a.layout != torch.sparse_csr:
        return a
    return torch.sparse_csr_tensor(a.crow_indices().clone(), a.col_indices().clone(), a.values().clone(), a.shape,
                                   dtype=a.dtype, device=a.device)


def same_csr(a: Tensor, b: Tensor) -> bool:
    """Whether two CSR tensors are equal bit for bit (shape, row pointers, columns, values)."""
    return (a.shape == b.shape and a.crow_indices().dtype == b.crow_indices().dtype
            and torch.equal(a.crow_indices(), b.crow_indices()) and torch.equal(a.col_indices(), b.col_indices())
            and torch.equal(a.values(), b.values()))


def csr_transpose(a: Tensor) -> Tensor:
    """Transpose of a CSR tensor, as CSR (holding only its own arrays, :func:`own_csr`)."""
    return own_csr(a.t().to_sparse_coo().coalesce().to_sparse_csr()) if a.layout == torch.sparse_csr else a.t()


def csr_row_slice(a: Tensor, start: int, end: int) -> Tensor:
    """Rows ``[start, end)`` of a CSR tensor as a new ``(end-start) × ncols`` CSR tensor (no copy of the pattern beyond
    the slice)."""
    crow = a.crow_indices()
    lo, hi = int(crow[start]), int(crow[end])
    new_crow = crow[start : end + 1] - lo
    return torch.sparse_csr_tensor(
        new_crow, a.col_indices()[lo:hi], a.values()[lo:hi], (end - start, a.size(1)), dtype=a.dtype
    )


def csr_rows(a: Tensor, rows: Tensor) -> Tensor:
    """Arbitrary rows (``LongTensor[r]``) of a CSR tensor as a new ``r × ncols`` CSR tensor."""
    crow = a.crow_indices()
    starts, ends = crow[rows], crow[rows + 1]
    counts = ends - starts
    new_crow = torch.zeros(rows.numel() + 1, dtype=crow.dtype)
    torch.cumsum(counts, 0, out=new_crow[1:])
    idx = torch.repeat_interleave(starts - new_crow[:-1], counts) + torch.arange(int(new_crow[-1]), dtype=crow.dtype)
    return torch.sparse_csr_tensor(new_crow, a.col_indices()[idx], a.values()[idx], (rows.numel(), a.size(1)),
                                   dtype=a.dtype)


def _bag_mm(crow: Tensor, col: Tensor, values: Tensor, h: Tensor) -> Tensor:
    """:func:`csr_mm`'s fused CPU product, without its checks (``col`` non-empty, ``h`` on the CPU in the dtype of
    ``values``, ``crow`` and ``col`` of one integer dtype)."""
    # torch.embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode (0: sum), sparse,
    # per_sample_weights, include_last_offset, padding_idx): F.embedding_bag without its Python checks
    return torch.embedding_bag(h if h.is_contiguous() else h.contiguous(), col, crow, False, 0, False, values,
                               True, None)[0]


def csr_mm(crow: Tensor, col: Tensor, values: Tensor, h: Tensor) -> Tensor:
    """``A @ h`` for the CSR matrix ``(crow, col, values)`` (``r + 1``, ``nnz``, ``nnz``; ``col`` indexing rows of
    ``h``) and a dense ``h`` (``[n, d]`` → ``[r, d]``, dtype of ``values``), without autograd through ``A``.

    On CPU, when ``h`` has the dtype of ``values``, this is one fused gather-and-multiply: PyTorch's
    ``embedding_bag`` in ``sum`` mode with the non-zeros as ``per_sample_weights`` (row ``i`` of the result is
    ``Σ_j values[j] · h[col[j]]`` over ``j ∈ [crow[i], crow[i+1])``, in that order). Its CPU kernel (FBGEMM)
    fetches the referenced rows of ``h`` with prefetching, so it neither copies them into a compact block first
    nor stalls on cold, scattered rows the way the CSR product does (faster than both the CSR product and the
    gather + compacted product, for the whole graph and per chunk op: docs/RESULTS.md §11c). Elsewhere (CUDA, or
    ``h`` stored in another dtype) it is ``torch.mm`` on the CSR tensor (after an up-cast of ``h``)."""
    r = crow.numel() - 1
    if col.numel() == 0 or h.size(1) == 0:
        return torch.zeros(r, h.size(1), dtype=values.dtype, device=h.device)
    if h.device.type == "cpu" and h.dtype == values.dtype:
        return _bag_mm(crow, col, values, h)
    if h.dtype != values.dtype:  # rows stored narrower (--history-dtype): up-cast when read
        h = h.to(values.dtype)
    a = torch.sparse_csr_tensor(crow, col, values, (r, h.size(0)), device=h.device)
    return torch.mm(a, h)


#: how many :class:`CompactRows` keep the columns of :meth:`CompactRows.redirected_col` at a time (the rows a
#: stage's chunk actions use one after another: a chunk's forward and backward, with room for 1F1B's interleaving)
REDIRECTED_CACHED = 4
_REDIRECTED: collections.deque[CompactRows] = collections.deque()


class CompactRows:
    """Some rows ``R`` of a CSR matrix, as the chunk aggregation op multiplies with them.

    ``Â[R, :] @ H`` is one fused gather-and-multiply over the rows of ``H`` the non-zeros reference
    (:func:`csr_mm`; on CPU ``embedding_bag``): no copy of those rows, no scattered reads of cold history rows
    inside a CSR kernel. Off the CPU (or for a history stored in another dtype) the referenced rows are
    gathered (``index_select``) into a compact block and multiplied by the rows with columns renumbered to that
    block (``local``, built on first use): ``Â[R, :] @ H = local @ H[cols]``.

    Indices are 32-bit when they fit (half the index memory of a rank's rows of ``Â``; same products). Nothing of
    the CSR tensor it was built from stays referenced: ``values()`` of a sparse CSR tensor is an alias that keeps
    the whole tensor, its 64-bit indices included, alive (measured: a block of ``nnz`` entries then holds
    ``nnz·(8 + 4)`` more bytes), so the values are copied.

    Args:
        rows: ``r × N`` CSR tensor (e.g. :func:`csr_row_slice` of ``Â``).
    """

    def __init__(self, rows: Tensor):
        nnz = int(rows.crow_indices()[-1]) if rows.size(0) else 0
        idx = torch.int32 if max(rows.size(1), nnz) < 2**31 - 1 else torch.int64
        self.crow = rows.crow_indices().to(idx)
        self.col = rows.col_indices().to(idx)
        self.values = rows.values().clone()
        self.shape = rows.shape
        self._empty = self.col.numel() == 0
        self._compact = None
        self._redirected = None  # (known, renumbered columns) of redirected_col

    def same_as(self, other: CompactRows) -> bool:
        """Whether ``other`` holds bit for bit the same rows (shape, row pointers, columns and values)."""
        return (tuple(self.shape) == tuple(other.shape) and self.crow.dtype == other.crow.dtype
                and torch.equal(self.crow, other.crow) and torch.equal(self.col, other.col)
                and torch.equal(self.values, other.values))

    @property
    def nbytes(self) -> int:
        """Bytes of its row pointers, columns and values (the compacted copy of the fallback path not counted)."""
        return sum(t.numel() * t.element_size() for t in (self.crow, self.col, self.values))

    def _compacted(self) -> tuple[Tensor, Tensor]:
        if self._compact is None:
            cols, local_col = torch.unique(self.col, sorted=True, return_inverse=True)
            local = torch.sparse_csr_tensor(self.crow, local_col.to(self.col.dtype), self.values,
                                            (self.shape[0], cols.numel()), dtype=self.values.dtype,
                                            device=self.values.device)
            self._compact = (cols.to(self.col.dtype), local)
        return self._compact

    @property
    def cols(self) -> Tensor:
        """The distinct columns the rows reference (sorted; ``[k]``): the rows of ``H`` a product reads."""
        return self._compacted()[0]

    @property
    def local(self) -> Tensor:
        """The ``r × k`` CSR rows with columns renumbered to :attr:`cols` (same values, same order per row)."""
        return self._compacted()[1]

    def redirected_col(self, redirect: Tensor, known: frozenset) -> Tensor:
        """The columns renumbered through a redirect table (``redirect[col]``: a column known zero becomes ``N``, the
        buffer's zero row). ``known`` names the table's state (the blocks of rows read in place,
        :attr:`gnnpipe.tasks.nodes.history.History.grads_in_place` or ``inputs_in_place``): the columns are renumbered
        once per state and reused by every op of the stage in that state — their histories are written chunk by chunk
        alike, so a chunk's backward through a stage's ``k`` ops renumbers once instead of ``k`` times.
        At most :data:`REDIRECTED_CACHED` blocks of rows keep theirs at a time (4 bytes per non-zero each)."""
        kept = self._redirected
        if kept is not None:
            if kept[0] == known:
                return kept[1]
            _REDIRECTED.remove(self)  # built for another state: this block of rows moves to the newest end
        col = redirect.index_select(0, self.col)
        if col.dtype != self.col.dtype:
            col = col.to(self.col.dtype)
        self._redirected = (known, col)
        _REDIRECTED.append(self)
        while len(_REDIRECTED) > REDIRECTED_CACHED:
            _REDIRECTED.popleft()._redirected = None
        return col

    def mm(self, h: Tensor, redirect: Tensor | None = None, known: frozenset | None = None) -> Tensor:
        """``Â[R, :] @ h`` for a dense ``h`` of ``N`` rows (``[N, d]`` → ``[r, d]``, in the dtype of ``Â``; rows of
        ``h`` of another floating dtype, e.g. a bfloat16 history (``--history-dtype``), are up-cast when read).

        With ``redirect`` (integer ``[N]``: ``redirect[v]`` is ``v``, or ``N`` for a row of ``h`` known to be zero;
        what :meth:`~gnnpipe.tasks.nodes.history.History.pull_source` keeps) ``h`` must have ``N + 1`` rows, the last
        one zero: known zero rows are read from there (one hot row) instead of where they lie, the columns renumbered
        in one gather. The result is the same, bit for bit.

        With ``known`` too (the state the redirect table is in:
        :attr:`gnnpipe.tasks.nodes.history.History.grads_in_place`), the renumbered columns are those of an earlier call
        in the same state (:meth:`redirected_col`)."""
        if self._empty or h.size(1) == 0:
            return h.new_zeros(self.shape[0], h.size(1), dtype=self.values.dtype)
        if h.device.type == "cpu" and h.dtype == self.values.dtype:
            col = self.col
            if redirect is not None and known is not None:
                return _bag_mm(self.crow, self.redirected_col(redirect, known), self.values, h)
            if redirect is not None:
                col = redirect.index_select(0, col)
                if col.dtype != self.col.dtype:
                    col = col.to(self.col.dtype)
            return _bag_mm(self.crow, col, self.values, h)
        cols, local = self._compacted()
        idx = cols
        if redirect is not None:
            idx = redirect.index_select(0, idx)
        rows = h.index_select(0, idx)
        if rows.dtype != local.dtype:  # rows stored narrower (--history-dtype): up-cast after the gather
            rows = rows.to(local.dtype)
        return torch.mm(local, rows)


def spmm(a: Tensor | CompactRows, h: Tensor) -> Tensor:
    """``a @ h`` for a CSR ``a`` (or :class:`CompactRows`) and a dense ``h`` (no autograd through ``a``;
    :func:`csr_mm`)."""
    if isinstance(a, CompactRows):
        return a.mm(h)
    if h.numel() == 0:
        return h.new_zeros(a.size(0), h.size(1), dtype=a.dtype)
    if h.device.type == "cpu" and h.dtype == a.dtype:
        return csr_mm(a.crow_indices(), a.col_indices(), a.values(), h)
    # torch.mm: one ATen call (torch.sparse.mm adds a zero-filled output and an addmm); same kernel, same sums
    return torch.mm(a, h)


class _SpMM(torch.autograd.Function):
    """``Â @ H`` with backward ``Âᵀ @ G`` (exact, full graph)."""

    @staticmethod
    def forward(ctx, h: Tensor, a: Tensor, at: Tensor) -> Tensor:  # type: ignore[override]
        ctx.at = at
        return spmm(a, h)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        return spmm(ctx.at, g.contiguous()), None, None


class GraphOps:
    """The adjacency matrices of one graph, built lazily once per aggregation kind.

    Args:
        edge_index: ``LongTensor[2, E]`` (already preprocessed; see :func:`gnnpipe.data.prepare`).
        num_nodes: ``N``.
        dtype: dtype of ``Â``'s values; must match the embeddings' dtype.
        device: where ``Â`` lives (built on the CPU, then moved).
        edge_weight: optional ``[E]`` weights of the edges (e.g. ``data.edge_weight``), used by every kind.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", edge_weight: Tensor | None = None):
        self.edge_index = edge_index
        self.edge_weight = edge_weight
        self.num_nodes = int(num_nodes)
        self.dtype = dtype
        self.device = torch.device(device)
        self._adj: dict[str, tuple[Tensor, Tensor]] = {}

    def adj(self, kind: str) -> tuple[Tensor, Tensor]:
        """``(Â, Âᵀ)`` of ``kind`` as CSR tensors (cached). When ``Âᵀ`` equals ``Â`` bit for bit (a symmetric ``Â``,
        e.g. ``gcn`` of an undirected graph without edge weights) both are the same tensor: same products, half
        the memory."""
        if kind not in self._adj:
            a = build_adjacency(self.edge_index.cpu(), self.num_nodes, kind, self.dtype, self.edge_weight)
            at = csr_transpose(a)
            if same_csr(a, at):
                at = a
            a = a.to(self.device)
            self._adj[kind] = (a, a if at is a else at.to(self.device))
        return self._adj[kind]

    def to(self, dtype: torch.dtype) -> GraphOps:
        """A copy of these ops with values of ``dtype``."""
        return GraphOps(self.edge_index, self.num_nodes, dtype, self.device, self.edge_weight)

    def rows(self, kind: str, ranges: list[tuple[int, int]], transpose: bool = False) -> list[Tensor]:
        """Row blocks ``[lo, hi)`` of ``Â`` (``transpose``: of ``Âᵀ``) of ``kind`` as CSR tensors on the device,
        built directly from the edge list: neither matrix is ever built whole (lean ranks)."""
        dst, src, w = normalised_edges(self.edge_index.cpu(), self.num_nodes, kind, self.dtype, self.edge_weight)
        row, col = (src, dst) if transpose else (dst, src)
        return [b.to(self.device) for b in csr_blocks(row, col, w, self.num_nodes, ranges)]

    def chunk_rows_many(self, kind: str, ranges: list[tuple[int, int]]) -> list[tuple[CompactRows, CompactRows]]:
        """For each row range ``(lo, hi)``: rows ``[lo, hi)`` of ``Â`` and of ``Âᵀ`` of ``kind`` as
        :class:`CompactRows` (what the chunk aggregation op multiplies with), built from the edge list.

        One range at a time, each compacted (32-bit indices) before the next is built: the transient is the
        normalised edge list plus one chunk's rows, not every chunk's rows with 64-bit indices at once (a
        pipeline rank runs every chunk). Where the rows of ``Âᵀ`` equal those of ``Â`` bit for bit (a
        symmetric ``Â``: ``gcn`` and ``sum`` of an undirected graph without edge weights, whose entries
        ``w·d_i^{-1/2}·d_j^{-1/2}`` are the same products either way round), the pair holds one object twice:
        the same products, half the memory."""
        dst, src, w = normalised_edges(self.edge_index.cpu(), self.num_nodes, kind, self.dtype, self.edge_weight)
        out = []
        for r in ranges:
            a = CompactRows(csr_blocks(dst, src, w, self.num_nodes, [r])[0].to(self.device))
            at = CompactRows(csr_blocks(src, dst, w, self.num_nodes, [r])[0].to(self.device))
            out.append((a, a if a.same_as(at) else at))
            del a, at
        return out

    def chunk_rows(self, kind: str, start: int, end: int) -> tuple[CompactRows, CompactRows]:
        """Rows ``[start, end)`` of ``Â`` and of ``Âᵀ`` of ``kind`` (:meth:`chunk_rows_many` of one range)."""
        return self.chunk_rows_many(kind, [(start, end)])[0]

    def edges(self, kind: str) -> tuple[Tensor, Tensor]:
        """The non-zeros of ``Â`` of ``kind`` as PyG edges: ``(edge_index [2, E'], edge_weight [E'])`` with
        ``edge_index[0]`` the sources (columns of ``Â``), sorted by destination (cached)."""
        key = ("edges", kind)
        if key not in self._adj:
            a, _ = self.adj(kind)
            crow = a.crow_indices()
            dst = torch.repeat_interleave(torch.arange(self.num_nodes, device=crow.device), crow.diff())
            self._adj[key] = (torch.stack([a.col_indices(), dst]), a.values())
        return self._adj[key]

    def bipartite_rows_many(self, kind: str, ranges: list[tuple[int, int]]) -> list[tuple[Tensor, Tensor, Tensor]]:
        """:meth:`bipartite_rows` of each row range ``(start, end)``, built from the edge list (only those rows of
        ``Â``: a lean rank never builds the whole matrix)."""
        out = []
        for (start, end), a in zip(ranges, self.rows(kind, ranges)):
            n = end - start
            crow, col = a.crow_indices(), a.col_indices()
            dst = torch.repeat_interleave(torch.arange(n, device=crow.device), crow.diff())
            own = (col >= start) & (col < end)
            halo = torch.unique(col[~own])
            src = torch.where(own, col - start, n + torch.searchsorted(halo, col))
            out.append((halo, torch.stack([src, dst]), a.values()))
        return out

    def bipartite_rows(self, kind: str, start: int, end: int) -> tuple[Tensor, Tensor, Tensor]:
        """The in-edges of rows ``[start, end)`` in bipartite form (what a halo-gradient op runs a layer on),
        built from the edge list (:meth:`bipartite_rows_many` of one range).

        Returns:
            ``(halo, edge_index, edge_weight)``: ``halo`` ``LongTensor[h]``, the sorted global ids of the
            sources outside ``[start, end)``; ``edge_index`` ``[2, E_c]`` with local sources (``0 … n−1``
            the rows themselves, ``n + t`` the halo row ``halo[t]``; ``n = end − start``) and local
            destinations ``0 … n−1``; ``edge_weight`` ``[E_c]`` the values of ``Â[start:end, :]``.
        """
        return self.bipartite_rows_many(kind, [(start, end)])[0]

    def aggregate(self, h: Tensor, kind: str, layer=None) -> Tensor:
        """Exact full-graph aggregation, differentiable in ``h``: ``Â @ h`` (``h``: ``[N, d]`` → ``[N, d]``),
        or with a message-passing ``layer`` (:class:`gnnpipe.models.MessagePassingUnit`)
        ``layer(h, h, edge_index, edge_weight)`` on the edges of ``Â`` (``[N, d_out]``)."""
        if layer is not None:
            edge_index, weight = self.edges(kind)
            return layer(h, h, edge_index, weight)
        a, at = self.adj(kind)
        return _SpMM.apply(h, a, at)

    def aggregator(self):
        """A callback ``agg(h, kind, layer=None)`` for :meth:`gnnpipe.models.LayerUnit.forward` on the whole graph."""
        return self.aggregate


def _install() -> None:
    set_graph_ops_factory(GraphOps)  # model(x, edge_index) builds these ops (gnnpipe.models.base)


_install()
