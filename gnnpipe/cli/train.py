"""``gnnpipe train``: train a model single-process, pipelined (GNNPipe), graph-parallel or hybrid."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

import attrs

from .. import api
from ..core.run.launch import _interrupt, under_torchrun
from ..core.run.stopping import unblock_stop_signals
from ..core.settings.arguments import add_train_arguments, config_from_args  # noqa: F401  (re-exported)
from ..core.settings.config import TrainConfig
from ..core.settings.options import RunOptions
from ..core.settings.runfile import run_file_path, write_run_file
from ..errors import ConfigError
from .main import HelpFormatter


def check_writable(path: str) -> None:
    """Fail before training, not after, when ``--out`` cannot be written.

    Raises:
        ConfigError: ``path`` is an existing directory, an existing file that is not writable, or its folder
            cannot be created or is not writable.
    """
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"--out {path!r} is an existing directory; --out names the JSON file to write, "
                          f"e.g. --out {os.path.join(path, 'run.json')}")
    if target.exists() and not os.access(target, os.W_OK):
        raise ConfigError(f"--out {path!r} exists and is not writable; pick another path")
    parent = target.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the folder of --out {path!r}: {exc.strerror}; pick another path") from None
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"the folder of --out {path!r} is not writable; pick another path")


def warn_layout_flags(config, why: str, names=("ways", "stages", "chunks", "scheduler")) -> None:
    """Warn about layout flags (``names`` of ``--ways``, ``--stages``, ``--chunks``, ``--scheduler``, ``--gp-size``) a
    command that chooses the layout itself ignores (``why``: what chooses it), when they were set away from their
    defaults."""
    set_ = {"ways": config.ways != 1, "stages": config.stages != 1, "chunks": config.chunks is not None,
            "scheduler": config.scheduler != TrainConfig().scheduler,
            "gp-size": config.graph_parallel_group_size != 1}
    flags = ["--" + n for n in names if set_[n]]
    if flags:
        warnings.warn(f"ignored: {', '.join(flags)} ({why})", stacklevel=3)


def _ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return vals


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """The flags shared by ``gnnpipe plan`` and ``gnnpipe train --layout auto``."""
    g = p.add_argument_group("layout planning (cost model)")
    g.add_argument("--ranks", "-P", type=int, default=None, help="ranks R to plan for (plan: required)")
    g.add_argument("--hardware", default=None,
                   help="hardware TOML file or shipped name (local-2core, cpu-16core, paper-a5000, h200x8, h200x64); "
                        "default: this machine with the measured link")
    g.add_argument("--chunks-per-stage", type=_ints, default="4",
                   help="chunks per stage and way k (C = k·S·W), comma-separated")
    g.add_argument("--over-partitions", type=_ints, default="1,4", help="METIS over-partitioning factors to try")
    g.add_argument("--schedulers", default="gpipe,1f1b", help="schedulers to try (comma-separated)")
    g.add_argument("--profile-in", default=None, help="reuse a profile JSON written by --profile-out")
    g.add_argument("--profile-out", default=None, help="write the profile JSON")
    g.add_argument("--no-contention", dest="contention", action="store_false",
                   help="do not measure how ranks computing at once slow each other (a shorter profile; the "
                        "prediction then assumes they do not)")


def register(sub) -> None:
    p = sub.add_parser("train", help="train a GNN (single process, GNNPipe, graph-parallel or hybrid)",
                       description=__doc__, formatter_class=HelpFormatter)
    add_train_arguments(p)
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a run file (TOML) holding any of these flags (keys: the flags' names, e.g. model, gp-size, "
                        "max-steps); flags given on the command line override it. Every run writes its resolved "
                        "configuration as one (<out>.config.toml, <checkpoint-dir>/config.toml)")
    p.add_argument("--out", default=None,
                   help="write the result (config, per-epoch records, summary) as JSON")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (default: shown on a terminal)")
    p.add_argument("--layout", choices=["manual", "auto"], default="manual",
                   help="manual: --ways/--stages/--chunks as given; auto: profile, predict every layout of --ranks "
                        "ranks (the cost model of `gnnpipe plan`), print the ranking, train the best that fits")
    add_plan_arguments(p)
    add_run_arguments(p)
    p.set_defaults(func=run, flags_parser=p)  # flags_parser: which flags were given (demo_keeping_flags)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of :class:`~gnnpipe.core.settings.options.RunOptions` (logging, kept weights, checkpoints)."""
    g = p.add_argument_group("saving and logging")
    g.add_argument("--keep", choices=["best", "last"], default="best",
                   help="weights of the trained model: of the best-validation epoch, or of the last epoch")
    g.add_argument("--log-every", type=int, default=None,
                   help="when stdout is not a terminal, print a line every k epochs (0: never; default: every 10%% "
                        "of the epochs)")
    g.add_argument("--log-csv", default=None, help="append each epoch record to this CSV file")
    g.add_argument("--tensorboard", default=None,
                   help="write the epoch records to this TensorBoard folder (needs the tensorboard package)")
    g.add_argument("--checkpoint-dir", default=None,
                   help="write checkpoints (torch.distributed.checkpoint) into this folder")
    g.add_argument("--checkpoint-every", type=int, default=0,
                   help="checkpoint every k epochs (0: only at the end; needs --checkpoint-dir)")
    g.add_argument("--checkpoint-every-steps", type=int, default=0,
                   help="atomistic S2EF: also checkpoint every k optimizer steps, inside epochs (0: off; needs "
                        "--checkpoint-dir); --resume continues at the next batch, exactly")
    g.add_argument("--log-every-steps", type=int, default=None,
                   help="atomistic S2EF: when stdout is not a terminal, print a step line every k optimizer steps "
                        "(0: never; default: every 10%% of --max-steps, at most 1000, when it is given)")
    g.add_argument("--resume", default=None, help="continue the run of this checkpoint folder")
    g.add_argument("--no-memory-check", dest="memory_check", action="store_false",
                   help="start the run even when the memory model predicts more memory than is available "
                        "(single process, or the ranks started on this machine together; by default it is refused "
                        "up front)")


