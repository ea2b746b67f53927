"""Summarise a study's results file: a markdown table over variants and PNG plots.

Variants are groups of runs with the same settings except the seed; each is named by what differs
from the study's fixed settings (the ``variant`` recorded by ``gnnpipe ablate``). Per variant, over its
successful seeds, mean ± sample standard deviation (n−1; just the mean for one seed) of:

* test accuracy at the epoch of best validation accuracy (%), and best validation accuracy (%);
* training time per epoch (ms; the train JSON's ``mean_epoch_time_s``, evaluation excluded);
* bytes sent per epoch summed over ranks, by kind — ``layer`` (stage boundaries), ``graph`` (mirror
  exchange), ``weight`` (gradient all-reduce) — in MB (10^6 bytes), each run's mean over its epochs;
* peak memory: the largest ``peak_mem_bytes`` over ranks (MiB, 2^20 bytes); distributed runs only;
* idle: ``idle_fraction`` averaged over ranks (%), distributed runs only.

Plots (matplotlib, Agg backend): ``val_acc.png`` validation accuracy against epoch per variant (mean
over seeds, band = min..max), ``time.png`` epoch time per variant (bars, ± std), ``bytes.png`` bytes
per epoch per variant stacked by kind.

S2EF runs (results with ``best_metrics``: ``gnnpipe train`` of an atomistic model) are reported on their own
metrics instead of accuracies, at the epoch of lowest validation force MAE (the run's best epoch): test energy
MAE (meV), test force MAE (eV/Å), test force cosine, test EFwT (%, energy within 0.02 eV and every force
component within 0.03 eV/Å; Chanussot et al. 2021, OC20), the best epoch (counted from 1), the model's
trained parameters (``num_params``), the time per training step (ms: epoch time over the epoch's steps,
``ceil(train structures / global batch)``), bytes by kind (``gp``: the graph-parallel collectives) and
the peak memory of every rank (MiB, mean over seeds). Their curve plot is ``val_force_mae.png``, the time
plot shows the step time.

The sweep plot ``sweep.png`` draws a metric (:data:`~gnnpipe.experiments.grid.SWEEP_METRICS`) against a setting that the
variants vary, or against the parameter count (log axis): one dot per seed, the mean with its sample std as error bars.
The study's ``[report]`` table chooses ``x``, ``y`` and ``log_x``; by default S2EF studies whose variants
differ in parameters draw the test force MAE against them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .grid import DISPLAY, SWEEP_METRICS, fmt_value
from .results import read_records, results_stem

BYTE_KINDS = ("layer", "graph", "weight", "gp")



@dataclass
class VariantStats:
    """Numbers of one variant (lists hold one value per successful seed)."""

    name: str
    overrides: dict
    seeds_ok: list = field(default_factory=list)
    failed: list = field(default_factory=list)  # (seed, first error line)
    test_acc: list = field(default_factory=list)
    best_val: list = field(default_factory=list)
    epoch_ms: list = field(default_factory=list)
    epochs_run: list = field(default_factory=list)
    bytes: dict = field(default_factory=lambda: {k: [] for k in BYTE_KINDS})
    peak_mib: list = field(default_factory=list)
    idle_pct: list = field(default_factory=list)
    val_curves: list = field(default_factory=list)  # per seed: ([epoch], [val acc %]; S2EF: val force MAE)
    settings: dict = field(default_factory=dict)  # the run's settings, seed excluded
    s2ef: bool = False  # the runs are S2EF runs (energies and forces)
    params: list = field(default_factory=list)
    e_mae: list = field(default_factory=list)  # meV
    f_mae: list = field(default_factory=list)  # eV/Å
    f_cos: list = field(default_factory=list)
    efwt: list = field(default_factory=list)  # %
    val_f_mae: list = field(default_factory=list)  # eV/Å
    best_epoch: list = field(default_factory=list)  # counted from 1
    step_ms: list = field(default_factory=list)
    rank_peak_mib: list = field(default_factory=list)  # per seed: [MiB per rank]


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return None if math.isnan(v) else v


def mean_std(vals: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); ``(nan, nan)`` for none."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return math.nan, math.nan
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))


def fmt_ms(vals: list[float], digits: int = 2) -> str:
    """``"m ± s"`` (``"m"`` for one value, ``"–"`` for none)."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–"
    m, s = mean_std(vals)
    if len(vals) == 1 or s == 0:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def _fmt_sig(vals: list[float]) -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–"
    m, s = mean_std(vals)
    out = f"{m:.3g}"
    if len(vals) > 1 and s > 0:
        out += f" ± {s:.2g}"
    return out


