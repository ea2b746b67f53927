"""``gnnpipe relax``: relax the structures of a file with a trained S2EF model, all at once.

Every step runs one batched graph build and forward over the structures still running; each leaves the batch when
the largest force on its free atoms (``FixAtoms`` respected) is below ``--fmax`` or after ``--steps`` steps. FIRE
and L-BFGS take, per structure, the steps ASE's ``FIRE`` / ``LBFGS`` take with the same parameters. The model is a
file of ``gnnpipe export`` (what the ASE calculator takes) or a checkpoint folder.

``--out`` gets the relaxed structures as extended XYZ with the model's energy and forces and, per structure,
``relax_steps``, ``relax_converged``, ``relax_fmax``, ``relax_done``; Ctrl-C writes the structures relaxed so far
(the others at their current positions, ``relax_done=False``) and exits 130.

``--relax-cell`` relaxes each cell with its positions, as ASE's ``FrechetCellFilter`` with the same optimizer
would (bulk structures periodic in 3D; a model with conservative forces, which gives stresses): the structure stops
when its largest generalised force, the cell's scaled virial included, is below ``--fmax``; ``--pressure`` relaxes
the enthalpy at that pressure; ``--out`` then holds each relaxed cell and the model's stress.

``--gp-size G`` computes each step's forces with the edges and triplets of the batch sharded over ``G`` ranks
(graph parallelism, the layout of ``gnnpipe train --gp-size``), for a model too large for one device; every rank
runs the same optimizer step, rank 0 writes the output.

examples:
  gnnpipe relax model.pt --dataset initial.extxyz --out relaxed.extxyz
  gnnpipe relax model.pt --dataset initial.extxyz --out relaxed.extxyz --optimizer lbfgs --fmax 0.02 --steps 300
  gnnpipe relax model.pt --dataset initial.extxyz --out relaxed.extxyz --gp-size 2
  gnnpipe relax model.pt --dataset bulk.extxyz --out relaxed.extxyz --relax-cell --fmax 0.01
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from ase.units import GPa

from .. import partitioners
from ..errors import ConfigError
from ..relax.relaxer import check_extxyz_out, relax_file, write_trajectories
from ..tasks.s2ef.predict import resolve_device, task_meta
from .main import HelpFormatter
from .predict import load_model


def add_relax_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a relaxation (shared by ``gnnpipe relax`` and ``gnnpipe evaluate --task is2rs``)."""
    p.add_argument("--optimizer", choices=["fire", "lbfgs"], default="fire", help="batched optimizer (ASE's rules)")
    p.add_argument("--fmax", type=float, default=0.05, help="eV/Å: a structure stops when its largest force on a "
                   "free atom is below this")
    p.add_argument("--steps", type=int, default=200, help="the most optimizer steps per structure")
    p.add_argument("--maxstep", type=float, default=0.2, help="Å, the largest move per step (ASE's maxstep)")
    p.add_argument("--batch-size", type=int, default=None, help="at most this many structures per batch "
                   "(default: all at once)")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu, cuda, cuda:1")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's; with --gp-size: "
                   "of each rank, torch's over G)")
    p.add_argument("--gp-size", dest="graph_parallel_group_size", type=int, default=1, metavar="G",
                   help="graph-parallel ranks sharing each step's edges and triplets (as gnnpipe train --gp-size; "
                        "default 1: one process)")
    p.add_argument("--gp-partitioner", dest="graph_parallel_partitioner", default="edge-chunk",
                   help="how the edges are split over the G ranks (default: edge-chunk)")
    p.add_argument("--gp-mode", dest="graph_parallel_mode", choices=["allgather", "halo"], default="allgather",
                   help="how the ranks exchange edge rows (default: allgather)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--log-every-steps", type=int, default=50, metavar="K",
                   help="where no progress bar is drawn (--no-progress, or not a terminal): a line as each phase and "
                        "batch starts and every K optimizer steps (0: none)")


