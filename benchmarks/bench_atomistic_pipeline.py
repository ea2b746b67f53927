"""The S2EF pipeline (issue #30): per-rank parameter memory, the bubble against the schedule simulator, step time.

Four measurements, each on gloo ranks of this machine (CPU, one torch thread per rank):

1. **Parameter memory per rank** — bytes of weights + gradients + AdamW moments (and step counters) each rank
   holds after one training step of a deep DimeNet++ (``--blocks`` interaction blocks), ``--mem-stages`` stages
   against the single process.
2. **Bubble** — one gpipe run with ``--stages`` stages and ``--chunks`` micro-batches (``--per-chunk`` structures
   each, direct forces): each rank's bubble ``1 − busy / makespan`` (busy: seconds in its ``F``, ``B`` and ``STEP``
   actions, each the whole time since the rank's action before — compute, posting its send and the next receive,
   the interpreter — less its receive waits; makespan: first schedule start to last schedule end over the ranks)
   against the discrete-event simulator's bubble (the same definition) for the same schedule with the measured
   duration of each action, step by step (micro-batches differ in size), and beside it with each stage's mean
   ``F``, ``B`` and ``STEP``; per rank the seconds computing, in the actions besides, blocked in receives, and
   between actions.
3. **Step time** — the same pipeline's step against the single process (1 thread, and 2 threads) on the same batch,
   and against the single process stepping through the same micro-batches in turn (its work without parallelism);
   with ``--contention``, two of those at once against one alone: how much two processes slow each other on this
   machine (two vCPUs may share one core), which bounds what two stages can gain.
4. **Memory model** (``--memory-model``) — each pipeline rank's peak over two steps on one batch above its floor
   (resident set, glibc's mmap threshold 16 KiB) against :func:`gnnpipe.tasks.s2ef.cost.predict_layout`, for
   ``--mm-stages`` stages, gpipe and 1f1b, the timing model on ``--mm-chunks`` structures.

    python benchmarks/bench_atomistic_pipeline.py                      # defaults below
    python benchmarks/bench_atomistic_pipeline.py --blocks 12 --mem-stages 4 --chunks 16 --json out.json
    python benchmarks/bench_atomistic_pipeline.py --model gemnet-t --memory-model --skip-memory --skip-timing
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_graph_parallel import set_allocator

#: ``--model`` choices: (zoo model, direct forces)
MODELS = {"dimenet++": ("dimenet++", True), "gemnet-t": ("gemnet-t", False), "gemnet-dt": ("gemnet-t", True)}


def _config(args, **kw):
    from gnnpipe.core.settings.config import TrainConfig

    model, direct = MODELS[getattr(args, "model", "dimenet++")]
    base = dict(task="s2ef", model=model, layers=args.layers, hidden=args.hidden, dtype="float32",
                dropout=0.0, lr=1e-3, epochs=1, batch_size=args.chunks * args.per_chunk, ema_decay=0.0, warmup_steps=0,
                lr_schedule="constant", clip_grad_norm=None, cutoff=args.cutoff, max_neighbors=args.max_neighbors,
                direct_forces=direct, frames=args.chunks * args.per_chunk + 8, dataset=args.dataset, threads=1,
                model_args=({"int_emb_size": 32, "basis_emb_size": 8, "out_emb_channels": 64, "num_spherical": 7,
                             "num_radial": 6} if model == "dimenet++" else {}))
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


def _fixed_batches(batch, steps: int = 1):
    """Every epoch of the S2EF trainers (the pipeline's too: they read their batches in
    :mod:`gnnpipe.tasks.s2ef.trainer`) is ``steps`` steps on the training structures ``batch``."""
    from gnnpipe.tasks.s2ef import trainer as T

    T.epoch_batches = lambda n, gb, seed, epoch: [torch.as_tensor(batch)] * steps


def _rank_memory(rank, world, cfg):
    from gnnpipe.tasks.s2ef import trainer as P

    torch.set_num_threads(1)
    structures, splits, norm = _data(cfg)
    tr = P.S2EFTrainer(cfg, structures, splits, norm, rank=rank, world=world)
    _fixed_batches(list(range(cfg.batch_size)))
    tr.train_epoch(0)
    return {"bytes": _state_bytes(tr), "bounds": tr.bounds, "params": sum(p.numel() for p in tr.params)}


def _rank_peak(rank, world, cfg):
    """The peak resident set of two training steps on the same batch above the rank's floor (the trainer built:
    parameters, data), the counter reset through ``/proc/self/clear_refs`` just before: the second step holds
    Adam's moments, as the prediction does. Run with ``MALLOC_MMAP_THRESHOLD_`` small, so freed tensors leave the
    resident set at once; the trainer fixes glibc's threshold at 1 MiB when built
    (:func:`~gnnpipe.tasks.nodes.metrics.bound_heap_retention`), so the small one is set again here."""
    from bench_graph_parallel import _status

    from gnnpipe.core.runtime.memory import bound_heap_retention
    from gnnpipe.tasks.s2ef import trainer as P

    torch.set_num_threads(1)
    structures, splits, norm = _data(cfg)
    tr = P.S2EFTrainer(cfg, structures, splits, norm, rank=rank, world=world)
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        bound_heap_retention(int(os.environ["MALLOC_MMAP_THRESHOLD_"]))
    _fixed_batches(list(range(cfg.batch_size)), steps=2)
    torch.distributed.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    floor = _status("VmRSS")
    tr.train_epoch(0)
    return {"peak": _status("VmHWM") - floor, "floor": floor, "bounds": tr.bounds}


def _rank_timing(rank, world, cfg, steps, malloc="system"):
    """``steps`` training steps of the pipeline on one fixed batch; per step: wall, idle (receive waits), and the
    mean duration of each action kind on this rank."""
    from gnnpipe.tasks.s2ef import trainer as P

    torch.set_num_threads(1)
    set_allocator(malloc)
    structures, splits, norm = _data(cfg)
    tr = P.S2EFTrainer(cfg, structures, splits, norm, rank=rank, world=world)
    st, ex = tr.pipe_stage, tr.executor
    spans: dict[str, list[float]] = {"F": [], "B": [], "STEP": []}  # the stage's compute
    # (kind, action, start, end, receive wait inside it, the rank's receive waits so far) on the shared clock;
    # action "F3", "STEP"
    line: list[tuple] = []

    def timed(kind, fn):
        def run(*a):
            t0 = time.perf_counter()
            out = fn(*a)
            spans[kind].append(time.perf_counter() - t0)
            return out
        return run

    def action(kind, fn):
        def run(*a):
            t0, w0 = time.perf_counter(), tr.comm.idle_s
            out = fn(*a)
            line.append((kind, _action_name(kind, a[0] if a else None), t0, time.perf_counter(), tr.comm.idle_s - w0,
                         tr.comm.idle_s))
            return out
        return run

    st.forward_chunk = timed("F", st.forward_chunk)
    st.backward_chunk = timed("B", st.backward_chunk)
    st.step = timed("STEP", st.step)
    ex.forward, ex.backward, ex.step = action("F", ex.forward), action("B", ex.backward), action("STEP", ex.step)
    sched = {"s": 0.0}
    run_schedule = tr.executor.train_epoch

    def timed_schedule(*a):
        t0, w0 = time.perf_counter(), tr.comm.idle_s
        out = run_schedule(*a)
        t1 = time.perf_counter()
        sched.update(s=sched["s"] + t1 - t0, start=t0, end=t1, idle0=w0)
        return out

    tr.executor.train_epoch = timed_schedule
    _fixed_batches(list(range(cfg.batch_size)))
    out = []
    for i in range(steps):
        for v in (*spans.values(), line):
            v.clear()
        tr.comm.reset()
        sched["s"] = 0.0
        torch.distributed.barrier()
        t0 = time.perf_counter()
        rec = tr.train_epoch(i)
        wall = time.perf_counter() - t0
        # each action's time on the rank: from the end of the one before (the schedule's start for the first) to
        # its end, less the receive waits in between: its compute, posting its send and the next action's receive,
        # the interpreter; what is left of the schedule is waiting (receives, the final wait for sends) and the
        # tail after the last action
        lead = {}
        prev_t, prev_w = sched["start"], sched["idle0"]
        for _, n, a, b, w, w_end in line:
            lead[n] = (b - prev_t) - (w_end - prev_w)
            prev_t, prev_w = b, w_end
        inside = {k: [b - a - w for kind, _, a, b, w, _ in line if kind == k] for k in spans}  # the action alone
        out.append({"wall": wall, "idle": tr.comm.idle_s, "schedule": sched["s"], "cpu": rec["cpu_s"][rank],
                    "bytes_layer": rec["bytes_layer"], "start": sched["start"], "end": sched["end"],
                    "compute": sum(sum(v) for v in spans.values()), "inside": sum(sum(v) for v in inside.values()),
                    "busy": sum(lead.values()),
                    "mean": {k: statistics.fmean(v) if (v := [lead[n] for kind, n, *_ in line if kind == k]) else 0.0
                             for k in spans},
                    "action": lead, "timeline": list(line)})
    return out


def _action_name(kind: str, chunk: int | None) -> str:
    """``"F3"`` (micro-batch 3's ``F``), ``"STEP"``: the key of one action's measured time."""
    return kind if chunk is None else f"{kind}{chunk}"


def _timed_steps(tr, steps):
    walls, cpus = [], []
    for i in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        tr.train_epoch(i)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    return walls, cpus


def _single_step(cfg, steps, threads):
    from gnnpipe.tasks.s2ef import trainer as T

    torch.set_num_threads(threads)
    structures, splits, norm = _data(cfg)
    tr = T.S2EFTrainer(cfg, structures, splits, norm)
    _fixed_batches(list(range(cfg.batch_size)))
    return (tr, *_timed_steps(tr, steps))


def _chunked_single_step(cfg, steps):
    """The single process stepping through the same micro-batches in turn (one stage, ``cfg.chunks`` chunks:
    gradients accumulated, one optimizer step): the pipeline's work without its parallelism."""
    from gnnpipe.tasks.s2ef import trainer as P

    torch.set_num_threads(1)
    structures, splits, norm = _data(cfg)
    tr = P.S2EFTrainer(cfg, structures, splits, norm, rank=0, world=1)
    _fixed_batches(list(range(cfg.batch_size)))
    return _timed_steps(tr, steps)


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each option's default."""


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=_Help)
    ap.add_argument("--blocks", type=int, default=12, help="interaction blocks of the memory model (>= 12)")
    ap.add_argument("--mem-hidden", type=int, default=128, help="hidden width of the memory model")
    ap.add_argument("--mem-stages", type=int, default=4, help="stages of the memory measurement")
    ap.add_argument("--layers", type=int, default=4, help="interaction blocks of the timing model")
    ap.add_argument("--hidden", type=int, default=128, help="hidden width of the timing model")
    ap.add_argument("--stages", type=int, default=2, help="stages of the timing runs")
    ap.add_argument("--chunks", type=int, default=16, help="micro-batches per step")
    ap.add_argument("--per-chunk", type=int, default=1, help="structures per micro-batch")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (the first is a warm-up)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of fresh processes of the timing runs")
    ap.add_argument("--dataset", default="oc20-like", help="generated structures of the timing runs")
    ap.add_argument("--cutoff", type=float, default=6.0, help="neighbour radius (Å) of the timing runs")
    ap.add_argument("--max-neighbors", type=int, default=30, help="neighbours per atom at most, timing runs")
    ap.add_argument("--skip-memory", action="store_true", help="only the bubble and step-time measurements")
    ap.add_argument("--memory-model", action="store_true",
                    help="also measure each pipeline rank's peak against the memory model's prediction")
    ap.add_argument("--mm-stages", type=int, nargs="+", default=[2, 4], help="stages of the memory-model runs")
    ap.add_argument("--mm-chunks", type=int, default=8, help="structures (= micro-batches) of the memory-model runs")
    ap.add_argument("--malloc", choices=["system", "retain"], default="system",
                    help="allocator of the timing runs' processes (bench_graph_parallel.set_allocator): glibc's "
                         "defaults, or 'retain' freed memory for reuse, so steps after the first fault no page in")
    ap.add_argument("--contention", action="store_true",
                    help="each round also runs two chunked single processes at once: how much two processes slow "
                         "each other on this machine (2 / that ratio bounds what S = 2 can gain)")
    ap.add_argument("--model", choices=sorted(MODELS), default="dimenet++",
                    help="the model of every run (dimenet++ and gemnet-dt: direct forces; gemnet-t: conservative)")
    ap.add_argument("--skip-timing", action="store_true", help="no bubble and step-time rounds")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error(f"--steps {args.steps}: give 2 or more (the first step is a warm-up, not timed)")


    res: dict = {"args": vars(args)}
    # 1. parameter memory
    if not args.skip_memory:
        _memory(args, res)
    if args.memory_model:
        _memory_model(args, res)
    if not args.skip_timing:
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
    print(f"memory: {args.model} {args.blocks} blocks hidden {args.mem_hidden}: single {single / 2**20:.2f} MiB of "
          f"weights+grads+Adam; {args.mem_stages} stages (bounds {ranks[0]['bounds']}): "
          + ", ".join(f"{b / 2**20:.2f}" for b in per) + f" MiB per rank, max {max(per) / single:.3f}x")


