"""Per-action timeline of pipeline epochs, with and without pre-posted receives, side by side in one run.

    python benchmarks/bench_pipeline_timeline.py [--rounds 2] [--epochs 5] [--trace timeline.json]

Runs the speed-up benchmark's pipeline (GCNII-32, hidden 100, Amazon Computers, 16 chunks, 2 stages × 1
thread, gpipe; split [0, 16, 34] unless ``--bounds``) in rounds of (receives posted one action ahead,
blocking receives), timing every action and every receive wait on every rank. Prints per setting the
median epoch time, each rank's receive waits (total, and the median wait of receives whose action is not
the epoch's first, i.e. the transfer left on the critical path) and each rank's compute per epoch.
``--trace`` writes the last epoch of the last round as a Chrome trace (chrome://tracing, Perfetto):
one process per setting and rank, one slice per action or wait. Not a test: numbers go to docs/RESULTS.md §5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _worker(rank: int, world: int, config, plan, prepost: bool, epochs: int) -> list[dict]:
    """One rank: ``epochs`` training epochs (each after a barrier) with every action and wait timed.
    Returns per epoch ``{"wall": s, "events": [(name, start_s, duration_s), ...]}`` (times from the epoch start)."""
    import torch.distributed as dist

    from gnnpipe.tasks.nodes.runner import make_executor

    stage = make_executor(config, plan, rank, world)
    stage.prepost = prepost
    events: list = []

    def timed(fn, label):
        def run(*args, **kw):
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            events.append((label(*args), t0, time.perf_counter() - t0))
            return out
        return run

    stage.forward = timed(stage.forward, lambda c, e=None: f"F{c}")  # the interpreter's actions
    stage.backward = timed(stage.backward, lambda c, e=None: f"B{c}")
    stage.step = timed(stage.step, lambda: "STEP")
    stage.comm.wait_recv = timed(stage.comm.wait_recv, lambda p: f"wait tag {p.tag}")
    stage.comm.wait_sends = timed(stage.comm.wait_sends, lambda: "wait sends")
    out = []
    for e in range(epochs):
        dist.barrier()
        events.clear()
        t0 = time.perf_counter()
        stage.train_epoch(e)
        out.append({"wall": time.perf_counter() - t0,
                    "events": [(n, s - t0, d) for n, s, d in events]})
    return out


def _summary(epochs: list[dict]) -> dict:
    """Per-epoch figures of one rank (epochs after the first): receive waits and compute."""
    waits, late, compute = [], [], []
    for ep in epochs[1:]:
        ev = ep["events"]
        w = [d for n, _, d in ev if n.startswith("wait tag")]
        waits.append(sum(w))
        actions = [(n, s, d) for n, s, d in ev if n[0] in "FB"]
        first_end = actions[0][1] + actions[0][2] if actions else 0.0
        # waits after the epoch's first action: what is left of each transfer on the critical path
        late += [d for n, s, d in ev if n.startswith("wait tag") and s >= first_end]
        busy = sum(d for n, _, d in actions) + sum(d for n, _, d in ev if n == "STEP")
        compute.append(busy - sum(w))
    return {"recv_wait_ms": 1e3 * statistics.median(waits), "late_wait_median_ms": 1e3 * statistics.median(late or [0]),
            "compute_ms": 1e3 * statistics.median(compute)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="Computers")
    p.add_argument("--root", default=str(SHARED / "amazon"))
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--scheduler", default="gpipe")
    p.add_argument("--bounds", default="0,16,34", help="stage unit bounds (the profiled split of RESULTS §5)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trace", default=None, help="write the last epoch as a Chrome trace JSON")
    a = p.parse_args()

    from gnnpipe import api
    from gnnpipe.core.run import launch
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.nodes.runner import build_plan
    from gnnpipe.tasks.nodes.trainer import resolve_config

    bounds = [int(b) for b in a.bounds.split(",")]
    cfg = resolve_config(TrainConfig(dataset=a.dataset, root=a.root, model="gcnii", layers=a.layers, hidden=a.hidden,
                                     stages=len(bounds) - 1, chunks=a.chunks, scheduler=a.scheduler,
                                     epochs=a.epochs, threads=1))
    plan = build_plan(cfg, api.load_data(cfg))
    plan.bounds = bounds
    settings = {"pre-posted receives": True, "blocking receives": False}
    runs: dict[str, list] = {k: [] for k in settings}
    for _ in range(a.rounds):  # alternate the settings: machine noise hits both alike
        for name, prepost in settings.items():
            runs[name].append(launch.spawn(_worker, cfg.world_size, (cfg, plan, prepost, a.epochs), threads=1,
                                           max_runtime_s=600))
    print(f"GCNII-{a.layers} hidden {a.hidden}, {a.dataset}: {cfg.stages} stages x 1 thread, {a.chunks} chunks, "
          f"{a.scheduler}, bounds {bounds}; {a.rounds} round(s) x {a.epochs} epochs (first epoch of each run dropped)")
    for name, rounds in runs.items():
        walls = [max(r[rank][e]["wall"] for rank in range(cfg.world_size)) for r in rounds for e in range(1, a.epochs)]
        ranks = [_summary([ep for r in rounds for ep in r[rank]]) for rank in range(cfg.world_size)]
        print(f"  {name:20s} epoch {1e3 * statistics.median(walls):7.1f} ms (median; range "
              f"{1e3 * min(walls):.0f}-{1e3 * max(walls):.0f}); per rank: receive waits "
              f"{[round(s['recv_wait_ms']) for s in ranks]} ms/epoch, median wait of a receive after the first "
              f"action {[round(s['late_wait_median_ms'], 2) for s in ranks]} ms, compute "
              f"{[round(s['compute_ms']) for s in ranks]} ms/epoch")
    if a.trace:
        trace = []
        for pid, (name, rounds) in enumerate(runs.items()):
            for rank, epochs in enumerate(rounds[-1]):
                for n, s, d in epochs[-1]["events"]:
                    trace.append({"name": n, "ph": "X", "ts": s * 1e6, "dur": d * 1e6, "pid": f"{name}",
                                  "tid": f"rank {rank}"})
        Path(a.trace).write_text(json.dumps({"traceEvents": trace}))
        print(f"  trace: {a.trace}")


if __name__ == "__main__":
    main()
