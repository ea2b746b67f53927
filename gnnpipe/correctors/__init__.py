"""Staleness correctors: pluggable policies that change what history holds or how it is read.

A corrector subclasses :class:`Corrector`, overrides the hooks it needs, and registers with
``@gnnpipe.correctors.register(name)``. The runtime calls, on every stage, in list order:

* :meth:`Corrector.setup` once, with a :class:`StageContext` (the stage's histories, chunk layout);
* :meth:`Corrector.on_epoch_start` / :meth:`Corrector.on_epoch_end` around each training epoch;
* :meth:`Corrector.after_forward` / :meth:`Corrector.after_backward` after each chunk's forward /
  backward through the stage;
* :meth:`Corrector.order_policy` once, to choose the chunk order (technique T1 owns it).

Built-ins (GNNPipe paper §4.3): ``t1`` random chunk order, ``t2`` unbiased cross-chunk
gradient, ``t3`` periodic history snapshot, ``ema`` smoothing of stale rows (PipeGCN, Wan et al. 2022),
``refresh`` periodic full refresh, ``none``. The default list is ``["t1", "t2", "t3"]``.
"""

from __future__ import annotations

from . import builtin  # noqa: F401  (registers the built-ins)
from .base import Corrector, StageContext
from .builtin import (
    EMASmoothing,
    NoCorrector,
    PeriodicRefresh,
    T1RandomChunkOrder,
    T1RandomOrder,
    T2UnbiasedGradient,
    T3PeriodicSnapshot,
)
from .registry import CORRECTORS, available, build_correctors, get, parse_spec, register

DEFAULT = ["t1", "t2", "t3"]

__all__ = [
    "CORRECTORS",
    "DEFAULT",
    "Corrector",
    "EMASmoothing",
    "NoCorrector",
    "PeriodicRefresh",
    "StageContext",
    "T1RandomChunkOrder",
    "T1RandomOrder",
    "T2UnbiasedGradient",
    "T3PeriodicSnapshot",
    "available",
    "build_correctors",
    "get",
    "parse_spec",
    "register"
]
