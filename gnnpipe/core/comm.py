"""A thin wrapper around every ``torch.distributed`` call the runtime makes, counting bytes and time.

Bytes are counted as the payload a rank *sends* (``numel · element_size``), by kind:

* ``layer``  — stage-boundary embeddings and their gradients (pipeline p2p);
* ``graph``  — mirror/halo rows exchanged between graph-parallel ways (and their gradients);
* ``weight`` — weight-gradient synchronisation. For an all-reduce of ``P`` bytes among ``G`` ranks
  the count follows the ring algorithm: each rank sends ``2·(G−1)/G·P`` bytes, so the sum over the
  group is exactly ``2·(G−1)·P`` (Patarasuk & Yuan 2009). Per rank it is recorded as ``2·(G−1)·P / G``
  (a float); sums over a group are integers;
* ``eval``   — exact-inference traffic (not part of the per-epoch training volume);
* ``gp``     — graph-parallel collectives of atomistic models (:mod:`gnnpipe.tasks.s2ef.collectives`: atom and edge
  gathers, reduce-scatters, halo exchanges, partial-energy and force all-reduces, forward and backward; the
  formula of each op is there). An all-gather of ``G`` equal blocks of ``P`` bytes is counted as the ring
  algorithm sends it, ``(G−1)·P`` per rank; a reduce-scatter of ``G`` blocks of ``P`` bytes likewise ``(G−1)·P``.

Time is split as: ``comm`` = seconds inside send/collective calls, ``idle`` = seconds blocked waiting for a
peer — in receives, and in waits for point-to-point sends the receiver has not taken yet (gloo completes a send
once the peer posts its receive; pipeline bubbles appear here) — and the caller derives ``compute`` = wall −
comm − idle. A receive posted early (:meth:`Comm.irecv`) counts as idle only the time its :meth:`Comm.wait_recv`
blocks.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch import Tensor

KINDS = ("layer", "graph", "weight", "eval", "gp")

#: sends a rank keeps outstanding on a transport that cannot report a send's completion without waiting for it
#: (gloo: a send's ``is_completed()`` stays ``False`` until ``wait()`` is called, even long after the peer has
#: received it). :meth:`Comm.isend` then waits for the oldest outstanding send before it returns whenever more
#: than this many are outstanding, so that a rank holds at most this many sent tensors (otherwise every tensor
#: sent in an epoch stayed alive until its end: on a pipeline rank, both directions' boundary tensors of every
#: chunk, ``2·N·(d + d_shared)`` values). A waited send's receive is always reachable: the receiver
#: posts its receives in its own action order, and what it needs before that receive was sent earlier.
MAX_PENDING_SENDS = 2


class PostedRecv:
    """A receive posted with :meth:`Comm.irecv`: the ``torch.distributed`` work handle, the buffer it fills,
    and its source rank and tag (``host``: the pinned CPU buffer the transport fills when staging)."""

    __slots__ = ("buf", "host", "src", "tag", "work")

    def __init__(self, work, buf: Tensor, src: int, tag: int, host: Tensor | None = None):
        self.work, self.buf, self.src, self.tag, self.host = work, buf, src, tag, host


def _host_copy(t: Tensor) -> Tensor:
    """A pinned CPU copy of a CUDA tensor (the copy has finished when this returns)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t)
    return host


def _host_buffer(shape, dtype) -> Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=torch.cuda.is_available())


