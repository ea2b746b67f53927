"""``gnnpipe plan``: predict every feasible layout of R ranks (time, bytes, peak memory per rank), best first.

Profiles the model on the graph here (per-unit chunk costs against rows and halo rows, saved activations, the
optimizer step, and a 2-rank ping-pong over the actual backend: a few seconds to a minute), then for every
layout W x S = R — graph parallelism (S = 1), GNNPipe (W = 1), hybrids — with C = k·S chunks per way
(``--chunks-per-stage``), each METIS over-partitioning factor (``--over-partitions``) and scheduler, builds
the plan the run would build and predicts its epoch time (discrete-event simulation of the schedule), bytes
per epoch (exact) and peak memory per rank (runtime floor + the memory model). Layouts that do not
fit the hardware's memory are marked and sorted last. ``--hardware FILE`` predicts for another machine
(TOML; shipped: local-2core, cpu-16core, paper-a5000, h200x8, h200x64). ``--out plan.json`` writes the records.

An atomistic job (an atomistic ``--model`` (``gnnpipe models`` lists them), or ``--task s2ef``) is ranked over its
S x G x D layouts (pipeline stages x graph-parallel ranks x replicas) by :mod:`gnnpipe.tasks.s2ef.cost`: one profiled
training step on the replica batch, then step time, structures per second, bytes, memory per rank and what fits;
``--params 1e9`` projects a model of that size (docs/guides/atomistic-cost.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import attrs

from .. import models, tasks
from ..api import plan, plan_s2ef
from ..core.run.results import json_safe
from ..core.settings.config import TrainConfig
from ..errors import ConfigError
from ..tasks.nodes.cost.predict import format_ranking
from ..tasks.nodes.trainer import resolve_config
from ..tasks.s2ef.cost import format_atom_ranking
from .main import HelpFormatter
from .train import add_plan_arguments, add_train_arguments, check_writable, config_from_args, warn_layout_flags


def register(sub) -> None:
    p = sub.add_parser("plan", help="predict every layout's epoch time, bytes and memory (cost model)",
                       description=__doc__, formatter_class=HelpFormatter)
    add_train_arguments(p)
    add_plan_arguments(p)
    a = p.add_argument_group("atomistic jobs (S2EF: an atomistic --model, or --task s2ef)")
    a.add_argument("--task", choices=["auto", "s2ef"], default="auto",
                   help="s2ef: plan an atomistic job (S x G x D layouts; default model dimenet++); auto: from "
                        "--model / --dataset")
    a.add_argument("--params", type=float, default=None,
                   help="project for a model of this many parameters (e.g. 1e9): blocks (and width) chosen to "
                        "reach it, built on the meta device; the profile of --model's configuration supplies the "
                        "seconds per unit of work and the double-backward factor")
    a.add_argument("--projection-hidden", type=int, default=None,
                   help="width of the --params model (default 1024 up to 3e8 parameters, else 2048)")
    a.add_argument("--plan-structures", choices=["dataset", "oc20-sized"], default="dataset",
                   help="the replica's batch of --batch-size structures: the dataset's first, or generated "
                        "OC20-sized slabs (65-66 atoms)")
    a.add_argument("--no-pipeline", dest="pipeline_layouts", action="store_false",
                   help="rank only D x G layouts (no pipeline stages S)")
    p.add_argument("--out", default=None, help="write the ranking as JSON records")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress messages")
    p.set_defaults(func=run, model=None)  # None: --model not given (its default depends on the task)


def plan_from_args(config, args, progress: bool = True):
    """Profile (or load the profile) and rank the layouts; returns ``(predictions, hardware, profile)``."""
    if args.ranks is None:
        raise ConfigError("give the number of ranks to plan for: --ranks R")
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    return plan(config, ranks=args.ranks, hardware=args.hardware,
                chunks_per_stage=args.chunks_per_stage, over_partitions=args.over_partitions, schedulers=schedulers,
                profile_in=args.profile_in, profile_out=args.profile_out, progress=progress,
                contention=args.contention)


def run(args: argparse.Namespace) -> int:
    given_model = args.model is not None
    if not given_model:
        args.model = TrainConfig().model
    config = config_from_args(args)
    if _is_s2ef(config, args):
        return _run_s2ef(config, args, given_model)
    auto_recompute = config.recompute is None
    config = resolve_config(config)
    if auto_recompute:  # "auto" resolved to off for one process: each pipeline layout decides it (api.plan)
        config = attrs.evolve(config, recompute=None)
    warn_layout_flags(config, "gnnpipe plan predicts every layout of --ranks ranks; --schedulers lists the candidates")
    if args.out:
        check_writable(args.out)
    preds, hw, prof = plan_from_args(config, args, progress=args.progress)
    print(format_ranking(preds, hw, prof))
    if not any(p.fits for p in preds):
        print("gnnpipe plan: no layout fits the hardware's memory", file=sys.stderr)
    if args.out:
        doc = [p.to_record() for p in preds]
        Path(args.out).write_text(json.dumps(json_safe(doc), indent=1))
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _is_s2ef(config, args) -> bool:
    if getattr(args, "task", "auto") == "s2ef":
        return True
    return tasks.for_config(config).name == "s2ef"


def _run_s2ef(config, args: argparse.Namespace, given_model: bool = True) -> int:
    """``gnnpipe plan`` of an atomistic job: the S x G x D ranking (:func:`gnnpipe.api.plan_s2ef`)."""
    if getattr(models.get(config.model), "task", None) != "s2ef":
        if given_model:
            raise ConfigError(f"--task s2ef needs an atomistic model ({', '.join(_atomistic_models())}), not "
                              f"--model {config.model}")
        config = attrs.evolve(config, model="dimenet++", model_args={})
    config = tasks.get("s2ef")().resolve(config)
    warn_layout_flags(config, "gnnpipe plan predicts every S x G x D layout of --ranks ranks; --gp-size keeps those "
                      "of its G", names=("ways", "stages", "chunks", "scheduler"))
    if args.out:
        check_writable(args.out)
    if args.ranks is None:
        raise ConfigError("give the number of ranks to plan for: --ranks R")
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    preds, hw, prof, build = plan_s2ef(
        config, ranks=args.ranks, hardware=args.hardware, chunks_per_stage=args.chunks_per_stage,
        schedulers=schedulers, profile_in=args.profile_in, profile_out=args.profile_out, progress=args.progress,
        params=args.params, projection_hidden=args.projection_hidden, structures=args.plan_structures,
        stages=args.pipeline_layouts)
    batch = build.pop("batch")
    sizes = f"{batch['atoms']:,} atoms, {batch['edges']:,} edges, {batch['triplets']:,} triplets"
    taken = f"{prof.atoms:,} atoms, {prof.edges:,} edges, {prof.triplets:,} triplets"
    print(f"model: {config.model} {build}; replica batch: {batch['structures']} structures ({sizes}); profile: "
          f"{prof.step_s:.3g} s/step" + (f" taken on {taken}" if taken != sizes else "") + f", kappa {prof.kappa:.2f}")
    print(format_atom_ranking(preds, hw, params=build["parameters"]))
    if not any(p.fits for p in preds):
        print("gnnpipe plan: no layout fits the hardware's memory", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(json_safe([p.to_record() for p in preds]), indent=1))
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _atomistic_models() -> list[str]:
    """The registered models that predict energies and forces (``task = "s2ef"``)."""
    return [n for n in models.available() if getattr(models.get(n), "task", None) == "s2ef"]
