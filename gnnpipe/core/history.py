"""History buffers and the chunk aggregation op with a pull-based backward (DESIGN §5).

For aggregation op ``k`` on a stage, :class:`History` holds two full-graph buffers:

* ``H_in``  (``[N, d]``): the op's input rows; rows of chunks already processed at this stage in this
  epoch are fresh, the others hold older values (stale; zeros before first use);
* ``G_out`` (``[N, d]``): the gradient of the op's output rows, the same way.

:class:`ChunkAggregate` is the op itself: forward writes ``H_in[R_c] ← x_c`` and returns
``Â[R_c, :] @ H_in``; backward writes ``G_out[R_c] ← g`` and returns ``Âᵀ[R_c, :] @ G_out`` — the
*pull*: the gradient reaching chunk c's input is summed over all of its out-neighbours' output
gradients (fresh for chunks already back-propagated, stale/zero otherwise). Plain autograd through
``Â[R_c, :] @ H_in`` would drop every cross-chunk gradient.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .graph import CompactRows, spmm


class History:
    """The two full-graph buffers of one aggregation op (``H_in``, ``G_out``), allocated on first use.

    ``G_out`` is a view of the first ``N`` rows of an ``(N + 1)``-row buffer whose last row stays zero. While
    every change to ``G_out`` goes through :meth:`zero_grads`, :meth:`write_grad_rows` and
    :meth:`scale_grad_rows`, the history knows which rows are zero (e.g. after T2's epoch-end zeroing, the
    rows of chunks not back-propagated yet this epoch) and the pull reads the zero row in their place
    instead of fetching cold rows of zeros (:meth:`grad_source`). Any other in-place change of ``G_out``
    bumps its version counter, and the history then treats no row as known zero (exact either way).

    Args:
        num_nodes: ``N``. dtype: buffer dtype. name: label used in reports (e.g. ``"unit3.op0"``).
    """

    def __init__(self, num_nodes: int, dtype: torch.dtype = torch.float32, name: str = "",
                 device: torch.device | str = "cpu"):
        self.num_nodes = num_nodes
        self.dtype = dtype
        self.device = torch.device(device)
        self.name = name
        self.H_in: Optional[Tensor] = None
        self.G_out: Optional[Tensor] = None
        self._g_buf: Optional[Tensor] = None  # [N + 1, d]; G_out = _g_buf[:N]
        self._g_zero: Optional[Tensor] = None  # bool [N]: rows of G_out known to be zero
        self._g_known = -1  # G_out's version counter when _g_zero was last valid (-1: nothing known)

    def ensure(self, dim: int) -> None:
        """Allocate zero buffers of width ``dim`` if not yet allocated."""
        if self.H_in is None:
            self.H_in = torch.zeros(self.num_nodes, dim, dtype=self.dtype, device=self.device)
            self._g_buf = torch.zeros(self.num_nodes + 1, dim, dtype=self.dtype, device=self.device)
            self.G_out = self._g_buf[: self.num_nodes]
            self._g_zero = torch.zeros(self.num_nodes, dtype=torch.bool, device=self.device)
            self._g_known = -1

    @staticmethod
    def write_rows(buf: Tensor, start: int, rows: Tensor) -> None:
        """``buf[start:start + len(rows)] ← rows`` (in place, no autograd)."""
        buf[start : start + rows.size(0)] = rows

    # ------------------------------------------------------------------ G_out with known zero rows
    def _tracking(self) -> bool:
        g = self.G_out
        return g is not None and self._g_known == g._version and g.data_ptr() == self._g_buf.data_ptr()

    def zero_grads(self) -> None:
        """``G_out ← 0`` (e.g. T2 at the end of an epoch); every row is then known to be zero."""
        if self.G_out is None:
            return
        self.G_out.zero_()
        if self.G_out.data_ptr() == self._g_buf.data_ptr():
            self._g_zero.fill_(True)
            self._g_known = self.G_out._version

    def write_grad_rows(self, start: int, g: Tensor, scale: Optional[float] = None) -> None:
        """``G_out[start:start + len(g)] ← g`` (``scale · g`` with a scale; the chunk op's backward)."""
        tracking = self._tracking()
        if scale is None:
            self.write_rows(self.G_out, start, g)
        else:
            torch.mul(g, scale, out=self.G_out[start : start + g.size(0)])
        if tracking:
            self._g_zero[start : start + g.size(0)].fill_(False)
            self._g_known = self.G_out._version

    def scale_grad_rows(self, start: int, end: int, factor: float) -> None:
        """``G_out[start:end] *= factor`` (e.g. T2's doubling); known zero rows stay zero."""
        tracking = self._tracking()
        self.G_out[start:end].mul_(factor)  # not `G[a:b] *= f`: that also copies the rows onto themselves
        if tracking:
            self._g_known = self.G_out._version

    def grad_source(self) -> tuple[Tensor, Optional[Tensor]]:
        """What the pull reads: ``(G, zero)`` with ``G`` the ``[N + 1, d]`` buffer (row ``N`` is zero) and ``zero``
        the bool ``[N]`` mask of rows known to be zero, or ``(G_out, None)`` when nothing is known."""
        if self._tracking():
            return self._g_buf, self._g_zero
        return self.G_out, None

    @property
    def nbytes(self) -> int:
        """Bytes held by both buffers."""
        if self.H_in is None:
            return 0
        return self.H_in.numel() * self.H_in.element_size() + self._g_buf.numel() * self._g_buf.element_size()


class ChunkPushPull:
    """The chunk op of one aggregation op on one chunk, without autograd: the two halves of DESIGN §5 that
    :class:`ChunkAggregate` runs as its forward and backward, and that a model unit may call from its own
    fused ``autograd.Function`` (one autograd node per unit and chunk instead of one per elementary op).

    * :meth:`push`: ``H_in[R_c] ← x_c`` (``x_c = h ⊙ mask`` written straight into history, no separate copy),
      then ``Â[R_c, :] @ H_in``;
    * :meth:`pull`: ``G_out[R_c] ← scale · g`` (written straight into history), then ``Âᵀ[R_c, :] @ G_out``.

    Args:
        hist: the op's :class:`History`. a_c, at_c: rows ``R_c`` of ``Â`` and ``Âᵀ`` (CSR or
        :class:`~gnnpipe.core.graph.CompactRows`). start, end: ``R_c = [start, end)``.
        write: write history (``False`` when a chunk is recomputed in its backward).
    """

    __slots__ = ("hist", "a_c", "at_c", "start", "end", "write")

    def __init__(self, hist: History, a_c, at_c, start: int, end: int, write: bool = True):
        self.hist, self.a_c, self.at_c, self.start, self.end, self.write = hist, a_c, at_c, start, end, write

    def push(self, h: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """``Â[R_c, :] @ H_in`` after ``H_in[R_c] ← h`` (``h ⊙ mask`` with a mask); ``[|R_c|, d]`` → ``[|R_c|, d]``.
        Call without autograd (inside an ``autograd.Function``)."""
        hist = self.hist
        if hist.H_in is None:
            hist.ensure(h.size(1))
        if self.write:
            if mask is None:
                hist.write_rows(hist.H_in, self.start, h)
            else:
                torch.mul(h, mask, out=hist.H_in[self.start : self.end])
        return spmm(self.a_c, hist.H_in)

    def pull(self, g: Tensor, scale: Optional[float] = None) -> Tensor:
        """``Âᵀ[R_c, :] @ G_out`` after ``G_out[R_c] ← g`` (``scale · g`` with a scale); ``[|R_c|, d]`` → ``[|R_c|, d]``.
        Rows of ``G_out`` known to be zero are read from the zero row (:meth:`History.grad_source`)."""
        hist = self.hist
        hist.write_grad_rows(self.start, g, scale)
        src, zero = hist.grad_source()
        if zero is not None and isinstance(self.at_c, CompactRows):
            return self.at_c.mm(src, zero_rows=zero)
        return spmm(self.at_c, hist.G_out)


class ChunkAggregate(torch.autograd.Function):
    """``out_c = Â[R_c, :] @ H_in`` after ``H_in[R_c] ← x_c``; backward is the pull ``Âᵀ[R_c, :] @ G_out``
    after ``G_out[R_c] ← g`` (DESIGN §5). Both halves are :class:`ChunkPushPull`'.

    Args (to ``apply``):
        x_c: ``[|R_c|, d]`` input rows of chunk c (rows ``start:end`` of the relabelled graph).
        hist: the op's :class:`History`.
        a_c: ``[|R_c|, N]`` CSR rows of ``Â``. at_c: ``[|R_c|, N]`` CSR rows of ``Âᵀ``.
        start, end: ``R_c = [start, end)``.
        write: write ``x_c`` into ``H_in`` (``False`` when recomputing activations in the backward, so
            history is not changed twice).

    Returns:
        ``[|R_c|, d]``.
    """

    @staticmethod
    def forward(ctx, x_c: Tensor, hist: History, a_c: Tensor, at_c: Tensor, start: int, end: int,
                write: bool = True) -> Tensor:  # type: ignore[override]
        ctx.rows = ChunkPushPull(hist, a_c, at_c, start, end, write)
        return ctx.rows.push(x_c)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        return ctx.rows.pull(g), None, None, None, None, None, None
