"""The schedule IR: :class:`ActionKind`, :class:`Action` and :class:`Schedule`.

A *schedule* says, for every pipeline stage, the ordered list of actions that stage's rank executes
in one epoch (or in several consecutive epochs, see :attr:`Schedule.epochs`). The runtime executes
``schedule.stages[s]`` on the rank of stage ``s`` in order, skipping ``None`` entries.

Action kinds (everything the runtime must see):

* ``F`` — forward of one chunk through the stage's layer units. On a stage ``s > 0`` it first
  receives the chunk's boundary rows from ``s - 1``; on ``s < S - 1`` it ends by sending them to
  ``s + 1``.
* ``B`` — backward of one chunk (input and weight gradients together, the "full backward" of
  torch.distributed.pipelining). On ``s < S - 1`` it first receives the boundary gradient from
  ``s + 1``; on ``s > 0`` it ends by sending the gradient to ``s - 1``. Weight gradients accumulate
  until the stage's next ``STEP``.
* ``G`` and ``D`` — the two extra passes of training with conservative forces ``F = −∂E/∂pos`` (S2EF):
  ``G`` of a chunk runs last stage → first (receives the gradient of its outputs from ``s + 1``, differentiates
  with ``create_graph=True``, sends its inputs' gradient to ``s − 1``); ``D`` runs first → last (receives the
  force loss's gradient of what ``G`` sent, back-propagates it into the ``G`` graph, sends on to ``s + 1``).
  A schedule has them for every chunk and stage or not at all (:attr:`Schedule.second_order`); on a stage a
  chunk runs ``F``, ``G``, ``D``, ``B`` in that order.
* ``STEP`` (text ``S``) — the stage's optimizer step, which also closes the epoch *on that stage*:
  per-stage end-of-epoch work (e.g. correctors that zero or snapshot history) runs here. It carries no
  chunk.

Sends and receives are implied by ``F``/``B`` (as in torch.distributed.pipelining's compute-only
format), so they are not actions of their own.

Text codec (the format of torch.distributed.pipelining's ``_Action``): ``"{stage}{kind}{chunk}"``,
e.g. ``"2F0"`` (stage 2 forward chunk 0), ``"1B3"``; the step is ``"0S"`` (no chunk). In a schedule
that spans several epochs, actions of epoch ``e > 0`` carry a suffix ``"@e"`` (``"0F3@1"``); epoch 0
has none, so single-epoch schedules print exactly like torch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import ScheduleError
from ._engine import run
from .actions import (  # noqa: F401  (re-exported: the IR's public names)
    STEP,
    Action,
    ActionKind,
    B,
    D,
    F,
    G,
    _is_nonneg_int,
    check_chunk_order,
    parse_actions,
)
from .render import to_ascii


@dataclass(eq=True)
class Schedule:
    """Per-stage action lists on a time grid.

    Attributes:
        num_stages: ``S``, the number of pipeline stages (one rank each).
        num_chunks: ``C``, the number of chunks per epoch.
        stages: ``S`` lists; ``stages[s][t]`` is the action stage ``s`` runs in slot ``t`` or ``None``
            for an idle slot. The slot index is the time step of the unit-cost grid (every action one
            slot, no communication time); rows may have different lengths. Only the order matters
            to the runtime and to :func:`~gnnpipe.schedulers.simulate`; the slots matter to
            :func:`~gnnpipe.schedulers.validate` (cross-stage order) and to the pictures.
        epochs: number of consecutive epochs the lists span (actions carry ``epoch`` in ``[0, epochs)``).
        flush: ``True`` if the pipeline drains and every stage steps once per epoch on fresh weights
            (gpipe, 1f1b); ``False`` if epochs overlap (async-stale).
        weight_staleness: declared bound, in weight versions, on how old the weights a forward uses
            may be (0 for flush schedules); :func:`~gnnpipe.schedulers.validate` checks it.
        stash_weights: the runtime keeps the weight version a chunk's forward used for its backward.
        name: the scheduler that built it (``"custom"`` otherwise).

    Rows may also be given as action strings (``"2F0"``, ``""`` for idle); they are parsed.

    Raises:
        ScheduleError: wrong number of rows or a cell that is neither an action, ``None`` nor parsable.
    """

    num_stages: int
    num_chunks: int
    stages: list[list[Action | None]]
    epochs: int = 1
    flush: bool = True
    weight_staleness: int = 0
    stash_weights: bool = False
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if not _is_nonneg_int(self.num_stages) or self.num_stages < 1:
            raise ScheduleError(f"num_stages must be a positive int, got {self.num_stages!r}")
        if not _is_nonneg_int(self.num_chunks) or self.num_chunks < 1:
            raise ScheduleError(f"num_chunks must be a positive int, got {self.num_chunks!r}")
        if not _is_nonneg_int(self.epochs) or self.epochs < 1:
            raise ScheduleError(f"epochs must be a positive int, got {self.epochs!r}")
        if len(self.stages) != self.num_stages:
            raise ScheduleError(
                f"a schedule with {self.num_stages} stages needs {self.num_stages} rows, got {len(self.stages)}"
            )
        rows = []
        for s, row in enumerate(self.stages):
            cells: list[Action | None] = []
            for cell in row:
                if cell is None or isinstance(cell, Action):
                    cells.append(cell)
                elif isinstance(cell, str):
                    cells.append(Action.parse(cell) if cell.strip() else None)
                else:
                    raise ScheduleError(
                        f"stage {s}: a schedule cell must be an Action, an action string or None, got {cell!r}"
                    )
            rows.append(cells)
        self.stages = rows

    # -- views ------------------------------------------------------------------------------------
    @property
    def second_order(self) -> bool:
        """Whether the schedule has the ``G`` / ``D`` passes of conservative-force training (any such action)."""
        return any(a is not None and a.kind in (ActionKind.G, ActionKind.D) for row in self.stages for a in row)

    @property
    def num_slots(self) -> int:
        """Length of the longest row (the unit-cost grid's number of time steps)."""
        return max((len(r) for r in self.stages), default=0)

    def actions(self, stage: int) -> list[Action]:
        """Stage ``stage``'s actions in execution order, idle slots dropped."""
        return [a for a in self.stages[stage] if a is not None]

    def iter_slots(self) -> Iterator[tuple[int, int, Action]]:
        """Yield ``(stage, slot, action)`` for every non-idle cell."""
        for s, row in enumerate(self.stages):
            for t, a in enumerate(row):
                if a is not None:
                    yield s, t, a

    def slot_index(self) -> dict[tuple, tuple[int, int]]:
        """Map ``action.key`` → ``(stage_row, slot)`` (for duplicates, the first occurrence)."""
        out: dict[tuple, tuple[int, int]] = {}
        for s, t, a in self.iter_slots():
            out.setdefault(a.key, (s, t))
        return out

    def weight_versions(self) -> dict[tuple, int]:
        """Weight version each action of each stage runs with: the number of ``STEP``s before it on its
        stage (without stashing; with :attr:`stash_weights` a ``B`` uses its ``F``'s version).

        Returns: ``action.key`` → version.
        """
        out: dict[tuple, int] = {}
        for s in range(self.num_stages):
            version = 0
            for a in self.actions(s):
                out.setdefault(a.key, version)
                if a.kind is ActionKind.STEP:
                    version += 1
        return out

    def max_weight_staleness(self) -> int:
        """Largest ``epoch - version`` over all forwards: how many optimizer steps a forward of epoch
        ``e`` misses compared with synchronous training, where it runs on version ``e``."""
        versions = self.weight_versions()
        return max(
            (max(0, a.epoch - versions[a.key]) for _, _, a in self.iter_slots() if a.kind is ActionKind.F),
            default=0,
        )

    def with_metadata(self, **changes) -> Schedule:
        """A copy with some of the non-grid fields changed (``name``, ``flush``, …)."""
        return dataclasses.replace(self, stages=[list(r) for r in self.stages], **changes)

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_orders(
        cls,
        num_stages: int,
        num_chunks: int,
        orders: Sequence[Sequence[Action | str]],
        *,
        epochs: int | None = None,
        flush: bool = True,
        weight_staleness: int = 0,
        stash_weights: bool = False,
        name: str = "custom",
    ) -> Schedule:
        """Place per-stage action *orders* on the unit-cost grid, as early as the order and the
        cross-stage dependencies allow (every action, ``STEP`` included, takes one slot).

        Dependencies: ``F(s,c)`` after ``F(s-1,c)``; ``B(s,c)`` after ``B(s+1,c)`` and after ``F(s,c)``
        (second-order schedules: ``G(s,c)`` after ``F(s,c)`` and ``G(s+1,c)``, ``D(s,c)`` after ``G(s,c)`` and
        ``D(s-1,c)``, ``B(s,c)`` after ``D(s,c)`` and ``B(s+1,c)``);
        ``STEP(s,e)`` after every ``B(s,·,e)``; with ``flush`` the first action of epoch ``e > 0`` on
        any stage also waits for every stage's ``STEP`` of epoch ``e - 1``.

        Args:
            orders: ``S`` sequences of actions (or action strings), no idle entries needed.
            epochs: defaults to ``1 + max(action.epoch)``.

        Raises:
            ScheduleError: the orders deadlock (the message names the stuck actions).
        """
        rows = [[Action.parse(a) if isinstance(a, str) else a for a in row] for row in orders]
        if epochs is None:
            epochs = 1 + max((a.epoch for row in rows for a in row if a is not None), default=0)
        staged = [[(i, a) for i, a in enumerate(row) if a is not None] for row in rows]
        preview = cls(num_stages, num_chunks, [list(r) for r in rows], epochs, flush, weight_staleness,
                      stash_weights, name)
        res = run(
            staged,
            num_stages=num_stages,
            num_chunks=num_chunks,
            duration=lambda a: 1,
            barrier=flush and epochs > 1,
            schedule_for_errors=preview,
        )
        grid: list[list[Action | None]] = []
        for s in range(num_stages):
            row: list[Action | None] = []
            for iv in res.intervals[s]:
                t = int(iv.start)
                row.extend([None] * (t - len(row)))
                row.append(iv.action)
            grid.append(row)
        return cls(num_stages, num_chunks, grid, epochs, flush, weight_staleness, stash_weights, name)

    # -- output shortcuts -------------------------------------------------------------------------
    def to_ascii(self, **kwargs) -> str:
        """See :func:`gnnpipe.schedulers.to_ascii`."""
        return to_ascii(self, **kwargs)

    def __str__(self) -> str:
        return self.to_ascii()
