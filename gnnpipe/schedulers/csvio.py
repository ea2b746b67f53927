"""CSV dump/load of a schedule in torch.distributed.pipelining's compute-only format.

One row per stage (torch: per rank; gnnpipe runs one stage per rank), one cell per time slot, each
cell an action string (``"2F0"``) or empty for an idle slot — what ``PipelineScheduleMulti._dump_csv``
writes and ``_load_csv(format="compute_only")`` reads. gnnpipe's ``STEP`` (``"0S"``) and epoch suffix
(``"0F3@1"``) are extensions torch does not know: ``to_csv(..., steps=False)`` writes ``STEP`` cells
as idle so that torch can read a single-epoch file, and ``from_csv(..., add_steps=True)`` appends the
missing steps when reading one of torch's files.
"""

from __future__ import annotations

import csv
import io
import os

from ..errors import ConfigError, ScheduleError
from .ir import Action, ActionKind, Schedule


def to_csv(schedule: Schedule, path: str | os.PathLike | None = None, *, steps: bool = True) -> str:
    """Dump ``schedule.stages`` as CSV text (and write it to ``path`` if given).

    Args:
        steps: write ``STEP`` actions (``"0S"``); ``False`` writes them as idle cells so the file is
            loadable by torch.distributed.pipelining (only meaningful for single-epoch schedules).

    Returns: the CSV text (rows end with ``"\\r\\n"`` as the csv module writes them).
    """
    buf = io.StringIO()
    writer = csv.writer(buf)
    for row in schedule.stages:
        writer.writerow(["" if a is None or (not steps and a.kind is ActionKind.STEP) else str(a) for a in row])
    text = buf.getvalue()
    if path is not None:
        with open(path, "w", newline="") as fh:
            fh.write(text)
    return text


def from_csv(
    path: str | os.PathLike | None = None,
    *,
    text: str | None = None,
    num_chunks: int | None = None,
    epochs: int | None = None,
    flush: bool = True,
    weight_staleness: int = 0,
    stash_weights: bool = False,
    name: str | None = None,
    add_steps: bool = False,
) -> Schedule:
    """Load a schedule from a CSV file (``path``) or string (``text``).

    The number of stages is the number of rows; ``num_chunks`` and ``epochs`` default to one more
    than the largest chunk id and epoch in the file. The metadata that CSV does not carry (``flush``,
    ``weight_staleness``, ``stash_weights``, ``name``) is taken from the arguments. The result is not
    validated; call :func:`~gnnpipe.schedulers.validate`.

    Args:
        add_steps: append a ``STEP`` at the end of every stage row that has none (for files written
            by torch, which has no optimizer-step action). Single-epoch files only.

    Raises:
        ConfigError: neither or both of ``path`` and ``text``; no rows; ``add_steps`` on a multi-epoch file.
        ScheduleError: a cell is not an action string (the message names row and column).
    """
    if (path is None) == (text is None):
        raise ConfigError("from_csv needs exactly one of path= or text=")
    if path is not None:
        with open(path, newline="") as fh:
            text = fh.read()
    rows: list[list[Action | None]] = []
    for r, cells in enumerate(csv.reader(io.StringIO(text))):
        row: list[Action | None] = []
        for col, cell in enumerate(cells):
            if not cell.strip():
                row.append(None)
                continue
            try:
                row.append(Action.parse(cell))
            except ScheduleError as exc:
                raise ScheduleError(f"CSV row {r} (stage {r}), column {col} (slot {col}): {exc}") from None
        rows.append(row)
    if not rows:
        raise ConfigError("the CSV holds no rows; a schedule needs one row per stage")
    acts = [a for row in rows for a in row if a is not None]
    if num_chunks is None:
        num_chunks = 1 + max((a.chunk for a in acts if a.chunk is not None), default=0)
    if epochs is None:
        epochs = 1 + max((a.epoch for a in acts), default=0)
    if add_steps:
        if epochs > 1:
            raise ConfigError("add_steps only works for single-epoch files")
        for s, row in enumerate(rows):
            if not any(a is not None and a.kind is ActionKind.STEP for a in row):
                while row and row[-1] is None:
                    row.pop()
                row.append(Action(s, ActionKind.STEP))
    return Schedule(len(rows), num_chunks, rows, epochs, flush, weight_staleness, stash_weights,
                    name if name is not None else (os.path.basename(str(path)) if path is not None else "custom"))
