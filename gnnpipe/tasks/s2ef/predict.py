"""Energies and forces of structures by a trained S2EF model (a training result's model, or a model file written by
``gnnpipe export`` / :func:`gnnpipe.models.save`): what ``gnnpipe predict`` and the ASE calculator use.

The model's ``meta["task_meta"]`` (written by training) carries what the model needs besides its weights: the
energy reference and normalisation (:class:`~.normalizer.EnergyNormalizer`), the graph's cutoff and neighbour cap.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .normalizer import EnergyNormalizer


def task_meta(model) -> dict:
    """The S2EF ``task_meta`` of a trained model.

    Raises:
        ConfigError: the model was not trained for S2EF (no energy normalisation recorded).
    """
    from ...errors import ConfigError

    meta = (getattr(model, "meta", None) or {}).get("task_meta") or {}
    if meta.get("task") != "s2ef":
        raise ConfigError("this model was not trained on energies and forces (its file records no S2EF "
                          "normalisation); train one with gnnpipe train --model schnet|dimenet++|gemnet-t and export it")
    return meta


@torch.no_grad()
def predict_structures(model, structures: Sequence, batch_size: int = 16) -> tuple[Tensor, list[Tensor]]:
    """Energies and forces of ``structures`` (PyG ``Data`` as :func:`gnnpipe.data.atoms.from_atoms` makes, labels
    not needed).

    Returns:
        ``(energy [S] float64 eV, [forces [n_s, 3] float64 eV/Å per structure])``.

    Raises:
        ConfigError: not an S2EF model. DataValidationError: a malformed structure.
    """
    from torch_geometric.data import Batch

    from .data import prepare_structures
    from .trainer import graph_builder

    meta = task_meta(model)
    norm = EnergyNormalizer.from_dict(meta["normalizer"])
    graph_fn = graph_builder(meta["cutoff"], meta["max_neighbors"], bool(getattr(model, "uses_triplets", True)),
                             bool(getattr(model, "uses_reverse_edges", False)))
    p = next(model.parameters())
    structures = prepare_structures(structures, p.dtype, labelled=False)
    model.eval()
    energies, forces = [], []
    for start in range(0, len(structures), batch_size):
        batch = Batch.from_data_list(structures[start:start + batch_size])
        out = model(batch, graph_fn(batch), forces=True)
        ref = norm.reference(batch.z, batch.batch, batch.num_graphs)
        energies.append(norm.denormalise(out["energy"].reshape(-1).double(), ref))
        f = out["forces"].double() * norm.std
        forces.extend(f[batch.ptr[i]:batch.ptr[i + 1]] for i in range(batch.num_graphs))
    return (torch.cat(energies) if energies else torch.zeros(0, dtype=torch.float64)), forces
