"""The model zoo: GNNs as linear sequences of layer units (see :mod:`gnnpipe.models.base`).

``register(name)`` / ``get(name)`` / ``available()`` form the registry; :func:`build_model` builds a
registered model by name. Built-ins: ``gcn``, ``graphsage``, ``gcnii``, ``resgcn+``.
"""

from __future__ import annotations

from .base import ACTIVATIONS, Aggregator, GNNModel, LayerUnit, activation  # noqa: F401
from .registry import MODELS, available, get, register  # noqa: F401
from . import zoo  # noqa: F401  (registers the built-ins)
from .zoo import GCN, GCNII, GraphSAGE, ResGCNPlus  # noqa: F401


def build_model(name: str, in_channels: int, out_channels: int, **kwargs) -> GNNModel:
    """Build the model registered as ``name``.

    Args:
        name: a name in :func:`available`.
        in_channels: input feature width ``F``. out_channels: number of classes ``C``.
        **kwargs: ``num_layers``, ``hidden``, ``dropout``, ``bias``, ``activation`` and model-specific
            options (e.g. GCNII's ``alpha``, ``lam``).

    Raises:
        UnknownComponentError: unknown name. ConfigError: bad sizes.
    """
    return get(name)(in_channels, out_channels, **kwargs)
