"""The composition: :mod:`.trainer` (the exact single-process trainer and the epoch loop every executor
shares) and :mod:`.runner` (the plan of a distributed run, the schedule check before the ranks start, the
per-rank worker). The top of :mod:`gnnpipe.core`."""
