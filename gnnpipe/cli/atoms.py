"""``gnnpipe atoms``: atomistic data sets.

``gnnpipe atoms generate`` writes a data set built with ASE and labelled by its EMT calculator as extended XYZ
(energies and forces as properties): ``oc20`` (adsorbates on fcc(111) slabs: rattles and relaxation frames) or
``md17`` (small molecules along Langevin trajectories). Without ``--out`` the file is cached under
``$GNNPIPE_CACHE`` (default ``~/.cache/gnnpipe/datasets``) and reused by the same arguments.

``gnnpipe atoms scales MODEL --out scales.json`` writes the scale factors of a trained GemNet model file (``gnnpipe
export``; every ``gemnet-t`` run fits them on its first training structures) as JSON, for another run to reuse with
``--model-arg scale_file=scales.json`` instead of fitting its own.
"""

from __future__ import annotations

import argparse
import sys
import time


def register(sub) -> None:
    from .main import HelpFormatter

    p = sub.add_parser("atoms", help="atomistic data sets (generate an EMT-labelled one)", description=__doc__,
                       formatter_class=HelpFormatter)
    commands = p.add_subparsers(dest="atoms_command", metavar="ACTION", required=True)
    g = commands.add_parser("generate", help="write an EMT-labelled data set as extended XYZ",
                            description=__doc__, formatter_class=HelpFormatter)
    g.add_argument("--kind", choices=["oc20", "md17", "oc20-is2rs"], default="oc20",
                   help="which data set (oc20-is2rs: initial structures, and their EMT relaxations in "
                        "<stem>.relaxed.extxyz beside them)")
    g.add_argument("--frames", type=int, default=200, help="number of structures")
    g.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    g.add_argument("--out", help="the .extxyz file to write (default: a cached file, its path printed)")
    g.add_argument("--overwrite", action="store_true", help="regenerate the cached file even if it exists")
    g.set_defaults(func=run_generate)
    sc = commands.add_parser("scales", help="write a trained GemNet model's scale factors (a scale_file)",
                             description=__doc__, formatter_class=HelpFormatter)
    sc.add_argument("model", help="a model file written by gnnpipe export (a gemnet-t run)")
    sc.add_argument("--out", required=True, help="the JSON file to write (for --model-arg scale_file=FILE)")
    sc.set_defaults(func=run_scales)


def run_scales(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..models import load
    from ..tasks.s2ef.scaling import write_scale_file

    model = load(args.model)
    values = getattr(model, "scale_factor_values", None)
    if values is None:
        raise ConfigError(f"{args.model} holds a {type(model).__name__}, which has no scale factors; give a "
                          f"gemnet-t model file")
    path = write_scale_file(values(), args.out)
    print(f"{len(values())} scale factors of {args.model} written to {path}", file=sys.stderr)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from ..data.atoms import generated_file
    from ..errors import ConfigError

    if args.frames < 1:
        raise ConfigError(f"--frames must be >= 1, got {args.frames}")
    start = time.perf_counter()
    path = generated_file(args.kind, args.frames, args.seed, out=args.out, overwrite=args.overwrite)
    print(path)
    print(f"{args.kind}: {args.frames} frames (seed {args.seed}) in {path} "
          f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0
