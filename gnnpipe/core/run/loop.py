"""The epoch loop every kind of work runs: evaluation cadence, model selection, early stopping, the records of
each epoch, and a stop at an epoch boundary on a signal or a non-finite loss."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence

from ...errors import TrainingDivergedError
from ...progress import progress_bar
from ..settings.config import TrainConfig
from .results import LoopState, Selection, TrainResult

__all__ = ["diverged_message", "epoch_loop"]


def diverged_message(epoch: int, loss: float, config: TrainConfig) -> str:
    """The message of a run stopped by a non-finite training loss at ``epoch`` (0-based)."""
    lr = f"--lr {config.lr:g}" if config.lr is not None else "--lr"
    return (f"the training loss is {loss} at epoch {epoch + 1}; the run stopped there (the epochs before it are kept, "
            f"and the last checkpoint written before it, if any). Likely causes: input values too large for "
            f"{config.dtype} (scale the features or edge weights, or --dtype float64); a learning rate too high "
            f"(lower {lr}); a model option that makes the model unstable (--model-arg, more --layers than it "
            f"tolerates without residuals or normalisation). --nan-ok keeps training past a non-finite loss")


def _finish(result: TrainResult) -> TrainResult:
    """The mean epoch time: of the epochs in the run's last layout (a resumed run may have changed it)."""
    times = [e["time_s"] for e in result.epochs[result.extra.get("layout_from_epoch", 0):]]
    result.mean_epoch_time_s = sum(times) / len(times) if times else float("nan")
    return result


def epoch_loop(
    config: TrainConfig,
    train_epoch: Callable[[int], dict],
    evaluate: Callable[[], dict],
    *,
    progress: bool = True,
    desc: str = "train",
    state: LoopState | None = None,
    on_best: Callable[[int], None] | None = None,
    after_epoch: Sequence[Callable[[int, dict, LoopState], None]] = (),
    warn: bool = True,
    selection: Selection | None = None,
) -> TrainResult:
    """Run ``config.epochs`` epochs with evaluation every ``eval_every`` epochs and early stopping.

    Model selection: the reported test accuracy is the one of the evaluation with the best validation
    accuracy (ties broken by lower validation loss); ``selection`` may monitor another metric (S2EF: the
    lowest validation force MAE). Early stopping: training stops when ``patience``
    epochs (``0`` = never) pass in which neither the best monitored metric nor the lowest validation
    loss improved (the criterion of the GCNII reference code is the loss; deep models keep lowering it
    long after accuracy plateaus).

    Args:
        train_epoch: ``epoch → dict`` with at least ``loss``; other keys go into the epoch record.
        evaluate: ``() → dict`` as :func:`accuracies` (with at least ``val_loss`` and the monitored metric).
        state: continue from this state (a resumed run) instead of epoch 0.
        on_best: called with the epoch whenever an evaluation becomes the best one (to keep its weights).
        after_epoch: called after each epoch's record is appended (logging, checkpoints), in order.
        warn: warn when a resumed ``state`` has no epoch left to run (``False`` on every rank of a distributed
            run but rank 0, so the warning is printed once).

    Training by steps (S2EF ``--max-steps``; ``gnnpipe.tasks.s2ef.steps.StepLoop``): ``train_epoch`` may end
    the run inside an epoch, leaving ``state.next_step > 0`` (no record of that epoch; its checkpoint resumes at the
    next batch), or at the end of one with ``state.budget_spent`` (evaluated and recorded as the last epoch).

    Divergence: an epoch whose training loss is NaN or infinite stops the run before it is evaluated or recorded
    (no ``after_epoch`` hook sees it, so no checkpoint holds its weights), unless ``config.nan_ok``. In a
    distributed run the loss is the one every rank gathered, so all ranks stop at the same epoch.

    Raises:
        TrainingDivergedError: a non-finite training loss (message: :func:`diverged_message`).
        KeyboardInterrupt / Exception: as raised inside; the exception carries ``.result``, the
            :class:`TrainResult` of the epochs completed so far with ``status`` ``"interrupted"``
            (``KeyboardInterrupt``) or ``"failed"``.
    """
    sel = selection if selection is not None else Selection()
    st = state if state is not None else LoopState(result=TrainResult(config=config.to_dict()))
    result = st.result
    if st.next_epoch >= config.epochs and state is not None and warn:
        warnings.warn(f"nothing to train: the resumed run has already completed {st.next_epoch} epoch(s) and "
                      f"--epochs is {config.epochs}; raise --epochs to continue it", stacklevel=2)
    bar = progress_bar(range(st.next_epoch, config.epochs), enabled=progress, desc=desc,
                       leave=False,  # on a terminal only
                       initial=st.next_epoch, total=config.epochs)
    try:
        for epoch in bar:
            if sel.monitor in (result.epochs[-1] if result.epochs else {}) and config.patience \
                    and st.since > config.patience:
                break  # a resumed run that had already stopped early
            t0 = time.perf_counter()
            rec = {"epoch": epoch}
            rec.update(train_epoch(epoch))
            if st.next_step:  # the step budget or a stop ended the run inside this epoch: no epoch record
                break
            if not config.nan_ok and not math.isfinite(rec["loss"]):
                raise TrainingDivergedError(diverged_message(epoch, rec["loss"], config))
            rec.setdefault("time_s", time.perf_counter() - t0)
            if (epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1 or st.budget_spent:
                ev = evaluate()
                rec.update(ev)
                if sel.better(ev, st.best):
                    st.best = sel.score(ev)
                    sel.record(result, ev, epoch)
                    st.since = 0
                    if on_best is not None:
                        on_best(epoch)
                if ev["val_loss"] < st.best_loss:
                    st.best_loss = ev["val_loss"]
                    st.since = 0
                bar.set_postfix(loss=f"{rec['loss']:.4f}", val=f"{ev[sel.monitor]:.3f}", best=f"{abs(st.best[0]):.3f}")
            result.epochs.append(rec)
            if not getattr(config, "eval_every_steps", None) or sel.monitor in rec:
                st.since += 1  # epochs, or evaluations when the run evaluates by steps (--eval-every-steps)
            st.next_epoch = epoch + 1
            for fn in after_epoch:
                fn(epoch, rec, st)
            if st.budget_spent:  # the last step of the step budget (--max-steps) ended this epoch
                break
            if sel.monitor in rec and config.patience and st.since > config.patience:
                result.extra["early_stop"] = {"epoch": epoch, "patience": config.patience,
                                              "best_epoch": result.best_epoch}
                break
    except BaseException as exc:
        result.status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        if result.status == "failed":
            result.error = f"{type(exc).__name__}: {exc}"
        try:
            exc.result = _finish(result)  # type: ignore[attr-defined]
        except AttributeError:
            pass
        raise
    finally:
        bar.close()
    return _finish(result)
