"""gnnpipe's graph parallelism of ``escn-md`` against fairchem's own (``gp_utils``) on the same eSCN-MD, weights,
structure and edges: per-step time and bytes per step at G ranks, each against its own single process; per-rank peak
memory (``--memory``) with the memory model's prediction for gnnpipe.

Run from the virtual environment that holds fairchem-core (never a gnnpipe dependency), gnnpipe importable::

    /work/venvs/fairchem/bin/python benchmarks/escn_gp_vs_fairchem.py --gp-sizes 2 4 --steps 5 --rounds 3 --out gp.json
    /work/venvs/fairchem/bin/python benchmarks/escn_gp_vs_fairchem.py --memory --repeat 4 --gp-sizes 4 \
        --skip-timing          # per-rank peak at G = 4 against G = 1 (256 atoms), and the memory model
    /work/venvs/fairchem/bin/python benchmarks/escn_gp_vs_fairchem.py --repeat 2 --gp-sizes 2 --steps 1  # smoke

What runs (each layout in fresh processes, ``torch.set_num_threads(1)`` per rank, gloo on the CPU):

* the structure: a rattled Cu fcc bulk cell (``--repeat n``: ``n × n × n`` cubic cells, ``4n³`` atoms; 108 for
  ``n = 3``) or a Pt(111) slab (``--structure pt-slab``), labelled by ASE's EMT; its neighbour graph is gnnpipe's
  (``build_graph``, ``--cutoff``, ``--max-neighbors``), fed to fairchem as ``edge_index`` / ``cell_offsets``
  (``otf_graph=False``) so both read the same edges;
* the weights: fairchem's ``eSCNMDBackbone`` + ``MLP_EFS_Head`` (conservative forces) built from a seed, loaded into
  gnnpipe's model with ``import_fairchem_state_dict``; float32;
* one training step: energy and forces ``F = −∂E/∂pos`` (with ``create_graph``), the loss ``(E − Ê)² + 100·mean
  (F − F̂)²``, its backward (no optimizer, no gradient all-reduce: both would cost the same in either library);
* gnnpipe: ``--gp-size G`` with the ``atom-owner`` partitioner (Morton order; every edge with its target atom's
  owner) — per block an all-gather of the normalised atom rows, sums onto atoms local;
* fairchem: ``gp_utils.setup_graph_parallel_groups`` and ``set_gp_config`` with mode ``allgather`` (contiguous
  index split: an all-gather of the atom rows per block) and ``all_to_all`` (partition ``index_split`` or
  ``spatial``: each rank receives only the atom rows its edges read); each rank is given the edges whose target atom
  it owns, as fairchem's graph generation does with a node partition.

Measured:

* ``step s``: the median over ``--steps`` steps after ``--warmup`` of the slowest rank's wall time of a step, the
  median over ``--rounds`` (every layout once per round, in fresh processes, one after the other, every other round
  in the reverse order within each G); ``x own G=1``: its
  own single process's step over it in the same round, the median over rounds (a speed-up: above 1 is faster);
  ``/ fc ag``: the step over fairchem's all-gather step at the same G in the same round (G = 1: over fairchem's
  single process), the median over rounds: on a shared machine runs minutes apart see other loads, adjacent ones
  much the same; ``cpu s``: the main thread's CPU seconds of a step (the slowest rank's; waits excluded, less
  sensitive to other processes than the wall time);
* ``MiB/step``: bytes a rank sends per step (the largest over the ranks), counted for both libraries the same way: a
  ``TorchDispatchMode`` intercepts every collective torch dispatches (``c10d`` / ``_c10d_functional`` ops, those of
  autograd's backward included) in one extra, untimed step and sums what the rank sends in each: an all-gather
  ``(G − 1)·input``, a ring all-reduce ``2(G − 1)/G·input``, a reduce-scatter ``(G − 1)/G·input``, an all-to-all or a
  send the rows to other ranks. gnnpipe's own counter (``Comm`` kind ``gp``) is printed beside it as a check;
* ``E, F vs ref``: the largest relative difference ``max |a − b| / max |b|`` of the energy and forces against gnnpipe's
  single process (the same weights; float32 rounding, and fairchem draws a random roll of each edge frame);
* ``--memory``: a one-step pass per layout in fresh processes with ``MALLOC_MMAP_THRESHOLD_=16384`` (freed blocks go
  back at once, so the resident peak is the live peak): per rank the peak resident set (``VmHWM``) above the floor
  held before the step (runtime, model, graph, plan); for gnnpipe beside it the memory model's prediction
  (``gnnpipe.tasks.s2ef.cost.predict_layout``: gradients + activations, with κ profiled on ``--profile-repeat``'s
  smaller cell).

Times on a shared CPU are load-dependent (G = 4 puts 4 ranks on 2 cores here): report ``uptime`` with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from ase.build import bulk, fcc111
from ase.calculators.emt import EMT
from fairchem.core.common import gp_utils
from fairchem.core.common.gp_utils import GPMode, GPPartition, GraphParallelConfig
from fairchem.core.common.parallelism.graph_parallel_a2a import compute_a2a_partition
from fairchem.core.common.parallelism.graph_partition import PartitionStrategy
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.data import Batch

from gnnpipe.core.comm import Comm
from gnnpipe.core.run import launch
from gnnpipe.data.atoms import build_graph, from_atoms
from gnnpipe.models import build_model
from gnnpipe.models.atomistic.escn import import_fairchem_state_dict
from gnnpipe.partitioners import plan_graph_parallel
from gnnpipe.tasks.s2ef.cost import AtomJob, AtomLayout, predict_layout, profile_step
from gnnpipe.tasks.s2ef.graph_parallel import GraphParallelComm

sys.path.insert(0, str(Path(__file__).parent))  # the sibling benchmarks below
import bench_graph_parallel as bgp  # noqa: E402
import escn_fairchem_check as check  # noqa: E402

CONFIG = {"lmax": 2, "mmax": 2, "sphere_channels": 32, "hidden_channels": 64, "edge_channels": 32,
          "num_distance_basis": 64, "num_layers": 2, "cutoff": 5.0, "max_neighbors": 30}
#: (library, mode, partition) of each layout with G > 1
LAYOUTS = [("gnnpipe", "allgather", "atom-owner"), ("fairchem", "allgather", "index_split"),
           ("fairchem", "all_to_all", "index_split"), ("fairchem", "all_to_all", "spatial")]


# ---------------------------------------------------------------------------------------------- bytes per collective
class CollectiveBytes(TorchDispatchMode):
    """Bytes this rank sends in the collectives torch dispatches while active (module docstring), and their count."""
    def __init__(self, rank: int, world: int):
        super().__init__()
        self.rank, self.G = rank, world
        self.bytes, self.calls, self.unknown = 0.0, 0, set()

    @staticmethod
    def _tensors(args) -> list:
        out = []
        for a in args:
            if isinstance(a, torch.Tensor):
                out.append(a)
            elif isinstance(a, (list, tuple)):
                out += CollectiveBytes._tensors(a)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        if "c10d" in name and not name.endswith(("wait_tensor", "_wrap_tensor_autograd")):
            self._count(name.split("::")[1], args)
        return func(*args, **kwargs)

    def _count(self, op: str, args) -> None:
        G = self.G
        ts = self._tensors(args)
        if op in ("all_gather_into_tensor", "all_gather_into_tensor_out"):
            b = (G - 1) * ts[0].nbytes
        elif op in ("allgather_", "_allgather_base_"):
            b = (G - 1) * ts[-1].nbytes  # allgather_(outputs [[...]], inputs [x]): the input
        elif op in ("allreduce_", "all_reduce", "all_reduce_"):
            b = sum(2 * (G - 1) * t.nbytes / G for t in ts)
        elif op in ("reduce_scatter_tensor", "_reduce_scatter_base_", "reduce_scatter_"):
            b = (G - 1) * ts[-1].nbytes / G if op == "_reduce_scatter_base_" else (G - 1) * ts[0].nbytes / G
        elif op == "all_to_all_single":
            x, splits = args[0], args[2]  # (input, output_split_sizes, input_split_sizes, group)
            row = x.nbytes / max(x.size(0), 1)
            b = row * (sum(splits) - splits[self.rank]) if splits else x.nbytes * (G - 1) / G
        elif op in ("send", "isend"):
            b = sum(t.nbytes for t in ts)
        elif op in ("recv_", "recv_any_source_", "barrier", "monitored_barrier_"):
            return
        else:
            self.unknown.add(op)
            return
        self.bytes += float(b)
        self.calls += 1


# ---------------------------------------------------------------------------------------------- inputs
def structure(kind: str, repeat: int):
    """The structure (``ase.Atoms`` with EMT energy and forces)."""
    if kind == "cu-bulk":
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True) * (repeat, repeat, repeat)
    else:
        atoms = fcc111("Pt", size=(repeat, repeat, 5), vacuum=8.0, periodic=False)
        atoms.pbc = (True, True, False)
    atoms.rattle(0.05, seed=0)
    atoms.calc = EMT()
    atoms.get_forces()
    return atoms


def _batch_graph(args, repeat: int | None = None, triplets: bool = False):
    """The structure as a batch and its graph (with triplets for gnnpipe's graph-parallel plan, which balances by
    them; the model reads none)."""
    batch = Batch.from_data_list(from_atoms([structure(args.structure, repeat or args.repeat)], dtype=torch.float32))
    return batch, build_graph(batch, CONFIG["cutoff"], CONFIG["max_neighbors"], with_triplets=triplets)


def fairchem_weights(seed: int) -> dict:
    """The weights both libraries run: fairchem's backbone and energy head (conservative forces) from ``seed``,
    every weight perturbed (:mod:`escn_fairchem_check`), as a CPU state dict of fairchem's names."""
    _, _, sd = check._build_fairchem(False, seed, CONFIG, torch.float64)
    return {k: v.detach().clone() for k, v in sd.items()}


