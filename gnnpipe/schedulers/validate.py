"""Validation of a :class:`~gnnpipe.schedulers.Schedule` against the pipeline's ordering rules.

Rules (all checked; every violation is reported):

1. *Placement*: an action sits in the row of its own stage; its chunk is in ``[0, num_chunks)`` and its
   epoch in ``[0, epochs)``.
2. *Counts*: on every stage, every chunk has exactly one ``F`` and one ``B`` per epoch, and every
   epoch has exactly one ``STEP`` (the per-stage optimizer step; gradients accumulate over all chunks).
3. *Stage order*: ``F(s,c,e)`` before ``B(s,c,e)``; ``STEP(s,e)`` after every ``B(s,·,e)`` and before
   any ``B(s,·,e+1)`` (a step applies exactly one epoch's gradients); forwards (and backwards) of a
   stage run epoch by epoch.
4. *Cross-stage order* (the data dependencies of a pipeline, as in GPipe, Huang et al. 2019, and
   torch.distributed.pipelining's ``_validate_pipeline_order``): in grid slots,
   ``F(s,c,e)`` after ``F(s-1,c,e)`` and ``B(s,c,e)`` after ``B(s+1,c,e)``.
   Second-order schedules (``G``/``D`` passes, :attr:`Schedule.second_order`): every chunk also has one ``G``
   and one ``D`` per stage and epoch, a chunk runs ``F``, ``G``, ``D``, ``B`` in that order on its stage, and
   ``G(s,c,e)`` follows ``G(s+1,c,e)``, ``D(s,c,e)`` follows ``D(s-1,c,e)`` (the cross-stage rules of rule 4).
5. *Weight staleness*: no forward runs on weights more than ``schedule.weight_staleness`` optimizer
   steps older than synchronous training would use (0 for flush schedules).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise

from ..errors import ScheduleError
from .ir import ActionKind, Schedule
from .render import MARK_BAD, MARK_RELATED, to_ascii

#: at most this many violations are listed in a message (all are on ``ScheduleError.violations``)
MAX_LISTED = 12
#: grids longer than this are cut to a window around the first offending slot
MAX_GRID_SLOTS = 64


@dataclass(frozen=True)
class Violation:
    """One broken rule: where (``stage``, ``slot``; ``None`` when the problem is a missing action),
    what, and the related cell it conflicts with (if any)."""

    stage: int | None
    slot: int | None
    message: str
    related: tuple[int, int] | None = None

    def __str__(self) -> str:
        where = f"stage {self.stage}" if self.stage is not None else "schedule"
        if self.slot is not None:
            where += f", slot {self.slot}"
        return f"{where}: {self.message}"


def find_violations(schedule: Schedule) -> list[Violation]:
    """Every violation of the rules in this module's docstring, sorted by slot (missing actions last)."""
    S, C, E = schedule.num_stages, schedule.num_chunks, schedule.epochs
    out: list[Violation] = []
    occ: dict[tuple, list[tuple[int, int]]] = defaultdict(list)

    # 1. placement
    for s, t, a in schedule.iter_slots():
        if a.stage != s:
            out.append(Violation(s, t, f"{a} belongs to stage {a.stage} but sits in the row of stage {s}"))
            continue
        if a.chunk is not None and a.chunk >= C:
            out.append(Violation(s, t, f"{a} names chunk {a.chunk}, but the schedule has {C} chunk(s) (0..{C - 1})"))
            continue
        if a.epoch >= E:
            out.append(Violation(s, t, f"{a} is in epoch {a.epoch}, but the schedule spans {E} epoch(s)"))
            continue
        occ[a.key].append((s, t))

    # 2. counts
    def count(kind: ActionKind, s: int, c, e: int, what: str) -> None:
        where = occ.get((kind, s, c, e), [])
        if not where:
            ep = f" in epoch {e}" if E > 1 else ""
            out.append(Violation(s, None, f"has no {what}{ep}"))
        for (s2, t2) in where[1:]:
            out.append(Violation(s2, t2, f"{schedule.stages[s2][t2]} is a duplicate of slot {where[0][1]}",
                                 related=where[0]))

    second = schedule.second_order
    for s in range(S):
        for e in range(E):
            for c in range(C):
                count(ActionKind.F, s, c, e, f"forward F of chunk {c} ({s}F{c})")
                count(ActionKind.B, s, c, e, f"backward B of chunk {c} ({s}B{c})")
                if second:
                    count(ActionKind.G, s, c, e, f"position-gradient pass G of chunk {c} ({s}G{c})")
                    count(ActionKind.D, s, c, e, f"second-order pass D of chunk {c} ({s}D{c})")
            count(ActionKind.STEP, s, None, e, f"optimizer step ({s}S)")

    def slot(kind: ActionKind, s: int, c, e: int) -> int | None:
        where = occ.get((kind, s, c, e))
        return where[0][1] if where else None

    # 3. stage order
    for s in range(S):
        for e in range(E):
            st = slot(ActionKind.STEP, s, None, e)
            st_prev = slot(ActionKind.STEP, s, None, e - 1) if e > 0 else None
            for c in range(C):
                f, b = slot(ActionKind.F, s, c, e), slot(ActionKind.B, s, c, e)
                a_b = schedule.stages[s][b] if b is not None else None
                if second:
                    chain = [(k, slot(k, s, c, e)) for k in (ActionKind.F, ActionKind.G, ActionKind.D, ActionKind.B)]
                    chain = [(k, t) for k, t in chain if t is not None]
                    for (_, t0), (_, t1) in pairwise(chain):
                        if t1 < t0:
                            out.append(Violation(s, t1, f"{schedule.stages[s][t1]} runs before "
                                                        f"{schedule.stages[s][t0]} (slot {t0}); a chunk runs F, G, D, "
                                                        f"B in that order on its stage", related=(s, t0)))
                if f is not None and b is not None and b < f:
                    out.append(Violation(s, b, f"{a_b} runs before its forward {schedule.stages[s][f]} (slot {f}); "
                                               f"a chunk's backward must follow its forward on the stage",
                                         related=(s, f)))
                if st is not None and b is not None and st < b:
                    out.append(Violation(s, st, f"{schedule.stages[s][st]} runs before {a_b} (slot {b}); the "
                                                f"optimizer step must follow every backward of its epoch",
                                         related=(s, b)))
                if st_prev is not None and b is not None and b < st_prev:
                    out.append(Violation(s, b, f"{a_b} runs before {schedule.stages[s][st_prev]} (slot {st_prev}); "
                                               f"its gradient would be applied by the previous epoch's step",
                                         related=(s, st_prev)))
        for kind in (ActionKind.F, ActionKind.B):
            top, top_t = -1, None
            for t, a in enumerate(schedule.stages[s]):
                if a is None or a.kind is not kind or a.stage != s:
                    continue
                if a.epoch < top:
                    out.append(Violation(s, t, f"{a} runs after {schedule.stages[s][top_t]} (slot {top_t}) of a "
                                               f"later epoch; a stage runs its {kind.name}s epoch by epoch",
                                         related=(s, top_t)))
                elif a.epoch > top:
                    top, top_t = a.epoch, t

    # 4. cross-stage order
    for (kind, s, c, e), where in occ.items():
        t = where[0][1]
        if kind is ActionKind.F and s > 0:
            u = slot(ActionKind.F, s - 1, c, e)
            if u is not None and u >= t:
                out.append(Violation(s, t, f"{schedule.stages[s][t]} runs at slot {t}, not after "
                                           f"{schedule.stages[s - 1][u]} (slot {u}); F(s,c) must come after F(s-1,c)",
                                     related=(s - 1, u)))
        if kind in (ActionKind.B, ActionKind.G) and s < S - 1:
            u = slot(kind, s + 1, c, e)
            if u is not None and u >= t:
                out.append(Violation(s, t, f"{schedule.stages[s][t]} runs at slot {t}, not after "
                                           f"{schedule.stages[s + 1][u]} (slot {u}); {kind.name}(s,c) must come "
                                           f"after {kind.name}(s+1,c)", related=(s + 1, u)))
        if kind is ActionKind.D and s > 0:
            u = slot(ActionKind.D, s - 1, c, e)
            if u is not None and u >= t:
                out.append(Violation(s, t, f"{schedule.stages[s][t]} runs at slot {t}, not after "
                                           f"{schedule.stages[s - 1][u]} (slot {u}); D(s,c) must come after D(s-1,c)",
                                     related=(s - 1, u)))

    # 5. weight staleness
    for s in range(S):
        version = 0
        for t, a in enumerate(schedule.stages[s]):
            if a is None or a.stage != s:
                continue
            if a.kind is ActionKind.STEP:
                version += 1
            elif a.kind is ActionKind.F and a.epoch - version > schedule.weight_staleness:
                out.append(Violation(s, t, f"{a} runs on weight version {version}, {a.epoch - version} step(s) "
                                           f"behind its epoch {a.epoch}, but the schedule declares "
                                           f"weight_staleness={schedule.weight_staleness}"
                                           + (" (flush)" if schedule.flush else "")))

    out.sort(key=lambda v: (v.slot is None, v.slot if v.slot is not None else 0, v.stage or 0))
    return out


