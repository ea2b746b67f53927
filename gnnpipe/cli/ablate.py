"""gnnpipe ablate: run a study (a grid of `gnnpipe train` runs) from a TOML file, resumably.

Every run is a `gnnpipe train` subprocess. Its result is appended to the results file (JSON Lines,
default <study>.results.jsonl beside the study file) as soon as it finishes; running the same command
again after an interruption skips every finished run. A failed run is recorded with its error and
the study goes on (--retry-failed runs failed ones again). Each run's output is kept in
<study>.logs/<run_id>.log beside the results file. The format in full: gnnpipe.experiments.grid.

Study file (TOML; relative `root` paths are resolved against the study file's folder):

  name = "depth"               # optional
  seeds = [0, 1, 2]
  run_timeout_s = 3600         # optional per-run limit
  [fixed]                      # gnnpipe train settings (TrainConfig field names) shared by all runs
  model = "gcnii"
  epochs = 100
  [grid]                       # lists: every combination is run
  layers = [8, 16, 32]
  [[variants]]                 # optional named variants, crossed with [grid]
  name = "GNNPipe"
  stages = 4
  [simulate]                   # optional costs of --simulate (lists are varied too)
  backward = 2.0
  [report]                     # optional sweep plot: a metric against a setting or "params"
  x = "params"
  y = "force_mae"

Atomistic (S2EF) runs take model = "dimenet++", gp_size, stages, ways, the S2EF settings and
model_args; their report has energy/force MAE, force cosine, EFwT, step time and per-rank memory.

examples:
  gnnpipe ablate experiments/technique_ablation.toml            # run / resume
  gnnpipe ablate experiments/technique_ablation.toml --list     # show runs and which are done
  gnnpipe ablate experiments/schedulers.toml --simulate         # schedule simulator only, seconds
  gnnpipe ablate experiments/atomistic_layouts.toml --report    # DimeNet++ (S2EF) in 6 S x G x D layouts
  gnnpipe report experiments/technique_ablation.results.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..experiments import load_study
from ..experiments.report import make_report
from ..experiments.results import default_results_path, read_records
from ..experiments.runner import run_study
from ..experiments.simulate import format_sim_table, simulate_study
from .main import HelpFormatter


def register(sub) -> None:
    p = sub.add_parser("ablate", help="run a grid of training runs (an ablation study) from a TOML file, resumably",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("study", metavar="STUDY.toml", help="the study file")
    p.add_argument("--results", default=None,
                   help="results file (JSON Lines; default: <study stem>.results.jsonl beside the study file)")
    p.add_argument("--simulate", action="store_true",
                   help="train nothing: simulate each variant's schedule (scheduler, stages, chunks, [simulate] "
                        "costs) and print makespan and bubble")
    p.add_argument("--list", dest="list_runs", action="store_true",
                   help="print the runs (id, variant, seed, done/failed/todo) and exit")
    p.add_argument("--retry-failed", action="store_true", help="run again the runs recorded as failed")
    p.add_argument("--run-timeout", dest="run_timeout_s", type=float, default=None,
                   help="seconds after which one run is stopped and recorded as failed (default: the study's "
                        "run_timeout_s, else none); not train's --timeout, which bounds a wait on a peer rank")
    p.add_argument("--timeout", dest="run_timeout_s", type=float, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # its old name
    p.add_argument("--report", action="store_true", help="write the report (gnnpipe report) when the study is done")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="plain lines instead of a progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    study = load_study(args.study)
    if args.run_timeout_s is not None:
        study.run_timeout_s = args.run_timeout_s
    if args.simulate:
        rows = simulate_study(study)
        print(f"# {study.name}: schedule simulation ({len(rows)} variants)\n")
        print(format_sim_table(rows))
        print("\nmakespan in cost units ([simulate] forward/backward/step); bubble = idle fraction of the makespan, "
              "mean over stages; steady = middle epochs only.")
        return 1 if any(r.error for r in rows) else 0

    results = Path(args.results) if args.results else default_results_path(args.study)
    if args.list_runs:
        recs = {r["run_id"]: r for r in read_records(results, warn=False)}
        width = max([len(r.variant) for r in study.runs] + [7])
        print(f"{'run_id':<12}  {'variant':<{width}}  seed  status")
        for r in study.runs:
            st = recs[r.run_id]["status"] if r.run_id in recs else "todo"
            print(f"{r.run_id:<12}  {r.variant:<{width}}  {r.seed:>4}  {st}")
        done = sum(1 for r in study.runs if r.run_id in recs)
        print(f"{len(study.runs)} runs, {done} done, {len(study.runs) - done} left ({results})")
        return 0

    prog = run_study(study, results, retry_failed=args.retry_failed, progress=args.progress)
    finished = prog.skipped + prog.ran
    print(f"{study.name}: {finished}/{prog.total} runs recorded in {results}"
          + (f"; {prog.failed} failed this time" if prog.failed else ""), file=sys.stderr)
    if prog.interrupted:
        return 130
    if args.report:
        rep = make_report(results, description=study.description, order=study.variant_names(), sweep=study.report)
        print(rep.markdown)
        print(f"wrote {rep.markdown_path}" + "".join(f", {p.name}" for p in rep.plots), file=sys.stderr)
    return 1 if prog.failed else 0
