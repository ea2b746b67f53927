"""Which ``S × G × D`` layouts train a DimeNet++ (or GemNet-T / GemNet-dT, ``--model``; GemNet-XL's size) of 10⁸ and
10⁹ parameters on 8 and 64 H200 GPUs.

For each parameter count and GPU count, the cost model (:mod:`gnnpipe.tasks.s2ef.cost`) predicts every layout of
the GPUs (``S`` pipeline stages × ``G`` graph-parallel ranks × ``D`` replicas) on the shipped H200 descriptions
(``h200x8``, ``h200x64``: public specifications, assumptions in the TOML files), for a replica batch of
``--batch-size`` OC20-sized structures (65–66 atoms; their neighbour graph at 6 Å, 50 neighbours, with triplets),
and prints the arithmetic of the memory per rank:

* states = 16 B/param × ``P/S`` (fp32 weights, gradients, Adam's two moments), + the gradient all-reduce buffer
  (the S2EF trainer's flat float64 copy, 8 B/param × ``P/S``; ``--no-flat`` leaves it out);
* activations = κ · 4 B · Σ_units (w_E·E_r + w_T·T_r + w_A·N_r) of the rank's stage (``activation_widths``; κ the
  double-backward factor of conservative forces, :data:`~gnnpipe.tasks.s2ef.cost.DEFAULT_KAPPA` unless
  ``--profile-in``);
* a runtime floor of 2 GiB per GPU (CUDA context, NCCL buffers: assumed).

A layout fits when every rank's total is within 131.3 GiB (141 GB). Step times use the TOML's assumed speed factor
against the profiled CPU core (order-of-magnitude; ``--profile-in`` a profile of the same model family taken with
``gnnpipe plan --profile-out``; without one, 1 µs per unit of work is assumed).

Usage::

    python benchmarks/project_atomistic.py                      # the table of docs/guides/atomistic-cost.md
    python benchmarks/project_atomistic.py --params 1e9 --gpus 64 --all
    python benchmarks/project_atomistic.py --model gemnet-dt     # GemNet-XL-sized GemNet-dT (direct forces)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    import attrs
    import torch

    from gnnpipe.costmodel.hardware import load_hardware
    from gnnpipe.tasks.s2ef import cost as A

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=float, nargs="+", default=[1e8, 1e9])
    p.add_argument("--model", default="dimenet++", choices=["dimenet++", "gemnet-t", "gemnet-dt"],
                   help="gemnet-dt: gemnet-t with direct forces (GemNet-XL's setting)")
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    p.add_argument("--batch-size", type=int, default=4, help="OC20-sized structures per replica")
    p.add_argument("--partitioner", default="edge-chunk")
    p.add_argument("--mode", default="halo", choices=["allgather", "halo"])
    p.add_argument("--chunks-per-stage", type=int, nargs="+", default=[1])
    p.add_argument("--profile-in", default=None, help="an atomistic profile JSON (gnnpipe plan --profile-out)")
    p.add_argument("--no-flat", dest="flat", action="store_false", help="no float64 all-reduce buffer")
    p.add_argument("--all", action="store_true", help="print every layout, not only the best ones")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.profile_in:
        prof = A.AtomProfile.from_dict(json.loads(Path(args.profile_in).read_text()))
    else:
        prof = A.AtomProfile(model=args.model if args.model != "gemnet-dt" else "gemnet-t", step_s=1e-6, work=1.0,
                             kappa=A.DEFAULT_KAPPA, peak_bytes=0, grad_bytes=0, kept_bytes=0.0, edges=0, triplets=0,
                             atoms=0, structures=0, element_size=4, step_cpu_s=1e-6)
    structs = A.oc20_sized_structures(args.batch_size, seed=args.seed)
    cache: dict = {}
    first = True
    for P in args.params:
        name, extra = {"gemnet-dt": ("gemnet-t", {"direct_forces": True})}.get(args.model, (args.model, {}))
        model, build = A.size_for_params(name, P, **extra)
        n = A.num_parameters(model)
        job = A.AtomJob(model, structs, 6.0, 50, partitioner=args.partitioner, mode=args.mode, element_size=4,
                        allreduce_element_size=8 if args.flat else 0, backend="nccl")
        batch, graph = A.job_graph(job, cache)
        if first:
            print(f"replica batch: {args.batch_size} OC20-sized structures, {batch.num_nodes} atoms, "
                  f"{graph.num_edges} edges, {graph.num_triplets} triplets (6 Å, 50 neighbours); "
                  f"kappa {prof.kappa:.2f}; {args.partitioner}, {args.mode}")
            first = False
        widths = A.activation_widths(model)
        per_t = sum(w.triplet for w in widths)
        per_e = sum(w.edge for w in widths)
        act1 = prof.kappa * 4 * (per_e * graph.num_edges + per_t * graph.num_triplets
                                 + sum(w.atom for w in widths) * batch.num_nodes)
        shape = ", ".join(f"{k} {v}" for k, v in build.items() if k != "num_layers")
        print(f"\n{args.model} {n / 1e6:.0f}M parameters: {shape}, {build['num_layers']} blocks. States 16 B x P = "
              f"{16 * n / 2**30:.1f} GiB (+ {8 * n / 2**30 if args.flat else 0:.1f} GiB float64 all-reduce buffer); "
              f"activations of one replica batch = kappa x 4 B x ({per_e:.0f} x {graph.num_edges} edges + "
              f"{per_t:.0f} x {graph.num_triplets} triplets + atoms) = {act1 / 2**30:.1f} GiB")
        for gpus in args.gpus:
            hw = load_hardware(f"h200x{gpus}" if gpus in (8, 64) else "h200x64")
            hw = attrs.evolve(hw, nodes=max(1, gpus // 8))
            preds = A.plan_atomistic(job, gpus, prof, hw, chunks_per_stage=args.chunks_per_stage,
                                     schedulers=("gpipe",))
            fit = [q for q in preds if q.fits]
            print(f"  {gpus} H200 ({hw.name}): {len(fit)} of {len(preds)} layouts fit; fitting: "
                  f"{', '.join(sorted({f'S{q.layout.stages}xG{q.layout.gp}xD{q.layout.replicas}' for q in fit})) or 'none'}")  # noqa: E501  (one f-string field)
            show = preds if args.all else (fit[:3] + [q for q in preds if not q.fits][:2])
            print("  " + A.format_atom_ranking(show).replace("\n", "\n  "))
    torch.set_num_threads(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
