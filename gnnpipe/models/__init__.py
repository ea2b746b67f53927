"""The model zoo: GNNs as linear sequences of layer units (see ``gnnpipe.models.base``).

``register(name)`` / ``get(name)`` / ``available()`` form the registry; :func:`build_model` builds a
registered model by name; :func:`model_options` lists a model's own options (GCNII's ``alpha``,
``lamda``). Built-ins: ``gcn``, ``graphsage``, ``gcnii``, ``resgcn+``; on PyG convolutions
(:class:`MessagePassingUnit`): ``gat``, ``gat-res``, ``gatv2``, ``gin``.
"""

from __future__ import annotations

from . import (
    atomistic,  # noqa: F401  (registers schnet and dimenet++)
    zoo,  # noqa: F401  (registers the built-ins)
)
from .atomistic import AtomisticModel
from .base import ACTIVATIONS, Aggregator, GNNModel, LayerUnit, ZooModel, activation, unit_seed
from .build import build_model
from .io import load, save
from .message_passing import GAT, GIN, GATResidual, GATv2, MessagePassingUnit
from .options import (
    ModelOption,
    check_model_args,
    describe_options,
    format_model_args,
    model_options,
    parse_model_args,
)
from .registry import MODELS, available, get, register
from .zoo import GCN, GCNII, GraphSAGE, ResGCNPlus

__all__ = [
    "ACTIVATIONS",
    "AtomisticModel",
    "ZooModel",
    "unit_seed",
    "GAT",
    "GCN",
    "GCNII",
    "GIN",
    "MODELS",
    "Aggregator",
    "GATResidual",
    "GATv2",
    "GNNModel",
    "GraphSAGE",
    "LayerUnit",
    "MessagePassingUnit",
    "ModelOption",
    "ResGCNPlus",
    "activation",
    "available",
    "build_model",
    "check_model_args",
    "describe_options",
    "format_model_args",
    "get",
    "load",
    "model_options",
    "parse_model_args",
    "register",
    "save"
]
