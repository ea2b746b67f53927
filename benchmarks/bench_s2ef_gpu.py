"""S2EF training on one GPU: the figures of docs/RESULTS.md's "On a GPU", one JSON line per measurement.

    python benchmarks/bench_s2ef_gpu.py --device cuda --json gpu.json      # on a GPU machine (~4 minutes)
    python benchmarks/bench_s2ef_gpu.py --device cpu --quick                # the same code, tiny sizes (~3 minutes)

Parts (``--parts``, comma-separated; each stops starting new work past its ``--part-s`` seconds, ``largest`` past
``--largest-s``, half for each model):

``pyg``
    One training step of our ``dimenet++`` against PyG's ``DimeNetPlusPlus`` on the same device, weights and batch
    (the step, weight mapping and batch of ``bench_dimenet_vs_pyg.py``: energies, conservative forces by
    ``create_graph``, ``MSE(E) + 100·MSE(F)``, ``backward()``; fairchem's OC20 sizes, hidden 128, 4 blocks,
    cutoff 6 Å), in float32 (TF32 off) and in bfloat16 autocast (``--amp``): median seconds per step, the ratio
    ours / PyG (≤ 1.0: ours is not slower). Steps alternate between the two sides.
``steps``
    Steps per second of the S2EF trainer (``S2EFTrainer.train_epoch``, the loader included) for GemNet-dT (GemNet-T
    with direct forces) and DimeNet++ at the S2EF defaults (hidden 64, 4 Å, 12 neighbours, batch 16, generated
    OC20-like frames), and GemNet-dT at fairchem's widths (hidden 512, 6 Å, 50 neighbours) on OC20-sized slabs; with
    each, the loader's wait per step (``trainer.data_wait_s``) as a fraction of the step.
``largest``
    The largest batch of 65-atom OC20-sized slabs whose training step (forward, forces, backward, AdamW step) runs
    on the device in one process, found by doubling then bisecting, against the largest the memory model predicts
    fits (``layout_memory`` of a one-process layout, its profile taken on the device, the GPU runtime floor
    included, against the free memory, as ``gnnpipe train`` checks). On the CPU (``--quick``) the "device" is
    ``--cpu-capacity-mib`` of allocated bytes (measured by ``PeakMeter``), with no floor.
``graph``
    The neighbour graph of one periodic Cu crystal of 32 to 6912 atoms built on the CPU (a loader worker's build) and
    on the device (``method="device"``), to place ``gnnpipe.tasks.s2ef.data.DEVICE_GRAPH_ATOMS``.
``memory``
    The memory model's per-rank peak against each rank's measured peak (``max_memory_allocated`` on a GPU; the
    peak resident size of spawned ranks on the CPU) for one process (GPU only), ``--gp-size 2`` and ``--stages 2``.

Absolute times hold only for the device named in each line.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dimenet_vs_pyg import clusters, make_steps, patch_pyg  # noqa: E402

from gnnpipe import api  # noqa: E402
from gnnpipe.core.settings.config import TrainConfig  # noqa: E402
from gnnpipe.data.atoms import build_graph  # noqa: E402
from gnnpipe.tasks.s2ef import S2EF  # noqa: E402
from gnnpipe.tasks.s2ef import cost as A  # noqa: E402
from gnnpipe.tasks.s2ef.build import make_model  # noqa: E402
from gnnpipe.tasks.s2ef.cost.profile import _train_step as train_step  # noqa: E402
from gnnpipe.tasks.s2ef.data import move_to  # noqa: E402
from gnnpipe.tasks.s2ef.trainer import S2EFTrainer  # noqa: E402

#: fairchem's OC20 DimeNet++ (PyG's argument names) and a tiny one for --quick
DPP = {"hidden_channels": 128, "num_blocks": 4, "int_emb_size": 64, "basis_emb_size": 8, "out_emb_channels": 256,
       "num_spherical": 7, "num_radial": 6}
DPP_QUICK = {"hidden_channels": 16, "num_blocks": 1, "int_emb_size": 8, "basis_emb_size": 4, "out_emb_channels": 16,
             "num_spherical": 3, "num_radial": 3}
#: the same tiny DimeNet++ as gnnpipe model arguments
DPP_QUICK_ARGS = {k: v for k, v in DPP_QUICK.items() if k not in ("hidden_channels", "num_blocks")}
ROWS: list[dict] = []
#: where :func:`emit` rewrites every line so far (``--json``): a run cut short keeps what it measured
JSON_PATH: list[Path] = []


def emit(row: dict) -> None:
    ROWS.append(row)
    print(json.dumps(row), flush=True)
    for path in JSON_PATH:
        path.write_text(json.dumps(ROWS, indent=1))


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def release(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- ours vs PyG
def pyg_part(dev: torch.device, args) -> None:
    import torch_geometric.nn.models.dimenet as pd

    from gnnpipe.models import build_model

    sizes = DPP_QUICK if args.quick else DPP
    structures, atoms = (2, 8) if args.quick else (args.structures, args.atoms)
    batch = clusters(structures, atoms, 0, torch.float32)
    graph = build_graph(batch, 6.0, 50)
    batch, graph = move_to(batch, dev, non_blocking=False), move_to(graph, dev, non_blocking=False)
    patch_pyg(graph)
    g = torch.Generator().manual_seed(1)
    e_ref = torch.randn(structures, generator=g).to(dev)
    f_ref = torch.randn(int(batch.num_nodes), 3, generator=g).to(dev)
    torch.manual_seed(0)
    theirs = pd.DimeNetPlusPlus(out_channels=1, cutoff=6.0, output_initializer="glorot_orthogonal", **sizes)
    ours = build_model("dimenet++", 0, 1, hidden=sizes["hidden_channels"], num_layers=sizes["num_blocks"],
                       output_initializer="glorot_orthogonal", cutoff=6.0,
                       **{k: v for k, v in sizes.items() if k not in ("hidden_channels", "num_blocks")})
    ours.load_pyg_state_dict(theirs.state_dict())
    theirs, ours = theirs.to(dev).train(), ours.to(dev).train()
    pyg_step, our_step = make_steps(theirs, ours, batch, graph, e_ref, f_ref)
    repeats = 3 if args.quick else args.repeats
    for amp in (False, True):
        def run(step, amp=amp):
            with torch.autocast(dev.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
                return step()

        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on both sides
        (e1, l1), (e2, l2) = run(pyg_step), run(our_step)
        times: dict = {"pyg": [], "ours": []}
        for r in range(1 + repeats):
            order = (("pyg", pyg_step), ("ours", our_step)) if r % 2 == 0 else (("ours", our_step), ("pyg", pyg_step))
            for side, step in order:
                sync(dev)
                t = time.perf_counter()
                run(step)
                sync(dev)
                if r:
                    times[side].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        emit({"part": "pyg", "device": device_name(dev), "precision": "amp-bf16" if amp else "float32",
              "structures": structures, "atoms": int(batch.num_nodes), "edges": int(graph.num_edges),
              "triplets": int(graph.num_triplets), "pyg_median_s": round(med["pyg"], 5),
              "ours_median_s": round(med["ours"], 5), "ratio_ours_over_pyg": round(med["ours"] / med["pyg"], 3),
              "max_energy_difference": float((e1.float() - e2.float()).abs().max()), "loss_pyg": l1,
              "loss_ours": l2})
    del theirs, ours, batch, graph
    release(dev)


# ---------------------------------------------------------------------------------------------- trainer steps
def trainer_rate(dev: torch.device, label: str, args, data=None, **kw) -> None:
    """Two epochs of the S2EF trainer (the first warms up); the second's seconds per step and data wait."""
    task = S2EF()
    cfg = task.resolve(TrainConfig(task="s2ef", device=str(dev), seed=0, **kw))
    d = task.load(cfg, data)
    tr = S2EFTrainer(cfg, d.structures, d.splits, d.normalizer)
    tr.train_epoch(0)
    tr.data_wait_s = 0.0
    sync(dev)
    t0 = time.perf_counter()
    rec = tr.train_epoch(1)
    sync(dev)
    dt = time.perf_counter() - t0
    steps = tr.steps_per_epoch
    emit({"part": "steps", "device": device_name(dev), "run": label, "model": cfg.model,
          "direct_forces": bool(cfg.direct_forces), "hidden": cfg.hidden, "layers": cfg.layers, "cutoff": cfg.cutoff,
          "max_neighbors": cfg.max_neighbors, "batch_size": cfg.batch_size, "amp": bool(cfg.amp),
          "loader_workers": tr.num_workers(), "steps": steps, "step_s": round(dt / steps, 5),
          "steps_per_s": round(steps / dt, 3), "structures_per_s": round(steps * cfg.batch_size / dt, 2),
          "data_wait_per_step_s": round(tr.data_wait_s / steps, 6),
          "data_wait_fraction": round(tr.data_wait_s / dt, 4), "loss": rec["loss"]})
    del tr
    release(dev)