def gnnpipe_model(sd: dict, dtype):
    c = CONFIG
    model = build_model("escn-md", 0, 1, num_layers=c["num_layers"], hidden=c["sphere_channels"], lmax=c["lmax"],
                        mmax=c["mmax"], sphere_channels=c["sphere_channels"], hidden_channels=c["hidden_channels"],
                        edge_channels=c["edge_channels"], num_distance_basis=c["num_distance_basis"],
                        cutoff=c["cutoff"], max_neighbors=c["max_neighbors"])
    import_fairchem_state_dict(model, sd)
    return model.to(dtype).train()


# ---------------------------------------------------------------------------------------------- one rank
class _Graph:
    def __init__(self, edge_index, cell_offsets):
        self.edge_index, self.cell_offsets = edge_index, cell_offsets


def run_rank(rank: int, world: int, args: argparse.Namespace, library: str, mode: str, partition: str,
             sd: dict) -> dict:
    """``--warmup`` + ``--steps`` timed training steps of one rank, then one step counting the collectives' bytes;
    the first step's energy and forces; the peak resident set above the floor (meaningful in the memory pass)."""
    torch.manual_seed(0)
    dtype = torch.float32
    batch, graph = _batch_graph(args, triplets=library == "gnnpipe" and world > 1)
    e_ref, f_ref = batch.energy.reshape(-1), batch.forces
    if library == "gnnpipe":
        step, counter = _gnnpipe_step(rank, world, batch, graph, partition, sd, dtype)
    else:
        step, counter = _fairchem_step(rank, world, batch, graph, mode, partition, args, dtype)
    times, cpus, first = [], [], None
    floor = bgp._peak_reset(torch.device("cpu"))
    for k in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        energy, forces, loss = step(e_ref, f_ref)
        loss.backward()
        t, c = time.perf_counter() - t0, time.thread_time() - c0
        if k == 0:
            first = (energy.detach().double().reshape(-1), forces.detach().double())
            peak = bgp._peak(torch.device("cpu")) - floor
        if k >= args.warmup:
            times.append(t)
            cpus.append(c)
    counted = CollectiveBytes(rank, world)
    own = None
    if world > 1 and not args.memory_pass:
        if counter is not None:
            counter.reset()
        with counted:
            _, _, loss = step(e_ref, f_ref)
            loss.backward()
        own = counter.counters()["bytes_gp"] if counter is not None else None
    return {"rank": rank, "times": times, "cpus": cpus, "energy": first[0], "forces": first[1],
            "peak_MiB": peak / 2 ** 20,
            "bytes": counted.bytes, "collectives": counted.calls, "own_bytes": own, "unknown": sorted(counted.unknown),
            "atoms": int(batch.num_nodes), "edges": int(graph.num_edges)}


