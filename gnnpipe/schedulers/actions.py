"""The actions of a schedule: :class:`ActionKind`, :class:`Action` and their text codec.

The bottom of :mod:`gnnpipe.schedulers`: it imports nothing else of the package (the IR, the renderer and
the event engine all build on it). :class:`Grid` is what the renderer and the event engine read of a
schedule, so that they need not import the IR that uses them. See :mod:`gnnpipe.schedulers.ir` for what each kind means
at runtime.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import ConfigError, ScheduleError


class ActionKind(str, enum.Enum):
    """What an :class:`Action` does; the value is its one-letter code in the text codec."""

    F = "F"
    """Forward of a chunk through the stage's units (receives before / sends after, see module doc)."""
    B = "B"
    """Full backward of a chunk (input and weight gradients; the pull backward of the chunk op)."""
    STEP = "S"
    """The stage's optimizer step; also the stage's end-of-epoch hook point. Has no chunk."""
    G = "G"
    """Position-gradient pass of a chunk (conservative forces ``F = −∂E/∂pos``), last stage → first: the stage
    differentiates its outputs with ``create_graph=True`` and sends the gradient of its inputs to ``s−1``."""
    D = "D"
    """Second-order pass of a chunk (the force loss differentiated through the ``G`` pass), first stage → last:
    the stage back-propagates into its ``G`` graph and sends the gradient of the ``G`` seed it received to
    ``s+1``. A chunk's actions on a stage run ``F``, ``G``, ``D``, ``B``."""

    @property
    def has_chunk(self) -> bool:
        """Whether actions of this kind name a chunk (``F``, ``B``, ``G``, ``D`` do, ``STEP`` does not)."""
        return self is not ActionKind.STEP

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: ActionKind | str) -> ActionKind:
        """``ActionKind`` from itself, its code (``"F"``, ``"B"``, ``"S"``, ``"G"``, ``"D"``) or its name (``"STEP"``).

        Raises:
            ScheduleError: unknown kind.
        """
        if isinstance(value, ActionKind):
            return value
        if isinstance(value, str):
            v = value.strip().upper()
            for k in cls:
                if v in (k.value, k.name):
                    return k
        raise ScheduleError(f"unknown action kind {value!r}; expected one of F, B, S (STEP), G, D")


_ACTION_RE = re.compile(r"^(\d+)(F|B|S|G|D)(\d*)(?:@(\d+))?$")


