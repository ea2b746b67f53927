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


@pytest.mark.slow
def test_concurrent_launches_all_succeed():
    """Launches started at the same moment (threads, 3 rounds of 2) each get their own rendezvous."""
    for _ in range(3):
        results, errors = [], []

        def go(results=results, errors=errors):
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
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "gnnpipe", "train", "--stages", "3", "--layers", "2", "--hidden", "8",
                        "--num-nodes", "100", "--epochs", "1", "--no-progress"], capture_output=True, text=True,
                       env=env, timeout=240)
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


# ------------------------------------------------------------------------------------------ dead or slow
# A rank that dies ends the run at once (the launcher watches the processes); the wait limit (the process group's
# timeout) only ends a run whose ranks are alive and one waits forever, so it is long by default and a slow rank
# (a large chunk, an evaluation, a loaded machine) is not taken for a dead one.
def test_the_wait_limit_is_derived_unless_given():
    from gnnpipe.core.settings.config import TrainConfig

    assert TrainConfig().timeout_s is None  # derived, not 60 s
    assert launch.wait_limit(None, "gloo") == (1800.0, "torch's default for gloo")
    assert launch.wait_limit(None, "nccl")[0] == 600.0
    assert launch.wait_limit(None, "gloo", predicted_epoch_s=20.0)[0] == 1800.0  # never below torch's default
    s, why = launch.wait_limit(None, "gloo", predicted_epoch_s=400.0)
    assert s == 4000.0 and why == "10 × the predicted epoch of 400 s"
    assert launch.wait_limit(5.0, "gloo", predicted_epoch_s=400.0) == (5.0, "--timeout")  # the user's override
    # a prediction past any sense (a hardware file of absurd links): capped, and a non-finite one is ignored
    s, why = launch.wait_limit(None, "gloo", predicted_epoch_s=1e300)
    assert s == launch.MAX_WAIT_S and why.endswith(f"at most {launch.MAX_WAIT_S:,.0f} s")
    assert launch.wait_limit(None, "gloo", predicted_epoch_s=float("inf")) == (1800.0, "torch's default for gloo")


class _Launched(Exception):
    pass


@pytest.mark.parametrize("kw", [
    dict(num_nodes=120, layers=2, hidden=8, stages=2, chunks=2),                          # GNNPipe
    dict(num_nodes=120, layers=2, hidden=8, ways=2),                                      # graph parallelism
    dict(model="schnet", frames=6, layers=1, hidden=8, batch_size=2, graph_parallel_group_size=2),  # S2EF GP
    dict(model="schnet", frames=6, layers=1, hidden=8, batch_size=2, stages=2, chunks=2),           # S2EF pipeline
], ids=["gnnpipe", "gp", "s2ef-gp", "s2ef-pipeline"])
def test_both_kinds_of_work_start_their_ranks_with_the_derived_wait_limit(monkeypatch, capsys, kw):
    seen = {}

    def fake_spawn(fn, world_size, args=(), **opts):
        seen.update(opts)
        raise _Launched

    monkeypatch.setattr(launch, "spawn", fake_spawn)
    with pytest.raises(_Launched):
        api.train(epochs=1, progress=False, **kw)
    assert seen["timeout_s"] == 1800.0  # was 60 s: any action slower than a minute ended the run
    assert "wait limit 1,800 s (torch's default for gloo; --timeout sets it)" in capsys.readouterr().err


def _default_wait(config):
    """``config`` with the wait limit of default flags (``TrainConfig``'s default ``timeout_s``)."""
    import attrs

    from gnnpipe.core.settings.config import TrainConfig

    return attrs.evolve(config, timeout_s=TrainConfig().timeout_s)


class _Probe(Corrector):
    """Test corrector: each rank writes its process group's timeout (seconds) to ``folder/rank{r}`` and, when
    ``die_stage`` is its stage, ends its process without a word (``os._exit``) in epoch 1, mid-epoch."""

    def __init__(self, folder, die_stage=None):
        self.folder, self.die_stage = str(folder), die_stage

    def after_forward(self, epoch, chunk):
        import torch
        import torch.distributed as dist

        pg = dist.distributed_c10d._get_default_group()
        timeout = pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
        with open(os.path.join(self.folder, f"rank{dist.get_rank()}"), "w") as fh:
            fh.write(str(timeout))
        if self.ctx.stage == self.die_stage and epoch == 1 and chunk >= 0:
            with open(os.path.join(self.folder, "died"), "w") as fh:
                fh.write(repr(time.time()))
            os._exit(3)


