"""How much ranks of one node slow each other: the profile's contention measurement
(``gnnpipe.tasks.nodes.cost.profile.measure_contention``) on the speed-up benchmark's chunks.

    python benchmarks/bench_contention.py [--processes 2] [--rounds 3] [--dataset Computers] [--chunks 16]

Per round, every unit of a 2-layer stand-in of the model (the units the profile times) on the chunks of a METIS
chunk plan, alone and, back to back, while forked co-runners run the same passes on the other cores (``--processes``
in all; more than the cores measures time-slicing): the median over ``--pairs`` pairs of loaded / alone thread CPU,
forward and backward per unit. Not a test: numbers go to docs/RESULTS.md §11f and §14i.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="Computers")
    p.add_argument("--root", default=str(SHARED / "amazon"))
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--over-partition", type=int, default=4)
    p.add_argument("--processes", type=int, default=None, help="processes at once (default: this machine's cores)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    import time

    import torch

    from gnnpipe import api
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.partitioners import ChunkPlan
    from gnnpipe.tasks.nodes.cost.profile import measure_contention
    from gnnpipe.tasks.nodes.trainer import make_model, resolve_config

    torch.set_num_threads(1)
    cfg = resolve_config(TrainConfig(dataset=args.dataset, root=args.root, model="gcnii", layers=2,
                                     hidden=args.hidden, threads=1, over_partition=args.over_partition))
    data = api.load_data(cfg)
    plan = ChunkPlan.build(data, args.chunks, cfg.partitioner, over=args.over_partition, seed=cfg.seed)
    model = make_model(cfg, int(data.x.size(1)), int(data.y.max()) + 1)
    names = [type(u).__name__ for u in model.units]
    for r in range(args.rounds):
        t0 = time.perf_counter()
        ratios, procs = measure_contention(model, plan.data, plan.chunk_ptr.tolist(), args.pairs,
                                           processes=args.processes)
        if ratios is None:
            print("not measured (fewer than 2 cores, or no fork start method)")
            return
        cells = ", ".join(f"{n} {f:.3f}/{b:.3f}" for n, (f, b) in zip(names, ratios))
        print(f"round {r}: {procs} processes, {time.perf_counter() - t0:.1f} s; loaded/alone F/B: {cells}")


if __name__ == "__main__":
    main()
