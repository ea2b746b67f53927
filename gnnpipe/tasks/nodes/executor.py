"""The node-classification executor: the schedule interpreter with staleness correctors, history refreshes and exact
inference through the stages.

:class:`NodeExecutor` adds to :class:`~gnnpipe.core.runtime.execute.Executor` what GNNPipe's training needs around
the actions: the correctors' hooks (``on_epoch_start`` / ``after_forward`` / ``after_backward`` /
``on_epoch_end``, and the ``wants_refresh`` full refresh of history before an epoch), the epoch windows of
non-flush schedulers (async-stale: several epochs as one action stream up to the next evaluation), and exact
inference (:meth:`NodeExecutor.infer`: each stage runs ``stage.infer_units`` on its inference rows and passes the
result on), from which evaluation computes the accuracies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ...core.comm import Comm
from ...core.runtime.execute import Executor
from ...correctors import Corrector, StageContext
from .metrics import accuracies, gather_accuracies
from .stage import Stage

__all__ = ["NodeExecutor"]


class NodeExecutor(Executor):
    """One rank of a node-classification run (pipeline, graph-parallel and hybrid alike).

    Args:
        stage: the compute of this rank. config: the resolved configuration (epochs, evaluation cadence for
            non-flush windows, the seed the correctors draw from).
        num_stages, ranks, chunks, scheduler, order_policy, comm, sync_grads: as
            :class:`~gnnpipe.core.runtime.execute.Executor`.
        correctors: corrector instances (fresh objects per rank).
        data: the relabelled graph (labels and masks for evaluation).
        chunk_ptr: ``LongTensor[C+1]``, the global chunk layout (the correctors' :class:`StageContext` gets it).
        peer_chunks: ``c → [global chunks]`` whose rows the ops just exchanged with peers (hybrid): the
            correctors' chunk hooks fire for them too, and forwards add them to ``ctx.fresh_chunks``.
        eval_group: process group of this pipeline's ranks (pipeline evaluation broadcast).
        inference_rows: the global rows ``(lo, hi)`` this rank's pipeline infers (``None``: all rows, and the
            last stage computes the metrics for everyone; else metrics are gathered from every rank).
        eval_tag: tag of the inference boundary tensors.
    """

    def __init__(self, stage: Stage, *, config, num_stages: int, ranks: Sequence[int], chunks: Sequence[int],
                 scheduler, order_policy, correctors: list[Corrector], comm: Comm, data, chunk_ptr: Tensor,
                 sync_grads: Callable[[], None] | None = None,
                 peer_chunks: Callable[[int], list[int]] | None = None, eval_group=None,
                 inference_rows: tuple[int, int] | None = None, eval_tag: int = 0):
        super().__init__(stage, num_stages=num_stages, ranks=ranks, chunks=chunks, scheduler=scheduler,
                         order_policy=order_policy, comm=comm, sync_grads=sync_grads, window=self._eval_window)
        self.config = config
        self.correctors = correctors
        self.data = data
        self.peer_chunks = peer_chunks
        self.eval_group = eval_group
        self.inference_rows = inference_rows
        self.eval_tag = eval_tag
        #: what the correctors see of this stage (global chunk structure)
        self.ctx = StageContext(stage=stage.s, num_stages=num_stages, histories=list(stage.histories.values()),
                                chunk_ptr=chunk_ptr.cpu(), seed=config.seed)
        for k in self.correctors:
            k.setup(self.ctx)

    def history_bytes(self) -> int:
        return self.stage.history_bytes()

    def named_grads(self) -> dict[str, Tensor]:
        return self.stage.named_grads()

    # ------------------------------------------------------------------ around the actions
    def _eval_window(self, epoch: int) -> int:
        """A non-flush stream runs up to the next evaluation (exact inference through all stages is a barrier)."""
        k = self.config.eval_every
        return min(k - epoch % k, self.config.epochs - epoch)

    def train_epoch(self, epoch: int) -> dict:
        self.ctx.fresh_chunks.clear()
        return super().train_epoch(epoch)

    def before_epoch(self, epoch: int) -> None:
        if self.flush and any(k.wants_refresh(epoch) for k in self.correctors):
            self.infer(capture=True)
        for k in self.correctors:
            k.on_epoch_start(epoch)

    def _with_peers(self, c: int) -> list[int]:
        return [c] + (self.peer_chunks(c) if self.peer_chunks else [])

    def after_forward(self, c: int, epoch: int) -> None:
        for p in self._with_peers(c):
            if p != c:
                self.ctx.fresh_chunks.add(p)
            for k in self.correctors:
                k.after_forward(epoch, p)

    def after_backward(self, c: int, epoch: int) -> None:
        for p in self._with_peers(c):
            for k in self.correctors:
                k.after_backward(epoch, p)

    def after_epoch(self, epoch: int) -> None:
        for k in self.correctors:
            k.on_epoch_end(epoch)

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def infer(self, capture: bool = False) -> Tensor | None:
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
