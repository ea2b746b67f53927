"""Differentiable collectives of graph parallelism, each differentiable twice.

Convention (Sriram et al., ICLR 2022, arXiv 2203.09697): each rank's autograd graph covers
only the work it owns, and a parameter's full gradient is the sum of the ranks' partial gradients. A tensor is
*owned* (rows of one rank, full gradient there), *partial* (a rank's contribution to a sum) or *replicated*
(the same rows on every rank, each rank's gradient a partial one). The ops and their adjoints:

==================  =============================================  ===================================================
op                  forward                                        backward
==================  =============================================  ===================================================
:func:`split`       owned rows of a replicated tensor (a slice)    own gradient rows, zero elsewhere; no communication
:func:`gather`      owned rows → all rows (all-gather)             **reduce-scatter**: summed over ranks, own rows kept
:func:`reduce_scatter` partial sums → owned rows                   all-gather
:func:`all_reduce`  partial → total (partial energies, forces)     identity
:func:`halo_exchange` owned rows → the rows this rank reads        the gradient rows go back to their owners, summed
:func:`halo_reduce` rows read here → added onto their owners       halo exchange
==================  =============================================  ===================================================

Every backward is written with these same autograd functions (the backward of a gather *is* a reduce-scatter
node), so a backward of a backward (conservative-force training: ``F = −∂E/∂pos`` inside the loss) is exact.
A gather whose backward keeps only the local slice of the gradient (the Megatron rule for replicated
downstream compute) drops the terms other ranks' triplets contributed; the tests pin that it fails.

Row counts may differ per rank and be zero; every rank knows them all (from the plan), takes part in every
collective, and never waits for a size. Transport: all-gather of blocks padded to the largest count; on
nccl a padded ``reduce_scatter_tensor``, on gloo (which has none) an all-reduce of the whole buffer and a
slice; halo rows by ``all_to_all`` on nccl and by batched point-to-point on gloo (whose ``all_to_all`` needs
equal blocks). Bytes are counted through :class:`~gnnpipe.core.comm.Comm` under the kind ``"gp"``; the
``*_bytes`` functions give each op's count per rank (measured == formula, in the tests).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ...core.comm import Comm

__all__ = [
    "GPGroup",
    "all_reduce",
    "all_reduce_bytes",
    "gather",
    "gather_bytes",
    "halo_exchange",
    "halo_exchange_bytes",
    "halo_reduce",
    "halo_reduce_bytes",
    "reduce_scatter",
    "reduce_scatter_bytes",
    "split",
]

#: the byte-accounting kind of every op here (:data:`gnnpipe.core.comm.KINDS`)
KIND = "gp"
#: point-to-point tag of halo messages on gloo
HALO_TAG = 0x4750


class GPGroup:
    """The process group a graph-parallel collective runs over, with its byte-counting wrapper.

    Args:
        group: a ``torch.distributed`` process group (``None``: the default group). Needs an initialised
            process group unless it has one rank.
        comm: the :class:`~gnnpipe.core.comm.Comm` that counts bytes (kind ``"gp"``) and moves the tensors;
            default a new CPU one. For CUDA tensors pass ``Comm("cuda")`` (it stages them through host memory
            under gloo, which refuses CUDA tensors).

    Attributes:
        rank: this process's rank in ``group``. size: ``G``. backend: ``"gloo"`` or ``"nccl"`` (``"local"``
            without a process group). global_ranks: the global rank of every group rank.
    """

    def __init__(self, group=None, comm: Comm | None = None):
        self.group = group
        if dist.is_available() and dist.is_initialized():
            self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
            self.backend = str(dist.get_backend(group))
            self.global_ranks = ([dist.get_global_rank(group, r) for r in range(self.size)]
                                 if group is not None else list(range(self.size)))
        else:
            self.rank, self.size, self.backend, self.global_ranks = 0, 1, "local", [0]
        self.comm = comm if comm is not None else Comm("cpu", stage=False)

    def __repr__(self) -> str:
        return f"GPGroup(rank={self.rank}, size={self.size}, backend={self.backend!r})"


def _counts(counts: Sequence[int], gp: GPGroup, what: str) -> list[int]:
    counts = [int(c) for c in counts]
    if len(counts) != gp.size or any(c < 0 for c in counts):
        raise ValueError(f"{what}: need one non-negative row count per rank of the group ({gp.size}); got {counts}")
    return counts


def _check_rows(x: Tensor, rows: int, what: str) -> None:
    if x.dim() < 1 or x.size(0) != rows:
        raise ValueError(f"{what}: this rank's input has {x.size(0) if x.dim() else 'no'} rows; the plan says {rows} "
                         "(build the plan and the local graph from the same batch on every rank)")


# ---------------------------------------------------------------------------------------------- byte formulas
def gather_bytes(counts: Sequence[int], row_numel: int, element_size: int) -> float:
    """Bytes a rank sends in :func:`gather` (and in :func:`reduce_scatter`'s backward): blocks padded to
    ``m = max(counts)`` rows, ring all-gather: ``(G − 1) · m · row_numel · element_size``; 0 when ``G = 1`` or
    ``m = 0``."""
    g, m = len(counts), max(counts, default=0)
    if g <= 1 or m == 0:
        return 0.0
    return float((g - 1) * (m * row_numel) * element_size)


def reduce_scatter_bytes(counts: Sequence[int], row_numel: int, element_size: int, backend: str = "gloo") -> float:
    """Bytes a rank sends in :func:`reduce_scatter` (and in :func:`gather`'s backward).

    nccl: ``reduce_scatter_tensor`` of blocks padded to ``m = max(counts)`` rows, ``(G − 1) · m · row_numel ·
    element_size``. gloo: ring all-reduce of the ``R = Σ counts`` rows, ``2 · (G − 1) · R · row_numel ·
    element_size / G``. 0 when ``G = 1`` or nothing to reduce.
    """
    g, m, total = len(counts), max(counts, default=0), sum(counts)
    if g <= 1 or m == 0:
        return 0.0
    if backend == "nccl":
        return float((g - 1) * (m * row_numel) * element_size)
    return 2.0 * (g - 1) * (total * row_numel) * element_size / g


def all_reduce_bytes(numel: int, element_size: int, group_size: int) -> float:
    """Bytes a rank sends in :func:`all_reduce`: ring all-reduce, ``2 · (G − 1) · numel · element_size / G``."""
    if group_size <= 1:
        return 0.0
    return 2.0 * (group_size - 1) * numel * element_size / group_size


def halo_exchange_bytes(send_rows: Sequence[int], row_numel: int, element_size: int) -> float:
    """Bytes a rank sends in :func:`halo_exchange`: the rows others read from it, ``Σ_q send_rows[q] · row_numel ·
    element_size`` (no padding). Its :func:`halo_reduce` (the backward) sends ``Σ_s recv_rows[s]`` rows."""
    return float(sum(int(c) for c in send_rows) * row_numel * element_size)


def halo_reduce_bytes(recv_rows: Sequence[int], row_numel: int, element_size: int) -> float:
    """Bytes a rank sends in :func:`halo_reduce`: the rows it read go back, ``Σ_s recv_rows[s] · row_numel ·
    element_size``."""
    return float(sum(int(c) for c in recv_rows) * row_numel * element_size)


# ---------------------------------------------------------------------------------------------- raw transport
def _raw_gather(x: Tensor, gp: GPGroup, counts: list[int]) -> Tensor:
    m = max(counts)
    rest = tuple(x.shape[1:])
    if m == 0:
        return x.new_zeros((0, *rest))
    block = x.new_zeros((m, *rest))
    block[: x.size(0)] = x
    outs = [torch.empty_like(block) for _ in range(gp.size)]
    gp.comm.all_gather(outs, block, group=gp.group, kind=KIND)
    return torch.cat([o[:c] for o, c in zip(outs, counts)])


def _raw_reduce_scatter(x: Tensor, gp: GPGroup, counts: list[int]) -> Tensor:
    m = max(counts)
    rest = tuple(x.shape[1:])
    off = sum(counts[: gp.rank])
    mine = counts[gp.rank]
    if m == 0:
        return x.new_zeros((0, *rest))
    if gp.backend == "nccl":
        buf = x.new_zeros((gp.size * m, *rest))
        start = 0
        for s, c in enumerate(counts):
            buf[s * m: s * m + c] = x[start: start + c]
            start += c
        out = x.new_empty((m, *rest))
        gp.comm.reduce_scatter(out, buf, group=gp.group, kind=KIND)
        return out[:mine].clone()
    y = x.clone().contiguous()
    gp.comm.all_reduce(y, group=gp.group, kind=KIND)
    return y[off: off + mine].clone()


def _raw_blocks(sends: list[Tensor], recv_shapes: list[tuple[int, ...]], gp: GPGroup, like: Tensor) -> list[Tensor]:
    """Send ``sends[q]`` to group rank ``q`` and receive a block of ``recv_shapes[s]`` from each ``s`` (own block
    passed through); only non-empty blocks travel."""
    recvs = [like.new_empty(shape) for shape in recv_shapes]
    recvs[gp.rank] = sends[gp.rank]
    if gp.size == 1:
        return recvs
    if gp.backend == "nccl":
        gp.comm.all_to_all(recvs, [s.contiguous() for s in sends], group=gp.group, kind=KIND, self_index=gp.rank)
        return recvs
    out_ops = [(sends[q], gp.global_ranks[q]) for q in range(gp.size) if q != gp.rank and sends[q].size(0)]
    in_ops = [(recvs[s], gp.global_ranks[s]) for s in range(gp.size) if s != gp.rank and recvs[s].size(0)]
    gp.comm.exchange(out_ops, in_ops, tag=HALO_TAG, kind=KIND)
    return recvs


# ---------------------------------------------------------------------------------------------- autograd functions
class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gp, counts):
        ctx.gp, ctx.counts = gp, counts
        return _raw_gather(x, gp, counts)

    @staticmethod
    def backward(ctx, grad):
        return _ReduceScatter.apply(grad, ctx.gp, ctx.counts), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gp, counts):
        ctx.gp, ctx.counts = gp, counts
        return _raw_reduce_scatter(x, gp, counts)

    @staticmethod
    def backward(ctx, grad):
        return _Gather.apply(grad, ctx.gp, ctx.counts), None, None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gp):
        y = x.clone().contiguous()
        gp.comm.all_reduce(y, group=gp.group, kind=KIND)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gp, send_index, recv_counts):
        ctx.gp, ctx.send_index, ctx.recv_counts, ctx.rows = gp, send_index, recv_counts, x.size(0)
        rest = tuple(x.shape[1:])
        sends = [x.index_select(0, idx) for idx in send_index]
        shapes = [(c, *rest) for c in recv_counts]
        shapes[gp.rank] = (0, *rest)
        sends[gp.rank] = x.new_zeros((0, *rest))
        return torch.cat(_raw_blocks(sends, shapes, gp, x))

    @staticmethod
    def backward(ctx, grad):
        return _HaloReduce.apply(grad, ctx.gp, ctx.send_index, ctx.recv_counts, ctx.rows), None, None, None


class _HaloReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, gp, send_index, recv_counts, rows):
        ctx.gp, ctx.send_index, ctx.recv_counts = gp, send_index, recv_counts
        rest = tuple(y.shape[1:])
        counts = list(recv_counts)
        counts[gp.rank] = 0
        sends = list(torch.split(y, counts))
        shapes = [(int(idx.numel()), *rest) for idx in send_index]
        shapes[gp.rank] = (0, *rest)
        blocks = _raw_blocks(sends, shapes, gp, y)
        out = y.new_zeros((rows, *rest))
        for q, idx in enumerate(send_index):
            if q != gp.rank and idx.numel():
                out.index_add_(0, idx, blocks[q])
        return out

    @staticmethod
    def backward(ctx, grad):
        return _HaloExchange.apply(grad, ctx.gp, ctx.send_index, ctx.recv_counts), None, None, None, None


# ---------------------------------------------------------------------------------------------- public ops
def split(x: Tensor, index: Tensor) -> Tensor:
    """This rank's rows ``x[index]`` of a replicated tensor ``x [R, …]`` → ``[len(index), …]``.

    Backward: the gradient rows scattered into zeros of ``x``'s shape (``index_select``'s own adjoint, itself
    differentiable); no communication.
    """
    return x.index_select(0, index.to(x.device))


def gather(x: Tensor, counts: Sequence[int], gp: GPGroup) -> Tensor:
    """All-gather of owned rows: rank ``r``'s ``x [counts[r], …]`` → ``[Σ counts, …]``, ranks' rows in rank order.

    Backward: reduce-scatter with sum (each rank's gradient for the whole buffer is partial; the ranks' sum
    is the gradient of the owned rows), via :func:`reduce_scatter`.

    Args:
        x: this rank's rows; every rank's trailing shape and dtype must agree.
        counts: the row count of every group rank (known to all; may be 0).
        gp: the group.

    Raises:
        ValueError: ``counts`` has the wrong length, or ``x`` does not have ``counts[rank]`` rows.

    Bytes (kind ``"gp"``): :func:`gather_bytes`.
    """
    counts = _counts(counts, gp, "gather")
    _check_rows(x, counts[gp.rank], "gather")
    if gp.size == 1:
        return x
    return _Gather.apply(x, gp, counts)


def reduce_scatter(x: Tensor, counts: Sequence[int], gp: GPGroup) -> Tensor:
    """Reduce-scatter with sum: partial sums ``x [Σ counts, …]`` (rows in rank order) → this rank's rows of the
    total, ``[counts[rank], …]``.

    Backward: all-gather (the gradient of a partial sum is the gradient of the total), via :func:`gather`.

    Raises:
        ValueError: wrong ``counts``, or ``x`` does not have ``Σ counts`` rows.

    Bytes (kind ``"gp"``): :func:`reduce_scatter_bytes` with the group's backend.
    """
    counts = _counts(counts, gp, "reduce_scatter")
    _check_rows(x, sum(counts), "reduce_scatter")
    if gp.size == 1:
        return x
    return _ReduceScatter.apply(x, gp, counts)


def all_reduce(x: Tensor, gp: GPGroup) -> Tensor:
    """Sum over the group of a partial tensor (same shape on every rank), e.g. partial energies or forces.

    Backward: identity (the total's gradient, identical on every rank, is each partial's gradient).

    Bytes (kind ``"gp"``): :func:`all_reduce_bytes`.
    """
    if gp.size == 1:
        return x
    return _AllReduce.apply(x, gp)


def _halo_args(send_index: Sequence[Tensor], recv_counts: Sequence[int], gp: GPGroup, x: Tensor):
    if len(send_index) != gp.size:
        raise ValueError(f"halo: need one send index per rank of the group ({gp.size}); got {len(send_index)}")
    recv_counts = _counts(recv_counts, gp, "halo")
    send_index = tuple(torch.as_tensor(i, dtype=torch.long).to(x.device) for i in send_index)
    return send_index, recv_counts


def halo_exchange(x: Tensor, send_index: Sequence[Tensor], recv_counts: Sequence[int], gp: GPGroup) -> Tensor:
    """Rows this rank reads from the others: sends ``x[send_index[q]]`` to each rank ``q``, returns the received
    rows ``[Σ_{s≠rank} recv_counts[s], …]``, blocks in rank order (this rank's own rows are not included).

    Backward: :func:`halo_reduce` (each gradient row goes back to its owner and is added onto the row it came
    from; rows read by several ranks sum).

    Args:
        x: this rank's owned rows ``[n, …]``.
        send_index: per group rank ``q``, ``LongTensor`` of rows of ``x`` that ``q`` reads, in ``q``'s order
            (ignored for ``q = rank``).
        recv_counts: per group rank ``s``, how many rows this rank reads from ``s`` (``= len`` of ``s``'s
            ``send_index[rank]``; the entry for ``rank`` is ignored).

    Bytes (kind ``"gp"``): :func:`halo_exchange_bytes` of the send counts.
    """
    send_index, recv_counts = _halo_args(send_index, recv_counts, gp, x)
    if gp.size == 1:
        return x[:0]
    return _HaloExchange.apply(x, gp, send_index, recv_counts)


def halo_reduce(y: Tensor, send_index: Sequence[Tensor], recv_counts: Sequence[int], rows: int, gp: GPGroup) -> Tensor:
    """The adjoint of :func:`halo_exchange`: rows ``y`` (laid out as :func:`halo_exchange` returns them) go back
    to their owners, which add them onto rows ``send_index[q]`` of a zero ``[rows, …]`` tensor.

    Backward: :func:`halo_exchange`.

    Bytes (kind ``"gp"``): :func:`halo_reduce_bytes` of the receive counts.
    """
    send_index, recv_counts = _halo_args(send_index, recv_counts, gp, y)
    if gp.size == 1:  # nothing was read from others; keep the output in the autograd graph of ``y``
        return y.new_zeros((rows, *y.shape[1:])).index_add(0, torch.zeros(0, dtype=torch.long, device=y.device), y[:0])
    return _HaloReduce.apply(y, gp, send_index, recv_counts, int(rows))