def format_violations(schedule: Schedule, violations: list[Violation]) -> str:
    """The error message: a summary, the listed violations, and the grid with offending cells marked."""
    marks: dict[tuple[int, int], str] = {}
    for v in violations:
        if v.related is not None:
            marks.setdefault(v.related, MARK_RELATED)
    for v in violations:
        if v.slot is not None and v.stage is not None:
            marks[(v.stage, v.slot)] = MARK_BAD
    head = (f"invalid schedule {schedule.name!r} ({schedule.num_stages} stage(s), {schedule.num_chunks} "
            f"chunk(s), {schedule.epochs} epoch(s)): {len(violations)} problem(s)")
    lines = [head]
    lines += [f"  - {v}" for v in violations[:MAX_LISTED]]
    if len(violations) > MAX_LISTED:
        lines.append(f"  ... and {len(violations) - MAX_LISTED} more")
    slots = None
    if schedule.num_slots > MAX_GRID_SLOTS:
        first = next((v.slot for v in violations if v.slot is not None), 0)
        lo = max(0, first - 12)
        slots = range(lo, lo + MAX_GRID_SLOTS)
    lines.append("")
    lines.append("[X]! = offending action, (X) = the action it conflicts with:")
    lines.append(to_ascii(schedule, marks=marks, slots=slots))
    return "\n".join(lines)


def validate(schedule: Schedule) -> Schedule:
    """Check ``schedule`` against every rule of this module and return it unchanged.

    Raises:
        ScheduleError: one or more violations; the message lists them and prints the grid with the
            offending slots marked ``[1F3]!``; the list is also on the exception's ``violations``.
    """
    if not isinstance(schedule, Schedule):
        raise ScheduleError(f"validate() expects a Schedule, got {type(schedule).__name__}")
    violations = find_violations(schedule)
    if violations:
        err = ScheduleError(format_violations(schedule, violations))
        err.violations = violations  # type: ignore[attr-defined]
        raise err
    return schedule
