"""Graph parallelism of DimeNet++ (or GemNet-T / GemNet-dT: ``--model``) on one large periodic structure: per-rank
peak memory and the training step.

A periodic Pt(111) slab (``--size`` unit cells × ``--layers`` layers, a few hundred atoms, periodic in x and y),
labelled by ASE's EMT; its neighbour graph within ``--cutoff`` Å (default 6), at most ``--max-neighbors`` (50)
per atom, with its triplets; ``dimenet++`` with ``--hidden`` channels (default 256). One training step is what the
S2EF executor does per batch: energy and conservative forces (``F = −∂E/∂pos``, a second backward), the loss
``(E − Ê)² + 100·mean |F − F̂|²``, its backward, then the all-reduce (sum) of the parameter gradients over the
group (:mod:`gnnpipe.tasks.s2ef.graph_parallel`).

For each ``G`` of ``--gp-sizes`` (1: a single process, no process group) the script reports per rank:

* ``peak_MiB``: peak memory of the step above the rank's floor (the memory held just before the first step:
  runtime, model, graph, plan). CUDA: ``max_memory_allocated`` − allocated before; CPU: the peak resident set
  (``VmHWM``, reset through ``/proc/self/clear_refs``) − the resident set before.
* ``step_s``: the median wall time of a step (after ``--warmup`` steps), split into ``comm_s`` (inside the
  graph-parallel collectives and the gradient all-reduce), ``idle_s`` (waiting at a barrier before the gradient
  all-reduce: the imbalance between the ranks' shares) and ``compute_s`` (the rest), medians over steps;
  ``bytes_gp`` (bytes the rank sent in the collectives per step); ``cpu_s``: the main thread's CPU seconds of the
  step (less sensitive than wall time to other processes sharing the cores).

Usage::

    python benchmarks/bench_graph_parallel.py --gp-sizes 1 2 4 --steps 5 --out bench_gp.json
    python benchmarks/bench_graph_parallel.py --gp-sizes 1 2 --hidden 128 --malloc retain   # no page faults
    python benchmarks/bench_graph_parallel.py --size 4 --layers 3 --hidden 32 --steps 2 --gp-sizes 1 2   # smoke
    python benchmarks/bench_graph_parallel.py --model gemnet-dt --cutoff 4 --max-neighbors 12 --hidden 64 \
        --blocks 2 --gp-sizes 1 2 4     # GemNet-dT at DimeNet++'s S2EF defaults' edge width
    python benchmarks/bench_graph_parallel.py --models dimenet++ gemnet-dt --rounds 5 --gp-sizes 1 2 --cutoff 4 \
        --max-neighbors 12 --hidden 64 --blocks 2     # side by side, rounds of fresh processes

Times on a shared CPU are load-dependent: report the machine's load (``uptime``) with them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def slab(size: int, layers: int, dtype: torch.dtype):
    """The Pt(111) slab as a PyG batch of one structure (EMT energy and forces)."""
    from ase.build import fcc111
    from ase.calculators.emt import EMT
    from torch_geometric.data import Batch

    from gnnpipe.data.atoms import from_atoms

    atoms = fcc111("Pt", size=(size, size, layers), vacuum=8.0, periodic=False)
    atoms.pbc = (True, True, False)
    atoms.rattle(0.05, seed=0)
    atoms.calc = EMT()
    atoms.get_forces()
    return Batch.from_data_list(from_atoms([atoms], dtype=dtype))


def set_allocator(kind: str) -> None:
    """This process's allocator from now on: glibc's defaults (``system``), or ``retain`` — no fresh mappings for
    large blocks and no trimming (``mallopt(M_MMAP_MAX, 0)``, ``mallopt(M_TRIM_THRESHOLD, -1)``), so freed memory
    is reused as PyTorch's CUDA caching allocator reuses it and a step after the first faults no page in. On a VM
    a page fault can cost tens of microseconds, and then the allocator, not the model, sets the step time."""
    if kind == "retain":
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        if not (libc.mallopt(-4, 0) and libc.mallopt(-1, -1)):  # M_MMAP_MAX, M_TRIM_THRESHOLD (SIZE_MAX)
            raise RuntimeError("mallopt refused the retain settings")


def _peak_reset(device: torch.device) -> float:
    """Reset the peak counter; returns the floor (bytes held now)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return float(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return float(_status("VmRSS"))


def _peak(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return float(_status("VmHWM"))


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


#: --model: (zoo model, extra options)
MODELS = {"dimenet++": ("dimenet++", {}), "gemnet-t": ("gemnet-t", {}),
          "gemnet-dt": ("gemnet-t", {"direct_forces": True})}


def run_rank(rank: int, world: int, args: argparse.Namespace, gp_size: int | None = None) -> dict:
    """The steps of one rank of ``world = D × G`` (``gp_size`` = G, default ``world``; rank ``d·G + g`` is rank ``g``
    of replica ``d``'s graph-parallel group; every replica steps on the same slab; ``world == 1``: the single
    process, no collectives)."""
    import torch.distributed as dist

    from gnnpipe.core.comm import Comm
    from gnnpipe.data.atoms import build_graph
    from gnnpipe.models import build_model
    from gnnpipe.partitioners import plan_graph_parallel
    from gnnpipe.tasks.s2ef.graph_parallel import GraphParallelComm

    torch.set_num_threads(args.threads)
    set_allocator(args.malloc)
    device = torch.device(args.device if args.device != "cuda" else f"cuda:{rank % torch.cuda.device_count()}")
    dtype = getattr(torch, args.dtype)
    batch = slab(args.size, args.layers, dtype)
    name, extra = MODELS[args.model]
    torch.manual_seed(0)
    model = build_model(name, 0, 1, num_layers=args.blocks, hidden=args.hidden, cutoff=args.cutoff,
                        max_neighbors=args.max_neighbors, **extra).to(dtype).to(device).train()
    graph = build_graph(batch, args.cutoff, args.max_neighbors,
                        with_reverse=bool(getattr(model, "uses_reverse_edges", False)))
    params = [p for p in model.parameters() if p.requires_grad]
    batch, graph = batch.to(device), graph.to(device)
    comm, local, counter = None, graph, Comm(device)
    G = world if gp_size is None else int(gp_size)
    group = None
    if world > G:  # D > 1 replicas: every rank creates every group, in the same order
        for d in range(world // G):
            g = dist.new_group(list(range(d * G, (d + 1) * G)))
            if d == rank // G:
                group = g
    if G > 1:
        plan = plan_graph_parallel(graph.to("cpu"), G, args.partitioner, pos=batch.pos.cpu())
        comm = GraphParallelComm(plan, group=group, mode=args.mode, comm=counter, device=device)
        local = comm.local_graph(graph)
    e_t, f_t = batch.energy.reshape(-1), batch.forces

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    floor = _peak_reset(device)
    for step in range(args.warmup + args.steps):
        counter.reset()
        for p in params:
            p.grad = None
        sync()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = model(batch, local, comm, forces=True)
        # direct forces come as the owned atoms' rows: their share of the mean over all atoms
        f_ref = f_t.index_select(0, comm.atom_ids) if comm is not None and model.direct_forces else f_t
        loss = ((out["energy"] - e_t) ** 2).sum() + 100.0 * ((out["forces"] - f_ref) ** 2).sum() / f_t.numel()
        loss.backward()
        sync()
        idle = comm_extra = 0.0
        if world > 1:
            t1 = time.perf_counter()
            dist.barrier()
            idle = time.perf_counter() - t1
            t2 = time.perf_counter()
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            dist.all_reduce(flat)
            sync()
            comm_extra = time.perf_counter() - t2
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        c = counter.counters()
        comm_s = c["comm_s"] + comm_extra
        if step >= args.warmup:
            rows.append({"step_s": wall, "comm_s": comm_s, "idle_s": idle, "compute_s": wall - comm_s - idle,
                         "cpu_s": cpu, "bytes_gp": c["bytes_gp"]})
    peak = _peak(device) - floor
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"rank": rank, "peak_MiB": peak / 2**20, "floor_MiB": floor / 2**20, **med,
            "edges": int(local.num_edges), "triplets": int(local.num_triplets),
            "atoms": int(batch.num_nodes), "all_edges": int(graph.num_edges), "all_triplets": int(graph.num_triplets)}


def rounds(args: argparse.Namespace) -> int:
    """``--rounds``: per round, each model of ``--models`` at each ``G`` of ``--gp-sizes`` in fresh processes
    (``G = 1`` too), one after the other; per round the step (slowest rank) of every model and ``G``, each model's
    step over the first model's at the same ``G``, and each ``G``'s speed-up over ``G = 1``; then the medians."""
    from gnnpipe.core.run import launch
    from gnnpipe.models import build_model

    models = args.models or [args.model]
    params = {}
    for m in models:
        name, extra = MODELS[m]
        params[m] = sum(p.numel() for p in build_model(name, 0, 1, num_layers=args.blocks, hidden=args.hidden,
                                                       cutoff=args.cutoff, max_neighbors=args.max_neighbors,
                                                       **extra).parameters())
    print("parameters: " + ", ".join(f"{m} {n:,}" for m, n in params.items()))
    table = []
    for r in range(args.rounds):
        row = {}
        for m in models:
            for G in args.gp_sizes:
                a = argparse.Namespace(**{**vars(args), "model": m})
                outs = launch.spawn(run_rank, G, (a,), backend="gloo", timeout_s=args.timeout, threads=args.threads)
                row[(m, G)] = {"step_s": max(o["step_s"] for o in outs), "cpu_s": max(o["cpu_s"] for o in outs),
                               "peak_MiB": max(o["peak_MiB"] for o in outs), "edges": outs[0]["all_edges"],
                               "triplets": outs[0]["all_triplets"], "atoms": outs[0]["atoms"]}
        table.append(row)
        ref = models[0]
        print(f"round {r + 1}: " + "; ".join(
            f"{m} G={G} {v['step_s']:.3f} s (cpu {v['cpu_s']:.3f})" for (m, G), v in row.items()), flush=True)
        print("  " + "; ".join(
            [f"{m}/{ref} at G={G}: {row[(m, G)]['step_s'] / row[(ref, G)]['step_s']:.2f}"
             for m in models[1:] for G in args.gp_sizes]
            + [f"{m} G=1/G={G}: {row[(m, 1)]['step_s'] / row[(m, G)]['step_s']:.2f}x"
               for m in models for G in args.gp_sizes if G > 1 and 1 in args.gp_sizes]), flush=True)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    ref = models[0]
    print("medians over rounds: " + "; ".join(
        [f"{m}/{ref} at G={G}: {med([t[(m, G)]['step_s'] / t[(ref, G)]['step_s'] for t in table]):.2f}"
         for m in models[1:] for G in args.gp_sizes]
        + [f"{m} G=1/G={G}: {med([t[(m, 1)]['step_s'] / t[(m, G)]['step_s'] for t in table]):.2f}x"
           for m in models for G in args.gp_sizes if G > 1 and 1 in args.gp_sizes]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "parameters": params,
                       "rounds": [{f"{m} G={G}": v for (m, G), v in t.items()} for t in table]}, f, indent=1)
    return 0


def main(argv=None) -> int:
    from gnnpipe.core.run import launch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=8, help="unit cells along x and y (8 x 8 x 5 = 320 atoms)")
    p.add_argument("--layers", type=int, default=5, help="atomic layers of the slab")
    p.add_argument("--cutoff", type=float, default=6.0)
    p.add_argument("--max-neighbors", type=int, default=50)
    p.add_argument("--model", choices=sorted(MODELS), default="dimenet++",
                   help="gemnet-dt: gemnet-t with direct forces; --hidden is the edge (and atom) width")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--blocks", type=int, default=3, help="interaction blocks")
    p.add_argument("--gp-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--partitioner", default="edge-chunk")
    p.add_argument("--mode", default="allgather", choices=["allgather", "halo"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--timeout", type=float, default=600.0, help="process-group timeout (s)")
    p.add_argument("--contention", action="store_true",
                   help="also run two whole single-process steps at once (D = 2 replicas of G = 1, their gradients "
                        "all-reduced): the slowdown two processes cause each other on this machine bounds what "
                        "G = 2 can gain (2 / that ratio)")
    p.add_argument("--malloc", choices=["system", "retain"], default="system",
                   help="each rank's allocator (set_allocator): glibc's defaults, or retain freed memory for reuse")
    p.add_argument("--rounds", type=int, default=0,
                   help="rounds of fresh processes: each round runs every model of --models at every G of "
                        "--gp-sizes in new processes and prints the ratios of that round (steps side by side)")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=None,
                   help="with --rounds: the models compared (default: --model); the first is the reference")
    p.add_argument("--out", help="write the results as JSON")
    args = p.parse_args(argv)
    if args.rounds:
        return rounds(args)
    results = {}
    for G in args.gp_sizes:
        if G == 1:
            outs = [run_rank(0, 1, args)]
        else:
            backend = "nccl" if args.device == "cuda" and torch.cuda.device_count() >= G else "gloo"
            outs = launch.spawn(run_rank, G, (args,), backend=backend, timeout_s=args.timeout, threads=args.threads)
        results[G] = outs
        a = outs[0]
        print(f"G={G}: {a['atoms']} atoms, {a['all_edges']} edges, {a['all_triplets']} triplets "
              f"({args.partitioner}, {args.mode}, hidden {args.hidden}, {args.blocks} blocks, {args.dtype}, "
              f"{args.device})", file=sys.stderr)
        print(f"{'rank':>4} {'edges':>7} {'triplets':>9} {'peak MiB':>9} {'step s':>8} {'compute':>8} {'comm':>8} "
              f"{'idle':>8} {'MiB sent':>9}")
        for o in outs:
            print(f"{o['rank']:>4} {o['edges']:>7} {o['triplets']:>9} {o['peak_MiB']:>9.1f} {o['step_s']:>8.3f} "
                  f"{o['compute_s']:>8.3f} {o['comm_s']:>8.3f} {o['idle_s']:>8.3f} {o['bytes_gp'] / 2**20:>9.2f}")
    if args.contention:
        outs = launch.spawn(run_rank, 2, (args, 1), backend="gloo", timeout_s=args.timeout, threads=args.threads)
        results["2x1"] = outs
        print("two single-process steps at once (D = 2, G = 1): compute "
              + ", ".join(f"{o['compute_s']:.3f}" for o in outs) + " s per rank")
    if 1 in results and 2 in results:
        s1 = results[1][0]["step_s"]
        s2 = max(o["step_s"] for o in results[2])
        print(f"training step: single process {s1:.3f} s, G = 2 {s2:.3f} s (slowest rank); speed-up {s1 / s2:.2f}x")
        c1 = results[1][0]["compute_s"]
        c2 = max(o["compute_s"] for o in results[2])
        print(f"compute per rank at G = 2 / half the single's: {c2 / (c1 / 2):.2f}")
        if "2x1" in results:
            k = max(o["compute_s"] for o in results["2x1"]) / c1
            print(f"two processes at once slow each other by {k:.2f}x: G = 2 can gain at most {2 / k:.2f}x here; the "
                  f"split work itself costs {c2 / (c1 / 2) / k:.2f}x half the single's")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": {str(k): v for k, v in results.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
