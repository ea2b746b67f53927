"""Loader workers inside ranks: multi-rank S2EF runs with ``--num-workers`` (and with the default worker count of
a machine with many cores) train to the losses of the single process, and a failure or a stop leaves no rank or
worker process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gnnpipe import api
from gnnpipe.core.settings.config import TrainConfig

from .toy import write_extxyz

pytestmark = pytest.mark.dist


def _config(path: str, **kw) -> TrainConfig:
    base = dict(model="schnet", dataset=path, layers=1, hidden=8, cutoff=4.0, max_neighbors=8, dtype="float64",
                epochs=1, batch_size=2, lr=1e-3, timeout_s=120)
    return TrainConfig(**{**base, **kw})


def _losses(result) -> list[float]:
    return [e["loss"] for e in result.epochs]


@pytest.mark.timeout(400)
def test_graph_and_data_parallel_ranks_start_loader_workers(tmp_path, monkeypatch):
    """``--gp-size 2`` with a worker per rank equals the single process; ``--replicas 2`` with the default worker count
    of an 8-core machine (workers started: the epoch is long enough) equals one process on the doubled batch."""
    from gnnpipe.tasks.s2ef import data

    path = write_extxyz(tmp_path / "c.extxyz", 12, seed=1)
    single = api.train(_config(path), progress=False)
    gp = api.train(_config(path, graph_parallel_group_size=2, num_workers=1), progress=False)
    assert gp.config["num_workers"] == 1
    assert _losses(gp) == pytest.approx(_losses(single), rel=1e-9)

    ref = api.train(_config(path, batch_size=2), progress=False)
    # what the launcher sees on an 8-core machine, and epochs of enough steps for workers to pay off
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(data, "MIN_STEPS_FOR_WORKERS", 2)
    dp = api.train(_config(path, batch_size=1, replicas=2), progress=False)
    assert dp.config["num_workers"] == 3  # (8 cores − 2 ranks of 1 thread) // 2 ranks, at most 4
    assert _losses(dp) == pytest.approx(_losses(ref), rel=1e-9)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _start_with_workers(tmp_path: Path) -> tuple[subprocess.Popen, list[int], list[int]]:
    """A 2-rank graph-parallel run with a loader worker per rank, once both ranks have started their worker:
    ``(launcher, ranks, workers)``."""
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        pytest.skip("needs /proc")
    path = write_extxyz(tmp_path / "c.extxyz", 40, seed=3)
    p = subprocess.Popen([sys.executable, "-m", "gnnpipe", "train", "--model", "schnet", "--dataset", path,
                          "--layers", "1", "--hidden", "8", "--cutoff", "4", "--batch-size", "1", "--epochs", "100000",
                          "--patience", "0", "--gp-size", "2", "--num-workers", "1", "--no-progress",
                          "--out", str(tmp_path / "r.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd=tmp_path)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 180:
        if p.poll() is not None:
            raise AssertionError(f"train ended early: {p.communicate()}")
        ranks = [c for c in _children(p.pid) if b"spawn_main" in _cmdline(c)]
        workers = [w for r in ranks for w in _descendants(r)]
        if len(ranks) == 2 and len(workers) >= 2:
            return p, ranks, workers
        time.sleep(0.5)
    p.kill()
    raise AssertionError("the ranks did not start their loader workers")


def _all_gone(pids: list[int], within: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        if not any(_alive(q) for q in pids):
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"still running after {within} s: {[q for q in pids if _alive(q)]}")


@pytest.mark.timeout(300)
def test_a_killed_rank_with_workers_ends_every_process(tmp_path):
    p, ranks, workers = _start_with_workers(tmp_path)
    t0 = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2, err
    assert "rank 1 was killed by signal SIGKILL" in err.decode()
    _all_gone(ranks + workers, within=max(30.0 - (time.monotonic() - t0), 1.0))
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "failed"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["ctrl-c", "kill-launcher"])
def test_a_stop_or_a_dead_launcher_leaves_no_rank_or_worker(tmp_path, how):
    """Ctrl-C stops the run (exit 130); a ``kill -9`` of the launcher takes its ranks (they ask for its death
    signal) and their workers (which watch their parent) with it."""
    p, ranks, workers = _start_with_workers(tmp_path)
    if how == "ctrl-c":
        os.killpg(p.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
        p.communicate(timeout=120)
        assert p.returncode == 130
        _all_gone(ranks + workers, within=30.0)
    else:
        os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
        _all_gone(ranks + workers, within=30.0)