def _loss(energy, forces, e_ref, f_ref):
    return ((energy.reshape(-1) - e_ref) ** 2).sum() + 100.0 * ((forces - f_ref) ** 2).mean()


def _gnnpipe_step(rank, world, batch, graph, partition, sd, dtype):
    model = gnnpipe_model(sd, dtype)
    params = [p for p in model.parameters()]
    comm, local, counter = None, graph, None
    if world > 1:
        counter = Comm("cpu")
        plan = plan_graph_parallel(graph, world, partition, pos=batch.pos)
        comm = GraphParallelComm(plan, mode="allgather", comm=counter)
        local = comm.local_graph(graph)

    def step(e_ref, f_ref):
        for p in params:
            p.grad = None
        out = model(batch, local, comm, forces=True)
        return out["energy"], out["forces"], _loss(out["energy"], out["forces"], e_ref, f_ref)

    return step, counter


def _fairchem_step(rank, world, batch, graph, mode, partition, args, dtype):
    backbone, heads, _ = check._build_fairchem(False, args.seed, CONFIG, torch.float64)
    backbone, head = backbone.to(dtype).train(), heads["energy"].to(dtype).train()
    params = [*backbone.parameters(), *head.parameters()]
    local = graph
    if world > 1:

        gp_utils.setup_graph_parallel_groups(world, "gloo")
        gp_utils.set_gp_config(GraphParallelConfig(group_size=world, mode=GPMode(mode),
                                                   partition=GPPartition(partition)))
        N = int(batch.num_nodes)
        if mode == "all_to_all":
            owner, _ = compute_a2a_partition(pos=batch.pos, total_atoms=N, device=batch.pos.device, world_size=world,
                                             rank=rank, strategy=PartitionStrategy(partition))
        else:  # fairchem's allgather: contiguous index split
            owner = torch.empty(N, dtype=torch.long)
            for r, part in enumerate(torch.tensor_split(torch.arange(N), world)):
                owner[part] = r
        mine = owner[graph.edge_index[1]] == rank  # the edges whose target this rank owns
        local = _Graph(graph.edge_index[:, mine], graph.cell_offsets[mine])

    def step(e_ref, f_ref):
        for p in params:
            p.grad = None
        data = check._fairchem_data(batch, local, dtype)  # fresh: fairchem's forward rewrites its fields under GP
        out = head(data, backbone(data))
        energy = out["energy"]["energy"] if isinstance(out["energy"], dict) else out["energy"]
        forces = out["forces"]["forces"] if isinstance(out["forces"], dict) else out["forces"]
        return energy, forces, _loss(energy.to(dtype), forces, e_ref, f_ref)

    return step, None


