"""gnnpipe report: summarise a study's results as a markdown table and PNG plots.

Per variant (runs that differ only in the seed, named by what differs from the study's fixed
settings): mean ± std over seeds of test accuracy at best validation, best validation accuracy,
training time per epoch, bytes sent per epoch by kind (layer / graph / weight) and peak memory.
The table is printed and written to OUT_DIR/report.md; the plots val_acc.png (validation accuracy
against epoch), time.png and bytes.png (bars per variant) go beside it.

S2EF runs (atomistic models) report, at the epoch of lowest validation force MAE: test energy MAE,
force MAE, force cosine and EFwT, the best epoch, the parameter count, the time per training step,
bytes by kind (gp: graph-parallel) and every rank's peak memory; val_force_mae.png replaces
val_acc.png. sweep.png draws a metric against a swept setting or the parameter count (the study's
[report] table: x, y, log_x; S2EF studies whose variants differ in parameters draw the test force MAE
against them by default).

OUT_DIR defaults to <results stem>.report/ beside the results file. RESULTS may also be the study
file (STUDY.toml), which then names the results file (<stem>.results.jsonl) and the variant order.

examples:
  gnnpipe report experiments/technique_ablation.results.jsonl
  gnnpipe report experiments/technique_ablation.toml --out-dir reports/ablation
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub) -> None:
    from .main import HelpFormatter

    p = sub.add_parser("report", help="markdown table and plots of a study's results (gnnpipe ablate)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("results", metavar="RESULTS", help="results file (.jsonl) written by gnnpipe ablate, or the study .toml")
    p.add_argument("--out-dir", default=None, help="output folder (default: <results stem>.report beside RESULTS)")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="only the markdown table")
    p.add_argument("--title", default="", help="report title (default: the study name)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..experiments.report import make_report
    from ..experiments.results import default_results_path

    path = Path(args.results)
    description, order, sweep = "", None, None
    if path.suffix == ".toml":
        from ..experiments import load_study

        study = load_study(path, check=False)
        description, order, sweep = study.description, study.variant_names(), study.report
        path = default_results_path(path)
    rep = make_report(path, args.out_dir, plots=args.plots, title=args.title, description=description, order=order,
                      sweep=sweep)
    print(rep.markdown)
    print(f"wrote {rep.markdown_path}" + "".join(f", {p}" for p in rep.plots), file=sys.stderr)
    return 0