def steps_part(dev: torch.device, args) -> None:
    frames = 24 if args.quick else 200
    tiny = dict(hidden=8, layers=1, model_args={"emb_size_trip": 4, "emb_size_rbf": 3, "emb_size_cbf": 3,
                                                "emb_size_bil_trip": 5, "num_spherical": 3, "num_radial": 4})
    trainer_rate(dev, "gemnet-dT, S2EF defaults", args, model="gemnet-t", direct_forces=True, dataset="oc20-like",
                 frames=frames, **(tiny if args.quick else {}))
    if args.deadline():
        return
    trainer_rate(dev, "dimenet++, S2EF defaults", args, model="dimenet++", dataset="oc20-like", frames=frames,
                 **({"hidden": 8, "layers": 1, "model_args": DPP_QUICK_ARGS} if args.quick else {}))
    if args.deadline() or args.quick:
        return
    slabs = A.oc20_sized_structures(80, seed=0)
    trainer_rate(dev, "gemnet-dT, fairchem widths, OC20-sized slabs", args, data=slabs, model="gemnet-t",
                 direct_forces=True, hidden=512, cutoff=6.0, max_neighbors=50, batch_size=8)
    if not args.deadline():
        trainer_rate(dev, "gemnet-dT, fairchem widths, OC20-sized slabs, --amp", args, data=slabs, model="gemnet-t",
                     direct_forces=True, hidden=512, cutoff=6.0, max_neighbors=50, batch_size=8, amp=True)


