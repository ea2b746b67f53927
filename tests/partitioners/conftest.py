"""Fixtures of the partitioner tests: a small hand-made graph and Cora (read-only shared data)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
from torch_geometric.data import Data

from .graphs import two_communities

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture
def graph() -> Data:
    return two_communities()


@pytest.fixture(scope="session")
def cora(tmp_path_factory) -> Data:
    raw = SHARED_DATA / "planetoid" / "Cora" / "raw"
    if not raw.is_dir():
        pytest.skip(f"shared data not found at {raw}")
    from torch_geometric.datasets import Planetoid

    root = tmp_path_factory.mktemp("planetoid")
    (root / "Cora").mkdir()
    os.symlink(raw, root / "Cora" / "raw")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Planetoid(str(root), "Cora")[0]
