"""Learning curves of one training run: ``gnnpipe report result.json`` of a ``gnnpipe train --out`` result.

A run's records are its epochs (``result["epochs"]``: ``epoch`` counted from 0, ``loss``, ``lr``, the ``val_*``
metrics of its evaluations) and, for a run that trains by steps (S2EF ``--max-steps``, ``--eval-every-steps``,
``--log-every-steps``), its step records (``result["steps"]``: ``step`` counted from 1, ``epoch``, ``loss`` of that
step, ``lr``, and the ``val_*`` metrics of the first ``val_size`` validation structures at evaluated steps).

Drawn against optimizer steps when the run has step records, else against epochs (counted from 1, as the run's
lines count them):

* S2EF: the training loss (and the validation loss), the validation energy MAE and force MAE of every validation
  set the records carry — the first set's ``val_energy_mae`` / ``val_force_mae`` and any other's
  ``val_<name>_energy_mae`` / ``val_<name>_force_mae`` — with the training split's MAEs where the epoch records
  have them, and the learning rate. In a run by steps, the epoch-end evaluations (the whole validation split) are
  drawn at the epoch's last step too, where the steps per epoch are known (the run's plan);
* node classification: the training and validation losses, the training, validation and test accuracies, and the
  learning rate where the records carry it.

``curves.png`` (matplotlib; without it the table alone, and a line saying so) and ``report.md``: a table of the
evaluated points (step, epoch, loss, lr and each validation set's metrics), the best one marked.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..errors import ConfigError
from .report import Report, _colors, _plt, steps_per_epoch

#: an extra validation set's metric keys: ``val_<name>_energy_mae``, ``val_<name>_force_mae`` (the first set's carry
#: no name)
VAL_KEY = re.compile(r"^val_(?:(?P<name>.+?)_)?(?P<metric>energy_mae|force_mae)$")

#: the name the first validation set is drawn under
FIRST_SET = "val"

#: what the report says when matplotlib is missing
NO_MATPLOTLIB = ("no plot: matplotlib is not installed (pip install 'gnnpipe[plot]'); the table holds the evaluated "
                 "points")


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return None if math.isnan(v) or math.isinf(v) else v


def training_result(path: str | Path) -> dict | None:
    """The result of ``path`` when it is one training run's result (a JSON object with ``config`` and ``epochs``, as
    ``gnnpipe train --out`` writes it), else ``None``."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if isinstance(doc, dict) and isinstance(doc.get("config"), dict) and isinstance(doc.get("epochs"), list):
        return doc
    return None


def is_s2ef(result: dict) -> bool:
    """Whether ``result`` is an S2EF run (energies and forces) rather than node classification."""
    if result.get("best_metrics"):
        return True
    return any(VAL_KEY.match(k) for r in (result.get("epochs") or []) + (result.get("steps") or []) for k in r)


def validation_sets(records: list[dict]) -> list[str]:
    """The validation sets the records report, in order of first appearance: :data:`FIRST_SET` for the keys
    ``val_energy_mae`` / ``val_force_mae``, ``<name>`` for ``val_<name>_energy_mae`` / ``val_<name>_force_mae``."""
    names: list[str] = []
    for r in records:
        for k in r:
            m = VAL_KEY.match(k)
            if m is None or _num(r[k]) is None:
                continue
            name = m["name"] or FIRST_SET
            if name not in names:
                names.append(name)
    return sorted(names, key=lambda n: (n != FIRST_SET, names.index(n)))


def val_key(name: str, metric: str) -> str:
    """The record key of ``metric`` (``energy_mae``, ``force_mae``) of validation set ``name``."""
    return f"val_{metric}" if name == FIRST_SET else f"val_{name}_{metric}"


def _steps_per_epoch(result: dict) -> int | None:
    return steps_per_epoch(result)


def curve_points(result: dict) -> dict:
    """The series to draw and the evaluated points to tabulate of one run.

    Returns:
        dict: ``unit`` (``"step"`` or ``"epoch"``), ``s2ef`` (bool), ``sets`` (validation set names), ``records``
        (the records drawn, each with ``x``: its step, or its epoch counted from 1; in a run by steps, epoch-end
        evaluations placed at their epoch's last step with ``epoch_end`` True), ``evaluated`` (those with a
        validation metric, in ``x`` order).
    """
    epochs = [dict(r) for r in result.get("epochs") or [] if isinstance(r, dict)]
    steps = [dict(r) for r in result.get("steps") or [] if isinstance(r, dict)]
    s2ef = is_s2ef(result)
    if steps:
        unit = "step"
        records = [{**r, "x": int(r["step"])} for r in steps if _num(r.get("step")) is not None]
        spe = _steps_per_epoch(result)
        last = max((r["x"] for r in records), default=0)
        if spe:
            for r in epochs:
                if _num(r.get("epoch")) is None:
                    continue
                x = (int(r["epoch"]) + 1) * spe
                if x <= last and any(k.startswith("val_") for k in r):
                    kept = {k: v for k, v in r.items() if k.startswith(("val_", "train_")) or k == "epoch"}
                    records.append({**kept, "x": x, "epoch_end": True})
        records.sort(key=lambda r: (r["x"], bool(r.get("epoch_end"))))
    else:
        unit = "epoch"
        records = [{**r, "x": int(r["epoch"]) + 1} for r in epochs if _num(r.get("epoch")) is not None]
    sets = validation_sets(records) if s2ef else []
    if s2ef:
        evaluated = [r for r in records if any(_num(r.get(val_key(n, m))) is not None for n in sets
                                               for m in ("energy_mae", "force_mae"))]
    else:
        evaluated = [r for r in records if _num(r.get("val_acc")) is not None]
    return {"unit": unit, "s2ef": s2ef, "sets": sets, "records": records, "evaluated": evaluated}