def register(sub) -> None:
    p = sub.add_parser("relax", help="relax structures with a trained S2EF model (batched FIRE / L-BFGS)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("model", metavar="MODEL", help="a model file (gnnpipe export) or a checkpoint folder")
    p.add_argument("--dataset", required=True,
                   help="the initial structures (.extxyz/.xyz, .traj, .db, .aselmdb, .lmdb, or a folder of such files)")
    p.add_argument("--out", required=True, help="the relaxed structures (.extxyz) to write")
    add_relax_arguments(p)
    c = p.add_argument_group("cell relaxation (ASE's FrechetCellFilter)")
    c.add_argument("--relax-cell", action="store_true", help="relax each cell with its positions (structures "
                   "periodic in 3D, a model with conservative forces)")
    c.add_argument("--pressure", type=float, default=0.0, metavar="GPA", help="external pressure, GPa: the enthalpy "
                   "E + pV is relaxed (default 0)")
    c.add_argument("--hydrostatic-strain", action="store_true", help="only hydrostatic cell deformation")
    c.add_argument("--constant-volume", action="store_true", help="cell deformation at constant volume")
    p.add_argument("--trajectory", default=None, help="folder for each structure's frames (<index>.extxyz)")
    p.set_defaults(func=run)


def check_relax_arguments(args: argparse.Namespace) -> None:
    """Refuse bad relaxation flags with one line (ConfigError)."""
    if not args.fmax > 0:
        raise ConfigError(f"--fmax must be > 0 eV/Å, got {args.fmax}")
    partitioners.get_edge_partitioner(args.graph_parallel_partitioner)  # a typo before anything is loaded
    if args.log_every_steps < 0:
        raise ConfigError(f"--log-every-steps must be >= 0, got {args.log_every_steps}")
    if args.steps < 0:
        raise ConfigError(f"--steps must be >= 0, got {args.steps}")
    if not args.maxstep > 0:
        raise ConfigError(f"--maxstep must be > 0 Å, got {args.maxstep}")
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.graph_parallel_group_size < 1:
        raise ConfigError(f"--gp-size must be >= 1, got {args.graph_parallel_group_size}")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)

    if hasattr(args, "save_relaxed"):  # gnnpipe evaluate: its --out is the JSON report
        flag, target = "--save-relaxed", args.save_relaxed
    else:
        flag, target = "--out", getattr(args, "out", None)
    if target is not None:
        check_extxyz_out(target, flag)

    try:
        resolve_device(args.device)
    except ConfigError as e:
        raise ConfigError(f"--device: {e}") from None


def _phases(args: argparse.Namespace):
    """``phase(text)``: a line on standard error as a slow phase starts, where no progress bar is drawn."""
    quiet = args.log_every_steps == 0 or (args.progress and sys.stderr.isatty())
    return (lambda text: None) if quiet else (lambda text: print(f"relax: {text}", file=sys.stderr, flush=True))


def relax_options(args: argparse.Namespace) -> dict:
    opts = dict(optimizer=args.optimizer, fmax=args.fmax, steps=args.steps, maxstep=args.maxstep,
                batch_size=args.batch_size, device=args.device, progress=args.progress,
                gp_size=args.graph_parallel_group_size, gp_partitioner=args.graph_parallel_partitioner,
                gp_mode=args.graph_parallel_mode, threads=args.threads, log_every_steps=args.log_every_steps)
    if getattr(args, "relax_cell", False):
        opts.update(relax_cell=True, scalar_pressure=args.pressure * GPa, hydrostatic_strain=args.hydrostatic_strain,
                    constant_volume=args.constant_volume)
    elif getattr(args, "pressure", 0.0) or getattr(args, "hydrostatic_strain", False) \
            or getattr(args, "constant_volume", False):
        raise ConfigError("--pressure, --hydrostatic-strain and --constant-volume act on the cell: add --relax-cell")
    return opts


def summary(res, seconds: float) -> str:
    n = len(res.structures)
    done = int(res.done.sum())
    return (f"{int(res.converged.sum())} of {n} structures converged, {done - int(res.converged.sum())} stopped at the "
            f"step limit; {int(res.steps.max()) if n else 0} steps at most, {res.forward_calls} batched forwards "
            f"({res.evaluations} structure evaluations) in {seconds:.1f} s")


def run(args: argparse.Namespace) -> int:
    check_relax_arguments(args)
    start = time.perf_counter()
    phase = _phases(args)
    model = load_model(args.model)
    task_meta(model)
    phase(f"loaded {args.model} ({type(model).__name__}, {time.perf_counter() - start:.1f} s); reading {args.dataset}")
    start = time.perf_counter()
    res = relax_file(model, args.dataset, args.out, trajectories=args.trajectory is not None, **relax_options(args))
    if args.trajectory is not None:
        write_trajectories(res, args.trajectory)
    if res.interrupted:
        print(f"gnnpipe: interrupted: {int(res.done.sum())} of {len(res.structures)} structures relaxed; all written "
              f"to {args.out} (the others at their current positions, relax_done=False)", file=sys.stderr)
        return 130
    print(summary(res, time.perf_counter() - start) + f"\nwrote {args.out}", file=sys.stderr)
    if not sys.stdout.isatty():  # the file for a script reading stdout; a terminal has it in the line above
        print(args.out)
    return 0
