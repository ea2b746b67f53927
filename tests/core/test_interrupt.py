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


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.mark.dist
def test_a_killed_rank_ends_every_rank_at_once_and_writes_a_failed_result(tmp_path):
    """Default flags (the wait limit is torch's 30 min): the launcher sees the killed rank's process end, not a
    timeout, and ends the others within seconds, naming it."""
    p, out, csv = _start(tmp_path, "--stages", "2")
    _wait_epochs(p, csv, 3)
    ranks = [c for c in _children(p.pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(ranks) == 2, ranks
    t0 = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    _, err = p.communicate(timeout=90)
    took = time.monotonic() - t0
    assert p.returncode == 2, err
    assert took < 30 and all(_gone(r) for r in ranks), took
    print(f"every rank ended {took:.1f} s after rank 1 was killed")
    assert "rank 1 was killed by signal SIGKILL without reporting a result" in err.decode()
    rec = json.loads(out.read_text())
    assert rec["status"] == "failed" and "rank 1" in rec["error"]
    assert len(rec["epochs"]) >= 3


@pytest.mark.dist
@pytest.mark.slow  # torchrun's start and 3 epochs: ~40 s on 2 busy cores
@pytest.mark.timeout(300)
def test_a_killed_rank_under_torchrun_ends_every_rank_at_once(tmp_path):
    """Under torchrun its agent watches the ranks' processes: a killed rank ends the others within seconds (with
    the default wait limit of 30 min), and its summary names the rank."""
    csv = tmp_path / "log.csv"
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "gnnpipe", "train", *ARGS, "--stages", "2", "--log-csv", str(csv)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd=tmp_path,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    _wait_epochs(p, csv, 3, timeout=200)
    ranks = {}
    for c in _children(p.pid):
        env = Path(f"/proc/{c}/environ").read_bytes().split(b"\0")
        ranks.update({int(v[5:]): c for v in env if v.startswith(b"RANK=")})
    assert sorted(ranks) == [0, 1], ranks
    t0 = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    _, err = p.communicate(timeout=90)
    took = time.monotonic() - t0
    assert p.returncode != 0 and took < 30 and all(_gone(r) for r in ranks.values()), (took, err)
    root = err.decode()[err.decode().index("Root Cause"):]
    assert "rank      : 1" in root and "SIGKILL" in root
    print(f"every rank ended {took:.1f} s after rank 1 was killed (torchrun)")
