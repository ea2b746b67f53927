"""The result of a training run: per-epoch records and the summary the CLI prints and ``--out`` writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs


@attrs.define
class TrainResult:
    """What a run returns (the Python API) and writes as JSON (``gnnpipe train --out FILE``).

    Attributes:
        config: the full resolved configuration (a dict of :class:`~gnnpipe.core.settings.config.TrainConfig`).
        epochs: one record per epoch: ``epoch``, ``loss``, ``time_s`` (seconds of training, evaluation
            excluded) and, in evaluated epochs, ``train_acc``, ``val_acc``, ``test_acc``, ``val_loss``;
            distributed runs add ``bytes_layer``, ``bytes_graph``, ``bytes_weight`` (bytes sent in the
            epoch summed over ranks) and the time split ``compute_s``, ``comm_s``, ``idle_s`` (max over ranks).
        best_val_acc: best validation accuracy (fraction in [0, 1]).
        test_acc_at_best_val: test accuracy in the evaluation of best validation accuracy.
        best_epoch: epoch of that evaluation, counted from 0 (the summary and the epoch lines count from 1).
        mean_epoch_time_s: mean of ``time_s`` over epochs.
        extra: executor-specific fields (plan, ``peak_mem_bytes`` per rank, per-rank time splits, …).
        best_metrics: kinds of work selected on another metric than the validation accuracy (S2EF: the
            validation force MAE): the evaluation record of the best epoch (``val_*`` and ``test_*`` metrics,
            e.g. ``test_energy_mae`` in eV, ``test_force_mae`` in eV/Å); empty for node classification.
        status: ``"completed"``, ``"interrupted"`` (SIGINT/SIGTERM: the epochs completed so far) or
            ``"failed"`` (a rank failed; ``error`` says how).
        model: the trained single-process :class:`~gnnpipe.models.GNNModel` (weights of the best-validation
            epoch by default, see ``RunOptions.keep``); not part of ``to_dict``. ``None`` for
            interrupted and failed runs.
        steps: step records of a run that trains by steps (S2EF ``--max-steps``, ``--eval-every-steps``,
            ``--log-every-steps``): ``step`` (optimizer steps done, counted from 1), ``epoch`` (the epoch in
            progress, from 0), ``loss`` (of that step's global batch), ``lr``, ``time_s`` (training seconds since
            the previous step record) and, at evaluations, the ``val_*`` / ``test_*`` metrics of the
            ``val_size`` structures evaluated; written as ``"steps"`` when there are any.
    """

    config: dict
    epochs: list[dict] = attrs.field(factory=list)
    best_val_acc: float = float("nan")
    test_acc_at_best_val: float = float("nan")
    best_epoch: int = -1
    mean_epoch_time_s: float = float("nan")
    extra: dict = attrs.field(factory=dict)
    best_metrics: dict = attrs.field(factory=dict)
    status: str = "completed"
    error: str | None = None
    model: Any = attrs.field(default=None, eq=False, repr=False)
    steps: list[dict] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "config": self.config,
            "best_val_acc": self.best_val_acc,
            "test_acc_at_best_val": self.test_acc_at_best_val,
            "best_epoch": self.best_epoch,
            "mean_epoch_time_s": self.mean_epoch_time_s,
            "epochs": self.epochs,
            "status": self.status,
        }
        if self.best_metrics:  # a regression task: no accuracies to report
            d.pop("best_val_acc")
            d.pop("test_acc_at_best_val")
            d["best_metrics"] = self.best_metrics
        if self.error is not None:
            d["error"] = self.error
        if self.steps:
            d["steps"] = self.steps
        d.update(self.extra)
        return d

    def save(self, path: str | Path) -> None:
        """Write ``to_dict`` as JSON (NaN written as ``null``)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(json_safe(self.to_dict()), indent=1))

    def summary(self) -> str:
        """A short human-readable summary."""
        if self.best_metrics:
            lines = _regression_lines(self.best_metrics, self.best_epoch)
        elif self.config.get("task") == "s2ef":  # a regression run that never evaluated a validation set
            lines = ["best val              none: no validation structures (the last weights are kept; give a "
                     "larger set or --val-dataset)"]
        else:
            lines = [
            f"best val acc          {_pct(self.best_val_acc)}"
            + (f" (epoch {self.best_epoch + 1}, counted from 1 as the epoch lines)" if self.best_epoch >= 0 else ""),
                f"test acc at best val  {_pct(self.test_acc_at_best_val)}",
            ]
        n = len(self.epochs)
        if self.steps:
            lines.append(f"optimizer steps       {self.steps[-1]['step']:,}")
        since = min(int(self.extra.get("layout_from_epoch", 0)), n)
        if n - since:
            lines.append(f"mean epoch time       {self.mean_epoch_time_s * 1000:.1f} ms over {n - since} epoch"
                         f"{'' if n - since == 1 else 's'}"
                         + (f" in this layout (the {since} before the resume ran in another)" if since else ""))
        else:  # --max-steps inside the first epoch, or stopped in it: no mean of nothing ("nan ms over 0 epochs")
            lines.append("mean epoch time       none (no epoch completed)")
        for key, label in (("bytes_layer", "layer-level"), ("bytes_graph", "graph-level"),
                           ("bytes_weight", "weight sync"), ("bytes_gp", "gp groups")):
            last = self.epochs[-1].get(key) if self.epochs else None  # the last epoch's layout (a resumed run may
            if last:                                                    # have changed it)
                lines.append(f"bytes/epoch {label:<11} {last:,}")
        if "early_stop" in self.extra:
            es = self.extra["early_stop"]
            what = "force MAE" if self.best_metrics else "accuracy"
            if es.get("unit") == "evaluations":
                lines.append(f"stopped early         at step {es['step']:,}: no better validation {what} in "
                             f"{es['patience']} evaluations (--patience)")
            else:
                lines.append(f"stopped early         after epoch {es['epoch'] + 1}: no better validation {what} or "
                             f"loss for {es['patience']} epochs (--patience)")
        if "peak_mem_bytes" in self.extra:
            mem = ", ".join(f"{m / 2**20:.0f}" for m in self.extra["peak_mem_bytes"])
            lines.append(f"peak memory per rank  {mem} MiB")
        return "\n".join(lines)


