"""Interrupted and failed runs keep their completed epochs in ``--out`` (issue #13)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ARGS = ["--model", "gcn", "--layers", "4", "--hidden", "8", "--num-nodes", "200", "--epochs", "100000",
        "--patience", "0", "--no-progress"]


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    out, csv = tmp_path / "r.json", tmp_path / "log.csv"
    p = subprocess.Popen([sys.executable, "-m", "gnnpipe", "train", *ARGS, "--out", str(out), "--log-csv", str(csv),
                          *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         cwd=tmp_path)
    return p, out, csv


def _wait_epochs(p, csv: Path, n: int, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if csv.exists() and len(csv.read_text().splitlines()) > n:
            return
        if p.poll() is not None:
            raise AssertionError(f"train ended early: {p.communicate()}")
        time.sleep(0.2)
    raise AssertionError("no progress")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pytest.skip("needs /proc")


@pytest.mark.dist
@pytest.mark.slow  # the default suite has Ctrl-C in tests/core/test_checkpoint.py
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupted_pipeline_writes_the_completed_epochs(tmp_path, how):
    p, out, csv = _start(tmp_path, "--stages", "2")
    _wait_epochs(p, csv, 3)
    if how == "ctrl-c":
        os.killpg(p.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
    else:
        p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    rec = json.loads(out.read_text())
    assert rec["status"] == "interrupted"
    assert len(rec["epochs"]) >= 3
    assert [e["epoch"] for e in rec["epochs"]] == list(range(len(rec["epochs"])))


def test_interrupted_single_process_writes_the_completed_epochs(tmp_path):
    p, out, csv = _start(tmp_path)
    _wait_epochs(p, csv, 3)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode == 130
    rec = json.loads(out.read_text())
    assert rec["status"] == "interrupted" and len(rec["epochs"]) >= 3


@pytest.mark.dist
def test_a_killed_rank_writes_a_failed_result(tmp_path):
    p, out, csv = _start(tmp_path, "--stages", "2", "--timeout", "20")
    _wait_epochs(p, csv, 3)
    ranks = [c for c in _children(p.pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGKILL)
    _, err = p.communicate(timeout=90)
    assert p.returncode == 2, err
    rec = json.loads(out.read_text())
    assert rec["status"] == "failed" and "rank 1" in rec["error"]
    assert len(rec["epochs"]) >= 3
