"""Values finite as given but not as trained, and runs whose loss becomes NaN or infinite.

Every road into a run (``api.train(data=...)``, ``gnnpipe train --dataset g.pt``, a study file of ``gnnpipe
ablate``) and every mode (single process, pipeline 1x2, graph parallelism 2x1, hybrid 2x2):

* features beyond float32's range in a float64 graph are refused before any rank starts, with a message naming
  the attribute, the dtypes and the fix (and train with ``--dtype float64``);
* a training loss that becomes NaN stops the run at that epoch on every rank (``TrainingDivergedError``; in a
  distributed run inside the ``DistributedError`` that names every rank), with the completed epochs in
  ``.result`` / ``--out`` (``status: failed``) and the last checkpoint written before it kept.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from gnnpipe import api
from gnnpipe.cli.main import main
from gnnpipe.core.run.checkpoint import list_checkpoints
from gnnpipe.core.run.loop import epoch_loop
from gnnpipe.core.run.results import TrainResult
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.core.settings.options import RunOptions
from gnnpipe.data import synthetic_graph
from gnnpipe.errors import DataValidationError, DistributedError, TrainingDivergedError
from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer

SMALL = dict(model="gcnii", layers=2, hidden=8, epochs=3, patience=0)
SMALL_FLAGS = ["--model", "gcnii", "--layers", "2", "--hidden", "8", "--epochs", "3", "--patience", "0",
               "--no-progress"]
MODES = {
    "single": ({}, []),
    "pipeline": ({"stages": 2, "chunks": 4}, ["--stages", "2", "--chunks", "4"]),
    "gp": ({"ways": 2}, ["--ways", "2"]),
    "hybrid": ({"ways": 2, "stages": 2, "chunks": 4}, ["--ways", "2", "--stages", "2", "--chunks", "4"]),
}
DIST = [pytest.param(m, marks=[pytest.mark.dist, pytest.mark.timeout(240)]
                     + ([pytest.mark.slow] if m == "hybrid" else []))
        for m in ("pipeline", "gp", "hybrid")]


def graph():
    return synthetic_graph(num_nodes=120, avg_degree=5.0, num_classes=3, num_features=8, train_per_class=8,
                           val_per_class=8, seed=2)


def beyond_float32():
    """float64 features, one of them 1e300: finite as given, inf in float32."""
    d = graph()
    d.x = d.x.double()
    d.x[7, 1] = 1e300
    return d


def overflowing():
    """float32 features at float32's largest magnitude: valid input whose first layer overflows (loss NaN)."""
    d = graph()
    d.x = torch.full_like(d.x, 3e38)
    return d


# --- item 1: validation in the training dtype ----------------------------------------------------------------

@pytest.mark.parametrize("mode", list(MODES))
def test_api_refuses_values_beyond_the_training_dtype(mode):
    with pytest.raises(DataValidationError, match=r"data\.x has 1 value.*float64.*float32.*--dtype float64"):
        api.train(data=beyond_float32(), progress=False, **SMALL, **MODES[mode][0])


@pytest.mark.parametrize("mode", list(MODES))
def test_cli_file_refuses_values_beyond_the_training_dtype(mode, tmp_path, capsys):
    path = tmp_path / "big.pt"
    torch.save(beyond_float32(), path)
    assert main(["train", "--dataset", str(path), *SMALL_FLAGS, *MODES[mode][1]]) == 2
    err = capsys.readouterr().err
    assert "data.x has 1 value" in err and "float32" in err and "--dtype float64" in err and "Traceback" not in err