@attrs.define
class LoopState:
    """Where :func:`epoch_loop` stands: everything it needs to continue (part of a checkpoint).

    Attributes:
        result: the records so far. next_epoch: the first epoch still to run.
        best: ``(score, val_loss)`` of the best evaluation (score: :meth:`Selection.score`, higher is better).
            best_loss: lowest validation loss.
        since: epochs since either improved (early stopping counter).
        next_step: optimizer steps of epoch ``next_epoch`` already done (``0`` at an epoch boundary; a checkpoint
            written inside an epoch resumes at its next batch). step: optimizer steps done in all.
        partial: what the epoch in progress has summed so far (``next_step > 0``): the kind of work's own record
            (S2EF: its step losses and metric sums, ``gnnpipe.tasks.s2ef.steps.StepLoop``).
        budget_spent: the step budget (``--max-steps``) ended the run (not stored: a resumed run decides anew).
    """

    result: TrainResult
    next_epoch: int = 0
    best: tuple = (-float("inf"), float("inf"))
    best_loss: float = float("inf")
    since: int = 0
    next_step: int = 0
    step: int = 0
    partial: dict | None = None
    budget_spent: bool = False

    @property
    def position(self) -> tuple[int, int]:
        """``(next_epoch, next_step)``: where the run stands (what a checkpoint's name encodes)."""
        return self.next_epoch, self.next_step

    def to_dict(self) -> dict:
        r = self.result
        return {"next_epoch": self.next_epoch, "best": list(self.best), "best_loss": self.best_loss,
                "since": self.since, "epochs": r.epochs, "best_val_acc": r.best_val_acc,
                "test_acc_at_best_val": r.test_acc_at_best_val, "best_epoch": r.best_epoch,
                "best_metrics": r.best_metrics, "next_step": self.next_step, "step": self.step,
                "partial": self.partial, "steps": r.steps,
                "layout_from_epoch": int(r.extra.get("layout_from_epoch", 0))}

    @classmethod
    def from_dict(cls, d: dict, config) -> LoopState:
        r = TrainResult(config=config.to_dict(), epochs=[dict(e) for e in d["epochs"]],
                        best_val_acc=d["best_val_acc"], test_acc_at_best_val=d["test_acc_at_best_val"],
                        best_epoch=d["best_epoch"], best_metrics=dict(d.get("best_metrics") or {}),
                        steps=[dict(s) for s in d.get("steps") or []])
        if d.get("layout_from_epoch"):
            r.extra["layout_from_epoch"] = int(d["layout_from_epoch"])
        return cls(result=r, next_epoch=d["next_epoch"], best=tuple(d["best"]), best_loss=d["best_loss"],
                   since=d["since"], next_step=int(d.get("next_step", 0)), step=int(d.get("step", 0)),
                   partial=d.get("partial"))


