"""The unit profiler: seconds of forward and backward of every layer unit (measures; never splits).

The layer partitioners (:mod:`gnnpipe.partitioners.layers`) receive these costs and split; the profiler lives
in the runtime because it runs the units with the runtime's aggregation ops (the pipeline's history-backed
chunk op, :class:`~gnnpipe.core.aggregation.HistoryOp`), as torchgpipe keeps ``profile_times`` apart from
``balance_cost``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, DataValidationError
from ..partitioners import StageSplit, UnitPhases, get_layer_partitioner
from .aggregation import history_op, unit_aggregators
from .graph import GraphOps


def _row_slice_sample(data: Any, k: int) -> Any:
    """The subgraph induced by vertices ``[0, k)``: ``x[:k]`` and the edges among them."""
    from torch_geometric.data import Data

    ei = data.edge_index
    keep = (ei < k).all(0)
    return Data(x=data.x[:k], edge_index=ei[:, keep], num_nodes=k)


def profile_unit_costs(model: Any, data_sample: Any, graph_ops: Any = None, repeats: int = 3,
                       chunk_ptr: Tensor | None = None, *, phases: bool = False) -> "list[float] | UnitPhases":
    """Seconds of forward + backward of every unit of ``model`` on a sample (or on every chunk of a graph).

    Units run in sequence on the sample (unit ``i`` gets unit ``i − 1``'s output, detached, as a leaf
    that requires grad, and the shared tensor likewise; the encoder's input ``x`` does not require grad,
    as in training). Each unit's time covers its forward and the backward of ``out.sum()`` (plus
    ``shared.sum()`` if it produces a new shared tensor).

    * Without ``chunk_ptr``, aggregation is the exact full-graph op on the sample's own graph
      (``GraphOps(sample.edge_index, n).aggregate``).
    * With ``chunk_ptr`` (``LongTensor[C+1]``, chunks = contiguous id ranges, as after
      :class:`~gnnpipe.partitioners.ChunkPlan` relabelling), each unit runs **as the pipeline runs it**:
      chunk by chunk, with the history-backed chunk aggregation op
      (:class:`gnnpipe.core.history.ChunkAggregate` on :class:`~gnnpipe.core.graph.CompactRows`, one
      scratch history per op), and its cost is the sum over chunks. This captures what a whole-graph
      profile misses: a chunk's aggregation also reads its halo from cold history buffers, so
      aggregation units cost relatively more in a pipeline than dense units.

    One untimed warm-up pass, then ``repeats`` timed passes; the **minimum** per unit is reported (noise
    on a shared machine only adds time). The model is run in training mode (dropout on), its
    parameters' ``.grad`` and training flag and the global RNG are restored.

    Args:
        model: a ``GNNModel`` (``.units``: callables ``unit(h, shared, agg) → (h, shared)``).
        data_sample: a PyG ``Data`` with ``x`` (``[n, F]``) and ``edge_index`` (``LongTensor[2, e]``
            within ``[0, n)``).
        graph_ops: optional ``gnnpipe.core.graph.GraphOps`` of the sample (built if ``None``).
        repeats: timed passes (``>= 1``).
        chunk_ptr: optional chunk boundaries (see above); ``chunk_ptr[-1]`` must equal ``n``.
        phases: return a :class:`UnitPhases` (forward and backward seconds per unit and chunk) instead.

    Returns:
        ``list[float]`` of length ``U``, seconds per unit (forward + backward, summed over chunks).

    Raises:
        DataValidationError: the sample lacks ``x`` or ``edge_index``. ConfigError: ``repeats < 1``.
    """
    if int(repeats) != repeats or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1; got {repeats!r}")
    x = getattr(data_sample, "x", None)
    ei = getattr(data_sample, "edge_index", None)
    if x is None or ei is None:
        raise DataValidationError("profiling needs a sample Data with node features x and edge_index")
    if graph_ops is None:
        graph_ops = GraphOps(ei, x.size(0), dtype=x.dtype, edge_weight=getattr(data_sample, "edge_weight", None))
    n = int(x.size(0))
    if chunk_ptr is not None:
        ptr = [int(v) for v in torch.as_tensor(chunk_ptr).tolist()]
        if len(ptr) < 2 or ptr[0] != 0 or ptr[-1] != n or any(b <= a for a, b in zip(ptr, ptr[1:])):
            raise ConfigError(f"chunk_ptr must rise strictly from 0 to the {n} vertices of the sample; got "
                              f"{ptr[:4]}{'…' if len(ptr) > 4 else ''}")
        ranges = list(zip(ptr, ptr[1:]))
        run_unit = _chunked_runner(graph_ops, ranges, n)
    else:
        agg = graph_ops.aggregate

        def run_unit(unit, i, h, shared):
            o, s_o, tf, tb = _timed_unit(unit, h, shared, agg, i > 0)
            return o, s_o, [tf], [tb]

    params = list(model.parameters())
    saved_grads = [p.grad for p in params]
    for p in params:  # backward would otherwise accumulate into the caller's .grad tensors in place
        p.grad = None
    was_training = model.training
    units = list(model.units)
    times: list[list[tuple[list[float], list[float]]]] = [[] for _ in units]
    try:
        model.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for rep in range(int(repeats) + 1):
                h: Tensor = x
                shared: Tensor | None = None
                for i, unit in enumerate(units):
                    h, shared, tf, tb = run_unit(unit, i, h, shared)
                    if rep > 0:
                        times[i].append((tf, tb))
    finally:
        for p, g in zip(params, saved_grads):
            p.grad = g
        model.train(was_training)
    # minimum over repeats, per unit, chunk and phase
    measured = UnitPhases(forward=[[min(rep[0][c] for rep in t) for c in range(len(t[0][0]))] for t in times],
                          backward=[[min(rep[1][c] for rep in t) for c in range(len(t[0][1]))] for t in times])
    return measured if phases else measured.unit_costs()


def _timed_unit(unit: Any, h: Tensor, shared: Tensor | None, agg: Any, input_grad: bool):
    """Forward + backward of one unit on ``h``; returns the detached outputs, forward and backward seconds."""
    h_in = h.detach().requires_grad_(input_grad)
    s_in = None if shared is None else shared.detach().requires_grad_(True)
    t0 = time.perf_counter()
    out, s_out = unit(h_in, s_in, agg)
    loss = out.sum()
    if s_out is not None and s_out is not s_in and s_out.requires_grad:
        loss = loss + s_out.sum()
    t1 = time.perf_counter()
    if loss.requires_grad:
        loss.backward()
    t2 = time.perf_counter()
    return out.detach(), (None if s_out is None else s_out.detach()), t1 - t0, t2 - t1


def _chunked_runner(graph_ops: Any, ranges: list[tuple[int, int]], n: int):
    """``run_unit(unit, i, h, shared) -> (h', shared', forward s per chunk, backward s per chunk)`` running a
    unit chunk by chunk with the pipeline's history-backed aggregation op (see :func:`profile_unit_costs`)."""
    adj: dict = {}  # (kind, chunk) -> row slices, shared by the ops as in a stage
    scratch: dict[int, list] = {}  # one op (with its history) per aggregation, made in the warm-up pass

    def run_unit(unit: Any, i: int, h: Tensor, shared: Tensor | None):
        if i not in scratch:
            scratch[i] = [history_op(unit, kind, n, h.dtype, h.device, "", graph_ops, adj)
                          for kind in getattr(unit, "aggregations", ())]
        ops = scratch[i]
        outs, shs, fw, bw = [], [], [], []
        for c, rows in enumerate(ranges):
            make = unit_aggregators({i: unit}, lambda _, j, t, kind, layer, c=c, rows=rows: ops[j].train(t, c, rows, True, layer))
            o, s_o, tf, tb = _timed_unit(unit, h[rows[0]:rows[1]], None if shared is None else shared[rows[0]:rows[1]],
                                         make(i), i > 0)
            outs.append(o)
            shs.append(s_o)
            fw.append(tf)
            bw.append(tb)
        sh = None if shs[0] is None else torch.cat(shs)
        return torch.cat(outs), sh, fw, bw

    return run_unit


