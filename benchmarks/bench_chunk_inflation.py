"""Where the pipeline's extra work goes: chunked stage compute against the whole-graph epoch, per item,
with machine-independent counts beside the CPU times (issue #18). Numbers go to docs/RESULTS.md.

    python benchmarks/bench_chunk_inflation.py --stages 2 --chunks 16            # S=2 x 16 chunks
    python benchmarks/bench_chunk_inflation.py --stages 8 --chunks 32            # S=8 x 32 chunks (over 4)

**Work inflation** = the summed compute CPU time of every stage of one pipeline epoch / the compute CPU
time of one single-process epoch on the pipeline's vertex order (both one thread; ``time.thread_time``,
so other processes on a shared machine do not count). All stages run in *this* process, one after the
other, through the pipeline's own per-action code (``Executor.forward`` / ``backward`` / ``step``, i.e.
``Stage.forward_chunk`` / ``backward_chunk`` and the correctors' hooks, as ``train_epoch`` calls them), with a loop-back
stand-in for the communication: what a rank would compute, without needing a core per rank. The schedule is gpipe (all
forwards of a stage, then its backwards in reverse order), stage by stage.

The breakdown (one epoch of each path under a ``TorchDispatchMode`` that times every ATen call alone and
files it under an item by the op and the Python frames that called it; the mode's own work disturbs the
caches, so compare the two columns, not a column with the unmeasured total) comes with counts that do not
depend on the CPU: ATen calls, autograd nodes created, Python function calls, and bytes moved per item.
"Per-call overhead" is the same inflation measured on the model with hidden width 1, where the kernels
are nearly free and what remains is Python, dispatch and autograd bookkeeping per call. Bytes moved are counted per ATen
call by a ``TorchDispatchMode``: every dense tensor argument and result (a view moves nothing; the destination of a copy
is written, not read), except that a gather (``index_select``) reads only the distinct indexed rows and a sparse product
(a CSR ``mm``, or the fused ``embedding_bag`` of :func:`gnnpipe.tasks.nodes.graph.csr_mm`) reads only the distinct rows
of the dense matrix its non-zeros reference (what a perfect cache fetches).

Not a test.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# --------------------------------------------------------------------------------------------- set-up
def build(a):
    import attrs
    import torch

    from gnnpipe import api
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.nodes.runner import build_plan
    from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer, resolve_config

    torch.set_num_threads(1)
    base = resolve_config(TrainConfig(dataset=a.dataset, root=a.root, model="gcnii", layers=a.layers,
                                      hidden=a.hidden, epochs=a.epochs, patience=0, threads=1))
    cfg = attrs.evolve(base, stages=a.stages, chunks=a.chunks, over_partition=a.over_partition,
                       layer_split="equal", backend="gloo", scheduler="gpipe", recompute=False)
    plan = build_plan(cfg, api.load_data(cfg))
    single = SingleProcessTrainer(plan.data, attrs.evolve(base, stages=1, chunks=1))
    return cfg, plan, single


class LoopbackComm:
    """The parts of :class:`gnnpipe.core.comm.Comm` a stage's actions use, delivering within this process."""

    def __init__(self, box: dict, rank: int):
        from gnnpipe.core.comm import Comm

        self._comm = Comm()
        self.box, self.rank = box, rank
        self.bytes = self._comm.bytes

    def isend(self, tensor, dst, tag, kind="layer"):
        t = tensor.detach().contiguous()
        self.box[(dst, tag)] = t
        self.bytes[kind] += t.numel() * t.element_size()

    def irecv(self, shape, dtype, src, tag):
        return (self.rank, tag)

    def wait_recv(self, posted):
        return self.box.pop(posted)

    def wait_sends(self):
        pass

    def reset(self):
        self.bytes.clear()


def make_stages(cfg, plan):
    """Every stage's executor of the pipeline in this process, sharing one model (each runs its own units)."""
    from gnnpipe import correctors as corr
    from gnnpipe.tasks.nodes.pipeline import make_pipeline_stage
    from gnnpipe.tasks.nodes.runner import _order_policy, _scheduler
    from gnnpipe.tasks.nodes.trainer import make_model

    model = make_model(cfg, plan.num_features, plan.num_classes)
    box: dict = {}
    stages = []
    for s in range(cfg.stages):
        cs = corr.build_correctors(cfg.correctors)
        stages.append(make_pipeline_stage(cfg, model, plan.data, plan.chunk_ptr, plan.bounds, s,
                                          list(range(cfg.stages)), _scheduler(cfg), _order_policy(cfg, cs), cs,
                                          LoopbackComm(box, s)))
    return stages


