"""``gnnpipe schedule``: show, list and validate pipeline schedules.

Examples::

    gnnpipe schedule list
    gnnpipe schedule show 1f1b --stages 4 --chunks 8
    gnnpipe schedule show gpipe --stages 4 --chunks 8 --order shuffle --seed 1 --png gpipe.png
    gnnpipe schedule show 1f1b --stages 4 --chunks 8 --csv s.csv     # the file torch.distributed.pipelining reads
    gnnpipe schedule show async-stale --stages 4 --chunks 4 --epochs 3 --trace trace.json --csv s.csv \\
        --csv-format gnnpipe
    gnnpipe schedule validate s.csv

CSV files: one row per stage, one cell per time slot, an action ("2F0") or empty for idle. The default
format is torch's compute-only CSV (one epoch, no optimizer-step cells), which torch's
``_Action.from_str`` and ``_load_csv`` read; ``--csv-format gnnpipe`` adds gnnpipe's optimizer steps
("0S") and epoch suffixes ("0F3@1"). Reading a single-epoch file without any step (torch's format),
``--from-csv`` and ``validate`` add the step at the end of every row.
"""

from __future__ import annotations

import argparse

from .. import schedulers as gs
from ..errors import ConfigError
from ..schedulers import ActionKind
from .main import HelpFormatter


def _add_build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", nargs="?", help="scheduler name (see `gnnpipe schedule list`)")
    p.add_argument("--stages", "-S", type=int, default=4, help="number of pipeline stages S")
    p.add_argument("--chunks", "-C", type=int, default=8, help="number of chunks C per epoch")
    p.add_argument("--epochs", "-E", type=int, default=1, help="consecutive epochs in one schedule")
    p.add_argument("--order", choices=["fixed", "shuffle"], default="fixed",
                   help="chunk order policy (shuffle = GNNPipe's T1, seeded, same on every stage)")
    p.add_argument("--seed", type=int, default=0, help="seed of --order shuffle")
    p.add_argument("--stash-weights", action="store_true",
                   help="weight stashing (schedulers without flush, e.g. async-stale)")
    p.add_argument("--second-order", action="store_true",
                   help="add the G and D passes of conservative-force training (atomistic S2EF pipelines)")
    p.add_argument("--from-csv", metavar="FILE", default=None,
                   help="load a custom schedule from a CSV (torch's compute-only format or gnnpipe's) instead of "
                        "building NAME")


def build_from_args(args: argparse.Namespace):
    """The schedule named by the common arguments (built and validated, or loaded and validated)."""
    if args.from_csv:
        if args.name:
            raise ConfigError("give either a scheduler NAME or --from-csv FILE, not both")
        return gs.validate(load_csv(args.from_csv))
    if not args.name:
        raise ConfigError(f"name a scheduler ({', '.join(gs.available())}) or give --from-csv FILE")
    options = {"stash_weights": True} if args.stash_weights else {}
    if getattr(args, "second_order", False):
        options["second_order"] = True
    return gs.build_schedule(args.name, args.stages, args.chunks, order=args.order, seed=args.seed,
                             epochs=args.epochs, **options)


def load_csv(path: str, *, add_steps: bool = False, **kwargs):
    """:func:`gnnpipe.schedulers.from_csv`, adding the optimizer steps that torch's format leaves out
    when a single-epoch file has none (or when ``add_steps``)."""
    sch = gs.from_csv(path, add_steps=add_steps, **kwargs)
    has_step = any(a is not None and a.kind is ActionKind.STEP for row in sch.stages for a in row)
    if not has_step and sch.epochs == 1:
        sch = gs.from_csv(path, add_steps=True, **kwargs)
    return sch


def _write_outputs(args, schedule, result) -> None:
    if getattr(args, "csv", None):
        fmt = getattr(args, "csv_format", "torch")
        if fmt == "torch" and schedule.epochs > 1:
            raise ConfigError(f"torch's CSV format holds one epoch; this schedule has {schedule.epochs}. "
                              "Use --epochs 1, or --csv-format gnnpipe (epoch suffixes and steps; gnnpipe reads it, "
                              "torch does not)")
        gs.to_csv(schedule, args.csv, steps=fmt == "gnnpipe")
        print(f"wrote CSV ({fmt} format) to {args.csv}")
    if getattr(args, "trace", None):
        gs.to_chrome_trace(result, args.trace)
        print(f"wrote chrome trace to {args.trace}")
    if getattr(args, "png", None):
        gs.plot_timeline(result, args.png)
        print(f"wrote timeline to {args.png}")