def test_ranks_wait_on_live_peers_for_the_derived_limit_and_a_rank_that_exits_ends_the_run_at_once(tmp_path):
    """Default flags: every rank's process group waits 30 min (gloo's default) on a live peer; a rank that exits
    mid-epoch without a word still ends every rank within seconds, named in the message."""
    cfg = _default_wait(base_config(stages=2, chunks=4, epochs=3, correctors=[_Probe(tmp_path, die_stage=1)]))
    with pytest.raises(DistributedError) as err:
        api.train(cfg, data=small_graph(), progress=False)
    took = time.time() - float((tmp_path / "died").read_text())  # from the rank's exit to every rank ended
    assert float((tmp_path / "rank0").read_text()) == 1800.0 and float((tmp_path / "rank1").read_text()) == 1800.0
    msg = str(err.value)
    assert "rank 1 exited with code 3 without reporting a result" in msg and "all 2 ranks were stopped" in msg
    assert took < 30, took
    print(f"every rank ended {took:.1f} s after rank 1 exited")


@pytest.mark.slow  # sleeps 90 s
@pytest.mark.timeout(600)
def test_a_rank_slower_than_a_minute_under_default_flags_finishes(capsys):
    """One rank sleeps 90 s inside an action (after a chunk's forward); its peer waits on it. With the old default
    wait limit of 60 s the run ended with "Timed out waiting 60000ms for recv operation"."""
    cfg = _default_wait(base_config(stages=2, chunks=4, epochs=3, correctors=[_Stall(1, 1, 90.0)]))
    t0 = time.monotonic()
    result = api.train(cfg, data=small_graph(), progress=False)
    assert time.monotonic() - t0 > 90
    assert len(result.epochs) == 3 and result.status == "completed"
    assert "wait limit 1,800 s" in capsys.readouterr().err


def test_layout_auto_derives_the_wait_limit_from_the_predicted_epoch(monkeypatch, capsys):
    """A layout whose epoch the cost model predicts at 400 s waits 10 × that on a live peer (above torch's 30 min)."""
    import attrs

    seen = {}

    def fake_auto(config, data, ranks, hardware, progress, plan_options):
        return attrs.evolve(config, stages=2, chunks=2), {"chosen": {"predicted_epoch_s": 400.0}, "ranking": []}

    def fake_spawn(fn, world_size, args=(), **opts):
        seen.update(opts)
        raise _Launched

    monkeypatch.setattr(api, "_auto_layout", fake_auto)
    monkeypatch.setattr(launch, "spawn", fake_spawn)
    with pytest.raises(_Launched):
        api.train(num_nodes=120, layers=2, hidden=8, epochs=1, progress=False, layout="auto", ranks=2)
    assert seen["timeout_s"] == 4000.0
    assert "wait limit 4,000 s (10 × the predicted epoch of 400 s; --timeout sets it)" in capsys.readouterr().err


def test_layout_auto_refuses_a_machine_with_no_finite_epoch(monkeypatch):
    """A hardware description whose links make every predicted epoch infinite (e.g. ``bandwidth_gbps = 1e-320``)
    is refused with a message naming the machine, not turned into an unbounded wait limit."""
    import types

    from gnnpipe import api
    from gnnpipe.errors import ConfigError
    from gnnpipe.tasks.nodes.cost import predict

    pred = types.SimpleNamespace(fits=True, epoch_s=float("inf"), spec=None)
    hw = types.SimpleNamespace(name="absurd links")
    monkeypatch.setattr(api, "_plan_prepared", lambda *a, **k: ([pred], hw, None))
    monkeypatch.setattr(predict, "format_ranking", lambda preds, hw: "")
    with pytest.raises(ConfigError, match="no finite epoch time on absurd links"):
        api._auto_layout(None, None, 2, "absurd.toml", False, {})
