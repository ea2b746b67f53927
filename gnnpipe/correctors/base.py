"""The corrector interface."""

from __future__ import annotations

import copy
from typing import ClassVar

import attrs
from torch import Tensor


@attrs.define
class StageContext:
    """What a corrector sees of one pipeline stage.

    Attributes:
        stage: this stage's index ``s``. num_stages: ``S``.
        histories: the stage's history buffers (``gnnpipe.tasks.nodes.history.History``), one per
            aggregation op, in execution order. Buffers are allocated lazily (``H_in is None`` until
            the op first runs); hooks must tolerate that.
        chunk_ptr: ``LongTensor[C+1]``; chunk ``c`` is rows ``[chunk_ptr[c], chunk_ptr[c+1])``.
        seed: the run's seed.
        fresh_chunks: chunks whose rows a hook must treat as fresh although this stage did not
            process them (hybrid mode: rows peers just exchanged); the runtime fills it.
    """

    stage: int
    num_stages: int
    histories: list
    chunk_ptr: Tensor
    seed: int = 0
    fresh_chunks: set = attrs.field(factory=set)
    #: ``chunk_ptr`` as Python ints (hooks run per chunk; indexing a tensor costs two ATen calls per bound)
    _bounds: list = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        self._bounds = [int(b) for b in self.chunk_ptr.tolist()]

    def rows(self, chunk: int) -> tuple[int, int]:
        """``(start, end)`` of chunk ``chunk``'s rows, as Python ints."""
        return self._bounds[chunk], self._bounds[chunk + 1]


class Corrector:
    """Base class of staleness correctors; every hook is a no-op by default."""

    registry_name: str = ""
    #: ``True`` for a corrector that does nothing at all (``none``): :func:`build_correctors` drops it
    is_noop: ClassVar[bool] = False

    def setup(self, ctx: StageContext) -> None:
        """Called once per stage before training with the stage's :class:`StageContext` (``self.ctx``)."""
        self.ctx = ctx

    def order_policy(self, seed: int):
        """Return a chunk-order policy (``gnnpipe.schedulers`` order object) or ``None`` to leave it alone."""
        return None

    def on_epoch_start(self, epoch: int) -> None:
        """Called at the start of training epoch ``epoch``, before its first chunk."""

    def on_epoch_end(self, epoch: int) -> None:
        """Called at the end of training epoch ``epoch``, after its last chunk."""

    def after_forward(self, epoch: int, chunk: int) -> None:
        """Called after chunk ``chunk``'s forward through the stage in epoch ``epoch``."""

    def after_backward(self, epoch: int, chunk: int) -> None:
        """Called after chunk ``chunk``'s backward through the stage in epoch ``epoch``."""

    def wants_refresh(self, epoch: int) -> bool:
        """Whether the runtime should recompute every ``H_in`` exactly from the current weights at the
        start of ``epoch``, before :meth:`Corrector.on_epoch_start` (a full-graph inference through the
        stages; flush schedulers only). Default ``False``; the ``refresh`` corrector says ``True`` every
        ``period`` epochs."""
        return False

    def state_dict(self) -> dict:
        """Everything the corrector carries from epoch to epoch (T3's snapshots, EMA's averages, …), for a
        checkpoint. Default: every attribute but the stage context (picklable values; tensors are copied)."""
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if k != "ctx"}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (call after :meth:`setup`)."""
        for k, v in state.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
