"""Profiles the cost model predicts from: per-unit chunk costs, the runtime's own costs, saved activations, the
optimizer step, the link. One idea per module:

* :mod:`.record` — the :class:`Profile` (JSON), its :class:`UnitKind` records and the chunk features of the fits;
* :mod:`.units` — timing the layer units chunk by chunk as the pipeline runs them, and the optimizer step;
* :mod:`.overhead` — the runtime's own costs: per pipeline action, per graph-parallel and hybrid op;
* :mod:`.contention` — how ranks computing at once on one node's cores slow each other;
* :mod:`.link` — the link (ping-pong, all-reduce, a rank's floor) and what a wait costs on shared cores;
* :mod:`.memory` — saved activations per row, and the memory-only profile;
* :mod:`.robust` — the statistic kept of repeated timings (a low quantile) and their spread;
* :mod:`.measure` — :func:`profile`, which takes all of them.
"""

from __future__ import annotations

from .....costmodel.link import (
    EXCHANGE_PROBE,
    STREAM_MESSAGES,
    STREAM_SIZES,
    SWITCH_PROBE,
    link_fields,
    profile_link,
    switch_byte_cost,
    switch_costs,
)
from .contention import cores_here, measure_contention
from .measure import profile
from .memory import memory_profile, saved_bytes
from .record import (
    FEATURES,
    LINK_FIELDS,
    SPREAD_GROUPS,
    Profile,
    UnitKind,
    chunk_features,
    part_features,
    size_factor,
    unit_key,
)
from .units import REDUCE

__all__ = [
    "EXCHANGE_PROBE",
    "FEATURES",
    "LINK_FIELDS",
    "REDUCE",
    "SPREAD_GROUPS",
    "STREAM_MESSAGES",
    "STREAM_SIZES",
    "SWITCH_PROBE",
    "Profile",
    "UnitKind",
    "chunk_features",
    "cores_here",
    "link_fields",
    "measure_contention",
    "memory_profile",
    "part_features",
    "profile",
    "profile_link",
    "saved_bytes",
    "size_factor",
    "switch_byte_cost",
    "switch_costs",
    "unit_key",
]
