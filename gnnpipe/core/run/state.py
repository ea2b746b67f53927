"""The trained model of any layout as one single-process model (a registered model: ``units`` and ``state_dict``).

Every executor (pipeline stage, graph-parallel way, hybrid member) holds the full model object but
trains only the units in its ``units`` range; :func:`owned_state` keys those units' tensors by the
single-process model's names (``units.{i}.{name}``), so the states of the stages of one way together
are exactly the single-process ``state_dict`` (ways hold identical copies: way 0's is taken).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor, nn

from ..settings.config import TrainConfig


def owned_state(model: nn.Module, units) -> dict[str, Tensor]:
    """CPU copies of the parameters and buffers of ``model.units[i]`` for ``i`` in ``units``, keyed
    ``units.{i}.{name}`` (the names of ``model.state_dict()``)."""
    out = {}
    for i in units:
        for k, v in model.units[i].state_dict().items():
            out[f"units.{i}.{k}"] = v.detach().to("cpu", copy=True)
    return out


def compute_of(ex):
    """The object of an executor that holds ``model``, ``units``, ``optimizer``, ``histories`` and ``version``:
    its ``stage`` when it drives one, else the executor itself (the single-process trainer)."""
    st = getattr(ex, "stage", None)
    return st if st is not None and hasattr(st, "model") else ex


def executor_state(ex) -> dict[str, Tensor]:
    """:func:`owned_state` of an executor's model and units (see :func:`compute_of`), or its ``weights()`` when it
    has one (an executor that evaluates other weights than it trains, e.g. S2EF's moving average)."""
    c = compute_of(ex)
    if callable(getattr(c, "weights", None)):
        return c.weights()
    return owned_state(c.model, c.units)


def gather_state(state: dict[str, Tensor], keep: bool) -> dict[str, Tensor] | None:
    """Collective: merge the ranks' states on rank 0 (``None`` elsewhere). Ranks with ``keep=False``
    (replicas: graph-parallel ways other than 0) send nothing; the first rank to name a key wins."""
    world = dist.get_world_size()
    objs = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(state if keep else {}, objs, dst=0)
    if objs is None:
        return None
    merged: dict[str, Tensor] = {}
    for part in objs:
        for k, v in (part or {}).items():
            merged.setdefault(k, v)
    return merged


def assemble_model(model: nn.Module, state: dict[str, Tensor], config: TrainConfig) -> nn.Module:
    """``model`` (built for ``config``'s architecture) holding ``state``, in eval mode, with the run's
    preprocessing recorded for :meth:`gnnpipe.models.GNNModel.predict`.

    Raises:
        RuntimeError: ``state`` misses or has extra keys (a bug: the stages did not cover the model).
    """
    model.load_state_dict(state, strict=True)
    model.preprocessing = preprocessing_of(config)
    return model.eval()


def preprocessing_of(config: TrainConfig) -> dict:
    """The edge/feature preprocessing ``config`` trains with (what :meth:`gnnpipe.models.GNNModel.predict` repeats)."""
    return {"undirected": config.undirected, "remove_self_loops": config.remove_self_loops,
            "dedupe": config.dedupe, "normalize_features": config.normalize_features}


def clone_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in state.items()}


__all__ = ["assemble_model", "clone_state", "compute_of", "executor_state", "gather_state", "owned_state",
           "preprocessing_of"]
