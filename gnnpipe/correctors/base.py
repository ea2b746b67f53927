"""The corrector interface."""

from __future__ import annotations

from typing import Optional, Sequence

import attrs
from torch import Tensor


@attrs.define
class StageContext:
    """What a corrector sees of one pipeline stage.

    Attributes:
        stage: this stage's index ``s``. num_stages: ``S``.
        histories: the stage's history buffers (:class:`gnnpipe.core.history.History`), one per
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

    def rows(self, chunk: int) -> tuple[int, int]:
        return int(self.chunk_ptr[chunk]), int(self.chunk_ptr[chunk + 1])


class Corrector:
    """Base class of staleness correctors; every hook is a no-op by default."""

    registry_name: str = ""

    def setup(self, ctx: StageContext) -> None:
        self.ctx = ctx

    def order_policy(self, seed: int):
        """Return a chunk-order policy (``gnnpipe.schedulers`` order object) or ``None`` to leave it alone."""
        return None

    def on_epoch_start(self, epoch: int) -> None:
        pass

    def on_epoch_end(self, epoch: int) -> None:
        pass

    def after_forward(self, epoch: int, chunk: int) -> None:
        pass

    def after_backward(self, epoch: int, chunk: int) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def build_correctors(spec: Sequence[str | Corrector] | None) -> list[Corrector]:
    """Instantiate a list of corrector names (``"ema"``, ``"ema:0.9"``, ``"t3:10"``) or objects.

    A name may carry one numeric option after a colon (the momentum of ``ema``, the period of ``t3``
    and ``refresh``). ``None``, ``[]`` and ``["none"]`` give no correctors.

    Raises:
        UnknownComponentError: unknown name (lists the available ones).
        ConfigError: a malformed option.
    """
    from ..errors import ConfigError
    from .registry import get

    out: list[Corrector] = []
    for item in spec or []:
        if isinstance(item, Corrector):
            out.append(item)
            continue
        name, _, opt = str(item).partition(":")
        cls = get(name.strip().lower())
        if opt:
            try:
                value = float(opt)
            except ValueError:
                raise ConfigError(f"corrector option in {item!r} must be a number, e.g. 'ema:0.9' or 't3:23'") from None
            out.append(cls(value))
        else:
            out.append(cls())
    return [c for c in out if type(c).__name__ != "NoCorrector"]
