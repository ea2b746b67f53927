"""GNNPipe speed-up on this machine: a 2-stage pipeline (1 thread per rank, profiled layer split, the default
scheduler and recompute: 1f1b, recompute as the memory model decides; 16 chunks) against the single-process
trainer (1 thread), GCNII-32 hidden 100 on Amazon Computers,
run side by side in one invocation (issue: pipeline executor benchmark).

    python benchmarks/bench_pipeline_speedup.py [--epochs 8] [--scheduler 1f1b] [--dataset Computers]

Prints the per-epoch times (median over epochs after the first), their ratio, each rank's measured
compute time, thread CPU time (the work inflation: ranks' CPU summed / the relabelled single process's), idle
fraction and backend (gloo on the CPU unless every rank has its own GPU), and the bubble the schedule simulator predicts
for the same schedule with the profiled stage costs. Not a test: numbers go to docs/RESULTS.md.

Two single-process baselines run beside the pipeline: the trainer on the dataset as loaded (what a
user runs) and the trainer on the pipeline's relabelled graph (vertices ordered by chunk, which also
makes the whole-graph sparse product faster through locality) — the stricter comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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
    p.add_argument("--scheduler", default=None, help="default: gnnpipe's default scheduler (1f1b)")
    p.add_argument("--recompute", choices=["auto", "on", "off"], default="auto",
                   help="default: auto (the memory model decides, as gnnpipe train does)")
    p.add_argument("--layer-split", default="profiled")
    p.add_argument("--over-partition", type=int, default=4, help="METIS over-partitioning factor (paper: 4)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of (single, single relabelled, pipeline)")
    p.add_argument("--_single-copy", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="write both results as JSON")
    a = p.parse_args()
    if a._single_copy is not None:
        return _single_copy(a)

    import torch

    from gnnpipe import api, schedulers
    from gnnpipe.core.settings.config import TrainConfig

    a.scheduler = a.scheduler or TrainConfig().scheduler
    base = TrainConfig(dataset=a.dataset, root=a.root, model="gcnii", layers=a.layers, hidden=a.hidden,
                       epochs=a.epochs, eval_every=a.epochs, patience=0, threads=1)
    import attrs

    from gnnpipe.tasks.nodes.runner import build_plan
    from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer, resolve_config

    torch.set_num_threads(1)
    pipe_cfg = resolve_config(attrs.evolve(base, stages=a.stages, chunks=a.chunks, scheduler=a.scheduler,
                                           layer_split="equal", over_partition=a.over_partition))
    relabelled = build_plan(pipe_cfg, api.load_data(pipe_cfg)).data  # same chunking (same seed) as the pipeline's

    def med(r):
        return statistics.median(e["time_s"] for e in r.epochs[1:])

    rounds = []
    for _ in range(a.repeat):  # each round runs the three side by side; noise drifts slowly on this VM
        single = api.train(base, progress=False)
        single_rl = SingleProcessTrainer(relabelled, resolve_config(base), prepared=True).fit(progress=False)
        pipe = api.train(base, stages=a.stages, chunks=a.chunks, scheduler=a.scheduler, layer_split=a.layer_split,
                         recompute={"auto": None, "on": True, "off": False}[a.recompute],
                         over_partition=a.over_partition, progress=False)
        cpu_rl = statistics.median(e["cpu_s"][0] for e in single_rl.epochs[1:])
        cpu_ranks = [statistics.median(e["cpu_s"][r] for e in pipe.epochs[1:]) for r in range(a.stages)]
        rounds.append({"single": med(single), "single_relabelled": med(single_rl), "pipeline": med(pipe),
                       "cpu_single_relabelled_s": cpu_rl, "cpu_s": cpu_ranks, "inflation": sum(cpu_ranks) / cpu_rl,
                       "backend": pipe.extra["plan"].get("backend"),
                       "compute_s": [statistics.median(e["compute_s"][r] for e in pipe.epochs[1:])
                                     for r in range(a.stages)],
                       "recompute": pipe.config["recompute"], "idle_fraction": pipe.extra["idle_fraction"],
                       "bounds": pipe.extra["plan"]["stage_bounds"],
                       "stage_costs": pipe.extra["plan"]["stage_costs"],
                       "measured_bubble": measured_phase_bubble(a, pipe.extra["plan"])})
    pair = concurrent_single_copies(a, a.stages)

    ts = statistics.median(r["single"] for r in rounds)
    tr = statistics.median(r["single_relabelled"] for r in rounds)
    tp = statistics.median(r["pipeline"] for r in rounds)
    print(f"GCNII-{a.layers} hidden {a.hidden}, {a.dataset}: {a.stages} stages x 1 thread, {a.chunks} chunks, "
          f"{a.scheduler}, recompute {rounds[0]['recompute']}, over-partition {a.over_partition}, layer split "
          f"{a.layer_split}; {a.repeat} round(s)")
    for i, r in enumerate(rounds):
        costs = r["stage_costs"]
        sched = schedulers.build_schedule(a.scheduler, a.stages, a.chunks)
        sim = schedulers.simulate(sched, costs=schedulers.CostModel(forward=1.0, backward=2.0, stage_scale=costs))
        r["simulated_bubble"] = list(sim.bubble_fraction)
        print(f"  round {i}: single {r['single'] * 1e3:7.1f}, single (pipeline's vertex order) "
              f"{r['single_relabelled'] * 1e3:7.1f}, pipeline {r['pipeline'] * 1e3:7.1f} ms/epoch -> "
              f"{r['single'] / r['pipeline']:.3f}x / {r['single_relabelled'] / r['pipeline']:.3f}x; split "
              f"{r['bounds']} (profiled {[f'{c:.3f}' for c in costs]} s); compute per rank "
              f"{[round(c, 3) for c in r['compute_s']]} s; idle {[round(f, 3) for f in r['idle_fraction']]}; "
              f"simulated bubble {[round(b, 3) for b in sim.bubble_fraction]} (uniform F:B = 1:2), "
              f"{[round(b, 3) for b in r['measured_bubble']] if r['measured_bubble'] else 'n/a'} "
              f"(profiled per-chunk F and B); thread CPU per rank {[round(c, 3) for c in r['cpu_s']]} s against "
              f"{r['cpu_single_relabelled_s']:.3f} s single (relabelled) -> work inflation {r['inflation']:.3f}; "
              f"backend {r['backend']}")
    print(f"  median single process (1 thread): {ts * 1e3:8.1f} ms/epoch (median of epochs 2..{a.epochs})")
    print(f"  median single process, pipeline's vertex order: {tr * 1e3:8.1f} ms/epoch")
    print(f"  median pipeline ({a.stages} ranks): {tp * 1e3:8.1f} ms/epoch")
    print(f"  speed-up single / pipeline = {ts / tp:.3f}x  (against the relabelled single process: {tr / tp:.3f}x)")
    r1 = statistics.median(r["single"] / r["pipeline"] for r in rounds)
    r2 = statistics.median(r["single_relabelled"] / r["pipeline"] for r in rounds)
    print(f"  median of the per-round speed-ups: {r1:.3f}x  (against the relabelled single process: {r2:.3f}x)")
    print(f"  median work inflation (ranks' thread CPU summed / relabelled single process's): "
          f"{statistics.median(r['inflation'] for r in rounds):.3f}")
    slow = bound = None
    if pair:
        slow = statistics.mean(pair) / ts
        bound = a.stages / slow * a.chunks / (a.chunks + a.stages - 1)
        print(f"  {a.stages} concurrent copies of the single-process trainer: {[round(t * 1e3, 1) for t in pair]} "
              f"ms/epoch = {slow:.3f}x one copy alone -> bound on the speed-up with the bubble: "
              f"{a.stages} / {slow:.3f} x {a.chunks}/{a.chunks + a.stages - 1} = {bound:.3f}x")
    else:
        print(f"  {a.stages} concurrent copies of the single-process trainer: failed (run one copy by hand: "
              f"{sys.executable} {__file__} --_single-copy 0)")
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "rounds": rounds, "single_ms": ts * 1e3,
                                           "single_relabelled_ms": tr * 1e3, "pipeline_ms": tp * 1e3,
                                           "speedup": ts / tp, "speedup_vs_relabelled": tr / tp,
                                           "median_round_speedup": r1, "median_round_speedup_vs_relabelled": r2,
                                           "concurrent_single_ms": [t * 1e3 for t in pair],
                                           "concurrency_slowdown": slow, "bound": bound}, indent=1))


def measured_phase_bubble(a, plan: dict):
    """The simulator's bubble per stage for this schedule with the profiled forward and backward seconds of
    every stage on every chunk (``plan["stage_chunk_forward_s"]``/``..._backward_s``), or ``None``."""
    from gnnpipe import partitioners, schedulers

    fwd, bwd = plan.get("stage_chunk_forward_s"), plan.get("stage_chunk_backward_s")
    if not fwd or not bwd:
        return None
    sched = schedulers.build_schedule(a.scheduler, a.stages, a.chunks)
    return list(schedulers.simulate(sched, costs=partitioners.action_costs(fwd, bwd)).bubble_fraction)


def concurrent_single_copies(a, copies: int) -> list[float]:
    """Median epoch time (s) of ``copies`` single-process trainers (1 thread each) running at the same time:
    how much two busy processes slow each other on this machine, whatever the pipeline does."""
    import subprocess
    import time

    start = time.time() + 30.0  # after every copy has loaded the data
    cmd = [sys.executable, __file__, "--_single-copy", str(start), "--epochs", str(a.epochs), "--dataset", a.dataset,
           "--root", a.root, "--layers", str(a.layers), "--hidden", str(a.hidden)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(copies)]
    outs = [p.communicate()[0].strip().splitlines() for p in procs]
    try:
        return [float(o[-1]) for o in outs]
    except (IndexError, ValueError):  # a copy failed: report it, keep the rounds already measured
        return []


def _single_copy(a) -> None:
    import time

    import torch

    from gnnpipe import api
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer, resolve_config

    torch.set_num_threads(1)
    cfg = resolve_config(TrainConfig(dataset=a.dataset, root=a.root, model="gcnii", layers=a.layers, hidden=a.hidden,
                                     epochs=a.epochs, patience=0, threads=1))
    trainer = SingleProcessTrainer(api.load_data(cfg), cfg, prepared=True)
    trainer.train_epoch(0)
    while time.time() < a._single_copy:
        time.sleep(0.01)
    times = []
    for e in range(a.epochs):
        t0 = time.perf_counter()
        trainer.train_epoch(e)
        times.append(time.perf_counter() - t0)
    print(statistics.median(times[1:]))


if __name__ == "__main__":
    main()
