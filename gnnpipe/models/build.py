"""Building a registered model by name (the one factory of the model family)."""

from __future__ import annotations

from .base import GNNModel
from .initflag import skipping_initialisation
from .options import COMMON_ARGS, check_model_args
from .registry import get


def build_model(name: str, in_channels: int, out_channels: int, *, init: bool = True, **kwargs) -> GNNModel:
    """Build the model registered as ``name``.

    Args:
        name: a name in :func:`available`.
        in_channels: input feature width ``F``. out_channels: number of classes ``C``.
        init: draw the random initial weights (``False``: the weights are about to be loaded; an atomistic model
            then skips its initialisation, ``gnnpipe.models.initflag``).
        **kwargs: ``num_layers``, ``hidden``, ``dropout``, ``bias``, ``activation`` and model-specific
            options (:func:`model_options`, e.g. GCNII's ``alpha``, ``lamda``).

    Raises:
        UnknownComponentError: unknown name. ConfigError: bad sizes, an unknown option (lists the
            model's options) or an option of the wrong type.
    """
    common = {k: v for k, v in kwargs.items() if k in COMMON_ARGS}
    options = check_model_args(name, {k: v for k, v in kwargs.items() if k not in COMMON_ARGS})
    with skipping_initialisation(not init):
        model = get(name)(in_channels, out_channels, **common, **options)
    model.spec = {"name": name, "in_channels": None if in_channels is None else int(in_channels),
                  "out_channels": int(out_channels),
                  "kwargs": {**common, **options}, "dtype": "float32"}
    return model
