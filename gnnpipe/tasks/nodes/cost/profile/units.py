"""Timing the layer units: the chunk passes every fit is made of, the optimizer step, the subgraph the runtime's
own costs are measured on.

For each distinct kind of layer unit (units with the same class, widths and aggregation
kinds cost the same; GCNII's 32 layers are one kind) the forward and the backward seconds of one chunk
are fitted, by non-negative least squares, as ``t = a + b·rows + c·halo + e·nnz`` — ``rows`` the chunk's
vertices, ``halo`` the distinct vertices of other chunks its aggregation reads, ``nnz`` its in-edges —
on chunks of several sizes measured as the pipeline runs them (the history-backed chunk op and the fused
chunk step of :func:`gnnpipe.tasks.nodes.profile.profile_unit_costs`, in a gpipe stage's order, one METIS chunking of
``16`` chunks merged into ``4`` and ``2``) and on the whole graph in the order the single process trains it
(``halo = 0``). The cost per row is not constant (a chunk that stays in the caches is cheaper per row than a
part that streams from memory), so each chunking's measured / fitted ratio is kept as a size factor at its mean
chunk rows (:func:`.record.size_factor`): the fit extrapolates to any chunk count and to a graph-parallel way's part
(its rows and halo), and is right where it was measured. Units that fuse their chunk step in a pipeline also
get the ratio of their plain path (:attr:`.record.UnitKind.unfused`).

Timing: every unit's forward and backward is timed by the CPU time of this thread (``time.thread_time``
through the profiler's ``clock``), which other processes on a busy machine do not inflate; the wall time of
the profile passes is measured beside it, and ``cpu_over_wall`` (their ratio; 1.0 on a quiet machine, 0.4
with two busy co-tenants per core) is reported. The predictions are thus of the work itself, and a machine
with fewer cores than ranks is modelled by the simulation (:mod:`gnnpipe.tasks.nodes.cost.epoch_time`), not by
noise.

Repeats: every measurement is repeated and reduced by :mod:`.robust` (a low quantile: noise on a shared machine
only adds time; the spread of the repeats is recorded). Repeats of different measurements are interleaved
(:func:`_interleaved`: one pass of each in turn, round after round), so that a burst of load hits one repeat of
each, not every repeat of one.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs as _attrs
import numpy as np
import torch
from torch_geometric.data import Data

from .....costmodel.robust import clean_passes, low
from .....partitioners import UnitPhases
from ... import profile as runtime_profile
from ...graph import GraphOps
from ...profile import _chunk_aggregators
from ...stage import make_optimizer_for
from ...trainer import make_model
from .record import unit_key


def _representatives(config, F: int, Cls: int):
    """``(model to time, {key: unit index in it})``: a 2-layer model when its unit kinds cover the full
    model's (they do for the zoo's models), else the full model."""
    full = make_model(config, F, Cls)
    keys = [unit_key(u) for u in full.units]
    small = make_model(_attrs.evolve(config, layers=min(config.layers, 2)), F, Cls)
    small_keys = [unit_key(u) for u in small.units]
    if set(keys) <= set(small_keys):
        model = small
        rep = {}
        for i, k in enumerate(small_keys):
            rep.setdefault(k, i)
    else:
        model = full
        rep = {}
        for i, k in enumerate(keys):
            rep.setdefault(k, i)
    return full, model, rep


def _model_fields(full, data, F: int, Cls: int) -> dict:
    """The :class:`Profile` fields that describe the model and the graph (no measurement)."""
    sd = full.units[0].out_dim if full.shared_tensor else 0
    return {"units": [unit_key(u) for u in full.units],
            "unit_dims": [(int(u.in_dim), int(u.out_dim)) for u in full.units],
            "agg_dims": [[int(getattr(u, "agg_dim", u.in_dim))] * len(u.aggregations) for u in full.units],
            "agg_kinds": [list(u.aggregations) for u in full.units], "shared_dim": int(sd),
            "num_nodes": int(data.num_nodes), "num_edges": int(data.edge_index.size(1)), "num_features": F,
            "num_classes": Cls}


def _subgraph(data, n: int):
    """The subgraph induced by the (relabelled) vertices ``[0, n)`` with features, labels and masks, as a rank's
    executor needs them (at least one training vertex, so that the loss is defined)."""
    ei = data.edge_index
    keep = (ei < n).all(0)
    sub = Data(x=data.x[:n], edge_index=ei[:, keep], y=data.y[:n], num_nodes=n)
    for m in ("train_mask", "val_mask", "test_mask"):
        if getattr(data, m, None) is not None:
            sub[m] = getattr(data, m)[:n].clone()
    if getattr(data, "edge_weight", None) is not None:
        sub.edge_weight = data.edge_weight[keep]
    if getattr(sub, "train_mask", None) is None:
        sub.train_mask = torch.zeros(n, dtype=torch.bool)
    if not bool(sub.train_mask.any()):
        sub.train_mask[0] = True
    return sub


@contextlib.contextmanager
def _passes_of(model):
    """Around timed passes of ``model``'s units: training mode, no ``.grad``, the global RNG seeded and restored
    afterwards with the model's ``.grad`` tensors and training flag (as ``profile_unit_costs`` runs them)."""
    params = list(model.parameters())
    saved = [p.grad for p in params]
    was_training = model.training
    try:
        for p in params:
            p.grad = None
        model.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            yield
    finally:
        for p, g in zip(params, saved):
            p.grad = g
        model.train(was_training)


def _graph_ops(data):
    """The aggregation operators of ``data``'s graph (``GraphOps``), for :func:`_unit_pass` to share."""
    return GraphOps(data.edge_index, int(data.x.size(0)), dtype=data.x.dtype,
                    edge_weight=getattr(data, "edge_weight", None))


