"""The unit profiler: seconds of forward and backward of every layer unit (measures; never splits).

The layer partitioners (:mod:`gnnpipe.partitioners.layers`) receive these costs and split; the profiler lives
in the runtime because it runs the units with the runtime's aggregation ops (the pipeline's history-backed
chunk op, :class:`~gnnpipe.tasks.nodes.aggregation.HistoryOp`), as torchgpipe keeps ``profile_times`` apart from
``balance_cost``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from ...errors import ConfigError, DataValidationError
from ...partitioners import StageSplit, UnitPhases, get_layer_partitioner
from ...partitioners.layers import _check_stages
from .aggregation import history_op, unit_aggregators
from .graph import GraphOps


def _row_slice_sample(data: Any, k: int) -> Any:
    """The subgraph induced by vertices ``[0, k)``: ``x[:k]`` and the edges among them."""
    ei = data.edge_index
    keep = (ei < k).all(0)
    return Data(x=data.x[:k], edge_index=ei[:, keep], num_nodes=k)


def profile_unit_costs(model: Any, data_sample: Any, graph_ops: Any = None, repeats: int = 3,
                       chunk_ptr: Tensor | None = None, *, phases: bool = False,
                       clock: Any = time.perf_counter, fused: bool = True,
                       reduce: str = "min") -> list[float] | UnitPhases:
    """Seconds of forward + backward of every unit of ``model`` on a sample (or on every chunk of a graph).

    Units run in sequence on the sample (unit ``i`` gets unit ``i − 1``'s output, detached, as a leaf
    that requires grad, and the shared tensor likewise; the encoder's input ``x`` does not require grad,
    as in training), in the order a gpipe stage runs them: the forward of every chunk through all units,
    then the backward of the chunks in reverse, each unit given the gradient of its output that the next
    unit's backward produced (ones for the last unit), so a unit's buffers leave the caches between its
    forward and its backward, and between chunks, as they do in training.

    * Without ``chunk_ptr``, aggregation is the exact full-graph op on the sample's own graph
      (``GraphOps(sample.edge_index, n).aggregate``).
    * With ``chunk_ptr`` (``LongTensor[C+1]``, chunks = contiguous id ranges, as after
      :class:`~gnnpipe.partitioners.ChunkPlan` relabelling), each unit runs **as the pipeline runs it**:
      chunk by chunk, with the history-backed chunk aggregation op
      (:class:`gnnpipe.tasks.nodes.history.ChunkAggregate` on :class:`~gnnpipe.tasks.nodes.graph.CompactRows`, one
      scratch history per op), and its cost is the sum over chunks. This captures what a whole-graph
      profile misses: a chunk's aggregation also reads its halo from cold history buffers, so
      aggregation units cost relatively more in a pipeline than dense units. A unit that fuses its chunk
      step (``agg.push_pull``, e.g. GCNII's layer) runs fused, as a pipeline stage runs it; ``fused=False``
      times the plain path instead (what a hybrid's peer op and graph parallelism run).

    One untimed warm-up pass, then ``repeats`` timed passes; per unit, chunk and phase the **minimum** is
    reported (``reduce="min"``: noise on a shared machine only adds time; what a layer split needs) or the
    **median** (``reduce="median"``: the typical cost, what an epoch-time prediction needs — the minimum of
    every unit and chunk separately sums to less than any real pass costs). The model is run in training mode (dropout
    on), its parameters' ``.grad`` and training flag and the global RNG are restored.

    Args:
        model: a ``GNNModel`` (``.units``: callables ``unit(h, shared, agg) → (h, shared)``).
        data_sample: a PyG ``Data`` with ``x`` (``[n, F]``) and ``edge_index`` (``LongTensor[2, e]``
            within ``[0, n)``).
        graph_ops: optional ``gnnpipe.tasks.nodes.graph.GraphOps`` of the sample (built if ``None``).
        repeats: timed passes (``>= 1``).
        chunk_ptr: optional chunk boundaries (see above); ``chunk_ptr[-1]`` must equal ``n``.
        phases: return a :class:`UnitPhases` (forward and backward seconds per unit and chunk) instead.
        clock: the timer, a callable returning seconds (default wall time, ``time.perf_counter``;
            ``time.thread_time`` measures the CPU time of this thread, which other processes on a busy
            machine do not inflate).
        fused: with ``chunk_ptr``, offer units the fused chunk step (``agg.push_pull``) as a pipeline stage does.
        reduce: ``"min"`` or ``"median"`` over the timed passes (above).

    Returns:
        ``list[float]`` of length ``U``, seconds per unit (forward + backward, summed over chunks).

    Raises:
        DataValidationError: the sample lacks ``x`` or ``edge_index``. ConfigError: ``repeats < 1`` or an unknown
        ``reduce``.
    """
    if int(repeats) != repeats or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1; got {repeats!r}")
    if reduce not in ("min", "median"):
        raise ConfigError(f"reduce must be 'min' or 'median'; got {reduce!r}")
    pick = min if reduce == "min" else statistics.median
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
        aggregator = _chunk_aggregators(graph_ops, ranges, n, fused)
    else:
        ranges = [(0, n)]

        def aggregator(unit, i, c, dtype, device):
            return graph_ops.aggregate

    params = list(model.parameters())
    saved_grads = [p.grad for p in params]
    for p in params:  # backward would otherwise accumulate into the caller's .grad tensors in place
        p.grad = None
    was_training = model.training
    units = list(model.units)
    C = len(ranges)
    times: list[tuple[list[list[float]], list[list[float]]]] = []  # per timed pass: (forward, backward)[unit][chunk]
    try:
        model.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for rep in range(int(repeats) + 1):
                fw = [[0.0] * C for _ in units]
                bw = [[0.0] * C for _ in units]
                _chunk_major_pass(units, x, ranges, aggregator, clock, fw, bw)
                if rep > 0:
                    times.append((fw, bw))
    finally:
        for p, g in zip(params, saved_grads):
            p.grad = g
        model.train(was_training)
    # minimum (or median) over repeats, per unit, chunk and phase
    measured = UnitPhases(forward=[[pick([t[0][i][c] for t in times]) for c in range(C)] for i in range(len(units))],
                          backward=[[pick([t[1][i][c] for t in times]) for c in range(C)] for i in range(len(units))])
    return measured if phases else measured.unit_costs()


def _chunk_major_pass(units: list, x: Tensor, ranges: list[tuple[int, int]], aggregator, clock, fw, bw) -> None:
    """One timed pass in a gpipe stage's order: the forward of every chunk through the units (unit ``i`` gets
    unit ``i − 1``'s output, detached, as a leaf that requires grad — the encoder's input ``x`` does not — and the
    shared tensor likewise), then the backward of the chunks in reverse, unit by unit from the last, each given
    the gradient of its output that the next unit's backward produced (ones for the last unit; the shared
    tensor's gradient summed over the units that read it, for the unit that produced it). A unit's data thus
    leaves the caches between its forward and its backward as in training. Fills ``fw[i][c]``, ``bw[i][c]``."""
    saved: dict[tuple[int, int], tuple] = {}
    for c, (lo, hi) in enumerate(ranges):
        h: Tensor = x[lo:hi]
        shared: Tensor | None = None
        for i, unit in enumerate(units):
            h_in = h.detach().requires_grad_(i > 0)
            s_in = None if shared is None else shared.detach().requires_grad_(True)
            agg = aggregator(unit, i, c, h.dtype, h.device)
            t0 = clock()
            out, s_out = unit(h_in, s_in, agg)
            fw[i][c] = clock() - t0
            saved[(c, i)] = (h_in, s_in, out, s_out)
            h, shared = out.detach(), (None if s_out is None else s_out.detach())
    for c in reversed(range(len(ranges))):
        g: Tensor | None = None
        g_shared: Tensor | None = None
        for i in reversed(range(len(units))):
            h_in, s_in, out, s_out = saved.pop((c, i))
            tensors, grads = [out], [torch.ones_like(out) if g is None else g]
            if s_out is not None and s_out is not s_in and s_out.requires_grad:  # this unit made the shared tensor
                tensors.append(s_out)
                grads.append(torch.ones_like(s_out) if g_shared is None else g_shared)
                g_shared = None
            t0 = clock()
            if any(t.requires_grad for t in tensors):
                torch.autograd.backward([t for t in tensors if t.requires_grad],
                                        [q for t, q in zip(tensors, grads) if t.requires_grad])
            bw[i][c] = clock() - t0
            g = h_in.grad
            if s_in is not None and s_in.grad is not None:
                g_shared = s_in.grad if g_shared is None else g_shared + s_in.grad
            del h_in, s_in, out, s_out


def _chunk_aggregators(graph_ops: Any, ranges: list[tuple[int, int]], n: int, fused: bool = True):
    """``aggregator(unit, i, c, dtype, device) -> agg``: unit ``i``'s callback on chunk ``c`` with the pipeline's
    history-backed aggregation op (one op with its history per aggregation of the unit, made on first use; the
    row slices of ``Â`` shared by the ops, as in a stage); with ``fused``, ``agg.push_pull`` offers the op as a
    fused chunk step (see :func:`profile_unit_costs`)."""
    adj: dict = {}  # (kind, chunk) -> row slices, shared by the ops as in a stage
    scratch: dict[int, list] = {}

    def aggregator(unit: Any, i: int, c: int, dtype, device):
        if i not in scratch:
            scratch[i] = [history_op(unit, kind, n, dtype, device, "", graph_ops, adj)
                          for kind in getattr(unit, "aggregations", ())]
        ops = scratch[i]
        rows = ranges[c]
        make = unit_aggregators({i: unit}, lambda _, j, t, kind, layer: ops[j].train(t, c, rows, True, layer),
                                (lambda _, j, kind: ops[j].push_pull(c, rows, True)) if fused else None)
        return make(i)

    return aggregator


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
    _check_stages(model.num_units, num_stages)
    sampled = sample_nodes is not None and sample_nodes < int(data.num_nodes)
    if sampled:
        data = _row_slice_sample(data, int(sample_nodes))
    phases = profile_unit_costs(model, data, graph_ops, repeats=repeats, chunk_ptr=None if sampled else chunk_ptr,
                                phases=True)
    return get_layer_partitioner("profiled")().split(phases, num_stages, scheduler=scheduler)


__all__ = ["profile_unit_costs", "profiled_split"]
