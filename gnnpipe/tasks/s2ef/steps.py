"""Training by optimizer steps (S2EF): ``--max-steps``, ``--eval-every-steps``, ``--checkpoint-every-steps``, step
lines.

On a set of millions of structures an epoch is hours, so OC20-style training is counted in optimizer steps. A
:class:`StepLoop` rides inside the shared epoch loop (:func:`~gnnpipe.core.run.loop.epoch_loop`): the
trainer's ``train_epoch(epoch)`` calls :meth:`StepLoop.begin_epoch` (where to start: the resumed batch) and
:meth:`StepLoop.after_step` after each optimizer step, on every rank at the same steps (all its decisions follow
from the step count, the configuration and one all-reduced stop flag), so the collectives it triggers line up.

After step ``k`` (counted from 1 over the run):

* every ``--log-every-steps`` steps: a step record ``{"step", "epoch", "loss", "lr", "time_s"}`` (``loss``: that
  step's global-batch loss) in ``result.steps`` (the ``"steps"`` list of the results JSON), the CSV of
  ``--log-csv`` (a row with ``step`` set), TensorBoard (``step/…`` tags) and, off a terminal, a step line;
* every ``--eval-every-steps`` steps and at ``--max-steps``: an evaluation with the averaged weights of the first
  ``--val-size`` structures of the validation and test splits (``val_*`` / ``test_*`` in the step record; model
  selection and the best weights consider it, ``best_metrics["step"]`` saying which);
* every ``--checkpoint-every-steps`` steps, at ``--max-steps`` and on a stop signal: a checkpoint inside the epoch
  (``ckpt-EEEEEE-sSSSSSS``, :mod:`gnnpipe.core.run.checkpoint`) holding the loop state at the next batch and the
  epoch's sums so far (its step losses and metric sums), so a resumed run takes the same next batches — they are a
  pure function of ``(seed, epoch)`` (:func:`~gnnpipe.tasks.s2ef.data.epoch_batches`) — and its epoch record is
  the one of an uninterrupted run;
* at ``--max-steps`` the run ends: inside an epoch (no record of that epoch) or at its end (evaluated and recorded
  as the last epoch, ``LoopState.budget_spent``).

Epoch records, epoch lines and epoch checkpoints stay as they are.
"""

from __future__ import annotations

import math
import os
import time
import warnings

import torch
import torch.distributed as dist

from ...core.run import stopping
from ...core.run.loop import diverged_message
from ...core.settings.config import DEFAULT_VAL_SIZE
from ...errors import ConfigError, TrainingDivergedError
from ...progress import progress_bar

#: step lines of a ``--max-steps`` run without ``--log-every-steps``: every 10 % of the steps, at most this many apart
MAX_DEFAULT_LOG_EVERY_STEPS = 1000


