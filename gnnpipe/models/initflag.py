"""Whether models being built draw their random initial weights (they do, unless their weights are about to be
loaded: :func:`gnnpipe.models.build_model` with ``init=False``, which :func:`gnnpipe.models.load` and checkpoint
restores use, so a model file or a checkpoint opens without paying for an initialisation it overwrites; GemNet's
He-orthogonal weights take about a second of QR decompositions on one core)."""

from __future__ import annotations

import contextlib
import contextvars

_SKIP = contextvars.ContextVar("gnnpipe_skip_init", default=False)


def initialisation_skipped() -> bool:
    """True inside :func:`skipping_initialisation`: a model's ``reset_parameters`` returns at once."""
    return _SKIP.get()


@contextlib.contextmanager
def skipping_initialisation(skip: bool = True):
    """Build models without drawing their random weights (they hold the framework's defaults or uninitialised
    values until a state dict is loaded into them)."""
    token = _SKIP.set(skip)
    try:
        yield
    finally:
        _SKIP.reset(token)
