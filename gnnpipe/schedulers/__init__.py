"""Pipeline schedules: the IR, validation, simulation, staleness analysis, pictures and the schedulers.

Pure Python, no process group. The runtime (``gnnpipe.core``) executes ``schedule.stages[s]`` on the
rank of stage ``s`` in order, skipping ``None``; ``F``/``B`` carry the chunk id, ``STEP`` (the stage's
optimizer step and end-of-epoch hook point) carries none. See ``gnnpipe.schedulers.ir``.

Registry: ``register(name)`` / ``get(name)`` / ``available()``; built-ins ``gpipe``, ``1f1b`` and
``async-stale`` (``gnnpipe.schedulers.builtin``) register through the same door as user code.

Quick tour::

    from gnnpipe import schedulers as gs
    sch = gs.build_schedule("1f1b", num_stages=4, num_chunks=8)      # validated
    print(gs.to_ascii(sch))
    res = gs.simulate(sch, costs=gs.CostModel(forward=1, backward=2))
    print(res.to_text())
    gs.plot_timeline(res, "1f1b.png")
"""

from __future__ import annotations

from . import builtin  # noqa: F401  (registers gpipe, 1f1b, async-stale)
from ._engine import Interval, Transfer
from .base import (
    SCHEDULERS,
    ChunkScheduler,
    available,
    build_schedule,
    get,
    make_scheduler,
    register,
)
from .builtin import AsyncStale, GPipe, OneFOneB
from .csvio import from_csv, to_csv
from .ir import STEP, Action, ActionKind, B, D, F, G, Schedule, check_chunk_order, parse_actions
from .order import ChunkOrder, FixedOrder, ShuffledOrder, order_policy
from .render import to_ascii
from .simulate import CommModel, CostModel, SimulationResult, simulate
from .staleness import StalenessReport, chunk_edge_counts, shuffled_staleness, staleness_report
from .timeline import plot_timeline, to_chrome_trace
from .validate import Violation, find_violations, validate

__all__ = [
    "SCHEDULERS",
    "STEP",
    "Action",
    "ActionKind",
    "AsyncStale",
    "B",
    "ChunkOrder",
    "ChunkScheduler",
    "CommModel",
    "CostModel",
    "D",
    "F",
    "FixedOrder",
    "G",
    "GPipe",
    "Interval",
    "OneFOneB",
    "Schedule",
    "ShuffledOrder",
    "SimulationResult",
    "StalenessReport",
    "Transfer",
    "Violation",
    "available",
    "build_schedule",
    "check_chunk_order",
    "chunk_edge_counts",
    "find_violations",
    "from_csv",
    "get",
    "make_scheduler",
    "order_policy",
    "parse_actions",
    "plot_timeline",
    "register",
    "shuffled_staleness",
    "simulate",
    "staleness_report",
    "to_ascii",
    "to_chrome_trace",
    "to_csv",
    "validate",
]
