"""The S2EF pipeline (issue #30): per-rank parameter memory, the bubble against the schedule simulator, step time.

Three measurements, each on gloo ranks of this machine (CPU, one torch thread per rank):

1. **Parameter memory per rank** — bytes of weights + gradients + AdamW moments (and step counters) each rank
   holds after one training step of a deep DimeNet++ (``--blocks`` interaction blocks), ``--mem-stages`` stages
   against the single process.
2. **Bubble** — one gpipe run with ``--stages`` stages and ``--chunks`` micro-batches (one structure each, direct
   forces): each rank's idle share (seconds blocked in receives / seconds running the step's schedule) against the
   discrete-event simulator's bubble for the same schedule with the measured mean duration of each stage's ``F``,
   ``B`` and ``STEP``.
3. **Step time** — the same pipeline's step against the single process (1 thread, and 2 threads) on the same batch.

    python benchmarks/bench_atomistic_pipeline.py                      # defaults below
    python benchmarks/bench_atomistic_pipeline.py --blocks 12 --mem-stages 4 --chunks 16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _config(args, **kw):
    from gnnpipe.core.settings.config import TrainConfig

    base = dict(task="s2ef", model="dimenet++", layers=args.layers, hidden=args.hidden, dtype="float32",
                dropout=0.0, lr=1e-3, epochs=1, batch_size=args.chunks, ema_decay=0.0, warmup_steps=0,
                lr_schedule="constant", clip_grad_norm=None, cutoff=args.cutoff, max_neighbors=args.max_neighbors,
                direct_forces=True, frames=args.chunks + 8, dataset=args.dataset, threads=1,
                model_args={"int_emb_size": 32, "basis_emb_size": 8, "out_emb_channels": 64, "num_spherical": 7,
                            "num_radial": 6})
    base.update(kw)
    from gnnpipe.tasks.s2ef import S2EF

    return S2EF().resolve(TrainConfig(**base))


def _data(cfg):
    from gnnpipe.tasks.s2ef import S2EF

    d = S2EF().load(cfg)
    return d.structures, d.splits, d.normalizer


def _state_bytes(tr) -> int:
    """Bytes of the parameters a trainer optimises, their gradients and the optimizer's state tensors."""
    n = 0
    for p in tr.params:
        n += p.numel() * p.element_size()
        if p.grad is not None:
            n += p.grad.numel() * p.grad.element_size()
        for v in tr.optimizer.state.get(p, {}).values():
            if torch.is_tensor(v):
                n += v.numel() * v.element_size()
    return n


def _fixed_batches(module, batch):
    module.epoch_batches = lambda n, gb, seed, epoch: [torch.as_tensor(batch)]


def _rank_memory(rank, world, cfg):
    from gnnpipe.tasks.s2ef import pipeline as P

    torch.set_num_threads(1)
    structures, splits, norm = _data(cfg)
    tr = P.PipelineS2EFTrainer(cfg, structures, splits, norm, rank=rank, world=world)
    _fixed_batches(P, list(range(cfg.batch_size)))
    tr.train_step(0)
    return {"bytes": _state_bytes(tr), "bounds": tr.bounds, "params": sum(p.numel() for p in tr.params)}


def _rank_timing(rank, world, cfg, steps):
    """``steps`` training steps of the pipeline on one fixed batch; per step: wall, idle (receive waits), and the
    mean duration of each action kind on this rank."""
    from gnnpipe.tasks.s2ef import pipeline as P

    torch.set_num_threads(1)
    structures, splits, norm = _data(cfg)
    tr = P.PipelineS2EFTrainer(cfg, structures, splits, norm, rank=rank, world=world)
    st = tr.pipe_stage
    spans: dict[str, list[float]] = {"F": [], "B": [], "STEP": []}

    def timed(kind, fn):
        def run(*a):
            t0 = time.perf_counter()
            out = fn(*a)
            spans[kind].append(time.perf_counter() - t0)
            return out
        return run

    st.forward_chunk = timed("F", st.forward_chunk)
    st.backward_chunk = timed("B", st.backward_chunk)
    st.step = timed("STEP", st.step)
    sched = {"s": 0.0}
    run_schedule = tr.executor.train_epoch

    def timed_schedule(*a):
        t0 = time.perf_counter()
        out = run_schedule(*a)
        sched["s"] += time.perf_counter() - t0
        return out

    tr.executor.train_epoch = timed_schedule
    _fixed_batches(P, list(range(cfg.batch_size)))
    out = []
    for i in range(steps):
        for v in spans.values():
            v.clear()
        tr.comm.reset()
        sched["s"] = 0.0
        torch.distributed.barrier()
        t0 = time.perf_counter()
        rec = tr.train_step(i)
        wall = time.perf_counter() - t0
        out.append({"wall": wall, "idle": tr.comm.idle_s, "schedule": sched["s"], "cpu": rec["cpu_s"][rank], "bytes_layer": rec["bytes_layer"],
                    "mean": {k: statistics.fmean(v) if v else 0.0 for k, v in spans.items()}})
    return out


