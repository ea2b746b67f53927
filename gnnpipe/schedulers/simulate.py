"""Discrete-event simulation of a schedule: makespan, bubbles, activation memory, deadlocks.

Model (see :mod:`gnnpipe.schedulers._engine`): each stage is one sequential device that runs its
actions in the schedule's order (idle grid slots are ignored; an action starts as soon as the stage
is free and its inputs have arrived). After ``F`` on ``s < S-1`` the chunk's boundary rows go to
``s+1``; after ``B`` on ``s > 0`` their gradient goes to ``s-1``. A send takes
``latency + bytes / bandwidth`` on the link from sender to receiver (one link per direction, sends
first come first served; with ``duplex=False`` both directions of a pair of stages share one). With ``overlap`` the
sender keeps computing meanwhile; without it the sender is busy until its send is done. A flush schedule spanning
several epochs gets a barrier: epoch ``e`` starts on a stage only after every stage's step of epoch ``e-1``.

Time is in whatever unit the costs use ("slots" for unit costs); ``bandwidth`` is in bytes per that
unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ._engine import Interval, Transfer, run
from .ir import Action, ActionKind, Schedule


@dataclass
class CostModel:
    """Duration of each action: ``base[kind] × stage_scale[stage] × chunk_scale[chunk]``.

    Attributes:
        forward, backward, step: base durations of ``F``, ``B`` and ``STEP`` (time units).
        force, second: base durations of the ``G`` and ``D`` passes of conservative-force schedules.
        stage_scale: optional per-stage factor, e.g. the number of layer units on the stage.
        chunk_scale: optional per-chunk factor for ``F``/``B`` (not ``STEP``), e.g. the chunk's edges
            relative to the mean chunk.

    With the defaults every ``F`` and ``B`` takes one slot and ``STEP`` is free, which gives the
    textbook numbers (GPipe makespan ``2(C+S-1)``, bubble ``(S-1)/(C+S-1)``).
    """

    forward: float = 1.0
    backward: float = 1.0
    step: float = 0.0
    stage_scale: Sequence[float] | None = None
    chunk_scale: Sequence[float] | None = None
    force: float = 1.0
    second: float = 1.0

    def duration(self, action: Action) -> float:
        """Duration of ``action``.

        Raises:
            ConfigError: the action's stage or chunk is outside the scale lists.
        """
        base = {ActionKind.F: self.forward, ActionKind.B: self.backward, ActionKind.STEP: self.step,
                ActionKind.G: self.force, ActionKind.D: self.second}[action.kind]
        try:
            if self.stage_scale is not None:
                base *= float(self.stage_scale[action.stage])
            if self.chunk_scale is not None and action.chunk is not None:
                base *= float(self.chunk_scale[action.chunk])
        except IndexError:
            raise ConfigError(
                f"no cost for {action}: stage_scale has {len(self.stage_scale or [])} entries, "
                f"chunk_scale {len(self.chunk_scale or [])}"
            ) from None
        return base

    __call__ = duration

    @classmethod
    def from_graph(cls, chunk_ptr, edge_index, stage_units: Sequence[float], *, forward: float = 1.0,
                   backward: float = 2.0, step: float = 0.0, vertex_weight: float = 0.0) -> CostModel:
        """Costs proportional to each chunk's aggregation work and each stage's number of units.

        ``chunk_scale[c] = (in-edges of chunk c + vertex_weight × |chunk c|)`` divided by its mean over
        chunks, so ``forward`` is the forward time of one unit on an average chunk.

        Args:
            chunk_ptr: ``C+1`` offsets of the contiguous chunks. edge_index: ``[2, E]`` (src, dst).
            stage_units: ``S`` numbers of layer units per stage (or any per-stage cost factor).
        """
        ptr = np.asarray(chunk_ptr, dtype=np.int64)
        ei = np.asarray(edge_index)
        dst_chunk = np.searchsorted(ptr, ei[1], side="right") - 1
        work = np.bincount(dst_chunk, minlength=len(ptr) - 1).astype(float)
        work += vertex_weight * np.diff(ptr)
        mean = work.mean() if work.size and work.mean() > 0 else 1.0
        return cls(forward, backward, step, list(map(float, stage_units)), list(work / mean))


@dataclass
class CommModel:
    """Time to send one chunk's boundary tensor (or its gradient) between neighbouring stages.

    Attributes:
        bytes_per_chunk: bytes per send — one number, a per-chunk sequence, or a callable
            ``(src, dst, action) -> bytes``.
        bandwidth: bytes per time unit (``inf``: only latency counts).
        latency: time added to every send.
        overlap: ``True``: sends run beside compute; ``False``: the sender waits for its send.
        duplex: ``True``: each direction of a link has its own channel; ``False``: the two directions share one
            (sends either way first come first served), as over a transport that gets half the rate each way
            while both ends send (``gnnpipe.costmodel.hardware``, ``exchange_gbps``).
    """

    bytes_per_chunk: float | Sequence[float] | Callable[[int, int, Action], float] = 0.0
    bandwidth: float = math.inf
    latency: float = 0.0
    overlap: bool = True
    duplex: bool = True

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ConfigError(f"bandwidth must be positive, got {self.bandwidth}")
        if self.latency < 0:
            raise ConfigError(f"latency must be non-negative, got {self.latency}")

    def nbytes(self, src: int, dst: int, action: Action) -> float:
        b = self.bytes_per_chunk
        if callable(b):
            return float(b(src, dst, action))
        if isinstance(b, (int, float)):
            return float(b)
        return float(b[action.chunk])

    def time(self, src: int, dst: int, action: Action) -> float:
        """``latency + bytes / bandwidth`` (0 when both are 0)."""
        n = self.nbytes(src, dst, action)
        return self.latency + (n / self.bandwidth if n else 0.0)

    @classmethod
    def from_chunks(cls, chunk_ptr, dim: int, bandwidth: float, *, dtype_bytes: int = 4,
                    latency: float = 0.0, overlap: bool = True) -> CommModel:
        """Boundary tensors of ``|chunk| × dim`` elements of ``dtype_bytes`` (fp32, 4 bytes)."""
        sizes = np.diff(np.asarray(chunk_ptr, dtype=np.int64))
        return cls([float(n * dim * dtype_bytes) for n in sizes], bandwidth, latency, overlap)


CostsLike = float | CostModel | Mapping[str, float] | Callable[[Action], float] | None


def _cost_fn(costs: CostsLike) -> Callable[[Action], float]:
    if costs is None:
        return CostModel().duration
    if isinstance(costs, CostModel):
        return costs.duration
    if isinstance(costs, (int, float)):
        return CostModel(float(costs), float(costs)).duration
    if isinstance(costs, Mapping):
        base = {ActionKind.parse(k): float(v) for k, v in costs.items()}
        return lambda a: base.get(a.kind, 0.0 if a.kind is ActionKind.STEP else 1.0)
    if callable(costs):
        return costs
    raise ConfigError(f"costs must be None, a number, a CostModel, a mapping or a callable, got {costs!r}")


@dataclass
class SimulationResult:
    """What :func:`simulate` measured.

    Attributes:
        schedule: the simulated schedule.
        makespan: time from 0 to the last action's (or send's) end.
        intervals: per stage, the executed actions with start/end times, in execution order.
        transfers: every boundary send with its start/end on the link.
        compute_time: per stage, total action time.
        comm_blocked: per stage, time the stage spent sending (only without overlap).
        bubble_fraction: per stage, ``1 - compute_time / makespan`` (time not computing).
        peak_inflight: per stage, the largest number of chunks forwarded but not yet backwarded
            (chunks whose activations are alive).
        peak_weight_versions: per stage, the most weight versions held at once (> 1 only with
            ``stash_weights`` when a chunk's forward ran before a step and its backward after it).
    """

    schedule: Schedule = field(repr=False)
    makespan: float
    intervals: list[list[Interval]] = field(repr=False)
    transfers: list[Transfer] = field(repr=False)
    compute_time: list[float]
    comm_blocked: list[float]
    bubble_fraction: list[float]
    peak_inflight: list[int]
    peak_weight_versions: list[int]
    costs_note: str = field(default="", repr=False)

    @property
    def mean_bubble(self) -> float:
        """Mean of :attr:`bubble_fraction` over stages."""
        return float(np.mean(self.bubble_fraction))

    def bubble_between(self, t0: float, t1: float) -> list[float]:
        """Per stage, the fraction of ``[t0, t1)`` not spent computing."""
        if not t1 > t0:
            raise ConfigError(f"empty window [{t0}, {t1})")
        out = []
        for row in self.intervals:
            busy = sum(max(0.0, min(iv.end, t1) - max(iv.start, t0)) for iv in row)
            out.append(1.0 - busy / (t1 - t0))
        return out

    def epoch_start(self, epoch: int) -> float:
        """Earliest start of any action of ``epoch``."""
        starts = [iv.start for row in self.intervals for iv in row if iv.action.epoch == epoch]
        if not starts:
            raise ConfigError(f"the schedule has no actions of epoch {epoch}")
        return min(starts)

    def epoch_bubble(self, epoch: int) -> list[float]:
        """Per stage, the bubble over ``[start of epoch, start of the next epoch)`` (or the makespan)."""
        t1 = self.epoch_start(epoch + 1) if epoch + 1 < self.schedule.epochs else self.makespan
        return self.bubble_between(self.epoch_start(epoch), t1)

    def steady_state_bubble(self, skip: int | None = None) -> list[float]:
        """Per stage, the bubble over whole epochs once the pipeline is full: stage ``s``'s window runs
        from its first action of epoch ``skip`` to its first action of epoch ``E - skip``.

        For flush schedules every epoch is one fill-drain period, so this is the per-epoch bubble
        (``(S-1)/(C+S-1)`` with unit costs); for async-stale it is the bubble between the first fill
        and the last drain (0 with unit costs).

        Args:
            skip: epochs left out at each end; default ``ceil(S/C)``: in a 1F1B stream stage 0's first
                forward after its first backward is micro-batch ``S``, so epochs before ``ceil(S/C)``
                can still hold fill-up idle time.

        Raises:
            ConfigError: fewer than ``2·skip + 1`` epochs.
        """
        S, C, E = self.schedule.num_stages, self.schedule.num_chunks, self.schedule.epochs
        if skip is None:
            skip = max(1, math.ceil(S / C))
        if E < 2 * skip + 1:
            raise ConfigError(f"a steady-state bubble with skip={skip} needs at least {2 * skip + 1} epochs, "
                              f"the schedule has {E}")
        out = []
        for row in self.intervals:
            t0 = min(iv.start for iv in row if iv.action.epoch == skip)
            t1 = min(iv.start for iv in row if iv.action.epoch == E - skip)
            busy = sum(max(0.0, min(iv.end, t1) - max(iv.start, t0)) for iv in row)
            out.append(1.0 - busy / (t1 - t0) if t1 > t0 else 0.0)
        return out

    def summary(self) -> dict:
        """The numbers as a JSON-friendly dict."""
        d = {
            "schedule": self.schedule.name, "num_stages": self.schedule.num_stages,
            "num_chunks": self.schedule.num_chunks, "epochs": self.schedule.epochs,
            "makespan": self.makespan, "compute_time": self.compute_time, "comm_blocked": self.comm_blocked,
            "bubble_fraction": self.bubble_fraction, "mean_bubble": self.mean_bubble,
            "peak_inflight": self.peak_inflight, "peak_weight_versions": self.peak_weight_versions,
            "comm_time_total": sum(t.end - t.start for t in self.transfers),
        }
        try:
            d["steady_state_bubble"] = self.steady_state_bubble()
        except ConfigError:  # too few epochs
            pass
        return d

    def to_text(self) -> str:
        """A small table: per stage compute, send-blocked time, bubble, peak in-flight chunks."""
        sch = self.schedule
        lines = [f"{sch.name}: {sch.num_stages} stage(s), {sch.num_chunks} chunk(s), {sch.epochs} epoch(s)"
                 + (f"; {self.costs_note}" if self.costs_note else "")]
        lines.append(f"makespan {self.makespan:g}")
        head = ["stage", "compute", "send-blocked", "bubble", "peak in-flight", "weight versions"]
        rows = [[str(s), f"{self.compute_time[s]:g}", f"{self.comm_blocked[s]:g}", f"{self.bubble_fraction[s]:.1%}",
                 str(self.peak_inflight[s]), str(self.peak_weight_versions[s])] for s in range(sch.num_stages)]
        try:
            steady = self.steady_state_bubble()
        except ConfigError:  # too few epochs
            steady = None
        if steady is not None:
            head.append("steady bubble")
            for r, b in zip(rows, steady):
                r.append(f"{b:.1%}")
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths)))
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        lines.append(f"mean bubble {self.mean_bubble:.1%}")
        if self.transfers:
            lines.append(f"sends: {len(self.transfers)}, "
                         f"total link time {sum(t.end - t.start for t in self.transfers):g}")
        return "\n".join(lines)


def _memory(schedule: Schedule) -> tuple[list[int], list[int]]:
    inflight, versions = [], []
    for s in range(schedule.num_stages):
        alive: dict[tuple, int] = {}
        version, peak, peak_v = 0, 0, 1
        for a in schedule.actions(s):
            if a.kind is ActionKind.F:
                alive[(a.chunk, a.epoch)] = version
            elif a.kind is ActionKind.B:
                alive.pop((a.chunk, a.epoch), None)
            else:
                version += 1
            peak = max(peak, len(alive))
            if schedule.stash_weights:
                peak_v = max(peak_v, len(set(alive.values()) | {version}))
        inflight.append(peak)
        versions.append(peak_v)
    return inflight, versions


def simulate(schedule: Schedule, costs: CostsLike = None, comm: CommModel | None = None, *,
             barrier: bool | None = None) -> SimulationResult:
    """Simulate ``schedule`` (which need not be valid: a broken one may deadlock).

    Args:
        costs: ``None`` (unit ``F``/``B``, free ``STEP``), a number (``F`` and ``B`` both that), a
            :class:`CostModel`, a mapping ``{"F": .., "B": .., "S": ..}``, or a callable ``action -> time``.
        comm: a :class:`CommModel`; ``None`` = free, instantaneous communication.
        barrier: flush barrier between epochs (default: ``schedule.flush and schedule.epochs > 1``).

    Returns: a :class:`SimulationResult`.

    Raises:
        ScheduleError: deadlock — the message names every stuck action, what it waits for, and shows
            the grid with the stuck slots marked; also an action in another stage's row.
        ConfigError: bad costs.
    """
    dur = _cost_fn(costs)
    staged = [[(t, a) for t, a in enumerate(row) if a is not None] for row in schedule.stages]
    if barrier is None:
        barrier = schedule.flush and schedule.epochs > 1
    res = run(
        staged, num_stages=schedule.num_stages, num_chunks=schedule.num_chunks, duration=dur,
        comm_time=comm.time if comm is not None else None, overlap=comm.overlap if comm is not None else True,
        barrier=barrier, schedule_for_errors=schedule, duplex=comm.duplex if comm is not None else True,
    )
    compute = [sum(iv.end - iv.start for iv in row) for row in res.intervals]
    span = res.makespan
    bubble = [1.0 - c / span if span > 0 else 0.0 for c in compute]
    inflight, versions = _memory(schedule)
    note = ""
    if isinstance(costs, CostModel) or costs is None:
        cm = costs or CostModel()
        note = f"costs F={cm.forward:g} B={cm.backward:g} STEP={cm.step:g}"
        if cm.stage_scale is not None or cm.chunk_scale is not None:
            note += " (scaled per stage/chunk)"
    if comm is not None:
        note += f"; comm latency={comm.latency:g} bandwidth={comm.bandwidth:g} overlap={comm.overlap}"
    return SimulationResult(schedule, span, res.intervals, res.transfers, compute, res.blocked, bubble,
                            inflight, versions, note)