def _memory_model(args, res: dict) -> None:
    """4. Per-rank peak of a pipeline step above the floor, measured, against the atomistic memory model
    (:func:`gnnpipe.tasks.s2ef.cost.predict_layout`: gradients + Adam moments + the all-reduce buffer +
    activations + the step's graphs; the parameters are in the floor), for ``--mm-stages`` × gpipe / 1f1b."""

    from torch_geometric.data import Batch

    from gnnpipe.core.run.launch import spawn
    from gnnpipe.data.atoms import build_graph
    from gnnpipe.tasks.s2ef.cost import AtomJob, AtomLayout, predict_layout, profile_step

    C = args.mm_chunks
    scfg = _config(args, chunks=C, batch_size=C, frames=C + 8)
    tr, _, _ = _single_step(scfg, 1, 1)
    batch_ids = list(range(C))
    structures = [tr.structures[i] for i in tr.splits["train"][batch_ids].tolist()]
    batch = Batch.from_data_list(structures)
    graph = build_graph(batch, scfg.cutoff, scfg.max_neighbors,
                        with_reverse=bool(getattr(tr.model, "uses_reverse_edges", False)))
    prof = profile_step(tr.model, batch, graph, steps=1, warmup=1, name=scfg.model)
    job = AtomJob(tr.model, structures, scfg.cutoff, scfg.max_neighbors, element_size=4, ema=False,
                  allreduce_element_size=8)
    rows = []
    for S in args.mm_stages:
        for sched in ("gpipe", "1f1b"):
            pcfg = _config(args, chunks=C, batch_size=C, frames=C + 8, stages=S, scheduler=sched)
            os.environ["MALLOC_MMAP_THRESHOLD_"] = "16384"
            try:
                outs = spawn(_rank_peak, S, (pcfg,), backend="gloo", timeout_s=600, threads=1)
            finally:
                os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
            pred = predict_layout(job, AtomLayout(S, 1, 1, C, sched), prof)
            for r, (o, m) in enumerate(zip(outs, pred.memory)):
                pm = m.gradients + m.optimizer + m.allreduce + m.activations + m.graph
                rows.append({"stages": S, "scheduler": sched, "rank": r, "measured_MiB": o["peak"] / 2**20,
                             "predicted_MiB": pm / 2**20, "error": pm / o["peak"] - 1, "bounds": o["bounds"]})
    res["memory_model"] = {"kappa": prof.kappa, "kappa_d": prof.kappa_d, "chunks": C, "rows": rows}
    kd = f", kappa_d {prof.kappa_d:.2f}" if prof.kappa_d is not None else ""
    print(f"memory model: {args.model} {args.layers} blocks hidden {args.hidden}, {C} structures in {C} micro-batches, "
          f"kappa {prof.kappa:.2f}{kd} (single-process profile); peak of a step above the floor, MiB (error):")
    for r in rows:
        print(f"  S={r['stages']} {r['scheduler']:>5} rank {r['rank']}: measured {r['measured_MiB']:8.1f}, predicted "
              f"{r['predicted_MiB']:8.1f} ({r['error']:+.1%})")