def test_float64_run_trains_on_such_values(tmp_path):
    path = tmp_path / "big.pt"
    d = beyond_float32()
    d.x[7, 1] = 1e40  # past float32's range, far inside float64's (the layers' arithmetic stays finite)
    torch.save(d, path)
    out = tmp_path / "run.json"
    assert main(["train", "--dataset", str(path), *SMALL_FLAGS, "--epochs", "1", "--dtype", "float64",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["status"] == "completed"
    with pytest.raises(DataValidationError, match="float32"):  # the same file in a float32 run
        api.train(TrainConfig(dataset=str(path), **SMALL), progress=False)


# --- item 2: a non-finite loss stops the run -----------------------------------------------------------------

def test_epoch_loop_stops_at_the_first_non_finite_loss():
    cfg = TrainConfig(epochs=5, patience=0)
    seen = []
    losses = [1.0, 0.9, math.nan, 0.5, 0.4]
    step = lambda e: {"loss": losses[e]}  # noqa: E731
    ev = lambda: {"train_acc": 0.5, "val_acc": 0.5, "test_acc": 0.5, "val_loss": 1.0}  # noqa: E731
    with pytest.raises(TrainingDivergedError, match=r"loss is nan at epoch 3.*--dtype float64.*--lr.*--nan-ok") as ei:
        epoch_loop(cfg, step, ev, progress=False, after_epoch=[lambda e, rec, st: seen.append(e)])
    assert seen == [0, 1]  # no hook (checkpoint, log line) saw the diverged epoch
    assert ei.value.result.status == "failed" and [r["epoch"] for r in ei.value.result.epochs] == [0, 1]
    assert "TrainingDivergedError" in ei.value.result.error
    losses[2] = math.inf
    with pytest.raises(TrainingDivergedError, match="loss is inf at epoch 3"):
        epoch_loop(cfg, step, ev, progress=False)
    r = epoch_loop(TrainConfig(epochs=5, patience=0, nan_ok=True), step, ev, progress=False)
    assert isinstance(r, TrainResult) and len(r.epochs) == 5 and math.isinf(r.epochs[2]["loss"])


def test_single_process_keeps_the_last_good_checkpoint(tmp_path):
    tr = SingleProcessTrainer(graph(), TrainConfig(**dict(SMALL, epochs=4)))
    good = tr.train_epoch

    def step(epoch):
        rec = good(epoch)
        return dict(rec, loss=math.nan) if epoch == 2 else rec

    tr.train_epoch = step
    with pytest.raises(TrainingDivergedError, match="epoch 3") as ei:
        tr.fit(progress=False, options=RunOptions(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=1))
    assert len(ei.value.result.epochs) == 2
    assert [n for n, _ in list_checkpoints(tmp_path / "ck")][-1] == 2  # written after epoch 2; none after


def test_api_single_process_stops_on_nan():
    with pytest.raises(TrainingDivergedError, match="loss is nan at epoch 1") as ei:
        api.train(data=overflowing(), progress=False, **SMALL)
    assert ei.value.result.status == "failed" and ei.value.result.epochs == []


@pytest.mark.parametrize("mode", DIST)
def test_api_distributed_stops_on_nan_on_every_rank(mode):
    with pytest.raises(DistributedError) as ei:
        api.train(data=overflowing(), progress=False, **SMALL, **MODES[mode][0])
    msg = str(ei.value)
    assert msg.startswith("every rank failed") and "TrainingDivergedError: the training loss is nan at epoch 1" in msg
    assert "lost their peer" not in msg and "Traceback" not in msg
    assert ei.value.result.status == "failed" and ei.value.result.epochs == []


@pytest.mark.parametrize("mode", ["single",
                                  pytest.param("pipeline", marks=[pytest.mark.dist, pytest.mark.timeout(240)])])
def test_cli_file_writes_failed_result_on_nan(mode, tmp_path, capsys):
    path, out = tmp_path / "hot.pt", tmp_path / "run.json"
    torch.save(overflowing(), path)
    assert main(["train", "--dataset", str(path), *SMALL_FLAGS, *MODES[mode][1], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "training loss is nan at epoch 1" in err and "--nan-ok" in err
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed" and doc["epochs"] == [] and "loss is nan" in doc["error"]


def test_cli_nan_ok_carries_on(tmp_path):
    path, out = tmp_path / "hot.pt", tmp_path / "run.json"
    torch.save(overflowing(), path)
    assert main(["train", "--dataset", str(path), *SMALL_FLAGS, "--nan-ok", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["status"] == "completed" and len(doc["epochs"]) == 3 and doc["config"]["nan_ok"] is True


STUDY = """
name = "faults"
seeds = [0]
run_timeout_s = 120

[fixed]
model = "gcnii"
layers = 2
hidden = 8
epochs = 2
patience = 0

[[variants]]
name = "beyond float32"
dataset = "big.pt"

[[variants]]
name = "overflow"
dataset = "hot.pt"
"""


@pytest.mark.timeout(240)
def test_study_records_both_failures(tmp_path, capsys):
    torch.save(beyond_float32(), tmp_path / "big.pt")
    torch.save(overflowing(), tmp_path / "hot.pt")
    study = tmp_path / "faults.toml"
    study.write_text(STUDY)
    assert main(["ablate", str(study), "--no-progress"]) == 1  # some runs failed
    recs = {r["variant"]: r for r in map(json.loads, (tmp_path / "faults.results.jsonl").read_text().splitlines())}
    big, hot = recs["beyond float32"], recs["overflow"]
    assert big["status"] == "failed" and "data.x has 1 value" in big["error"] and "--dtype float64" in big["error"]
    assert hot["status"] == "failed" and "training loss is nan at epoch 1" in hot["error"]
    assert hot["result"]["status"] == "failed" and hot["result"]["epochs"] == []  # the run's --out, kept
