"""What every rank does around the epoch loop besides training: keep the best weights, log, checkpoint.

A :class:`RunSession` is built per rank around its executor (the single-process trainer, a pipeline
stage, a graph-parallel way or a hybrid member: anything with ``model`` and ``units``) and hands
:func:`~gnnpipe.core.run.loop.epoch_loop` its ``on_best`` and ``after_epoch`` hooks.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from ..comm import collective_device
from ..runtime.memory import peak_memory_bytes
from ..settings.config import TrainConfig
from ..settings.options import RunOptions
from ..settings.runfile import write_run_file
from . import stopping
from .checkpoint import Checkpointer, can_checkpoint, layout_of, load_checkpoint, read_meta
from .epochlog import EpochLogger
from .results import LoopState, Selection, TrainResult
from .state import executor_state


class RunSession:
    """Per-rank run helpers.

    The executor may name its CSV columns (``log_fields``) and, through the small interface of
    :mod:`gnnpipe.core.run.checkpoint`, what its checkpoints hold.

    Args:
        config: the run's configuration. options: its :class:`RunOptions` (``None``: defaults).
        executor: this rank's executor. lead: whether this rank logs (rank 0).
        rank, world: this rank and the world size (``1``: no process group).
        plan_info: the plan description (``RunPlan.info``; stored in checkpoints, compared on resume).

    Checkpoints (``options.checkpoint_dir``) are collective: every rank builds its session.
    """

    def __init__(self, config: TrainConfig, options: RunOptions | None, executor, *, lead: bool = True,
                 rank: int = 0, world: int = 1, plan_info: dict | None = None):
        self.config = config
        self.options = options or RunOptions()
        self.executor = executor
        self.rank, self.world, self.plan_info, self.lead = rank, world, plan_info or {}, lead
        self.best_state: dict[str, Tensor] | None = None
        self.loop_state = None
        self.read_s: float | None = None  # seconds this rank took to load the resumed checkpoint
        self.logger = None
        if lead and (self.options.log_every != 0 or self.options.log_csv or self.options.tensorboard
                     or self.options.log_every_steps):
            self.logger = EpochLogger(config.epochs, self.options.log_every, self.options.log_csv,
                                      self.options.tensorboard, fields=getattr(executor, "log_fields", None))
        self.hooks = [self.logger] if self.logger is not None else []
        self.checkpointer = None
        if self.options.checkpoint_dir:
            self.checkpointer = Checkpointer(self.options.checkpoint_dir, self.options.checkpoint_every, executor,
                                             config, self.plan_info, rank, world, self)
            self.hooks.append(self.checkpointer)
            if lead:  # the resolved configuration beside the checkpoints: gnnpipe train --config repeats the run
                write_run_file(config.to_dict(), Path(self.options.checkpoint_dir) / "config.toml")
        self.hooks.append(self._stop_if_requested)

    def _stop_if_requested(self, epoch: int, rec: dict, st) -> None:
        """After each epoch: if a signal asked to stop (:mod:`gnnpipe.core.run.stopping`; on any rank — all agree
        with one all-reduce), write the final checkpoint and raise ``KeyboardInterrupt``."""
        flag = stopping.requested()
        if self.world > 1:
            t = torch.tensor([1.0 if flag else 0.0], device=collective_device(getattr(self.executor, "device", "cpu")))
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # control traffic, not counted in the epoch's bytes
            flag = bool(t.item())
        if not flag or not can_checkpoint(self.executor):  # async-stale: at the end of the action stream
            return
        if self.checkpointer is not None:
            self.checkpointer.finish(st)
        raise KeyboardInterrupt(stopping.reason())

    def start_state(self):
        """The :class:`~gnnpipe.core.run.results.LoopState` to start from: epoch 0, or the checkpoint of
        ``options.resume`` loaded into the executor (:func:`~gnnpipe.core.run.checkpoint.load_checkpoint`)."""
        if self.options.resume:
            t0 = time.perf_counter()
            loop, best = load_checkpoint(self.options.resume, self.executor, self.rank, self.config, self.plan_info,
                                         self.world, warn=self.rank == 0)
            self.best_state = best if self.options.keep == "best" else None
            self.loop_state = LoopState.from_dict(loop, self.config)
            self.read_s = time.perf_counter() - t0
            meta = read_meta(self.options.resume)
            if meta.get("layout") != layout_of(self.config, self.plan_info) or meta.get("world") != self.world:
                # the epochs before ran in another layout: the summary's times and bytes are this layout's
                self.loop_state.result.extra["layout_from_epoch"] = self.loop_state.next_epoch
            if self.checkpointer is not None:
                self.checkpointer.last_saved = self.loop_state.position
            if self.lead and self.options.log_every != 0:
                k = self.loop_state.next_step
                inside = f" and {k} step(s) of epoch {self.loop_state.next_epoch + 1}" if k else ""
                print(f"resumed from {self.options.resume}: {self.loop_state.next_epoch} epoch(s){inside} done, "
                      f"training to {self.config.epochs} (read in {self.read_s:.1f} s)", file=sys.stderr)
        else:
            self.loop_state = LoopState(result=TrainResult(config=self.config.to_dict()))
        return self.loop_state

    def on_best(self, epoch: int) -> None:
        """``epoch_loop``'s ``on_best``: snapshot this rank's weights (``keep="best"`` only)."""
        if self.options.keep == "best":
            self.best_state = executor_state(self.executor)

    def final_state(self) -> dict[str, Tensor]:
        """This rank's weights to return: the best evaluation's (``keep="best"``, if any improved), else the current."""
        if self.options.keep == "best" and self.best_state is not None:
            return self.best_state
        return executor_state(self.executor)

    def finish(self) -> None:
        """After a completed loop: the final checkpoint (collective)."""
        if self.checkpointer is not None and self.loop_state is not None:
            self.checkpointer.finish(self.loop_state)

    def checkpoint_stats(self) -> dict | None:
        """``{"write_s": [seconds per checkpoint written], "read_s": seconds of the resume load}`` of this
        rank, or ``None`` when the run neither wrote nor read a checkpoint."""
        if self.checkpointer is None and self.read_s is None:
            return None
        return {"write_s": list(self.checkpointer.seconds) if self.checkpointer else [], "read_s": self.read_s}

    def annotate(self, result, plan_info: dict, device) -> None:
        """Put what every single-rank run reports into ``result.extra``: its ``plan``, the checkpoint timings
        (``checkpoint``, when any was written or read) and this process's ``peak_mem_bytes`` on ``device``."""
        result.extra["plan"] = plan_info
        stats = self.checkpoint_stats()
        if stats is not None:
            result.extra["checkpoint"] = {k: [v] for k, v in stats.items()}
        result.extra["peak_mem_bytes"] = [peak_memory_bytes(device)]

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()


