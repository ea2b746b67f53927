"""Timing the layer units: the chunk passes every fit is made of, the optimizer step, the subgraph the runtime's
own costs are measured on.

For each distinct kind of layer unit (units with the same class, widths and aggregation
kinds cost the same; GCNII's 32 layers are one kind) the forward and the backward seconds of one chunk
are fitted, by non-negative least squares, as ``t = a + b·rows + c·halo + e·nnz`` — ``rows`` the chunk's
vertices, ``halo`` the distinct vertices of other chunks its aggregation reads, ``nnz`` its in-edges —
on chunks of several sizes measured as the pipeline runs them (the history-backed chunk op and the fused
chunk step of :func:`gnnpipe.core.runtime.profile.profile_unit_costs`, in a gpipe stage's order, one METIS chunking of
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
with fewer cores than ranks is modelled by the simulation (:mod:`gnnpipe.costmodel.predict`), not by noise.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from .record import unit_key


def _representatives(config, F: int, Cls: int):
    """``(model to time, {key: unit index in it})``: a 2-layer model when its unit kinds cover the full
    model's (they do for the zoo's models), else the full model."""
    import attrs as _attrs

    from ...core.training.trainer import make_model

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
    return dict(units=[unit_key(u) for u in full.units],
                unit_dims=[(int(u.in_dim), int(u.out_dim)) for u in full.units],
                agg_dims=[[int(getattr(u, "agg_dim", u.in_dim))] * len(u.aggregations) for u in full.units],
                agg_kinds=[list(u.aggregations) for u in full.units], shared_dim=int(sd),
                num_nodes=int(data.num_nodes), num_edges=int(data.edge_index.size(1)), num_features=F,
                num_classes=Cls)


def _subgraph(data, n: int):
    """The subgraph induced by the (relabelled) vertices ``[0, n)`` with features, labels and masks, as a rank's
    executor needs them (at least one training vertex, so that the loss is defined)."""
    from torch_geometric.data import Data

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


def _units_cpu(model, data, ptr: list[int], repeats: int, fused: bool = True):
    """Measured thread CPU seconds of every unit of ``model`` on the chunks ``ptr`` of ``data`` (the chunk op):
    :class:`~gnnpipe.partitioners.UnitPhases` (forward and backward per unit and chunk)."""
    from ...core.runtime.profile import profile_unit_costs

    return profile_unit_costs(model, data, repeats=repeats, chunk_ptr=torch.tensor(ptr), phases=True,
                              clock=time.thread_time, fused=fused, reduce=REDUCE)


#: how the timed passes of a measurement are reduced: the median (a typical pass, which is what an epoch costs);
#: the minimum of every unit, chunk and phase separately sums to less than any real pass (measured on a quiet
#: machine: predictions 0.6-0.9x of the measured epochs with the minimum, docs/RESULTS.md §14f)
REDUCE = "median"


def _epoch_cpu(executor, repeats: int) -> float:
    """The median thread CPU seconds of ``executor.train_epoch`` over ``repeats`` epochs after one warm-up."""
    executor.train_epoch(0)  # warm-up: allocates history and the autograd buffers
    cpus = []
    for e in range(1, 1 + max(1, repeats)):
        c0 = time.thread_time()
        executor.train_epoch(e)
        cpus.append(time.thread_time() - c0)
    return float(statistics.median(cpus))


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


def _time_step(model, config) -> float:
    """Seconds per parameter of one Adam step (the mean of 3 after a warm-up), thread CPU time."""
    from ...core.runtime.stage import make_optimizer_for

    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    if n == 0:
        return 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = make_optimizer_for(model, config, range(model.num_units))
    saved = [p.detach().clone() for p in params]
    opt.step()
    t0 = time.thread_time()
    for _ in range(3):
        opt.step()
    dt = (time.thread_time() - t0) / 3
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
            p.grad = None
    return dt / n