def _single_rank(rank, world, cfg, steps, chunked, malloc="system"):
    """A fresh process's single-process steps: the whole batch (``chunked`` false) or its micro-batches in turn."""
    set_allocator(malloc)
    if chunked:
        return _chunked_single_step(cfg, steps)
    _, w, c = _single_step(cfg, steps, torch.get_num_threads())
    return w, c


def _pair_rank(rank, world, cfg, steps, malloc="system"):
    """Contention control: each of two processes, started together, steps through the micro-batches in turn alone
    (no process group: nothing is exchanged), as ``_chunked_single_step``."""
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    set_allocator(malloc)
    return _chunked_single_step(cfg, steps)


def _round(args) -> dict:
    """One round in fresh processes: the pipeline, then the single process (1 and 2 threads) and the chunked
    single process; each of this machine's processes runs the same step at its own speed (±25 % here), so rounds
    of fresh processes, not steps of one, give the spread."""
    from gnnpipe import schedulers as gs
    from gnnpipe.core.run.launch import spawn

    S, C = args.stages, args.chunks
    outs = spawn(_rank_timing, S, (_config(args, stages=S, chunks=C, scheduler="gpipe"), args.steps, args.malloc),
                 backend="gloo", timeout_s=600, threads=1)
    timed = range(1, args.steps)
    means = [{k: statistics.fmean(outs[s][i]["mean"][k] for i in timed) for k in ("F", "B", "STEP")}
             for s in range(S)]
    sched = gs.build_schedule("gpipe", S, C)

    def action_key(a):
        return _action_name(a.kind.name, None if a.kind.name == "STEP" else a.chunk)

    # each step simulated with the duration each of its actions took (micro-batches differ in size, and a process's
    # speed drifts from step to step), against the same step measured
    sims = [gs.simulate(sched, lambda a, i=i: outs[a.stage][i]["action"][action_key(a)]) for i in timed]
    sim_mean = gs.simulate(sched, lambda a: means[a.stage][a.kind.name])
    # the simulator's definition, measured: 1 − (seconds in F, B, STEP: each action's whole time on the rank, its
    # compute, posting its send, the interpreter's share and the time since the action before, less the receive
    # waits) / (first schedule start to last schedule end over the ranks; perf_counter is the machine's monotonic
    # clock, shared by the processes)
    spans = [max(outs[s][i]["end"] for s in range(S)) - min(outs[s][i]["start"] for s in range(S)) for i in timed]

    def mean(key, s):
        return statistics.fmean(outs[s][i][key] for i in timed)

    r = {"pipeline_s": max(mean("wall", s) for s in range(S)),
         "rank_cpu_s": [mean("cpu", s) for s in range(S)],
         "measured_bubble": [statistics.fmean(1 - outs[s][i]["busy"] / sp for i, sp in zip(timed, spans))
                             for s in range(S)],
         "simulated_bubble": [statistics.fmean(sim.bubble_fraction[s] for sim in sims) for s in range(S)],
         "simulated_bubble_mean_times": list(sim_mean.bubble_fraction),
         "inside_s": [mean("inside", s) for s in range(S)],
         "receive_wait_share": [statistics.fmean(outs[s][i]["idle"] / outs[s][i]["schedule"] for i in timed)
                                for s in range(S)],
         "busy_s": [mean("busy", s) for s in range(S)], "compute_s": [mean("compute", s) for s in range(S)],
         "receive_wait_s": [mean("idle", s) for s in range(S)],
         "schedule_s": [mean("schedule", s) for s in range(S)], "makespan_s": statistics.fmean(spans),
         "start_s": [statistics.fmean(outs[s][i]["start"] - min(outs[q][i]["start"] for q in range(S)) for i in timed)
                     for s in range(S)],
         "simulated_makespan_s": statistics.fmean(sim.makespan for sim in sims), "action_means_s": means,
         "bytes_layer_per_step": outs[0][-1]["bytes_layer"]}
    for key, threads, chunked, cfg in (("single", 1, False, _config(args)),
                                       ("single_2_threads", 2, False, _config(args)),
                                       ("chunked", 1, True, _config(args, stages=1, chunks=C))):
        w, c = spawn(_single_rank, 1, (cfg, args.steps, chunked, args.malloc), backend="gloo", timeout_s=600,
                     threads=threads)[0]
        r[key + "_s"] = statistics.fmean(w[i] for i in timed)
        r[key + "_cpu_s"] = statistics.fmean(c[i] for i in timed)
    if args.contention:
        pair = spawn(_pair_rank, 2, (_config(args, stages=1, chunks=C), args.steps, args.malloc), backend="gloo",
                     timeout_s=600, threads=1)
        r["pair_s"] = statistics.fmean(statistics.fmean(w[i] for i in timed) for w, _ in pair)
        r["contention"] = r["pair_s"] / r["chunked_s"]
    r["speedup"] = r["single_s"] / r["pipeline_s"]
    r["speedup_vs_chunked"] = r["chunked_s"] / r["pipeline_s"]
    return r


