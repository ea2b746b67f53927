"""``gnnpipe evaluate --task is2rs``: relax initial structures with a trained S2EF model and score them against
reference relaxed structures (the OC20 IS2RS and IS2RE tasks, Chanussot et al., ACS Catal. 2021).

Reported (definitions: gnnpipe.relax.metrics and docs/guides/relaxations.md): **ADwT** (fraction of structures
whose mean free-atom minimum-image distance to the reference is below a threshold, averaged over 0.01…0.5 Å),
**FbT** (fraction whose largest oracle force on a free atom, at the model's relaxed structure, is below
0.05 eV/Å) and **AFbT** (FbT averaged over 0.01…0.4 eV/Å), the **IS2RE energy MAE** (model's relaxed energy
against the reference's) and **EwT** (fraction within 0.02 eV). The oracle is any ASE calculator (``emt``,
``lj`` or ``module:Class``). ``--out`` gets the metrics and the curves over thresholds as JSON, which
``gnnpipe report`` draws.

examples:
  gnnpipe atoms generate --kind oc20-is2rs --frames 32 --out is2rs.extxyz     # + is2rs.relaxed.extxyz
  gnnpipe evaluate --task is2rs model.pt --dataset is2rs.extxyz --reference is2rs.relaxed.extxyz --out is2rs.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def register(sub) -> None:
    from .main import HelpFormatter
    from .relax import add_relax_arguments

    p = sub.add_parser("evaluate", help="IS2RS / IS2RE metrics of a trained S2EF model (ADwT, FbT, AFbT, energy MAE)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("model", metavar="MODEL", help="a model file (gnnpipe export) or a checkpoint folder")
    p.add_argument("--task", choices=["is2rs"], required=True, help="what to evaluate (is2rs: relaxations; its "
                   "IS2RE energy MAE is reported with it)")
    p.add_argument("--dataset", required=True, help="the initial structures (.extxyz/.xyz, .traj, .db, .aselmdb, .lmdb, or a folder of such files)")
    p.add_argument("--reference", required=True, help="the reference relaxed structures with energies, same order")
    p.add_argument("--oracle", default="emt", help="ASE calculator for FbT / AFbT: emt, lj or module:Class")
    p.add_argument("--relaxed", default=None, help="score these model-relaxed structures (a gnnpipe relax --out) "
                   "instead of relaxing here")
    p.add_argument("--save-relaxed", default=None, help="also write the model's relaxed structures (.extxyz)")
    p.add_argument("--out", default=None, help="write the metrics and curves as JSON here")
    add_relax_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..data.atoms import read_structures
    from ..relax import evaluate_is2rs, get_oracle, relax
    from ..relax.metrics import check_pairs
    from ..tasks.s2ef.predict import task_meta
    from .predict import load_model
    from .relax import check_relax_arguments, relax_options, summary

    check_relax_arguments(args)
    get_oracle(args.oracle)                         # an unknown oracle fails before any work
    model = load_model(args.model)
    meta = task_meta(model)
    initial = read_structures(args.dataset, dtype=torch.float64)
    reference = read_structures(args.reference, dtype=torch.float64)
    check_pairs(initial, reference, what="initial")
    start = time.perf_counter()
    relax_info = {}
    if args.relaxed is not None:
        relaxed = read_structures(args.relaxed, dtype=torch.float64)
    else:
        res = relax(model, initial, **relax_options(args))
        if res.interrupted:
            print("gnnpipe: interrupted while relaxing; nothing evaluated", file=sys.stderr)
            return 130
        print(summary(res, time.perf_counter() - start), file=sys.stderr)
        relaxed = res.structures
        relax_info = {"converged": int(res.converged.sum()), "steps_max": int(res.steps.max()) if len(relaxed) else 0,
                      "steps_mean": float(res.steps.double().mean()) if len(relaxed) else 0.0,
                      "seconds": time.perf_counter() - start}
        if args.save_relaxed:
            import ase.io

            ase.io.write(args.save_relaxed, res.to_atoms(), format="extxyz")
    metrics = evaluate_is2rs(relaxed, reference, oracle=args.oracle)
    record = {"task": "is2rs", "model": str(args.model), "dataset": str(args.dataset),
              "reference": str(args.reference), "model_name": (getattr(model, "spec", None) or {}).get("name"),
              "cutoff": meta.get("cutoff"), "relax": {**{k: getattr(args, k) for k in
                                                         ("optimizer", "fmax", "steps", "maxstep")}, **relax_info},
              **metrics}
    print(f"IS2RS on {metrics['structures']} structures: ADwT {100 * metrics['adwt']:.1f} %, "
          f"FbT {100 * metrics['fbt']:.1f} %, AFbT {100 * metrics['afbt']:.1f} % ({metrics['oracle']} forces), "
          f"mean distance {metrics['mean_distance']:.3f} Å"
          + (f"; IS2RE energy MAE {1000 * metrics['energy_mae']:.1f} meV, EwT {100 * metrics['ewt']:.1f} %"
             if "energy_mae" in metrics else ""))
    if args.out:
        out = Path(args.out).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1))
        print(f"wrote {out}", file=sys.stderr)
    return 0