def collect(records: list[dict]) -> tuple[list[VariantStats], dict]:
    """Group records into variants (settings without seed) in order of first appearance.

    Returns: ``(variants, fixed)`` where ``fixed`` holds the study's fixed settings: those that every record
    not overriding them has with the same value.
    """
    groups: dict[str, VariantStats] = {}
    names: dict[str, int] = {}
    base_vals: dict[str, list] = {}
    base_first: dict[str, object] = {}
    for rec in records:
        settings = dict(rec.get("settings") or {})
        overrides = rec.get("overrides") or {}
        for k, v in settings.items():
            if k not in overrides and k != "seed":
                base_vals.setdefault(k, []).append(json.dumps(v, sort_keys=True, default=str))
                base_first.setdefault(k, v)
        settings.pop("seed", None)
        key = json.dumps(settings, sort_keys=True, default=str) if settings else rec.get("variant", "?")
        if key not in groups:
            name = str(rec.get("variant") or "fixed")
            names[name] = names.get(name, 0) + 1
            if names[name] > 1:
                name = f"{name} (#{names[name]})"
            groups[key] = VariantStats(name, overrides, settings=settings)
        g = groups[key]
        seed = rec.get("seed")
        if rec.get("status") != "ok" or not isinstance(rec.get("result"), dict):
            err = (rec.get("error") or "").strip().splitlines()
            g.failed.append((seed, err[-1] if err else "unknown error"))
            continue
        res = rec["result"]
        g.seeds_ok.append(seed)
        ta, bv, t = (_num(res.get("test_acc_at_best_val")), _num(res.get("best_val_acc")),
                     _num(res.get("mean_epoch_time_s")))
        g.test_acc.append(100 * ta if ta is not None else None)
        g.best_val.append(100 * bv if bv is not None else None)
        g.epoch_ms.append(1000 * t if t is not None else None)
        epochs = res.get("epochs") or []
        g.epochs_run.append(len(epochs))
        for kind in BYTE_KINDS:
            vals = [_num(e.get(f"bytes_{kind}")) for e in epochs]
            vals = [v for v in vals if v is not None]
            g.bytes[kind].append(sum(vals) / len(vals) / 1e6 if vals else None)
        peak = res.get("peak_mem_bytes")
        if isinstance(peak, list) and peak:
            nums = [_num(p) for p in peak]
            nums = [p for p in nums if p is not None]
            g.peak_mib.append(max(nums) / 2**20 if nums else None)
            if len(nums) == len(peak):
                g.rank_peak_mib.append([p / 2**20 for p in nums])
        elif _num(peak) is not None:
            g.peak_mib.append(_num(peak) / 2**20)
        idle = res.get("idle_fraction")
        if isinstance(idle, list) and idle and all(_num(x) is not None for x in idle):
            g.idle_pct.append(100 * sum(idle) / len(idle))
        elif _num(idle) is not None:
            g.idle_pct.append(100 * _num(idle))
        if isinstance(res.get("best_metrics"), dict):
            _collect_s2ef(g, res, epochs)
            continue
        xs, ys = [], []
        for e in epochs:
            v = _num(e.get("val_acc"))
            if v is not None and _num(e.get("epoch")) is not None:
                xs.append(int(e["epoch"]))
                ys.append(100 * v)
        g.val_curves.append((xs, ys))
    fixed = {k: base_first[k] for k, vals in base_vals.items() if len(set(vals)) == 1}
    return list(groups.values()), fixed


def _scaled(v, factor: float) -> float | None:
    v = _num(v)
    return None if v is None else factor * v


def steps_per_epoch(res: dict) -> int | None:
    """Training steps per epoch of an S2EF result: ``ceil(train structures / global batch)`` from its plan."""
    plan = res.get("plan") or {}
    n = (plan.get("structures") or {}).get("train") if isinstance(plan.get("structures"), dict) else None
    batch = plan.get("global_batch") or plan.get("batch_size")
    if _num(n) is None or not _num(batch):
        return None
    return max(1, math.ceil(n / batch))


