"""Per-epoch log lines, CSV and TensorBoard records, and the start line (issue #13)."""

from __future__ import annotations

import csv
import io
import sys

import pytest

from gnnpipe import api
from gnnpipe.core.run.epochlog import EpochLogger, default_log_every
from gnnpipe.errors import ConfigError


def _rec(e):
    return {"epoch": e, "loss": 1.0 / (e + 1), "time_s": 0.01, "train_acc": 0.5, "val_acc": 0.4, "test_acc": 0.3,
            "val_loss": 1.2, "bytes_layer": 1024, "comm_s": [0.1, 0.2]}


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_lines_every_k_epochs_off_a_terminal_and_none_on_one():
    out = io.StringIO()
    log = EpochLogger(20, stream=out)
    for e in range(20):
        log(e, _rec(e))
    lines = out.getvalue().splitlines()
    assert default_log_every(20) == 2 and len(lines) == 10
    assert lines[0].startswith("epoch  2/20  loss 0.5000  train 50.00%  val 40.00%  test 30.00%  time 10.0 ms")
    assert "sent 0.00 MiB" in lines[0]
    tty = _Tty()
    log = EpochLogger(20, log_every=1, stream=tty)
    log(0, _rec(0))
    assert tty.getvalue() == ""  # the progress bar shows it on a terminal
    out = io.StringIO()
    log = EpochLogger(7, log_every=3, stream=out)
    for e in range(7):
        log(e, _rec(e))
    assert [int(line.split()[1].split("/")[0]) for line in out.getvalue().splitlines()] == [3, 6, 7]


def test_csv_appends_records_with_one_header(tmp_path):
    path = tmp_path / "log.csv"
    for start in (0, 2):
        log = EpochLogger(4, log_every=0, csv_path=str(path), stream=io.StringIO())
        for e in range(start, start + 2):
            log(e, _rec(e))
        log.close()
    rows = list(csv.DictReader(path.open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3]
    assert rows[0]["comm_s"] == "0.2" and rows[0]["bytes_graph"] == ""


def test_tensorboard_missing_gives_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match="pip install"):
        EpochLogger(4, tensorboard=str(tmp_path / "tb"))


def test_a_run_says_what_it_trains(capsys):
    api.train(model="gcn", layers=2, hidden=8, num_nodes=200, epochs=2, log_every=0)
    err = capsys.readouterr().err
    assert "training gcn (L=2, hidden 8) on synthetic (N=200," in err and "single process" in err
