"""Discrete-event core shared by :meth:`Schedule.from_orders` (unit-cost placement) and
:func:`gnnpipe.schedulers.simulate`.

Model: every stage is one sequential device that runs its action list in order; an action starts as
soon as the stage is free and its inputs are there. Inputs: ``F(s,c,e)`` needs the boundary rows
that ``F(s-1,c,e)`` sent; ``B(s,c,e)`` needs ``F(s,c,e)`` done on the stage and (for ``s < S-1``) the
gradient that ``B(s+1,c,e)`` sent; in a second-order schedule (conservative forces) ``G(s,c,e)`` needs
``F(s,c,e)`` done and what ``G(s+1,c,e)`` sent, ``D(s,c,e)`` needs ``G(s,c,e)`` done and what ``D(s-1,c,e)`` sent,
and ``B(s,c,e)`` waits for ``D(s,c,e)`` instead of ``F``; ``STEP(s,e)`` needs every ``B(s,·,e)`` done on the stage; with
a *barrier* (flush schedules over several epochs) the first action of epoch ``e`` on a stage also needs
every stage's ``STEP`` of epoch ``e-1``. Sends go over one link per (source, destination) pair and
direction, first come first served; with overlap the sender goes on computing, without it the sender
is busy until the send is done. Sends are buffered (a send never waits for the receiver).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ScheduleError
from .actions import Action, ActionKind, Grid
from .render import to_ascii


@dataclass(frozen=True)
class Interval:
    """One executed action: it ran on ``stage`` over ``[start, end)``; ``slot`` is its grid slot."""

    stage: int
    action: Action
    start: float
    end: float
    slot: int


@dataclass(frozen=True)
class Transfer:
    """One boundary send: ``action``'s output (``F``) or input gradient (``B``) from ``src`` to ``dst``
    over ``[start, end)`` (``start`` may be after the action ended when the link was busy)."""

    src: int
    dst: int
    action: Action
    start: float
    end: float


@dataclass
class EngineResult:
    intervals: list[list[Interval]]
    transfers: list[Transfer] = field(default_factory=list)
    blocked: list[float] = field(default_factory=list)  # time each stage spent sending (no overlap)
    makespan: float = 0.0


def send_direction(kind: ActionKind) -> int:
    """Where an action's result goes: ``+1`` (``F``, ``D``: to the next stage), ``-1`` (``B``, ``G``: to the
    previous one), ``0`` (``STEP``)."""
    return {ActionKind.F: 1, ActionKind.D: 1, ActionKind.B: -1, ActionKind.G: -1}.get(kind, 0)


def _deps(a: Action, num_stages: int, num_chunks: int, barrier_first: bool, second_order: bool = False) -> list[tuple]:
    """Dependency keys of ``a``: ``("arr", key)`` = data of ``key`` arrived at a's stage,
    ``("done", key)`` = ``key`` finished on its own stage. ``second_order``: the schedule has ``G``/``D`` passes
    (a chunk runs ``F``, ``G``, ``D``, ``B`` on each stage)."""
    s, e = a.stage, a.epoch
    out: list[tuple] = []
    if a.kind is ActionKind.F:
        if s > 0:
            out.append(("arr", (ActionKind.F, s - 1, a.chunk, e)))
    elif a.kind is ActionKind.G:
        out.append(("done", (ActionKind.F, s, a.chunk, e)))
        if s < num_stages - 1:
            out.append(("arr", (ActionKind.G, s + 1, a.chunk, e)))
    elif a.kind is ActionKind.D:
        out.append(("done", (ActionKind.G, s, a.chunk, e)))
        if s > 0:
            out.append(("arr", (ActionKind.D, s - 1, a.chunk, e)))
    elif a.kind is ActionKind.B:
        out.append(("done", (ActionKind.D if second_order else ActionKind.F, s, a.chunk, e)))
        if s < num_stages - 1:
            out.append(("arr", (ActionKind.B, s + 1, a.chunk, e)))
    else:
        out.extend(("done", (ActionKind.B, s, c, e)) for c in range(num_chunks))
    if barrier_first and e > 0:
        out.extend(("done", (ActionKind.STEP, t, None, e - 1)) for t in range(num_stages))
    return out


def run(
    staged: list[list[tuple[int, Action]]],
    *,
    num_stages: int,
    num_chunks: int,
    duration: Callable[[Action], float],
    comm_time: Callable[[int, int, Action], float] | None = None,
    overlap: bool = True,
    barrier: bool = False,
    schedule_for_errors: Grid | None = None,
    duplex: bool = True,
) -> EngineResult:
    """Run the per-stage orders ``staged[s] = [(slot, action), ...]``.

    Raises:
        ScheduleError: an action sits in the row of another stage, a duration is negative, or the
            run deadlocks (the message names every stuck action and what it waits for).
    """
    S = num_stages
    for s, row in enumerate(staged):
        for slot, a in row:
            if a.stage != s:
                raise ScheduleError(f"action {a} is in the row of stage {s} (slot {slot}); move it to row {a.stage}")
    present = {a.key for row in staged for _, a in row}
    second = any(a.kind in (ActionKind.G, ActionKind.D) for row in staged for _, a in row)
    seen_epoch: list[set[int]] = [set() for _ in range(S)]
    deps: list[list[list[tuple]]] = []
    for s, row in enumerate(staged):
        row_deps = []
        for _, a in row:
            first = a.epoch not in seen_epoch[s]
            seen_epoch[s].add(a.epoch)
            row_deps.append(_deps(a, S, num_chunks, barrier and first, second))
        deps.append(row_deps)

    done: dict[tuple, float] = {}
    arrived: dict[tuple, float] = {}
    ptr = [0] * S
    busy = [False] * S
    link_free: dict[tuple[int, int], float] = {}
    intervals: list[list[Interval]] = [[] for _ in range(S)]
    transfers: list[Transfer] = []
    blocked = [0.0] * S
    heap: list[tuple] = []
    seq = 0

    def push(t: float, kind: str, payload) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, payload))
        seq += 1

    def ok(dep: tuple) -> bool:
        return dep[1] in (arrived if dep[0] == "arr" else done)

    def try_start(s: int, t: float) -> None:
        if busy[s] or ptr[s] >= len(staged[s]):
            return
        if not all(ok(d) for d in deps[s][ptr[s]]):
            return
        slot, a = staged[s][ptr[s]]
        d = float(duration(a))
        if not d >= 0:  # negative or NaN
            raise ScheduleError(f"the cost of {a} is {d}; costs must be non-negative numbers")
        busy[s] = True
        push(t + d, "end", (s, slot, a, t))

    t = 0.0
    for s in range(S):
        try_start(s, t)
    while heap:
        t, _, kind, payload = heapq.heappop(heap)
        if kind == "end":
            s, slot, a, start = payload
            intervals[s].append(Interval(s, a, start, t, slot))
            done[a.key] = t
            ptr[s] += 1
            step = send_direction(a.kind)
            dst = s + step if step else None
            if dst is None or not 0 <= dst < S:
                busy[s] = False
            else:
                ct = float(comm_time(s, dst, a)) if comm_time is not None else 0.0
                if not ct >= 0:  # negative or NaN
                    raise ScheduleError(f"the communication time of {a} is {ct}; it must be non-negative")
                if ct == 0:
                    arrived[a.key] = t
                    busy[s] = False
                else:
                    lk = (s, dst) if duplex else (min(s, dst), max(s, dst))  # half duplex: one channel per pair
                    st = max(t, link_free.get(lk, 0.0))
                    link_free[lk] = st + ct
                    transfers.append(Transfer(s, dst, a, st, st + ct))
                    push(st + ct, "arrive", a.key)
                    if overlap:
                        busy[s] = False
                    else:
                        blocked[s] += st + ct - t
                        push(st + ct, "free", s)
        elif kind == "arrive":
            arrived[payload] = t
        else:  # "free"
            busy[payload] = False
        for s in range(S):
            try_start(s, t)

    stuck = [s for s in range(S) if ptr[s] < len(staged[s])]
    if stuck:
        raise _deadlock_error(staged, deps, ptr, stuck, present, ok, t, schedule_for_errors)
    makespan = max((iv.end for row in intervals for iv in row), default=0.0)
    makespan = max([makespan] + [tr.end for tr in transfers])
    return EngineResult(intervals, transfers, blocked, makespan)


def _describe_key(key: tuple) -> str:
    kind, stage, chunk, epoch = key
    return str(Action(stage, kind, chunk, epoch))


def _deadlock_error(staged, deps, ptr, stuck, present, ok, t, schedule) -> ScheduleError:
    where: dict[tuple, tuple[int, int]] = {}
    for s, row in enumerate(staged):
        for i, (_, a) in enumerate(row):
            where.setdefault(a.key, (s, i))
    lines = []
    marks: dict[tuple[int, int], str] = {}
    for s in stuck:
        slot, a = staged[s][ptr[s]]
        marks[(s, slot)] = "!"
        missing = []
        for dep in deps[s][ptr[s]]:
            if ok(dep):
                continue
            key = dep[1]
            name = _describe_key(key)
            if key not in present:
                missing.append(f"{name}, which is not in the schedule")
            else:
                ws = where[key][0]
                blocker = staged[ws][ptr[ws]][1] if ptr[ws] < len(staged[ws]) else None
                if blocker is not None and blocker.key == key:
                    missing.append(f"{name} (itself stuck)")
                elif blocker is not None:
                    missing.append(f"{name} (stage {ws} is stuck at {blocker} before it)")
                else:
                    missing.append(name)
        lines.append(f"  stage {s} is stuck at {a} (slot {slot}), waiting for " + "; ".join(missing))
    msg = (
        f"deadlock at time {t:g}: no stage can make progress; "
        f"{sum(len(staged[s]) - ptr[s] for s in stuck)} action(s) never run.\n" + "\n".join(lines)
    )
    if schedule is not None:
        msg += "\n\n" + to_ascii(schedule, marks=marks)
    err = ScheduleError(msg)
    err.stuck = [staged[s][ptr[s]][1] for s in stuck]  # type: ignore[attr-defined]
    return err
