"""result.model for every layout, the PyG-style call, predict, and the model file (issue #13)."""

from __future__ import annotations

import pytest
import torch

from gnnpipe import api, models
from gnnpipe.tasks.nodes.graph import GraphOps

from .distutil import small_graph


def _acc(model, data, mask) -> float:
    pred = api.predict(model, data).argmax(-1)
    return pytest.approx(int((pred[mask] == data.y[mask]).sum()) / int(mask.sum()), rel=1e-6)  # = correct/total


def _cfg(**kw):
    d = dict(model="gcnii", layers=4, hidden=8, dropout=0.5, epochs=12, patience=0, seed=3, dtype="float64",
             timeout_s=60.0)
    d.update(kw)
    return d


def test_pyg_call_equals_the_callback_call_and_is_cached():
    data = small_graph()
    model = models.build_model("gcn", 8, 3, num_layers=3, hidden=8).eval()
    ops = GraphOps(data.edge_index, data.num_nodes)
    a = model(data.x, ops.aggregate)
    b = model(data.x, data.edge_index)
    assert torch.equal(a, b)
    cached = model.__dict__["_graph_ops"][1]
    model(data.x, data.edge_index)
    assert model.__dict__["_graph_ops"][1] is cached  # built once
    with pytest.raises(Exception, match=r"\[2, E\]"):
        model(data.x, data.x)


def test_single_process_model_is_the_best_epoch_and_predicts_its_test_accuracy(tmp_path):
    data = small_graph()
    res = api.train(data=data, progress=False, **_cfg())
    assert _acc(res.model, data, data.test_mask) == res.test_acc_at_best_val
    assert _acc(res.model, data, data.val_mask) == res.best_val_acc
    last = api.train(data=data, progress=False, keep="last", **_cfg())
    rec = last.epochs[-1]
    assert _acc(last.model, data, data.test_mask) == rec["test_acc"]
    # the exported-and-reloaded model predicts the same scores
    models.save(res.model, tmp_path / "m.pt")
    back = models.load(tmp_path / "m.pt")
    assert torch.equal(api.predict(back, data), api.predict(res.model, data))


def test_model_file_holds_plain_values_even_for_settings_not_given(tmp_path):
    """A run's config marks the settings the user left at their defaults (``unset``: int and float subclasses); the
    model file stores them as plain numbers, so ``torch.load(weights_only=True)`` (and ``models.load``) reads it."""
    from gnnpipe.core.settings.config import is_unset, unset

    model = models.build_model("gcn", 8, 3, num_layers=2, hidden=8)
    meta = {"chunks": unset(4), "lr": unset(0.01), "sizes": [unset(2), 3], "pair": (unset(1.5), "a")}
    models.save(model, tmp_path / "m.pt", meta=meta)
    raw = torch.load(tmp_path / "m.pt", weights_only=True)  # no class allowed: plain values only
    assert raw["meta"] == {"chunks": 4, "lr": 0.01, "sizes": [2, 3], "pair": (1.5, "a")}
    assert type(raw["meta"]["chunks"]) is int and type(raw["meta"]["lr"]) is float
    assert not is_unset(raw["meta"]["sizes"][0]) and type(raw["meta"]["pair"][0]) is float
    back = models.load(tmp_path / "m.pt")
    assert back.meta["chunks"] == 4
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))


def test_predict_returns_scores_in_the_callers_vertex_order():
    data = small_graph()
    res = api.train(data=data, progress=False, **_cfg(epochs=3))
    perm = torch.randperm(data.num_nodes, generator=torch.Generator().manual_seed(0))
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(data.num_nodes)
    shuffled = data.clone()
    shuffled.x, shuffled.y = data.x[perm], data.y[perm]
    shuffled.edge_index = inv[data.edge_index]
    a = api.predict(res.model, data)
    b = api.predict(res.model, shuffled)
    assert torch.allclose(a[perm], b, atol=1e-10)


@pytest.mark.dist
@pytest.mark.parametrize("layout", [dict(stages=2), dict(ways=2), dict(ways=2, stages=2, chunks=4)],
                         ids=["pipeline", "gp", "hybrid"])
def test_distributed_model_predicts_the_reported_test_accuracy(layout):
    data = small_graph()
    res = api.train(data=data, progress=False, **_cfg(epochs=8, **layout))
    assert res.model is not None and res.status == "completed"
    assert _acc(res.model, data, data.test_mask) == res.test_acc_at_best_val
    assert _acc(res.model, data, data.val_mask) == res.best_val_acc


@pytest.mark.dist
def test_one_chunk_pipeline_model_equals_the_single_process_model():
    data = small_graph()
    single = api.train(data=data, progress=False, **_cfg(epochs=4, dropout=0.0, keep="last"))
    pipe = api.train(data=data, progress=False, **_cfg(epochs=4, dropout=0.0, keep="last", stages=2, chunks=1))
    for (k, a), (k2, b) in zip(single.model.state_dict().items(), pipe.model.state_dict().items()):
        assert k == k2
        assert torch.allclose(a, b, atol=1e-9), k


def test_export_and_predict_commands(tmp_path, capsys):
    from gnnpipe.cli.main import main

    ck, out = tmp_path / "ck", tmp_path / "r.json"
    assert main(["train", "--model", "gcn", "--layers", "2", "--hidden", "8", "--num-nodes", "300", "--epochs", "6",
                 "--no-progress", "--checkpoint-dir", str(ck), "--out", str(out)]) == 0
    assert main(["export", str(ck), "--out", str(tmp_path / "m.pt")]) == 0
    model = models.load(tmp_path / "m.pt")
    assert model.spec["name"] == "gcn" and model.meta["epochs"] == 6
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "m.pt"), "--out", str(tmp_path / "p.pt")]) == 0
    text = capsys.readouterr().out
    rec = __import__("json").loads(out.read_text())
    test_line = next(line for line in text.splitlines() if line.startswith("test"))
    assert test_line.endswith(f"{100 * rec['test_acc_at_best_val']:.2f} %")
    preds = torch.load(tmp_path / "p.pt")
    assert preds["scores"].shape == (300, 5) and torch.equal(preds["pred"], preds["scores"].argmax(-1))
    assert main(["predict", str(ck), "--out", str(tmp_path / "q.pt")]) == 0  # the folder itself
    assert torch.equal(torch.load(tmp_path / "q.pt")["scores"], preds["scores"])


@pytest.mark.dist
@pytest.mark.data
def test_cora_pipeline_model_exported_and_reloaded(tmp_path, shared_data):
    """Acceptance: on Cora the pipeline's result.model predicts its reported test accuracy, and the exported
    and reloaded model predicts the same scores."""
    from gnnpipe.core.settings.config import TrainConfig

    cfg = dict(dataset="Cora", root=str(shared_data / "planetoid"), model="gcnii", layers=4, hidden=16,
               epochs=15, patience=0, dtype="float64")
    res = api.train(progress=False, stages=2, checkpoint_dir=str(tmp_path / "ck"), **cfg)
    data = api.load_data(TrainConfig(**{k: v for k, v in cfg.items()}))
    assert _acc(res.model, data, data.test_mask) == res.test_acc_at_best_val
    from gnnpipe.cli.main import main

    assert main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "m.pt")]) == 0
    back = models.load(tmp_path / "m.pt")
    assert torch.equal(api.predict(back, data), api.predict(res.model, data))