def _best(points: dict) -> dict | None:
    """The evaluated point of lowest first-set validation force MAE (S2EF) or highest validation accuracy."""
    if points["s2ef"]:
        if not points["sets"]:
            return None
        key = val_key(points["sets"][0], "force_mae")
        cand = [r for r in points["evaluated"] if _num(r.get(key)) is not None]
        if not cand:
            key = val_key(points["sets"][0], "energy_mae")
            cand = [r for r in points["evaluated"] if _num(r.get(key)) is not None]
        return min(cand, key=lambda r: r[key]) if cand else None
    cand = [r for r in points["evaluated"] if _num(r.get("val_acc")) is not None]
    return max(cand, key=lambda r: r["val_acc"]) if cand else None


def _fmt(v, scale: float = 1.0, digits: int = 4) -> str:
    v = _num(v)
    return "–" if v is None else f"{scale * v:.{digits}f}"


def _fmt_g(v) -> str:
    v = _num(v)
    return "–" if v is None else f"{v:.3g}"


def run_title(result: dict) -> str:
    cfg = result.get("config") or {}
    model = cfg.get("model") or "model"
    ds = cfg.get("dataset")
    ds = Path(str(ds)).name if ds else ("oc20-like" if is_s2ef(result) else "data")
    return f"{model} on {ds}"


def curves_markdown(result: dict, points: dict, *, title: str = "", source: str = "", plots: list | None = None,
                    note: str = "") -> str:
    """The markdown of a run's curves: what was drawn, and a table of the evaluated points (best marked)."""
    unit, s2ef, sets = points["unit"], points["s2ef"], points["sets"]
    lines = [f"# {title or run_title(result)}", ""]
    if source:
        lines.append(f"Learning curves of `{source}` against {'optimizer steps' if unit == 'step' else 'epochs'}"
                     f" ({len(points['records'])} records, {len(points['evaluated'])} evaluated"
                     + ("; epochs counted from 1" if unit == "epoch" else "") + ").")
        lines.append("")
    if note:
        lines += [note, ""]
    best = _best(points)
    with_lr = any(_num(r.get("lr")) is not None for r in points["records"])
    head = (["step"] if unit == "step" else []) + ["epoch", "loss"] + (["lr"] if with_lr else [])
    if s2ef:
        for n in sets:
            head += [f"{n} energy MAE (meV)", f"{n} force MAE (eV/Å)"]
        if unit == "step":
            head.append("evaluated on")
    else:
        head += ["val loss", "train acc %", "val acc %", "test acc %"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join("--:" for _ in head) + "|"]
    for r in points["evaluated"]:
        ep = _num(r.get("epoch"))
        row = ([str(r["x"])] if unit == "step" else []) + [str(int(ep) + 1) if ep is not None else "–"]
        row.append(_fmt(r.get("loss")) if not r.get("epoch_end") else "–")
        if with_lr:
            row.append(_fmt_g(r.get("lr")))
        if s2ef:
            for n in sets:
                row += [_fmt(r.get(val_key(n, "energy_mae")), 1000.0, 1), _fmt(r.get(val_key(n, "force_mae")))]
            if unit == "step":
                size = r.get("val_size")
                row.append("whole split (epoch end)" if r.get("epoch_end") else
                           f"first {size} structures" if size is not None else "–")
        else:
            row += [_fmt(r.get("val_loss")), _fmt(r.get("train_acc"), 100.0, 2), _fmt(r.get("val_acc"), 100.0, 2),
                    _fmt(r.get("test_acc"), 100.0, 2)]
        if r is best:
            row[0] = f"**{row[0]}** (best)"
        lines.append("| " + " | ".join(row) + " |")
    if not points["evaluated"]:
        lines.append("| " + " | ".join(["–"] * len(head)) + " |")
        lines += ["", "No record carries a validation metric (no evaluation ran)."]
    for p in plots or []:
        lines += ["", f"![curves]({Path(p).name})"]
    return "\n".join(lines) + "\n"


def _series(records: list[dict], key: str, scale: float = 1.0, *, epoch_end: bool | None = None):
    xs, ys = [], []
    for r in records:
        if epoch_end is not None and bool(r.get("epoch_end")) != epoch_end:
            continue
        v = _num(r.get(key))
        if v is not None:
            xs.append(r["x"])
            ys.append(scale * v)
    return xs, ys