def _unit_pass(model, data, ptr: Sequence[int] | None = None, fused: bool = True, graph_ops=None) -> Callable:
    """``one_pass(clock) -> (forward, backward)``, each ``[unit][chunk]`` seconds: one pass of every unit of ``model``
    over ``data`` in a gpipe stage's order (:func:`gnnpipe.tasks.nodes.profile.profile_unit_costs`' pass): on the
    chunks ``ptr`` with the pipeline's history-backed chunk op (``fused``: the fused chunk step where a unit has
    one), or without ``ptr`` on the whole graph with the exact full-graph op. The op and its history buffers are
    made once, on the first pass (run one untimed), and kept; ``.grad`` is cleared after every pass. Run it
    inside :func:`_passes_of`. ``graph_ops``: :func:`_graph_ops` of ``data``, when the caller shares it."""
    x = data.x
    n = int(x.size(0))
    ops = _graph_ops(data) if graph_ops is None else graph_ops
    if ptr is None:
        ranges = [(0, n)]

        def aggregator(unit, i, c, dtype, device):
            return ops.aggregate
    else:
        bounds = [int(v) for v in ptr]
        ranges = list(itertools.pairwise(bounds))
        aggregator = _chunk_aggregators(ops, ranges, n, fused)
    units = list(model.units)
    params = list(model.parameters())

    def one_pass(clock) -> tuple[list, list]:
        fw = [[0.0] * len(ranges) for _ in units]
        bw = [[0.0] * len(ranges) for _ in units]
        try:
            runtime_profile._chunk_major_pass(units, x, ranges, aggregator, clock, fw, bw)
        finally:
            for p in params:
                p.grad = None
        return fw, bw

    return one_pass


def _epoch_run(executor) -> Callable:
    """``run(clock) -> seconds``: one ``executor.train_epoch`` (epochs numbered on), timed by ``clock``."""
    epochs = iter(range(1 << 30))

    def run(clock) -> float:
        e = next(epochs)
        c0 = clock()
        executor.train_epoch(e)
        return clock() - c0

    return run


def _interleaved(jobs: Sequence[Callable], repeats: int, clock: Callable = time.thread_time) -> list[list[Any]]:
    """Run every job once untimed (the warm-up: a pass allocates its history and the autograd buffers), then
    ``repeats`` rounds of one run of each job in turn; returns each job's ``repeats`` results. A burst of load
    then hits one repeat of several measurements, not every repeat of one (the reductions of :mod:`.robust`
    drop it)."""
    for job in jobs:
        job(clock)
    out: list[list[Any]] = [[] for _ in jobs]
    for _ in range(max(1, int(repeats))):
        for k, job in enumerate(jobs):
            out[k].append(job(clock))
    return out


def _phases(passes) -> tuple[Any, list[float]]:
    """``(UnitPhases, each pass's total)`` of timed passes (:func:`.robust.clean_passes`)."""
    fw, bw, totals = clean_passes(passes)
    return UnitPhases(forward=fw, backward=bw), totals


def _units_cpu(model, data, ptr: list[int], repeats: int, fused: bool = True):
    """Measured thread CPU seconds of every unit of ``model`` on the chunks ``ptr`` of ``data`` (the chunk op):
    :class:`~gnnpipe.partitioners.UnitPhases` (forward and backward per unit and chunk), ``repeats`` passes after a
    warm-up reduced by :func:`.robust.clean_passes`."""
    with _passes_of(model):
        passes, = _interleaved([_unit_pass(model, data, ptr, fused)], repeats)
    return _phases(passes)[0]


#: how the timed passes of a unit measurement are reduced (:func:`.robust.clean_passes`): the slower half of the
#: passes dropped whole, each unit, chunk and phase the median of the rest — a low quantile of whole passes (noise
#: on a shared machine only adds time). Not the minimum of each unit, chunk and phase separately: that sums to less
#: than any real pass (measured on a quiet machine: predictions 0.6-0.9x of the measured epochs, docs/RESULTS.md
#: §14f)
REDUCE = "clean-median"


def _epoch_cpu(executor, repeats: int) -> float:
    """The thread CPU seconds of ``executor.train_epoch``, the low quantile (:func:`.robust.low`) of ``repeats``
    epochs after one warm-up."""
    runs, = _interleaved([_epoch_run(executor)], repeats)
    return low(runs)


def _fit_per_op(rows_A: list, rows_y: list, points: list) -> tuple[float, float, list]:
    """``(seconds per op and direction, seconds per exchanged element, points)``: the non-negative least-squares
    fit of the residual seconds ``rows_y`` on ``rows_A = [[directions, elements], …]``, relative (the small
    subgraph counts as much as the large one); ``(0, 0, points)`` when no op was timed."""
    from scipy.optimize import nnls

    if not rows_A or not any(r[0] for r in rows_A):
        return 0.0, 0.0, points
    A, y = np.array(rows_A), np.array(rows_y)
    scale = np.maximum(np.abs(y), 1e-5)
    coef, _ = nnls(A / scale[:, None], y / scale)
    return float(coef[0]), float(coef[1]), points


def _time_step(model, config, repeats: int = 5, out: list | None = None) -> float:
    """Seconds per parameter of one Adam step, thread CPU time: the low quantile (:func:`.robust.low`) of
    ``repeats`` steps after a warm-up. ``out``: receives every step's seconds per parameter (their spread)."""
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    if n == 0:
        return 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = make_optimizer_for(model, config, range(model.num_units))
    saved = [p.detach().clone() for p in params]
    opt.step()
    steps = []
    for _ in range(max(1, int(repeats))):
        t0 = time.thread_time()
        opt.step()
        steps.append((time.thread_time() - t0) / n)
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
            p.grad = None
    if out is not None:
        out.extend(steps)
    return low(steps)
