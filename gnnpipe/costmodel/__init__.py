"""The cost-model pieces every task shares: the machine and what is measured on it.

* ``hardware`` — the TOML machine description (``--hardware FILE``), the shipped examples, this machine's cores
  and available memory;
* ``link`` — the link between two local ranks (ping-pong, all-reduce, a rank's floor, what a wait costs on
  shared cores);
* ``live`` — live bytes (glibc's ``mallinfo2``) and their peak over a region (``LiveBytes``);
* ``robust`` — the statistic kept of repeated timings (a low quantile) and their spread.

Each task's own cost model sits beside the code it models and is built on these and on the schedule simulation
(:func:`gnnpipe.schedulers.simulate`): ``gnnpipe.tasks.nodes.cost`` (node classification: profiles, bytes,
epoch time, memory, the ranking of layouts) and ``gnnpipe.tasks.s2ef.cost`` (S2EF). Layering: above ``core``,
``schedulers``, ``partitioners``, ``models`` and ``data``; below ``tasks``. ``core`` never imports it.
"""

from .hardware import Hardware, Link, available_memory_bytes, cores_here, load_hardware, shipped_hardware
from .link import profile_link
from .live import LiveBytes, live_bytes

__all__ = [
    "Hardware",
    "Link",
    "LiveBytes",
    "available_memory_bytes",
    "cores_here",
    "live_bytes",
    "load_hardware",
    "profile_link",
    "shipped_hardware",
]