@dataclass(frozen=True, slots=True)
class Action:
    """One entry of a stage's action list.

    Args:
        stage: the stage that executes it (must equal its row in :attr:`Schedule.stages`).
        kind: an :class:`ActionKind` (or its code ``"F"``/``"B"``/``"S"``/``"G"``/``"D"``).
        chunk: the chunk id for ``F``, ``B``, ``G``, ``D``; must be ``None`` for ``STEP``.
        epoch: the epoch it belongs to, counted from the first epoch of its schedule (default 0).

    Raises:
        ScheduleError: negative ids, a chunk on ``STEP`` or none on ``F``/``B``/``G``/``D``.
    """

    stage: int
    kind: ActionKind
    chunk: int | None = None
    epoch: int = 0

    def __post_init__(self) -> None:
        kind = ActionKind.parse(self.kind)
        object.__setattr__(self, "kind", kind)
        if not _is_nonneg_int(self.stage):
            raise ScheduleError(f"action stage must be a non-negative int, got {self.stage!r}")
        if not _is_nonneg_int(self.epoch):
            raise ScheduleError(f"action epoch must be a non-negative int, got {self.epoch!r}")
        if kind.has_chunk:
            if not _is_nonneg_int(self.chunk):
                raise ScheduleError(
                    f"a {kind.name} action needs a non-negative int chunk, got {self.chunk!r}"
                )
        elif self.chunk is not None:
            raise ScheduleError(f"a STEP action has no chunk, got chunk={self.chunk!r}")

    # -- text codec -------------------------------------------------------------------------------
    def __str__(self) -> str:
        text = f"{self.stage}{self.kind.value}{'' if self.chunk is None else self.chunk}"
        return f"{text}@{self.epoch}" if self.epoch else text

    def __repr__(self) -> str:
        return f"Action({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of ``str(action)``: ``"2F0"``, ``"1B3"``, ``"0S"``, ``"0F3@1"``.

        Raises:
            ScheduleError: the text does not match ``{stage}{F|B|S}{chunk}[@{epoch}]``.
        """
        m = _ACTION_RE.match(text.strip()) if isinstance(text, str) else None
        if m is None:
            raise ScheduleError(
                f"cannot parse action {text!r}: expected '{{stage}}{{F|B|S|G|D}}{{chunk}}[@{{epoch}}]', "
                f"e.g. '2F0', '1B3', '0S', '0F3@1'"
            )
        stage, kind, chunk, epoch = m.groups()
        return cls(int(stage), ActionKind(kind), int(chunk) if chunk else None, int(epoch or 0))

    from_str = parse

    @property
    def key(self) -> tuple[ActionKind, int, int | None, int]:
        """``(kind, stage, chunk, epoch)`` — identifies the action within a schedule."""
        return (self.kind, self.stage, self.chunk, self.epoch)

    def with_epoch(self, epoch: int) -> Action:
        """A copy of this action labelled with ``epoch``."""
        return dataclasses.replace(self, epoch=epoch)


def F(stage: int, chunk: int, epoch: int = 0) -> Action:
    """Shorthand for ``Action(stage, ActionKind.F, chunk, epoch)``."""
    return Action(stage, ActionKind.F, chunk, epoch)


def B(stage: int, chunk: int, epoch: int = 0) -> Action:
    """Shorthand for ``Action(stage, ActionKind.B, chunk, epoch)``."""
    return Action(stage, ActionKind.B, chunk, epoch)


def G(stage: int, chunk: int, epoch: int = 0) -> Action:
    """Shorthand for ``Action(stage, ActionKind.G, chunk, epoch)``."""
    return Action(stage, ActionKind.G, chunk, epoch)


def D(stage: int, chunk: int, epoch: int = 0) -> Action:
    """Shorthand for ``Action(stage, ActionKind.D, chunk, epoch)``."""
    return Action(stage, ActionKind.D, chunk, epoch)


def STEP(stage: int, epoch: int = 0) -> Action:
    """Shorthand for ``Action(stage, ActionKind.STEP, None, epoch)``."""
    return Action(stage, ActionKind.STEP, None, epoch)


def _is_nonneg_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def parse_actions(texts: Iterable[str]) -> list[Action | None]:
    """Parse a sequence of action strings; empty strings become ``None`` (idle)."""
    return [Action.parse(t) if t.strip() else None for t in texts]


def check_chunk_order(num_stages: int, chunk_order: Sequence[int]) -> list[int]:
    """Validate a scheduler's inputs and return the chunk order as a list.

    Raises:
        ConfigError: ``num_stages < 1``, empty order, or an order that is not a permutation of
            ``range(len(chunk_order))``.
    """
    if not _is_nonneg_int(num_stages) or num_stages < 1:
        raise ConfigError(f"num_stages must be a positive int, got {num_stages!r}")
    order = list(chunk_order)
    if not order:
        raise ConfigError("the chunk order is empty; a schedule needs at least one chunk")
    if not all(_is_nonneg_int(c) for c in order) or sorted(order) != list(range(len(order))):
        raise ConfigError(
            f"the chunk order must be a permutation of 0..{len(order) - 1}, got {order!r}"
        )
    return order


class Grid(Protocol):
    """What the renderer and the event engine read of a schedule (:class:`~gnnpipe.schedulers.ir.Schedule`
    has it): ``num_stages`` rows ``stages[s][t]`` (an :class:`Action` or ``None`` for an idle slot), the
    longest ``num_slots`` long."""

    @property
    def num_stages(self) -> int: ...

    @property
    def num_slots(self) -> int: ...

    @property
    def stages(self) -> Sequence[Sequence[Action | None]]: ...
