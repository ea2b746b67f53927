"""What an S2EF run builds from its configuration: the model and the neighbour-graph builder (the same on every
rank of every layout)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor
from torch_geometric.data import Batch

from ...core.settings.config import TrainConfig
from ...data.atoms import build_graph
from ...models import build_model, model_options

__all__ = ["forward", "graph_builder", "make_model"]


def make_model(config: TrainConfig):
    """The atomistic model of ``config`` (``layers`` interaction blocks, ``hidden`` channels, the ``cutoff``, the
    model's own options), its weights drawn after ``torch.manual_seed(config.seed)`` (the same on every rank)."""
    opts = model_options(config.model)
    kw = dict(config.model_args)
    for name, value in (("cutoff", config.cutoff), ("direct_forces", config.direct_forces),
                        ("max_neighbors", config.max_neighbors)):
        if name in opts:
            kw.setdefault(name, value)
    torch.manual_seed(config.seed)
    model = build_model(config.model, 0, 1, num_layers=config.layers, hidden=config.hidden,
                        dropout=config.dropout or 0.0, **kw)
    return model.to(config.torch_dtype)


def graph_builder(cutoff: float, max_neighbors: int, with_triplets: bool = True, with_reverse: bool = False,
                  method: str = "auto") -> Callable:
    """``batch → AtomGraph`` (:func:`gnnpipe.data.atoms.build_graph`; triplets only ``with_triplets``, each edge's
    reverse with ``with_reverse``: models with ``uses_reverse_edges``, GemNet; ``method="device"``: the pairs found
    where the batch's positions are, on a GPU for a GPU batch). Picklable: loader workers started with ``spawn``
    (inside a rank) receive it."""
    kw = {} if method == "auto" else {"method": method}
    return functools.partial(build_graph, cutoff=cutoff, max_neighbors=max_neighbors, with_triplets=with_triplets,
                             with_reverse=with_reverse, **kw)


def forward(model, structures: list, graph_fn: Callable) -> tuple[Tensor, Tensor, object]:
    """``(ê [b], F̂ [n, 3], batch)``: the model's (normalised) energies and forces of ``structures`` (the model's
    direct head, or conservative ``−∂ê/∂pos``, differentiable again while the model trains and grad is on)."""
    batch = Batch.from_data_list(structures)
    out = model(batch, graph_fn(batch), forces=True)
    return out["energy"].reshape(-1), out["forces"], batch