def _collect_s2ef(g: VariantStats, res: dict, epochs: list) -> None:
    """The S2EF numbers of one successful run (see the module docstring)."""
    bm = res["best_metrics"]
    g.s2ef = True
    g.params.append(_num(res.get("num_params")))
    g.e_mae.append(_scaled(bm.get("test_energy_mae"), 1000.0))
    g.f_mae.append(_num(bm.get("test_force_mae")))
    g.f_cos.append(_num(bm.get("test_force_cos")))
    g.efwt.append(_scaled(bm.get("test_efwt"), 100.0))
    g.val_f_mae.append(_num(bm.get("val_force_mae")))
    be = _num(res.get("best_epoch"))
    g.best_epoch.append(be + 1 if be is not None and be >= 0 else None)
    steps, t = steps_per_epoch(res), _num(res.get("mean_epoch_time_s"))
    g.step_ms.append(1000 * t / steps if steps and t is not None else None)
    xs, ys = [], []
    for e in epochs:
        v = _num(e.get("val_force_mae"))
        if v is not None and _num(e.get("epoch")) is not None:
            xs.append(int(e["epoch"]))
            ys.append(v)
    g.val_curves.append((xs, ys))


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|")


def markdown(variants: list[VariantStats], fixed: dict, *, title: str = "", description: str = "",
             source: str = "", plots: list[str] | None = None) -> str:
    """The report as markdown: header, fixed settings, the variant table, failures, plot links."""
    lines = [f"# {title or 'Study report'}", ""]
    if description:
        lines += [description.strip(), ""]
    n_ok = sum(len(v.seeds_ok) for v in variants)
    n_fail = sum(len(v.failed) for v in variants)
    if source:
        lines += [f"Results: {n_ok + n_fail} runs ({n_ok} ok, {n_fail} failed) from `{source}`.", ""]
    if fixed:
        lines += ["Fixed settings: " + ", ".join(f"`{k}={fmt_value(v)}`" for k, v in fixed.items()), ""]
    has_bytes = {k: any(x for v in variants for x in v.bytes[k] if x) for k in BYTE_KINDS}
    has_mem = any(v.peak_mib for v in variants)
    if any(v.s2ef for v in variants):
        lines += _s2ef_table(variants, has_bytes, has_mem)
        return _tail(lines, variants, has_bytes, has_mem, False, plots, s2ef=True)
    head = ["variant", "seeds", "test acc @ best val (%)", "best val acc (%)", "epoch time (ms)", "epochs"]
    head += [f"{k} MB/epoch" for k in BYTE_KINDS if has_bytes[k]]
    if has_mem:
        head.append("peak mem (MiB)")
    has_idle = any(v.idle_pct for v in variants)
    if has_idle:
        head.append("idle (%)")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|" + "|".join(["--:"] * (len(head) - 1)) + "|")
    for v in variants:
        seeds = str(len(v.seeds_ok)) + (f" (+{len(v.failed)} failed)" if v.failed else "")
        row = [_md_escape(v.name), seeds, fmt_ms(v.test_acc), fmt_ms(v.best_val), fmt_ms(v.epoch_ms, 1),
               fmt_ms([float(x) for x in v.epochs_run], 0)]
        row += [_fmt_sig(v.bytes[k]) for k in BYTE_KINDS if has_bytes[k]]
        if has_mem:
            row.append(fmt_ms(v.peak_mib, 0))
        if has_idle:
            row.append(fmt_ms(v.idle_pct, 1))
        lines.append("| " + " | ".join(row) + " |")
    return _tail(lines, variants, has_bytes, has_mem, has_idle, plots)


def _fmt_params(vals: list) -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–"
    m = sum(vals) / len(vals)
    return f"{m / 1e6:.3g} M" if m >= 1e5 else f"{m:,.0f}"


def _fmt_ranks(per_seed: list) -> str:
    """Per-rank peaks (MiB), mean over seeds: ``"412 / 415"``."""
    if not per_seed or len({len(r) for r in per_seed}) != 1:
        return "–"
    n = len(per_seed[0])
    return " / ".join(f"{sum(r[i] for r in per_seed) / len(per_seed):.0f}" for i in range(n))


