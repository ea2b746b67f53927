"""``gnnpipe atoms``: atomistic data sets.

``gnnpipe atoms generate`` writes a data set built with ASE and labelled by its EMT calculator: ``oc20`` (adsorbates
on fcc(111) slabs: rattles and relaxation frames), ``oc20-paths`` (frames along whole EMT relaxations of the
``oc20-is2rs`` set's kind of initial structures), ``oc20-is2rs`` (initial structures and their relaxations), ``bulk``
(strained and rattled bulk crystals and alloys, with stresses) or ``md17`` (small molecules along Langevin
trajectories), in the format of ``--out``'s suffix (``.extxyz``, ``.db``, ``.aselmdb``, fairchem ``.lmdb``). Without
``--out`` an extended XYZ file is cached under ``$GNNPIPE_CACHE`` (default ``~/.cache/gnnpipe/datasets``) and reused
by the same arguments. ``--metals`` and ``--adsorbates`` narrow the draws, so that sets of one kind can differ in
domain: a validation set of adsorbates (or metals) the training set lacks stands in for OC20's ``val_ood_ads``
(``val_ood_cat``).

``gnnpipe atoms convert IN OUT`` rewrites a structure file or folder in the format of ``OUT``'s suffix, one structure
at a time. ``gnnpipe atoms check PATH`` reads and validates every structure of a file or folder and prints a
summary: structures, atoms, elements, the energy range, neighbours per atom within ``--cutoff``.

``gnnpipe atoms scales MODEL --out scales.json`` writes the scale factors of a trained GemNet model file (``gnnpipe
export``; every ``gemnet-t`` run fits them on its first training structures) as JSON, for another run to reuse with
``--model-arg scale_file=scales.json`` instead of fitting its own.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from ase.data import chemical_symbols

from ..data.atoms import generated_file
from ..data.atoms.generate import EMT_METALS, GENERATORS, OC20_ADSORBATES, reference_path
from ..data.atoms.graph import neighbor_pairs
from ..data.atoms.sets import PreparedSet, format_of, open_structures, write_structures
from ..errors import ConfigError
from ..models import load
from ..progress import progress_bar
from ..tasks.s2ef.scaling import write_scale_file
from .main import HelpFormatter


def register(sub) -> None:
    p = sub.add_parser("atoms", help="atomistic data sets (generate, convert, check)", description=__doc__,
                       formatter_class=HelpFormatter)
    commands = p.add_subparsers(dest="atoms_command", metavar="ACTION", required=True)
    g = commands.add_parser("generate", help="write an EMT-labelled data set (.extxyz, .db, .aselmdb, .lmdb)",
                            description=__doc__, formatter_class=HelpFormatter)
    g.add_argument("--kind", choices=["oc20", "md17", "bulk", "oc20-paths", "oc20-is2rs"], default="oc20",
                   help="which data set (bulk: strained and rattled bulk crystals and alloys labelled with stresses "
                        "too; oc20-paths: frames along whole EMT relaxations of IS2RS-like initial "
                        "structures; oc20-is2rs: initial structures, and their EMT relaxations in "
                        "<stem>.relaxed.extxyz beside them)")
    g.add_argument("--frames", type=int, default=200, help="number of structures")
    g.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    g.add_argument("--metals", default=None, metavar="M,M,…",
                   help="the EMT metals drawn from, comma-separated (oc20, oc20-paths, oc20-is2rs: the slab; bulk: "
                        "host and alloying metals) (default: Al, Ni, Cu, Pd, Ag, Pt, Au)")
    g.add_argument("--adsorbates", default=None, metavar="A,A,…",
                   help="the adsorbates drawn from, comma-separated (oc20, oc20-paths, oc20-is2rs) (default: O, H, "
                        "N, C, CO, OH)")
    g.add_argument("--out", help="the file to write, its format by suffix: .extxyz, .db, .aselmdb, .lmdb (default: "
                                 "a cached .extxyz file, its path printed)")
    g.add_argument("--overwrite", action="store_true", help="regenerate the cached file even if it exists; replace "
                                                              "--out if it exists")
    g.set_defaults(func=run_generate)
    c = commands.add_parser("convert", help="rewrite a structure file or folder in another format",
                            description=__doc__, formatter_class=HelpFormatter)
    c.add_argument("input", metavar="IN", help="a structure file (.extxyz, .xyz, .db, .aselmdb, .lmdb) or a folder "
                                               "of such files of one format")
    c.add_argument("output", metavar="OUT", help="the file to write, its format by suffix")
    c.add_argument("--energy-key", default=None, help="the energy label of IN (default: energy)")
    c.add_argument("--forces-key", default=None, help="the force label of IN (default: forces)")
    c.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    c.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    c.set_defaults(func=run_convert)
    k = commands.add_parser("check", help="validate every structure of a file or folder and summarise it",
                            description=__doc__, formatter_class=HelpFormatter)
    k.add_argument("path", metavar="PATH", help="a structure file or a folder of such files of one format")
    k.add_argument("--cutoff", type=float, default=6.0, help="Å: the radius of the neighbour count")
    k.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="the training dtype the values are judged in")
    k.add_argument("--energy-key", default=None, help="the energy label (default: energy)")
    k.add_argument("--forces-key", default=None, help="the force label (default: forces)")
    k.add_argument("--skip-invalid", action="store_true",
                   help="count malformed structures and go on (default: stop at the first, naming it)")
    k.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    k.set_defaults(func=run_check)
    sc = commands.add_parser("scales", help="write a trained GemNet model's scale factors (a scale_file)",
                             description=__doc__, formatter_class=HelpFormatter)
    sc.add_argument("model", help="a model file written by gnnpipe export (a gemnet-t run)")
    sc.add_argument("--out", required=True, help="the JSON file to write (for --model-arg scale_file=FILE)")
    sc.set_defaults(func=run_scales)


def run_scales(args: argparse.Namespace) -> int:
    model = load(args.model)
    values = getattr(model, "scale_factor_values", None)
    if values is None:
        raise ConfigError(f"{args.model} holds a {type(model).__name__}, which has no scale factors; give a "
                          f"gemnet-t model file")
    path = write_scale_file(values(), args.out)
    print(f"{len(values())} scale factors of {args.model} written to {path}", file=sys.stderr)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    if args.frames < 1:
        raise ConfigError(f"--frames must be >= 1, got {args.frames}")
    if args.out is not None and format_of(args.out) is None:
        raise ConfigError(f"--out {args.out!r}: the format is chosen by the suffix; name the file .extxyz, .db, "
                          f".aselmdb or .lmdb")
    if args.out is not None and os.path.lexists(args.out) and not args.overwrite:
        raise ConfigError(f"{args.out} exists; remove it or pass --overwrite")
    choices = _draw_choices(args)
    start = time.perf_counter()
    if args.out is not None and format_of(args.out) != "extxyz":
        if args.kind == "oc20-is2rs":
            raise ConfigError(f"--kind oc20-is2rs writes two extended XYZ files (initial structures and "
                              f"<stem>.relaxed.extxyz); give --out NAME.extxyz, not {args.out!r}")
        path = args.out
        write_structures(args.out, GENERATORS[args.kind](args.frames, args.seed, **choices), overwrite=args.overwrite)
    else:
        path = generated_file(args.kind, args.frames, args.seed, out=args.out, overwrite=args.overwrite, **choices)
    if not sys.stdout.isatty():  # the file for a script reading stdout; a terminal has it in the line below
        print(path)
    also = ""
    if args.kind == "oc20-is2rs":
        also = f", their EMT relaxations in {reference_path(path)}"
    drawn = "".join(f", {k} {' '.join(v)}" for k, v in choices.items())
    print(f"{args.kind}: {args.frames} frames (seed {args.seed}{drawn}) in {path}{also} "
          f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0


def _draw_choices(args: argparse.Namespace) -> dict:
    """The generator's ``metals`` / ``adsorbates`` of ``--metals`` / ``--adsorbates`` (tuples; absent when not
    given).

    Raises:
        ConfigError: an empty list, an unknown metal or adsorbate, or a flag the kind does not draw.
    """
    takes = {"metals": ("oc20", "oc20-paths", "oc20-is2rs", "bulk"), "adsorbates": ("oc20", "oc20-paths", "oc20-is2rs")}
    allowed = {"metals": EMT_METALS, "adsorbates": OC20_ADSORBATES}
    out = {}
    for name in ("metals", "adsorbates"):
        given = getattr(args, name, None)
        if given is None:
            continue
        if args.kind not in takes[name]:
            raise ConfigError(f"--{name}: --kind {args.kind} draws no {name} (only {', '.join(takes[name])} do)")
        items = tuple(dict.fromkeys(x.strip() for x in given.split(",") if x.strip()))
        if not items:
            raise ConfigError(f"--{name} names none; give some of {', '.join(allowed[name])}, comma-separated")
        unknown = [x for x in items if x not in allowed[name]]
        if unknown:
            raise ConfigError(f"--{name}: unknown {', '.join(unknown)}; choose from {', '.join(allowed[name])}")
        out[name] = items
    return out


def run_convert(args: argparse.Namespace) -> int:
    src = open_structures(args.input, energy_key=args.energy_key, forces_key=args.forces_key)
    start = time.perf_counter()
    bar = progress_bar(total=len(src), desc="convert", unit="structure", enabled=args.progress)
    try:
        n = write_structures(args.output, (src[i] for i in range(len(src))), overwrite=args.overwrite, progress=bar)
    except FileExistsError as exc:
        raise ConfigError(f"{args.output} exists; remove it or pass --overwrite") from exc
    finally:
        bar.close()
    print(f"{n:,} structures from {args.input} written to {args.output} ({time.perf_counter() - start:.1f} s)")
    return 0


def run_check(args: argparse.Namespace) -> int:
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    data = PreparedSet(open_structures(args.path, energy_key=args.energy_key, forces_key=args.forces_key), dtype,
                       cutoff=args.cutoff, skip_invalid=args.skip_invalid)
    n, atoms, invalid, elements = 0, 0, 0, set()
    e_lo, e_hi, neigh, neigh_max = float("inf"), float("-inf"), 0, 0
    start = time.perf_counter()
    for i in progress_bar(range(len(data)), desc="check", unit="structure", enabled=args.progress):
        d = data[i]
        if d is None:
            invalid += 1
            continue
        n += 1
        atoms += int(d.z.numel())
        elements.update(d.z.tolist())
        e = float(d.energy.reshape(-1)[0])
        e_lo, e_hi = min(e_lo, e), max(e_hi, e)
        pbc = d.pbc.reshape(3).numpy()
        _, j, _, _ = neighbor_pairs(d.pos.double().numpy(), d.cell.double().reshape(3, 3).numpy(), pbc, args.cutoff)
        counts = np.bincount(np.asarray(j), minlength=int(d.z.numel()))
        neigh += int(counts.sum())
        neigh_max = max(neigh_max, int(counts.max()) if counts.size else 0)

    print(f"{args.path}: {n:,} valid structures" + (f", {invalid:,} invalid (skipped)" if args.skip_invalid else "")
          + f", {atoms:,} atoms ({atoms / max(n, 1):.1f} per structure)")
    print(f"elements: {' '.join(chemical_symbols[z] for z in sorted(elements)) or 'none'}")
    if n:
        print(f"energy: {e_lo:.6g} .. {e_hi:.6g} eV")
        print(f"neighbours within {args.cutoff:g} Å: {neigh / max(atoms, 1):.1f} per atom on average, at most "
              f"{neigh_max}")
    print(f"checked in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0
