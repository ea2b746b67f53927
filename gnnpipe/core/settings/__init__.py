"""What a run is told: :mod:`.config` (``TrainConfig``, component name checks, ignored options), :mod:`.options`
(``RunOptions``: watching, saving, resuming) and :mod:`.arguments` (the one parser of the train flags). The
bottom of :mod:`gnnpipe.core`."""
