"""Node classification's cost model: predict every layout's epoch time, bytes and per-rank memory before running it.

* :mod:`.profile` — per-unit chunk-cost fits against rows and halo rows, saved-activation bytes per row, the
  optimizer step, the runtime's own costs and contention, with the shared link probe
  (:mod:`gnnpipe.costmodel.link`); one module per measurement (``record``, ``units``, ``overhead``,
  ``contention``, ``memory``, ``measure``);
* :mod:`.memory` — per-rank memory by kind, fed by :mod:`.footprint` (each rank role's bytes per row, measured by
  running its real stage on a sample of the graph under :class:`~gnnpipe.costmodel.live.LiveBytes`);
* :mod:`.layouts` — the candidate layouts, their predictions, enumeration, configuration and plans; :mod:`.geometry`
  — the sizes of a plan the predictions read;
* :mod:`.epoch_bytes` — bytes per epoch (exact); :mod:`.epoch_time` — epoch time (a discrete-event simulation of
  the actual schedule with :func:`gnnpipe.schedulers.simulate`), with :mod:`.host_costs` (messages, exchanges, ranks
  sharing a node's cores); :mod:`.plan_memory` — per-rank memory of a plan; :mod:`.memory_check` — the recompute
  decision and the memory checks before a run;
* :mod:`.predict` — one layout's predictions and the ranking of every feasible layout.

The machine comes from :mod:`gnnpipe.costmodel.hardware`.
"""

from .epoch_bytes import predict_bytes
from .layouts import LayoutPrediction, LayoutSpec, enumerate_layouts
from .memory import MemoryBreakdown
from .predict import plan_layouts
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
