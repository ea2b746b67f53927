"""The schedule interpreter and what it drives: :mod:`.protocol` (what a stage declares: what it receives,
computes, sends and recomputes), :mod:`.execute` (the one interpreter of a validated schedule, for every task) and
:mod:`.memory` (peak and returned memory). Built on :mod:`gnnpipe.core.comm` and :mod:`gnnpipe.core.settings`."""
