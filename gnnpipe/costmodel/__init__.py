"""Cost model: predict every layout's epoch time, bytes and per-rank memory before running it (issue #14).

Layering: above ``core``, ``schedulers``, ``partitioners``, ``models`` and ``data`` (it composes them to
profile and to simulate); below ``api`` and ``cli``. ``core`` never imports it.

* ``hardware`` — the TOML machine description (``--hardware FILE``) and the shipped examples;
* ``profile``  — per-unit chunk-cost fits against rows and halo rows, saved-activation bytes per row,
  the optimizer step, and the link (point-to-point and all-reduce ping-pong over the actual backend); one module
  per measurement (``record``, ``units``, ``overhead``, ``contention``, ``link``, ``memory``, ``measure``);
* ``memory``   — per-rank memory by kind (issue #12 item 2), fed by ``footprint`` (each rank role's bytes
  per row, measured by running its real stage on a sample of the graph under a live-byte counter);
* ``predict``  — bytes per epoch (DESIGN §6, exact), epoch time (discrete-event simulation of the actual
  schedule with :func:`gnnpipe.schedulers.simulate`), memory; the ranking of every feasible layout.
"""

from .hardware import Hardware, Link, load_hardware, shipped_hardware
from .memory import MemoryBreakdown
from .predict import LayoutPrediction, LayoutSpec, enumerate_layouts, plan_layouts, predict_bytes
from .profile import Profile, profile

__all__ = [
    "Hardware",
    "LayoutPrediction",
    "LayoutSpec",
    "Link",
    "MemoryBreakdown",
    "Profile",
    "enumerate_layouts",
    "load_hardware",
    "plan_layouts",
    "predict_bytes",
    "profile",
    "shipped_hardware",
]
