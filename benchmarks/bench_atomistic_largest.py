"""A DimeNet++ of 1.1 × 10^8 trained parameters pipelined over four stages on a CPU machine, against the memory
model; resumed in another layout; exported and loaded by the calculator.

Usage (defaults: 7 interaction blocks, hidden 256, int_emb_size 128, out_emb_channels 2048 — 109.8 M parameters, most
of them in the output blocks, which run per atom, so a CPU step stays affordable; 10 generated OC20-like frames,
8 of them training: 2 steps of 4 structures per epoch)::

    python benchmarks/bench_atomistic_largest.py --epochs 10 --out-dir largest

Steps, each a ``gnnpipe`` command printed before it runs (so each can be run by hand):

1. ``gnnpipe plan --ranks S·…``: the cost model ranks the S × G × D layouts of ``--ranks`` ranks; the fastest that
   fits (the local machine's memory, ``--hardware``) with ``stages >= --min-stages`` is trained.
2. ``gnnpipe train`` in that layout for ``--epochs`` epochs (checkpoints after epoch ``E − 1`` and at the end); the loss
   of each epoch is the mean of its steps' losses, taken before each step's update.
3. The measured peak resident memory of every rank (``peak_mem_bytes``) against the prediction (runtime floor +
   the rank's states, all-reduce buffer, activations and graph).
4. ``gnnpipe train --resume ck/ckpt-(E−1)`` in another layout (``--resume-stages``, ``--resume-gp``) for the last
   epoch: its loss against the pipelined run's last epoch (the same weights, Adam state and batches).
5. ``gnnpipe export``; the model file as an ASE calculator (energy and forces of a training structure).
6. With ``--single``: the single process for two epochs: its step time and peak memory against the pipeline's.

Cost (a 2-core machine shared with other jobs, every process at ``nice 19``): ``gnnpipe plan`` profiles one
single-process step (~6 min there); every rank draws the whole model's weights before keeping its stage's (the
2048-wide output layers' orthogonal initialisation: ~8 min for four ranks there); a pipelined step took ~12 s.
Each rank peaks near 1.1 GiB (memory model: floor + 0.58–0.62 GiB); the single process near 3 GiB. The
pipelined run checkpoints once, after epoch ``E − 1``, with ``--keep last``: rank 0 gathers the whole model's weights
for a checkpoint or a best-epoch snapshot (+0.4 GiB for a moment). Writes ``summary.json`` in ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path


def gnnpipe(args: list[str], log: Path) -> float:
    """Run ``gnnpipe ARGS`` (output to ``log``); returns the wall seconds. Raises CalledProcessError on failure."""
    print("$ gnnpipe " + " ".join(args), flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        subprocess.run([sys.executable, "-m", "gnnpipe", *args], stdout=fh, stderr=subprocess.STDOUT, check=True,
                       env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return time.perf_counter() - t0


def steps_per_epoch(res: dict) -> int:
    plan = res["plan"]
    return max(1, math.ceil(plan["structures"]["train"] / plan["global_batch"]))


def step_s(res: dict) -> float:
    """Median training seconds per step over the epochs after the first (evaluation excluded)."""
    ts = sorted(e["time_s"] for e in res["epochs"][1:]) or [res["epochs"][0]["time_s"]]
    return ts[len(ts) // 2] / steps_per_epoch(res)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=7, help="interaction blocks (default: 7)")
    ap.add_argument("--hidden", type=int, default=256, help="hidden width (default: 256)")
    ap.add_argument("--int-emb", type=int, default=128, help="int_emb_size (default: 128)")
    ap.add_argument("--out-emb", type=int, default=2048, help="out_emb_channels (default: 2048)")
    ap.add_argument("--frames", type=int, default=10, help="generated OC20-like frames, 80 %% training (default: 10)")
    ap.add_argument("--batch-size", type=int, default=4, help="structures per step (default: 4)")
    ap.add_argument("--epochs", type=int, default=10, help="epochs of the pipelined run (default: 10)")
    ap.add_argument("--lr", type=float, default=5e-4, help="learning rate (default: 5e-4)")
    ap.add_argument("--warmup-steps", type=int, default=4, help="warm-up steps (default: 4)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks of the layouts the plan ranks (default: 4)")
    ap.add_argument("--min-stages", type=int, default=4, help="the layout trained has at least this many stages")
    ap.add_argument("--hardware", default="local-2core", help="machine the plan fits (default: local-2core)")
    ap.add_argument("--resume-stages", type=int, default=2, help="stages of the resumed run (default: 2)")
    ap.add_argument("--resume-gp", type=int, default=1, help="graph-parallel ranks of the resumed run (default: 1)")
    ap.add_argument("--single", action="store_true", help="also the single process (2 epochs; needs ~3 GiB)")
    ap.add_argument("--out-dir", default="largest", help="folder of the files written (default: largest)")
    args = ap.parse_args()

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = ["--model", "dimenet++", "--layers", str(args.layers), "--hidden", str(args.hidden),
             "--model-arg", f"int_emb_size={args.int_emb}", "--model-arg", f"out_emb_channels={args.out_emb}",
             "--model-arg", "basis_emb_size=8", "--frames", str(args.frames), "--batch-size", str(args.batch_size),
             "--cutoff", "4", "--max-neighbors", "8"]
    # --keep last: no best-epoch snapshot (rank 0 would hold the whole model's weights beside its stage's)
    train = [*model, "--lr", str(args.lr), "--warmup-steps", str(args.warmup_steps), "--threads", "1",
             "--keep", "last", "--no-progress"]
    summary: dict = {"command": " ".join(sys.argv)}

    # 1. the cost model's layout
    if (out / "plan.json").is_file():  # a plan of these arguments written before (delete it to plan again)
        print(f"using the ranking in {out / 'plan.json'}")
    else:
        gnnpipe(["plan", *model, "--ranks", str(args.ranks), "--hardware", args.hardware, "--out",
                 str(out / "plan.json"), "--no-progress"], out / "plan.log")
    ranking = json.loads((out / "plan.json").read_text())
    recs = ranking if isinstance(ranking, list) else ranking.get("layouts", ranking.get("records", []))
    ok = [r for r in recs if r["fits"] and r["stages"] >= args.min_stages]
    if not ok:
        print(f"no layout of {args.ranks} ranks with >= {args.min_stages} stages fits", file=sys.stderr)
        return 1
    pick = min(ok, key=lambda r: r["step_s"])
    S, G, D = pick["stages"], pick["gp"], pick["replicas"]
    summary["layout"] = {"stages": S, "gp": G, "replicas": D, "chunks": pick["chunks"], "scheduler": pick["scheduler"],
                         "predicted_step_s": pick["step_s"]}
    print(f"layout: S={S} G={G} D={D}, C={pick['chunks']} {pick['scheduler']} (predicted step {pick['step_s']:.2f} s)")

    # 2. the pipelined run
    ck = out / "ck"
    layout = ["--stages", str(S), "--gp-size", str(G), "--ways", str(D), "--chunks", str(pick["chunks"]),
              "--scheduler", pick["scheduler"]]
    wall = gnnpipe(["train", *train, *layout, "--epochs", str(args.epochs), "--checkpoint-dir", str(ck),
                    "--checkpoint-every", str(max(args.epochs - 1, 1)), "--out", str(out / "pipeline.json")],
                   out / "pipeline.log")
    pipe = json.loads((out / "pipeline.json").read_text())
    losses = [e["loss"] for e in pipe["epochs"]]
    summary["pipeline"] = {"params": pipe["num_params"], "wall_s": wall, "epochs": len(losses),
                           "steps": len(losses) * steps_per_epoch(pipe), "losses": losses, "step_s": step_s(pipe),
                           "val_force_mae": [e.get("val_force_mae") for e in pipe["epochs"]],
                           "peak_mib": [p / 2**20 for p in pipe["peak_mem_bytes"]]}
    print(f"{pipe['num_params']:,} parameters, {summary['pipeline']['steps']} steps in {wall:.0f} s; loss per epoch "
          + " ".join(f"{v:.3f}" for v in losses))

    # 3. memory: measured peak per rank against floor + predicted
    floor = pick["floor_bytes"]
    pred = [floor + m["peak"] for m in pick["memory"]]
    meas = pipe["peak_mem_bytes"]
    summary["memory"] = {"floor_mib": floor / 2**20, "predicted_mib": [p / 2**20 for p in pred],
                         "measured_mib": [m / 2**20 for m in meas], "measured_over_predicted": [
                             m / p for m, p in zip(meas, pred)]}
    print("peak per rank, measured / predicted MiB: " + ", ".join(
        f"{m / 2**20:.0f} / {p / 2**20:.0f} ({m / p - 1:+.1%})" for m, p in zip(meas, pred)))

    # 4. resume the last epoch in another layout
    last = ck / f"ckpt-{args.epochs - 1:06d}"
    gnnpipe(["train", *train, "--stages", str(args.resume_stages), "--gp-size", str(args.resume_gp), "--epochs",
             str(args.epochs), "--resume", str(last), "--out", str(out / "resumed.json")], out / "resumed.log")
    res = json.loads((out / "resumed.json").read_text())
    a, b = losses[-1], res["epochs"][-1]["loss"]
    summary["resume"] = {"from": str(last), "stages": args.resume_stages, "gp": args.resume_gp,
                         "pipeline_last_loss": a, "resumed_last_loss": b, "relative_difference": abs(a - b) / abs(a)}
    print(f"last epoch's loss: pipeline {a:.6f}, resumed with S={args.resume_stages} G={args.resume_gp}: {b:.6f} "
          f"(relative difference {abs(a - b) / abs(a):.1e})")

    # 5. export and the calculator
    gnnpipe(["export", str(ck), "--keep", "last", "--out", str(out / "largest.pt")], out / "export.log")
    from ase.io import read

    from gnnpipe.calculator import Calculator
    from gnnpipe.data.atoms import generated_file

    atoms = read(generated_file("oc20", args.frames, 0), index=0)
    atoms.calc = Calculator(str(out / "largest.pt"))
    e, f = float(atoms.get_potential_energy()), atoms.get_forces()
    summary["calculator"] = {"energy_eV": e, "max_force_eV_per_A": float(abs(f).max()),
                             "model_file_mib": os.path.getsize(out / "largest.pt") / 2**20}
    print(f"calculator: energy {e:.4f} eV, max |F| {abs(f).max():.4f} eV/Å, model file "
          f"{summary['calculator']['model_file_mib']:.0f} MiB")

    # 6. the single process
    if args.single:
        gnnpipe(["train", *train, "--epochs", "2", "--out", str(out / "single.json")], out / "single.log")
        one = json.loads((out / "single.json").read_text())
        summary["single"] = {"step_s": step_s(one), "peak_mib": one["peak_mem_bytes"][0] / 2**20,
                             "pipeline_step_ratio": step_s(one) / step_s(pipe),
                             "largest_rank_over_single": max(meas) / one["peak_mem_bytes"][0]}
        print(f"single process: step {step_s(one):.2f} s ({step_s(one) / step_s(pipe):.2f}x the pipeline's), peak "
              f"{one['peak_mem_bytes'][0] / 2**20:.0f} MiB (largest rank {max(meas) / one['peak_mem_bytes'][0]:.2f}x)")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
