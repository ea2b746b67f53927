"""The schedule interpreter: one loop over a validated schedule's actions, for every executor.

:class:`Executor` runs one rank's row of a schedule on its :class:`~gnnpipe.core.runtime.stage.Stage`:

* ``F`` of chunk c: receive the boundary tensor from stage s−1 (none on stage 0), ``stage.forward_chunk``,
  send its result to s+1 (none on the last stage);
* ``B`` of chunk c: receive the boundary gradient from s+1 (none on the last stage),
  ``stage.backward_chunk``, send its result to s−1 (none on stage 0);
* ``G`` / ``D`` of chunk c (second-order schedules, conservative forces of atomistic models): ``G`` receives from
  s+1 (none on the last stage), runs ``stage.force_grad_chunk`` and sends to s−1; ``D`` receives from s−1 (none on
  stage 0), runs ``stage.second_chunk`` and sends to s+1. Only stages that implement them run such schedules.
* ``STEP``: the gradient synchronisation the executor was composed with (graph-parallel and hybrid: an
  all-reduce over the stage's peers), then ``stage.step``.

Corrector hooks fire here (``on_epoch_start`` / ``after_forward`` / ``after_backward`` / ``on_epoch_end``,
and the ``wants_refresh`` full refresh before an epoch), as do the epoch windows of non-flush schedulers
(async-stale: several epochs as one action stream up to the next evaluation).

**Validation**: every schedule is checked with :func:`gnnpipe.schedulers.validate` the first time its
shape (``S``, ``C``, the chunk orders) is run, on every rank, before the rank sends or receives anything
for it — an invalid custom schedule raises :class:`~gnnpipe.errors.ScheduleError` (the problems and the
ASCII picture) on every rank instead of deadlocking.

**Pre-posted receives** (gloo only): while a stage computes action k, the receive of the next action that reads
from each neighbour is already posted, so its boundary tensor arrives off the critical path
(``benchmarks/bench_pipeline_timeline.py``, docs/RESULTS.md §5). NCCL runs a pair's sends and receives in issue order on one stream, so a receive posted
before this action's send would deadlock against the peer's; there receives are posted when needed.

Exact inference through the stages (evaluation, the full refresh) is :meth:`Executor.infer`: each stage
runs ``stage.infer_units`` on its inference rows and passes the result on.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ... import schedulers
from ...correctors import Corrector, StageContext
from ..ops.comm import Comm, PostedRecv
from .metrics import accuracies, gather_accuracies
from .stage import Stage

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
            from ...errors import ScheduleError

            raise ScheduleError(f"scheduler {type(scheduler).__name__} built a schedule of {schedule.num_stages} "
                                f"stages for a pipeline of {num_stages}")
        if validated is not None:
            validated.add(key)
    return schedule


class Executor:
    """One rank of a run: a :class:`Stage` driven through schedules (pipeline, graph-parallel and hybrid alike).

    Args:
        stage: the compute of this rank.
        num_stages: ``S``. ranks: global rank of each stage of this rank's pipeline.
        chunks: the global ids of the chunks this rank's pipeline runs, in local order (schedules use local
            ids ``0 … len(chunks)−1``).
        scheduler: a :class:`~gnnpipe.schedulers.ChunkScheduler`. order_policy: ``order(epoch, C) -> list``.
        correctors: corrector instances (fresh objects per rank). comm: the byte-counting facade.
        data: the relabelled graph (labels and masks for evaluation).
        chunk_ptr: ``LongTensor[C+1]``, the global chunk layout (the correctors' :class:`StageContext` gets it).
        sync_grads: called before every optimizer step (graph-parallel / hybrid: all-reduce over the peers).
        peer_chunks: ``c → [global chunks]`` whose rows the ops just exchanged with peers (hybrid): the
            correctors' chunk hooks fire for them too, and forwards add them to ``ctx.fresh_chunks``.
        eval_group: process group of this pipeline's ranks (pipeline evaluation broadcast).
        inference_rows: the global rows ``(lo, hi)`` this rank's pipeline infers (``None``: all rows, and the
            last stage computes the metrics for everyone; else metrics are gathered from every rank).
        eval_tag: tag of the inference boundary tensors.
        config: the resolved configuration (epochs, evaluation cadence for non-flush windows).
    """

    def __init__(self, stage: Stage, *, config, num_stages: int, ranks: Sequence[int], chunks: Sequence[int],
                 scheduler, order_policy, correctors: list[Corrector], comm: Comm, data, chunk_ptr: Tensor,
                 sync_grads: Optional[Callable[[], None]] = None,
                 peer_chunks: Optional[Callable[[int], list[int]]] = None, eval_group=None,
                 inference_rows: Optional[tuple[int, int]] = None, eval_tag: int = 0):
        self.stage = stage
        self.config = config
        self.S, self.s = num_stages, stage.s
        self.ranks = list(ranks)
        self.chunks = list(chunks)
        self.num_chunks = len(self.chunks)
        self.scheduler = scheduler
        self.order_policy = order_policy
        self.correctors = correctors
        self.comm = comm
        self.data = data
        self.device = stage.device
        self.flush = bool(getattr(scheduler, "flush", True))
        self.sync_grads = sync_grads
        self.peer_chunks = peer_chunks
        self.eval_group = eval_group
        self.inference_rows = inference_rows
        self.eval_tag = eval_tag
        #: what the correctors see of this stage (global chunk structure)
        self.ctx = StageContext(stage=stage.s, num_stages=num_stages, histories=list(stage.histories.values()),
                                chunk_ptr=chunk_ptr.cpu(), seed=config.seed)
        for k in self.correctors:
            k.setup(self.ctx)
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

    def history_bytes(self) -> int:
        return self.stage.history_bytes()

    def named_grads(self) -> dict[str, Tensor]:
        return self.stage.named_grads()

    # ------------------------------------------------------------------ communication of one action
    def _recv_spec(self, kind: str, c: int) -> Optional[tuple]:
        """``(shape, src, tag)`` of the boundary tensor action ``kind`` on global chunk ``c`` receives, or ``None``.
        A stage with ``recv_shape(kind, c)`` says the shape itself (``None``: nothing to receive)."""
        if kind not in _KIND_TAG:
            return None
        if hasattr(self.stage, "recv_shape"):
            shape = self.stage.recv_shape(kind, c)
            if shape is None:
                return None
            off, direction = _KIND_TAG[kind]
            return shape, self.ranks[self.s - direction], TAG_STRIDE * c + off
        lo, hi = self.stage.rows(c)
        if kind == "F" and not self.stage.is_first:
            return (hi - lo, self.stage.input_width()), self.ranks[self.s - 1], TAG_STRIDE * c
        if kind == "B" and not self.stage.is_last:
            return (hi - lo, self.stage.output_width()), self.ranks[self.s + 1], TAG_STRIDE * c + 2
        return None

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

    def _receive(self, kind: str, c: int, e: int) -> Optional[Tensor]:
        """The boundary tensor of action ``(kind, c, e)`` (its pre-posted receive, or one posted now), or ``None``."""
        if self._recv_spec(kind, c) is None:
            return None
        self._post(kind, c, e)
        return self.comm.wait_recv(self._posted.pop((kind, c, e)))

    def forward(self, c: int, e: int) -> None:
        """Action ``F``: receive, compute, send; then the correctors' ``after_forward``."""
        out = self.stage.forward_chunk(c, self._receive("F", c, e), e)
        if out is not None:
            self.comm.isend(out, self.ranks[self.s + 1], TAG_STRIDE * c, "layer")
        for p in [c] + (self.peer_chunks(c) if self.peer_chunks else []):
            if p != c:
                self.ctx.fresh_chunks.add(p)
            for k in self.correctors:
                k.after_forward(e, p)

    def backward(self, c: int, e: int) -> None:
        """Action ``B``: receive, compute, send; then the correctors' ``after_backward``."""
        grad = self.stage.backward_chunk(c, self._receive("B", c, e), e)
        if grad is not None:
            self.comm.isend(grad, self.ranks[self.s - 1], TAG_STRIDE * c + 2, "layer")
        for p in [c] + (self.peer_chunks(c) if self.peer_chunks else []):
            for k in self.correctors:
                k.after_backward(e, p)

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
        """Epochs run as one uninterrupted action stream: 1 for flush schedulers; for the others, up to
        the next evaluation (evaluation is exact inference through all stages, a natural barrier)."""
        if self.flush:
            return 1
        k = self.config.eval_every
        return min(k - epoch % k, self.config.epochs - epoch)

    def _start_epoch(self, e: int) -> None:
        if e in self._started:
            return
        self._started.add(e)
        if self.flush and any(k.wants_refresh(e) for k in self.correctors):
            self.infer(capture=True)
        for k in self.correctors:
            k.on_epoch_start(e)

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
        self.ctx.fresh_chunks.clear()
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
        for k in self.correctors:
            k.on_epoch_end(epoch)
        self._started.discard(epoch)
        return {"loss": self.stage.pop_loss(epoch)}

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def infer(self, capture: bool = False) -> Optional[Tensor]:
        """Exact inference through the stages (eval mode, no history reads, no dropout) on the inference
        rows; ``capture=True`` writes each op's exact input into its history (a full refresh), otherwise
        history is untouched. Returns the logits on the last stage, else ``None``."""
        st = self.stage
        lo, hi = self.inference_rows or (0, st.num_nodes)
        if st.is_first:
            b = st.row_range[0]
            inputs = [st.x[lo - b:hi - b], None]
        else:  # the rows and the shared tensor as two messages: no concatenated copy, and h is freed after one unit
            src = self.ranks[self.s - 1]
            inputs = [self.comm.recv((hi - lo, st.in_dim), st.dtype, src, self.eval_tag),
                      self.comm.recv((hi - lo, st.shared_dim), st.dtype, src, self.eval_tag + 1)
                      if st.shared_dim else None]
        out, sh = st.infer_units(inputs, capture)
        if st.is_last:
            return out
        dst = self.ranks[self.s + 1]
        self.comm.isend(out, dst, self.eval_tag, "eval")
        if st.shared_dim:
            self.comm.isend(sh, dst, self.eval_tag + 1, "eval")
        del out, sh
        self.comm.wait_sends()
        return None

    def refresh_history(self) -> None:
        """Recompute every ``H_in`` exactly from the current weights (the ``refresh`` corrector)."""
        self.infer(capture=True)

    def evaluate(self) -> dict:
        """Exact evaluation; every rank gets the same metrics dict (pipeline: broadcast from the last stage;
        with inference rows: counts gathered from every rank)."""
        logits = self.infer()
        if self.inference_rows is None:
            obj = [accuracies(logits.cpu(), self.data) if self.stage.is_last else None]
            dist.broadcast_object_list(obj, src=self.ranks[-1], group=self.eval_group)
            return obj[0]
        lo, hi = self.inference_rows
        masks = {s: getattr(self.data, f"{s}_mask")[lo:hi].to(self.device) for s in ("train", "val", "test")}
        return gather_accuracies(logits, self.data.y[lo:hi].to(self.device), masks)


__all__ = ["TAG_STRIDE", "Executor", "build_validated"]
