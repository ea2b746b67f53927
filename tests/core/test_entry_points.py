"""Every public entry point checks the same things the same way (issue #17, items 1-5).

Roads into a run: the command line with a graph file (``gnnpipe train --dataset g.pt``), a PyG dataset by
name, ``api.train(data=...)`` and ``SingleProcessTrainer(data, config)``; modes: single process, pipeline
(1 x 2) and graph parallelism (2 x 1). A bad input must end every road with the same error class and
message, before any rank starts (so these tests are cheap: nothing is spawned for them).
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from torch_geometric.data import Data

from gnnpipe import api
from gnnpipe.cli.main import build_parser, main
from gnnpipe.core.settings import config as config_module
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.data import DataWarning, prepare, synthetic_graph
from gnnpipe.errors import ConfigError, DataValidationError, UnknownComponentError
from gnnpipe.tasks.nodes.runner import check_config
from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer, resolve_config

SMALL = dict(model="gcn", layers=2, hidden=8, epochs=1, patience=0, dropout=0.0)
SMALL_FLAGS = ["--model", "gcn", "--layers", "2", "--hidden", "8", "--epochs", "1", "--patience", "0",
               "--dropout", "0", "--no-progress"]
MODES = {
    "single": ({}, []),
    "pipeline": ({"stages": 2, "chunks": 4}, ["--stages", "2", "--chunks", "4"]),
    "gp": ({"ways": 2}, ["--ways", "2"]),
}


def raw_graph(n: int = 60) -> Data:
    return synthetic_graph(num_nodes=n, avg_degree=5.0, num_classes=3, num_features=6, train_per_class=5,
                           val_per_class=5, seed=3)


def halved_edge_index() -> Data:
    d = raw_graph()
    d.edge_index = d.edge_index.float() / 2  # vertex ids halved: fractions; .long() would truncate silently
    return d


def fractional_labels() -> Data:
    d = raw_graph()
    d.y = d.y.float() + 0.3  # class id + 0.3: .long() would truncate silently
    return d


def no_labels_no_masks() -> Data:
    d = raw_graph()
    return Data(x=d.x, edge_index=d.edge_index)


BAD = {
    "float edge_index": (halved_edge_index, "edge_index must hold integer vertex ids"),
    "fractional y": (fractional_labels, "non-integral"),
    "no y": (no_labels_no_masks, "labels are required"),
}


def _cli_run(argv):
    """Parse like ``gnnpipe train`` and run its function, so the exception itself is seen."""
    args = build_parser().parse_args(["train", *argv])
    return args.func(args)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", list(BAD))
def test_bad_data_fails_alike_on_every_road(case, mode, tmp_path, monkeypatch):
    make, fragment = BAD[case]
    kw, flags = MODES[mode]
    path = tmp_path / "g.pt"
    torch.save(make(), path)
    # 1. command line, graph file
    with pytest.raises(DataValidationError, match=fragment):
        _cli_run(["--dataset", str(path), *SMALL_FLAGS, *flags])
    # 2. a PyG dataset by name (its loader replaced by one that returns the bad graph as stored)
    import gnnpipe.data.datasets as ds

    monkeypatch.setattr(ds, "_load_pyg", lambda spec, root, cache: make())
    with pytest.raises(DataValidationError, match=fragment):
        api.train(TrainConfig(dataset="Cora", root=str(tmp_path), **SMALL, **kw), progress=False)
    # 3. api.train with a Data
    with pytest.raises(DataValidationError, match=fragment):
        api.train(TrainConfig(**SMALL, **kw), data=make(), progress=False)
    # 4. the single-process trainer
    with pytest.raises(DataValidationError, match=fragment):
        SingleProcessTrainer(make(), TrainConfig(**SMALL, **kw))


@pytest.mark.parametrize("key", ["edge_index", "edges"])
def test_npz_file_road_validates_before_casting(key, tmp_path):
    import numpy as np

    d = raw_graph()
    ei = d.edge_index.numpy().astype("float64") / 2
    path = tmp_path / "g.npz"
    np.savez(path, x=d.x.numpy(), y=d.y.numpy(), **{key: ei if key == "edge_index" else ei.T})
    with pytest.raises(DataValidationError, match="edge_index must hold integer vertex ids"):
        _cli_run(["--dataset", str(path), *SMALL_FLAGS])


def test_cli_prints_the_data_error_and_exits_2(tmp_path, capsys):
    path = tmp_path / "g.pt"
    torch.save(fractional_labels(), path)
    assert main(["train", "--dataset", str(path), *SMALL_FLAGS]) == 2
    err = capsys.readouterr().err
    assert "gnnpipe: error:" in err and "non-integral" in err and "Traceback" not in err


def only_train_mask() -> Data:
    d = raw_graph()
    return Data(x=d.x, edge_index=d.edge_index, y=d.y, train_mask=d.train_mask)


def _assert_trained_without_eval(result):
    assert len(result.epochs) == 1 and math.isfinite(result.epochs[0]["loss"])
    assert math.isnan(result.epochs[0]["val_acc"]) and math.isnan(result.epochs[0]["test_acc"])


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", list(MODES))
def test_missing_eval_masks_train_with_a_warning(mode, tmp_path):
    """Only ``train_mask``: every road trains (empty val/test, reported as n/a) and warns once per mask."""
    kw, flags = MODES[mode]
    path = tmp_path / "g.pt"
    torch.save(only_train_mask(), path)
    out = tmp_path / "r.json"
    with pytest.warns(DataWarning, match="val_mask is missing") as rec:
        assert _cli_run(["--dataset", str(path), *SMALL_FLAGS, *flags, "--out", str(out)]) == 0
    assert any("test_mask is missing" in str(w.message) for w in rec)
    assert json.loads(out.read_text())["epochs"][0]["loss"] > 0
    with pytest.warns(DataWarning, match="val_mask is missing"):
        _assert_trained_without_eval(api.train(TrainConfig(**SMALL, **kw), data=only_train_mask(), progress=False))
    if mode == "single":
        with pytest.warns(DataWarning, match="test_mask is missing"):
            _assert_trained_without_eval(
                SingleProcessTrainer(only_train_mask(), TrainConfig(**SMALL)).fit(progress=False))


def test_missing_masks_warn_once_each():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = prepare(only_train_mask())
    msgs = [str(w.message) for w in rec if issubclass(w.category, DataWarning)]
    assert sum("val_mask" in m for m in msgs) == 1 and sum("test_mask" in m for m in msgs) == 1
    assert out.val_mask.dtype == torch.bool and not bool(out.val_mask.any()) and not bool(out.test_mask.any())


# ---------------------------------------------------------------------------------------- item 3: names
UNKNOWN = {
    "scheduler": (["--scheduler", "1fb1"], {"scheduler": "1fb1"}, UnknownComponentError, "1f1b, async-stale, gpipe"),
    "partitioner": (["--partitioner", "metiss"], {"partitioner": "metiss"}, UnknownComponentError, "metis"),
    "correctors": (["--correctors", "t1,t9"], {"correctors": ["t1", "t9"]}, UnknownComponentError, "t1, t2, t3"),
    "layer split": (["--layer-split", "balanced"], {"layer_split": "balanced"}, UnknownComponentError,
                    "equal, profiled"),
    "backend": (["--backend", "mpi"], {"backend": "mpi"}, ConfigError, "available: gloo, nccl"),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("what", list(UNKNOWN))
def test_unknown_names_are_errors_in_every_mode(what, mode):
    flags, over, exc, listed = UNKNOWN[what]
    kw, mode_flags = MODES[mode]
    with pytest.raises(exc, match="unknown") as e:
        _cli_run([*SMALL_FLAGS, "--num-nodes", "60", *mode_flags, *flags])
    assert listed in str(e.value)
    with pytest.raises(exc, match="unknown") as e:
        api.train(TrainConfig(**SMALL, **kw, num_nodes=60), progress=False, **over)
    assert listed in str(e.value)
    with pytest.raises(exc, match="unknown") as e:
        SingleProcessTrainer(raw_graph(), TrainConfig(**SMALL, **kw, **over))
    assert listed in str(e.value)


def test_graph_parallel_defaults_do_not_warn():
    """`gnnpipe train --ways 4 --stages 1` (a README command) passes no --correctors: no warning about them."""
    cfg = resolve_config(TrainConfig(ways=4, stages=1, model="gcn", layers=2))
    assert config_module.ignored_options(cfg) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_config(cfg, num_nodes=100, num_units=4)
    given = resolve_config(TrainConfig(ways=4, stages=1, model="gcn", layers=2, correctors=["ema"], scheduler="gpipe"))
    with pytest.warns(UserWarning, match="ignored: --correctors.*--scheduler"):
        check_config(given, num_nodes=100, num_units=4)
    # `--correctors none`: nothing to ignore
    assert config_module.ignored_options(TrainConfig(ways=4, correctors="none")) == []


def test_single_process_warns_about_given_pipeline_options_only():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        api.train(TrainConfig(**SMALL, num_nodes=60), progress=False)
    assert not [w for w in rec if "ignored" in str(w.message)]
    with pytest.warns(UserWarning, match=r"ignored: --scheduler, --partitioner \(a single-process run"):
        api.train(TrainConfig(**SMALL, num_nodes=60, scheduler="gpipe", partitioner="random"), progress=False)


# ---------------------------------------------------------------------------------- item 4: --out, dtype
def test_out_naming_a_directory_fails_before_training(tmp_path, capsys, monkeypatch):
    called = []
    monkeypatch.setattr(api, "train", lambda *a, **k: called.append(1))
    assert main(["train", *SMALL_FLAGS, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is an existing directory" in err and "run.json" in err and "Traceback" not in err
    import gnnpipe.cli.compare as compare_cli

    monkeypatch.setattr(compare_cli, "compare", lambda *a, **k: called.append(1))
    assert main(["compare", *SMALL_FLAGS, "--out", str(tmp_path)]) == 2
    assert "is an existing directory" in capsys.readouterr().err
    assert not called


def test_unsupported_dtype_is_rejected_by_the_config():
    with pytest.raises(ConfigError, match="dtype 'float16' is not supported; use one of float32, float64"):
        TrainConfig(dtype="float16")
    with pytest.raises(ConfigError, match="float16"):
        api.train(dtype="float16", progress=False)


# ------------------------------------------------------------------- item 5: the trainer applies the config
def test_single_process_trainer_applies_the_preprocessing_options():
    raw = raw_graph()
    raw.edge_index = raw.edge_index[:, raw.edge_index[0] < raw.edge_index[1]]  # one direction only
    raw.x = raw.x.abs() + 0.1  # row sums far from 1
    cfg = TrainConfig(**SMALL, normalize_features=True)
    t = SingleProcessTrainer(raw, cfg)
    torch.testing.assert_close(t.data.x.sum(1), torch.ones(raw.num_nodes))
    assert t.data.edge_index.size(1) == 2 * raw.edge_index.size(1)  # made undirected
    ref = prepare(raw, normalize_features=True)  # what every entry point does with this config
    assert torch.equal(t.data.x, ref.x) and torch.equal(t.data.edge_index, ref.edge_index)
    a = t.fit(progress=False)
    b = api.train(cfg, data=raw, progress=False)
    assert [e["loss"] for e in a.epochs] == [e["loss"] for e in b.epochs]
    kept = SingleProcessTrainer(raw, TrainConfig(**SMALL, undirected=False))
    assert kept.data.edge_index.size(1) == raw.edge_index.size(1)
    # prepared=True: the caller says the data went through prepare_data already (api.train's own path)
    assert torch.equal(SingleProcessTrainer(ref, cfg, prepared=True).data.x, ref.x)
