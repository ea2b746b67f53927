"""Readers for graph files that have no PyG dataset class: npz / pt files and the MUSAE raw release.

* Platonov npz (``node_features``, ``node_labels``, ``edges`` ``[E, 2]``, ``{train,val,test}_masks``
  ``[k, N]``): the format of Platonov, Kuznedelev, Diskin, Babenko & Prokhorenkova, *A critical look at
  the evaluation of GNNs under heterophily*, ICLR 2023 (github.com/yandex-research/heterophilous-graphs).
  Edges are made undirected on load, exactly as PyG's ``HeterophilousGraphDataset`` does.
* Plain npz (``x``, ``y``, ``edge_index`` ``[2, E]``, optional ``train_mask``/``val_mask``/``test_mask``
  of shape ``[N]``, ``[N, k]`` or ``[k, N]``): loaded as given.
* gnn-benchmark npz (``adj_data``/``adj_indices``/``adj_indptr``/``adj_shape``, ``attr_*``, ``labels``;
  Shchur et al. 2018): read by ``torch_geometric.io.read_npz``.
* ``.pt``: a saved ``Data``, a dict of tensors, a one-element list/tuple of ``Data``, or the processed
  file of a PyG ``InMemoryDataset`` holding one graph.
* MUSAE Facebook Page-Page raw release (``edges.csv``, ``features.json``, ``target.csv``):
  Rozemberczki, Allen & Sarkar, *Multi-scale Attributed Node Embedding*, J. Complex Networks 2021.
"""

from __future__ import annotations

import csv
import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage
from torch_geometric.io import read_npz
from torch_geometric.utils import to_undirected

from ..errors import ConfigError

_ALIASES = {
    "x": ("x", "node_features", "features"),
    "y": ("y", "node_labels", "labels"),
}


def _pick(f: Any, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k in f), None)


def _mask(arr: np.ndarray, n: int) -> torch.Tensor:
    t = torch.from_numpy(np.asarray(arr))
    if t.dim() == 2 and t.size(1) == n and t.size(0) != n:  # Platonov: [k, N]
        t = t.t()
    return t.contiguous()


def read_npz_graph(path: str | Path) -> Data:
    """Read a graph from an ``.npz`` file in one of the layouts of the module docstring.

    Returns:
        ``Data`` with ``x``, ``y``, ``edge_index`` and whatever masks the file holds (``[N]`` or
        ``[N, k]``), not yet canonicalised.

    Raises:
        ConfigError: the file cannot be read or lacks features, labels or edges (names the keys found).
    """
    path = Path(path)
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path} as an .npz file ({e}); save it with numpy.savez") from e
    with f:
        keys = set(f.files)
        if "adj_data" in keys or "adj_matrix.data" in keys:
            return read_npz(str(path))
        kx, ky = _pick(keys, _ALIASES["x"]), _pick(keys, _ALIASES["y"])
        ke = "edge_index" if "edge_index" in keys else ("edges" if "edges" in keys else None)
        if kx is None or ky is None or ke is None:
            raise ConfigError(
                f"{path} holds keys {sorted(keys)}; a graph .npz needs features (x or node_features), labels "
                "(y or node_labels) and edges (edge_index [2, E] or edges [E, 2]) — re-save it with those keys"
            )
        x = torch.from_numpy(np.asarray(f[kx]))
        y = torch.from_numpy(np.asarray(f[ky]))
        n = x.size(0)
        edges = torch.from_numpy(np.asarray(f[ke]))
        if edges.is_floating_point() or edges.dtype == torch.bool:
            # left as stored: validate() rejects it with the fix (a cast here would hide fractional ids)
            edge_index = edges.t().contiguous() if ke == "edges" and edges.dim() == 2 else edges
        elif ke == "edges":  # Platonov layout: undirected pairs [E, 2]
            edge_index = to_undirected(edges.long().t().contiguous(), num_nodes=n)
        else:
            edge_index = edges.long()
        data = Data(x=x, y=y, edge_index=edge_index)
        for name in ("train", "val", "test"):
            k = _pick(keys, (f"{name}_mask", f"{name}_masks"))
            if k is not None:
                data[f"{name}_mask"] = _mask(f[k], n)
    return data


