"""Why the chunk aggregation gathers its rows first: the cost of one aggregation op in a pipeline's
access pattern, side by side in one run (numbers go to docs/RESULTS.md §5).

    python benchmarks/bench_chunk_gather.py [--dataset Computers] [--chunks 16] [--buffers 40] [--over 4]

A pipeline stage runs chunk by chunk through all of its ops ("chunk-major"), so every chunk's product
``Â[R_c, :] @ H_in`` reads its halo rows from a different, cold, full-graph history buffer. Timed per
op (ms, median of 5 rounds, 1 thread), on the graph relabelled by the pipeline's chunk plan:

* ``whole``: the whole-graph product ``Â @ H`` (what the single-process trainer does), op after op;
* ``chunk-major, row slice``: ``Â[R_c, :] @ H`` with a CSR row slice, chunk after chunk, each chunk
  through all ``--buffers`` buffers;
* ``chunk-major, compact``: the same as a gather (``index_select`` of the referenced rows) and a product
  with compacted columns — what the pipeline used before the fused product (issue #18);
* ``chunk-major, fused``: :class:`gnnpipe.tasks.nodes.graph.CompactRows` ``.mm``, one fused gather-and-multiply
  (:func:`gnnpipe.tasks.nodes.graph.csr_mm`: ``embedding_bag`` on CPU) — what the pipeline uses;
* ``whole, fused``: the whole-graph product through :func:`gnnpipe.tasks.nodes.graph.spmm` (the same fused kernel;
  what the single-process trainer uses).

Both on the chunk plan's two within-chunk vertex orders (``ChunkPlan.build(order=…)``): ``original``
(the dataset's relative order inside each chunk) and ``locality`` (the default: fine METIS parts
contiguous, each in reverse Cuthill–McKee order). It also prints the whole-graph product on the
dataset's original vertex order.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="Computers")
    p.add_argument("--root", default=str(SHARED / "amazon"))
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--over", type=int, default=4, help="over-partitioning factor of the chunk plan (paper: 4)")
    p.add_argument("--buffers", type=int, default=40, help="history buffers (ops) a stage cycles through")
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()

    import torch

    from gnnpipe.api import load_data
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.partitioners import ChunkPlan, partition_metrics
    from gnnpipe.tasks.nodes.graph import CompactRows, build_adjacency, csr_row_slice, spmm
    from gnnpipe.tasks.nodes.trainer import resolve_config

    torch.set_num_threads(1)
    data = load_data(resolve_config(TrainConfig(dataset=a.dataset, root=a.root)))
    n = int(data.num_nodes)
    bufs = [torch.randn(n, a.dim) for _ in range(a.buffers)]

    def whole(mat, op=torch.sparse.mm):  # outputs dropped at once, as in the chunk-major cases
        def run():
            for b in bufs:
                op(mat, b)
        return run

    def chunk_major(rows, op):
        def run():
            for r in rows:
                for b in bufs:
                    op(r, b)
        return run

    cases = {"whole, original order": whole(build_adjacency(data.edge_index, n, "gcn"))}
    for order in ("original", "locality"):
        plan = ChunkPlan.build(data, a.chunks, "metis", over=a.over, seed=0, order=order)
        rd = plan.data
        ptr = plan.chunk_ptr.tolist()
        adj = build_adjacency(rd.edge_index, n, "gcn")
        slices = [csr_row_slice(adj, lo, hi) for lo, hi in zip(ptr, ptr[1:])]
        compact = [CompactRows(s) for s in slices]
        cases[f"whole, chunk plan ({order})"] = whole(adj)
        cases[f"chunk-major, row slice ({order})"] = chunk_major(slices, torch.sparse.mm)
        cases[f"whole, fused ({order})"] = whole(adj, spmm)
        cases[f"chunk-major, compact ({order})"] = chunk_major(
            compact, lambda r, b: torch.mm(r.local, b.index_select(0, r.cols)))
        cases[f"chunk-major, fused ({order})"] = chunk_major(compact, lambda r, b: r.mm(b))
    m = partition_metrics(rd.edge_index, n, plan.chunk_of())
    times = {k: [] for k in cases}
    for f in cases.values():
        f()  # warm-up
    for _ in range(a.rounds):  # interleaved rounds: machine noise hits every case alike
        for k, f in cases.items():
            t0 = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t0) / a.buffers * 1e3)
    halo = sum(int(c.cols.numel()) for c in compact) - n
    print(f"{a.dataset}: N={n}, E={rd.edge_index.size(1)}, {a.chunks} chunks (METIS, over={a.over}): "
          f"directed edge cut {m.edge_cut} ({m.edge_cut / rd.edge_index.size(1):.0%}), halo rows read per op "
          f"{halo} ({halo / n:.2f} N); {a.buffers} buffers of [{n}, {a.dim}] float32")
    for k, v in times.items():
        print(f"  {k:40s} {statistics.median(v):7.2f} ms per op")


if __name__ == "__main__":
    main()
