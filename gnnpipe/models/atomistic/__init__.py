"""Atomistic models of the zoo (task ``s2ef``: structure → energy and forces): ``schnet``, ``dimenet++``,
``gemnet-t`` (GemNet-T; GemNet-dT with direct forces) and ``escn-md`` (eSCN-MD, fairchem's UMA backbone).

Each is a sequence of units over a ``state`` dict with a readout (:mod:`.base`), calling the graph-parallel hooks
of a ``comm`` object (:mod:`.comm`; :class:`LocalHooks` by default) where graph parallelism communicates, so one
definition serves the single process, pipelines and graph parallelism.
"""

from __future__ import annotations

from .base import (  # noqa: F401
    AtomisticModel,
    AtomisticUnit,
    ConservativeForces,
    DirectForceHead,
    atomistic_activation,
    scatter_sum,
    shifted_softplus,
)
from .comm import LOCAL, GraphParallelHooks, LocalHooks  # noqa: F401
from .dimenet import DimeNetPlusPlus  # noqa: F401
from .escn import ESCNMD  # noqa: F401
from .gemnet import GemNetT  # noqa: F401
from .schnet import SchNet  # noqa: F401