def default_log_every_steps(max_steps: int | None, log_every: int | None) -> int:
    """The step-line cadence when ``--log-every-steps`` is not given: every 10 % of ``max_steps`` (at most
    :data:`MAX_DEFAULT_LOG_EVERY_STEPS` apart) when it is given and epoch lines are not off (``log_every = 0``);
    else ``0`` (no step lines)."""
    if not max_steps or log_every == 0:
        return 0
    return min(MAX_DEFAULT_LOG_EVERY_STEPS, max(1, max_steps // 10))


class StepLoop:
    """The step bookkeeping of one rank's S2EF executor (see the module docstring).

    Args:
        trainer: the rank's :class:`~gnnpipe.tasks.s2ef.trainer.S2EFTrainer` (any layout).
        options: the run's :class:`~gnnpipe.core.settings.options.RunOptions`.
        session: the rank's :class:`~gnnpipe.core.run.session.RunSession` (logger, checkpointer, best weights).
        state: the :class:`~gnnpipe.core.run.results.LoopState` the epoch loop runs on.
        selection: the model selection rule. lead: whether this rank reports (rank 0). progress: draw a step bar
            on a terminal (``--max-steps`` runs).
    """

    def __init__(self, trainer, options, session, state, selection, *, lead: bool, progress: bool):
        cfg = trainer.config
        self.tr, self.cfg, self.session, self.st, self.sel, self.lead = trainer, cfg, session, state, selection, lead
        self.max_steps = cfg.max_steps
        self.eval_every = cfg.eval_every_steps or 0
        self.val_size = cfg.val_size or DEFAULT_VAL_SIZE
        every = options.log_every_steps
        self.log_every = default_log_every_steps(cfg.max_steps, options.log_every) if every is None else every
        self.checkpointer = session.checkpointer
        self.ckpt_every = options.checkpoint_every_steps or 0
        #: watch the stop signal at every step (one all-reduce when distributed): runs that count steps
        self.watch = bool(cfg.max_steps or self.eval_every or self.ckpt_every)
        self.bar = None
        if lead and progress and cfg.max_steps:
            total = min(cfg.max_steps, cfg.epochs * trainer.steps_per_epoch)
            self.bar = progress_bar(total=total, initial=min(state.step, total), desc="steps", leave=False)
        self._mark = time.perf_counter()
        self.overhead_s = 0.0  # seconds of this epoch spent evaluating and checkpointing at steps
        self.resumed_time_s = 0.0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    # ------------------------------------------------------------------ the epoch loop's side
    def spent(self) -> bool:
        """Whether the step budget is spent before any step runs (a resumed run at or past ``--max-steps``)."""
        return self.max_steps is not None and self.st.step >= self.max_steps

    def begin_epoch(self, epoch: int) -> int:
        """The first batch of ``epoch`` to train: the resumed one (its sums restored into the executor), else 0."""
        st, tr = self.st, self.tr
        self.overhead_s, self.resumed_time_s = 0.0, 0.0
        self._mark = time.perf_counter()
        if epoch != st.next_epoch or not st.next_step:
            return 0
        part = st.partial or {}
        if part:
            tr.restore_partial(part)
            self.resumed_time_s = float(part.get("time_s", 0.0))
        st.partial = None
        return st.next_step

    def epoch_time(self, t0: float) -> float:
        """Training seconds of the epoch since ``t0`` (evaluations and checkpoints at steps excluded), with those
        of the part before a resume."""
        return time.perf_counter() - t0 - self.overhead_s + self.resumed_time_s

    def _stop_requested(self) -> bool:
        flag = stopping.requested()
        if self.tr.world > 1:
            t = torch.tensor([1.0 if flag else 0.0])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # control traffic: every rank stops at the same step
            flag = bool(t.item())
        return flag

    def after_step(self, epoch: int, j: int, n: int, t0: float) -> bool:
        """After batch ``j`` of the ``n`` of ``epoch`` (``t0``: when the epoch's training started): count the step,
        record, evaluate, checkpoint as due. Returns ``True`` when the run ends inside the epoch (``--max-steps``, or
        ``--patience`` evaluations at steps without a better one: ``result.extra["early_stop"]`` says where).

        Raises:
            KeyboardInterrupt: a stop signal (after the checkpoint, when checkpoints are written).
            TrainingDivergedError: a non-finite loss at a recorded step (unless ``--nan-ok``).
        """
        st, tr, cfg = self.st, self.tr, self.cfg
        st.step += 1
        st.next_step = j + 1
        k = st.step
        if self.bar is not None:
            self.bar.update(1)
        ends_epoch = j + 1 == n
        last = self.max_steps is not None and k >= self.max_steps
        log = bool(self.log_every) and k % self.log_every == 0
        evaluate = (bool(self.eval_every) and k % self.eval_every == 0) or (last and not ends_epoch)
        ckpt = self.checkpointer is not None and bool(self.ckpt_every) and k % self.ckpt_every == 0
        stop = self.watch and self._stop_requested()
        if last and ends_epoch:
            st.budget_spent = True
        early = False
        if log or evaluate or ckpt or last or stop:
            t_rec = time.perf_counter()
            tr.flush_losses()  # collective in a pipeline
            loss = tr.epoch_losses[-1]
            if not cfg.nan_ok and not math.isfinite(loss):
                raise TrainingDivergedError(f"step {k}: " + diverged_message(epoch, loss, cfg))
            if log or evaluate:
                self._record(epoch, k, loss, evaluate, t_rec)
            # --patience counts evaluations when they are by steps: the run ends at the evaluation that exhausts it
            early = evaluate and bool(self.eval_every) and bool(cfg.patience) and st.since > cfg.patience
            if early:
                st.result.extra["early_stop"] = {"step": k, "epoch": epoch, "patience": cfg.patience,
                                                 "unit": "evaluations", "best_step": st.result.best_metrics.get("step")}
                if ends_epoch:
                    st.budget_spent = True  # the epoch loop records this epoch and stops
            if not ends_epoch and self.checkpointer is not None and (ckpt or last or stop or early):
                st.partial = tr.partial_state(self.epoch_time(t0))  # collective: the epoch's sums so far
                self.checkpointer.save(st)
                st.partial = None
            elif ends_epoch and ckpt:
                self.checkpointer.pending = True  # the epoch-end hook writes it at the epoch boundary
            self.overhead_s += time.perf_counter() - t_rec
            self._mark = time.perf_counter()
            if stop and not ends_epoch:  # at an epoch's end the session's stop hook writes the checkpoint
                raise KeyboardInterrupt(stopping.reason())
        if ends_epoch:
            st.next_step = 0
            return False
        return last or early

    def _record(self, epoch: int, k: int, loss: float, evaluate: bool, t_rec: float) -> None:
        st, tr = self.st, self.tr
        rec = {"step": k, "epoch": epoch, "loss": loss, "lr": tr.lr, "time_s": t_rec - self._mark}
        if evaluate:  # the epoch's training sums and bytes stay the training steps' alone
            kept = tr.metrics
            counters = [(c, c.bytes.copy(), c.comm_s, c.idle_s) for c in tr.comms()]
            try:
                ev = tr.evaluate(size=self.val_size)
            finally:
                tr.metrics = kept
                for c, b, cs, idle in counters:
                    c.bytes, c.comm_s, c.idle_s = b, cs, idle
                tr.model.train()
            n = min(self.val_size, len(tr.splits["val"]))
            rec.update(ev, val_size=n)
            if self.sel.better(ev, st.best):
                st.best = self.sel.score(ev)
                self.sel.record(st.result, ev, epoch)
                st.result.best_metrics.update(step=k, val_size=n)
                self.session.on_best(epoch)
                st.since = 0
            else:
                st.since += 1  # --patience counts evaluations when they are by steps
        st.result.steps.append(rec)
        logger = self.session.logger
        if self.lead and logger is not None:
            line = (bool(self.log_every) and k % self.log_every == 0) or evaluate
            logger.step(rec, self.max_steps, line=line)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", **({"val": f"{rec['val_force_mae']:.3f}"}
                                                        if "val_force_mae" in rec else {}))


