"""A user's own .pt / .npz files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import is_undirected

from gnnpipe.data import load_dataset, prepare
from gnnpipe.errors import ConfigError


def small(n: int = 60, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, 200), generator=g)
    y = torch.arange(n) % 3
    tr = torch.zeros(n, dtype=torch.bool)
    tr[:9] = True
    return Data(x=torch.randn(n, 4, generator=g), edge_index=ei, y=y, train_mask=tr,
                val_mask=~tr & (torch.arange(n) < 20), test_mask=torch.arange(n) >= 20)


def test_pt_data(tmp_path, recwarn):
    d = small()
    d.name = "mine"
    torch.save(d, tmp_path / "g.pt")
    out = load_dataset(str(tmp_path / "g.pt"))
    assert not [w for w in recwarn if "unpickling" in str(w.message)]  # loaded with weights_only=True
    assert out.name == "mine" and torch.equal(out.edge_index, d.edge_index) \
        and torch.equal(out.train_mask, d.train_mask)


def test_a_damaged_pt_file_is_a_clear_error(tmp_path):
    (tmp_path / "junk.pt").write_text("junk\n")  # torch.load fails inside its unpickler (a KeyError)
    with pytest.raises(ConfigError, match=r"cannot load .*junk\.pt with torch\.load .*torch\.save"):
        load_dataset(str(tmp_path / "junk.pt"))


def test_pt_dict_without_masks_gets_random_split(tmp_path):
    d = small()
    y = d.y.clone()
    y[:6] = -1  # unlabelled vertices stay out of every mask
    torch.save({"x": d.x.double(), "edge_index": d.edge_index.int(), "y": y}, tmp_path / "g.pt")
    out = load_dataset("g.pt", tmp_path, seed=4)
    assert out.name == "g" and out.x.dtype == torch.float32 and out.edge_index.dtype == torch.long
    # 54 labelled vertices, 18 per class: classes smaller than 20 + 30 put all of them in train
    assert int(out.train_mask.sum()) == 54 and int(out.val_mask.sum()) == 0
    assert not bool((out.train_mask | out.val_mask | out.test_mask)[:6].any())
    prepare(out)


def test_pt_needs_full_unpickling_warns(tmp_path):
    torch.save({"x": torch.ones(3, 1), "edge_index": torch.zeros(2, 0, dtype=torch.long), "y": torch.zeros(3),
                "meta": np.int64(3)}, tmp_path / "h.pt")
    with pytest.warns(UserWarning, match="only load files you trust"):
        out = load_dataset(str(tmp_path / "h.pt"))
    assert out.y.dtype == torch.long


def test_npz_platonov_layout(tmp_path):
    n, k = 30, 3
    rng = np.random.default_rng(0)
    edges = rng.integers(0, n, (50, 2))
    masks = rng.random((k, n)) < 0.5
    np.savez(tmp_path / "p.npz", node_features=rng.standard_normal((n, 5)).astype(np.float32),
             node_labels=np.arange(n) % 2, edges=edges, train_masks=masks, val_masks=~masks, test_masks=~masks)
    out = load_dataset(str(tmp_path / "p.npz"), split=2)
    assert out.x.shape == (30, 5) and is_undirected(out.edge_index)  # pairs made undirected on load
    assert torch.equal(out.train_mask, torch.from_numpy(masks[2]))
    with pytest.raises(ConfigError, match=r"3 predefined splits"):
        load_dataset(str(tmp_path / "p.npz"), split=3)


def test_npz_plain_keys(tmp_path):
    d = small()
    np.savez(tmp_path / "q.npz", x=d.x.numpy(), y=d.y.numpy(), edge_index=d.edge_index.numpy(),
             train_mask=d.train_mask.numpy(), val_mask=d.val_mask.numpy(), test_mask=d.test_mask.numpy())
    out = load_dataset(str(tmp_path / "q.npz"))
    assert torch.equal(out.edge_index, d.edge_index) and torch.equal(out.test_mask, d.test_mask)


def test_npz_wrong_keys(tmp_path):
    np.savez(tmp_path / "bad.npz", a=np.zeros(3))
    with pytest.raises(ConfigError, match=r"holds keys \['a'\].*node_features"):
        load_dataset(str(tmp_path / "bad.npz"))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"not found \(looked at .*nope\.npz"):
        load_dataset(str(tmp_path / "nope.npz"))
