"""The paper's graph preprocessing and the canonical form every loader returns.

GNNPipe (Chen, Chen & Qian, arXiv 2308.10087, §6 "Experimental setup") trains on undirected graphs
without self-loops or duplicate edges — self-loops are added back by the ``gcn`` normalisation
itself (Kipf & Welling, ICLR 2017, eq. 2). Each step is switchable; all of them use PyG's utilities
(``remove_self_loops``, ``to_undirected``, ``coalesce``).

Canonical form (what :func:`canonicalize`, :func:`prepare` and ``load_dataset`` return):
``x`` dense ``[N, F]`` in the training dtype (float32 unless a float64 run asks for float64), ``y`` int64 ``[N]``,
``edge_index`` int64 ``[2, E]`` (contiguous), ``train_mask`` / ``val_mask`` / ``test_mask`` bool ``[N]``.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import NormalizeFeatures
from torch_geometric.utils import coalesce, to_undirected
from torch_geometric.utils import remove_self_loops as _remove_self_loops

from ..errors import DataValidationError
from .splits import select_split
from .validation import MASKS, DataWarning, validate

_EDGE_KEYS = ("edge_attr", "edge_weight")


def _to_data(data: Any) -> Data:
    if isinstance(data, Data):
        return copy.copy(data)  # new storage, tensors shared
    if isinstance(data, dict):
        return Data(**data)
    raise DataValidationError(
        f"expected a torch_geometric.data.Data (or a dict of tensors), got {type(data).__name__}; "
        "build one with torch_geometric.data.Data(x=..., edge_index=..., y=..., train_mask=...)"
    )


def select_masks(data: Any, split: int | None, *, dataset: str | None = None) -> Data:
    """Reduce ``[N, k]`` split matrices to column ``split``; nothing else is converted. Returns a new ``Data``.

    A 1-D mask next to ``[N, k]`` ones is shared by every split; if all masks are 1-D, ``split`` must be 0.
    With ``split=None`` the masks are left alone (and :func:`validate` rejects split matrices). This is the
    only step allowed before :func:`validate`: it changes no dtype, so it cannot hide a bad value.

    Raises:
        ConfigError: ``split`` out of range for an ``[N, k]`` mask (names ``k``).
    """
    out = _to_data(data)
    if split is None:
        return out
    name = dataset or str(getattr(out, "name", None) or "the dataset")
    matrix = any(isinstance(out[k], Tensor) and out[k].dim() == 2 for k in MASKS if k in out)
    for key in MASKS:
        m = out[key] if key in out else None
        if isinstance(m, Tensor) and (m.dim() == 2 or (m.dim() == 1 and not matrix)):
            out[key] = select_split(m, split, what=key, dataset=name)
    return out


def canonicalize(data: Any, *, split: int | None = None, dataset: str | None = None,
                 dtype: torch.dtype = torch.float32) -> Data:
    """Convert dtypes and layouts to the canonical form (module docstring); returns a new ``Data``.

    ``x`` is densified if sparse and cast to ``dtype`` (default float32; a float64 run keeps float64 features); ``y``
    flattened from ``[N, 1]`` and cast to int64; ``edge_index`` cast to int64; 0/1 integer masks cast to bool;
    ``[N, k]`` split matrices reduced to column ``split`` (:func:`select_masks`). Does not validate, and its casts would
    hide bad values (a float ``edge_index`` with fractions, non-integral labels): run :func:`validate` *before* it,
    as :func:`prepare` and ``load_dataset`` do.

    Raises:
        ConfigError: ``split`` out of range for an ``[N, k]`` mask (names ``k``).
    """
    out = select_masks(data, split, dataset=dataset)
    x = out.x if "x" in out else None
    if isinstance(x, Tensor):
        if x.layout != torch.strided:
            x = x.to_dense()
        out.x = x.to(dtype).contiguous()
    y = out.y if "y" in out else None
    if isinstance(y, Tensor):
        if y.dim() == 2 and y.size(1) == 1:
            y = y.view(-1)
        out.y = y.long()
    if isinstance(out.edge_index if "edge_index" in out else None, Tensor):
        out.edge_index = out.edge_index.long().contiguous()
    for key in MASKS:
        m = out[key] if key in out else None
        if not isinstance(m, Tensor):
            continue
        if m.dtype != torch.bool and not m.is_floating_point() and bool(((m == 0) | (m == 1)).all()):
            m = m.bool()
        out[key] = m
    return out


def preprocess(
    data: Data,
    *,
    undirected: bool = True,
    remove_self_loops: bool = True,
    dedupe: bool = True,
) -> Data:
    """Make the graph undirected, drop self-loops and duplicate edges (each switchable).

    Steps, in this order: ``remove_self_loops`` (PyG ``remove_self_loops``); ``undirected`` (PyG
    ``to_undirected``: adds every missing reverse edge; it coalesces, so it also removes duplicates —
    ``dedupe=False`` has an effect only with ``undirected=False``); ``dedupe`` (PyG ``coalesce``:
    duplicates merged, edges sorted by source then target). ``edge_attr`` / ``edge_weight`` are carried
    along (duplicates summed, PyG's default reduction). The vertex count is kept, so trailing isolated
    vertices survive.

    Args:
        data: a graph with ``edge_index`` ``[2, E]`` (other attributes are passed through untouched).

    Returns:
        A new ``Data``; every tensor but ``edge_index`` (and edge attributes) is shared with the input,
        the input object itself is not modified.
    """
    out = _to_data(data)
    n = out.num_nodes
    ei = out.edge_index.long()
    key = next((k for k in _EDGE_KEYS if k in out and isinstance(out[k], Tensor)), None)
    attr = out[key] if key else None
    if remove_self_loops:
        ei, attr = _remove_self_loops(ei, attr)
    if undirected:
        if attr is None:
            ei = to_undirected(ei, num_nodes=n)
        else:
            ei, attr = to_undirected(ei, attr, num_nodes=n)
    elif dedupe:
        if attr is None:
            ei = coalesce(ei, num_nodes=n)
        else:
            ei, attr = coalesce(ei, attr, num_nodes=n)
    out.edge_index = ei.contiguous()
    if key:
        out[key] = attr
    return out


def prepare(
    data: Any,
    *,
    split: int | None = None,
    num_classes: int | None = None,
    undirected: bool = True,
    remove_self_loops: bool = True,
    dedupe: bool = True,
    normalize_features: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Data:
    """Validate, convert to the canonical form and preprocess: the input stage of a training run.

    ``[N, k]`` split matrices are reduced to column ``split`` first (pass ``split`` for such data,
    :func:`select_masks`), then :func:`validate` runs on the values as given, judged in ``dtype``
    (the floating dtype training uses: a float64 feature beyond float32's range is an error for a float32 run;
    its warnings are emitted), then :func:`canonicalize` (``x`` cast to ``dtype``); a missing ``val_mask`` /
    ``test_mask`` becomes an all-``False`` mask (``validate`` has warned; an empty one gives a :class:`DataWarning`
    here); then :func:`preprocess` with the given switches and, with ``normalize_features``, PyG's ``NormalizeFeatures``
    (each row of ``x`` divided by its sum: the GCN/GCNII papers' Planetoid preprocessing). Returns a new ``Data``; the
    input is not modified.

    Raises:
        DataValidationError: see :func:`validate`.
        ConfigError: ``split`` out of range.
    """
    staged = select_masks(data, split)
    validate(staged, num_classes=num_classes, dtype=dtype)
    out = canonicalize(staged, dtype=dtype)
    for key in ("val_mask", "test_mask"):
        if key not in out:  # validate() has warned
            out[key] = torch.zeros(out.num_nodes, dtype=torch.bool)
        elif not bool(out[key].any()):
            warnings.warn(f"data.{key} selects no vertex: no {key[:-5]} accuracy (reported as n/a"
                          + ("; no model selection" if key == "val_mask" else "") + f"); give the graph a {key} "
                          "(or more labelled vertices per class for the default split)", DataWarning, stacklevel=2)
    out = preprocess(out, undirected=undirected, remove_self_loops=remove_self_loops, dedupe=dedupe)
    if normalize_features:
        out = NormalizeFeatures()(out)
    return out
