"""The runtime every kind of work shares, with nothing task-specific in it (:mod:`gnnpipe.tasks` holds each
task's engine).

Parts, bottom to top (a part imports only its own modules and those below it; checked by ``tests/test_imports.py``):

* :mod:`~gnnpipe.core.settings` — what a run is told: ``TrainConfig``, ``RunOptions``, the train flags, run files;
  :mod:`~gnnpipe.core.comm` — every ``torch.distributed`` call, counted (``Comm``), the flat gradient all-reduce;
  :mod:`~gnnpipe.core.grid` — the rank grid and its process groups;
* :mod:`~gnnpipe.core.runtime` — the stage protocol and the one schedule interpreter (``Executor``), memory readings;
* :mod:`~gnnpipe.core.run` — around the epoch loop: starting ranks, the epoch loop, the session, checkpoints, the
  epoch log, stopping, results, the assembled state.
"""