def read_pt_graph(path: str | Path) -> Data:
    """Read a graph saved with ``torch.save`` (see module docstring for the accepted objects).

    Tries ``torch.load(weights_only=True)`` first (with PyG's ``Data`` classes allow-listed, so a saved
    ``Data`` loads safely); only if that refuses the file does it unpickle it fully (``weights_only=False``, with a
    warning: do this only for files you trust).

    Raises:
        ConfigError: the file cannot be loaded or holds something else.
    """
    path = Path(path)

    # PyG allow-lists Data itself; add the storage classes a pickled Data also needs. (Not the
    # safe_globals() context manager: on exit it also drops entries that were registered before.)
    known = set(torch.serialization.get_safe_globals())
    missing = [c for c in (Data, DataEdgeAttr, DataTensorAttr, GlobalStorage) if c not in known]
    if missing:
        torch.serialization.add_safe_globals(missing)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        warnings.warn(
            f"{path} is not loadable with torch.load(weights_only=True); unpickling it fully — only load files "
            "you trust",
            UserWarning,
            stacklevel=3,
        )
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:
            raise ConfigError(f"cannot load {path} with torch.load ({type(e).__name__}: {e})") from e
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways (OSError, EOFError, KeyError, …)
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"cannot load {path} with torch.load ({type(e).__name__}: {e}); is it a file written "
                          "by torch.save?") from e
    if isinstance(obj, (list, tuple)) and len(obj) >= 1 and isinstance(obj[0], dict) and len(obj) <= 4 and (
        len(obj) == 1 or obj[1] is None or isinstance(obj[1], dict)
    ):
        obj = obj[0]  # InMemoryDataset processed file: (data dict, slices, [sizes,] class)
    if isinstance(obj, (list, tuple)) and len(obj) == 1 and isinstance(obj[0], Data):
        obj = obj[0]
    if isinstance(obj, Data):
        return obj
    if isinstance(obj, dict):
        if "_store" in obj or any(isinstance(v, dict) for v in obj.values()):
            try:
                return Data.from_dict(obj)
            except Exception:  # noqa: BLE001
                pass
        return Data(**{k: v for k, v in obj.items()})
    raise ConfigError(
        f"{path} holds a {type(obj).__name__}; save a torch_geometric.data.Data or a dict of tensors "
        "(x, edge_index, y, masks) with torch.save"
    )


def read_musae_facebook(raw_dir: str | Path) -> Data:
    """Read the MUSAE Facebook Page-Page raw release (``edges.csv``, ``features.json``, ``target.csv``).

    Returns ``x`` dense binary float32 ``[22470, 4714]`` (sparse features densified), ``y`` int64 (classes
    sorted by name: company, government, politician, tvshow), ``edge_index`` made undirected
    (``to_undirected``; self-loops kept, as listed). No masks (the release has no split).
    """
    raw = Path(raw_dir)
    with open(raw / "target.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    ids = np.array([int(r["id"]) for r in rows])
    names = [r["page_type"] for r in rows]
    classes = sorted(set(names))
    n = len(rows)
    y = torch.empty(n, dtype=torch.long)
    y[torch.from_numpy(ids)] = torch.tensor([classes.index(c) for c in names])
    edges = np.loadtxt(raw / "edges.csv", delimiter=",", skiprows=1, dtype=np.int64).reshape(-1, 2)
    edge_index = to_undirected(torch.from_numpy(edges).t().contiguous(), num_nodes=n)
    with open(raw / "features.json", encoding="utf-8") as fh:
        feats = json.load(fh)
    r = np.fromiter((int(k) for k, v in feats.items() for _ in v), dtype=np.int64)
    c = np.fromiter((int(j) for v in feats.values() for j in v), dtype=np.int64)
    f = int(c.max()) + 1 if c.size else 1
    x = torch.zeros(n, f, dtype=torch.float32)
    x[torch.from_numpy(r), torch.from_numpy(c)] = 1.0
    return Data(x=x, y=y, edge_index=edge_index)
