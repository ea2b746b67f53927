"""The ASCII picture of a schedule (:func:`to_ascii`: the unit-cost grid, ``Schedule.stages`` as is).

Pictures of a *timed* run (chrome trace, PNG timeline) are in :mod:`gnnpipe.schedulers.timeline`.
This module sits low in the package (it reads a schedule as an :class:`~gnnpipe.schedulers.actions.Grid`
and imports only the actions), so that the IR, the validator and the event engine can all draw a schedule in
their messages without an import circle.
"""

from __future__ import annotations

from collections.abc import Mapping

from .actions import Grid

#: marks understood by :func:`to_ascii`: offending cell, related cell
MARK_BAD = "!"
MARK_RELATED = "~"


def _cell(a, mark: str | None, idle: str) -> str:
    text = idle if a is None else str(a)
    if mark == MARK_BAD:
        return f"[{text}]!"
    if mark == MARK_RELATED:
        return f"({text})"
    return text


def to_ascii(
    schedule: Grid,
    *,
    marks: Mapping[tuple[int, int], str] | None = None,
    by_stage: bool = False,
    slots: range | None = None,
    idle: str = ".",
) -> str:
    """Render the schedule's grid as text.

    By default one line per time slot and one column per stage (time slots × stages); with
    ``by_stage=True`` one line per stage and one column per slot.

    Args:
        marks: ``{(stage, slot): mark}``; ``"!"`` draws the cell as ``[1F3]!`` (offending) and ``"~"``
            as ``(0F3)`` (the action it conflicts with). Lines with a ``"!"`` end with ``<--``.
        slots: the slot range to draw (default: all); a note says when slots are left out.
        idle: text of an idle slot.

    Returns: the grid, lines joined by ``"\\n"``, no trailing newline.
    """
    marks = dict(marks or {})
    n = schedule.num_slots
    rng = range(n) if slots is None else range(max(0, slots.start), min(n, slots.stop))
    S = schedule.num_stages

    def cell(s: int, t: int) -> str:
        row = schedule.stages[s]
        return _cell(row[t] if t < len(row) else None, marks.get((s, t)), idle)

    lines: list[str] = []
    if not by_stage:
        heads = [f"stage {s}" for s in range(S)]
        table = [[cell(s, t) for s in range(S)] for t in rng]
        widths = [max([len(heads[s])] + [len(r[s]) for r in table]) for s in range(S)]
        sw = max(4, len(str(max(n - 1, 0))))
        lines.append("slot".rjust(sw) + "  " + "  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip())
        for t, r in zip(rng, table):
            line = str(t).rjust(sw) + "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths))
            line = line.rstrip()
            if any(marks.get((s, t)) == MARK_BAD for s in range(S)):
                line += "  <--"
            lines.append(line)
    else:
        cols = [[cell(s, t) for s in range(S)] for t in rng]
        widths = [max(len(str(t)), *(len(c) for c in col)) for t, col in zip(rng, cols)]
        lw = len(f"stage {S - 1}")
        lines.append("slot".ljust(lw) + "  " + "  ".join(str(t).ljust(w) for t, w in zip(rng, widths)).rstrip())
        for s in range(S):
            line = f"stage {s}".ljust(lw) + "  " + "  ".join(col[s].ljust(w) for col, w in zip(cols, widths))
            line = line.rstrip()
            if any(marks.get((s, t)) == MARK_BAD for t in rng):
                line += "  <--"
            lines.append(line)
    if len(rng) < n:
        lines.append(f"(slots {rng.start}..{rng.stop - 1} of 0..{n - 1} shown)")
    return "\n".join(lines)