# ---------------------------------------------------------------------------------------------- the runs
def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _spawn(args, library, mode, partition, G, sd, memory: bool = False):
    a = argparse.Namespace(**{**vars(args), "memory_pass": memory, **({"steps": 1, "warmup": 0} if memory else {})})
    if memory:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "16384"
    try:
        if G == 1:  # a fresh process too, alone in its group
            return launch.spawn(_single, 1, (a, library, mode, partition, sd), backend="gloo", timeout_s=600)
        return launch.spawn(run_rank, G, (a, library, mode, partition, sd), backend="gloo", timeout_s=600, threads=1)
    finally:
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)


def _single(rank, world, args, library, mode, partition, sd):
    """The single process (no graph parallelism), in a fresh process like the ranks."""
    return run_rank(0, 1, args, library, mode, partition, sd)


def _layouts(args) -> list[tuple[str, str, str, int]]:
    """``(library, mode, partition, G)`` of every timed layout, the single processes first."""
    out = [(lib, "single process", "-", 1) for lib in ("gnnpipe", "fairchem") if lib in args.libraries]
    for G in args.gp_sizes:
        out += [(lib, mode, part, G) for lib, mode, part in LAYOUTS
                if lib in args.libraries and (lib == "gnnpipe" or mode in args.fairchem_modes)]
    return out


