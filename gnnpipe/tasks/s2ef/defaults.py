"""The S2EF defaults of each atomistic model: the hyper-parameters ``gnnpipe train --model M`` uses on structures
for the flags not given.

The node-classification defaults of :class:`~gnnpipe.core.settings.config.TrainConfig` (8 layers of 64 channels)
and its generic S2EF values (cutoff 6 Å, 50 neighbours, fairchem's loss coefficients 1 : 100) are sized for large
graphs and OC20's large models: on a CPU a DimeNet++ epoch of a few thousand small structures then takes many
minutes, and with the 1 : 100 balance the energy is barely learned in a short run. The values here are the recipe
that met the accuracy targets (force MAE under 25 % of predicting zero, energy per atom under 10 % of the training
mean) on the generated OC20-like set (``docs/RESULTS.md``, "Atomistic accuracy"):
a few interaction blocks; for DimeNet++ a 4 Å cutoff with at most 12 neighbours per atom (the first shell; the
triplets grow with its square), for SchNet, which has no triplets, 6 Å and 50 (EMT's reach, up to the third
shell); and the energy weighted ten times more than fairchem's (``energy_coef : force_coef`` = 1 : 10 on the
normalised targets of :mod:`~.normalizer`). GemNet-T / GemNet-dT keep fairchem's three interaction blocks and its
energy : force weights 1 : 100 at DimeNet++'s width and graph (``docs/RESULTS.md``, "GemNet-T and GemNet-dT").

A field counts as given when the user set it (any value on the command line or in :func:`gnnpipe.api.train`, also
one equal to the generic default); fields left unset are marked by :func:`gnnpipe.core.settings.config.unset`.
Models registered later without an entry here keep the generic values.
"""

from __future__ import annotations

from typing import Any

import attrs

from ...core.settings.config import is_unset
from ...errors import ConfigError

#: per model, the S2EF default of each field (``TrainConfig`` names; ``lr`` in place of the model's
#: ``default_hparams["lr"]``)
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "schnet": {"layers": 3, "hidden": 64, "cutoff": 6.0, "max_neighbors": 50, "batch_size": 16, "lr": 2e-3,
               "energy_coef": 1.0, "force_coef": 10.0},
    "dimenet++": {"layers": 2, "hidden": 64, "cutoff": 4.0, "max_neighbors": 12, "batch_size": 16, "lr": 1e-3,
                  "energy_coef": 1.0, "force_coef": 10.0},
    # fairchem's GemNet-dT recipe (3 blocks, 512 wide, 6 Å / 50 neighbours, energy : force 1 : 100) at DimeNet++'s
    # width and graph here: 3 blocks of 64 (766 k parameters with direct forces, DimeNet++'s 756 k), fairchem's
    # loss weights
    "gemnet-t": {"layers": 3, "hidden": 64, "cutoff": 4.0, "max_neighbors": 12, "batch_size": 16, "lr": 1e-3,
                 "energy_coef": 1.0, "force_coef": 100.0},
    # eSCN-MD: fairchem's 2 blocks, 5 Å cutoff; 32 channels per coefficient (hidden) and at most 30 neighbours keep a
    # CPU epoch short; SchNet's loss weights. Not yet measured on the accuracy set.
    "escn-md": {"layers": 2, "hidden": 32, "cutoff": 5.0, "max_neighbors": 30, "batch_size": 16, "lr": 1e-3,
                "energy_coef": 1.0, "force_coef": 10.0},
}

#: the fields a model's S2EF defaults may set
FIELDS = ("layers", "hidden", "cutoff", "max_neighbors", "batch_size", "lr", "energy_coef", "force_coef")


def apply_model_defaults(config: Any) -> tuple[Any, dict]:
    """``(config, chosen)``: ``config`` with the fields the user did not set replaced by the S2EF defaults of its
    model (:data:`MODEL_DEFAULTS`; ``lr`` when it is ``None``, the others when
    :func:`~gnnpipe.core.settings.config.is_unset`), and ``chosen``, the fields replaced and their values (empty
    for a model without defaults here). The fields left unset that have no model default become plain numbers.
    A model option ``num_blocks`` > 0 (GemNet's ``--model-arg num_blocks=K``) is the depth: ``layers`` becomes
    ``K``.

    Raises:
        ConfigError: ``layers`` set and ``num_blocks`` > 0 naming another depth.
    """
    blocks = int((config.model_args or {}).get("num_blocks", 0) or 0)
    if blocks > 0:
        if not is_unset(config.layers) and int(config.layers) != blocks:
            raise ConfigError(f"--layers {int(config.layers)} and --model-arg num_blocks={blocks} name two depths; "
                              f"give one of them")
        config = attrs.evolve(config, layers=blocks)
    table = MODEL_DEFAULTS.get(config.model, {})
    chosen = {}
    for k in FIELDS:
        v = getattr(config, k)
        if k in table and (v is None if k == "lr" else is_unset(v)):
            chosen[k] = table[k]
    plain = {k: _plain(getattr(config, k)) for k in FIELDS if k not in chosen and is_unset(getattr(config, k))}
    return attrs.evolve(config, **chosen, **plain), chosen


def _plain(v):
    return float(v) if isinstance(v, float) else int(v)