def _s2ef_table(variants: list[VariantStats], has_bytes: dict, has_mem: bool) -> list[str]:
    head = ["variant", "seeds", "params", "energy MAE (meV)", "force MAE (eV/Å)", "force cos", "EFwT (%)",
            "best epoch", "step time (ms)", "epochs"]
    head += [f"{k} MB/epoch" for k in BYTE_KINDS if has_bytes[k]]
    if has_mem:
        head += ["peak mem, largest rank (MiB)", "peak mem per rank (MiB)"]
    out = ["| " + " | ".join(head) + " |", "|---|" + "|".join(["--:"] * (len(head) - 1)) + "|"]
    for v in variants:
        seeds = str(len(v.seeds_ok)) + (f" (+{len(v.failed)} failed)" if v.failed else "")
        row = [_md_escape(v.name), seeds, _fmt_params(v.params), fmt_ms(v.e_mae, 1), fmt_ms(v.f_mae, 4),
               fmt_ms(v.f_cos, 3), fmt_ms(v.efwt, 1), fmt_ms(v.best_epoch, 1), fmt_ms(v.step_ms, 1),
               fmt_ms([float(x) for x in v.epochs_run], 0)]
        row += [_fmt_sig(v.bytes[k]) for k in BYTE_KINDS if has_bytes[k]]
        if has_mem:
            row += [fmt_ms(v.peak_mib, 0), _fmt_ranks(v.rank_peak_mib)]
        out.append("| " + " | ".join(row) + " |")
    return out