@attrs.define(frozen=True)
class Selection:
    """Which evaluation is the best one (model selection and early stopping of
    :func:`~gnnpipe.core.run.loop.epoch_loop`): the highest (``mode="max"``) or lowest (``"min"``) ``monitor`` of
    an evaluation record, ties broken by the lower ``val_loss``.

    Node classification monitors ``val_acc`` (``max``) and reports ``best_val_acc`` / ``test_acc_at_best_val``;
    any other monitor (S2EF: ``val_force_mae``, ``min``) keeps the whole evaluation record of the best epoch in
    :attr:`TrainResult.best_metrics`.
    """

    monitor: str = "val_acc"
    mode: str = "max"

    def score(self, ev: dict) -> tuple[float, float]:
        """``(score, val_loss)``: the first higher is better, the second lower is better."""
        v = float(ev[self.monitor])
        return (v if self.mode == "max" else -v), float(ev["val_loss"])

    def better(self, ev: dict, best: tuple) -> bool:
        s, loss = self.score(ev)
        return (s, -loss) > (best[0], -best[1])

    def record(self, result: TrainResult, ev: dict, epoch: int) -> None:
        """Write the best evaluation ``ev`` of ``epoch`` into ``result``."""
        result.best_epoch = epoch
        if self.monitor == "val_acc":
            result.best_val_acc = ev["val_acc"]
            result.test_acc_at_best_val = ev["test_acc"]
        else:
            result.best_metrics = {k: v for k, v in ev.items() if k.startswith(("val_", "test_", "train_"))}


#: (key, label, unit, scale) of the regression metrics the summary prints
_REGRESSION = (("energy_mae", "energy MAE", "eV", 1.0), ("energy_mae_per_atom", "energy MAE/atom", "meV", 1000.0),
               ("force_mae", "force MAE", "eV/Å", 1.0), ("force_cos", "force cosine", "", 1.0),
               ("efwt", "EFwT", "%", 100.0), ("stress_mae", "stress MAE", "meV/Å³", 1000.0))


def _regression_lines(best: dict, epoch: int) -> list[str]:
    at = f" (epoch {epoch + 1}, counted from 1 as the epoch lines)" if epoch >= 0 else ""
    if "step" in best:  # selected at a step evaluation (S2EF --eval-every-steps / --max-steps)
        at = f" (step {best['step']:,}, {best.get('val_size', '?')} validation structures)"
    lines = []
    others = sorted({k[: -len("_force_mae")] for k in best if k.startswith("val_") and k.endswith("_force_mae")}
                    - {"val"})
    for split in ("val", *others, "test"):
        parts = [f"{label} {best[f'{split}_{k}'] * scale:.4g}{(' ' + unit) if unit else ''}"
                 for k, label, unit, scale in _REGRESSION
                 if f"{split}_{k}" in best and not (isinstance(best[f"{split}_{k}"], float)
                                                    and math.isnan(best[f"{split}_{k}"]))]
        if parts:
            head = {"val": "best val", "test": "test at best val"}.get(split, f"{split} at best val")
            lines.append(f"{head:<21} " + ", ".join(parts) + (at if split == "val" else ""))  # a long name too
    return lines or ["no evaluation"]


def _pct(v: float | None) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f} %"


def json_safe(o):
    """``o`` with NaN/inf floats replaced by ``None`` and dict keys made strings (strict JSON)."""
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if isinstance(o, dict):
        return {str(k): json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o