def _show(args: argparse.Namespace) -> int:
    sch = build_from_args(args)
    res = gs.simulate(sch)
    S, C = sch.num_stages, sch.num_chunks
    print(f"schedule {sch.name!r}: {S} stage(s), {C} chunk(s), {sch.epochs} epoch(s); "
          f"flush={sch.flush}, weight staleness bound={sch.weight_staleness}"
          + (", weight stashing" if sch.stash_weights else ""))
    extra = "G = force pass (S→1), D = second-order pass (1→S), " if sch.second_order else ""
    print(f"F = forward, B = backward, {extra}S = optimizer step, {{stage}}{{kind}}{{chunk}}[@epoch]; '.' = idle")
    print(gs.to_ascii(sch, by_stage=args.by_stage))
    print(f"unit costs (F = B = 1 slot, step free, no communication): makespan {res.makespan:g}, "
          f"bubble per stage " + ", ".join(f"{b:.0%}" for b in res.bubble_fraction)
          + f"; peak in-flight chunks per stage {res.peak_inflight}")
    steady = res.summary().get("steady_state_bubble")
    if steady is not None:
        print("steady-state bubble per stage (fill and drain epochs left out): "
              + ", ".join(f"{b:.0%}" for b in steady))
    _write_outputs(args, sch, res)
    return 0


def _list(args: argparse.Namespace) -> int:
    names = gs.available()
    w = max(map(len, names), default=0)
    for n in names:
        cls = gs.get(n)
        print(f"{n.ljust(w)}  flush={str(cls.flush).ljust(5)}  staleness={cls.weight_staleness}  {cls.describe()}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    sch = load_csv(args.file, num_chunks=args.chunks, flush=not args.no_flush,
                   weight_staleness=args.weight_staleness, add_steps=args.add_steps)
    gs.validate(sch)
    print(f"{args.file}: valid ({sch.num_stages} stage(s), {sch.num_chunks} chunk(s), {sch.epochs} epoch(s))")
    print(gs.to_ascii(sch))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "schedule", help="show, list and validate pipeline schedules",
        description=__doc__, formatter_class=HelpFormatter,
    )
    sub = p.add_subparsers(dest="schedule_command", metavar="ACTION")

    show = sub.add_parser("show", help="print a schedule's grid (and optionally a PNG, trace, CSV)",
                          description="Build a schedule and print its grid (time slots × stages) with "
                                      "its unit-cost makespan, bubbles and peak in-flight chunks.",
                          formatter_class=HelpFormatter)
    _add_build_args(show)
    show.add_argument("--by-stage", action="store_true", help="one line per stage instead of per slot")
    show.add_argument("--png", metavar="FILE", default=None, help="write a timeline picture (needs the plot extra)")
    show.add_argument("--trace", metavar="FILE", default=None, help="write a chrome-trace JSON (unit costs)")
    show.add_argument("--csv", metavar="FILE", default=None,
                      help="write the schedule as CSV (see --csv-format)")
    show.add_argument("--csv-format", choices=["torch", "gnnpipe"], default="torch",
                      help="torch: torch.distributed.pipelining's compute-only CSV (one epoch, no step cells; as "
                           "Python to_csv(steps=False)); gnnpipe: with optimizer steps and epoch suffixes")
    show.set_defaults(func=_show)

    ls = sub.add_parser("list", help="list the registered schedulers", formatter_class=HelpFormatter)
    ls.set_defaults(func=_list)

    val = sub.add_parser("validate", help="validate a schedule CSV", formatter_class=HelpFormatter)
    val.add_argument("file", metavar="FILE", help="schedule CSV, one row per stage (torch's or gnnpipe's format)")
    val.add_argument("--chunks", type=int, default=None, help="number of chunks (default: inferred)")
    val.add_argument("--add-steps", action="store_true",
                     help="append a missing optimizer step to each row (done anyway for a single-epoch file "
                          "without any step, as torch writes)")
    val.add_argument("--no-flush", action="store_true", help="the schedule does not flush between epochs")
    val.add_argument("--weight-staleness", type=int, default=0, help="declared weight-staleness bound")
    val.set_defaults(func=_validate)

    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
