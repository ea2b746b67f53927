"""GNNPipe speed-up on this machine: a 2-stage pipeline (1 thread per rank, profiled layer split, gpipe,
16 chunks) against the single-process trainer (1 thread), GCNII-32 hidden 100 on Amazon Computers,
run side by side in one invocation (issue: pipeline executor benchmark).

    python benchmarks/bench_pipeline_speedup.py [--epochs 8] [--scheduler gpipe] [--dataset Computers]

Prints the per-epoch times (median over epochs after the first), their ratio, each rank's measured
compute time and idle fraction, and the bubble the schedule simulator predicts for the same schedule
with the profiled stage costs. Not a test: numbers go to docs/RESULTS.md.

Two single-process baselines run beside the pipeline: the trainer on the dataset as loaded (what a
user runs) and the trainer on the pipeline's relabelled graph (vertices ordered by chunk, which also
makes the whole-graph sparse product faster through locality) — the stricter comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--dataset", default="Computers")
    p.add_argument("--root", default=str(SHARED / "amazon"))
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--scheduler", default="gpipe")
    p.add_argument("--layer-split", default="profiled")
    p.add_argument("--over-partition", type=int, default=4, help="METIS over-partitioning factor (paper: 4)")
    p.add_argument("--out", default=None, help="write both results as JSON")
    a = p.parse_args()

    import torch

    from gnnpipe import api, schedulers
    from gnnpipe.core.config import TrainConfig

    base = TrainConfig(dataset=a.dataset, root=a.root, model="gcnii", layers=a.layers, hidden=a.hidden,
                       epochs=a.epochs, eval_every=a.epochs, patience=0, threads=1)
    import attrs
    from gnnpipe.core.runner import build_plan
    from gnnpipe.core.trainer import SingleProcessTrainer, resolve_config

    single = api.train(base, progress=False)
    pipe_cfg = resolve_config(attrs.evolve(base, stages=a.stages, chunks=a.chunks, scheduler=a.scheduler,
                                           layer_split="equal", over_partition=a.over_partition))
    torch.set_num_threads(1)
    relabelled = build_plan(pipe_cfg, api.load_data(pipe_cfg)).data  # same chunking (same seed) as the pipeline's
    single_rl = SingleProcessTrainer(relabelled, resolve_config(base)).fit(progress=False)
    pipe = api.train(base, stages=a.stages, chunks=a.chunks, scheduler=a.scheduler, layer_split=a.layer_split,
                     over_partition=a.over_partition, progress=False)

    def med(r):
        return statistics.median(e["time_s"] for e in r.epochs[1:])

    ts, tr, tp = med(single), med(single_rl), med(pipe)
    compute = [statistics.median(e["compute_s"][r] for e in pipe.epochs[1:]) for r in range(a.stages)]
    plan = pipe.extra["plan"]
    costs = plan["stage_costs"]
    sched = schedulers.build_schedule(a.scheduler, a.stages, a.chunks)
    sim = schedulers.simulate(sched, costs=schedulers.CostModel(forward=1.0, backward=2.0, stage_scale=costs))
    print(f"GCNII-{a.layers} hidden {a.hidden}, {a.dataset}: {a.stages} stages x 1 thread, {a.chunks} chunks, "
          f"{a.scheduler}, over-partition {a.over_partition}, layer split {a.layer_split} {plan['stage_bounds']} (profiled costs {['%.4f' % c for c in costs]})")
    print(f"  single process (1 thread): {ts * 1000:8.1f} ms/epoch (median of epochs 2..{a.epochs})")
    print(f"  single process, pipeline's vertex order: {tr * 1000:8.1f} ms/epoch")
    print(f"  pipeline ({a.stages} ranks):     {tp * 1000:8.1f} ms/epoch")
    print(f"  speed-up single / pipeline = {ts / tp:.3f}x  (against the relabelled single process: {tr / tp:.3f}x)")
    print(f"  compute per rank (s/epoch): {[round(c, 3) for c in compute]}  (sum {sum(compute):.3f})")
    print(f"  measured idle fraction per rank: {[round(f, 3) for f in pipe.extra['idle_fraction']]}")
    print(f"  simulator predicted bubble per stage: {[round(b, 3) for b in sim.bubble_fraction]}")
    if a.out:
        Path(a.out).write_text(json.dumps({"single": single.to_dict(), "single_relabelled": single_rl.to_dict(),
                                           "pipeline": pipe.to_dict(), "speedup": ts / tp,
                                           "speedup_vs_relabelled": tr / tp}, indent=1, default=str))


if __name__ == "__main__":
    main()
