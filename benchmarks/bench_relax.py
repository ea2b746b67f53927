"""Batched relaxation against ASE one structure at a time: the same model, the same structures, the same thread
count, measured side by side.

Usage::

    gnnpipe atoms generate --kind oc20-is2rs --frames 64 --out is2rs.extxyz
    python benchmarks/bench_relax.py model.pt --dataset is2rs.extxyz --optimizer fire --fmax 0.05 --steps 200 \\
        --threads 1 --out bench_relax.json

Both sides run the optimizer with ASE's parameters: ``gnnpipe.relax.relax`` (all structures in one batch; one graph
build and one forward per step for the structures still running) and ``ase.optimize.FIRE`` / ``LBFGS`` over
``gnnpipe.calculator.Calculator`` (one structure after the other). Reported: wall seconds of each, the speed-up,
the steps per structure on each side, and the largest difference of the final energies (the acceptance: ≥ 5× and
< 1 meV). Without ``--dataset`` 64 OC20-like initial structures are generated (``--frames``).

``--relax-cell`` relaxes bulk structures' positions and cells together: ``relax(relax_cell=True)`` against ASE's
optimizer over ``FrechetCellFilter(atoms)``; the largest difference of the relaxed cell vectors (Å) is reported
beside the energies (a model trained with stresses, on ``bulk`` structures)::

    gnnpipe atoms generate --kind bulk --frames 200 --out bulk.extxyz
    gnnpipe train --model schnet --dataset bulk.extxyz --stress-coef 100 --epochs 10 --checkpoint-dir bulk-ck
    gnnpipe export bulk-ck --out bulk.pt
    python benchmarks/bench_relax.py bulk.pt --dataset bulk.extxyz --relax-cell --fmax 0.05 --steps 200
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a model file (gnnpipe export)")
    p.add_argument("--dataset", default=None, help="initial structures (default: --frames generated OC20-like ones)")
    p.add_argument("--frames", type=int, default=64, help="structures generated without --dataset (default: 64)")
    p.add_argument("--optimizer", choices=["fire", "lbfgs"], default="fire", help="(default: fire)")
    p.add_argument("--fmax", type=float, default=0.05, help="eV/Å (default: 0.05)")
    p.add_argument("--steps", type=int, default=200, help="(default: 200)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides (default: 1)")
    p.add_argument("--device", default="cpu", help="where the model runs on both sides: cpu, cuda (default: cpu)")
    p.add_argument("--relax-cell", action="store_true",
                   help="relax cells with the positions (ASE's side: FrechetCellFilter); bulk structures")
    p.add_argument("--out", default=None, help="write the numbers as JSON")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    import ase.io
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE, LBFGS

    from gnnpipe.calculator import Calculator
    from gnnpipe.data.atoms import generated_file
    from gnnpipe.models import load
    from gnnpipe.relax import relax

    path = args.dataset or generated_file("oc20-is2rs", args.frames, seed=0)
    atoms = ase.io.read(str(path), ":")
    for a in atoms:
        a.calc = None
    model = load(args.model)
    kw = dict(optimizer=args.optimizer, fmax=args.fmax, device=args.device, relax_cell=args.relax_cell)
    relax(model, atoms[:2], steps=2, **kw)  # warm-up

    start = time.perf_counter()
    res = relax(model, atoms, steps=args.steps, **kw)
    batched = time.perf_counter() - start

    cls = FIRE if args.optimizer == "fire" else LBFGS
    calc = Calculator(model, device=args.device)
    from gnnpipe.errors import DataValidationError

    energies, steps, failed, cells = [], [], [], []
    start = time.perf_counter()
    for k, a in enumerate(atoms):
        b = a.copy()
        b.calc = calc
        opt = cls(FrechetCellFilter(b) if args.relax_cell else b, logfile=None)
        try:
            opt.run(fmax=args.fmax, steps=args.steps)
            energies.append(b.get_potential_energy())
            cells.append(np.array(b.cell))
        except DataValidationError:   # the calculator refuses atoms the model pushed together; the batch goes on
            failed.append(k)
            energies.append(float("nan"))
            cells.append(None)
        steps.append(opt.nsteps)
    one_by_one = time.perf_counter() - start

    ok = [k for k in range(len(atoms)) if k not in failed]
    de = np.abs(np.array(energies)[ok] - res.energies.numpy()[ok]) if ok else np.zeros(1)
    dcell = 0.0  # Å: the largest |a_i − b_i| over the cell vectors of every structure both sides relaxed
    if args.relax_cell:
        ours = [d.cell.reshape(3, 3).numpy() for d in res.structures]
        dcell = max((float(np.linalg.norm(ours[k] - cells[k], axis=1).max()) for k in ok), default=0.0)
    out = {"structures": len(atoms), "atoms_mean": float(np.mean([len(a) for a in atoms])),
           "model": args.model, "model_name": (load(args.model).spec or {}).get("name"),
           "optimizer": args.optimizer, "fmax": args.fmax, "steps": args.steps, "threads": args.threads,
           "device": args.device,
           "batched_s": batched, "ase_s": one_by_one, "speedup": one_by_one / batched,
           "converged_batched": int(res.converged.sum()), "converged_ase": int(sum(s < args.steps for s in steps)),
           "steps_batched": res.steps.tolist(), "steps_ase": steps, "forwards_batched": res.forward_calls,
           "energy_max_abs_diff_eV": float(de.max()), "ase_refused": failed, "relax_cell": args.relax_cell,
           "cell_vector_max_diff_A": dcell,
           "same_steps": [res.steps.tolist()[k] for k in ok] == [steps[k] for k in ok]}
    print(f"{len(atoms)} structures ({out['atoms_mean']:.1f} atoms on average), {args.optimizer} to fmax {args.fmax} "
          f"or {args.steps} steps, {args.threads} thread(s), {args.device}:\n"
          f"  batched          {batched:8.2f} s  ({res.forward_calls} batched forwards, "
          f"{out['converged_batched']} converged)\n"
          f"  ASE one by one   {one_by_one:8.2f} s  ({sum(s + 1 for s in steps)} forwards, "
          f"{out['converged_ase']} converged)\n"
          f"  speed-up {out['speedup']:.1f}x; final energies differ by at most {1000 * de.max():.2g} meV; "
          f"same steps per structure: {out['same_steps']}"
          + (f"; relaxed cell vectors differ by at most {dcell:.2g} Å" if args.relax_cell else "")
          + (f"; ASE's calculator refused {len(failed)} structures whose atoms the model pushed within 0.1 Å "
             f"(left out of the comparison)" if failed else ""))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
