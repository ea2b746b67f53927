"""The runtime's own costs, measured on the subgraph of the first few thousand (relabelled) vertices, where
the units' cost that the difference removes is small: the pipeline's per chunk action (a one-stage executor
against its units, :func:`_action_overhead`), graph parallelism's per op and direction (:func:`_gp_overhead`:
both ways of a 2-way split run by the real executor without peers) and a hybrid's (:func:`_hybrid_overhead`).
Each is the difference between the real executor's epoch and its units' time (:mod:`.units`), their repeats
interleaved (a unit pass, then an epoch of each executor, round after round: both sides of the difference see the
same stretch of the machine) and each side reduced to its low quantile (:mod:`.robust`); the spread of the epochs
is recorded relative to the difference. Last, the executor against the units' fit on the whole graph
(:func:`_executor_scale`).
"""

from __future__ import annotations

import copy
import itertools
import types
from collections.abc import Sequence
from typing import Any

import attrs as _attrs
import numpy as np
import torch

from ..... import correctors as corr
from .....core.comm import Comm
from .....core.run.launch import spawn
from .....costmodel.robust import MAX_SPREAD, high, low, spread
from .....schedulers import get as get_scheduler
from ...parallel import make_graph_parallel_way, make_hybrid_member, send_lists
from ...pipeline import make_pipeline_stage
from ...runner import _order_policy
from ...trainer import make_model
from .record import chunk_features
from .units import _epoch_run, _fit_per_op, _interleaved, _passes_of, _phases, _subgraph, _unit_pass


def _action_overhead(config, model, sub, ptr: list[int], repeats: int, step_pp: float) -> tuple[float, Any, float]:
    """Thread CPU seconds per chunk action of the real pipeline runtime beyond its units: one pipeline executor
    (:func:`~gnnpipe.tasks.nodes.pipeline.make_pipeline_stage`) holding every unit of ``model``, run as a single stage
    (no communication) over the chunks ``ptr`` of the subgraph ``sub`` with the configured correctors and gpipe,
    against the same units measured on the same chunks (a copy of ``model``, its passes interleaved with the
    executor's epochs) and the optimizer step. Measured on a subgraph of a few thousand vertices: the units' own
    cost, which the difference removes, stays small there, so the difference is not the noise of a large one (a
    wide encoder's). Returns ``(seconds per action, the units' measured phases, the spread of the epochs relative
    to the runtime's part of them)``."""
    C = len(ptr) - 1
    cfg = _attrs.evolve(config, stages=1, ways=1, chunks=C, scheduler="gpipe", stash_weights=False)
    correctors = corr.build_correctors(cfg.correctors)
    U = model.num_units
    timed = copy.deepcopy(model)  # the units' passes: gradients of their own, the executor's model untouched
    stage = make_pipeline_stage(cfg, model, sub, torch.tensor(ptr), [0, U], 0, [0], get_scheduler("gpipe")(),
                                _order_policy(cfg, correctors), correctors, Comm())
    with _passes_of(timed):
        passes, epochs = _interleaved([_unit_pass(timed, sub, ptr), _epoch_run(stage)], repeats)
    units = _phases(passes)[0]
    units_s = sum(sum(f) + sum(b) for f, b in zip(units.forward, units.backward))
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    epoch = low(epochs)
    runtime_s = epoch - units_s - step_pp * params
    return max(0.0, runtime_s / (2 * C)), units, spread(epochs, epoch, scale=runtime_s)


def _executor_stage(config, model, data, ptr: list[int]):
    """One executor holding every unit of ``model`` (the full model), a single stage with gpipe over the chunks
    ``ptr`` of ``data`` (the whole relabelled graph's base chunking): what :func:`_executor_scale` times."""
    C = len(ptr) - 1
    cfg = _attrs.evolve(config, stages=1, ways=1, chunks=C, scheduler="gpipe", stash_weights=False)
    correctors = corr.build_correctors(cfg.correctors)
    return make_pipeline_stage(cfg, model, data, torch.tensor(ptr), [0, model.num_units], 0, [0],
                               get_scheduler("gpipe")(), _order_policy(cfg, correctors), correctors, Comm())


