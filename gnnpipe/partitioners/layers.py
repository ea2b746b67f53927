"""Layer partitioners: map a model's ``U = L + 2`` layer units onto ``S`` pipeline stages.

DESIGN §4, step 4. A stage is a contiguous range of units (DESIGN §2), so a split is the list of
boundaries ``0 = b_0 < b_1 < … < b_S = U``; stage ``s`` runs units ``[b_s, b_{s+1})``.

* ``equal`` — the paper's rule (GNNPipe, arXiv 2308.10087, §4: layers are assigned evenly to GPUs):
  every unit costs 1 and the split is greedy and contiguous.
* ``profiled`` — each unit's forward+backward time measured (:func:`profile_unit_costs`: on a sample,
  or — as the runtime does — chunk by chunk over the whole relabelled graph with the pipeline's
  history-backed chunk op), then the exact min–max contiguous split (the "linear partition"
  / chains-on-chains problem; Bokhari, IEEE Trans. Computers 1988) by dynamic programming.

This family has its own registry, separate from the vertex partitioners:
``layer_partitioners.register(name)``, :func:`get_layer_partitioner`, :func:`available_layer_partitioners`.
"""

from __future__ import annotations

import abc
import itertools
import time
from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch import Tensor

from ..errors import ConfigError, DataValidationError
from ..registry import Registry
from .base import _is_count

__all__ = [
    "EqualLayerPartitioner",
    "LayerPartitioner",
    "ProfiledLayerPartitioner",
    "StageSplit",
    "available_layer_partitioners",
    "get_layer_partitioner",
    "layer_partitioners",
    "minmax_split",
    "profile_unit_costs",
    "schedule_split",
    "split_layers",
    "UnitPhases",
    "action_costs",
    "stage_chunk_costs",
]


@attrs.frozen
class StageSplit:
    """Units → stages.

    Attributes:
        bounds: ``list[int]`` of length ``S + 1``, ``0 = bounds[0] < … < bounds[S] = U``.
        stage_costs: ``list[float]`` of length ``S``: the predicted cost of each stage (sum of its
            unit costs; seconds for ``profiled``, unit counts for ``equal``).
        unit_costs: ``list[float]`` of length ``U``: the cost of every unit used for the split.
        phases: the measured forward/backward seconds per unit and chunk when the split was profiled
            (``None`` otherwise); :meth:`stage_phase_costs` sums them per stage.
    """

    bounds: list[int]
    stage_costs: list[float]
    unit_costs: list[float]
    phases: "UnitPhases | None" = None

    @property
    def num_stages(self) -> int:
        """``S``."""
        return len(self.bounds) - 1

    @property
    def num_units(self) -> int:
        """``U``."""
        return self.bounds[-1]

    @property
    def bottleneck(self) -> float:
        """``max(stage_costs)``: the predicted per-chunk time of the slowest stage."""
        return max(self.stage_costs)

    def stage_phase_costs(self) -> "tuple[list[list[float]], list[list[float]]] | None":
        """``(forward, backward)``: seconds of each stage on each chunk (``S × C`` lists), summed over the
        stage's units from :attr:`phases` (:func:`stage_chunk_costs`); ``None`` without measured phases.
        Feed them to the schedule simulator through :func:`action_costs`."""
        return None if self.phases is None else stage_chunk_costs(self.phases, self.bounds)

    def stage_units(self, s: int) -> range:
        """Unit indices of stage ``s`` (``range``).

        Raises:
            ConfigError: ``s`` outside ``[0, S)``.
        """
        if not 0 <= s < self.num_stages:
            raise ConfigError(f"stage {s} out of range [0, {self.num_stages})")
        return range(self.bounds[s], self.bounds[s + 1])

    def stage_of(self, unit: int) -> int:
        """The stage that runs unit ``unit``."""
        for s in range(self.num_stages):
            if self.bounds[s] <= unit < self.bounds[s + 1]:
                return s
        raise ConfigError(f"unit {unit} out of range [0, {self.num_units})")

    @classmethod
    def from_bounds(cls, bounds: Sequence[int], unit_costs: Sequence[float]) -> StageSplit:
        """A split with the given boundaries; stage costs are sums of ``unit_costs``.

        Raises:
            ConfigError: boundaries not strictly increasing from 0 to ``len(unit_costs)``.
        """
        b = [int(x) for x in bounds]
        u = len(unit_costs)
        if len(b) < 2 or b[0] != 0 or b[-1] != u or any(x >= y for x, y in itertools.pairwise(b)):
            raise ConfigError(f"stage bounds must increase strictly from 0 to {u}; got {b}")
        costs = [float(c) for c in unit_costs]
        return cls(bounds=b, stage_costs=[sum(costs[b[s] : b[s + 1]]) for s in range(len(b) - 1)], unit_costs=costs)


