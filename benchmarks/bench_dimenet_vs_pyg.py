"""One S2EF training step of our ``dimenet++`` and ``schnet`` against PyG's ``DimeNetPlusPlus`` and ``SchNet``
driven the plain way, on the same batch and weights (issue 28, item 4).

    python benchmarks/bench_dimenet_vs_pyg.py [--structures 8] [--atoms 24] [--repeats 7] [--threads 1]

A step: energies, conservative forces ``−∂E/∂pos`` with ``create_graph=True``, the loss
``MSE(E) + 100·MSE(F)``, ``backward()`` (the second backward through the forces). PyG's model runs its own
``forward(z, pos, batch)`` with its graph functions (``radius_graph``, DimeNet's ``triplets``) returning the
precomputed gnnpipe graph, so neither side pays for neighbour search; ours runs ``model(batch, graph,
forces=True)`` with the default ``LocalComm``. Sizes are fairchem's OC20 defaults (DimeNet++: hidden 128, 4 blocks,
int_emb 64, basis_emb 8, out_emb 256, 7 spherical, 6 radial, cutoff 6 Å; SchNet: hidden 128, 128 filters,
6 interactions, 50 Gaussians, cutoff 6 Å). The structures are random clusters (atoms at least 1 Å apart in a cube
sized to about 0.08 atoms/Å³). Steps of the two models alternate, so load on the machine hits both alike; the
median wall times, their ratio (ours / PyG: ≤ 1.0 means ours is not slower), the median process CPU times and
their ratio (less sensitive to other processes on a loaded machine when ``--threads 1``) and structures per second
are printed, one JSON line per model. Not a test: numbers go to docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def clusters(num: int, atoms: int, seed: int, dtype):
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(seed)
    side = (atoms / 0.08) ** (1 / 3)
    data = []
    for _ in range(num):
        pts = []
        while len(pts) < atoms:
            p = torch.rand(3, generator=g, dtype=torch.float64) * side
            if all(float((p - q).norm()) > 1.0 for q in pts):
                pts.append(p)
        z = torch.tensor([1, 6, 7, 8, 29])[torch.randint(0, 5, (atoms,), generator=g)]
        data.append(Data(z=z, pos=torch.stack(pts).to(dtype), cell=torch.zeros(1, 3, 3, dtype=dtype),
                         pbc=torch.zeros(1, 3, dtype=torch.bool), natoms=torch.tensor([atoms])))
    return Batch.from_data_list(data)


def patch_pyg(graph) -> None:
    import torch_geometric.nn.models.dimenet as pd
    import torch_geometric.nn.models.schnet as ps

    from gnnpipe.models.atomistic.dimenet import CachedSphericalBasis

    j, i = graph.edge_index
    kj, ji = graph.idx_kj, graph.idx_ji
    trip = (i, j, i[ji], j[ji], j[kj], kj, ji)
    pd.radius_graph = lambda pos, r, batch=None, max_num_neighbors=32, **kw: graph.edge_index
    ps.radius_graph = pd.radius_graph
    pd.triplets = lambda edge_index, num_nodes: trip
    pd.SphericalBasisLayer = CachedSphericalBasis  # the same sympy functions, derived once


def build(name: str, dtype):
    import torch_geometric.nn.models.dimenet as pd
    import torch_geometric.nn.models.schnet as ps

    from gnnpipe.models import build_model

    torch.manual_seed(0)
    if name == "dimenet++":
        theirs = pd.DimeNetPlusPlus(hidden_channels=128, out_channels=1, num_blocks=4, int_emb_size=64,
                                    basis_emb_size=8, out_emb_channels=256, num_spherical=7, num_radial=6,
                                    cutoff=6.0, output_initializer="glorot_orthogonal")
        ours = build_model("dimenet++", 0, 1, output_initializer="glorot_orthogonal")
    else:
        theirs = ps.SchNet(hidden_channels=128, num_filters=128, num_interactions=6, num_gaussians=50, cutoff=6.0)
        ours = build_model("schnet", 0, 1)
    ours.load_pyg_state_dict(theirs.state_dict())
    return theirs.to(dtype).train(), ours.to(dtype).train()


def make_steps(theirs, ours, batch, graph, e_ref, f_ref):
    def loss_of(energy, forces):
        return torch.nn.functional.mse_loss(energy, e_ref) + 100.0 * torch.nn.functional.mse_loss(forces, f_ref)

    def pyg_step():
        theirs.zero_grad(set_to_none=True)
        pos = batch.pos.detach().requires_grad_(True)
        energy = theirs(batch.z, pos, batch.batch).squeeze(-1)
        (g,) = torch.autograd.grad(energy.sum(), pos, create_graph=True)
        loss = loss_of(energy, -g)
        loss.backward()
        return energy.detach(), float(loss.detach())

    def our_step():
        ours.zero_grad(set_to_none=True)
        out = ours(batch, graph, forces=True)
        loss = loss_of(out["energy"], out["forces"])
        loss.backward()
        return out["energy"].detach(), float(loss.detach())

    return pyg_step, our_step


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--structures", type=int, default=8)
    p.add_argument("--atoms", type=int, default=24, help="atoms per structure")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--models", default="dimenet++,schnet")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args()

    from gnnpipe.data.atoms import build_graph

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    batch = clusters(args.structures, args.atoms, 0, dtype)
    graph = build_graph(batch, 6.0, 50)
    patch_pyg(graph)
    g = torch.Generator().manual_seed(1)
    e_ref = torch.randn(args.structures, generator=g).to(dtype)
    f_ref = torch.randn(batch.num_nodes, 3, generator=g).to(dtype)
    rows = []
    for name in args.models.split(","):
        theirs, ours = build(name, dtype)
        pyg_step, our_step = make_steps(theirs, ours, batch, graph, e_ref, f_ref)
        (e1, l1), (e2, l2) = pyg_step(), our_step()
        diff = float((e1 - e2).abs().max())
        times = {"pyg": [], "ours": []}
        cpu = {"pyg": [], "ours": []}
        for r in range(args.warmup + args.repeats):
            for side, step in (("pyg", pyg_step), ("ours", our_step)) if r % 2 == 0 else \
                    (("ours", our_step), ("pyg", pyg_step)):
                t, c = time.perf_counter(), time.process_time()
                step()
                if r >= args.warmup:
                    times[side].append(time.perf_counter() - t)
                    cpu[side].append(time.process_time() - c)
        med = {k: statistics.median(v) for k, v in times.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        row = {"model": name, "structures": args.structures, "atoms": batch.num_nodes, "edges": graph.num_edges,
               "triplets": graph.num_triplets, "dtype": args.dtype, "threads": args.threads,
               "pyg_median_s": round(med["pyg"], 4), "ours_median_s": round(med["ours"], 4),
               "ratio_ours_over_pyg": round(med["ours"] / med["pyg"], 3),
               "pyg_median_cpu_s": round(med_cpu["pyg"], 4), "ours_median_cpu_s": round(med_cpu["ours"], 4),
               "cpu_ratio_ours_over_pyg": round(med_cpu["ours"] / med_cpu["pyg"], 3),
               "pyg_min_s": round(min(times["pyg"]), 4), "ours_min_s": round(min(times["ours"]), 4),
               "min_ratio_ours_over_pyg": round(min(times["ours"]) / min(times["pyg"]), 3),
               "pyg_structures_per_s": round(args.structures / med["pyg"], 2),
               "ours_structures_per_s": round(args.structures / med["ours"], 2),
               "max_energy_difference": diff, "loss_pyg": l1, "loss_ours": l2,
               "pyg_times_s": [round(t, 4) for t in times["pyg"]], "ours_times_s": [round(t, 4) for t in times["ours"]]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
