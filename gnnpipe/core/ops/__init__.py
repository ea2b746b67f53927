"""The aggregation and communication ops a stage calls: :mod:`.kinds` (which ``Â``), :mod:`.graph` (``Â`` as
CSR and its row slices), :mod:`.history` (history buffers and the chunk op), :mod:`.aggregation` (the ops as
objects: pipeline, hybrid, graph parallel) and :mod:`.comm` (every ``torch.distributed`` call, counted). The
bottom of :mod:`gnnpipe.core` beside :mod:`gnnpipe.core.settings`."""
