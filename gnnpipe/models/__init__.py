"""The model zoo: GNNs as linear sequences of layer units (see :mod:`gnnpipe.models.base`).

``register(name)`` / ``get(name)`` / ``available()`` form the registry; :func:`build_model` builds a
registered model by name; :func:`model_options` lists a model's own options (GCNII's ``alpha``,
``lamda``). Built-ins: ``gcn``, ``graphsage``, ``gcnii``, ``resgcn+``.
"""

from __future__ import annotations

from .base import ACTIVATIONS, Aggregator, GNNModel, LayerUnit, activation  # noqa: F401
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


def build_model(name: str, in_channels: int, out_channels: int, **kwargs) -> GNNModel:
    """Build the model registered as ``name``.

    Args:
        name: a name in :func:`available`.
        in_channels: input feature width ``F``. out_channels: number of classes ``C``.
        **kwargs: ``num_layers``, ``hidden``, ``dropout``, ``bias``, ``activation`` and model-specific
            options (:func:`model_options`, e.g. GCNII's ``alpha``, ``lamda``).

    Raises:
        UnknownComponentError: unknown name. ConfigError: bad sizes, an unknown option (lists the
            model's options) or an option of the wrong type.
    """
    from .options import COMMON_ARGS

    common = {k: v for k, v in kwargs.items() if k in COMMON_ARGS}
    options = check_model_args(name, {k: v for k, v in kwargs.items() if k not in COMMON_ARGS})
    return get(name)(in_channels, out_channels, **common, **options)
