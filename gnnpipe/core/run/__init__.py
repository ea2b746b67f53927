"""Around the epoch loop: :mod:`.launch` (starting ranks: local processes or ``torchrun``), :mod:`.session`
(best weights, logging, checkpointing on every rank), :mod:`.checkpoint`, :mod:`.epochlog`, :mod:`.stopping`
(SIGINT/SIGTERM at an epoch boundary) and :mod:`.results` (``TrainResult``). Above :mod:`gnnpipe.core.runtime`."""