def timing(args, sd) -> list[dict]:
    """Per round every layout in fresh processes, one after the other; per layout the median over rounds of its step
    (the slowest rank's, median over steps) and of its own single process's step over it in the same round."""
    runs: dict[tuple, list[dict]] = {}
    ref = None
    for r in range(args.rounds):
        order = _layouts(args)
        if r % 2:  # every other round the other way round within each G: slow drifts of the load cancel
            order = [lay for G in sorted({x[3] for x in order}) for lay in reversed([x for x in order if x[3] == G])]
        for lay in order:
            library, mode, partition, G = lay
            outs = _spawn(args, library, mode, partition, G, sd)
            if ref is None and library == "gnnpipe" and G == 1:  # the reference energies and forces
                ref = (outs[0]["energy"], outs[0]["forces"])
            if ref is None:  # fairchem alone
                ref = (outs[0]["energy"], outs[0]["forces"])
            runs.setdefault(lay, []).append({
                "step_s": statistics.median(max(o["times"][k] for o in outs) for k in range(len(outs[0]["times"]))),
                "cpu_s": statistics.median(max(o["cpus"][k] for o in outs) for k in range(len(outs[0]["cpus"]))),
                "bytes": max(o["bytes"] for o in outs), "collectives": max(o["collectives"] for o in outs),
                "own": max(o["own_bytes"] for o in outs) if outs[0]["own_bytes"] is not None else None,
                "energy_rel": max(_rel(o["energy"], ref[0]) for o in outs),
                "forces_rel": max(_rel(o["forces"], ref[1]) for o in outs),
                "rank_steps": [statistics.median(o["times"]) for o in outs],
                "unknown": sorted({u for o in outs for u in o["unknown"]}), "atoms": outs[0]["atoms"],
                "edges": outs[0]["edges"]})
            last = runs[lay][-1]
            print(f"  round {r + 1}: {library} {mode} {partition} G={G}: step {last['step_s']:.3f} s", flush=True)
    rows = []
    for (library, mode, partition, G), rs in runs.items():
        single = runs[(library, "single process", "-", 1)]
        # fairchem's all-gather run at the same G in the same round (the single process: fairchem's), if timed
        pair = runs.get(("fairchem", "allgather", "index_split", G) if G > 1
                        else ("fairchem", "single process", "-", 1))
        rows.append({"library": library, "mode": mode, "partition": partition, "G": G,
                     "step_s": statistics.median(x["step_s"] for x in rs),
                     "cpu_s": statistics.median(x["cpu_s"] for x in rs),
                     "speedup": statistics.median(s1["step_s"] / x["step_s"] for s1, x in zip(single, rs)),
                     "vs_fairchem_allgather": (statistics.median(x["step_s"] / f["step_s"] for x, f in zip(rs, pair))
                                               if pair else None),
                     "bytes_MiB": rs[0]["bytes"] / 2 ** 20,
                     "own_MiB": rs[0]["own"] / 2 ** 20 if rs[0]["own"] is not None else None,
                     "collectives": rs[0]["collectives"], "energy_rel": max(x["energy_rel"] for x in rs),
                     "forces_rel": max(x["forces_rel"] for x in rs), "rounds": rs,
                     "unknown_ops": rs[0]["unknown"], "atoms": rs[0]["atoms"], "edges": rs[0]["edges"]})
    print(f"{'library':9} {'mode':15} {'partition':12} {'G':>2} {'step s':>8} {'cpu s':>7} {'x own G=1':>9} "
          f"{'/ fc ag':>8} {'MiB/step':>10} {'own count':>10} {'colls':>6} {'E vs ref':>9} {'F vs ref':>9}")
    for row in rows:
        _print_row(row)
    return rows


def _print_row(r: dict) -> None:
    own = f"{r['own_MiB']:.3f}" if r.get("own_MiB") is not None else "-"
    extra = f"  (uncounted ops: {', '.join(r['unknown_ops'])})" if r.get("unknown_ops") else ""
    pair = f"{r['vs_fairchem_allgather']:.2f}" if r.get("vs_fairchem_allgather") is not None else "-"
    print(f"{r['library']:9} {r['mode']:15} {r['partition']:12} {r['G']:>2} {r['step_s']:>8.3f} {r['cpu_s']:>7.3f} "
          f"{r['speedup']:>9.2f} {pair:>8} {r['bytes_MiB']:>10.3f} {own:>10} {r['collectives']:>6} "
          f"{r['energy_rel']:>9.1e} {r['forces_rel']:>9.1e}{extra}", flush=True)


