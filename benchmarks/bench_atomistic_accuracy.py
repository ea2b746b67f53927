"""S2EF accuracy on a generated set (the OC20-like one unless ``--dataset`` names another; ``bulk-like`` adds stresses):
held-out test errors of ``dimenet++``, ``schnet``, ``gemnet-t``, ``gemnet-dt`` (GemNet-T with direct forces) and
``escn-md`` (at the table's parameter count, below) against the trivial predictors (zero force; the training mean
energy; zero stress) and the per-element linear reference.

Usage (the models' S2EF defaults, ``gnnpipe.tasks.s2ef.defaults``, for every flag not given)::

    python benchmarks/bench_atomistic_accuracy.py --frames 2000 --models dimenet++ schnet --epochs 15 25 \\
        --threads 1 --out bench_s2ef.json
    python benchmarks/bench_atomistic_accuracy.py --frames 2000 --models escn-md --epochs 15 --threads 1

``escn-md`` here is eSCN-MD at DimeNet++'s and GemNet-dT's size on their graph: 2 blocks, ``--hidden 40`` (40
channels per coefficient and 40 hidden: 753,689 parameters against DimeNet++'s 756 k and GemNet-dT's 766 k), 4 Å,
12 neighbours; the rest its S2EF defaults (energy : force 1 : 10). Flags given on the command line win.

Baselines on the test split: the force MAE of predicting zero force (over free atoms' components), and the energy
MAE per atom (``mean |E − Ê| / n_atoms``) of predicting the mean training energy for every structure (what the
acceptance of issue 28 means by "the training mean"; predicting the mean training energy per atom times the atoms
is printed beside it), and of the per-element linear reference fitted on the training split (``E_ref + μ`` of
:mod:`gnnpipe.tasks.s2ef.normalizer`: the composition alone, what the model predicts before it learns anything).
The acceptance ratios are force < 25 % of zero force, energy per atom < 10 % of the training mean. The model kept
is the epoch with the lowest validation force MAE (the S2EF selection); no choice looks at the test split.

Stresses (``--dataset bulk-like``: strained and rattled EMT bulk crystals and alloys; ``--stress-coef C`` weighs the
stress term of the loss, as ``gnnpipe train --stress-coef``)::

    python benchmarks/bench_atomistic_accuracy.py --dataset bulk-like --frames 400 --stress-coef 100 \
        --models schnet dimenet++ --epochs 20 --threads 1

A set with stress labels adds the zero-stress baseline (the MAE of predicting σ = 0 over the 9 components of the test
split's stresses, eV/Å³, as the stress metric counts them) and each model's test stress MAE (eV/Å³ and GPa), its
ratio to the baseline and the validation stress MAE of every epoch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def baselines(task_data) -> dict:
    """Trivial predictors on the test split: zero force (MAE over free atoms' components), the mean training energy
    per structure, the mean training energy per atom times the atoms, the per-element linear reference, and where
    test structures have stress labels zero stress (MAE over their stresses' 9 components, eV/Å³)."""
    s, sp = task_data.structures, task_data.splits
    train, test = [s[i] for i in sp["train"].tolist()], [s[i] for i in sp["test"].tolist()]
    e_mean = sum(float(d.energy) for d in train) / len(train)
    e_atom = sum(float(d.energy) / d.z.numel() for d in train) / len(train)
    f = torch.cat([d.forces[~d.fixed].abs().reshape(-1).double() for d in test])
    norm = task_data.normalizer
    ref = [float(norm.reference(d.z, torch.zeros_like(d.z, dtype=torch.long), 1)) + norm.mean for d in test]
    stressed = [d.stress.reshape(-1).abs().double() for d in test if bool(d.has_stress.reshape(-1)[0])]
    zero_stress = {"zero_stress_mae": float(torch.cat(stressed).mean())} if stressed else {}
    return zero_stress | {"zero_force_mae": float(f.mean()),
            "linear_reference_mae_per_atom": sum(abs(float(d.energy) - r) / d.z.numel() for d, r in zip(test, ref))
            / len(test),
            "mean_energy_mae_per_atom": sum(abs(float(d.energy) - e_mean) / d.z.numel() for d in test) / len(test),
            "mean_per_atom_energy_mae_per_atom": sum(abs(float(d.energy) / d.z.numel() - e_atom) for d in test)
            / len(test)}


#: names the benchmark takes beside the zoo's, or a zoo model's size here: (zoo model, training flags; the command
#: line's win)
ALIASES = {"gemnet-dt": ("gemnet-t", {"direct_forces": True}),
           "escn-md": ("escn-md", {"hidden": 40, "cutoff": 4.0, "max_neighbors": 12})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="oc20-like", help="the generated set (oc20-like, bulk-like, md17-like)")
    p.add_argument("--frames", type=int, default=2000)
    p.add_argument("--models", nargs="+", default=["dimenet++", "schnet"])
    p.add_argument("--epochs", type=int, nargs="+", default=[15, 25], help="per model, in --models order")
    given = "(default: the model's S2EF default, gnnpipe.tasks.s2ef.defaults)"
    for flag, typ in (("--layers", int), ("--hidden", int), ("--cutoff", float), ("--max-neighbors", int),
                      ("--batch-size", int), ("--lr", float), ("--energy-coef", float), ("--force-coef", float)):
        p.add_argument(flag, type=typ, default=None, help=given)
    p.add_argument("--stress-coef", type=float, default=None,
                   help="weight of the stress term (as gnnpipe train --stress-coef; default 0: stresses only reported)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the numbers as JSON")
    args = p.parse_args(argv)

    from gnnpipe import api
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.s2ef import S2EF
    from gnnpipe.tasks.s2ef.loss import GPA_PER_EV_A3

    torch.set_num_threads(args.threads)
    flags = ("layers", "hidden", "cutoff", "max_neighbors", "batch_size", "lr", "energy_coef", "force_coef")
    stress = {} if args.stress_coef is None else {"stress_coef": args.stress_coef}
    common = dict(dataset=args.dataset, frames=args.frames, **stress, seed=args.seed, threads=args.threads, patience=0,
                  **{k: getattr(args, k) for k in flags if getattr(args, k) is not None})
    t0 = time.perf_counter()
    task = S2EF()
    data = task.load(task.resolve(TrainConfig(model=ALIASES.get(args.models[0], (args.models[0],))[0], **common)))
    base = baselines(data)
    print(f"{args.frames} frames ({time.perf_counter() - t0:.0f} s to load); test split {len(data.splits['test'])}: "
          f"zero-force MAE {base['zero_force_mae']:.4f} eV/Å, training-mean energy MAE/atom "
          f"{1000 * base['mean_energy_mae_per_atom']:.2f} meV (per-atom mean × n: "
          f"{1000 * base['mean_per_atom_energy_mae_per_atom']:.2f} meV), linear reference "
          f"{1000 * base['linear_reference_mae_per_atom']:.2f} meV"
          + (f", zero-stress MAE {base['zero_stress_mae']:.5f} eV/Å³ "
             f"({base['zero_stress_mae'] * GPA_PER_EV_A3:.3f} GPa)" if "zero_stress_mae" in base else ""), flush=True)
    report = {"args": vars(args), "baselines": base, "models": {}}
    for name, epochs in zip(args.models, args.epochs + [args.epochs[-1]] * len(args.models)):
        t1 = time.perf_counter()
        model, extra = ALIASES.get(name, (name, {}))
        r = api.train(model=model, epochs=epochs, progress=False, log_every=1, **{**extra, **common})
        b, cfg = r.best_metrics, r.config
        recipe = {k: cfg[k] for k in flags}
        params = sum(p.numel() for p in r.model.parameters()) if r.model is not None else None
        row = {"recipe": recipe, "parameters": params, "epochs": epochs, "best_epoch": r.best_epoch + 1,
               "train_s": time.perf_counter() - t1,
               "test_force_mae": b["test_force_mae"], "test_energy_mae": b["test_energy_mae"],
               "test_energy_mae_per_atom": b["test_energy_mae_per_atom"], "test_force_cos": b["test_force_cos"],
               "test_efwt": b["test_efwt"],
               "force_ratio": b["test_force_mae"] / base["zero_force_mae"],
               "energy_ratio": b["test_energy_mae_per_atom"] / base["mean_energy_mae_per_atom"],
               "val_force_mae": b["val_force_mae"], "val_energy_mae_per_atom": b["val_energy_mae_per_atom"]}
        if "test_stress_mae" in b:
            row.update(stress_coef=cfg["stress_coef"], test_stress_mae=b["test_stress_mae"],
                       test_stress_mae_gpa=b["test_stress_mae_gpa"], val_stress_mae=b["val_stress_mae"],
                       val_stress_mae_by_epoch=[e.get("val_stress_mae") for e in r.epochs])
            if "zero_stress_mae" in base:
                row["stress_ratio"] = b["test_stress_mae"] / base["zero_stress_mae"]
        report["models"][name] = row
        print(f"{name:<10} test force MAE {row['test_force_mae']:.4f} eV/Å ({100 * row['force_ratio']:.1f} % of zero "
              f"force; target < 25 %), energy MAE/atom {1000 * row['test_energy_mae_per_atom']:.2f} meV "
              f"({100 * row['energy_ratio']:.1f} % of the training mean; target < 10 %), force cos "
              f"{row['test_force_cos']:.3f}, EFwT {100 * row['test_efwt']:.1f} %, {epochs} epochs in "
              f"{row['train_s']:.0f} s (best epoch {row['best_epoch']}); {params} parameters; {recipe}", flush=True)
        if "test_stress_mae" in row:
            by_epoch = " ".join(f"{1000 * v:.2f}" for v in row["val_stress_mae_by_epoch"] if v is not None)
            ratio = f" ({100 * row['stress_ratio']:.1f} % of zero stress)" if "stress_ratio" in row else ""
            print(f"{name:<10} test stress MAE {row['test_stress_mae']:.5f} eV/Å³ = "
                  f"{row['test_stress_mae_gpa']:.3f} GPa{ratio} (--stress-coef {row['stress_coef']:g}); validation "
                  f"stress MAE by epoch (meV/Å³): {by_epoch}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
