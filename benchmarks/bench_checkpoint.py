"""Checkpoint cost per rank: size, write time and read (resume) time as a fraction of one epoch
(issue #13). Default: Coauthor-Physics, GCNII-32 hidden 100, 4 pipeline stages (gpipe, 16 chunks,
T1+T2+T3), one checkpoint per epoch.

    python benchmarks/bench_checkpoint.py [--epochs 3] [--dataset Physics] [--stages 4]

Runs ``--epochs`` epochs writing a checkpoint after each, then resumes the last checkpoint with no epoch
left to run (a pure load). Per rank it prints the bytes of its DCP file, the median write time, the
read time, and both divided by the median epoch time (the epoch that follows a checkpoint pays for
it). Write times include DCP's collective planning and waiting for the slowest rank. Not a test:
numbers go to docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--dataset", default="Physics")
    p.add_argument("--root", default=str(SHARED / "coauthor"))
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--dir", default=None, help="checkpoint folder (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args()

    from gnnpipe import api

    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(args.dir or tmp) / "ck"
        cfg = dict(dataset=args.dataset, root=args.root, model="gcnii", layers=args.layers, hidden=args.hidden,
                   stages=args.stages, chunks=args.chunks, epochs=args.epochs, patience=0, timeout_s=600.0)
        run = api.train(progress=False, checkpoint_dir=str(ck), checkpoint_every=1, **cfg)
        last = sorted(ck.glob("ckpt-*"))[-1]
        sizes = {int(f.name.split("_")[2]): f.stat().st_size for f in last.glob("__*_*.distcp")}
        back = api.train(progress=False, resume=str(ck), **cfg)
    epoch_s = statistics.median(e["time_s"] for e in run.epochs)
    write = [statistics.median(w) for w in run.extra["checkpoint"]["write_s"]]
    read = back.extra["checkpoint"]["read_s"]
    total = sum(sizes.values())
    print(f"{args.dataset}, GCNII-{args.layers} hidden {args.hidden}, {args.stages} stages, {args.chunks} chunks: "
          f"median epoch {epoch_s:.3f} s; checkpoint data {total / 2**20:.1f} MiB in all")
    print(f"{'rank':>4} {'MiB':>8} {'write s':>8} {'/epoch':>7} {'read s':>8} {'/epoch':>7}")
    rows = []
    for r in range(len(write)):
        mib = sizes.get(r, 0) / 2**20
        rows.append({"rank": r, "bytes": sizes.get(r, 0), "write_s": write[r], "read_s": read[r]})
        print(f"{r:>4} {mib:>8.1f} {write[r]:>8.3f} {write[r] / epoch_s:>7.2f} "
              f"{read[r]:>8.3f} {read[r] / epoch_s:>7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"epoch_s": epoch_s, "ranks": rows, "args": vars(args)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