def _check_stages(num_units: int, num_stages: int) -> None:
    if not _is_count(num_stages):
        raise ConfigError(f"num_stages must be an integer >= 1; got {num_stages!r}")
    if num_stages > num_units:
        raise ConfigError(
            f"cannot split {num_units} layer units into {num_stages} non-empty stages; "
            f"use at most {num_units} stages or a deeper model"
        )


def _num_units(model_or_costs: Any) -> int:
    if isinstance(model_or_costs, int) and not isinstance(model_or_costs, bool):
        return model_or_costs
    if hasattr(model_or_costs, "units"):
        return len(model_or_costs.units)
    return len(model_or_costs)


def _costs(model_or_costs: Any) -> list[float] | None:
    """Explicit unit costs if ``model_or_costs`` is a sequence of numbers, else ``None``."""
    if hasattr(model_or_costs, "units") or isinstance(model_or_costs, int):
        return None
    costs = [float(c) for c in model_or_costs]
    if any(not c >= 0 for c in costs):  # also rejects NaN
        raise ConfigError(f"unit costs must be non-negative numbers; got {costs}")
    return costs


def minmax_split(costs: Sequence[float], num_stages: int) -> list[int]:
    """Exact min–max contiguous split of ``U`` costs into ``S`` non-empty ranges (dynamic programming).

    ``best[s][u]`` = the smallest possible maximum range sum when the first ``u`` units form ``s``
    ranges; ``best[s][u] = min_{j} max(best[s-1][j], sum(costs[j:u]))``. ``O(S · U²)`` time.
    Among optimal splits the one with the latest boundaries is returned (later stages stay light,
    which shortens the pipeline's drain; ties compared exactly on floats).

    Returns:
        ``list[int]`` of ``S + 1`` boundaries.

    Raises:
        ConfigError: ``S < 1`` or ``S > U``; negative costs.
    """
    u_n = len(costs)
    _check_stages(u_n, num_stages)
    pre = [0.0]
    for c in costs:
        if not c >= 0:
            raise ConfigError(f"unit costs must be non-negative; got {c!r}")
        pre.append(pre[-1] + float(c))
    inf = float("inf")
    best = [[inf] * (u_n + 1) for _ in range(num_stages + 1)]
    arg = [[0] * (u_n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        # the first s ranges cover u units; leave room for the remaining S - s ranges
        for u in range(s, u_n - (num_stages - s) + 1):
            b, a = inf, s - 1
            for j in range(s - 1, u):
                v = max(best[s - 1][j], pre[u] - pre[j])
                if v <= b:
                    b, a = v, j
            best[s][u], arg[s][u] = b, a
    bounds = [u_n]
    u = u_n
    for s in range(num_stages, 0, -1):
        u = arg[s][u]
        bounds.append(u)
    return bounds[::-1]


class LayerPartitioner(abc.ABC):
    """Abstract layer partitioner: ``split(model_or_costs, S, **ctx) → StageSplit``.

    ``model_or_costs`` is a ``GNNModel`` (anything with ``.units``), a sequence of per-unit costs,
    or the number of units ``U``.
    """

    registry_name: str = "?"

    @abc.abstractmethod
    def split(self, model_or_costs: Any, num_stages: int, **ctx: Any) -> StageSplit:
        """Split the units into ``num_stages`` contiguous non-empty stages.

        Raises:
            ConfigError: ``num_stages < 1`` or ``num_stages > U``.
        """


layer_partitioners: Registry = Registry("layer partitioner", base=LayerPartitioner)
register_layer_partitioner = layer_partitioners.register
get_layer_partitioner = layer_partitioners.get
available_layer_partitioners = layer_partitioners.available


@register_layer_partitioner("equal")
class EqualLayerPartitioner(LayerPartitioner):
    """Every unit costs 1; greedy contiguous split (GNNPipe §4, layers spread evenly over GPUs).

    Greedy rule (ceil-balanced): with ``U`` units and ``S`` stages, the first ``U mod S`` stages get
    ``⌈U/S⌉`` units and the rest ``⌊U/S⌋``, in order. Explicit costs passed in are ignored (the
    split only counts units); ``stage_costs`` are the unit counts.
    """

    def split(self, model_or_costs: Any, num_stages: int, **ctx: Any) -> StageSplit:
        u = _num_units(model_or_costs)
        _check_stages(u, num_stages)
        base, extra = divmod(u, int(num_stages))
        bounds = [0]
        for s in range(int(num_stages)):
            bounds.append(bounds[-1] + base + (1 if s < extra else 0))
        return StageSplit.from_bounds(bounds, [1.0] * u)


@register_layer_partitioner("profiled")
class ProfiledLayerPartitioner(LayerPartitioner):
    """Measured unit costs + exact min–max contiguous split (:func:`minmax_split`).

    Args:
        repeats: timed repetitions per unit (the minimum is kept), see :func:`profile_unit_costs`.

    ``split`` context:
        costs given directly (``model_or_costs`` a sequence of numbers) are used as is; otherwise
        ``model_or_costs`` is a ``GNNModel`` and ``data=`` (a PyG ``Data`` with ``x`` and
        ``edge_index``) must be given; ``sample_nodes=`` (optional int) restricts it to the subgraph
        induced by vertices ``[0, sample_nodes)`` (after :class:`~gnnpipe.partitioners.ChunkPlan`
        relabelling, the first chunks); ``graph_ops=`` reuses a ``GraphOps`` of the sample;
        ``chunk_ptr=`` (with the whole relabelled graph as ``data``) times every unit chunk by chunk as
        the pipeline runs it (see :func:`profile_unit_costs`); with ``chunk_ptr=``, ``scheduler=`` (a
        scheduler name or instance) then refines the min–max split for that schedule's simulated makespan
        with separate forward and backward costs per chunk (:func:`schedule_split`; without chunks every
        split has the same simulated makespan and it is ignored).

    Raises:
        ConfigError: no ``data`` for a model; ``S`` out of range.
    """

    def __init__(self, repeats: int = 3):
        if int(repeats) != repeats or repeats < 1:
            raise ConfigError(f"repeats must be an integer >= 1; got {repeats!r}")
        self.repeats = int(repeats)

    def split(self, model_or_costs: Any, num_stages: int, **ctx: Any) -> StageSplit:
        costs = _costs(model_or_costs)
        if costs is None:
            if isinstance(model_or_costs, int):
                raise ConfigError("the 'profiled' layer partitioner needs a model (and data=) or explicit unit costs")
            _check_stages(_num_units(model_or_costs), num_stages)
            data = ctx.get("data")
            if data is None:
                raise ConfigError("the 'profiled' layer partitioner needs data= (a sample chunk) to time the units")
            sample_nodes = ctx.get("sample_nodes")
            sampled = sample_nodes is not None and sample_nodes < int(data.num_nodes)
            if sampled:
                data = _row_slice_sample(data, int(sample_nodes))
            phases = profile_unit_costs(
                model_or_costs, data, ctx.get("graph_ops"), repeats=int(ctx.get("repeats", self.repeats)),
                chunk_ptr=None if sampled else ctx.get("chunk_ptr"), phases=True,
            )
            costs = phases.unit_costs()
            bounds = minmax_split(costs, num_stages)
            if ctx.get("scheduler") is not None and num_stages > 1 and len(phases.forward[0]) > 1:
                bounds, _ = schedule_split(phases, num_stages, ctx["scheduler"], start=bounds)
            return attrs.evolve(StageSplit.from_bounds(bounds, costs), phases=phases)
        return StageSplit.from_bounds(minmax_split(costs, num_stages), costs)


@attrs.frozen
class UnitPhases:
    """Measured forward and backward seconds of every unit on every chunk.

    Attributes:
        forward, backward: ``list[list[float]]`` of shape ``U × C`` (``C = 1`` for a whole-graph profile).
    """

    forward: list[list[float]]
    backward: list[list[float]]

    def unit_costs(self) -> list[float]:
        """Forward + backward seconds per unit, summed over chunks (``list[float]`` of length ``U``)."""
        return [sum(f) + sum(b) for f, b in zip(self.forward, self.backward)]


def stage_chunk_costs(phases: UnitPhases, bounds: Sequence[int]) -> tuple[list[list[float]], list[list[float]]]:
    """``(forward, backward)``: seconds of each stage ``[bounds[s], bounds[s+1])`` on each chunk, summed over
    its units (two ``S × C`` lists)."""
    out = []
    for table in (phases.forward, phases.backward):
        chunks = len(table[0])
        out.append([[sum(table[u][c] for u in range(a, b)) for c in range(chunks)]
                    for a, b in itertools.pairwise(bounds)])
    return out[0], out[1]


def action_costs(forward: Sequence[Sequence[float]], backward: Sequence[Sequence[float]]):
    """A cost callable for :func:`gnnpipe.schedulers.simulate`: ``F``/``B`` of stage ``s`` on chunk ``c`` take
    ``forward[s][c]`` / ``backward[s][c]`` seconds, ``STEP`` is free."""
    from ..schedulers.ir import ActionKind

    def cost(action) -> float:
        if action.kind == ActionKind.STEP:
            return 0.0
        return (forward if action.kind == ActionKind.F else backward)[action.stage][action.chunk]

    return cost


def schedule_split(phases: UnitPhases, num_stages: int, scheduler: Any, start: Sequence[int] | None = None,
                   max_rounds: int = 64) -> tuple[list[int], float]:
    """Refine a contiguous split for one schedule: minimise the makespan the schedule simulator predicts
    with the measured per-chunk forward and backward costs of each stage.

    A min–max split of forward + backward balances each stage's total, which is what a 1F1B steady
    state needs; GPipe runs all forwards, then all backwards, so a stage whose forward is relatively heavy
    (e.g. a wide encoder without input gradient) and another whose backward is heavy each wait in a
    different phase although their totals are equal. Starting from ``start`` (default: the min–max split of
    the totals), every stage boundary is moved by ±1 while the simulated makespan
    (:func:`gnnpipe.schedulers.simulate`, ``F``/``B`` of stage ``s`` on chunk ``c`` = the sum of its units'
    measured seconds on chunk ``c``) decreases — a local search, steepest descent, at most ``max_rounds``
    moves.

    Args:
        phases: per-unit, per-chunk forward/backward seconds (:func:`profile_unit_costs` with ``phases=True``).
        num_stages: ``S``. scheduler: a registered scheduler name or instance.
        start: initial boundaries (``S + 1`` ints).

    Returns:
        ``(bounds, makespan)``: the refined boundaries and their simulated makespan (seconds per epoch).

    Raises:
        ConfigError: ``S`` out of range; UnknownComponentError: unknown scheduler.
    """
    from ..schedulers import build_schedule, simulate

    _check_stages(len(phases.forward), num_stages)
    sched = build_schedule(scheduler, num_stages, len(phases.forward[0]))

    def makespan(bounds: Sequence[int]) -> float:
        return simulate(sched, costs=action_costs(*stage_chunk_costs(phases, bounds))).makespan

    bounds = list(start) if start is not None else minmax_split(phases.unit_costs(), num_stages)
    best = makespan(bounds)
    for _ in range(max_rounds):
        move = None
        for i in range(1, num_stages):
            for d in (-1, 1):
                cand = list(bounds)
                cand[i] += d
                if not cand[i - 1] < cand[i] < cand[i + 1]:
                    continue
                m = makespan(cand)
                if m < best - 1e-12 and (move is None or m < move[1]):
                    move = (cand, m)
        if move is None:
            break
        bounds, best = move
    return bounds, best


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
        from ..core.graph import GraphOps

        graph_ops = GraphOps(ei, x.size(0), dtype=x.dtype)
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
    from ..core.history import ChunkAggregate, History

    rows: dict[str, list] = {}

    def chunk_rows(kind: str) -> list:
        if kind not in rows:
            rows[kind] = [graph_ops.chunk_rows(kind, lo, hi) for lo, hi in ranges]
        return rows[kind]

    scratch: dict[int, list] = {}  # one history per op, allocated in the untimed warm-up pass and reused

    def run_unit(unit: Any, i: int, h: Tensor, shared: Tensor | None):
        if i not in scratch:
            scratch[i] = [History(n, h.dtype, device=h.device) for _ in getattr(unit, "aggregations", ())]
        hists = scratch[i]
        outs, shs, fw, bw = [], [], [], []
        for c, (lo, hi) in enumerate(ranges):
            counter = [0]

            def agg(t: Tensor, kind: str, c: int = c, lo: int = lo, hi: int = hi) -> Tensor:
                j = counter[0]
                counter[0] += 1
                a_c, at_c = chunk_rows(kind)[c]
                return ChunkAggregate.apply(t, hists[j], a_c, at_c, lo, hi, True)

            o, s_o, tf, tb = _timed_unit(unit, h[lo:hi], None if shared is None else shared[lo:hi], agg, i > 0)
            outs.append(o)
            shs.append(s_o)
            fw.append(tf)
            bw.append(tb)
        sh = None if shs[0] is None else torch.cat(shs)
        return torch.cat(outs), sh, fw, bw

    return run_unit


def split_layers(model_or_costs: Any, num_stages: int, method: str = "equal", **ctx: Any) -> StageSplit:
    """``get_layer_partitioner(method)().split(model_or_costs, num_stages, **ctx)``.

    Raises:
        UnknownComponentError: unknown method (the message lists the available ones). ConfigError: see ``split``.
    """
    return get_layer_partitioner(method)().split(model_or_costs, num_stages, **ctx)