class Comm:
    """Byte- and time-accounting facade over ``torch.distributed`` point-to-point and collectives.

    Args:
        device: device of receive buffers.
        stage: pass CUDA tensors through pinned CPU buffers (gloo refuses CUDA tensors, "writev: Bad address",
            and nccl refuses two ranks on one GPU, so ranks sharing a GPU talk over gloo this way).
            Default: ``device`` is CUDA and the process group's backend is not nccl.
    """

    def __init__(self, device: torch.device | str = "cpu", stage: bool | None = None):
        self.device = torch.device(device)
        if stage is None:
            stage = self.device.type == "cuda" and not (dist.is_initialized() and dist.get_backend() == "nccl")
        self.stage = bool(stage)
        self.bytes: dict[str, float] = defaultdict(float)
        self.comm_s = 0.0
        self.idle_s = 0.0
        self._pending: list = []
        #: whether a completed send says so without a wait (nccl); gloo's does not (:data:`MAX_PENDING_SENDS`)
        self._pollable = dist.is_initialized() and dist.get_backend() != "gloo"

    # ------------------------------------------------------------------ accounting
    def reset(self) -> None:
        """Zero the byte and time counters (call at the start of an epoch)."""
        self.bytes = defaultdict(float)
        self.comm_s = 0.0
        self.idle_s = 0.0

    def counters(self) -> dict:
        """``{"bytes_layer": …, "bytes_graph": …, "bytes_weight": …, "bytes_eval": …, "bytes_gp": …, "comm_s": …,
        "idle_s": …}``."""
        out = {f"bytes_{k}": self.bytes.get(k, 0.0) for k in KINDS}
        out["comm_s"] = self.comm_s
        out["idle_s"] = self.idle_s
        return out

    # ------------------------------------------------------------------ point to point
    def isend(self, tensor: Tensor, dst: int, tag: int, kind: str = "layer") -> None:
        """Non-blocking send of a contiguous tensor to global rank ``dst``; completed by :meth:`wait_sends`.

        The rank keeps a reference to every outstanding send's tensor; completed sends are forgotten here (their
        tensors freed), and on gloo at most :data:`MAX_PENDING_SENDS` stay outstanding (the oldest is waited for)."""
        t0 = time.perf_counter()
        tensor = tensor.detach().contiguous()
        if self.stage and tensor.device.type != "cpu":
            tensor = _host_copy(tensor)
        self._reap_sends()
        self._pending.append((dist.isend(tensor, dst, tag=tag), tensor))
        waited = 0.0
        if not self._pollable and len(self._pending) > MAX_PENDING_SENDS:
            t1 = time.perf_counter()
            while len(self._pending) > MAX_PENDING_SENDS:
                work, _ = self._pending.pop(0)
                work.wait()
            waited = time.perf_counter() - t1
        self.bytes[kind] += tensor.numel() * tensor.element_size()
        self.idle_s += waited
        self.comm_s += time.perf_counter() - t0 - waited

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int) -> Tensor:
        """Blocking receive of a tensor of known ``shape`` and ``dtype`` from global rank ``src``."""
        buf = _host_buffer(shape, dtype) if self.stage else torch.empty(shape, dtype=dtype, device=self.device)
        t0 = time.perf_counter()
        dist.recv(buf, src, tag=tag)
        self.idle_s += time.perf_counter() - t0
        return buf.to(self.device) if self.stage else buf

    def irecv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int) -> PostedRecv:
        """Post a non-blocking receive of a tensor of known ``shape`` and ``dtype`` from global rank ``src``.

        The transport fills the buffer in the background while this rank computes; :meth:`wait_recv`
        returns it. Posting the next receive before computing the current action hides the transfer
        (pre-posted receives, as in Megatron-LM's and PipeDream's pipeline runtimes)."""
        t0 = time.perf_counter()
        if self.stage:
            host = _host_buffer(shape, dtype)
            work = dist.irecv(host, src, tag=tag)
            self.comm_s += time.perf_counter() - t0
            return PostedRecv(work, host, src, tag, host=host)
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        work = dist.irecv(buf, src, tag=tag)
        self.comm_s += time.perf_counter() - t0
        return PostedRecv(work, buf, src, tag)

    def wait_recv(self, posted: PostedRecv) -> Tensor:
        """Block until a posted receive completes (the wait counts as idle); returns its buffer."""
        t0 = time.perf_counter()
        posted.work.wait()
        self.idle_s += time.perf_counter() - t0
        if posted.host is not None:
            posted.buf = posted.host.to(self.device)
            posted.host = None
        return posted.buf

    def exchange(self, sends: list[tuple[Tensor, int]], recvs: list[tuple[Tensor, int]], tag: int, kind: str) -> None:
        """Batched isend/irecv (``torch.distributed.batch_isend_irecv``): send each ``(tensor, dst)``,
        fill each ``(buffer, src)``; blocks until all complete.

        The receives are posted before the sends. gloo's TCP transport reads a pair's incoming bytes only into a
        posted receive: with every rank's sends first, each rank's send waits until its peer, done sending, posts
        the receive, so the two directions of a link take turns (measured on a shaped veth link: 0.49 of the
        rate each way at once, against 0.92 with the receives first; ``benchmarks/netns_links.py``)."""
        ops = []
        staged = []
        for b, src in recvs:
            if self.stage and b.device.type != "cpu":
                host = _host_buffer(b.shape, b.dtype)
                staged.append((b, host))
                b = host
            ops.append(dist.P2POp(dist.irecv, b, src, tag=tag))
        for t, dst in sends:
            t = t.detach().contiguous()
            if self.stage and t.device.type != "cpu":
                t = _host_copy(t)
            ops.append(dist.P2POp(dist.isend, t, dst, tag=tag))
            self.bytes[kind] += t.numel() * t.element_size()
        if not ops:
            return
        t0 = time.perf_counter()
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        for b, host in staged:
            b.copy_(host)
        self.comm_s += time.perf_counter() - t0

    def _reap_sends(self) -> None:
        """Forget the sends that have completed (``wait`` returns at once and raises a transport error if there
        was one), so their tensors are freed now rather than at the epoch's :meth:`wait_sends`: a stage that
        recomputes keeps no other reference to the outputs it sent (a pipeline rank's peak). Only a
        transport that reports completion (nccl) has any to forget; on gloo :meth:`isend` bounds them instead."""
        if self._pollable and self._pending and any(w.is_completed() for w, _ in self._pending):
            keep = []
            for work, t in self._pending:
                if work.is_completed():
                    work.wait()
                else:
                    keep.append((work, t))
            self._pending = keep

    def wait_sends(self) -> None:
        """Wait for every outstanding :meth:`isend` (the wait counts as idle: the receiver has not taken them)."""
        t0 = time.perf_counter()
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
        self.idle_s += time.perf_counter() - t0

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, tensor: Tensor, group=None, kind: str = "weight") -> Tensor:
        """In-place sum all-reduce over ``group``; counts ring-algorithm bytes (module docstring)."""
        g = dist.get_world_size(group)
        if g == 1:
            return tensor
        t0 = time.perf_counter()
        if self.stage and tensor.device.type != "cpu":
            host = _host_copy(tensor)
            dist.all_reduce(host, group=group)
            tensor.copy_(host)
        else:
            dist.all_reduce(tensor, group=group)
        self.comm_s += time.perf_counter() - t0
        self.bytes[kind] += 2.0 * (g - 1) * tensor.numel() * tensor.element_size() / g
        return tensor

    def all_gather(self, outputs: list[Tensor], tensor: Tensor, group=None, kind: str = "gp") -> None:
        """``all_gather`` of equal-shaped blocks over ``group`` into ``outputs`` (one per group rank); counts
        ``(G−1)·numel·element_size`` (ring algorithm)."""
        g = dist.get_world_size(group)
        t0 = time.perf_counter()
        if self.stage and tensor.device.type != "cpu":
            hosts = [_host_buffer(o.shape, o.dtype) for o in outputs]
            dist.all_gather(hosts, _host_copy(tensor), group=group)
            for o, h in zip(outputs, hosts):
                o.copy_(h)
        else:
            dist.all_gather(outputs, tensor.contiguous(), group=group)
        self.comm_s += time.perf_counter() - t0
        self.bytes[kind] += (g - 1) * tensor.numel() * tensor.element_size()

    def reduce_scatter(self, output: Tensor, tensor: Tensor, group=None, kind: str = "gp") -> None:
        """Sum ``reduce_scatter_tensor`` over ``group`` (``tensor``: ``G`` equal blocks stacked along dim 0; this
        rank's summed block lands in ``output``); counts ``(G−1)·output.numel·element_size`` (ring algorithm).
        Backends without it (gloo) use :meth:`all_reduce` and a slice instead (the caller's choice)."""
        g = dist.get_world_size(group)
        t0 = time.perf_counter()
        dist.reduce_scatter_tensor(output, tensor.contiguous(), group=group)
        self.comm_s += time.perf_counter() - t0
        self.bytes[kind] += (g - 1) * output.numel() * output.element_size()

    def all_to_all(self, outputs: list[Tensor], inputs: list[Tensor], group=None, kind: str = "graph",
                   self_index: int | None = None) -> None:
        """``all_to_all`` over ``group`` (gloo: emulated by batched p2p); bytes count what leaves this rank
        (the block addressed to ``self_index`` does not)."""
        t0 = time.perf_counter()
        dist.all_to_all(outputs, inputs, group=group)
        self.comm_s += time.perf_counter() - t0
        for i, t in enumerate(inputs):
            if i != self_index:
                self.bytes[kind] += t.numel() * t.element_size()


