"""The executors: :mod:`.stage` (a stage that only computes), :mod:`.execute` (the one interpreter of a
validated schedule), :mod:`.pipeline` and :mod:`.parallel` (pipeline, graph-parallel and hybrid executors),
:mod:`.assemble` (the trained model of any layout as one model), :mod:`.graphfile` (the memory-mapped graph),
:mod:`.metrics` (loss, accuracies, peak memory) and :mod:`.profile` (the unit profiler). Built on
:mod:`gnnpipe.core.ops` and :mod:`gnnpipe.core.settings`."""
