"""The built-in launcher and torchrun: stalled ranks, the rendezvous port, world-size mismatches under
torchrun, scripts read from standard input (issue #17 items 8–11)."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gnnpipe import api
from gnnpipe.core.run import launch
from gnnpipe.correctors import Corrector
from gnnpipe.errors import ConfigError, DistributedError

from .distutil import base_config, small_graph

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Stall(Corrector):
    """Test corrector: stage ``stage`` sleeps ``seconds`` after its first forward of epoch ``epoch``."""

    def __init__(self, stage, epoch, seconds):
        self.stage, self.at_epoch, self.seconds = stage, epoch, seconds

    def after_forward(self, epoch, chunk):
        if self.ctx.stage == self.stage and epoch == self.at_epoch and chunk >= 0:
            time.sleep(self.seconds)
            self.seconds = 0


# ------------------------------------------------------------------------------------------ item 8
def test_a_stalled_rank_is_named_with_the_timeout():
    cfg = base_config(stages=3, chunks=6, epochs=3, correctors=[_Stall(1, 1, 6.0)], timeout_s=2.0)
    with pytest.raises(DistributedError) as err:
        api.train(cfg, data=small_graph(), progress=False)
    msg = str(err.value)
    assert "--timeout" in msg and "2 s" in msg
    assert "rank 1 reported neither a result nor an error" in msg and "probably stalled" in msg
    assert "larger --timeout" in msg
    assert "timed out waiting for a peer" in msg and "first timeout (rank 1)" not in msg


def test_timeout_message_without_silent_ranks():
    errors = {0: (1.0, "RuntimeError: Timed out waiting 2000ms for recv\nTraceback ..."),
              1: (1.5, "RuntimeError: Socket Timeout\nTraceback ...")}
    msg = launch._timeout_message(errors, [], 2, 2.0)
    assert "none can be singled out" in msg and "--timeout 60" in msg and "first timeout (rank 0)" in msg


def test_timeout_message_with_a_lost_connection_after_the_timeout():
    errors = {0: (1.0, "RuntimeError: [pair.cc:534] Timed out waiting 2000ms for send operation to complete"),
              2: (1.2, "RuntimeError: Connection closed by peer [127.0.0.1]:1234")}
    msg = launch._timeout_message(errors, [1], 3, 2.0)
    assert "rank(s) [0] timed out" in msg and "rank(s) [2] then lost their connection" in msg
    assert "rank 1 reported neither a result nor an error" in msg and "--timeout / timeout_s = 2 s" in msg


# ------------------------------------------------------------------------------------------ item 9
def _ping(rank, world):
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return float(t)


def test_a_taken_port_does_not_stop_a_launch(monkeypatch):
    """The launcher used to pick a free port, release it, and bind it in rank 0 later: a port taken
    meanwhile failed the run. Force the port it would pick to be taken."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(launch, "free_port", lambda: taken.getsockname()[1])
        assert launch.spawn(_ping, 2, timeout_s=30, threads=1, max_runtime_s=120) == [3.0, 3.0]


def test_concurrent_launches_all_succeed():
    """Launches started at the same moment (threads, 3 rounds of 2) each get their own rendezvous."""
    for _ in range(3):
        results, errors = [], []

        def go():
            try:
                results.append(launch.spawn(_ping, 2, timeout_s=30, threads=1, max_runtime_s=120))
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=go) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and results == [[3.0, 3.0]] * 2


# ------------------------------------------------------------------------------------------ item 10
def test_torchrun_world_size_mismatch_is_checked_before_the_group(monkeypatch, tmp_path):
    err_file = tmp_path / "error.json"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # nothing listens: joining a group would hang or fail
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err_file))
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"rank 1: torchrun started 2 rank\(s\) but --ways 1 × --stages 3 needs 3"):
        api.train(base_config(stages=3, chunks=6), data=small_graph(), progress=False)
    assert time.monotonic() - t0 < 20
    doc = json.loads(err_file.read_text())["message"]
    assert "torchrun started 2 rank(s)" in doc["message"] and "\n" not in doc["message"]
    assert doc["extraInfo"]["py_callstack"] == doc["message"]  # what torchrun's summary prints


def test_torchrun_summary_shows_the_world_size_error():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "gnnpipe", "train",
                        "--stages", "3", "--layers", "2", "--hidden", "8", "--num-nodes", "100", "--epochs", "1",
                        "--no-progress"], capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode != 0
    summary = r.stderr[r.stderr.index("Root Cause"):]
    assert "torchrun started 2 rank(s) but --ways 1 × --stages 3 needs 3" in summary
    assert "To enable traceback" not in r.stderr
    # gnnpipe itself prints one line per rank (the summary repeats them), and no rank prints a traceback
    assert r.stderr.count("gnnpipe: error: rank 0") == 2 and r.stderr.count("gnnpipe: error: rank 1") == 2
    assert "ConfigError" not in r.stderr and r.stderr.count("Traceback") <= 1  # torchrun's own, at most


# ------------------------------------------------------------------------------------------ item 11
_STDIN_SCRIPT = textwrap.dedent("""
    from gnnpipe import api
    {extra}
    if __name__ == "__main__":
        r = api.train(num_nodes=120, layers=2, hidden=8, epochs=1, stages=2, chunks=2, progress=False{kw})
        print("EPOCHS", len(r.epochs))
""")


def test_a_script_read_from_stdin_starts_local_ranks():
    r = subprocess.run([sys.executable, "-"], input=_STDIN_SCRIPT.format(extra="", kw=""), capture_output=True,
                       text=True, timeout=240, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    assert "EPOCHS 1" in r.stdout


@pytest.mark.parametrize("extra, kw, name", [
    ("from gnnpipe.correctors import Corrector\nclass Mine(Corrector):\n    pass\n", ", correctors=[Mine()]", "Mine"),
    ("from gnnpipe import schedulers\n@schedulers.register('mine')\nclass Mine(schedulers.get('gpipe')):\n    pass\n",
     ", scheduler='mine'", "scheduler 'mine'"),
])
def test_a_stdin_script_whose_ranks_need_its_own_objects_is_told_how_to_proceed(extra, kw, name):
    r = subprocess.run([sys.executable, "-"], input=_STDIN_SCRIPT.format(extra=extra, kw=kw),
                       capture_output=True, text=True, timeout=240, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode != 0
    assert "ConfigError" in r.stderr and "standard input" in r.stderr and name in r.stderr
    assert "python script.py" in r.stderr and "FileNotFoundError" not in r.stderr
