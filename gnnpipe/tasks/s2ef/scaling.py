"""Scale factors fitted on data at the start of a run (GemNet's ``fit_scaling``; Gasteiger et al., NeurIPS 2021).

A model with ``fit_scale_factors(batch, graph)`` (:class:`~gnnpipe.models.atomistic.gemnet.GemNetT`) has it
called once, before training, on the first :data:`FIT_STRUCTURES` structures of the first epoch's order of the
training split (:func:`~.data.epoch_batches`: the same permutation whatever the batch size, the number of
replicas, stages or graph-parallel ranks), in one process with the whole graph, on every rank alike: every layout
computes the same factors. They are buffers of the model, so checkpoints, resumed runs and exported models carry
them. A model given ``scale_file`` loads its factors instead (``gnnpipe atoms scales MODEL --out FILE`` writes one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch_geometric.data import Batch

from ...data.atoms import build_graph
from .data import epoch_batches

#: how many training structures the factors are fitted on (fairchem fits on 16 batches; here one batch of these)
FIT_STRUCTURES = 16


def fit_structures(config: Any, structures: list, splits: dict) -> list:
    """The structures the factors are fitted on: the first :data:`FIT_STRUCTURES` of epoch 0's order of the
    training split."""
    train = splits["train"]
    if len(train) == 0:
        return []
    order = epoch_batches(len(train), len(train), config.seed, 0)[0]
    return [structures[int(i)] for i in train[order[:FIT_STRUCTURES]].tolist()]


def fit_scale_factors(model, config: Any, structures: list, splits: dict) -> dict | None:
    """Fit ``model``'s scale factors (see the module docstring); ``None`` when it has none to fit (another model,
    or factors loaded from a ``scale_file``), else ``{name: factor}``."""
    fit = getattr(model, "fit_scale_factors", None)
    if fit is None or getattr(model, "scale_file", ""):
        return None
    data = fit_structures(config, structures, splits)
    if not data:
        return None

    batch = Batch.from_data_list(data)
    graph = build_graph(batch, config.cutoff, config.max_neighbors,
                        with_reverse=bool(getattr(model, "uses_reverse_edges", False)))
    return fit(batch, graph)


def write_scale_file(values: dict, path: str) -> Path:
    """Write ``{name: factor}`` as JSON (what ``--model-arg scale_file=PATH`` reads)."""
    p = Path(path).expanduser()
    p.write_text(json.dumps(values, indent=1, sort_keys=False) + "\n")
    return p
