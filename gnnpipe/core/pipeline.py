"""The GNNPipe executor: pipelined layer-level model parallelism (GNNPipe paper §3–4; DESIGN §5).

Rank layout (one way): the rank of stage ``s`` is ``ranks[s]``. Each rank holds its stage's units,
the CSR row slices of ``Â`` and ``Âᵀ`` of every chunk, and one :class:`~gnnpipe.core.history.History`
per aggregation op it owns. Every epoch it executes its row of the schedule:

* ``F`` of chunk c: take ``x[R_c]`` (stage 0) or receive the boundary rows (``|R_c| × d``, with the
  shared tensor concatenated on the right, e.g. GCNII's ``h0``) from stage s−1; run the stage's units
  with the chunk aggregation op; on the last stage compute the chunk's loss (train cross-entropy /
  global number of training vertices), else send the output rows to stage s+1;
* ``B`` of chunk c: on the last stage back-propagate the loss, else receive the output gradient from
  s+1 and back-propagate it (the aggregation op's backward is the pull); send the input gradient
  (and the shared tensor's, which thus sums over stages) to s−1;
* ``STEP``: one optimizer step on the stage's parameters (gradients accumulated over chunks).

With gloo, receives are posted one action ahead (:meth:`PipelineStage._post`): while a stage computes
action k, the boundary tensor of action k+1 is already being received, so the transfer is off the
critical path (Amazon Computers, 2 stages: 994 → 924 ms per epoch, ``benchmarks/bench_pipeline_timeline.py``,
docs/RESULTS.md §5).

Evaluation is exact full-graph inference through the stages with ``Â`` itself (no history, no dropout)
and does not touch history.
"""

from __future__ import annotations

import resource
import time
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ..correctors import Corrector, StageContext
from ..errors import ConfigError
from ..models import GNNModel
from .comm import Comm, PostedRecv
from .config import TrainConfig
from .graph import CompactRows, GraphOps
from .history import ChunkAggregate, History
from .trainer import accuracies, make_optimizer, masked_loss

TAG_STRIDE = 4  # tags per chunk: +0 forward, +2 backward


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process: CUDA max allocated on a GPU, else peak resident set size (bytes)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _rng_state(device: torch.device):
    """The RNG state dropout draws from on ``device`` (replayed when recomputing a chunk)."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def _actions(schedule, stage: int):
    """``(kind, chunk, epoch)`` of the stage's actions in order, idle slots skipped; kind in ``F``, ``B``, ``STEP``."""
    for a in schedule.stages[stage]:
        if a is None:
            continue
        kind = getattr(a.kind, "name", str(a.kind))
        yield kind, a.chunk, getattr(a, "epoch", 0)


