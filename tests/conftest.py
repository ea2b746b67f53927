import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture
def shared_data():
    """``../shared/data`` beside the checkout; skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    if "GNNPIPE_CACHE" not in os.environ:
        monkeypatch.setenv("GNNPIPE_CACHE", str(tmp_path_factory.getbasetemp() / "gnnpipe-cache"))
    yield
