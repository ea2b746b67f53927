"""Fixtures of the gnnpipe.data tests: the shared offline datasets and a per-session cache folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: ``../shared/data`` beside the checkout (read-only in CI); ``GNNPIPE_TEST_DATA`` names another copy (e.g. a
#: writable one: the tests must pass whichever write bits the folder has).
SHARED_DATA = Path(os.environ.get("GNNPIPE_TEST_DATA")
                   or Path(__file__).resolve().parents[2].parent / "shared" / "data")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "README.md").is_file():
        pytest.skip(f"shared offline datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One writable cache for the whole session, so each dataset is processed by PyG once."""
    return tmp_path_factory.mktemp("gnnpipe-cache")
