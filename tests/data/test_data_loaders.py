"""load_dataset on every dataset family in ../shared/data; counts from its README's table.

Counts are those of the raw loader (``data.num_edges`` counts each undirected edge twice), before
:func:`gnnpipe.data.preprocess`.
"""

from __future__ import annotations

import stat

import pytest
import torch

from gnnpipe.data import available_datasets, load_dataset, validate
from gnnpipe.errors import ConfigError

pytestmark = pytest.mark.data

# name, root relative to shared/data ("" = the parent), nodes, edges, features, classes, split kind
TABLE = [
    ("Cora", "planetoid", 2708, 10556, 1433, 7, "fixed"),
    ("citeseer", "", 3327, 9104, 3703, 6, "fixed"),
    ("Computers", "amazon", 13752, 491722, 767, 10, "random"),
    ("amazon-photo", "", 7650, 238162, 745, 8, "random"),
    ("CS", "coauthor", 18333, 163788, 6805, 15, "random"),
    pytest.param("Physics", "", 34493, 495924, 8415, 5, "random", marks=pytest.mark.slow),  # 1.2 GB dense x
    ("Cora_ML", "citation_full", 2995, 16316, 2879, 7, "random"),
    ("CiteSeer_full", "", 4230, 10674, 602, 6, "random"),
    ("dblp", "citation_full/dblp", 17716, 105734, 1639, 4, "random"),
    ("Actor", "", 7600, 30019, 932, 5, "matrix"),
    ("cornell", "webkb", 183, 298, 1703, 5, "matrix"),
    ("Texas", "webkb/texas", 183, 325, 1703, 5, "matrix"),
    ("WISCONSIN", "", 251, 515, 1703, 5, "matrix"),
    ("Minesweeper", "heterophilous", 10000, 78804, 7, 2, "matrix"),
    ("tolokers", "", 11758, 1038000, 10, 2, "matrix"),
    ("chameleon", "heterophilous", 2277, 62742, 2325, 5, "matrix"),
    ("squirrel", "", 5201, 396706, 2089, 5, "matrix"),
    ("chameleon_filtered", "heterophilous/chameleon_filtered", 890, 17708, 2325, 5, "matrix"),
    ("squirrel-filtered", "heterophilous", 2223, 93996, 2089, 5, "matrix"),
    ("facebook", "musae", 22470, 341825, 4714, 4, "random"),
]


def canonical(d, n: int) -> None:
    assert d.x.dtype == torch.float32 and d.x.layout == torch.strided and d.x.shape[0] == n
    assert d.y.dtype == torch.long and d.y.shape == (n,)
    assert d.edge_index.dtype == torch.long and d.edge_index.size(0) == 2
    for k in ("train_mask", "val_mask", "test_mask"):
        assert d[k].dtype == torch.bool and d[k].shape == (n,), k
    assert isinstance(d.name, str)


@pytest.mark.parametrize("name,sub,n,e,f,c,kind", TABLE)
def test_counts_match_readme(shared_data, cache_dir, name, sub, n, e, f, c, kind):
    d = load_dataset(name, shared_data / sub if sub else shared_data, cache_dir=cache_dir)
    canonical(d, n)
    assert (d.num_nodes, d.num_edges, d.x.size(1), int(d.y.max()) + 1) == (n, e, f, c)
    assert d.name in available_datasets()
    assert bool(d.train_mask.any())
    validate(d)
    if kind == "random":  # Shchur et al.: 20 train / 30 val per class
        assert int(d.train_mask.sum()) == 20 * c and int(d.val_mask.sum()) == 30 * c
        assert int(d.test_mask.sum()) == n - 50 * c


def test_planetoid_public_split(shared_data, cache_dir):
    d = load_dataset("cora", shared_data, cache_dir=cache_dir)
    assert (int(d.train_mask.sum()), int(d.val_mask.sum()), int(d.test_mask.sum())) == (140, 500, 1000)
    with pytest.raises(ConfigError, match="single predefined split"):
        load_dataset("cora", shared_data, split=1, cache_dir=cache_dir)


def test_ten_splits_select_columns(shared_data, cache_dir):
    a = load_dataset("cornell", shared_data, split=0, cache_dir=cache_dir)
    b = load_dataset("cornell", shared_data, split=9, cache_dir=cache_dir)
    assert not torch.equal(a.train_mask, b.train_mask)
    assert torch.equal(a.edge_index, b.edge_index)
    with pytest.raises(ConfigError, match=r"10 predefined splits.*split=0..9"):
        load_dataset("cornell", shared_data, split=10, cache_dir=cache_dir)
    s3 = load_dataset("squirrel_filtered", shared_data, split=3, cache_dir=cache_dir)
    assert not torch.equal(s3.train_mask,
                           load_dataset("squirrel_filtered", shared_data, cache_dir=cache_dir).train_mask)


def test_random_split_is_seeded(shared_data, cache_dir):
    a = load_dataset("photo", shared_data, seed=1, cache_dir=cache_dir)
    b = load_dataset("photo", shared_data, seed=1, cache_dir=cache_dir)
    c = load_dataset("photo", shared_data, seed=2, cache_dir=cache_dir)
    d = load_dataset("photo", shared_data, seed=1, split=1, cache_dir=cache_dir)
    assert torch.equal(a.train_mask, b.train_mask)
    assert not torch.equal(a.train_mask, c.train_mask) and not torch.equal(a.train_mask, d.train_mask)


def test_dataset_folder_itself_as_root(shared_data, cache_dir):
    d = load_dataset("Cora", shared_data / "planetoid" / "Cora", cache_dir=cache_dir)
    assert d.num_nodes == 2708


def test_unknown_name_lists_known(shared_data):
    with pytest.raises(ConfigError, match=r"unknown dataset 'ogbn-arxiv'.*Cora.*squirrel"):
        load_dataset("ogbn-arxiv", shared_data)


def test_a_structure_set_as_a_node_dataset_points_to_the_atomistic_models():
    from gnnpipe.data.datasets import dataset_spec

    for name in ("oc20.extxyz", "relax.traj", "md17-like"):
        with pytest.raises(ConfigError, match=r"structure set: .*--model schnet or dimenet\+\+"):
            dataset_spec(name)
    with pytest.raises(ConfigError) as info:
        dataset_spec("ogbn-arxiv")
    assert "structure set" not in str(info.value)


@pytest.fixture
def partial_readonly_root(tmp_path):
    """A root without write bits holding only ``planetoid/PubMed_partial/raw`` (so PubMed is missing and PyG
    may not download it): built here, so the test does not depend on how the environment laid out a folder."""
    root = tmp_path / "data"
    raw = root / "planetoid" / "PubMed_partial" / "raw"
    raw.mkdir(parents=True)
    (raw / "ind.pubmed.x").write_bytes(b"")
    folders = [root, *sorted(root.rglob("*"))]
    for p in folders:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield root
    for p in folders:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_missing_files_name_paths(partial_readonly_root, tmp_path):
    root, cache = partial_readonly_root, tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"planetoid/PubMed/raw.*PubMed_partial.*not writable"):
        load_dataset("PubMed", root, cache_dir=cache)
    with pytest.raises(ConfigError, match=r"squirrel\.npz.*not writable"):
        load_dataset("squirrel", root / "planetoid", cache_dir=cache)


def test_synthetic_kwargs_only_for_synthetic(shared_data):
    with pytest.raises(ConfigError, match="only accepted for the synthetic graph"):
        load_dataset("cora", shared_data, num_nodes=10)