def pipeline_epoch(stages, epoch: int) -> list[float]:
    """One gpipe epoch of every stage in this process; returns each stage's thread CPU seconds.

    Mirrors ``Executor.train_epoch`` for a flush schedule (zero_grad, epoch-start hooks, forwards in the epoch's
    chunk order, backwards in reverse, one optimizer step, epoch-end hooks), calling the executor's own
    ``forward`` / ``backward`` / ``step`` (which run the stage's compute and the correctors' chunk hooks)."""
    S = len(stages)
    order = list(stages[0].order_policy.order(epoch, stages[0].num_chunks))
    cpu = [0.0] * S

    def timed(s, f, *args):
        t0 = time.thread_time()
        f(*args)
        cpu[s] += time.thread_time() - t0

    for s, ex in enumerate(stages):
        def start(ex=ex):
            ex.ctx.fresh_chunks.clear()
            ex.stage.zero_grad()
            ex._start_epoch(epoch)
        timed(s, start)
    for s, ex in enumerate(stages):
        for c in order:
            timed(s, ex.forward, c, epoch)
    for s in reversed(range(S)):
        ex = stages[s]
        for c in reversed(order):
            timed(s, ex.backward, c, epoch)

        def end(ex=ex):
            ex.step()
            for k in ex.correctors:
                k.on_epoch_end(epoch)
            ex._started.discard(epoch)
            ex.stage.pop_loss(epoch)
        timed(s, end)
    return cpu


def single_epoch(single, epoch: int) -> float:
    t0 = time.thread_time()
    single.train_epoch(epoch)
    return time.thread_time() - t0


# --------------------------------------------------------------------------------------------- breakdown
DENSE = "dense ops (linear, lerp, activations, loss, optimizer)"
ITEMS = {  # ATen op → item, unless the calling Python frames say otherwise (see classify)
    "index_select": "gather own + halo rows",
    "rand_like": "dropout masks", "rand": "dropout masks", "uniform_": "dropout masks", "ge_": "dropout masks",
    "ge": "dropout masks",
    "bernoulli_": "dropout masks", "native_dropout": "dropout masks", "empty_like": "dropout masks",
}
CHUNK_ONLY = ("history writes (H_in, G_out)", "correctors (T2 doubling/zeroing, T3 restore)", "boundary copies",
              "gather own + halo rows")
#: Python functions whose ATen calls belong to an item, whatever the op (innermost wins)
FRAMES = {"write_rows": "history writes (H_in, G_out)", "write_grad_rows": "history writes (H_in, G_out)",
          "_boundary": "boundary copies", "boundary": "boundary copies", "split_boundary": "boundary copies",
          "forward_chunk": None, "backward_chunk": None, "dropout": "dropout masks",
          "_run_masks": "dropout masks",  # a fused run's masks, drawn in one call
          "scale_grad_rows": "correctors (T2 doubling/zeroing, T3 restore)"}  # T2's doubling, also from the pull


def classify(op: str, sparse: bool) -> str:
    """The item of an ATen call ``op`` (name without overload), from the Python frames it was called from."""
    if sparse:
        return "sparse product"
    f = sys._getframe(3)
    depth = 0
    while f is not None and depth < 12:
        name = f.f_code.co_name
        owner = f.f_locals.get("self")
        if owner is not None and type(owner).__module__.startswith("gnnpipe.correctors"):
            return "correctors (T2 doubling/zeroing, T3 restore)"
        if op == "copy_" and "hist" in f.f_locals and name in ("forward", "backward"):  # an older chunk op
            return "history writes (H_in, G_out)"
        if name == "push" and op == "mul":  # ChunkPushPull.push writes h * mask straight into H_in
            return "history writes (H_in, G_out)"
        if name in FRAMES and FRAMES[name] is not None:
            if name == "dropout" and op not in ITEMS:
                return DENSE  # the product h * mask is the dropout's dense work, not its mask
            return FRAMES[name]
        if name in ("forward_chunk", "_receive") and op in ("clone", "copy_", "cat"):
            return "boundary copies"
        if name in ("forward_chunk", "backward_chunk") and op in ("cat", "zeros_like"):
            return "boundary copies"
        f = f.f_back
        depth += 1
    return ITEMS.get(op, DENSE)