# ---------------------------------------------------------------------------------------------- the largest
def largest_part(dev: torch.device, args) -> None:
    end = time.perf_counter() + args.largest_s
    for i, (model, extra) in enumerate((("gemnet-t", {"direct_forces": True}), ("dimenet++", {}))):
        if args.deadline():
            return
        share = time.perf_counter() + (end - time.perf_counter()) / (2 - i)  # the part's time, half each
        kw = dict(hidden=8, layers=1, model_args=DPP_QUICK_ARGS if model == "dimenet++" else {}) if args.quick else {}
        cfg = S2EF().resolve(TrainConfig(task="s2ef", model=model, cutoff=6.0, max_neighbors=50, **extra, **kw))
        largest_one(dev, cfg, args, lambda share=share: time.perf_counter() > share)


def largest_one(dev: torch.device, cfg, args, deadline) -> None:
    """The largest batch of OC20-sized slabs that trains, and the largest the memory model predicts fits. The
    prediction is exact at 2 and 4 slabs (their graphs built on the CPU) and linear in the batch between and beyond
    (the slabs are alike: 65–66 atoms each), so that it costs no graph of hundreds of slabs."""
    gpu = dev.type == "cuda"
    release(dev)
    capacity = int(torch.cuda.mem_get_info(dev)[0]) if gpu else args.cpu_capacity_mib << 20
    floor = A.GPU_FLOOR_BYTES if gpu else 0
    distinct = A.oc20_sized_structures(16 if args.quick else 64, seed=0)
    pool = [distinct[i % len(distinct)] for i in range(64 if args.quick else 4096)]
    model = make_model(cfg)
    jobs = {n: A.AtomJob(model, pool[:n], cfg.cutoff, cfg.max_neighbors, ema=bool(cfg.ema_decay)) for n in (2, 4)}
    b, g = A.job_graph(jobs[2])
    prof = A.profile_step(model, b, g, steps=1, warmup=1, name=cfg.model, device=dev)
    at = {n: A.layout_memory(job, A.AtomLayout(1, 1, 1), prof, floor_bytes=floor)[0] for n, job in jobs.items()}
    slope = (at[4] - at[2]) / 2

    def predicted(n: int) -> int:
        return int(at[2] + slope * (n - 2))

    def trains(n: int) -> tuple[bool, int]:
        from torch_geometric.data import Batch

        release(dev)
        m = make_model(cfg).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        reverse = bool(getattr(m, "uses_reverse_edges", False))
        try:
            with A.PeakMeter(dev) as meter:
                batch = move_to(Batch.from_data_list(pool[:n]), dev, non_blocking=False)
                graph = build_graph(batch, cfg.cutoff, cfg.max_neighbors, with_reverse=reverse,
                                    method="device" if gpu else "auto")
                train_step(m, batch, graph)
                opt.step()
                del batch, graph
            peak = meter.peak if gpu else meter.peak - meter.base
            return peak <= capacity, peak
        except torch.cuda.OutOfMemoryError:
            return False, -1
        finally:
            del m, opt
            release(dev)

    def search(ok, hi_cap: int) -> tuple[int, bool]:
        """The largest n in [1, hi_cap] with ok(n), by doubling from 1 then bisecting; (n, capped)."""
        lo, hi, n = 0, None, 1
        while n <= hi_cap and not deadline():
            if ok(n):
                lo, n = n, 2 * n
            else:
                hi = n
                break
        if hi is None:
            return lo, True
        while hi - lo > max(1, lo // 16) and not deadline():
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo, False

    peaks: dict = {}

    def ok_measured(n: int) -> bool:
        fits, peak = trains(n)
        peaks[n] = peak
        return fits

    n_pred, pred_capped = search(lambda n: predicted(n) <= capacity, len(pool))
    n_meas, meas_capped = search(ok_measured, len(pool))  # capped: the pool or the time ran out first
    emit({"part": "largest", "device": device_name(dev), "model": cfg.model,
          "direct_forces": bool(cfg.direct_forces), "hidden": cfg.hidden, "layers": cfg.layers,
          "cutoff": cfg.cutoff, "max_neighbors": cfg.max_neighbors, "atoms_per_structure": int(pool[0].num_nodes),
          "capacity_bytes": capacity, "floor_bytes": floor,
          "largest_batch_trained": n_meas, "trained_search_capped": meas_capped,
          "largest_batch_predicted": n_pred, "predicted_search_capped": pred_capped,
          "predicted_bytes_at_2": at[2], "predicted_bytes_at_4": at[4],
          "predicted_bytes_at_trained": predicted(n_meas) if n_meas else None,
          "measured_bytes_at_trained": peaks.get(n_meas),
          "ratio_predicted_over_trained": round(n_pred / n_meas, 3) if n_meas else None})


# ---------------------------------------------------------------------------------------------- memory model
def memory_part(dev: torch.device, args) -> None:
    gpu = dev.type == "cuda"
    batch = 8 if gpu and not args.quick else 2
    margs = (dict(int_emb_size=64, basis_emb_size=8, out_emb_channels=256, num_spherical=7, num_radial=6)
             if not args.quick else dict(int_emb_size=8, basis_emb_size=4, out_emb_channels=16, num_spherical=3,
                                         num_radial=3))
    data = A.oc20_sized_structures(3 * batch, seed=0)
    kw = dict(model="dimenet++", layers=2 if args.quick else 3, hidden=16 if args.quick else 128, cutoff=6.0,
              max_neighbors=50, batch_size=batch, epochs=1, dtype="float32", model_args=margs, ema_decay=0.999,
              dropout=0.0, tf32=False, seed=0)
    for S, G in ((1, 1), (1, 2), (2, 1)):
        if args.deadline() or (S * G == 1 and not gpu):  # the CPU's single process: the peak resident size is ours
            continue
        layout = dict(stages=S, graph_parallel_group_size=G, chunks=2 if S > 1 else None)
        cfg = S2EF().resolve(TrainConfig(device=str(dev), **kw, **layout))
        job = A.AtomJob(make_model(cfg), data[:batch], cfg.cutoff, cfg.max_neighbors, ema=True)
        b, g = A.job_graph(job)
        prof = A.profile_step(job.model, b, g, steps=1, warmup=1, name=cfg.model, device=dev)
        predicted = A.layout_memory(job, A.AtomLayout(S, G, 1, chunks=cfg.chunks or 1, scheduler=cfg.scheduler),
                                    prof, floor_bytes=0 if gpu else None)
        del b, g, job
        release(dev)
        if gpu:
            torch.cuda.reset_peak_memory_stats(dev)
        base = int(torch.cuda.memory_allocated(dev)) if gpu and S * G == 1 else 0
        res = api.train(data=data, log_every=0, progress=False, memory_check=False, **kw, **layout)
        measured = [m - base for m in res.extra["peak_mem_bytes"]]
        errors = [p / m - 1 for p, m in zip(predicted, measured)]
        emit({"part": "memory", "device": device_name(dev), "layout": f"S{S} G{G}", "predicted_bytes": predicted,
              "measured_bytes": measured, "errors": [round(e, 4) for e in errors],
              "within_15_percent": all(abs(e) <= 0.15 for e in errors)})
        release(dev)


def graph_part(dev: torch.device, args) -> None:
    """The neighbour graph (cutoff 6 Å, 50 neighbours, triplets) of one periodic Cu crystal of ``n`` atoms, built on
    the CPU (a loader worker's build) and on ``dev`` (``method="device"``): median seconds of 3, the edges equal."""
    from ase.build import bulk
    from torch_geometric.data import Batch, Data

    for cells in ((1, 2) if args.quick else (2, 3, 4, 6, 8, 12)):
        if args.deadline():
            return
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((cells, cells, cells))
        atoms.rattle(0.05, seed=0)
        d = Data(z=torch.as_tensor(atoms.numbers), pos=torch.as_tensor(atoms.positions, dtype=torch.float32),
                 cell=torch.as_tensor(atoms.cell.array, dtype=torch.float32).reshape(1, 3, 3),
                 pbc=torch.ones(1, 3, dtype=torch.bool), natoms=torch.tensor([len(atoms)]))
        cpu_batch = Batch.from_data_list([d])
        dev_batch = move_to(cpu_batch, dev, non_blocking=False)
        times: dict = {"cpu": [], "device": []}
        graphs = {}
        for _ in range(4):
            for side, batch, method in (("cpu", cpu_batch, "auto"), ("device", dev_batch, "device")):
                sync(dev)
                t = time.perf_counter()
                graphs[side] = build_graph(batch, 6.0, 50, method=method)
                sync(dev)
                times[side].append(time.perf_counter() - t)
        same = torch.equal(graphs["cpu"].edge_index, graphs["device"].edge_index.cpu())
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        emit({"part": "graph", "device": device_name(dev), "atoms": len(atoms), "edges": int(graphs["cpu"].num_edges),
              "triplets": int(graphs["cpu"].num_triplets), "cpu_s": round(med["cpu"], 5),
              "device_s": round(med["device"], 5), "device_over_cpu": round(med["device"] / med["cpu"], 3),
              "same_edges": same})
        release(dev)


PARTS = {"pyg": pyg_part, "steps": steps_part, "memory": memory_part, "graph": graph_part,
         "largest": largest_part}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda or cpu (default: cuda)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every part (CPU: ~3 minutes)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--part-s", type=float, default=90.0, help="seconds after which a part starts no new work")
    ap.add_argument("--largest-s", type=float, default=120.0, help="--part-s of the largest part (default: 120)")
    ap.add_argument("--structures", type=int, default=8, help="pyg: structures per batch (default: 8)")
    ap.add_argument("--atoms", type=int, default=24, help="pyg: atoms per structure (default: 24)")
    ap.add_argument("--repeats", type=int, default=10, help="pyg: timed steps per side (default: 10)")
    ap.add_argument("--cpu-capacity-mib", type=int, default=384, help="largest, on the CPU: the memory (default: 384)")
    ap.add_argument("--json", default=None, help="also write every line here, as a JSON list")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA GPU here; use --device cpu", file=sys.stderr)
            return 2
        dev = torch.device("cuda", torch.cuda.current_device())
    if args.json:
        JSON_PATH.append(Path(args.json))
    torch.manual_seed(0)
    for name in args.parts.split(","):
        if name not in PARTS:
            ap.error(f"unknown part {name!r}; the parts are {', '.join(PARTS)}")
        end = time.perf_counter() + (args.largest_s if name == "largest" else args.part_s)
        args.deadline = lambda end=end: time.perf_counter() > end
        t0 = time.perf_counter()
        PARTS[name](dev, args)
        print(f"# part {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
