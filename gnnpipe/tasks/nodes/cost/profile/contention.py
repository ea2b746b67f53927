"""Contention between ranks that compute at once on one CPU node.

The first chunking is timed again while every other core of the machine runs the same passes
(:func:`measure_contention`, forked co-runners): per unit kind and phase the ratio of the two, which the
prediction applies to ranks of one CPU node that compute at the same time (they share its caches and memory
bandwidth; a whole-graph profile in one process cannot see it); and, asked about more ranks than cores, with
that many processes time-sliced on the cores (a rank switched back in finds its data evicted).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import sys
import time

import torch

from .....costmodel.hardware import cores_here
from .....costmodel.robust import low, spread
from ... import profile as runtime_profile
from ...graph import GraphOps
from ...profile import _chunk_aggregators


class _Paused(Exception):
    """Raised by a co-runner's clock when it is told to pause (ends its pass at the next unit)."""


def _co_runner(one_pass, threads: int, run, stop, ready) -> None:
    """A forked co-runner of :func:`measure_contention`: ``one_pass(clock)`` while ``run`` is set, abandoned at
    the next unit when it is cleared, until ``stop`` is set."""
    torch.set_num_threads(threads)

    def clock() -> float:
        if stop.is_set() or not run.is_set():
            raise _Paused
        return time.thread_time()

    ready.set()
    while not stop.is_set():
        if not run.wait(0.05):
            continue
        try:
            one_pass(clock)
        except _Paused:
            pass


def measure_contention(model, data, ptr: list[int], repeats: int = 3, *, processes: int | None = None,
                       threads: int = 1, timeout_s: float | None = 120.0,
                       spreads: list | None = None) -> tuple[list | None, int]:
    """How much slower ``model``'s units run on the chunks ``ptr`` of ``data`` while the node's other cores run the
    same passes: ``(ratios, processes)`` — ``ratios[i] = (forward, backward)`` of unit ``i``, loaded over alone —
    or ``(None, 0)`` where it cannot be measured.

    ``processes − 1`` co-runners (default: this machine's cores, so that every core computes) are forked — they
    share the graph and the model with this process, nothing is copied — and run the passes of
    :func:`gnnpipe.tasks.nodes.profile.profile_unit_costs` (a gpipe stage's order, the history-backed chunk op with
    full-graph history buffers) on the chunks of ``ptr`` whenever they are told to. This process then times,
    ``repeats`` times, one pass alone and one pass with the co-runners running, back to back (thread CPU of every
    unit on every chunk), so that the machine's drift, which on a shared VM is larger than the effect within
    minutes, hits both alike; a unit's ratio is the low quantile (:func:`.robust.low`) of its summed chunk seconds
    loaded over the same of its seconds alone (noise from outside only adds time, to either side; a median of the
    pairs' ratios would fall with a burst during an alone pass). ``spreads``: receives the spread of the loaded
    passes' totals (:func:`.robust.spread`). What it measures is what ranks of one node do to each other when they
    compute at once: they share the last level cache and the memory bandwidth (on this 2-core VM 1.0–1.15×, with
    the host's load; a dense unit's matrix products barely slow, a sparse product and the element-wise ops do). With
    ``processes`` above the cores they are also time-sliced, and a process switched back in finds its data evicted
    (4 on the 2 cores here: 1.06–1.31× forward, 1.16–1.59× backward); the core time a blocking wait costs is
    modelled apart (:func:`~gnnpipe.tasks.nodes.cost.host_costs.shared_cores_bound`). Source: docs/RESULTS.md §14i.

    Not measured (``(None, 0)``): fewer than 2 cores, no ``fork`` start method (not Linux), a co-runner that did
    not start within ``timeout_s``.
    """
    procs_n = int(processes or cores_here())
    if procs_n < 2 or not sys.platform.startswith("linux") or "fork" not in mp.get_all_start_methods():
        return None, 0
    n = int(data.x.size(0))
    ranges = list(itertools.pairwise(ptr))
    ops = GraphOps(data.edge_index, n, dtype=data.x.dtype, edge_weight=getattr(data, "edge_weight", None))
    aggregator = _chunk_aggregators(ops, ranges, n, True)  # full-graph history buffers, as in a stage
    units = list(model.units)
    U = len(units)
    params = list(model.parameters())
    saved_grads = [q.grad for q in params]
    was_training = model.training

    def one_pass(clock) -> tuple[list[float], list[float]]:
        fw = [[0.0] * len(ranges) for _ in units]
        bw = [[0.0] * len(ranges) for _ in units]
        try:
            runtime_profile._chunk_major_pass(units, data.x, ranges, aggregator, clock, fw, bw)
        finally:
            for q in params:
                q.grad = None
        return [sum(f) for f in fw], [sum(b) for b in bw]

    ctx = mp.get_context("fork")
    run, stop = ctx.Event(), ctx.Event()
    readies = [ctx.Event() for _ in range(procs_n - 1)]
    pairs: list[tuple] = []
    procs: list = []
    try:
        for q in params:
            q.grad = None
        model.train()
        # forked with the model in training mode and no .grad: the co-runners' passes are this process's
        procs += [ctx.Process(target=_co_runner, args=(one_pass, int(threads), run, stop, r), daemon=True)
                  for r in readies]
        for pr in procs:
            pr.start()
        deadline = time.monotonic() + float(timeout_s if timeout_s is not None else 120.0)  # None: config's derived
        for r, pr in zip(readies, procs):
            while not r.wait(0.2):
                if not pr.is_alive() or time.monotonic() > deadline:
                    return None, 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            one_pass(time.thread_time)  # warm-up (allocates the scratch history)
            for _ in range(max(1, int(repeats))):
                alone = one_pass(time.thread_time)
                run.set()
                time.sleep(0.01)  # the co-runners start a pass
                loaded = one_pass(time.thread_time)
                run.clear()
                pairs.append((alone, loaded))
    finally:
        stop.set()
        run.clear()
        for pr in procs:
            pr.join(timeout=60)
            if pr.is_alive():  # pragma: no cover - a co-runner stuck in a unit
                pr.kill()
                pr.join(timeout=10)
        for q, g in zip(params, saved_grads):
            q.grad = g
        model.train(was_training)

    def ratio(i: int, ph: int) -> float:
        alone = low([al[ph][i] for al, _ in pairs])
        return low([lo[ph][i] for _, lo in pairs]) / alone if alone > 0 else 1.0

    if spreads is not None:
        spreads.append(spread([sum(lo[0]) + sum(lo[1]) for _, lo in pairs]))
    return [(ratio(i, 0), ratio(i, 1)) for i in range(U)], procs_n