class Counter:
    """ATen calls, their thread CPU time and the bytes they move, per item (a ``TorchDispatchMode``: sees every
    ATen call below autograd, the backward's included)."""

    def __init__(self):
        self.calls = collections.Counter()
        self.bytes = collections.Counter()
        self.cpu = collections.Counter()
        self.rows_gathered = 0
        self.nnz = 0

    def mode(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        counter = self

        def dense_bytes(t):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                return 0
            return t.numel() * t.element_size()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                t0 = time.thread_time()
                out = func(*args, **kwargs)
                dt = time.thread_time() - t0
                op = func.__name__.split(".")[0]
                flat_in, _ = tree_flatten((args, kwargs))
                flat_out, _ = tree_flatten(out)
                sp = [t for t in flat_in if isinstance(t, torch.Tensor) and t.layout == torch.sparse_csr]
                fused = op in ("_embedding_bag", "_embedding_bag_forward_only")  # csr_mm's fused product
                accessor = op in ("crow_indices", "col_indices", "values", "_nnz")  # views of a CSR tensor
                item = classify(op, fused or (bool(sp) and op not in ("_to_sparse_csr", "clone") and not accessor))
                if op == "index_select":  # reads only the distinct indexed rows (a repeated row is cached)
                    src, idx = args[0], args[2]
                    row = src.numel() // max(src.size(0), 1) * src.element_size()
                    distinct = int(torch.unique(idx).numel())
                    if src.dim() == 2:  # rows of a matrix (a 1-D source: the pull's zero-row mask)
                        counter.rows_gathered += distinct
                    b = distinct * row + idx.numel() * idx.element_size() + sum(dense_bytes(t) for t in flat_out)
                elif fused:  # reads the distinct rows of the weight its indices reference, once each
                    weight, idx, offsets, psw = args[0], args[1], args[2], args[6]
                    width = weight.size(1)
                    rows = int(torch.unique(idx).numel()) if idx.numel() else 0
                    counter.nnz += idx.numel() * width
                    b = (rows * width * weight.element_size() + sum(dense_bytes(t) for t in (idx, offsets, psw))
                         + sum(dense_bytes(t) for t in flat_out))
                elif sp and item == "sparse product":  # reads the distinct rows its sparse matrix references
                    m = sp[0]
                    dense = [t for t in flat_in if isinstance(t, torch.Tensor) and t.layout == torch.strided
                             and t.dim() == 2]
                    width = dense[-1].size(1) if dense else 0
                    rows = int(torch.unique(m.col_indices()).numel()) if m._nnz() else 0
                    counter.nnz += m._nnz() * width
                    b = (rows * width * 4 + m._nnz() * (m.col_indices().element_size() + m.element_size())
                         + sum(dense_bytes(t) for t in flat_out))
                elif getattr(func, "is_view", False) or accessor or op in ("detach", "alias", "t", "view", "slice"):
                    b = 0  # a view moves nothing
                elif op in ("copy_", "zero_", "fill_"):  # the destination is written, not read
                    b = sum(dense_bytes(t) for t in flat_in[1:]) + dense_bytes(args[0])
                else:
                    b = sum(dense_bytes(t) for t in flat_in) + sum(dense_bytes(t) for t in flat_out)
                counter.calls[item] += 1
                counter.bytes[item] += b
                counter.cpu[item] += dt
                return out

        return Mode()


def count_pass(run_epoch) -> tuple[Counter, int]:
    """ATen calls, CPU seconds and bytes per item for one epoch, and the Python calls of another."""
    c = Counter()
    with c.mode():
        run_epoch()
    calls = [0]

    def prof(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    sys.setprofile(prof)
    try:
        run_epoch()
    finally:
        sys.setprofile(None)
    return c, calls[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="Computers")
    p.add_argument("--root", default=str(SHARED / "amazon"))
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=100)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--over-partition", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per round (after one warm-up epoch)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-breakdown", action="store_true", help="inflation only (skip the profiled/counted passes)")
    p.add_argument("--out", default=None, help="write the numbers as JSON")
    p.add_argument("--no-gather", action="store_true",
                   help="A/B only: the chunk op multiplies the plain CSR rows over the whole history buffer instead "
                        "of gathering the rows it references into a compact block (RESULTS §11b)")
    a = p.parse_args()
    if a.no_gather:
        from gnnpipe.tasks.nodes import graph as _graph

        def plain_rows(self, kind, ranges):
            return list(zip(self.rows(kind, ranges), self.rows(kind, ranges, transpose=True)))

        _graph.GraphOps.chunk_rows_many = plain_rows

    cfg, plan, single = build(a)
    stages = make_stages(cfg, plan)
    epoch = [0]

    def run_pipe():
        cpu = pipeline_epoch(stages, epoch[0])
        epoch[0] += 1
        return cpu

    def run_single():
        t = single_epoch(single, epoch[0])
        return t

    run_pipe(), run_single()  # warm-up (allocates history)
    rounds = []
    for _ in range(a.rounds):  # interleaved: drift of the machine hits both paths alike
        ps, ss, ws, wp = [], [], [], []
        for _ in range(a.epochs):
            t0 = time.perf_counter()
            ps.append(run_pipe())
            wp.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ss.append(run_single())
            ws.append(time.perf_counter() - t0)
        per_stage = [statistics.median(x[s] for x in ps) for s in range(a.stages)]
        total = statistics.median(sum(x) for x in ps)
        one = statistics.median(ss)
        rounds.append({"stage_cpu_s": per_stage, "pipeline_cpu_s": total, "single_cpu_s": one,
                       "pipeline_wall_s": statistics.median(wp), "single_wall_s": statistics.median(ws),
                       "inflation": total / one})
    infl = statistics.median(r["inflation"] for r in rounds)
    adj = next(iter(stages[0].stage.ops.values())).chunk_adj  # (kind, c) -> (Â[R_c, :], Âᵀ[R_c, :]), shared by the ops
    halo = sum(int(a_.cols.numel()) if hasattr(a_, "cols") else int(a_.col_indices().unique().numel())
               for (kind, c), (a_, _) in adj.items()) - plan.data.num_nodes
    print(f"GCNII-{a.layers} hidden {a.hidden}, {a.dataset} (N={plan.data.num_nodes}), {a.stages} stages x "
          f"{a.chunks} chunks (METIS over-partition {a.over_partition}), split {plan.bounds}; halo rows per op "
          f"{halo} ({halo / plan.data.num_nodes:.2f} N); thread CPU time, 1 thread")
    for i, r in enumerate(rounds):
        print(f"  round {i}: pipeline {r['pipeline_cpu_s'] * 1e3:7.1f} ms CPU (stages "
              f"{[round(x * 1e3, 1) for x in r['stage_cpu_s']]}), wall {r['pipeline_wall_s'] * 1e3:7.1f}; single "
              f"{r['single_cpu_s'] * 1e3:7.1f} ms CPU, wall {r['single_wall_s'] * 1e3:7.1f} -> inflation "
              f"{r['inflation']:.3f}")
    print(f"  work inflation (median of rounds): {infl:.3f}")
    out = {"args": vars(a), "bounds": plan.bounds, "rounds": rounds, "inflation": infl}
    if not a.no_breakdown:
        out["breakdown"] = breakdown(run_pipe, run_single, stages, single, rounds, a)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