def memory(args, sd) -> list[dict]:

    torch.set_num_threads(1)
    sample, sample_graph = _batch_graph(args, args.profile_repeat, triplets=True)  # the profile counts them
    model = gnnpipe_model(sd, torch.float32)
    prof = profile_step(model, sample, sample_graph, steps=1, warmup=1, name="escn-md")
    batch, _ = _batch_graph(args)
    job = AtomJob(model, batch.to_data_list(), CONFIG["cutoff"], CONFIG["max_neighbors"], partitioner="atom-owner",
                  mode="allgather", element_size=4)
    print(f"memory model: kappa {prof.kappa:.2f} profiled on {prof.atoms} atoms ({prof.edges} edges)", flush=True)
    rows = []
    for G in [1, *args.gp_sizes]:
        for library, mode, partition in LAYOUTS if G > 1 else [("gnnpipe", "-", "-"), ("fairchem", "-", "-")]:
            if library not in args.libraries or (library == "fairchem" and G > 1 and mode not in args.fairchem_modes):
                continue
            outs = _spawn(args, library, mode, partition, G, sd, memory=True)
            pred = None
            if library == "gnnpipe":
                p = predict_layout(job, AtomLayout(1, G, 1), prof)
                pred = [(m.gradients + m.activations) / 2 ** 20 for m in p.memory]
            row = {"library": library, "mode": mode if G > 1 else "single process", "partition": partition, "G": G,
                   "peak_MiB": [o["peak_MiB"] for o in outs], "predicted_MiB": pred}
            rows.append(row)
            peaks = ", ".join(f"{v:.0f}" for v in row["peak_MiB"])
            preds = ", ".join(f"{v:.0f}" for v in pred) if pred else "-"
            errs = (", ".join(f"{100 * (q / v - 1):+.1f}" for q, v in zip(pred, row["peak_MiB"])) if pred else "-")
            print(f"{library:9} {row['mode']:15} {partition:12} {G:>2}  peak MiB per rank {peaks:28}  "
                  f"predicted {preds:24} error % {errs}", flush=True)
    ones = {r["library"]: max(r["peak_MiB"]) for r in rows if r["G"] == 1}
    for r in rows:
        r["largest_over_single"] = max(r["peak_MiB"]) / ones[r["library"]] if r["library"] in ones else None
    print("largest rank / own single process: " + "; ".join(
        f"{r['library']} {r['mode']} {r['partition']} G={r['G']}: {r['largest_over_single']:.2f}"
        for r in rows if r["G"] > 1 and r["largest_over_single"] is not None))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--structure", choices=["cu-bulk", "pt-slab"], default="cu-bulk")
    p.add_argument("--repeat", type=int, default=3, help="cubic cells per axis (cu-bulk: 4n³ atoms) or the slab's "
                                                         "unit cells per side (pt-slab: 5 layers)")
    p.add_argument("--gp-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--libraries", nargs="+", default=["gnnpipe", "fairchem"], choices=["gnnpipe", "fairchem"])
    p.add_argument("--fairchem-modes", nargs="+", default=["allgather", "all_to_all"],
                   choices=["allgather", "all_to_all"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="every layout once per round (fresh processes); medians")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory", action="store_true", help="also the per-rank peak memory pass and the memory model")
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--profile-repeat", type=int, default=2, help="the memory model's profiled cell (--repeat)")
    p.add_argument("--out", help="write the results as JSON")
    args = p.parse_args(argv)
    args.memory_pass = False
    torch.set_num_threads(1)
    sd = fairchem_weights(args.seed)
    print(f"eSCN-MD {', '.join(f'{k}={v}' for k, v in CONFIG.items())}; float32; {args.structure} x{args.repeat}; "
          f"1 thread per rank; gloo", flush=True)
    result: dict = {"args": vars(args), "config": CONFIG}
    if not args.skip_timing:
        result["timing"] = timing(args, sd)
        print("MiB/step: per rank and step, the largest over the ranks, counted by intercepting every collective "
              "torch dispatches (both libraries alike); own count: gnnpipe's Comm counter (kind gp)")
    if args.memory:
        result["memory"] = memory(args, sd)
    if args.out:
        def plain(x):
            if isinstance(x, torch.Tensor):
                return x.tolist()
            return x
        Path(args.out).write_text(json.dumps(result, indent=1, default=plain))
    return 0


if __name__ == "__main__":
    sys.exit(main())