def options_from_args(args: argparse.Namespace):
    return RunOptions(keep=args.keep, log_every=args.log_every, log_csv=args.log_csv, tensorboard=args.tensorboard,
                      checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, resume=args.resume,
                      memory_check=args.memory_check,
                      checkpoint_every_steps=getattr(args, "checkpoint_every_steps", 0),
                      log_every_steps=getattr(args, "log_every_steps", None))


#: what ``gnnpipe train`` with no flag that chooses the job trains: the main job, a GNNPipe pipeline of 2 stages, on
#: the synthetic default graph (learnable: GCNII reaches ~75 % test accuracy on its 5 classes, majority 20 %), in
#: under a minute
DEMO = {"stages": 2, "epochs": 100}

#: flags (by ``dest``) that say how a run is reported, saved, checked or waited on, not what is trained: given alone
#: they keep :data:`DEMO` (``--resume`` too, so that a demo's checkpoint continues as the demo). Every other flag
#: chooses the job (data, model, optimisation, layout, threads, device, …) and leaves the demo: the flags' defaults
#: apply.
DEMO_KEEPING = ("out", "progress", "keep", "log_every", "log_csv", "tensorboard", "checkpoint_dir", "checkpoint_every",
                "resume", "memory_check", "timeout_s")


class _NotGiven(list):
    """The value of a flag not given (a list: ``append`` flags copy and extend it, making another object)."""


def demo_keeping_flags(args: argparse.Namespace) -> list[str] | None:
    """Whether ``gnnpipe train`` trains :data:`DEMO`: the flags given (as spelled, e.g. ``["--out"]``; ``[]``:
    none) when every one is in :data:`DEMO_KEEPING`, else ``None`` (a flag chooses the job, or the words given
    are unknown: a call of :func:`run` without the command line's ``argv``)."""
    argv, parser = getattr(args, "argv", None), getattr(args, "flags_parser", None)
    if not argv or argv[0] != "train" or parser is None:
        return None
    sentinel = _NotGiven()
    dests = {a.dest for a in parser._actions if a.dest != argparse.SUPPRESS}
    # argparse fills in a default only where the namespace has no value yet: what keeps the sentinel was not given
    given, _ = parser.parse_known_args(argv[1:], argparse.Namespace(**{d: sentinel for d in dests}))
    chosen = [d for d in dests if getattr(given, d) is not sentinel and d not in ("func", "flags_parser")]
    if any(d not in DEMO_KEEPING for d in chosen):
        return None
    spelled = {a.dest: next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
               for a in parser._actions if a.option_strings}
    return sorted(spelled.get(d, d) for d in chosen)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    kept = demo_keeping_flags(args)
    if kept is not None and not under_torchrun():
        config = attrs.evolve(config, **DEMO)
        why = (f"no flag choosing the job given ({', '.join(kept)} only say how to report, save or check it)" if kept
               else "no flags given")
        print(f"gnnpipe: {why}: training the demo, a 2-stage GNNPipe pipeline (--stages 2, 2 local processes, "
              "--epochs 100) on the synthetic default graph; `gnnpipe train --help` lists the flags, "
              "`--stages 1` trains in one process", file=sys.stderr)
    options = options_from_args(args)
    if args.out:
        check_writable(args.out)
    layout_kw = {}
    if args.layout == "auto":
        if args.ranks is None:
            raise ConfigError("--layout auto needs the number of ranks: --ranks R")
        plan_options = {"chunks_per_stage": args.chunks_per_stage, "over_partitions": args.over_partitions,
                        "schedulers": [x.strip() for x in args.schedulers.split(",") if x.strip()],
                        "profile_in": args.profile_in, "profile_out": args.profile_out,
                        "contention": args.contention}
        layout_kw = {"layout": "auto", "ranks": args.ranks, "hardware": args.hardware, "plan_options": plan_options}
        warn_layout_flags(config, "--layout auto picks the layout of --ranks ranks; --schedulers lists the candidates")
    elif args.ranks is not None or args.hardware is not None:
        flags = ", ".join(f for f, v in (("--ranks", args.ranks), ("--hardware", args.hardware)) if v is not None)
        warnings.warn(f"ignored: {flags} (they choose a layout only with --layout auto; the layout is "
                      "--ways x --stages)", stacklevel=2)
    for flag, every in (("--checkpoint-every", args.checkpoint_every),
                        ("--checkpoint-every-steps", args.checkpoint_every_steps)):
        if every and not args.checkpoint_dir and not args.resume:
            warnings.warn(f"ignored: {flag} {every} (no --checkpoint-dir: no checkpoints are written; give "
                          "--checkpoint-dir DIR)", stacklevel=2)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill`, `timeout`: end like Ctrl-C

        unblock_stop_signals()
    try:
        result = api.train(config, progress=args.progress, options=options, **layout_kw)
    except BaseException as exc:
        partial = getattr(exc, "result", None)
        if partial is not None and args.out:  # the epochs completed so far are not lost
            partial.save(args.out)
            n = len(partial.epochs)
            print(f"wrote {args.out} ({partial.status} after {n} epoch{'s' if n != 1 else ''})", file=sys.stderr)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if result is None:  # a non-zero rank under torchrun
        return 0
    print(result.summary())
    if args.out:
        result.save(args.out)
        conf = write_run_file(result.config, run_file_path(args.out))
        print(f"wrote {args.out} (and its configuration, {conf})", file=sys.stderr)
    return 0