def _executor_scale(epochs: Sequence[float], fitted_s: float, overhead_s: float, step_pp: float, params: int,
                    chunks: int) -> tuple[float, float]:
    """The pipeline executor's units over their fitted cost (:attr:`Profile.executor_scale`) and its spread: the
    :func:`_executor_stage`'s epoch thread CPU seconds (``epochs``, its timed repeats; their low quantile) less the
    optimizer step of its ``params`` and ``overhead_s`` per chunk action of its ``chunks``, over ``fitted_s`` (the
    fitted seconds of the same units on the same chunks). Below 1 where the executor runs a stage's units back to
    back on a chunk faster than the units timed one by one, or where the fit lies above the chunks' measured cost;
    clipped to ``[0.5, 2]``; 1.0 (spread 0) when nothing was fitted or timed."""
    if fitted_s <= 0 or not epochs:
        return 1.0, 0.0
    epoch = low(epochs)
    units_s = epoch - step_pp * params - 2 * chunks * overhead_s
    return float(min(2.0, max(0.5, units_s / fitted_s))), spread(epochs, epoch, scale=units_s)


class _LocalComm:
    """A graph-parallel way's communication without peers (profiling): an exchange fills the receive buffers
    with zeros, an all-reduce returns its input; bytes are not counted."""

    def exchange(self, sends, recvs, tag, kind) -> None:
        for b, _ in recvs:
            b.zero_()

    def all_reduce(self, tensor, group=None, kind: str = "weight"):
        return tensor

    def wait_sends(self) -> None:
        pass