def profiled_split(model: Any, num_stages: int, *, data: Any, repeats: int = 3, sample_nodes: int | None = None,
                   graph_ops: Any = None, chunk_ptr: Tensor | None = None, scheduler: Any = None) -> StageSplit:
    """Measure ``model``'s units on ``data`` (:func:`profile_unit_costs`) and split them with the ``profiled``
    layer partitioner.

    Args:
        data: a PyG ``Data`` with ``x`` and ``edge_index``. sample_nodes: restrict it to the subgraph induced
            by vertices ``[0, sample_nodes)`` (after relabelling: the first chunks); ``chunk_ptr`` is then
            ignored. graph_ops, repeats, chunk_ptr: as :func:`profile_unit_costs`. scheduler: refine the split
            for this schedule's simulated makespan (needs ``chunk_ptr`` with more than one chunk).

    Raises:
        ConfigError: ``S`` out of range or bad profiler arguments.
    """
    from ..partitioners.layers import _check_stages

    _check_stages(model.num_units, num_stages)
    sampled = sample_nodes is not None and sample_nodes < int(data.num_nodes)
    if sampled:
        data = _row_slice_sample(data, int(sample_nodes))
    phases = profile_unit_costs(model, data, graph_ops, repeats=repeats, chunk_ptr=None if sampled else chunk_ptr,
                                phases=True)
    return get_layer_partitioner("profiled")().split(phases, num_stages, scheduler=scheduler)


__all__ = ["profile_unit_costs", "profiled_split"]
