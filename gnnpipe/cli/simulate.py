"""``gnnpipe simulate``: discrete-event simulation of a pipeline schedule.

Examples::

    gnnpipe simulate gpipe --stages 4 --chunks 8
    gnnpipe simulate 1f1b --stages 4 --chunks 8 --forward 1 --backward 2 --stage-scale 3,2,2,3
    gnnpipe simulate async-stale --stages 4 --chunks 8 --epochs 4 --png async.png
    gnnpipe simulate 1f1b -S 4 -C 8 --bytes-per-chunk 4e6 --bandwidth 1e7 --no-overlap
    gnnpipe simulate --from-csv my_schedule.csv --json result.json

Time is in cost units (one forward = ``--forward`` units); ``--bandwidth`` is in bytes per unit.
"""

from __future__ import annotations

import argparse
import json

from .. import schedulers as gs
from ..errors import ConfigError
from .main import HelpFormatter
from .schedule import _add_build_args, _write_outputs, build_from_args


def _floats(text: str | None):
    if text is None:
        return None

    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"expected comma-separated numbers, got {text!r}") from None


def _run(args: argparse.Namespace) -> int:
    if not args.bandwidth > 0:  # inf (the default) is free communication
        raise ConfigError(f"--bandwidth must be > 0 bytes per time unit, got {args.bandwidth!r}")
    if not 0 <= args.latency < float("inf"):
        raise ConfigError(f"--latency must be a finite number >= 0 time units, got {args.latency!r}")
    sch = build_from_args(args)
    stage_scale, chunk_scale = _floats(args.stage_scale), _floats(args.chunk_scale)
    if stage_scale is not None and len(stage_scale) != sch.num_stages:
        raise ConfigError(f"--stage-scale needs {sch.num_stages} numbers, got {len(stage_scale)}")
    if chunk_scale is not None and len(chunk_scale) != sch.num_chunks:
        raise ConfigError(f"--chunk-scale needs {sch.num_chunks} numbers, got {len(chunk_scale)}")
    costs = gs.CostModel(args.forward, args.backward, args.step, stage_scale, chunk_scale)
    comm = None
    nbytes = _floats(args.bytes_per_chunk)
    if nbytes or args.latency:
        if nbytes and len(nbytes) not in (1, sch.num_chunks):
            raise ConfigError(f"--bytes-per-chunk needs 1 or {sch.num_chunks} numbers, got {len(nbytes)}")
        per = 0.0 if not nbytes else nbytes[0] if len(nbytes) == 1 else nbytes
        comm = gs.CommModel(per, args.bandwidth, args.latency, not args.no_overlap)
    res = gs.simulate(sch, costs, comm)
    print(res.to_text())
    if (args.forward == args.backward == 1 and args.step == 0 and comm is None and stage_scale is None
            and chunk_scale is None and sch.flush and not sch.second_order):
        S, C = sch.num_stages, sch.num_chunks
        print(f"textbook (unit costs, flush): makespan 2(C+S-1) = {2 * (C + S - 1)} per epoch, "
              f"bubble (S-1)/(C+S-1) = {(S - 1) / (C + S - 1):.1%}")
    if args.grid:
        print(gs.to_ascii(sch))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res.summary(), fh, indent=2)
        print(f"wrote summary to {args.json}")
    _write_outputs(args, sch, res)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate a pipeline schedule: makespan, bubbles, memory",
        description=__doc__, formatter_class=HelpFormatter,
    )
    _add_build_args(p)
    g = p.add_argument_group("costs (duration = base × stage scale × chunk scale)")
    g.add_argument("--forward", type=float, default=1.0, help="base duration of a forward")
    g.add_argument("--backward", type=float, default=1.0, help="base duration of a backward")
    g.add_argument("--step", type=float, default=0.0, help="base duration of an optimizer step")
    g.add_argument("--stage-scale", metavar="LIST", default=None,
                   help="comma-separated factor per stage, e.g. its number of layer units")
    g.add_argument("--chunk-scale", metavar="LIST", default=None,
                   help="comma-separated factor per chunk, e.g. its edges relative to the mean")
    c = p.add_argument_group("communication")
    c.add_argument("--bytes-per-chunk", metavar="B", default=None,
                   help="bytes of one chunk's boundary tensor: one number or one per chunk (comma-separated)")
    c.add_argument("--bandwidth", type=float, default=float("inf"), help="bytes per time unit")
    c.add_argument("--latency", type=float, default=0.0, help="time added to every send")
    c.add_argument("--no-overlap", action="store_true", help="the sender waits for its send to finish")
    o = p.add_argument_group("output")
    o.add_argument("--grid", action="store_true", help="also print the schedule grid")
    o.add_argument("--json", metavar="FILE", default=None, help="write the summary as JSON")
    o.add_argument("--trace", metavar="FILE", default=None, help="write a chrome-trace JSON of the run")
    o.add_argument("--png", metavar="FILE", default=None, help="write a timeline picture (plot extra)")
    p.set_defaults(func=_run)
