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

from .graph import spmm


class History:
    """The two full-graph buffers of one aggregation op (``H_in``, ``G_out``), allocated on first use.

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

    def ensure(self, dim: int) -> None:
        """Allocate zero buffers of width ``dim`` if not yet allocated."""
        if self.H_in is None:
            self.H_in = torch.zeros(self.num_nodes, dim, dtype=self.dtype, device=self.device)
            self.G_out = torch.zeros(self.num_nodes, dim, dtype=self.dtype, device=self.device)

    @property
    def nbytes(self) -> int:
        """Bytes held by both buffers."""
        if self.H_in is None:
            return 0
        return 2 * self.H_in.numel() * self.H_in.element_size()


class ChunkAggregate(torch.autograd.Function):
    """``out_c = Â[R_c, :] @ H_in`` after ``H_in[R_c] ← x_c``; backward is the pull ``Âᵀ[R_c, :] @ G_out``
    after ``G_out[R_c] ← g`` (DESIGN §5).

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
        hist.ensure(x_c.size(1))
        if write:
            hist.H_in[start:end] = x_c.detach()
        ctx.hist, ctx.at_c, ctx.start, ctx.end = hist, at_c, start, end
        return spmm(a_c, hist.H_in)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        hist = ctx.hist
        hist.G_out[ctx.start : ctx.end] = g
        return spmm(ctx.at_c, hist.G_out), None, None, None, None, None, None