def plot_curves(result: dict, points: dict, path: Path, title: str = "") -> Path:
    """``path`` (PNG): the run's curves in panels against steps or epochs (the module docstring)."""
    plt = _plt()
    recs, unit, sets = points["records"], points["unit"], points["sets"]
    lr_known = any(_num(r.get("lr")) is not None for r in recs)
    if points["s2ef"]:
        panels = [("loss", "loss"), ("energy", "energy MAE (meV)"), ("forces", "force MAE (eV/Å)")]
    else:
        panels = [("loss", "loss"), ("acc", "accuracy (%)")]
    if lr_known:
        panels.append(("lr", "learning rate"))
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(10, 3.4 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    colors = _colors(max(len(sets), 1) + 3)
    few = len(recs) <= 30
    mark = {"marker": "o", "ms": 3} if few else {}

    def line(ax, xs, ys, label, color, **kw):
        if xs:
            ax.plot(xs, ys, label=label, color=color, lw=1.3, **{**mark, **kw})
            return True
        return False

    for ax, (kind, ylabel) in zip(flat, panels):
        drawn = False
        if kind == "loss":
            drawn |= line(ax, *_series(recs, "loss", epoch_end=False), "training loss" + (" (step)" if unit == "step"
                                                                                       else ""), colors[0])
            drawn |= line(ax, *_series(recs, "val_loss", epoch_end=False if unit == "step" else None),
                          "validation loss", colors[1], ls="--")
        elif kind in ("energy", "forces"):
            metric, scale = ("energy_mae", 1000.0) if kind == "energy" else ("force_mae", 1.0)
            for n, color in zip(sets, colors):
                key = val_key(n, metric)
                drawn |= line(ax, *_series(recs, key, scale, epoch_end=False if unit == "step" else None), n, color)
                if unit == "step":
                    xs, ys = _series(recs, key, scale, epoch_end=True)
                    if xs:
                        ax.plot(xs, ys, ls="none", marker="s", ms=5, mfc="none", color=color,
                                label=f"{n} (epoch end, whole split)")
                        drawn = True
            drawn |= line(ax, *_series(recs, f"train_{metric}", scale),
                          "train (epoch mean)" if unit == "step" else "train", "grey", ls=":")
        elif kind == "acc":
            for key, label, color in (("train_acc", "train", colors[0]), ("val_acc", "validation", colors[1]),
                                      ("test_acc", "test", colors[2])):
                drawn |= line(ax, *_series(recs, key, 100.0), label, color)
        else:
            drawn |= line(ax, *_series(recs, "lr", epoch_end=False), "learning rate", colors[0])
        ax.set_xlabel("optimizer step" if unit == "step" else "epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ys = [v for ln in ax.get_lines() for v in ln.get_ydata() if v is not None and v > 0]
            if kind != "acc" and kind != "lr" and ys and max(ys) / min(ys) > 20:
                ax.set_yscale("log")
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        if unit == "epoch":
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title or run_title(result))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def make_curves_report(result_path: str | Path, out_dir: str | Path | None = None, *, plots: bool = True,
                       title: str = ""):
    """Write ``report.md`` and ``curves.png`` of one training result (``gnnpipe train --out``) into ``out_dir``
    (default ``<result stem>.report`` beside it). Without matplotlib the PNG is skipped and the report says so.

    Returns:
        a :class:`gnnpipe.experiments.report.Report` (``variants`` empty; ``plots`` empty when matplotlib is
        missing: :data:`NO_MATPLOTLIB`).

    Raises:
        ConfigError: ``result_path`` is not a training result, or its records hold nothing to draw.
    """
    rp = Path(result_path)
    result = training_result(rp)
    if result is None:
        raise ConfigError(f"{rp} is not a training result (a JSON object with 'config' and 'epochs', as gnnpipe "
                          "train --out writes it)")
    points = curve_points(result)
    if not any(_num(r.get("loss")) is not None or any(k.startswith("val_") and _num(v) is not None
                                                      for k, v in r.items()) for r in points["records"]):
        raise ConfigError(f"{rp} is a training result whose records hold no loss and no validation metric: nothing "
                          "to draw (a run that ended before its first epoch or step record?)")
    out = Path(out_dir) if out_dir is not None else rp.with_name(rp.stem + ".report")
    out.mkdir(parents=True, exist_ok=True)
    pngs: list[Path] = []
    note = ""
    if plots:
        try:
            import matplotlib  # noqa: F401 - only whether it is there
        except ImportError:
            note = NO_MATPLOTLIB
        else:
            pngs.append(plot_curves(result, points, out / "curves.png", title))
    text = curves_markdown(result, points, title=title, source=str(rp), plots=pngs,
                           note=note[:1].upper() + note[1:] + "." if note else "")
    md = out / "report.md"
    md.write_text(text)
    return Report(text, md, pngs, [])
