"""The atomistic cost model against measured graph-parallel steps: per-rank peak memory and step time.

Profiles ``dimenet++`` (or ``--model gemnet-t`` / ``gemnet-dt``) on a small sample slab (``--profile-size`` unit cells:
one single-process step's time and peak of live bytes, :func:`gnnpipe.tasks.s2ef.cost.profile_step`), then runs the
training steps of ``benchmarks/bench_graph_parallel.py`` on the job's Pt(111) slab for each ``G`` of ``--gp-sizes``
(fresh processes) and prints, per rank, the measured peak above the floor and step time beside the cost model's
prediction for the layout ``S1 x G x D1`` (:func:`gnnpipe.tasks.s2ef.cost.predict_layout`; the benchmark's step has no
optimizer, so the prediction compared is gradients + the flat all-reduce buffer + activations; its floor holds the
weights).

Each ``G`` runs twice in fresh processes: a memory pass (one step) with ``MALLOC_MMAP_THRESHOLD_=16384`` (glibc
returns freed blocks of 16 KiB and more at once, so the resident peak is the live peak: with the default 128 KiB
threshold the per-rank edge tensors of a small model fall under it and the heap keeps what they freed), and a timing
pass with the default allocator (the memory pass's ``mmap`` per tensor slows a step several times).

Usage::

    python benchmarks/bench_atomistic_costmodel.py --size 6 --layers 3 --hidden 64 --gp-sizes 1 2 4
    python benchmarks/bench_atomistic_costmodel.py --size 4 --layers 3 --hidden 32 --gp-sizes 1 2   # smoke

Times on a shared CPU are load-dependent: report ``uptime`` with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def main(argv=None) -> int:
    import bench_graph_parallel as bgp

    from gnnpipe.core.run import launch
    from gnnpipe.data.atoms import build_graph
    from gnnpipe.models import build_model
    from gnnpipe.tasks.s2ef.cost import AtomJob, AtomLayout, predict_layout, profile_step

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=6)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--profile-size", type=int, default=None,
                   help="unit cells of the profiled sample (default: the job's slab)")
    p.add_argument("--cutoff", type=float, default=6.0)
    p.add_argument("--max-neighbors", type=int, default=50)
    p.add_argument("--model", choices=sorted(bgp.MODELS), default="dimenet++")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--gp-sizes", type=int, nargs="+", default=[1, 2], help="layouts D = 1 x G")
    p.add_argument("--layouts", nargs="+", default=None,
                   help="D x G layouts as DxG (e.g. 1x1 1x2 2x1 2x2; replaces --gp-sizes): D replicas of G ranks, "
                        "each replica stepping on the slab, the gradients all-reduced over the D·G ranks")
    p.add_argument("--partitioner", default="edge-chunk")
    p.add_argument("--mode", default="allgather", choices=["allgather", "halo"])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", help="write the results as JSON")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    psize = args.profile_size or args.size
    mk = {"num_layers": args.blocks, "hidden": args.hidden, "cutoff": args.cutoff, "max_neighbors": args.max_neighbors}
    torch.manual_seed(0)
    name, extra = bgp.MODELS[args.model]
    model = build_model(name, 0, 1, **mk, **extra)
    sample = bgp.slab(psize, args.layers, torch.float32)
    rev = bool(getattr(model, "uses_reverse_edges", False))
    prof = profile_step(model, sample, build_graph(sample, args.cutoff, args.max_neighbors, with_reverse=rev),
                        steps=args.steps, warmup=args.warmup, link=True, name=name)
    print(f"profile: {psize}x{psize}x{args.layers} slab, {prof.atoms} atoms, {prof.edges} edges, {prof.triplets} "
          f"triplets: step {prof.step_s:.3f} s, kappa {prof.kappa:.2f}", file=sys.stderr)
    job_batch = bgp.slab(args.size, args.layers, torch.float32)
    job = AtomJob(model, job_batch.to_data_list(), args.cutoff, args.max_neighbors, partitioner=args.partitioner,
                  mode=args.mode, element_size=4, allreduce_element_size=4)
    bench_args = argparse.Namespace(model=args.model, malloc="system", size=args.size, layers=args.layers,
                                    cutoff=args.cutoff, max_neighbors=args.max_neighbors, hidden=args.hidden,
                                    blocks=args.blocks, partitioner=args.partitioner, mode=args.mode, steps=args.steps,
                                    warmup=args.warmup, threads=1, dtype="float32", device="cpu", timeout=600.0)
    rows = []
    grid = ([tuple(int(v) for v in lay.lower().split("x")) for lay in args.layouts] if args.layouts
            else [(1, G) for G in args.gp_sizes])
    print(f"{'DxG':>4} {'rank':>4} {'peak MiB':>9} {'pred MiB':>9} {'err %':>6} "
          f"{'step s':>8} {'pred s':>8} {'err %':>6} "
          f"{'cpu s':>7} {'pred':>7} {'err %':>6}")
    for D, G in grid:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "16384"
        mem_args = argparse.Namespace(**{**vars(bench_args), "steps": 1, "warmup": 0})
        try:
            mem = launch.spawn(bgp.run_rank, D * G, (mem_args, G), backend="gloo", timeout_s=600, threads=1)
        finally:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        outs = launch.spawn(bgp.run_rank, D * G, (bench_args, G), backend="gloo", timeout_s=600, threads=1)
        for o, m in zip(outs, mem):
            o["peak_MiB"] = m["peak_MiB"]
        pred = predict_layout(job, AtomLayout(1, G, D), prof)
        step = max(o["step_s"] for o in outs)
        for o, m, w in zip(outs, pred.memory * D, pred.work_s * D):
            pm = (m.gradients + m.allreduce + m.activations) / 2 ** 20
            row = {"D": D, "G": G, "rank": o["rank"], "peak_MiB": o["peak_MiB"], "pred_MiB": pm, "step_s": step,
                   "pred_step_s": pred.step_s, "cpu_s": o["cpu_s"], "pred_cpu_s": w, "edges": o["edges"],
                   "triplets": o["triplets"]}
            rows.append(row)
            print(f"{f'{D}x{G}':>4} {o['rank']:>4} {o['peak_MiB']:>9.1f} {pm:>9.1f} "
                  f"{100 * (pm / o['peak_MiB'] - 1):>6.1f} "
                  f"{step:>8.3f} {pred.step_s:>8.3f} {100 * (pred.step_s / step - 1):>6.1f} "
                  f"{o['cpu_s']:>7.3f} {w:>7.3f} {100 * (w / o['cpu_s'] - 1):>6.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "profile": prof.to_dict(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
