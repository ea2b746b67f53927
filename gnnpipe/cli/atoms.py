"""``gnnpipe atoms``: atomistic data sets.

``gnnpipe atoms generate`` writes a data set built with ASE and labelled by its EMT calculator as extended XYZ
(energies and forces as properties): ``oc20`` (adsorbates on fcc(111) slabs: rattles and relaxation frames) or
``md17`` (small molecules along Langevin trajectories). Without ``--out`` the file is cached under
``$GNNPIPE_CACHE`` (default ``~/.cache/gnnpipe/datasets``) and reused by the same arguments.
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
