"""S2EF accuracy on the generated OC20-like set: held-out test errors of ``dimenet++`` and ``schnet`` against the
trivial predictors (zero force; the training mean energy).

Usage (sizes small enough for a 2-core CPU; raise them on a larger machine)::

    python benchmarks/bench_atomistic_accuracy.py --frames 2000 --models schnet dimenet++ \\
        --epochs 30 10 --cutoff 4.0 --max-neighbors 12 --layers 3 --hidden 64 --out bench_s2ef.json

Prints, per model, the test force MAE (eV/Å) beside the zero-force MAE, and the test energy MAE per atom beside that
of predicting the training mean energy (and of the training mean energy per atom × atoms); the acceptance ratios of
issue 28 are force < 25 % of zero force, energy per atom < 10 % of the training mean.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def baselines(task_data) -> dict:
    """Trivial predictors on the test split: zero force (MAE over free atoms' components), the mean training energy
    per structure, and the mean training energy per atom times the atoms."""
    s, sp = task_data.structures, task_data.splits
    train, test = [s[i] for i in sp["train"].tolist()], [s[i] for i in sp["test"].tolist()]
    e_mean = sum(float(d.energy) for d in train) / len(train)
    e_atom = sum(float(d.energy) / d.z.numel() for d in train) / len(train)
    f = torch.cat([d.forces[~d.fixed].abs().reshape(-1).double() for d in test])
    return {"zero_force_mae": float(f.mean()),
            "mean_energy_mae_per_atom": sum(abs(float(d.energy) - e_mean) / d.z.numel() for d in test) / len(test),
            "mean_per_atom_energy_mae_per_atom": sum(abs(float(d.energy) / d.z.numel() - e_atom) for d in test)
            / len(test)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=2000)
    p.add_argument("--models", nargs="+", default=["schnet", "dimenet++"])
    p.add_argument("--epochs", type=int, nargs="+", default=[30, 10], help="per model, in --models order")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--cutoff", type=float, default=4.0)
    p.add_argument("--max-neighbors", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the numbers as JSON")
    args = p.parse_args(argv)

    from gnnpipe import api
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.s2ef import S2EF

    torch.set_num_threads(args.threads)
    common = dict(dataset="oc20-like", frames=args.frames, layers=args.layers, hidden=args.hidden, cutoff=args.cutoff,
                  max_neighbors=args.max_neighbors, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                  threads=args.threads, patience=0, warmup_steps=100, lr_schedule="cosine")
    t0 = time.perf_counter()
    task = S2EF()
    data = task.load(task.resolve(TrainConfig(model=args.models[0], **common)))
    base = baselines(data)
    print(f"{args.frames} frames ({time.perf_counter() - t0:.0f} s to load); test split {len(data.splits['test'])}: "
          f"zero-force MAE {base['zero_force_mae']:.4f} eV/Å, training-mean energy MAE/atom "
          f"{1000 * base['mean_energy_mae_per_atom']:.2f} meV (per-atom mean × n: "
          f"{1000 * base['mean_per_atom_energy_mae_per_atom']:.2f} meV)", flush=True)
    report = {"args": vars(args), "baselines": base, "models": {}}
    for name, epochs in zip(args.models, args.epochs + [args.epochs[-1]] * len(args.models)):
        t1 = time.perf_counter()
        r = api.train(model=name, epochs=epochs, progress=False, log_every=1, **common)
        b = r.best_metrics
        row = {"epochs": epochs, "best_epoch": r.best_epoch + 1, "train_s": time.perf_counter() - t1,
               "test_force_mae": b["test_force_mae"], "test_energy_mae": b["test_energy_mae"],
               "test_energy_mae_per_atom": b["test_energy_mae_per_atom"], "test_force_cos": b["test_force_cos"],
               "test_efwt": b["test_efwt"],
               "force_ratio": b["test_force_mae"] / base["zero_force_mae"],
               "energy_ratio": b["test_energy_mae_per_atom"] / base["mean_energy_mae_per_atom"]}
        report["models"][name] = row
        print(f"{name:<10} test force MAE {row['test_force_mae']:.4f} eV/Å ({100 * row['force_ratio']:.1f} % of zero "
              f"force; target < 25 %), energy MAE/atom {1000 * row['test_energy_mae_per_atom']:.2f} meV "
              f"({100 * row['energy_ratio']:.1f} % of the training mean; target < 10 %), force cos "
              f"{row['test_force_cos']:.3f}, EFwT {100 * row['test_efwt']:.1f} %, {epochs} epochs in "
              f"{row['train_s']:.0f} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