def _timing(args, res: dict) -> None:
    """2. and 3.: the bubble against the simulator, the step time against the single process, ``--rounds`` rounds."""
    S, C = args.stages, args.chunks
    rounds = []
    for k in range(args.rounds):
        r = _round(args)
        rounds.append(r)
        print(f"round {k + 1}: step single {r['single_s']:.3f} s (2 threads {r['single_2_threads_s']:.3f}), "
              f"chunked {r['chunked_s']:.3f}, {S}-stage pipeline {r['pipeline_s']:.3f}: {r['speedup']:.2f}x "
              f"({r['speedup_vs_chunked']:.2f}x the chunked); bubble measured "
              + ", ".join(f"{x:.1%}" for x in r["measured_bubble"]) + ", simulated "
              + ", ".join(f"{x:.1%}" for x in r["simulated_bubble"]) + " (mean times "
              + ", ".join(f"{x:.1%}" for x in r["simulated_bubble_mean_times"]) + "); schedule starts +"
              + "/".join(f"{x * 1e3:.0f}" for x in r["start_s"])
              + " ms; per rank s computing, in the actions besides, blocked in receives, between actions "
              + ", ".join(f"{c:.3f}/{b - c:.3f}/{w:.3f}/{t - b - w:.3f}" for c, b, w, t in
                          zip(r["compute_s"], r["inside_s"], r["receive_wait_s"], r["schedule_s"]))
              + (f"; two chunked copies at once {r['contention']:.2f}x slower than one alone" if "contention" in r
                 else ""), flush=True)
    med = statistics.median
    diff = [max(abs(m - s) for m, s in zip(r["measured_bubble"], r["simulated_bubble"])) for r in rounds]
    res["rounds"] = rounds
    res["summary"] = {"speedup_median": med(r["speedup"] for r in rounds),
                      "speedup_range": [min(r["speedup"] for r in rounds), max(r["speedup"] for r in rounds)],
                      "speedup_vs_chunked_median": med(r["speedup_vs_chunked"] for r in rounds),
                      "bubble_gap_points_median": 100 * med(diff), "bubble_gap_points_max": 100 * max(diff),
                      "bytes_layer_per_step": rounds[0]["bytes_layer_per_step"]}
    if args.contention:
        res["summary"]["contention_range"] = [min(r["contention"] for r in rounds),
                                              max(r["contention"] for r in rounds)]
    sm = res["summary"]
    print(f"gpipe S={S} C={C} ({args.per_chunk} structure(s) per micro-batch), {args.rounds} rounds: speed-up "
          f"{sm['speedup_median']:.2f}x median ({sm['speedup_range'][0]:.2f}-{sm['speedup_range'][1]:.2f}), "
          f"{sm['speedup_vs_chunked_median']:.2f}x the chunked single process; bubble |measured - simulated|: "
          f"{sm['bubble_gap_points_median']:.1f} points median, {sm['bubble_gap_points_max']:.1f} max; "
          f"{sm['bytes_layer_per_step'] / 2**20:.2f} MiB of boundary tensors per step"
          + ("; two processes at once {:.2f}-{:.2f}x slower than one".format(*sm["contention_range"])
             if args.contention else ""))


if __name__ == "__main__":
    main()
