"""Single-process trainer determinism, the epoch loop, the train CLI and its JSON output."""

import json
import subprocess
import sys

import torch

from gnnpipe import api
from gnnpipe.cli.main import build_parser, main
from gnnpipe.core.run.loop import epoch_loop
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.data import prepare, synthetic_graph
from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer, masked_loss


def _data():
    return prepare(synthetic_graph(num_nodes=200, avg_degree=6, num_features=8, num_classes=3, seed=1))


def test_training_is_deterministic_for_a_seed():
    cfg = TrainConfig(model="gcnii", layers=3, hidden=8, epochs=4, seed=7)
    a = SingleProcessTrainer(_data(), cfg).fit(progress=False)
    b = SingleProcessTrainer(_data(), cfg).fit(progress=False)
    assert [e["loss"] for e in a.epochs] == [e["loss"] for e in b.epochs]
    assert a.test_acc_at_best_val == b.test_acc_at_best_val
    c = SingleProcessTrainer(_data(),
                             TrainConfig(model="gcnii", layers=3, hidden=8, epochs=4, seed=8)).fit(progress=False)
    assert [e["loss"] for e in a.epochs] != [e["loss"] for e in c.epochs]


def test_chunk_losses_sum_to_the_full_batch_mean():
    logits = torch.randn(10, 3)
    y = torch.randint(0, 3, (10,))
    mask = torch.tensor([1, 0, 1, 1, 0, 1, 0, 0, 1, 1], dtype=torch.bool)
    full = torch.nn.functional.cross_entropy(logits[mask], y[mask])
    parts = sum(masked_loss(logits[a:b], y[a:b], mask[a:b], int(mask.sum())) for a, b in [(0, 3), (3, 7), (7, 10)])
    torch.testing.assert_close(parts, full)


def test_epoch_loop_early_stopping_and_selection():
    vals = [0.5, 0.6, 0.6, 0.55, 0.55, 0.55, 0.55, 0.55]
    losses = [1.0, 0.9, 0.8, 0.85, 0.85, 0.85, 0.85, 0.85]
    tests = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    it = iter(range(100))

    def evaluate():
        i = next(it)
        return {"train_acc": 0.0, "val_acc": vals[i], "test_acc": tests[i], "val_loss": losses[i]}

    cfg = TrainConfig(epochs=8, patience=2)
    r = epoch_loop(cfg, lambda e: {"loss": 1.0}, evaluate, progress=False)
    # epoch 2 ties the best accuracy with a lower loss: it is selected; after 2 (= patience) epochs without
    # improvement (3 and 4) the run stops
    assert r.best_epoch == 2 and r.test_acc_at_best_val == 0.3 and r.best_val_acc == 0.6
    assert len(r.epochs) == 5


def test_eval_every():
    cfg = TrainConfig(model="gcn", layers=2, hidden=8, epochs=5, eval_every=2, patience=0)
    r = SingleProcessTrainer(_data(), cfg).fit(progress=False)
    assert ["val_acc" in e for e in r.epochs] == [False, True, False, True, True]


def test_help_lists_every_flag_with_its_default(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    train = sub.choices["train"]
    text = " ".join(train.format_help().split())
    for flag in ["--dataset", "--root", "--split", "--model", "--layers", "--hidden", "--dropout", "--lr",
                 "--weight-decay", "--epochs", "--patience", "--eval-every", "--seed", "--out", "--stages",
                 "--ways", "--chunks", "--scheduler", "--correctors", "--partitioner", "--layer-split", "--recompute"]:
        assert flag in text
    assert "(default: 200)" in text and "(default: gcnii)" in text
    for name in ["train", "partition", "schedule", "simulate", "ablate", "report"]:
        assert name in sub.choices


def test_train_cli_writes_the_json_record(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["train", "--num-nodes", "200", "--epochs", "3", "--layers", "2", "--hidden", "8",
               "--no-progress", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "test acc at best val" in printed and "mean epoch time" in printed
    d = json.loads(out.read_text())
    assert {"config", "epochs", "best_val_acc", "test_acc_at_best_val", "mean_epoch_time_s"} <= set(d)
    assert d["config"]["layers"] == 2 and d["config"]["lr"] == 0.01  # resolved model default
    assert [e["epoch"] for e in d["epochs"]] == [0, 1, 2]
    assert {"loss", "train_acc", "val_acc", "test_acc", "time_s"} <= set(d["epochs"][0])


def test_cli_reports_bad_input_without_a_traceback():
    r = subprocess.run([sys.executable, "-m", "gnnpipe", "train", "--model", "nope", "--epochs", "1",
                        "--num-nodes", "100"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "unknown model 'nope'" in r.stderr and "Traceback" not in r.stderr


def test_api_accepts_keyword_overrides():
    r = api.train(data=_data(), model="graphsage", layers=2, hidden=8, epochs=2, progress=False)
    assert len(r.epochs) == 2 and r.config["model"] == "graphsage"
