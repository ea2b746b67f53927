"""Node classification's cost model: predict every layout's epoch time, bytes and per-rank memory before running it.

* :mod:`.profile` — per-unit chunk-cost fits against rows and halo rows, saved-activation bytes per row, the
  optimizer step, the runtime's own costs and contention, with the shared link probe
  (:mod:`gnnpipe.costmodel.link`); one module per measurement (``record``, ``units``, ``overhead``,
  ``contention``, ``memory``, ``measure``);
* :mod:`.memory` — per-rank memory by kind, fed by :mod:`.footprint` (each rank role's bytes per row, measured by
  running its real stage on a sample of the graph under :class:`~gnnpipe.costmodel.live.LiveBytes`);
* :mod:`.predict` — bytes per epoch (exact), epoch time (a discrete-event simulation of the actual schedule with
  :func:`gnnpipe.schedulers.simulate`), memory; the ranking of every feasible layout.

The machine comes from :mod:`gnnpipe.costmodel.hardware`.
"""

from .memory import MemoryBreakdown
from .predict import LayoutPrediction, LayoutSpec, enumerate_layouts, plan_layouts, predict_bytes
from .profile import Profile, profile

__all__ = [
    "LayoutPrediction",
    "LayoutSpec",
    "MemoryBreakdown",
    "Profile",
    "enumerate_layouts",
    "plan_layouts",
    "predict_bytes",
    "profile",
]
