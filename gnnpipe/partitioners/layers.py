"""Layer partitioners: map a model's ``U = L + 2`` layer units onto ``S`` pipeline stages.

A stage is a contiguous range of units, so a split is the list of
boundaries ``0 = b_0 < b_1 < … < b_S = U``; stage ``s`` runs units ``[b_s, b_{s+1})``.

* ``equal`` — the paper's rule (GNNPipe, arXiv 2308.10087, §4: layers are assigned evenly to GPUs):
  every unit costs 1 and the split is greedy and contiguous.
* ``profiled`` — measured costs per unit (``gnnpipe.tasks.nodes.profile.profile_unit_costs`` measures them:
  on a sample, or — as the runtime does — chunk by chunk over the whole relabelled graph with the pipeline's
  history-backed chunk op), then the exact min–max contiguous split (the "linear partition" / chains-on-chains
  problem; Bokhari, IEEE Trans. Computers 1988) by dynamic programming. Layer partitioners receive costs and
  never run the model (torchgpipe's ``balance``: profile apart from split).

This family has its own registry, separate from the vertex partitioners:
``layer_partitioners.register(name)``, :func:`get_layer_partitioner`, :func:`available_layer_partitioners`.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Sequence
from typing import Any

import attrs

from ..errors import ConfigError
from ..registry import Registry
from ..schedulers import build_schedule, simulate
from ..schedulers.ir import ActionKind
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
    phases: UnitPhases | None = None

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

    def stage_phase_costs(self) -> tuple[list[list[float]], list[list[float]]] | None:
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

    It takes costs only and never runs a model (the profiler,
    ``gnnpipe.tasks.nodes.profile.profile_unit_costs``, measures;
    ``gnnpipe.tasks.nodes.profile.profiled_split`` does both).

    ``split(costs, S, scheduler=None)``: ``costs`` is a sequence of per-unit costs, or a :class:`UnitPhases`
    (forward and backward seconds per unit and chunk); with a :class:`UnitPhases` of more than one chunk,
    ``scheduler=`` (a scheduler name or instance) then refines the min–max split for that schedule's
    simulated makespan with separate forward and backward costs per chunk (:func:`schedule_split`).

    Raises:
        ConfigError: a model (or a unit count) instead of costs; ``S`` out of range.
    """

    def __init__(self, repeats: int = 3):
        if int(repeats) != repeats or repeats < 1:
            raise ConfigError(f"repeats must be an integer >= 1; got {repeats!r}")
        self.repeats = int(repeats)  # kept for callers that pass it; the profiler takes its own

    def split(self, model_or_costs: Any, num_stages: int, **ctx: Any) -> StageSplit:
        if isinstance(model_or_costs, UnitPhases):
            phases = model_or_costs
            costs = phases.unit_costs()
            bounds = minmax_split(costs, num_stages)
            if ctx.get("scheduler") is not None and num_stages > 1 and len(phases.forward[0]) > 1:
                bounds, _ = schedule_split(phases, num_stages, ctx["scheduler"], start=bounds)
            return attrs.evolve(StageSplit.from_bounds(bounds, costs), phases=phases)
        costs = _costs(model_or_costs)
        if costs is None:
            raise ConfigError("the 'profiled' layer partitioner takes measured unit costs, not a model: measure "
                              "them with gnnpipe.tasks.nodes.profile.profile_unit_costs(model, data, phases=True) "
                              "and pass the result, or call "
                              "gnnpipe.tasks.nodes.profile.profiled_split(model, S, data=...)")
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
        phases: per-unit, per-chunk forward/backward seconds
            (``gnnpipe.tasks.nodes.profile.profile_unit_costs`` with ``phases=True``).
        num_stages: ``S``. scheduler: a registered scheduler name or instance.
        start: initial boundaries (``S + 1`` ints).

    Returns:
        ``(bounds, makespan)``: the refined boundaries and their simulated makespan (seconds per epoch).

    Raises:
        ConfigError: ``S`` out of range; UnknownComponentError: unknown scheduler.
    """
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


def split_layers(model_or_costs: Any, num_stages: int, method: str = "equal", **ctx: Any) -> StageSplit:
    """``get_layer_partitioner(method)().split(model_or_costs, num_stages, **ctx)``.

    Raises:
        UnknownComponentError: unknown method (the message lists the available ones). ConfigError: see ``split``.
    """
    return get_layer_partitioner(method)().split(model_or_costs, num_stages, **ctx)