def _single_step(cfg, steps, threads):
    from gnnpipe.tasks.s2ef import trainer as T

    torch.set_num_threads(threads)
    structures, splits, norm = _data(cfg)
    tr = T.S2EFTrainer(cfg, structures, splits, norm)
    _fixed_batches(T, list(range(cfg.batch_size)))
    walls, cpus = [], []
    for i in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        tr.train_step(i)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    return tr, walls, cpus


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=12, help="interaction blocks of the memory model (>= 12)")
    ap.add_argument("--mem-hidden", type=int, default=128, help="hidden width of the memory model")
    ap.add_argument("--mem-stages", type=int, default=4, help="stages of the memory measurement")
    ap.add_argument("--layers", type=int, default=4, help="interaction blocks of the timing model")
    ap.add_argument("--hidden", type=int, default=128, help="hidden width of the timing model")
    ap.add_argument("--stages", type=int, default=2, help="stages of the timing runs")
    ap.add_argument("--chunks", type=int, default=16, help="micro-batches (= structures) per step")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (the first is a warm-up)")
    ap.add_argument("--dataset", default="oc20-like", help="generated structures of the timing runs")
    ap.add_argument("--cutoff", type=float, default=6.0)
    ap.add_argument("--max-neighbors", type=int, default=30)
    ap.add_argument("--skip-memory", action="store_true", help="only the bubble and step-time measurements")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args(argv)


    res: dict = {"args": vars(args)}
    # 1. parameter memory
    if not args.skip_memory:
        _memory(args, res)
    _timing(args, res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


def _memory(args, res: dict) -> None:
    from gnnpipe.core.run.launch import spawn

    mcfg = _config(args, layers=args.blocks, hidden=args.mem_hidden, chunks=args.mem_stages,
                   batch_size=args.mem_stages, stages=args.mem_stages, dataset="md17-like")
    single_cfg = _config(args, layers=args.blocks, hidden=args.mem_hidden, batch_size=args.mem_stages,
                         dataset="md17-like")
    tr, _, _ = _single_step(single_cfg, 1, 1)
    single = _state_bytes(tr)
    ranks = spawn(_rank_memory, args.mem_stages, (mcfg,), backend="gloo", timeout_s=300, threads=1)
    per = [r["bytes"] for r in ranks]
    res["memory"] = {"single_bytes": single, "rank_bytes": per, "ratio_max": max(per) / single,
                     "ratios": [b / single for b in per], "bounds": ranks[0]["bounds"],
                     "params_single": sum(p.numel() for p in tr.params)}
    print(f"memory: dimenet++ {args.blocks} blocks hidden {args.mem_hidden}: single {single / 2**20:.2f} MiB of "
          f"weights+grads+Adam; {args.mem_stages} stages (bounds {ranks[0]['bounds']}): "
          + ", ".join(f"{b / 2**20:.2f}" for b in per) + f" MiB per rank, max {max(per) / single:.3f}x")


def _timing(args, res: dict) -> None:
    """2. and 3.: the bubble against the simulator, the step time against the single process."""
    from gnnpipe import schedulers as gs
    from gnnpipe.core.run.launch import spawn

    S, C = args.stages, args.chunks
    pcfg = _config(args, stages=S, chunks=C, scheduler="gpipe")
    outs = spawn(_rank_timing, S, (pcfg, args.steps), backend="gloo", timeout_s=600, threads=1)
    timed = range(1, args.steps) if args.steps > 1 else range(args.steps)
    sch = gs.build_schedule("gpipe", S, C)
    means = [{k: statistics.fmean(outs[s][i]["mean"][k] for i in timed) for k in ("F", "B", "STEP")}
             for s in range(S)]

    def cost(a):
        return means[a.stage][{"F": "F", "B": "B", "STEP": "STEP"}[a.kind.name]]

    sim = gs.simulate(sch, cost)
    walls = [statistics.fmean(outs[s][i]["wall"] for i in timed) for s in range(S)]
    idle = [statistics.fmean(outs[s][i]["idle"] / outs[s][i]["schedule"] for i in timed) for s in range(S)]
    sched_s = [statistics.fmean(outs[s][i]["schedule"] for i in timed) for s in range(S)]
    res["bytes_layer_per_step"] = outs[0][-1]["bytes_layer"]
    res["bubble"] = {"measured_idle_share": idle, "simulated_bubble": sim.bubble_fraction, "schedule_s": sched_s,
                     "simulated_makespan_s": sim.makespan, "measured_step_s": walls, "action_means_s": means}
    print(f"bubble: gpipe S={S} C={C}: measured idle share " + ", ".join(f"{x:.1%}" for x in idle)
          + "; simulated (measured action costs) " + ", ".join(f"{x:.1%}" for x in sim.bubble_fraction)
          + f"; schedule {max(sched_s):.3f} s of a {max(walls):.3f} s step, simulated makespan {sim.makespan:.3f} s; "
          f"{res['bytes_layer_per_step'] / 2**20:.2f} MiB of boundary tensors per step")
    cpu = [statistics.fmean(outs[s][i]["cpu"] for i in timed) for s in range(S)]
    scfg = _config(args)
    speed, single_cpu = {}, {}
    for threads in (1, 2):
        _, w, c = _single_step(scfg, args.steps, threads)
        speed[threads] = statistics.fmean(w[i] for i in timed)
        single_cpu[threads] = statistics.fmean(c[i] for i in timed)
    res["speed"] = {"pipeline_step_s": max(walls), "single_step_s": speed,
                    "speedup_vs_1_thread": speed[1] / max(walls), "speedup_vs_2_threads": speed[2] / max(walls),
                    "pipeline_rank_cpu_s": cpu, "single_cpu_s": single_cpu[1],
                    "cpu_bound_speedup": single_cpu[1] / max(cpu)}
    print(f"step time: single {speed[1]:.3f} s (1 thread), {speed[2]:.3f} s (2 threads); {S}-stage pipeline "
          f"{max(walls):.3f} s: {speed[1] / max(walls):.2f}x / {speed[2] / max(walls):.2f}x; thread CPU seconds "
          f"per step: single {single_cpu[1]:.3f}, pipeline ranks " + ", ".join(f"{x:.3f}" for x in cpu)
          + f" ({single_cpu[1] / max(cpu):.2f}x)")


if __name__ == "__main__":
    main()
