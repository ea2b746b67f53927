"""A snapshot of what a fixed set of runs computes, to compare a refactored tree with the one before it.

Every layout of both kinds of work on small data: node classification (single process, pipeline with gpipe and
1f1b, graph parallelism, the hybrid, async-stale) and S2EF (single process, data parallelism, graph parallelism,
pipelines with conservative and direct forces, S × G, D × G and S × G × D), each trained a few epochs; the
snapshot records per-epoch losses, validation metrics and bytes by kind, and the cost models' predicted epoch /
step times and bytes of every layout from profiles taken once and saved (``--profiles DIR``), so predictions are
a function of the tree alone.

Usage::

    python benchmarks/behaviour_snapshot.py --profiles /tmp/snap/profiles --out /tmp/snap/before.json
    # ... change the tree ...
    python benchmarks/behaviour_snapshot.py --profiles /tmp/snap/profiles --out /tmp/snap/after.json
    python benchmarks/behaviour_snapshot.py --compare /tmp/snap/before.json /tmp/snap/after.json

The first run with an empty ``--profiles`` folder takes the profiles; later runs read them. ``--compare`` prints
every number that differs (relative tolerance ``--rtol``, default 1e-9) and exits 1 if any does. The node
classification memory predictions are measured at plan time (live bytes of the real stages on a subgraph), which
varies by a few tenths of a percent from run to run of one tree: those fields are compared within ``--mem-rtol``
(default 2 %).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

NODE_RUNS = {
    "nodes-single": dict(),
    "nodes-pipe-gpipe": dict(stages=2, chunks=4, scheduler="gpipe"),
    "nodes-pipe-1f1b": dict(stages=2, chunks=4, scheduler="1f1b"),
    "nodes-gp": dict(ways=2),
    "nodes-hybrid": dict(ways=2, stages=2, chunks=4),
    "nodes-async": dict(stages=2, chunks=4, scheduler="async-stale"),
}
NODE_BASE = dict(model="gcnii", layers=4, hidden=16, epochs=3, num_nodes=400, seed=3)

S2EF_RUNS = {
    "s2ef-single": dict(),
    "s2ef-dp": dict(ways=2),
    "s2ef-gp": dict(graph_parallel_group_size=2),
    "s2ef-gp-halo-atom": dict(graph_parallel_group_size=2, graph_parallel_mode="halo",
                              graph_parallel_partitioner="atom-owner"),
    "s2ef-pipe": dict(stages=2, chunks=2),
    "s2ef-pipe-direct": dict(stages=2, chunks=2, model="gemnet-t", direct_forces=True),
    "s2ef-pipe-gp": dict(stages=2, chunks=2, graph_parallel_group_size=2),
    "s2ef-dp-gp": dict(ways=2, graph_parallel_group_size=2),
    "s2ef-pipe-gp-dp": dict(stages=2, chunks=2, graph_parallel_group_size=2, ways=2),
}
S2EF_BASE = dict(model="dimenet++", layers=2, hidden=16, epochs=2, frames=12, batch_size=4, cutoff=4.0,
                 max_neighbors=8, dtype="float64", warmup_steps=1, seed=1)

EPOCH_KEYS = ("loss", "val_loss", "val_acc", "train_acc", "val_energy_mae", "val_force_mae", "train_force_mae",
              "bytes_layer", "bytes_graph", "bytes_weight", "bytes_gp", "lr")


def _epochs(result) -> list[dict]:
    return [{k: e[k] for k in EPOCH_KEYS if k in e} for e in result.epochs]


def run_all(profiles: Path) -> dict:
    from gnnpipe import api
    from gnnpipe.core.settings.config import TrainConfig

    out: dict = {}
    for name, kw in NODE_RUNS.items():
        r = api.train(TrainConfig(**{**NODE_BASE, **kw}), progress=False, log_every=0)
        out[name] = _epochs(r)
        print(name, "done", file=sys.stderr)
    for name, kw in S2EF_RUNS.items():
        r = api.train(TrainConfig(**{**S2EF_BASE, **kw}), progress=False, log_every=0)
        out[name] = _epochs(r)
        print(name, "done", file=sys.stderr)
    profiles.mkdir(parents=True, exist_ok=True)
    nodes_prof, s2ef_prof = profiles / "nodes.json", profiles / "s2ef.json"
    preds = api.plan(TrainConfig(**NODE_BASE), ranks=4, progress=False,
                     **({"profile_in": str(nodes_prof)} if nodes_prof.exists()
                        else {"profile_out": str(nodes_prof)}))[0]
    out["plan-nodes"] = [p.to_record() for p in preds]
    preds = api.plan(TrainConfig(**{**S2EF_BASE, "dtype": "float32"}), ranks=4, progress=False,
                     **({"profile_in": str(s2ef_prof)} if s2ef_prof.exists() else {"profile_out": str(s2ef_prof)}))[0]
    out["plan-s2ef"] = [p.to_record() for p in preds]
    return out


#: fields measured at plan time (node classification's memory footprint), compared within ``--mem-rtol``
MEASURED = ("mem", "peak", "resident", "activations", "memory", "max_rank_bytes", "floor")


def compare(a: dict, b: dict, rtol: float, mem_rtol: float = 0.02) -> list[str]:
    diffs = []

    def walk(x, y, where):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if k not in x or k not in y:
                    diffs.append(f"{where}.{k}: only in {'before' if k in x else 'after'}")
                else:
                    walk(x[k], y[k], f"{where}.{k}")
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                diffs.append(f"{where}: {len(x)} entries before, {len(y)} after")
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{where}[{i}]")
        elif isinstance(x, (int, float)) and isinstance(y, (int, float)):
            tol = mem_rtol if where.startswith(".plan-nodes") and any(m in where for m in MEASURED) else rtol
            if not (math.isclose(x, y, rel_tol=tol, abs_tol=1e-15) or (math.isnan(x) and math.isnan(y))):
                diffs.append(f"{where}: {x!r} before, {y!r} after")
        elif x != y:
            diffs.append(f"{where}: {x!r} before, {y!r} after")

    walk(a, b, "")
    return diffs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", type=Path, default=Path("/tmp/gnnpipe-snapshot/profiles"))
    p.add_argument("--out", type=Path)
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    p.add_argument("--rtol", type=float, default=1e-9)
    p.add_argument("--mem-rtol", type=float, default=0.02)
    args = p.parse_args()
    if args.compare:
        diffs = compare(*(json.loads(f.read_text()) for f in args.compare), rtol=args.rtol, mem_rtol=args.mem_rtol)
        print("\n".join(diffs) or "no differences")
        return 1 if diffs else 0
    snap = run_all(args.profiles)
    text = json.dumps(snap, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