def check_steps(config, splits: dict, options=None) -> None:
    """Refuse step settings that cannot run, before any process starts; warn of a ``--max-steps`` beyond
    ``--epochs``.

    Raises:
        ConfigError: ``--eval-every-steps`` with an empty validation split.
    """
    n_val, n_train = len(splits["val"]), len(splits["train"])
    if config.eval_every_steps and n_val == 0:
        raise ConfigError(f"--eval-every-steps {config.eval_every_steps} needs validation data, and the validation "
                          f"split is empty ({n_train + n_val + len(splits['test'])} structures); give a larger set "
                          f"or drop --eval-every-steps")
    lead = os.environ.get("RANK", "0") == "0"  # said once, also under torchrun
    if config.val_size is not None and not (config.eval_every_steps or config.max_steps) and lead:
        warnings.warn(f"ignored: --val-size {config.val_size} (it sizes the evaluations at steps, of "
                      f"--eval-every-steps and --max-steps; the epoch evaluations read the whole validation split)",
                      stacklevel=3)
    if config.max_steps and lead:
        spe = max(math.ceil(n_train / (config.batch_size * config.replicas)), 1)
        if config.max_steps > config.epochs * spe:
            warnings.warn(f"--max-steps {config.max_steps} exceeds the {config.epochs * spe} steps of --epochs "
                          f"{config.epochs} ({spe} per epoch): the run ends after {config.epochs} "
                          f"epoch{'s' if config.epochs != 1 else ''}; raise --epochs to train {config.max_steps} steps",
                          stacklevel=3)