def overhead(args) -> tuple[float, float]:
    """Median thread CPU seconds of a pipeline epoch (all stages) and a single-process epoch at hidden width 1."""
    import copy

    a = copy.copy(args)
    a.hidden = 1
    cfg, plan, single = build(a)
    stages = make_stages(cfg, plan)
    pipe, one = [], []
    for e in range(1 + 2 * max(a.epochs, 2)):
        p, s = sum(pipeline_epoch(stages, e)), single_epoch(single, e)
        if e:
            pipe.append(p)
            one.append(s)
    return statistics.median(pipe), statistics.median(one)


def breakdown(run_pipe, run_single, stages, single, rounds, args) -> dict:
    tp = statistics.median(r["pipeline_cpu_s"] for r in rounds)
    ts = statistics.median(r["single_cpu_s"] for r in rounds)
    cnt_p, py_p = count_pass(run_pipe)
    cnt_s, py_s = count_pass(run_single)
    nodes_p, nodes_s = autograd_nodes(stages, single)
    items = sorted(set(cnt_p.calls) | set(cnt_s.calls) | set(CHUNK_ONLY))
    print("  breakdown per epoch (chunked = all stages summed); CPU ms of the ATen calls, timed one by one:")
    print(f"  {'item':52s} {'CPU ms':>17s} {'ATen calls':>17s} {'MB moved':>17s}")
    print(f"  {'':52s} {'chunked':>8s} {'whole':>8s} {'chunked':>8s} {'whole':>8s} {'chunked':>8s} {'whole':>8s}")
    rows = {}
    for it in items:
        r = (cnt_p.cpu.get(it, 0.0) * 1e3, cnt_s.cpu.get(it, 0.0) * 1e3, cnt_p.calls.get(it, 0),
             cnt_s.calls.get(it, 0), cnt_p.bytes.get(it, 0) / 1e6, cnt_s.bytes.get(it, 0) / 1e6)
        rows[it] = r
        print(f"  {it:52s} {r[0]:8.1f} {r[1]:8.1f} {r[2]:8d} {r[3]:8d} {r[4]:8.1f} {r[5]:8.1f}")
    ovp, ovs = overhead(args)
    print(f"  {'per-call overhead (the same epochs at hidden width 1)':52s} {ovp * 1e3:8.1f} {ovs * 1e3:8.1f} "
          f"{'Python calls':>17s} {py_p:8d} {py_s:8d}")
    bp, bs = sum(cnt_p.bytes.values()), sum(cnt_s.bytes.values())
    print(f"  {'total (thread CPU time of the timed rounds)':52s} {tp * 1e3:8.1f} {ts * 1e3:8.1f} "
          f"{sum(cnt_p.calls.values()):8d} {sum(cnt_s.calls.values()):8d} {bp / 1e6:8.1f} {bs / 1e6:8.1f}")
    print(f"  bytes moved chunked / whole: {bp / bs:.3f}; rows gathered {cnt_p.rows_gathered} vs "
          f"{cnt_s.rows_gathered}; nonzeros x width multiplied {cnt_p.nnz} vs {cnt_s.nnz}; autograd nodes "
          f"{nodes_p} vs {nodes_s}; Python calls {py_p} vs {py_s}")
    return {"items": rows, "overhead_ms": [ovp * 1e3, ovs * 1e3], "bytes_ratio": bp / bs,
            "rows_gathered": [cnt_p.rows_gathered, cnt_s.rows_gathered], "nnz_x_width": [cnt_p.nnz, cnt_s.nnz],
            "autograd_nodes": [nodes_p, nodes_s], "python_calls": [py_p, py_s]}


def autograd_nodes(stages, single) -> tuple[int, int]:
    """Autograd nodes of one epoch's graphs: every stage's chunk forwards (pipeline), one forward (single)."""

    from gnnpipe.tasks.nodes.trainer import masked_loss

    def walk(roots) -> int:
        seen, todo = set(), [r for r in roots if r is not None]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo.extend(f for f, _ in n.next_functions if f is not None)
        return len(seen)

    total = 0
    e = 10_000  # an epoch id no other pass uses
    for ex in stages:
        ex._start_epoch(e)
    for ex in stages:
        for c in range(ex.num_chunks):
            ex.forward(c, e)
            h_in, sh_in, out, sh_out, loss, *_ = ex.stage._saved.pop((e, c))
            total += walk([t.grad_fn for t in (loss, out, sh_out) if t is not None and t.grad_fn is not None])
    for ex in stages:
        ex._started.discard(e)
        ex.stage.pop_loss(e)
        ex.comm.box.clear()
    single.model.train()
    logits = single.model(single.x, single.ops.aggregate)
    loss = masked_loss(logits, single.data.y, single.data.train_mask, single.num_train)
    return total, walk([loss.grad_fn])


if __name__ == "__main__":
    main()
