"""``gnnpipe compare``: graph parallelism, GNNPipe and their hybrid on the same ranks, side by side.

Runs, with the same data, model, epochs and hyper-parameters (the same budget):

* **GP**       — ``--ways P --stages 1`` (one METIS part per rank, exact);
* **GNNPipe**  — ``--ways 1 --stages P`` (chunks: ``--chunks`` or 4·P);
* **hybrid**   — ``W × S = P`` with both > 1 (``--hybrid WxS``; default the most square split with
  ``W ≤ S``, e.g. 2×2 for P = 4; skipped when P is prime).

and prints one table: mean time per epoch, bytes per epoch by kind (layer, graph, weight; summed over
ranks), peak memory per rank (max), accuracy (best validation, test at best validation), and the
ratios GP / GNNPipe. ``--out FILE`` writes every run's full result and the table as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import attrs

from .. import api
from ..core.run.results import json_safe
from ..errors import ConfigError
from .main import HelpFormatter
from .train import add_train_arguments, check_writable, config_from_args, warn_layout_flags

MODES = ("gp", "gnnpipe", "hybrid")


def default_hybrid(ranks: int) -> tuple[int, int] | None:
    """The most square ``(W, S)`` with ``W·S = ranks``, ``2 ≤ W ≤ S``; ``None`` when there is none."""
    best = None
    for w in range(2, math.isqrt(ranks) + 1):
        if ranks % w == 0:
            best = (w, ranks // w)
    return best


def parse_layout(text: str) -> tuple[int, int]:
    """``"2x2"`` → ``(2, 2)`` (ways × stages)."""
    try:
        w, s = (int(v) for v in text.lower().replace("×", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WxS (ways x stages, e.g. 2x2), got {text!r}") from None
    if w < 1 or s < 1:
        raise argparse.ArgumentTypeError(f"ways and stages must be >= 1, got {text!r}")
    return w, s


def layouts(ranks: int, hybrid: tuple[int, int] | None, modes) -> dict[str, tuple[int, int]]:
    """``{mode: (ways, stages)}`` of the runs to compare.

    Raises:
        ConfigError: ``ranks < 2``, or a hybrid layout whose product is not ``ranks``.
    """
    if ranks < 2:
        raise ConfigError(f"--ranks must be at least 2 to compare parallel layouts, got {ranks}")
    out = {}
    if "gp" in modes:
        out["gp"] = (ranks, 1)
    if "gnnpipe" in modes:
        out["gnnpipe"] = (1, ranks)
    if "hybrid" in modes:
        h = hybrid or default_hybrid(ranks)
        if hybrid is not None and hybrid[0] * hybrid[1] != ranks:
            raise ConfigError(f"hybrid layout {hybrid[0]}x{hybrid[1]} uses {hybrid[0] * hybrid[1]} ranks, not {ranks}")
        if h is not None:
            out["hybrid"] = h
        else:
            if not out:
                raise ConfigError(f"nothing to compare: {ranks} ranks have no hybrid layout W x S with W, S > 1; "
                                  f"use a rank count with one (e.g. --ranks 4) or add gp/gnnpipe to --modes")
            print(f"gnnpipe compare: no hybrid layout W x S = {ranks} with W, S > 1; skipping the hybrid",
                  file=sys.stderr)
    if not out:
        raise ConfigError("nothing to compare: --modes names none of gp, gnnpipe, hybrid")
    return out


def summarize(mode: str, layout: tuple[int, int], result) -> dict:
    """One table row of a :class:`~gnnpipe.core.run.results.TrainResult`."""
    ep = result.epochs
    row = {"mode": mode, "layout": f"{layout[0]}x{layout[1]}", "ranks": layout[0] * layout[1],
           "epochs": len(ep), "epoch_time_s": result.mean_epoch_time_s}
    for k in ("bytes_layer", "bytes_graph", "bytes_weight"):
        vals = [e.get(k, 0) for e in ep]
        row[k] = round(sum(vals) / len(vals)) if vals else 0
    row["bytes_total"] = row["bytes_layer"] + row["bytes_graph"] + row["bytes_weight"]
    mem = result.extra.get("peak_mem_bytes", [])
    row["peak_mem_bytes"] = max(mem) if mem else 0
    row["peak_mem_bytes_per_rank"] = list(mem)
    hist = result.extra.get("history_bytes", [])
    row["history_bytes"] = max(hist) if hist else 0
    row["best_val_acc"] = result.best_val_acc
    row["test_acc"] = result.test_acc_at_best_val
    plan = result.extra.get("plan", {})
    row["chunks"] = plan.get("chunks")
    row["mirror_count"] = plan.get("mirror_count")
    return row


def ratios(rows: dict[str, dict]) -> dict:
    """GP / GNNPipe of time, bytes (total and without the weight all-reduce) and peak memory; the
    accuracy columns as differences (GP − GNNPipe)."""
    if "gp" not in rows or "gnnpipe" not in rows:
        return {}
    a, b = rows["gp"], rows["gnnpipe"]

    def r(x, y):
        return x / y if y else (float("inf") if x else float("nan"))

    return {
        "epoch_time": r(a["epoch_time_s"], b["epoch_time_s"]),
        "bytes_total": r(a["bytes_total"], b["bytes_total"]),
        "bytes_embeddings": r(a["bytes_layer"] + a["bytes_graph"], b["bytes_layer"] + b["bytes_graph"]),
        "peak_mem": r(a["peak_mem_bytes"], b["peak_mem_bytes"]),
        "best_val_acc_diff": a["best_val_acc"] - b["best_val_acc"],
        "test_acc_diff": a["test_acc"] - b["test_acc"],
    }


def _mb(v) -> str:
    return f"{v / 2**20:,.2f}"


def _pct(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}"


def format_table(rows: dict[str, dict], rat: dict) -> str:
    """The comparison table as text (bytes and memory in MiB)."""
    head = ["mode", "WxS", "C", "ms/epoch", "layer MiB", "graph MiB", "weight MiB", "total MiB",
            "peak MiB/rank", "hist MiB/rank", "best val %", "test %"]
    body = []
    for row in rows.values():
        body.append([row["mode"], row["layout"], str(row["chunks"]), f"{1000 * row['epoch_time_s']:.1f}",
                     _mb(row["bytes_layer"]), _mb(row["bytes_graph"]), _mb(row["bytes_weight"]),
                     _mb(row["bytes_total"]), _mb(row["peak_mem_bytes"]), _mb(row["history_bytes"]),
                     _pct(row["best_val_acc"]), _pct(row["test_acc"])])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    if rat:
        lines.append("")
        lines.append(
            f"GP / GNNPipe: time {rat['epoch_time']:.2f}x, bytes {rat['bytes_total']:.2f}x "
            f"(embeddings only {rat['bytes_embeddings']:.2f}x), peak memory {rat['peak_mem']:.2f}x; "
            f"accuracy GP - GNNPipe: val {100 * rat['best_val_acc_diff']:+.2f} pt, "
            f"test {100 * rat['test_acc_diff']:+.2f} pt")
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("compare", help="run graph parallelism, GNNPipe and the hybrid on P ranks; one table",
                       description=__doc__, formatter_class=HelpFormatter)
    add_train_arguments(p)
    c = p.add_argument_group("comparison")
    c.add_argument("--ranks", "-P", type=int, default=4, help="ranks P of every layout (--ways/--stages are ignored)")
    c.add_argument("--hybrid", type=parse_layout, default=None, help="hybrid layout WxS (default: most square, W <= S)")
    c.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of gp,gnnpipe,hybrid")
    p.add_argument("--out", default=None, help="write every run's result and the table as JSON")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.set_defaults(func=run)


def compare(config, ranks: int, hybrid: tuple[int, int] | None = None, modes=MODES, progress: bool = True,
            data=None) -> dict:
    """Train each layout with the same configuration otherwise; returns ``{"rows", "ratios", "results"}``.

    ``config.chunks`` (if set) applies to GNNPipe and the hybrid; GP uses one part per rank.
    """
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ConfigError(f"unknown mode(s) {', '.join(sorted(unknown))}; use gp, gnnpipe, hybrid")
    rows, results = {}, {}
    for mode, (w, s) in layouts(ranks, hybrid, modes).items():
        if mode == "gp":  # exact: one part per rank, no history, no pipeline schedule
            cfg = attrs.evolve(config, ways=w, stages=s, chunks=None, correctors=[], scheduler="gpipe",
                               stash_weights=False)
        else:
            cfg = attrs.evolve(config, ways=w, stages=s, chunks=config.chunks)
        print(f"gnnpipe compare: {mode} ({w}x{s})", file=sys.stderr)
        res = api.train(cfg, data=data, progress=progress)
        results[mode] = res
        rows[mode] = summarize(mode, (w, s), res)
    return {"rows": rows, "ratios": ratios(rows), "results": results}


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    warn_layout_flags(config, "gnnpipe compare runs GP, GNNPipe and the hybrid of --ranks ranks; --hybrid WxS sets "
                              "the hybrid's layout", names=("ways", "stages"))
    if args.out:
        check_writable(args.out)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    out = compare(config, args.ranks, args.hybrid, modes, progress=args.progress)
    print(format_table(out["rows"], out["ratios"]))
    if args.out:
        doc = {"rows": out["rows"], "ratios": out["ratios"],
               "results": {m: r.to_dict() for m, r in out["results"].items()}}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(json_safe(doc), indent=1))
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
