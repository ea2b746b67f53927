"""The runtime every kind of work shares (:mod:`gnnpipe.tasks` holds what belongs to one kind).

Subpackages, bottom to top (a subpackage imports only its own modules and those below it; checked by
``tests/test_imports.py``):

* :mod:`~gnnpipe.core.settings` — what a run is told: ``TrainConfig``, ``RunOptions``, the train flags;
* :mod:`~gnnpipe.core.ops` — the aggregation and communication ops: adjacency, history, halo and peer ops, ``Comm``;
* :mod:`~gnnpipe.core.runtime` — a stage, the schedule interpreter, the executors built from them, the unit
  profiler, metrics, the memory-mapped graph and the assembled model;
* :mod:`~gnnpipe.core.run` — around the epoch loop: starting ranks, checkpoints, the epoch log, stopping, results;
* :mod:`~gnnpipe.core.training` — the composition: the single-process trainer and the shared epoch loop, the plan
  of a distributed run and the per-rank worker.
"""
