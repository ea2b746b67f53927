"""Read-only roots load through the cache and are never written; writable roots work as in PyG."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from gnnpipe.data import load_dataset
from gnnpipe.errors import ConfigError

pytestmark = pytest.mark.data


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_mode) for p in root.rglob("*")}


def make_readonly(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def make_writable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


@pytest.fixture
def webkb_copy(shared_data, tmp_path):
    root = tmp_path / "data" / "webkb"
    shutil.copytree(shared_data / "webkb" / "cornell", root / "cornell")
    make_writable(tmp_path / "data")  # copytree keeps the read-only modes of shared/
    yield root
    make_writable(tmp_path / "data")


def test_readonly_root_is_not_written(webkb_copy, tmp_path):
    make_readonly(webkb_copy.parent)
    before = snapshot(webkb_copy.parent)
    cache = tmp_path / "cache"
    d = load_dataset("Cornell", webkb_copy, cache_dir=cache)
    assert d.num_nodes == 183 and d.num_edges == 298
    assert snapshot(webkb_copy.parent) == before  # nothing created or touched
    assert list(cache.rglob("processed"))  # PyG processed into the cache instead
    links = [p for p in cache.rglob("raw") if p.is_symlink()]
    assert links and os.path.realpath(links[0]) == str((webkb_copy / "cornell" / "raw").resolve())
    # the parent as root works too, and a second load reuses the cache
    d2 = load_dataset("cornell", webkb_copy.parent, cache_dir=cache)
    assert d2.num_edges == 298 and snapshot(webkb_copy.parent) == before


def test_writable_root_gets_processed_beside_raw(webkb_copy, tmp_path):
    d = load_dataset("cornell", webkb_copy, cache_dir=tmp_path / "cache")
    assert d.num_nodes == 183
    assert (webkb_copy / "cornell" / "processed").is_dir()
    assert not (tmp_path / "cache" / "readonly").exists()


def test_readonly_root_missing_raw_errors(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    make_readonly(root)
    try:
        with pytest.raises(ConfigError, match=r"empty/Texas/raw|empty/texas/raw"):
            load_dataset("texas", root, cache_dir=tmp_path / "cache")
    finally:
        make_writable(root)
    assert list(root.iterdir()) == []


def test_writable_root_missing_raw_calls_pyg_download(tmp_path, monkeypatch):
    """With the raw files missing and a writable root, the PyG class is called (and downloads)."""
    from torch_geometric.datasets import webkb

    called = {}

    def fake_download(self):
        called["raw_dir"] = self.raw_dir
        raise OSError("offline")

    monkeypatch.setattr(webkb.WebKB, "download", fake_download)
    (tmp_path / "dl").mkdir()
    with pytest.raises(ConfigError, match="offline"):
        load_dataset("texas", tmp_path / "dl", cache_dir=tmp_path / "cache")
    assert called["raw_dir"] == str(tmp_path / "dl" / "texas" / "raw")


def test_a_root_that_does_not_exist_is_an_error_not_a_download(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*mkdir"):
        load_dataset("Cora", tmp_path / "typo")
    assert not (tmp_path / "typo").exists()