class RecordCollector:
    """The launcher side of rank 0's epoch records: a pipe read by a background thread (so rank 0 never
    blocks on a full pipe), kept for the result of a run that is interrupted or fails.

    Usage: pass :attr:`send_end` to the worker (``records=``), :meth:`start`, and after the run
    :meth:`stop`; :attr:`records` holds what arrived.
    """

    def __init__(self):
        self.recv_end, self.send_end = mp.get_context("spawn").Pipe(duplex=False)
        self.records: list[dict] = []
        self._stop = False
        self._thread = None

    def _run(self) -> None:
        while not self._stop:
            try:
                if self.recv_end.poll(0.1):
                    self.records.append(self.recv_end.recv())
            except (EOFError, OSError):
                return

    def start(self) -> RecordCollector:
        self._thread = threading.Thread(target=self._run, name="gnnpipe-records", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            while self.recv_end.poll(0):
                self.records.append(self.recv_end.recv())
        except (EOFError, OSError):
            pass
        for c in (self.recv_end, self.send_end):
            c.close()
        return self.records


def partial_result(config: TrainConfig, records: list[dict], status: str, error: str | None = None,
                   selection=None):
    """A :class:`~gnnpipe.core.run.results.TrainResult` of the completed epochs ``records`` of a run that did not
    finish (``status`` ``"interrupted"`` or ``"failed"``), with the best-validation summary of those epochs
    (the rule of :func:`~gnnpipe.core.run.loop.epoch_loop`; ``selection``: its
    :class:`~gnnpipe.core.run.results.Selection`, default the highest validation accuracy)."""
    sel = selection if selection is not None else Selection()
    r = TrainResult(config=config.to_dict(), epochs=list(records), status=status, error=error)
    best = (-float("inf"), float("inf"))
    for rec in records:
        if sel.monitor in rec and sel.better(rec, best):
            best = sel.score(rec)
            sel.record(r, rec, rec["epoch"])
    if records:
        r.mean_epoch_time_s = sum(e["time_s"] for e in records) / len(records)
    return r
