"""Datasets for gnnpipe: loading, validation and preprocessing.

Public API::

    load_dataset(name=None, root=None, *, split=0, seed=0, cache_dir=None, dtype=torch.float32,
                 **synthetic_kwargs) -> Data
    synthetic_graph(num_nodes=2000, avg_degree=10.0, num_classes=5, num_features=32, homophily=0.85,
                    gamma=2.2, noise=1.0, train_per_class=20, val_per_class=30, seed=0) -> Data
    validate(data, *, num_classes=None, require_train_mask=True, dtype=torch.float32) -> list[str]
    check_finite_in_dtype(value, name, dtype=torch.float32) -> None
    preprocess(data, *, undirected=True, remove_self_loops=True, dedupe=True) -> Data
    prepare(data, *, split=None, num_classes=None, undirected=True, remove_self_loops=True, dedupe=True,
            normalize_features=False, dtype=torch.float32) -> Data

plus helpers: ``random_split`` (Shchur et al. 2018 per-class split), ``canonicalize``, ``select_masks``,
``available_datasets``, ``default_cache_dir`` and the warning class ``DataWarning``.
"""

from .datasets import DatasetSpec, available_datasets, dataset_spec, default_cache_dir, load_dataset
from .preprocess import canonicalize, prepare, preprocess, select_masks
from .splits import random_split
from .synthetic import synthetic_graph
from .validation import DataWarning, check_finite_in_dtype, validate

__all__ = [
    "DataWarning",
    "DatasetSpec",
    "available_datasets",
    "canonicalize",
    "check_finite_in_dtype",
    "dataset_spec",
    "default_cache_dir",
    "load_dataset",
    "prepare",
    "preprocess",
    "random_split",
    "select_masks",
    "synthetic_graph",
    "validate",
]
