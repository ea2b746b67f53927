"""The schedule interpreter: one loop over a validated schedule's actions, for every kind of work.

:class:`Executor` runs one rank's row of a schedule on its stage, a
:class:`~gnnpipe.core.runtime.protocol.PipelineStage` (what it receives, computes and sends is declared there):

* ``F`` of chunk c: receive the boundary tensor from stage s−1 (none on stage 0), ``stage.forward_chunk``,
  send its result to s+1 (none on the last stage);
* ``B`` of chunk c: receive the boundary gradient from s+1 (none on the last stage),
  ``stage.backward_chunk``, send its result to s−1 (none on stage 0);
* ``G`` / ``D`` of chunk c (second-order schedules, conservative forces of atomistic models): ``G`` receives from
  s+1 (none on the last stage), runs ``stage.force_grad_chunk`` and sends to s−1; ``D`` receives from s−1 (none on
  stage 0), runs ``stage.second_chunk`` and sends to s+1. Only stages that implement them run such schedules.
* ``STEP``: the gradient synchronisation the executor was composed with (an all-reduce over the ranks holding the
  same units), then ``stage.step``.

A kind of work adds what happens around the actions by overriding the hooks :meth:`Executor.before_epoch`,
:meth:`~Executor.after_forward`, :meth:`~Executor.after_backward` and :meth:`~Executor.after_epoch` (node
classification: the staleness correctors and history refreshes) and runs several epochs as one action stream for
non-flush schedulers (``window``: async-stale, up to the next evaluation).

**Validation**: every schedule is checked with :func:`gnnpipe.schedulers.validate` the first time its
shape (``S``, ``C``, the chunk orders) is run, on every rank, before the rank sends or receives anything
for it — an invalid custom schedule raises :class:`~gnnpipe.errors.ScheduleError` (the problems and the
ASCII picture) on every rank instead of deadlocking.

**Pre-posted receives** (gloo only): while a stage computes action k, the receive of the next action that reads
from each neighbour is already posted, so its boundary tensor arrives off the critical path
(``benchmarks/bench_pipeline_timeline.py``, docs/RESULTS.md). NCCL runs a pair's sends and receives in issue order on
one stream, so a receive posted before this action's send would deadlock against the peer's; there receives are
posted when needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch.distributed as dist
from torch import Tensor

from ... import schedulers
from ...errors import ScheduleError
from ..comm import Comm, PostedRecv
from .protocol import PipelineStage

TAG_STRIDE = 4  # tags per chunk: +0 forward, +1 G pass, +2 backward, +3 D pass
#: tag offset and direction of the message each action kind sends (+1: to s+1, −1: to s−1)
_KIND_TAG = {"F": (0, 1), "G": (1, -1), "B": (2, -1), "D": (3, 1)}


def _actions(schedule, stage: int):
    """``(kind, chunk, epoch)`` of the stage's actions in order, idle slots skipped; kind in ``F``, ``B``, ``STEP``."""
    for a in schedule.stages[stage]:
        if a is None:
            continue
        kind = getattr(a.kind, "name", str(a.kind))
        yield kind, a.chunk, getattr(a, "epoch", 0)


def build_validated(scheduler, num_stages: int, orders: Sequence[Sequence[int]], validated: set | None = None):
    """The schedule of ``scheduler`` for ``orders`` (one chunk order per epoch of the window), validated.

    Flush schedulers get ``build(S, orders[0])``; others ``build_epochs(S, orders)``. ``validated`` caches the
    shapes ``(S, C, orders)`` already checked.

    Raises:
        ScheduleError: the schedule breaks the pipeline's rules (the message lists the problems and draws it),
            or ``build`` returned something that is not a :class:`~gnnpipe.schedulers.Schedule`.
    """
    flush = bool(getattr(scheduler, "flush", True))
    schedule = scheduler.build(num_stages, list(orders[0])) if flush else scheduler.build_epochs(num_stages, orders)
    key = (num_stages, len(orders[0]), tuple(tuple(o) for o in orders))
    if validated is None or key not in validated:
        schedulers.validate(schedule)
        if getattr(schedule, "num_stages", num_stages) != num_stages:
            raise ScheduleError(f"scheduler {type(scheduler).__name__} built a schedule of {schedule.num_stages} "
                                f"stages for a pipeline of {num_stages}")
        if validated is not None:
            validated.add(key)
    return schedule


