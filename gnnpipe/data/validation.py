"""Checks that a ``torch_geometric.data.Data`` can be trained on, with messages that name the fix.

Rules and what they guard against:

* ``edge_index`` must be an integer ``[2, E]`` tensor of ids in ``[0, N)`` — PyG's convention
  (Fey & Lenssen, *Fast Graph Representation Learning with PyTorch Geometric*, ICLR-W 2019); floats,
  negative or too-large ids would index out of bounds inside the sparse aggregation.
* ``x`` must be a 2-D ``[N, F]`` tensor with only finite values — one NaN row poisons every vertex
  within L hops after L aggregations, i.e. (nearly) the whole graph for a deep GNN.
* Values are judged in the dtype training uses (``dtype``, default float32), not only as given: a
  float64 ``1e300`` is finite but becomes ``inf`` when cast to float32. :func:`check_finite_in_dtype`
  is that rule for one tensor (``x``, ``edge_weight``; positions, energies and forces of atomistic data).
* ``y`` must have one label per vertex. Labels are only checked where a mask uses them: vertices
  outside every mask may carry anything (e.g. ``-1`` for "unlabelled", as in the heterophilous
  benchmarks of Platonov et al., ICLR 2023).
* ``train_mask`` must exist and select at least one vertex; every mask must be 1-D of length N.

Decisions:

* Masks may be ``bool`` or integer tensors holding only 0/1 (older datasets store ``uint8`` masks);
  :func:`gnnpipe.data.prepare` converts them to ``bool``. Float masks, values other than 0/1 and
  index lists are errors (the message says how to convert an index list).
* An ``[N, k]`` split matrix (k predefined splits) is an error here; pick a column first
  (``prepare(data, split=i)`` or ``load_dataset(..., split=i)``).
* A graph without edges is allowed with a warning (every GNN degenerates to an MLP). Isolated
  vertices are allowed silently: they are common in real graphs (CiteSeer has 48) and every
  aggregation kind handles them (``gcn`` keeps the self term, ``mean``/``sum`` give zero rows).
* Missing ``val_mask`` / ``test_mask`` and train/test overlap are warnings, not errors:
  :func:`gnnpipe.data.prepare` then gives the missing masks as all-``False`` (no model selection / no
  test accuracy; reported as n/a), and warns about empty ones.
* ``y`` is required (node classification needs labels), also where no mask exists yet and a loader
  is about to draw a random split from it.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from ..errors import DataValidationError

MASKS = ("train_mask", "val_mask", "test_mask")


class DataWarning(UserWarning):
    """A property of the input graph that is legal but probably unintended."""


def _fail(msg: str) -> None:
    raise DataValidationError(msg)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_finite_in_dtype(value: Tensor, name: str, dtype: torch.dtype = torch.float32, *,
                          scale_hint: str | None = None) -> None:
    """Check that every value of a floating tensor is finite as given *and* once cast to ``dtype``.

    The run casts its inputs to one floating dtype (``TrainConfig.dtype``); a value finite in the given
    dtype can overflow in that one (float32 holds magnitudes up to about 3.4e38, float64 up to 1.8e308), and
    one ``inf`` makes the loss NaN. Integer and bool tensors pass (every integer up to 2^63 is finite in
    float32); so does a non-tensor (the caller checks types).

    Args:
        value: the tensor (any shape; sparse tensors are judged by their stored values).
        name: how the message names it, e.g. ``"data.x"``, ``"data.edge_weight"``, ``"data.pos"``.
        dtype: the floating dtype the values are trained in (default float32).
        scale_hint: how to scale this input, shown in the message (default: divide by its largest magnitude).

    Raises:
        DataValidationError: NaN or ±inf as given (with their counts), or values beyond ``dtype``'s range
            (with their count and largest magnitude); the message names ``name``, both dtypes and the fix:
            scale the input, or train in float64 (``--dtype float64`` / ``TrainConfig(dtype="float64")``).
    """
    if not isinstance(value, Tensor):
        return
    vals = value.coalesce().values() if value.is_sparse else value
    if not vals.is_floating_point() or vals.numel() == 0:
        return
    finite = torch.isfinite(vals)
    if not bool(finite.all()):
        nan = int(torch.isnan(vals).sum())
        _fail(
            f"{name} has non-finite values (NaN: {nan}, inf: {int((~finite).sum()) - nan} of {vals.numel()}); "
            f"replace them (e.g. {name} = torch.nan_to_num({name}, nan=0.0, posinf=0.0, neginf=0.0)) or drop "
            "the items that hold them"
        )
    if not dtype.is_floating_point or torch.finfo(vals.dtype).max <= torch.finfo(dtype).max:
        return
    hi = max(abs(float(vals.amax())), abs(float(vals.amin())))
    if hi <= torch.finfo(dtype).max:
        return
    over = int((~torch.isfinite(vals.to(dtype))).sum())  # exact: what the cast gives
    if over == 0:
        return
    scale = scale_hint or f"{name} = {name} / {name}.abs().max()"
    _fail(
        f"{name} has {over} value(s) that are finite as given ({_dtype_name(vals.dtype)}) but beyond the range of "
        f"{_dtype_name(dtype)}, the dtype training uses (largest magnitude {hi:.3g} > {torch.finfo(dtype).max:.3g}): "
        f"they would become inf and the loss NaN; scale the input (e.g. {scale}) or train in float64 "
        "(--dtype float64, or TrainConfig(dtype=\"float64\"))"
    )


def _get(data: Any, key: str) -> Any:
    try:
        return data[key] if key in data else None
    except (KeyError, TypeError, AttributeError):
        return getattr(data, key, None)


def _num_nodes(data: Any, x: Tensor | None) -> int | None:
    if isinstance(x, Tensor) and x.dim() >= 1:
        return int(x.size(0))
    n = getattr(data, "num_nodes", None)
    return int(n) if n is not None else None


def _check_edge_index(edge_index: Any, n: int | None) -> int:
    if edge_index is None:
        _fail(
            "data.edge_index is missing; set data.edge_index = LongTensor[2, E] of (source, target) ids, "
            "or torch.empty(2, 0, dtype=torch.long) for a graph without edges"
        )
    if not isinstance(edge_index, Tensor):
        _fail(
            f"data.edge_index must be a torch.Tensor, got {type(edge_index).__name__}; "
            "convert it with torch.as_tensor(edge_index, dtype=torch.long)"
        )
    if edge_index.is_sparse or edge_index.layout != torch.strided:
        _fail(
            "data.edge_index is a sparse tensor; pass the COO index list instead, e.g. "
            "edge_index = adj.coalesce().indices() (or torch_geometric.utils.to_edge_index(adj)[0])"
        )
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        hint = " (it looks transposed: use edge_index.t().contiguous())" if (
            edge_index.dim() == 2 and edge_index.size(1) == 2
        ) else ""
        _fail(
            f"data.edge_index must have shape [2, E], got {list(edge_index.shape)}{hint}; "
            "row 0 holds source ids and row 1 target ids"
        )
    if edge_index.dtype == torch.bool or edge_index.is_floating_point() or edge_index.is_complex():
        _fail(
            f"data.edge_index must hold integer vertex ids, got dtype {edge_index.dtype}; "
            "convert it with data.edge_index = data.edge_index.long() (after checking the values are whole numbers)"
        )
    e = int(edge_index.size(1))
    if e == 0:
        return 0
    lo, hi = int(edge_index.min()), int(edge_index.max())
    if lo < 0:
        bad = int((edge_index < 0).any(0).sum())
        _fail(
            f"data.edge_index has {bad} edge(s) with a negative vertex id (min {lo}); vertex ids must be in "
            "[0, N): remove those edges, e.g. data.edge_index = ei[:, (ei >= 0).all(0)]"
        )
    if n is not None and hi >= n:
        bad = int((edge_index >= n).any(0).sum())
        _fail(
            f"data.edge_index refers to vertex {hi} but the graph has N = {n} vertices ({bad} edge(s) out of "
            "range); vertex ids must be in [0, N): relabel the vertices to 0..N-1, add the missing rows to "
            "data.x and data.y, or drop those edges"
        )
    return e


def _check_x(x: Any, n_hint: int | None, dtype: torch.dtype = torch.float32) -> int:
    if x is None:
        _fail(
            "data.x (vertex features) is missing; set data.x = FloatTensor[N, F] — for a graph without "
            "features use e.g. torch.ones(N, 1) or a one-hot identity torch.eye(N)"
        )
    if not isinstance(x, Tensor):
        _fail(f"data.x must be a torch.Tensor, got {type(x).__name__}; convert it with torch.as_tensor(x)")
    if x.dim() != 2:
        fix = "use data.x = data.x.unsqueeze(1) for one feature per vertex" if x.dim() == 1 else (
            "flatten the trailing dimensions: data.x = data.x.flatten(1)"
        )
        _fail(f"data.x must be 2-D [N, F], got shape {list(x.shape)}; {fix}")
    if x.size(1) == 0:
        _fail("data.x has 0 feature columns; give every vertex at least one feature, e.g. torch.ones(N, 1)")
    vals = x.coalesce().values() if x.is_sparse else x
    if vals.is_floating_point() or vals.is_complex():
        finite = torch.isfinite(vals)
        if not bool(finite.all()):
            if x.is_sparse:
                rows = x.coalesce().indices()[0][~finite.reshape(finite.size(0), -1).all(1)].unique().numel()
            else:
                rows = int((~finite.all(1)).sum())
            nan = int(torch.isnan(vals).sum())
            _fail(
                f"data.x has non-finite values (NaN: {nan}, inf: {int((~finite).sum()) - nan}) in {rows} of "
                f"{x.size(0)} row(s); they would spread to every vertex within L hops — impute them (e.g. "
                "data.x = torch.nan_to_num(data.x, nan=0.0, posinf=0.0, neginf=0.0)) or drop those vertices"
            )
    check_finite_in_dtype(x, "data.x", dtype)
    return int(x.size(0))


def _check_edge_weight(w: Any, e: int, dtype: torch.dtype) -> None:
    if w is None:
        return
    if not isinstance(w, Tensor):
        _fail(f"data.edge_weight must be a torch.Tensor, got {type(w).__name__}; convert it with "
              "torch.as_tensor(edge_weight, dtype=torch.float32)")
    if w.dim() == 2 and w.size(1) == 1:
        w = w.view(-1)
    if w.dim() != 1 or w.numel() != e:
        _fail(f"data.edge_weight must hold one weight per edge, shape [E] = [{e}], got {list(w.shape)}; "
              "give every column of data.edge_index a weight (or delete data.edge_weight for weight 1)")
    if w.is_complex() or w.dtype == torch.bool:
        _fail(f"data.edge_weight has dtype {w.dtype}; edge weights must be real numbers: data.edge_weight.float()")
    check_finite_in_dtype(w, "data.edge_weight", dtype)


def _check_masks(data: Any, n: int) -> dict[str, Tensor]:
    masks: dict[str, Tensor] = {}
    for key in MASKS:
        m = _get(data, key)
        if m is None:
            continue
        if not isinstance(m, Tensor):
            _fail(
                f"data.{key} must be a torch.Tensor, got {type(m).__name__}; "
                f"convert it with torch.as_tensor({key}, dtype=torch.bool)"
            )
        if m.dim() == 2 and m.size(0) == n:
            _fail(
                f"data.{key} is a split matrix of shape {list(m.shape)} ({m.size(1)} predefined splits); "
                f"pick one column: prepare(data, split=i) or data.{key} = data.{key}[:, i] with i in "
                f"0..{m.size(1) - 1}"
            )
        if m.dim() != 1 or m.numel() != n:
            idx_hint = ""
            if m.dim() == 1 and m.dtype not in (torch.bool,) and not m.is_floating_point():
                idx_hint = (
                    f"; if it is a list of vertex ids, convert it with "
                    f"torch_geometric.utils.index_to_mask(data.{key}, size={n})"
                )
            _fail(
                f"data.{key} must be a 1-D mask of length N = {n}, got shape {list(m.shape)}{idx_hint}"
            )
        if m.dtype != torch.bool:
            if m.is_floating_point() or m.is_complex():
                _fail(
                    f"data.{key} has dtype {m.dtype}; masks must be bool (or 0/1 integers): "
                    f"use data.{key} = data.{key} > 0.5 (or .bool() after checking the values)"
                )
            if m.numel() and bool(((m != 0) & (m != 1)).any()):
                _fail(
                    f"data.{key} is an integer tensor with values other than 0/1 (min {int(m.min())}, max "
                    f"{int(m.max())}); masks must be bool: if these are vertex ids use "
                    f"torch_geometric.utils.index_to_mask(ids, size={n}), else data.{key} = data.{key} != 0"
                )
            m = m.bool()
        masks[key] = m
    return masks


def validate(data: Any, *, num_classes: int | None = None, require_train_mask: bool = True,
             dtype: torch.dtype = torch.float32) -> list[str]:
    """Check that ``data`` is a well-formed node-classification graph; raise on errors, warn otherwise.

    Args:
        data: a ``torch_geometric.data.Data`` (anything with the same attributes works).
        num_classes: if given (else ``data.num_classes`` if that attribute is stored), labels of
            masked vertices must be ``< num_classes``.
        require_train_mask: whether a missing ``train_mask`` is an error (default) or is left to the
            caller (``load_dataset`` draws a random split for graphs without masks; then no mask
            warning is given either).

    Returns:
        The warning messages, each also emitted as :class:`DataWarning` via ``warnings.warn``
        (empty list for a clean graph).

    Raises:
        DataValidationError: naming the problem and the fix, for: ``edge_index`` missing, not
            ``[2, E]``, not integer, negative or ``>= N`` ids; ``x`` missing, not 2-D, NaN/inf
            (with the number of rows), or beyond ``dtype``'s range; ``edge_weight`` not one real number per
            edge, non-finite or beyond ``dtype``'s range; ``y`` missing, wrong length, multi-column or non-integral;
            masked labels negative or ``>= num_classes``; ``train_mask`` missing (unless
            ``require_train_mask=False``: a loader that draws a random split itself) or empty; any mask of
            the wrong shape or dtype (see module docstring).
    """
    if data is None:
        _fail("data is None; pass a torch_geometric.data.Data with x, edge_index, y and train_mask")
    x = _get(data, "x")
    n = _check_x(x, None, dtype)
    _check_edge_index(_get(data, "edge_index"), n)
    e = int(_get(data, "edge_index").size(1))
    _check_edge_weight(_get(data, "edge_weight"), e, dtype)

    # labels
    y = _get(data, "y")
    if y is None:
        _fail("data.y (vertex labels) is missing; labels are required for training (node classification): "
              "set data.y = LongTensor[N] of class ids (use -1 for unlabelled vertices)")
    if not isinstance(y, Tensor):
        _fail(f"data.y must be a torch.Tensor, got {type(y).__name__}; convert it with torch.as_tensor(y).long()")
    if y.dim() == 2 and y.size(1) == 1:
        y = y.view(-1)
    if y.dim() != 1:
        _fail(
            f"data.y must be 1-D [N] class ids, got shape {list(y.shape)}; multi-label targets are not "
            "supported — for one-hot labels use data.y = data.y.argmax(1)"
        )
    if y.numel() != n:
        _fail(
            f"data.y has {y.numel()} labels but the graph has N = {n} vertices (rows of data.x); give every "
            "vertex a label (use -1 for vertices outside every mask)"
        )
    if y.is_floating_point():
        if not bool((torch.isfinite(y) & (y == y.round())).all()):
            _fail(
                "data.y holds non-integral float values; labels must be class ids: "
                "data.y = data.y.long() for whole numbers, or map the values to 0..C-1"
            )
    elif y.dtype == torch.bool or y.is_complex():
        _fail(f"data.y has dtype {y.dtype}; labels must be integer class ids: data.y = data.y.long()")

    masks = _check_masks(data, n)
    if "train_mask" not in masks and not require_train_mask:
        pass  # the caller draws a random split
    elif "train_mask" not in masks:
        _fail(
            "data.train_mask is missing; set it to a BoolTensor[N] marking the training vertices, e.g. "
            "gnnpipe.data.random_split(data.y) for 20 train / 30 val per class, rest test"
        )
    elif not bool(masks["train_mask"].any()):
        _fail(
            "data.train_mask selects no vertex; mark at least one training vertex (e.g. "
            "gnnpipe.data.random_split(data.y))"
        )

    if num_classes is None:
        stored = _get(data, "num_classes")
        num_classes = int(stored) if isinstance(stored, (int, Tensor)) and not isinstance(stored, bool) else None
    yl = y.long()
    for key, m in masks.items():
        if not bool(m.any()):
            continue
        labels = yl[m]
        if int(labels.min()) < 0:
            bad = int((labels < 0).sum())
            _fail(
                f"{bad} vertex/vertices in data.{key} have a negative label (min {int(labels.min())}); "
                f"labels of masked vertices must be class ids >= 0: remove them from the mask "
                f"(data.{key} &= data.y >= 0) or fix their labels"
            )
        if num_classes is not None and int(labels.max()) >= num_classes:
            bad = int((labels >= num_classes).sum())
            _fail(
                f"{bad} vertex/vertices in data.{key} have a label >= num_classes = {num_classes} "
                f"(max {int(labels.max())}); labels must be in [0, {num_classes}): fix num_classes or the labels"
            )

    found: list[str] = []
    if e == 0:
        found.append(
            "the graph has no edges: every GNN layer reduces to a per-vertex MLP; check data.edge_index "
            "if that is not intended"
        )
    if "train_mask" in masks:
        for key in ("val_mask", "test_mask"):
            if key not in masks:
                found.append(
                    f"data.{key} is missing: training treats it as empty (no {key[:-5]} accuracy, reported as n/a"
                    + ("; no model selection" if key == "val_mask" else "") + f"); give the graph a {key} to get one"
                )
    if "test_mask" in masks and "train_mask" in masks:
        overlap = int((masks["train_mask"] & masks["test_mask"]).sum())
        if overlap:
            found.append(
                f"{overlap} vertex/vertices are in both train_mask and test_mask; the test accuracy is "
                "optimistic (data.test_mask &= ~data.train_mask removes the overlap)"
            )
    for msg in found:
        warnings.warn(msg, DataWarning, stacklevel=2)
    return found
