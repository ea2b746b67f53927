"""One rule for progress bars in every command (issue #17 item 14): drawn on a terminal only, never into
pipes or log files — for ``train``'s epoch bar and ``ablate``'s run bar alike."""

import io
import sys

import pytest
import tomllib

from gnnpipe.core.run.loop import epoch_loop
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.experiments import Outcome, parse_study, run_study


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _train(progress=True):
    ev = {"train_acc": 0.5, "val_acc": 0.5, "test_acc": 0.5, "val_loss": 1.0}
    epoch_loop(TrainConfig(epochs=3, patience=0), lambda e: {"loss": 1.0}, lambda: dict(ev), progress=progress)


def _ablate(tmp_path, progress=True):
    study = parse_study(tomllib.loads('name = "p"\nseeds = [0, 1]\n[fixed]\nlayers = 2\n'), None)
    ok = Outcome("ok", None, {"best_val_acc": 0.5, "test_acc_at_best_val": 0.4, "mean_epoch_time_s": 0.01,
                              "epochs": [{"epoch": 0, "loss": 1.0, "time_s": 0.01, "val_acc": 0.5}]})
    run_study(study, tmp_path / "r.jsonl", execute=lambda run: ok, progress=progress)


@pytest.mark.parametrize("command", ["train", "ablate"])
def test_no_bar_into_a_pipe_or_file(command, tmp_path, monkeypatch):
    err = io.StringIO()  # not a terminal, like a pipe or a log file
    monkeypatch.setattr(sys, "stderr", err)
    _train() if command == "train" else _ablate(tmp_path)
    text = err.getvalue()
    assert "\r" not in text and "it/s" not in text and "run/s" not in text and "%|" not in text
    if command == "ablate":
        assert "[2/2]" in text  # the plain per-run lines are still printed


@pytest.mark.parametrize("command", ["train", "ablate"])
def test_bar_on_a_terminal(command, tmp_path, monkeypatch):
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    _train() if command == "train" else _ablate(tmp_path)
    assert "\r" in err.getvalue()


@pytest.mark.parametrize("command", ["train", "ablate"])
def test_no_progress_means_no_bar_even_on_a_terminal(command, tmp_path, monkeypatch):
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    _train(False) if command == "train" else _ablate(tmp_path, False)
    assert "\r" not in err.getvalue()