class PipelineStage:
    """One stage of a GNNPipe pipeline, running on this rank.

    Args:
        config: the resolved run configuration.
        model: the full model (every rank builds it with the same seed; the stage keeps its units).
        data: the relabelled graph (chunks are contiguous id ranges).
        chunk_ptr: ``LongTensor[C+1]``.
        bounds: unit boundaries of the stages (``S+1`` ints); this stage runs units ``bounds[s]:bounds[s+1]``.
        stage: ``s``. ranks: global rank of each stage of this pipeline.
        scheduler: a :class:`gnnpipe.schedulers.ChunkScheduler` instance.
        order_policy: chunk order policy (``order(epoch, C) -> list[int]``).
        correctors: corrector instances (fresh objects per rank).
        comm: the byte-counting communication facade.
        eval_group: process group of this pipeline's ranks (for broadcasting evaluation results).
    """

    def __init__(self, config: TrainConfig, model: GNNModel, data, chunk_ptr: Tensor, bounds: Sequence[int],
                 stage: int, ranks: Sequence[int], scheduler, order_policy, correctors: list[Corrector],
                 comm: Comm, eval_group=None, device: torch.device | str = "cpu"):
        self.config = config
        self.device = torch.device(device)
        self.dtype = model.units[0].lin.weight.dtype if hasattr(model.units[0], "lin") else torch.float32
        self.model = model.to(self.device)
        self.data = data
        self.x = data.x.to(self.device, self.dtype)
        self.y = data.y.to(self.device)
        self.train_mask = data.train_mask.to(self.device)
        self.num_train = int(data.train_mask.sum())
        self.chunk_ptr = chunk_ptr.cpu()
        self.num_chunks = len(chunk_ptr) - 1
        self.S = len(ranks)
        self.s = stage
        self.ranks = list(ranks)
        self.lo_unit, self.hi_unit = int(bounds[stage]), int(bounds[stage + 1])
        if self.hi_unit <= self.lo_unit:
            raise ConfigError(f"stage {stage} owns no unit (bounds {list(bounds)})")
        self.units = range(self.lo_unit, self.hi_unit)
        self.scheduler = scheduler
        self.order_policy = order_policy
        self.correctors = correctors
        self.comm = comm
        self.eval_group = eval_group
        #: a non-flush scheduler (async-stale) steps between a chunk's forward and its backward; autograd
        #: cannot back-propagate through weights changed in place, so such chunks are recomputed in B
        self.flush = bool(getattr(scheduler, "flush", True))
        self.stash = bool(getattr(scheduler, "stash_weights", False))
        self.recompute = config.recompute or not self.flush
        self.ops = GraphOps(data.edge_index, data.num_nodes, self.dtype, self.device)
        # widths of the boundary tensors
        self.shared_dim = model.units[0].out_dim if model.shared_tensor else 0
        self.in_dim = model.units[self.lo_unit].in_dim
        self.out_dim = model.units[self.hi_unit - 1].out_dim
        # history: one per aggregation op of the stage, keyed (unit, op index)
        self.histories: dict[tuple[int, int], History] = {}
        for i in self.units:
            for j, _ in enumerate(model.units[i].aggregations):
                self.histories[(i, j)] = History(data.num_nodes, self.dtype, f"unit{i}.op{j}", self.device)
        # rows R_c of Â and Âᵀ per chunk and kind, columns compacted to the chunk's own rows + halo
        self._chunk_adj: dict[tuple[str, int], tuple[CompactRows, CompactRows]] = {}
        for i in self.units:
            for kind in model.units[i].aggregations:
                for c in range(self.num_chunks):
                    if (kind, c) not in self._chunk_adj and self._owns_chunk(c):
                        self._chunk_adj[(kind, c)] = self.ops.chunk_rows(kind, *self.rows(c))
        self.optimizer = make_optimizer_for(model, config, self.units)
        self.ctx = StageContext(stage=stage, num_stages=self.S, histories=list(self.histories.values()),
                                chunk_ptr=self.chunk_ptr, seed=config.seed)
        for c in self.correctors:
            c.setup(self.ctx)
        self._saved: dict[tuple[int, int], tuple] = {}
        self._losses: dict[int, list[float]] = {}
        self._stream: list = []
        self._started: set[int] = set()
        self._posted: dict[tuple[str, int, int], PostedRecv] = {}  # pre-posted receives by (kind, chunk, epoch)
        #: post each action's receive one action ahead: gloo only. NCCL runs a pair's sends and receives
        #: in issue order on one stream, so a receive posted before this action's send would deadlock
        #: against the peer's (send/recv pairs must be grouped there, as Megatron-LM does)
        self.prepost = dist.is_initialized() and dist.get_backend() == "gloo"
        self.version = 0  # optimizer steps taken by this stage
        self._stashed: dict[int, list[Tensor]] = {}
        self.epoch = 0

    # ------------------------------------------------------------------ helpers
    def _owns_chunk(self, c: int) -> bool:
        """Whether this rank runs chunk ``c`` (every chunk here; a hybrid member only its way's)."""
        return True

    def rows(self, c: int) -> tuple[int, int]:
        return int(self.chunk_ptr[c]), int(self.chunk_ptr[c + 1])

    @property
    def is_first(self) -> bool:
        return self.s == 0

    @property
    def is_last(self) -> bool:
        return self.s == self.S - 1

    def _recv_spec(self, kind: str, c: int) -> Optional[tuple]:
        """``(shape, src, tag)`` of the boundary tensor that action ``kind`` (``F``/``B``) on chunk ``c``
        receives, or ``None`` (stage 0's forwards, the last stage's backwards, ``STEP``)."""
        lo, hi = self.rows(c)
        if kind == "F" and not self.is_first:
            return (hi - lo, self.in_dim + self.shared_dim), self.ranks[self.s - 1], TAG_STRIDE * c
        if kind == "B" and not self.is_last:
            return (hi - lo, self.out_dim + self.shared_dim), self.ranks[self.s + 1], TAG_STRIDE * c + 2
        return None

    def _action_chunk(self, c: int) -> int:
        """The chunk id :meth:`forward_chunk` / :meth:`backward_chunk` work on for a schedule entry ``c``."""
        return c

    def _post(self, kind: str, c: int, e: int) -> None:
        """Post the receive of action ``(kind, c, e)`` now (if it has one and it is not posted yet).
        Receives are posted in stream order, and gloo matches them in that order per (source, tag)."""
        key = (kind, c, e)
        spec = None if key in self._posted else self._recv_spec(kind, c)
        if spec is not None:
            shape, src, tag = spec
            self._posted[key] = self.comm.irecv(shape, self.dtype, src, tag)

    def _receive(self, kind: str, c: int, e: int) -> Tensor:
        """The boundary tensor of action ``(kind, c, e)``: its pre-posted receive, or a receive posted now."""
        self._post(kind, c, e)
        return self.comm.wait_recv(self._posted.pop((kind, c, e)))

    def _make_agg(self, c: int, write: bool):
        """The per-unit aggregation callbacks for chunk ``c``: op ``j`` of unit ``i`` → :meth:`_chunk_op`."""

        def factory(i: int):
            counter = [0]
            kinds = self.model.units[i].aggregations

            def agg(h: Tensor, kind: str) -> Tensor:
                j = counter[0]
                counter[0] += 1
                if j >= len(kinds) or kinds[j] != kind:
                    raise ConfigError(f"unit {i} called aggregation {kind!r} as op {j}, but declares {kinds}")
                return self._chunk_op(i, j, kind, h, c, write)

            return agg

        return factory

    def _chunk_op(self, i: int, j: int, kind: str, h: Tensor, c: int, write: bool) -> Tensor:
        """Op ``j`` of unit ``i`` on chunk ``c``: the history-backed chunk aggregation (DESIGN §5)."""
        lo, hi = self.rows(c)
        a_c, at_c = self._chunk_adj[(kind, c)]
        return ChunkAggregate.apply(h, self.histories[(i, j)], a_c, at_c, lo, hi, write)

    def _run(self, c: int, h: Tensor, sh: Optional[Tensor], write: bool):
        return self.model.run_units(self.lo_unit, self.hi_unit, h, sh, self._make_agg(c, write))

    # ------------------------------------------------------------------ actions
    def forward_chunk(self, c: int, epoch: Optional[int] = None) -> None:
        e = self.epoch if epoch is None else epoch
        lo, hi = self.rows(c)
        if self.is_first:
            h_in, sh_in = self.x[lo:hi], None
        else:
            buf = self._receive("F", c, e)
            h_in = buf[:, : self.in_dim].clone().requires_grad_()
            sh_in = buf[:, self.in_dim :].clone().requires_grad_() if self.shared_dim else None
        rng = _rng_state(self.device) if self.recompute else None
        self.model.train()
        with torch.set_grad_enabled(not self.recompute):
            out, sh_out = self._run(c, h_in, sh_in, write=True)
        loss = None
        if self.is_last:
            if self.recompute:
                with torch.no_grad():
                    self._losses.setdefault(e, []).append(
                        float(masked_loss(out, self.y[lo:hi], self.train_mask[lo:hi], self.num_train)))
            else:
                loss = masked_loss(out, self.y[lo:hi], self.train_mask[lo:hi], self.num_train)
                self._losses.setdefault(e, []).append(float(loss.detach()))
        else:
            self.comm.isend(self._boundary(out, sh_out), self.ranks[self.s + 1], TAG_STRIDE * c, "layer")
        if self.recompute:
            self._saved[(e, c)] = (h_in, sh_in, None, None, None, rng, self.version)
            if self.stash and self.version not in self._stashed:
                self._stashed[self.version] = [p.detach().clone() for p in self._params()]
        else:
            self._saved[(e, c)] = (h_in, sh_in, out, sh_out, loss, None, self.version)
        for k in self.correctors:
            k.after_forward(e, c)

    def _params(self) -> list[Tensor]:
        return [p for i in self.units for p in self.model.units[i].parameters()]

    def backward_chunk(self, c: int, epoch: Optional[int] = None) -> None:
        e = self.epoch if epoch is None else epoch
        lo, hi = self.rows(c)
        h_in, sh_in, out, sh_out, loss, rng, version = self._saved.pop((e, c))
        if self.recompute:
            swap = self.stash and version != self.version
            if swap:  # weight stashing: recompute and differentiate at the weights the forward used
                current = [p.detach().clone() for p in self._params()]
                with torch.no_grad():
                    for p, w in zip(self._params(), self._stashed[version]):
                        p.copy_(w)
            cur = _rng_state(self.device)
            _set_rng_state(self.device, rng)
            out, sh_out = self._run(c, h_in, sh_in, write=False)
            _set_rng_state(self.device, cur)
            if self.is_last:
                loss = masked_loss(out, self.y[lo:hi], self.train_mask[lo:hi], self.num_train)
        if self.is_last:
            loss.backward()
        else:
            g = self._receive("B", c, e)
            tensors, grads = [out], [g[:, : self.out_dim]]
            if self.shared_dim and sh_out is not None and sh_out.requires_grad:
                tensors.append(sh_out)
                grads.append(g[:, self.out_dim :])
            torch.autograd.backward(tensors, grads)
        if not self.is_first:
            gh = h_in.grad if h_in.grad is not None else torch.zeros_like(h_in)
            if self.shared_dim:
                gs = sh_in.grad if sh_in.grad is not None else torch.zeros_like(sh_in)
                gh = torch.cat([gh, gs], 1)
            self.comm.isend(gh, self.ranks[self.s - 1], TAG_STRIDE * c + 2, "layer")
        if self.recompute and self.stash and swap:
            with torch.no_grad():
                for p, w in zip(self._params(), current):
                    p.copy_(w)
        if self.stash:
            live = {v for *_, v in self._saved.values()}
            for v in [v for v in self._stashed if v not in live and v != self.version]:
                del self._stashed[v]
        for k in self.correctors:
            k.after_backward(e, c)

    def step(self) -> None:
        """One optimizer step on the stage's accumulated gradients (a new weight version)."""
        self.optimizer.step()
        self.version += 1
        if not self.flush:  # gradients of the next epoch start accumulating right away
            self.optimizer.zero_grad(set_to_none=False)

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
        for k in self.correctors:
            if hasattr(k, "wants_refresh") and k.wants_refresh(e) and self.flush:
                self.refresh_history()
        for k in self.correctors:
            k.on_epoch_start(e)

    def train_epoch(self, epoch: int) -> dict:
        """Run this stage's actions of one epoch. Returns ``{"loss": …}`` (last stage: the epoch's loss,
        the sum of chunk losses = the full-batch mean loss over the training vertices; others: 0).

        Flush schedulers (gpipe, 1f1b): the epoch's schedule is built from this epoch's chunk order and
        run to the end. Non-flush schedulers (async-stale): a stream of several epochs is built with
        :meth:`~gnnpipe.schedulers.ChunkScheduler.build_epochs` and run up to this stage's ``STEP`` of
        ``epoch``; forwards of the next epoch that precede it run now, with the current weights.
        """
        self.epoch = epoch
        if self.flush:
            self.optimizer.zero_grad(set_to_none=False)
        if not self._stream:
            w = self._window(epoch)
            orders = [list(self.order_policy.order(epoch + i, self.num_chunks)) for i in range(w)]
            schedule = (self.scheduler.build(self.S, orders[0]) if self.flush
                        else self.scheduler.build_epochs(self.S, orders))
            self._stream = [(kind, c, epoch + (a_epoch or 0)) for kind, c, a_epoch in _actions(schedule, self.s)]
            self._stream.reverse()  # pop() from the end
        self._start_epoch(epoch)
        stepped = False
        while self._stream:
            kind, c, e = self._stream.pop()
            self._start_epoch(e)
            if self.prepost and self._stream and self._stream[-1][0] != "STEP":
                # post the next action's receive, so that its boundary tensor arrives while this one computes
                nk, nc, ne = self._stream[-1]
                self._post(nk, self._action_chunk(nc), ne)
            if kind == "F":
                self.forward_chunk(c, e)
            elif kind == "B":
                self.backward_chunk(c, e)
            elif kind == "STEP":
                self.step()
                if e == epoch:
                    stepped = True
                    break
        if not stepped:
            self.step()
        if not self._stream:
            self.comm.wait_sends()
            if self._saved:
                raise RuntimeError(f"stage {self.s}: chunks {sorted(self._saved)} were forwarded but never back-propagated")
        for k in self.correctors:
            k.on_epoch_end(epoch)
        self._started.discard(epoch)
        return {"loss": sum(self._losses.pop(epoch, []))}

    @torch.no_grad()
    def infer(self, capture: bool = False) -> Optional[Tensor]:
        """Exact full-graph inference through the stages (eval mode, ``Â`` itself, no history reads).

        With ``capture=True`` each op's exact input is written into ``H_in`` (a full refresh of history);
        otherwise history is untouched. Returns the logits ``[N, C]`` on the last stage, else ``None``.
        """
        self.model.eval()
        tag = TAG_STRIDE * self.num_chunks + 1
        N = self.data.num_nodes
        if self.is_first:
            h, sh = self.x, None
        else:
            buf = self.comm.recv((N, self.in_dim + self.shared_dim), self.dtype, self.ranks[self.s - 1], tag)
            h = buf[:, : self.in_dim]
            sh = buf[:, self.in_dim :] if self.shared_dim else None

        def factory(i: int):
            counter = [0]

            def agg(t: Tensor, kind: str) -> Tensor:
                if capture:
                    hist = self.histories[(i, counter[0])]
                    hist.ensure(t.size(1))
                    hist.H_in.copy_(t)
                counter[0] += 1
                return self.ops.aggregate(t, kind)

            return agg

        out, sh = self.model.run_units(self.lo_unit, self.hi_unit, h, sh, factory)
        return self._pass_on_inference(out, sh, tag)

    def _boundary(self, out: Tensor, sh: Optional[Tensor]) -> Tensor:
        """The stage-boundary payload: output rows with the shared tensor (e.g. GCNII's h0) on the right."""
        return torch.cat([out, sh], 1) if self.shared_dim else out

    def _pass_on_inference(self, out: Tensor, sh: Optional[Tensor], tag: int) -> Optional[Tensor]:
        """End of a stage's inference: send to the next stage (``None`` returned) or return the logits."""
        if self.is_last:
            return out
        self.comm.isend(self._boundary(out, sh), self.ranks[self.s + 1], tag, "eval")
        self.comm.wait_sends()
        return None

    def refresh_history(self) -> None:
        """Recompute every ``H_in`` exactly from the current weights (the ``refresh`` corrector)."""
        self.infer(capture=True)

    def evaluate(self) -> dict:
        """Exact evaluation; every rank of the pipeline gets the same metrics dict (broadcast from the last stage)."""

        logits = self.infer()
        obj = [accuracies(logits.cpu(), self.data) if self.is_last else None]
        dist.broadcast_object_list(obj, src=self.ranks[-1], group=self.eval_group)
        return obj[0]

    def history_bytes(self) -> int:
        return sum(h.nbytes for h in self.histories.values())

    def named_grads(self) -> dict[str, Tensor]:
        """Gradients of this stage's parameters, keyed by the full model's parameter names."""
        out = {}
        for i in self.units:
            for name, p in self.model.units[i].named_parameters():
                out[f"units.{i}.{name}"] = (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        return out


def make_optimizer_for(model: GNNModel, config: TrainConfig, units: range) -> torch.optim.Optimizer:
    """Adam over the given units' parameters (dense / conv weight decay as in :func:`make_optimizer`)."""
    groups = model.param_groups(config.weight_decay, config.weight_decay_conv, units=units)
    if not groups:  # a stage without parameters still needs a steppable optimizer
        groups = [{"params": [torch.nn.Parameter(torch.zeros(0))]}]
    return torch.optim.Adam(groups, lr=config.lr)


__all__ = ["PipelineStage", "make_optimizer_for", "peak_memory_bytes", "make_optimizer"]