def collective_device(device: torch.device | str) -> torch.device:
    """Where a control collective's tensors live (e.g. per-epoch counters, a stop flag): ``device`` under nccl
    (which only collects device tensors), else the CPU (gloo refuses CUDA tensors)."""
    device = torch.device(device)
    if device.type != "cpu" and dist.is_initialized() and dist.get_backend() == "nccl":
        return device
    return torch.device("cpu")


def sum_over_ranks(values: dict[str, float], group=None) -> dict[str, float]:
    """Sum a dict of floats over all ranks (control traffic, not counted)."""
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return {k: float(v) for k, v in zip(keys, t.tolist())}


def max_over_ranks(values: dict[str, float], group=None) -> dict[str, float]:
    """Max of a dict of floats over all ranks (control traffic, not counted)."""
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return {k: float(v) for k, v in zip(keys, t.tolist())}


def all_reduce_gradients(params: list, comm: Comm, group=None, *, dtype: torch.dtype | None = None,
                         extra: Tensor | None = None) -> Tensor | None:
    """Sum the gradients of ``params`` over ``group`` (``None``: the world) with one all-reduce of the flattened
    gradients (kind ``weight``: its ring bytes are counted); a parameter without a gradient contributes zeros and
    gets the sum. The one gradient synchronisation of every layout of every kind of work.

    Args:
        params: the parameters whose ``.grad`` is summed in place (every rank of ``group`` passes the same list).
        comm: the byte-counting communication. group: the process group.
        dtype: the dtype on the wire (``None``: the gradients' own); the sums are cast back to each gradient's dtype.
        extra: a 1-element tensor summed with the gradients (a loss travelling with them: no second collective).

    Returns:
        ``extra`` summed over ``group`` (``None`` without ``extra``).
    """
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    parts = [g.reshape(-1) if dtype is None else g.reshape(-1).to(dtype) for g in grads]
    if extra is not None:
        parts.append(extra.reshape(1).to(parts[0].dtype if parts else extra.dtype))
    if not parts:
        return None
    flat = torch.cat(parts)
    comm.all_reduce(flat, group=group, kind="weight")
    off = 0
    for p, g in zip(params, grads):
        n = g.numel()
        summed = flat[off:off + n].view_as(g)
        if p.grad is not None and p.grad.dtype == summed.dtype:
            p.grad.copy_(summed)
        else:
            p.grad = summed.to(g.dtype).clone()
        off += n
    return flat[-1:] if extra is not None else None
