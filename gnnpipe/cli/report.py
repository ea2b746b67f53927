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

RESULTS may instead be one training result (``gnnpipe train --out run.json``): the learning curves of that run,
curves.png — the training loss, the validation energy and force MAE of each validation set and the learning rate
(node classification: the losses and the training, validation and test accuracies) against optimizer steps when
the run has step records (``--max-steps``, ``--eval-every-steps``), else against epochs — and report.md, a table of
the evaluated points. Without matplotlib the table alone is written, and a line says so.

RESULTS may instead be one or more IS2RS result files (``gnnpipe evaluate --task is2rs --out X.json``): a table of
ADwT, FbT, AFbT and the IS2RE energy MAE per file, and is2rs_curves.png with the ADwT curve (fraction of
structures within each distance threshold) and the FbT curve (fraction with oracle forces below each threshold),
one line per file.

examples:
  gnnpipe report run.json                                            # learning curves of one training run
  gnnpipe report experiments/technique_ablation.results.jsonl
  gnnpipe report experiments/technique_ablation.toml --out-dir reports/ablation
  gnnpipe report short.json long.json --out-dir is2rs_report        # IS2RS curves of two models
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError
from ..experiments import load_study
from ..experiments.curves import NO_MATPLOTLIB, make_curves_report, training_result
from ..experiments.report import is2rs_file, make_is2rs_report, make_report
from ..experiments.results import default_results_path
from .main import HelpFormatter


def register(sub) -> None:
    p = sub.add_parser("report", help="markdown table and plots of a study's results (gnnpipe ablate), of one "
                       "training run's learning curves, or of IS2RS results",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("results", metavar="RESULTS", nargs="+", help="results file (.jsonl) written by gnnpipe ablate, "
                   "or the study .toml; or one training result (.json of gnnpipe train --out); or IS2RS result "
                   "files (.json) of gnnpipe evaluate")
    p.add_argument("--out-dir", default=None, help="output folder (default: <results stem>.report beside RESULTS)")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="only the markdown table")
    p.add_argument("--title", default="", help="report title (default: the study name; a training run: its model and "
                   "data set)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if any(is2rs_file(p) for p in args.results):
        rep = make_is2rs_report(args.results, args.out_dir, plots=args.plots, title=args.title)
        print(rep.markdown)
        print(f"wrote {rep.markdown_path}" + "".join(f", {p}" for p in rep.plots), file=sys.stderr)
        return 0
    if any(training_result(p) is not None for p in args.results):
        if len(args.results) > 1:
            raise ConfigError("give one training result at a time (gnnpipe report run.json draws that run's "
                              "learning curves); several files are read only as IS2RS results of gnnpipe evaluate")
        rep = make_curves_report(args.results[0], args.out_dir, plots=args.plots, title=args.title)
        print(rep.markdown)
        if args.plots and not rep.plots:
            print(f"gnnpipe: {NO_MATPLOTLIB}", file=sys.stderr)
        print(f"wrote {rep.markdown_path}" + "".join(f", {p}" for p in rep.plots), file=sys.stderr)
        return 0
    if len(args.results) > 1:
        raise ConfigError("give one study results file (.jsonl or .toml); several files are read only as IS2RS "
                          "results of gnnpipe evaluate")
    path = Path(args.results[0])
    if path.suffix != ".toml" and _one_json_object(path):
        raise ConfigError(f"{path} is one JSON document but neither a training result (gnnpipe train --out) nor a "
                          f"study's results; give the .jsonl written by gnnpipe ablate (or the study .toml), a "
                          f"training result, or IS2RS results of gnnpipe evaluate --task is2rs --out")
    description, order, sweep = "", None, None
    if path.suffix == ".toml":
        study = load_study(path, check=False)
        description, order, sweep = study.description, study.variant_names(), study.report
        path = default_results_path(path)
    rep = make_report(path, args.out_dir, plots=args.plots, title=args.title, description=description, order=order,
                      sweep=sweep)
    print(rep.markdown)
    print(f"wrote {rep.markdown_path}" + "".join(f", {p}" for p in rep.plots), file=sys.stderr)
    return 0


def _one_json_object(path: Path) -> bool:
    """Whether ``path`` holds one JSON object spread over several lines (a result file of ``gnnpipe train``), which a
    study's JSON-lines results never are."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if text.count("\n") < 2:
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
