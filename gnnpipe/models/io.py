"""A trained model as one plain file: its state dict and how to rebuild it (``gnnpipe export``).

The file is a ``torch.save`` of a dict of plain Python values and tensors only (no pickled classes),
so :func:`load` reads it with ``torch.load(weights_only=True)``::

    {"format": "gnnpipe.model", "version": 1,
     "spec": {"name", "in_channels", "out_channels", "kwargs", "dtype"},   # GNNModel.spec
     "preprocessing": {...} | None,                                          # GNNModel.preprocessing
     "state_dict": {"units.0.lin.weight": Tensor, ...},                      # single-process names
     "meta": {...}}                                                          # free-form (run summary)
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ConfigError
from .base import GNNModel
from .build import build_model

FORMAT = "gnnpipe.model"


def _plain(value):
    """``value`` with every int and float subclass (a setting marked "not given":
    ``gnnpipe.core.settings.config.unset``) as the plain number, through dicts, lists and tuples, so the file holds
    plain Python values only and :func:`load` can read it with ``weights_only=True``."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and type(value) is not int:
        return int(value)
    if isinstance(value, float) and type(value) is not float:
        return float(value)
    return value


def save(model: GNNModel, path: str | Path, meta: dict | None = None) -> None:
    """Write ``model`` (built by :func:`gnnpipe.models.build_model`, so it has a ``spec``) to ``path``, with ``meta``
    (default: the model's own ``meta``, e.g. ``result.model``'s training config and data paths, which
    ``gnnpipe predict`` reads).

    Raises:
        ConfigError: the model has no ``spec`` (it was not built by ``build_model``).
    """
    if model.spec is None:
        raise ConfigError("this model has no spec (build it with gnnpipe.models.build_model to save it)")
    p = next(model.parameters(), None)
    spec = dict(model.spec, dtype=str(p.dtype).replace("torch.", "") if p is not None else model.spec["dtype"])
    obj = {"format": FORMAT, "version": 1, "spec": spec, "preprocessing": getattr(model, "preprocessing", None),
           "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
           "meta": dict(meta if meta is not None else getattr(model, "meta", None) or {})}
    obj = _plain(obj)
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"{target} is a folder; give the model file to write (e.g. {target / 'model.pt'})")
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, target)


def load(path: str | Path, map_location: str | torch.device = "cpu") -> GNNModel:
    """Rebuild the model a file written by :func:`save` (``gnnpipe export``) holds; ``model.meta`` is its ``meta``.

    Raises:
        ConfigError: the file is not a gnnpipe model file (e.g. a checkpoint folder or another state dict).
        UnknownComponentError: its model name is not registered (a user model not imported yet).
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(f"{path} is a folder (a checkpoint?); export it first: gnnpipe export {path} --out model.pt")
    if not path.is_file():
        raise ConfigError(f"no model file {path}; write one with `gnnpipe export CHECKPOINT --out {path.name}`")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # not a torch.save file, a damaged one, or one holding pickled classes
        raise ConfigError(f"{path} is not a gnnpipe model file ({type(exc).__name__}); write one with "
                          f"`gnnpipe export` or gnnpipe.models.save") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a gnnpipe model file (write one with `gnnpipe export` or "
                          "gnnpipe.models.save)")
    spec = obj["spec"]
    model = build_model(spec["name"], spec["in_channels"], spec["out_channels"], init=False, **spec["kwargs"])
    model = model.to(getattr(torch, spec.get("dtype", "float32")))
    model.spec = dict(spec)
    model.load_state_dict(obj["state_dict"])
    model.preprocessing = obj.get("preprocessing")
    model.meta = obj.get("meta", {})
    model.eval()
    return model