def _tail(lines: list[str], variants: list[VariantStats], has_bytes: dict, has_mem: bool, has_idle: bool,
          plots: list[str] | None, *, s2ef: bool = False) -> str:
    lines.append("")
    if s2ef:
        notes = ["Mean ± sample std over seeds (n−1). Test metrics at the epoch of lowest validation force MAE "
                 "(best epoch, counted from 1); EFwT: energy within 0.02 eV and every force component within "
                 "0.03 eV/Å. Step time: training time per epoch over its steps (evaluation excluded)."]
    else:
        notes = ["Mean ± sample std over seeds (n−1); epoch time excludes evaluation."]
    if any(has_bytes.values()):
        notes.append("Bytes: sent per epoch, summed over ranks, MB = 10^6 B (layer = stage boundaries, "
                     "graph = mirror exchange, weight = gradient all-reduce, gp = graph-parallel collectives).")
    if has_mem:
        notes.append("Peak memory: the largest rank" + (" and every rank in order (stage-major)." if s2ef else "."))
    if has_idle:
        notes.append("Idle: share of epoch time ranks waited for peers, mean over ranks.")
    lines.append(" ".join(notes))
    fails = [(v.name, s, e) for v in variants for s, e in v.failed]
    if fails:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {_md_escape(n)}, seed {s}: {e}" for n, s, e in fails]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("the report's plots need matplotlib: install the plot extra "
                          "(pip install 'gnnpipe[plot]') or pass --no-plots") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _colors(n: int):
    plt = _plt()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def plot_val_acc(variants: list[VariantStats], path: Path, title: str = "", *,
                 ylabel: str = "validation accuracy (%)") -> Path:
    """Validation accuracy (%) against epoch, one line per variant (mean over seeds, band min..max); S2EF
    variants: the validation force MAE (eV/Å, ``ylabel``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    any_line = False
    for v, col in zip(variants, _colors(len(variants))):
        per_epoch: dict[int, list[float]] = {}
        for xs, ys in v.val_curves:
            for x, y in zip(xs, ys):
                per_epoch.setdefault(x, []).append(y)
        if not per_epoch:
            continue
        ep = sorted(per_epoch)
        mean = [sum(per_epoch[e]) / len(per_epoch[e]) for e in ep]
        ax.plot(ep, mean, color=col, lw=1.4, label=f"{v.name} (n={len(v.val_curves)})",
                marker="o" if len(ep) <= 12 else None, ms=3)
        if len(v.val_curves) > 1:
            ax.fill_between(ep, [min(per_epoch[e]) for e in ep], [max(per_epoch[e]) for e in ep], color=col,
                            alpha=0.15, lw=0)
        any_line = True
    ax.set_xlabel("epoch")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title or "validation accuracy (mean over seeds; band: min–max)")
    ax.grid(alpha=0.3)
    if any_line:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    else:
        ax.text(0.5, 0.5, "no evaluated epochs", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _barh_setup(n: int):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.5, max(2.4, 0.38 * n + 1.3)))
    return plt, fig, ax


def plot_time(variants: list[VariantStats], path: Path, title: str = "", *, per: str = "epoch") -> Path:
    """Mean training time per epoch (ms; ``per="step"``: per training step) per variant as horizontal bars with
    ± std error bars."""
    plt, fig, ax = _barh_setup(len(variants))
    names = [v.name for v in variants]
    stats = [mean_std(v.step_ms if per == "step" else v.epoch_ms) for v in variants]
    y = list(range(len(variants)))
    means = [0.0 if math.isnan(m) else m for m, _ in stats]
    errs = [0.0 if math.isnan(s) else s for _, s in stats]
    ax.barh(y, means, xerr=errs, color=_colors(len(variants)), capsize=3, alpha=0.85)
    for yi, m, e in zip(y, means, errs):
        ax.text(m + e, yi, f"  {m:.1f}", va="center", fontsize=8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_ylim(len(variants) - 0.5, -0.5)
    ax.set_xlabel(f"training time per {per} (ms)")
    ax.set_title(title or "epoch time (mean ± std over seeds)")
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.12)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_bytes(variants: list[VariantStats], path: Path, title: str = "") -> Path:
    """Bytes sent per epoch (MB, summed over ranks) per variant, stacked by kind."""
    plt, fig, ax = _barh_setup(len(variants))
    names = [v.name for v in variants]
    y = list(range(len(variants)))
    left = [0.0] * len(variants)
    colors = {"layer": "#1f77b4", "graph": "#ff7f0e", "weight": "#2ca02c", "gp": "#9467bd"}
    total_any = False
    for kind in BYTE_KINDS:
        vals = []
        for v in variants:
            m, _ = mean_std(v.bytes[kind])
            vals.append(0.0 if math.isnan(m) else m)
        if any(vals):
            total_any = True
            ax.barh(y, vals, left=left, color=colors[kind], label=kind, alpha=0.85)
            left = [a + b for a, b in zip(left, vals)]
    for yi, tot in zip(y, left):
        if total_any:
            ax.text(tot, yi, f"  {tot:.3g}", va="center", fontsize=8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_ylim(len(variants) - 0.5, -0.5)
    ax.set_xlabel("MB sent per epoch (sum over ranks)")
    ax.set_title(title or "communication volume per epoch by kind")
    ax.grid(axis="x", alpha=0.3)
    if total_any:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.margins(x=0.12)
    else:
        ax.text(0.5, 0.5, "no bytes sent (single-process runs)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def sweep_x(v: VariantStats, x: str) -> float | None:
    """The variant's value of the swept setting ``x`` (``"params"``: its mean parameter count); ``None`` when it
    has none or it is not a number."""
    if x == "params":
        vals = [p for p in v.params if p is not None]
        return sum(vals) / len(vals) if vals else None
    return _num(v.settings.get(x))


def default_sweep(variants: list[VariantStats]) -> dict:
    """The sweep plot drawn without a ``[report]`` table: S2EF variants that differ in parameter count, test
    force MAE against it (log axis); else none (``{}``)."""
    ok = [v for v in variants if v.seeds_ok and v.s2ef]
    if len({sweep_x(v, "params") for v in ok} - {None}) > 1:
        return {"x": "params", "y": "force_mae", "log_x": True}
    return {}


def plot_sweep(variants: list[VariantStats], path: Path, x: str, y: str, *, log_x: bool | None = None,
               title: str = "") -> Path | None:
    """``y`` (a :data:`~gnnpipe.experiments.grid.SWEEP_METRICS` name) against the swept setting ``x`` (or ``"params"``):
    a dot per seed, the mean ± sample std per distinct ``x``, joined in ``x`` order. Variants with the same ``x``
    (differing in another setting) are pooled. Returns ``None`` (nothing drawn) when fewer than two distinct ``x`` have
    values.

    Raises:
        ConfigError: ``y`` not a known metric.
    """
    if y not in SWEEP_METRICS:
        raise ConfigError(f"sweep metric {y!r} unknown; use one of {', '.join(SWEEP_METRICS)}")
    attr, ylabel = SWEEP_METRICS[y]
    pts: dict[float, list[float]] = {}
    for v in variants:
        xv = sweep_x(v, x)
        if xv is None:
            continue
        pts.setdefault(xv, []).extend(val for val in getattr(v, attr) if val is not None)
    pts = {k: vals for k, vals in pts.items() if vals}
    if len(pts) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    xs = sorted(pts)
    for xv in xs:
        ax.scatter([xv] * len(pts[xv]), pts[xv], s=14, color="#1f77b4", alpha=0.45, lw=0)
    stats = [mean_std(pts[xv]) for xv in xs]
    ax.errorbar(xs, [m for m, _ in stats], yerr=[sd for _, sd in stats], color="#1f77b4", marker="o", ms=5,
                capsize=3, lw=1.4, label="mean ± std over seeds")
    if log_x if log_x is not None else x == "params":
        ax.set_xscale("log")

    ax.set_xlabel("trained parameters" if x == "params" else DISPLAY.get(x, x))
    ax.set_ylabel(ylabel)
    ax.set_title(title or f"{y} against {x}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


@dataclass
class Report:
    """What :func:`make_report` wrote: the markdown text, its path and the PNG paths."""

    markdown: str
    markdown_path: Path
    plots: list[Path]
    variants: list[VariantStats]


def make_report(results_path: str | Path, out_dir: str | Path | None = None, *, plots: bool = True,
                title: str = "", description: str = "", order: list[str] | None = None,
                sweep: dict | None = None) -> Report:
    """Read ``results_path`` and write ``report.md`` (+ ``val_acc.png`` or, for S2EF runs, ``val_force_mae.png``,
    ``time.png``, ``bytes.png``, and ``sweep.png`` when a metric is drawn against a swept setting).

    Args:
        results_path: a study's JSON Lines results file.
        out_dir: output folder (default ``<results folder>/<results stem>.report``; created).
        plots: draw the PNGs (needs matplotlib).
        title, description: report header (default: the study name recorded in the results).
        order: optional variant names in the order to list them (others follow in file order).
        sweep: the sweep plot, ``{"x": setting or "params", "y": metric, "log_x": bool}`` (a study's
            ``[report]`` table; missing keys as ``default_sweep``); ``None``: the default.

    Raises:
        ConfigError: missing or empty results file; matplotlib missing while ``plots`` is set.
    """
    rp = Path(results_path)
    if not rp.is_file():
        raise ConfigError(f"results file {str(rp)!r} not found; run `gnnpipe ablate STUDY.toml` first "
                          f"(or give the file `gnnpipe ablate --results FILE` wrote)")
    records = read_records(rp)
    if not records:
        raise ConfigError(f"results file {str(rp)!r} holds no finished runs yet")
    variants, fixed = collect(records)
    if order:
        rank = {n: i for i, n in enumerate(order)}
        variants.sort(key=lambda v: rank.get(v.name, len(rank)))
    out = Path(out_dir) if out_dir is not None else rp.with_name(results_stem(rp) + ".report")
    if plots:
        _plt()  # matplotlib missing: say so before creating anything
    out.mkdir(parents=True, exist_ok=True)
    title = title or (records[0].get("study") or results_stem(rp))
    pngs: list[Path] = []
    if plots:
        ok = [v for v in variants if v.seeds_ok]
        if ok and any(v.s2ef for v in ok):
            pngs = [plot_val_acc(ok, out / "val_force_mae.png", f"{title}: validation force MAE",
                                 ylabel="validation force MAE (eV/Å)"),
                    plot_time(ok, out / "time.png", f"{title}: step time (mean ± std over seeds)", per="step"),
                    plot_bytes(ok, out / "bytes.png", f"{title}: bytes sent per epoch")]
        elif ok:
            pngs = [plot_val_acc(ok, out / "val_acc.png", f"{title}: validation accuracy"),
                    plot_time(ok, out / "time.png", f"{title}: epoch time (mean ± std over seeds)"),
                    plot_bytes(ok, out / "bytes.png", f"{title}: bytes sent per epoch")]
        sw = {**default_sweep(ok), **(sweep or {})}
        if ok and sw.get("x"):
            y = sw.get("y") or ("force_mae" if any(v.s2ef for v in ok) else "test_acc")
            png = plot_sweep(ok, out / "sweep.png", sw["x"], y, log_x=sw.get("log_x"),
                             title=f"{title}: {y} against {sw['x']}")
            if png is not None:
                pngs.append(png)
    text = markdown(variants, fixed, title=title, description=description, source=str(rp),
                    plots=[str(p) for p in pngs])
    md = out / "report.md"
    md.write_text(text)
    return Report(text, md, pngs, variants)


# --------------------------------------------------------------------------------------------- IS2RS


def is2rs_file(path: str | Path) -> bool:
    """Whether ``path`` is an IS2RS result file (a JSON object with ``"task": "is2rs"``, ``gnnpipe evaluate``)."""
    p = Path(path)
    if p.suffix != ".json" or not p.is_file():
        return False
    try:
        return json.loads(p.read_text()).get("task") == "is2rs"
    except (OSError, ValueError, AttributeError):
        return False


def plot_is2rs_curves(records: list[tuple[str, dict]], path: Path, title: str = "") -> Path:
    """Two panels: the fraction of structures within each distance threshold (ADwT's curve, Å) and with oracle
    forces below each threshold (FbT's curve, eV/Å), one line per result."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for (name, rec), color in zip(records, _colors(len(records))):
        c = rec.get("curves", {})
        if "adwt" in c:
            a.plot(c["adwt"]["thresholds"], [100 * v for v in c["adwt"]["fraction"]], color=color,
                   label=f"{name} (ADwT {100 * rec['adwt']:.1f} %)")
        if "fbt" in c:
            b.plot(c["fbt"]["thresholds"], [100 * v for v in c["fbt"]["fraction"]], color=color,
                   label=f"{name} (AFbT {100 * rec['afbt']:.1f} %)")
    a.set_xlabel("distance threshold (Å)")
    a.set_ylabel("structures within (%)")
    a.set_title("ADwT curve")
    b.set_xlabel("force threshold (eV/Å)")
    oracles = sorted({str(rec.get("oracle", "oracle")) for _, rec in records})  # results of different oracles
    b.set_ylabel(f"structures below ({' / '.join(oracles)} forces, %)")
    b.axvline(0.05, color="grey", lw=0.8, ls=":")
    b.set_title("FbT curve")
    for ax in (a, b):
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def make_is2rs_report(paths: list, out_dir: str | Path | None = None, *, plots: bool = True,
                      title: str = "") -> Report:
    """A table (ADwT, FbT, AFbT, mean distance, IS2RE energy MAE, EwT per file) and ``is2rs_curves.png`` of IS2RS
    result files (``gnnpipe evaluate --task is2rs --out``).

    Raises:
        ConfigError: a file that is not an IS2RS result; matplotlib missing while ``plots`` is set.
    """
    records = []
    for p in paths:
        if not is2rs_file(p):
            raise ConfigError(f"{p} is not an IS2RS result file; write one with "
                              "gnnpipe evaluate --task is2rs --out X.json")
        records.append((Path(p).stem, json.loads(Path(p).read_text())))
    first = Path(paths[0])
    out = Path(out_dir) if out_dir is not None else first.with_name(first.stem + ".report")
    if plots:
        _plt()
    out.mkdir(parents=True, exist_ok=True)
    title = title or "IS2RS"

    def pct(rec, k):
        return f"{100 * rec[k]:.1f}" if k in rec else "–"

    lines = [f"# {title}", "", "| result | model | oracle | structures | ADwT % | FbT % | AFbT % | mean distance (Å) | "
             "energy MAE (meV) | EwT % |", "|---|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for name, rec in records:
        mae = f"{1000 * rec['energy_mae']:.1f}" if "energy_mae" in rec else "–"
        lines.append(f"| {_md_escape(name)} | {_md_escape(str(rec.get('model', '')))} | "
                     f"{_md_escape(str(rec.get('oracle', '–')))} | {rec.get('structures')} | "
                     f"{pct(rec, 'adwt')} | {pct(rec, 'fbt')} | {pct(rec, 'afbt')} | "
                     f"{rec.get('mean_distance', float('nan')):.3f} | {mae} | {pct(rec, 'ewt')} |")
    pngs = [plot_is2rs_curves(records, out / "is2rs_curves.png", title)] if plots else []
    if pngs:
        lines += ["", f"![curves]({pngs[0].name})"]
    text = "\n".join(lines) + "\n"
    md = out / "report.md"
    md.write_text(text)
    return Report(text, md, pngs, [])
