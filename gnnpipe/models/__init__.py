"""The model zoo: GNNs as linear sequences of layer units (see :mod:`gnnpipe.models.base`).

``register(name)`` / ``get(name)`` / ``available()`` form the registry; :func:`build_model` builds a
registered model by name; :func:`model_options` lists a model's own options (GCNII's ``alpha``,
``lamda``). Built-ins: ``gcn``, ``graphsage``, ``gcnii``, ``resgcn+``; on PyG convolutions
(:class:`MessagePassingUnit`): ``gat``, ``gat-res``, ``gatv2``, ``gin``.
"""

from __future__ import annotations

from .base import ACTIVATIONS, Aggregator, GNNModel, LayerUnit, ZooModel, activation, unit_seed  # noqa: F401
from .registry import MODELS, available, get, register  # noqa: F401
from .options import (  # noqa: F401
    ModelOption,
    check_model_args,
    describe_options,
    format_model_args,
    model_options,
    parse_model_args,
)
from . import zoo  # noqa: F401  (registers the built-ins)
from .zoo import GCN, GCNII, GraphSAGE, ResGCNPlus  # noqa: F401
from .message_passing import GAT, GIN, GATResidual, GATv2, MessagePassingUnit  # noqa: F401
from .build import build_model  # noqa: F401
from .io import load, save  # noqa: F401
from . import atomistic  # noqa: F401,E402  (registers schnet and dimenet++)
from .atomistic import AtomisticModel  # noqa: F401,E402
