"""``gnnpipe plan``: predict every feasible layout of R ranks (time, bytes, peak memory per rank), best first.

Profiles the model on the graph here (per-unit chunk costs against rows and halo rows, saved activations, the
optimizer step, and a 2-rank ping-pong over the actual backend: a few seconds to a minute), then for every
layout W x S = R — graph parallelism (S = 1), GNNPipe (W = 1), hybrids — with C = k·S chunks per way
(``--chunks-per-stage``), each METIS over-partitioning factor (``--over-partitions``) and scheduler, builds
the plan the run would build and predicts its epoch time (discrete-event simulation of the schedule), bytes
per epoch (DESIGN §6, exact) and peak memory per rank (runtime floor + the memory model). Layouts that do not
fit the hardware's memory are marked and sorted last. ``--hardware FILE`` predicts for another machine
(TOML; shipped: local-2core, cpu-16core, paper-a5000). ``--out plan.json`` writes the records.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .train import add_plan_arguments, add_train_arguments, check_writable, config_from_args, warn_layout_flags


def register(sub) -> None:
    from .main import HelpFormatter

    p = sub.add_parser("plan", help="predict every layout's epoch time, bytes and memory (cost model)",
                       description=__doc__, formatter_class=HelpFormatter)
    add_train_arguments(p)
    add_plan_arguments(p)
    p.add_argument("--out", default=None, help="write the ranking as JSON records")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress messages")
    p.set_defaults(func=run)


def plan_from_args(config, args, progress: bool = True):
    """Profile (or load the profile) and rank the layouts; returns ``(predictions, hardware, profile)``."""
    from ..api import plan
    from ..errors import ConfigError

    if args.ranks is None:
        raise ConfigError("give the number of ranks to plan for: --ranks R")
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    return plan(config, ranks=args.ranks, hardware=args.hardware,
                chunks_per_stage=args.chunks_per_stage, over_partitions=args.over_partitions, schedulers=schedulers,
                profile_in=args.profile_in, profile_out=args.profile_out, progress=progress,
                contention=args.contention)


def run(args: argparse.Namespace) -> int:
    from ..core.run.results import json_safe
    from ..core.training.trainer import resolve_config
    from ..costmodel.predict import format_ranking

    config = resolve_config(config_from_args(args))
    warn_layout_flags(config, "gnnpipe plan predicts every layout of --ranks ranks; --schedulers lists the candidates")
    if args.out:
        check_writable(args.out)
    preds, hw, _ = plan_from_args(config, args, progress=args.progress)
    print(format_ranking(preds, hw))
    if not any(p.fits for p in preds):
        print("gnnpipe plan: no layout fits the hardware's memory", file=sys.stderr)
    if args.out:
        doc = [p.to_record() for p in preds]
        Path(args.out).write_text(json.dumps(json_safe(doc), indent=1))
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