class Executor:
    """One rank of a run: a :class:`~gnnpipe.core.runtime.protocol.PipelineStage` driven through schedules.

    Args:
        stage: the compute of this rank.
        num_stages: ``S``. ranks: global rank of each stage of this rank's pipeline.
        chunks: the global ids of the chunks this rank's pipeline runs, in local order (schedules use local
            ids ``0 … len(chunks)−1``).
        scheduler: a :class:`~gnnpipe.schedulers.ChunkScheduler`. order_policy: ``order(epoch, C) -> list``.
        comm: the byte-counting facade.
        sync_grads: called before every optimizer step (an all-reduce over the ranks holding the same units).
        window: ``epoch → k``: a non-flush scheduler's epochs run as one action stream from ``epoch`` (default 1).
    """

    def __init__(self, stage: PipelineStage, *, num_stages: int, ranks: Sequence[int], chunks: Sequence[int],
                 scheduler, order_policy, comm: Comm, sync_grads: Callable[[], None] | None = None,
                 window: Callable[[int], int] | None = None):
        self.stage = stage
        self.S, self.s = num_stages, stage.s
        self.ranks = list(ranks)
        self.chunks = list(chunks)
        self.num_chunks = len(self.chunks)
        self.scheduler = scheduler
        self.order_policy = order_policy
        self.comm = comm
        self.device = stage.device
        self.flush = bool(getattr(scheduler, "flush", True))
        self.sync_grads = sync_grads
        self.window = window
        #: post each action's receive one action ahead: gloo only (module docstring)
        self.prepost = dist.is_initialized() and dist.get_backend() == "gloo"
        self.validated: set = set()
        self._stream: list = []
        self._started: set[int] = set()
        self._posted: dict[tuple[str, int, int], PostedRecv] = {}

    # ------------------------------------------------------------------ the stage's view, for callers
    @property
    def version(self) -> int:
        return self.stage.version

    @property
    def params(self) -> list:
        return self.stage.params

    # ------------------------------------------------------------------ what a kind of work adds
    def before_epoch(self, epoch: int) -> None:
        """Called once before the first action of ``epoch`` on this rank (default: nothing)."""

    def after_forward(self, c: int, epoch: int) -> None:
        """Called after the ``F`` of chunk ``c`` (its output sent; default: nothing)."""

    def after_backward(self, c: int, epoch: int) -> None:
        """Called after the ``B`` of chunk ``c`` (its input gradient sent; default: nothing)."""

    def after_epoch(self, epoch: int) -> None:
        """Called once this rank has run ``epoch``'s actions (default: nothing)."""

    # ------------------------------------------------------------------ communication of one action
    def _recv_spec(self, kind: str, c: int) -> tuple | None:
        """``(shape, src, tag)`` of the boundary tensor action ``kind`` on global chunk ``c`` receives, or ``None``
        (the stage says the shape: :meth:`~gnnpipe.core.runtime.protocol.PipelineStage.recv_shape`)."""
        if kind not in _KIND_TAG:
            return None
        shape = self.stage.recv_shape(kind, c)
        if shape is None:
            return None
        off, direction = _KIND_TAG[kind]
        return shape, self.ranks[self.s - direction], TAG_STRIDE * c + off

    def _post(self, kind: str, c: int, e: int) -> None:
        """Post the receive of action ``(kind, c, e)`` now (if it has one and it is not posted yet).
        Receives are posted in stream order, and gloo matches them in that order per (source, tag)."""
        key = (kind, c, e)
        spec = None if key in self._posted else self._recv_spec(kind, c)
        if spec is not None:
            shape, src, tag = spec
            self._posted[key] = self.comm.irecv(shape, self.stage.dtype, src, tag)

    def _post_ahead(self) -> None:
        """Post, for each neighbour, the receive of the next action that reads from it (up to the next ``STEP``),
        so that both neighbours' boundary tensors arrive while this action computes: a middle stage of 1f1b
        alternates forwards (from s−1) and backwards (from s+1), and gloo moves a tensor's bytes only once its
        receive is posted. One receive per neighbour keeps the posts in stream order per (source, tag)."""
        seen: set[int] = set()
        neighbours = (self.s > 0) + (self.s < self.S - 1)
        for kind, c, e in reversed(self._stream):
            if kind == "STEP" or len(seen) == neighbours:
                return
            spec = self._recv_spec(kind, c)
            if spec is None or spec[1] in seen:
                continue
            seen.add(spec[1])
            self._post(kind, c, e)

    def _receive(self, kind: str, c: int, e: int) -> Tensor | None:
        """The boundary tensor of action ``(kind, c, e)`` (its pre-posted receive, or one posted now), or ``None``."""
        if self._recv_spec(kind, c) is None:
            return None
        self._post(kind, c, e)
        return self.comm.wait_recv(self._posted.pop((kind, c, e)))

    def forward(self, c: int, e: int) -> None:
        """Action ``F``: receive, compute, send; then :meth:`after_forward`."""
        out = self.stage.forward_chunk(c, self._receive("F", c, e), e)
        if out is not None:
            self.comm.isend(out, self.ranks[self.s + 1], TAG_STRIDE * c, "layer")
        self.after_forward(c, e)

    def backward(self, c: int, e: int) -> None:
        """Action ``B``: receive, compute, send; then :meth:`after_backward`."""
        grad = self.stage.backward_chunk(c, self._receive("B", c, e), e)
        if grad is not None:
            self.comm.isend(grad, self.ranks[self.s - 1], TAG_STRIDE * c + 2, "layer")
        self.after_backward(c, e)

    def force_grad(self, c: int, e: int) -> None:
        """Action ``G`` (conservative forces): receive from s+1, ``stage.force_grad_chunk``, send to s−1."""
        out = self.stage.force_grad_chunk(c, self._receive("G", c, e), e)
        if out is not None:
            self.comm.isend(out, self.ranks[self.s - 1], TAG_STRIDE * c + 1, "layer")

    def second(self, c: int, e: int) -> None:
        """Action ``D`` (conservative forces): receive from s−1, ``stage.second_chunk``, send to s+1."""
        out = self.stage.second_chunk(c, self._receive("D", c, e), e)
        if out is not None:
            self.comm.isend(out, self.ranks[self.s + 1], TAG_STRIDE * c + 3, "layer")

    def step(self) -> None:
        """Action ``STEP``: gradient synchronisation (if composed with one), then the stage's step."""
        if self.sync_grads is not None:
            self.sync_grads()
        self.stage.step()

    # ------------------------------------------------------------------ epochs
    def _window(self, epoch: int) -> int:
        """Epochs run as one uninterrupted action stream: 1 for flush schedulers; for the others ``window``'s."""
        return 1 if self.flush or self.window is None else self.window(epoch)

    def _start_epoch(self, e: int) -> None:
        if e in self._started:
            return
        self._started.add(e)
        self.before_epoch(e)

    def schedule_for(self, epoch: int):
        """The validated schedule that starts at ``epoch`` (one epoch, or a non-flush window)."""
        orders = [list(self.order_policy.order(epoch + i, self.num_chunks)) for i in range(self._window(epoch))]
        return build_validated(self.scheduler, self.S, orders, self.validated)

    def train_epoch(self, epoch: int) -> dict:
        """Run this rank's actions of one epoch. Returns ``{"loss": …}`` (last stage: the epoch's loss, the
        sum of chunk losses = the full-batch mean loss over the training vertices; others: 0).

        Flush schedulers (gpipe, 1f1b): the epoch's schedule is built from this epoch's chunk order and run
        to the end. Non-flush schedulers (async-stale): a stream of several epochs is built with
        :meth:`~gnnpipe.schedulers.ChunkScheduler.build_epochs` and run up to this stage's ``STEP`` of
        ``epoch``; forwards of the next epoch that precede it run now, with the current weights.

        Raises:
            ScheduleError: the schedule is invalid (raised before anything is sent or received).
        """
        if self.flush:
            self.stage.zero_grad()
        if not self._stream:
            schedule = self.schedule_for(epoch)
            self._stream = [(kind, None if c is None else self.chunks[c], epoch + (a_epoch or 0))
                            for kind, c, a_epoch in _actions(schedule, self.s)]
            self._stream.reverse()  # pop() from the end
        self._start_epoch(epoch)
        stepped = False
        while self._stream:
            kind, c, e = self._stream.pop()
            self._start_epoch(e)
            if self.prepost:
                self._post_ahead()
            if kind == "F":
                self.forward(c, e)
            elif kind == "B":
                self.backward(c, e)
            elif kind == "G":
                self.force_grad(c, e)
            elif kind == "D":
                self.second(c, e)
            elif kind == "STEP":
                self.step()
                if e == epoch:
                    stepped = True
                    break
        if not stepped:
            self.step()
        if not self._stream:
            self.comm.wait_sends()
            if self.stage.pending():
                raise RuntimeError(f"stage {self.s}: chunks {self.stage.pending()} were forwarded but never "
                                   f"back-propagated")
        self.after_epoch(epoch)
        self._started.discard(epoch)
        return {"loss": self.stage.pop_loss(epoch)}


__all__ = ["TAG_STRIDE", "Executor", "build_validated"]