def _gp_overhead(config, make, sub_sizes: Sequence[int], data, repeats: int, step_pp: float,
                 agg_dims: list, back_units: set) -> tuple[float, float, list, float]:
    """Graph parallelism's bookkeeping beyond its units (:attr:`Profile.gp_op_s`, :attr:`Profile.gp_op_s_per_elem`):
    for each subgraph ``[0, n)`` of the relabelled ``data``, ``n`` in ``sub_sizes``, both ways of a 2-way split at
    ``n/2`` run as the runtime runs them (:func:`~gnnpipe.tasks.nodes.parallel.make_graph_parallel_way`, the halo op,
    the weight all-reduce and one Adam step) with :class:`_LocalComm`; each way's epoch CPU time minus the plain
    units measured on the same rows (``fused=False``; the units' passes and both ways' epochs interleaved, each
    reduced to its low quantile) and the step is fitted, by non-negative least squares, as
    ``a · (op directions) + b · Σ (rows + halo) · d`` over the way's aggregation ops and directions (forward;
    backward where the op's input takes a gradient). Returns ``(a, b, points, spread)``: the spread of the epochs
    relative to the residuals (:func:`_residual_spread`)."""
    cfg = _attrs.evolve(config, ways=2, stages=1, chunks=None, correctors=[], scheduler="gpipe", stash_weights=False)
    rows_A, rows_y, points = [], [], []
    for n in sorted({int(v) for v in sub_sizes if v >= 16}, reverse=True):
        sub = _subgraph(data, n)
        ptr = [0, n // 2, n]
        model = make()
        feats = chunk_features(sub.edge_index, ptr)
        plan = types.SimpleNamespace(data=sub, chunk_ptr=torch.tensor(ptr), way_ptr=torch.tensor([0, 1, 2]))
        ways = [make_graph_parallel_way(cfg, make(), plan, w, _LocalComm(), ranks=[0, 1]) for w in range(2)]
        with _passes_of(model):
            passes, *runs = _interleaved([_unit_pass(model, sub, ptr, fused=False)] + [_epoch_run(ex) for ex in ways],
                                         repeats)
        units = _phases(passes)[0]
        for w, ex in enumerate(ways):
            epoch = low(runs[w])
            own = sum(f[w] + b[w] for f, b in zip(units.forward, units.backward))
            params = sum(p.numel() for p in ex.params)
            dirs = elems = 0.0
            width = float(feats[w][1] + feats[w][2])
            for u, dims in enumerate(agg_dims):
                for d in dims:
                    k = 2 if u in back_units else 1
                    dirs += k
                    elems += k * width * d
            resid = epoch - own - step_pp * params
            rows_A.append([dirs, elems])
            rows_y.append(resid)
            points.append({"rows": n, "way": w, "epoch_s": epoch, "epoch_high_s": high(runs[w]), "units_s": own,
                           "residual_s": resid})
    return (*_fit_per_op(rows_A, rows_y, points), _residual_spread(points))


def _residual_spread(points: list) -> float:
    """The spread of a per-op fit (:mod:`.robust`): the epochs' high quantile above the low one, summed over the
    points, over the positive residuals summed (0 without any), at most ``MAX_SPREAD``."""
    extra = sum(max(0.0, p["epoch_high_s"] - p["epoch_s"]) for p in points)
    base = sum(max(0.0, p["residual_s"]) for p in points)
    return float(min(MAX_SPREAD, extra / base)) if base > 0 else 0.0


def _peer_rows(edge_index, ptr: list[int], way_ptr: list[int]) -> dict:
    """``{(chunk, backward): rows}`` a hybrid way exchanges for ``chunk`` per op: the rows it sends to the peers
    plus the rows it receives from the peers' chunks of the same slot
    (:func:`~gnnpipe.tasks.nodes.parallel.send_lists`)."""
    W = len(way_ptr) - 1
    rows = [ptr[w] for w in way_ptr]
    way_of = torch.repeat_interleave(torch.arange(W), torch.tensor(np.diff(rows)))
    chunk_of = torch.repeat_interleave(torch.arange(len(ptr) - 1), torch.tensor(np.diff(ptr)))
    out: dict = {}
    for backward in (False, True):
        for (c, q), idx in send_lists(edge_index, chunk_of, way_of, W, backward=backward).items():
            w = int(np.searchsorted(way_ptr, c, side="right") - 1)
            peer = way_ptr[q] + (c - way_ptr[w])  # way q's chunk of the same slot receives them
            out[(c, backward)] = out.get((c, backward), 0) + int(idx.numel())
            out[(peer, backward)] = out.get((peer, backward), 0) + int(idx.numel())
    return out


def _hybrid_overhead(config, make, data, sub_sizes: Sequence[int], repeats: int, step_pp: float, action_s: float,
                     agg_dims: list, back_units: set) -> tuple[float, float, list, float]:
    """A hybrid's bookkeeping per aggregation op and direction of a chunk action beyond the pipeline's per-action
    cost (:attr:`Profile.hybrid_op_s`, :attr:`Profile.hybrid_op_s_per_elem`): for each subgraph ``[0, n)`` of the
    relabelled ``data``, ``n`` in ``sub_sizes``, both ways of a 2-way, one-stage hybrid over 8 chunks run as the
    runtime runs them (:func:`~gnnpipe.tasks.nodes.parallel.make_hybrid_member`: the peer op, which gathers the rows it
    sends and writes the peers' rows into history, and the correctors' hooks for the peers' chunks) with
    :class:`_LocalComm`; each way's epoch CPU time minus its plain units on its chunks (``fused=False``; passes and
    epochs interleaved, each reduced to its low quantile), the step and ``action_s`` per action is fitted, by
    non-negative least squares, as ``a · (op directions) + b · Σ (rows exchanged) · d``. Returns ``(a, b, points,
    spread)`` (:func:`_residual_spread`)."""
    rows_A, rows_y, points = [], [], []
    for n in sorted({int(v) for v in sub_sizes if v >= 64}, reverse=True):
        sub = _subgraph(data, n)
        C = 8
        ptr = [round(k * n / C) for k in range(C + 1)]
        way_ptr = [0, C // 2, C]
        cfg = _attrs.evolve(config, ways=2, stages=1, chunks=C, scheduler="gpipe", stash_weights=False)
        peer = _peer_rows(sub.edge_index, ptr, way_ptr)
        members = []
        for w in range(2):
            model = make()
            plan = types.SimpleNamespace(data=sub, chunk_ptr=torch.tensor(ptr), way_ptr=torch.tensor(way_ptr),
                                         bounds=[0, model.num_units])
            correctors = corr.build_correctors(cfg.correctors)
            members.append(make_hybrid_member(cfg, model, plan, w, 0, get_scheduler("gpipe")(),
                                              _order_policy(cfg, correctors), correctors, _LocalComm(), None, None))
        timed = make()
        with _passes_of(timed):
            passes, *runs = _interleaved([_unit_pass(timed, sub, ptr, fused=False)]
                                         + [_epoch_run(ex) for ex in members], repeats)
        units = _phases(passes)[0]
        for w, ex in enumerate(members):
            epoch = low(runs[w])
            own = range(way_ptr[w], way_ptr[w + 1])
            units_s = sum(f[c] + b[c] for f, b in zip(units.forward, units.backward) for c in own)
            params = sum(p.numel() for p in ex.params)
            dirs = elems = 0.0
            for c in own:
                for u, dims in enumerate(agg_dims):
                    for d in dims:
                        dirs += 1
                        elems += peer.get((c, False), 0) * d
                        if u in back_units:
                            dirs += 1
                            elems += peer.get((c, True), 0) * d
            resid = epoch - units_s - step_pp * params - 2 * len(own) * action_s
            rows_A.append([dirs, elems])
            rows_y.append(resid)
            points.append({"rows": n, "way": w, "epoch_s": epoch, "epoch_high_s": high(runs[w]), "units_s": units_s,
                           "residual_s": resid})
    return (*_fit_per_op(rows_A, rows_y, points), _residual_spread(points))


def _pipeline_rank(rank: int, world: int, config, small_cfg, F: int, Cls: int, sub, ptr: list[int],
                   repeats: int) -> dict:
    """One rank of :func:`_pipeline_overhead`: stage ``rank`` of a 2-stage gpipe pipeline of ``small_cfg``'s
    model over the chunks ``ptr`` of ``sub``, with the configured correctors and real communication; the low and
    the high quantile of its epoch thread CPU time (:mod:`.robust`) over ``repeats`` epochs after one warm-up, its
    units, and their seconds on the same chunks (``units_s``) timed in this rank, a pass of a copy of the model
    before each epoch (the difference is then taken within one process, each side at the same moments)."""
    torch.set_num_threads(config.threads)
    model = make_model(small_cfg, F, Cls)
    U = model.num_units
    bounds = [0, U // 2, U]
    lo, hi = bounds[rank], bounds[rank + 1]
    cfg = _attrs.evolve(config, stages=2, ways=1, chunks=len(ptr) - 1, scheduler="gpipe", stash_weights=False)
    correctors = corr.build_correctors(cfg.correctors)
    timed = copy.deepcopy(model)  # the units' passes: gradients of their own, the stage's model untouched
    ex = make_pipeline_stage(cfg, model, sub, torch.tensor(ptr), bounds, rank, [0, 1], get_scheduler("gpipe")(),
                             _order_policy(cfg, correctors), correctors, Comm())
    with _passes_of(timed):
        passes, runs = _interleaved([_unit_pass(timed, sub, ptr), _epoch_run(ex)], repeats)
    units = _phases(passes)[0]
    units_s = sum(sum(units.forward[i]) + sum(units.backward[i]) for i in range(lo, hi))
    return {"cpu_s": low(runs), "cpu_high_s": high(runs), "units": (lo, hi), "rank_units_s": units_s,
            "params": sum(p.numel() for p in ex.params), "width": ex.stage.output_width() if rank == 0 else 0}


def _pipeline_overhead(config, small_cfg, F: int, Cls: int, sub, ptr: list[int], units, repeats: int,
                       step_pp: float, outs: list | None = None) -> tuple[float, list, float]:
    """Thread CPU seconds per chunk action of the runtime in a real 2-rank pipeline beyond its units: both stages
    of a 2-stage pipeline over the chunks ``ptr`` of the subgraph ``sub`` run as the runtime runs them
    (:func:`_pipeline_rank`: pre-posted receives, the boundary tensors and their gradients, the sends), each
    rank's epoch CPU time (low quantile) minus its units on the same chunks (timed in the rank, ``rank_units_s``;
    else ``units``, measured in this process) and the step, per action; the mean over the ranks (at least 0).
    Messages are not subtracted here (the caller does, with the measured CPU per message). ``outs``: the ranks'
    results when they already ran (in the link probe's ranks, :func:`profile_link`); otherwise 2 ranks are started.
    Returns ``(seconds per action, per-rank points, the spread of the ranks' epochs relative to the runtime's part of
    them)``."""
    if outs is None:
        outs = spawn(_pipeline_rank, 2, (config, small_cfg, F, Cls, sub, list(ptr), int(repeats)),
                     timeout_s=config.timeout_s, threads=config.threads)
    C = len(ptr) - 1
    vals, extra = [], []
    for o in outs:
        lo, hi = o["units"]
        units_s = o.get("rank_units_s")
        if units_s is None:
            units_s = sum(sum(units.forward[i]) + sum(units.backward[i]) for i in range(lo, hi))
        vals.append((o["cpu_s"] - units_s - step_pp * o["params"]) / (2 * C))
        extra.append(max(0.0, o.get("cpu_high_s", o["cpu_s"]) - o["cpu_s"]) / (2 * C))
        o["units_s"] = units_s
    outs[0]["rows"] = [b - a for a, b in itertools.pairwise(ptr)]
    per = max(0.0, float(np.mean(vals)))
    return per, outs, float(min(MAX_SPREAD, float(np.mean(extra)) / per)) if per > 0 else 0.0
