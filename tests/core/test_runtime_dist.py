"""Multi-process tests: recompute, async-stale, failure handling, configuration errors, torchrun."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import torch

from gnnpipe import api
from gnnpipe.correctors import Corrector
from gnnpipe.errors import ConfigError, DistributedError, UnknownComponentError

from .distutil import base_config, run_distributed, run_many, small_graph

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def test_recompute_gives_identical_losses_and_gradients_with_dropout():
    """Activation recomputation replays the same dropout masks: with C = 1 it changes nothing."""
    data = small_graph()
    cfg = base_config(model="gcnii", stages=2, chunks=1, dropout=0.3, epochs=2)
    _, outs_a, grads_a = run_distributed(cfg, data, grads_after=(2,))
    _, outs_b, grads_b = run_distributed(attrs.evolve(cfg, recompute=True), data, grads_after=(2,))
    assert outs_a[0]["losses"] == pytest.approx(outs_b[0]["losses"], abs=1e-6)
    for name, g in grads_a[2].items():
        torch.testing.assert_close(grads_b[2][name], g, rtol=0, atol=1e-6)


@pytest.mark.parametrize("model,layout,scheduler", [
    ("gcnii", dict(stages=2, chunks=4), "1f1b"), ("gin", dict(stages=2, chunks=4), "gpipe"),
    pytest.param("gcn", dict(ways=2, stages=2, chunks=8), "1f1b", marks=pytest.mark.slow)],
    ids=["gcnii-1f1b", "gin-push-gpipe", "gcn-hybrid"])
def test_recompute_with_several_chunks_changes_nothing(model, layout, scheduler):
    """With C > 1 a chunk's halo rows come from history, which later chunks' forwards overwrite before the chunk's
    backward: the recomputation gets what its forward read (``History.recall``), so losses and gradients equal
    those without recompute bit for bit — the pull op (GCNII, its fused step), the halo-gradient op (GIN) and the
    hybrid's peer op; with dropout and the correctors T1, T2."""
    data = small_graph()
    cfg = base_config(model=model, scheduler=scheduler, dropout=0.3, epochs=3, correctors=["t1", "t2"], **layout)
    (_, outs_a, grads_a), (_, outs_b, grads_b) = run_many(
        [attrs.evolve(cfg, recompute=False), attrs.evolve(cfg, recompute=True)], data, grads_after=(1, 3),
        no_eval=True)
    assert outs_a[0]["losses"] == outs_b[0]["losses"]
    for e in (1, 3):
        assert grads_a[e] and set(grads_a[e]) == set(grads_b[e])
        for name, g in grads_a[e].items():
            torch.testing.assert_close(grads_b[e][name], g, rtol=0, atol=0, msg=f"{name} after epoch {e}")


@pytest.mark.parametrize("stash", [False, True])
def test_async_stale_runs_without_drain_and_moves_the_same_bytes(stash):
    data = small_graph(n=100)
    cfg = base_config(model="gcn", stages=3, chunks=6, scheduler="async-stale", stash_weights=stash,
                      epochs=4, eval_every=2, correctors=["t1"])
    _, outs, _ = run_distributed(cfg, data, grads_after=())
    res = outs[0]["result"]
    assert len(res.epochs) == 4
    # forwards of epoch e+1 may run inside epoch e's step, so bytes balance over the whole run
    total = sum(e["bytes_layer"] for e in res.epochs)
    assert total == 4 * 2 * 4 * (3 - 1) * data.num_nodes * cfg.hidden
    assert all(e["loss"] > 0 for e in res.epochs)


def test_stash_weights_needs_a_non_flush_scheduler():
    with pytest.raises(ConfigError, match="does not flush"):
        api.train(base_config(stages=2, chunks=4, stash_weights=True), data=small_graph(), progress=False)


class _Fail(Corrector):
    """Test corrector: makes one stage fail mid-epoch (raise, or die by SIGKILL)."""

    def __init__(self, stage, epoch, how):
        self.stage, self.at_epoch, self.how = stage, epoch, how

    def after_forward(self, epoch, chunk):
        if self.ctx.stage == self.stage and epoch == self.at_epoch and chunk >= 0:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected failure in a test")


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_rank_ends_every_rank_with_a_message(how):
    data = small_graph()
    cfg = base_config(stages=4, chunks=8, epochs=5, correctors=[_Fail(2, 1, how)], timeout_s=30.0)
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as err:
        api.train(cfg, data=data, progress=False)
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert "rank 2" in msg
    assert ("injected failure" in msg) if how == "raise" else ("SIGKILL" in msg)


@pytest.mark.parametrize("overrides,exc,match", [
    ({"stages": 9, "layers": 4}, ConfigError, "only 6 layer units"),
    ({"stages": 2, "chunks": 500}, ConfigError, "fewer chunks"),
    ({"stages": 2, "scheduler": "zigzag"}, UnknownComponentError, "available: 1f1b"),
    ({"stages": 2, "correctors": ["t9"]}, UnknownComponentError, "available: .*t1"),
    ({"stages": 2, "partitioner": "magic"}, UnknownComponentError, "metis"),
    ({"stages": 2, "layer_split": "best"}, UnknownComponentError, "equal"),
])
def test_bad_configurations_fail_before_any_process_starts(overrides, exc, match):
    t0 = time.monotonic()
    with pytest.raises(exc, match=match):
        api.train(base_config(**overrides), data=small_graph(), progress=False)
    assert time.monotonic() - t0 < 10


def _train_cmd(extra):
    return ["--stages", "2", "--chunks", "4", "--model", "gcnii", "--layers", "3", "--hidden", "8",
            "--num-nodes", "150", "--epochs", "3", "--seed", "5", "--no-progress"] + extra


def test_torchrun_gives_the_same_result_as_the_builtin_launcher(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    a, b = tmp_path / "builtin.json", tmp_path / "torchrun.json"
    subprocess.run([sys.executable, "-m", "gnnpipe", "train", *_train_cmd(["--out", str(a)])], check=True, env=env,
                   timeout=240)
    # torchrun of this interpreter's torch (a `torchrun` script need not sit beside a venv's python)
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    subprocess.run([*torchrun, "--standalone", "--nproc-per-node", "2", "-m", "gnnpipe", "train",
                    *_train_cmd(["--out", str(b)])], check=True, env=env, timeout=240)
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert [e["loss"] for e in ra["epochs"]] == pytest.approx([e["loss"] for e in rb["epochs"]], abs=1e-6)
    assert ra["best_val_acc"] == rb["best_val_acc"]
    assert [e["bytes_layer"] for e in ra["epochs"]] == [e["bytes_layer"] for e in rb["epochs"]]


def test_compare_command_end_to_end(tmp_path, capsys):
    from gnnpipe.cli.main import main

    out = tmp_path / "cmp.json"
    rc = main(["compare", "--ranks", "2", "--num-nodes", "150", "--epochs", "2", "--layers", "2", "--hidden", "8",
               "--no-progress", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "GP" in text and "GNNPipe" in text
    doc = json.loads(out.read_text())
    assert doc  # the comparison was written as JSON


def test_a_script_without_main_guard_fails_fast_with_the_fix(tmp_path):
    script = tmp_path / "noguard.py"
    script.write_text(
        "from gnnpipe import api\n"
        "api.train(num_nodes=150, layers=2, hidden=8, epochs=1, stages=2, chunks=2, progress=False)\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 120
    assert "__main__" in r.stderr and "DistributedError" in r.stderr


def test_sigterm_stops_every_rank(tmp_path):
    """`kill`/`timeout` send SIGTERM to the launcher: it must stop its ranks, not orphan them."""
    proc = subprocess.Popen([sys.executable, "-m", "gnnpipe", "train", "--stages", "2", "--num-nodes", "300",
                             "--epochs", "100000", "--patience", "0", "--layers", "2", "--hidden", "8",
                             "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0, children = time.monotonic(), []
    while len(children) < 3 and time.monotonic() - t0 < 120:  # the two ranks (and the resource tracker) started
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    assert "SIGINT" not in err and "stopped by signal SIGTERM" in err, err[-2000:]  # the signal sent, named
    time.sleep(1)
    alive = [c for c in children
             if os.path.exists(f"/proc/{c}") and "zombie" not in open(f"/proc/{c}/status").read().lower()]
    assert not alive, f"ranks left running: {alive}"


def test_sigterm_during_start_up_stops_a_launcher_started_with_sigint_ignored():
    """A background job (``cmd &`` in a script) starts with SIGINT ignored, and an ignored signal stays ignored
    through exec: the SIGINT the launcher forwards must still reach ranks that are still starting up."""
    proc = subprocess.Popen([sys.executable, "-m", "gnnpipe", "train", "--stages", "2", "--num-nodes", "300",
                             "--epochs", "100000", "--patience", "0", "--layers", "2", "--hidden", "8",
                             "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    t0, children = time.monotonic(), []
    while len(children) < 2 and time.monotonic() - t0 < 120:  # the ranks exist; they are importing, not training
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)])
    assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
    time.sleep(1)
    alive = [c for c in children
             if os.path.exists(f"/proc/{c}") and "zombie" not in open(f"/proc/{c}/status").read().lower()]
    assert not alive, f"ranks left running: {alive}"


def _share_split(rank, world, config, plan):
    from gnnpipe.tasks.nodes.runner import share_profiled_split

    plan.bounds = [0, 1 + rank, plan.bounds[-1]]  # as if each rank's profile had chosen differently
    plan.info = dict(plan.info, stage_bounds=plan.bounds)
    share_profiled_split(config, plan)
    return plan.bounds, plan.info["stage_bounds"]


def test_torchrun_ranks_run_rank_0s_profiled_split():
    """Under torchrun every rank profiles for itself; the ranks must agree on rank 0's split."""
    from gnnpipe.core.run import launch
    from gnnpipe.tasks.nodes.runner import RunPlan

    from .distutil import base_config

    config = base_config(stages=2, chunks=2, layer_split="profiled")
    plan = RunPlan(data=None, chunk_ptr=torch.tensor([0, 1, 2]), way_ptr=torch.tensor([0, 2]), bounds=[0, 2, 4],
                   num_features=1, num_classes=2, info={})
    outs = launch.spawn(_share_split, 2, (config, plan), timeout_s=60, threads=1, max_runtime_s=120)
    assert outs == [([0, 1, 4], [0, 1, 4])] * 2


_REPEAT_SCRIPT = r"""
import os, signal, sys, threading, time
from gnnpipe.core.run import stopping
from gnnpipe.core.run.launch import spawn

def rank(r, world):
    with stopping.installed(announce=False):
        while not stopping.requested():
            time.sleep(0.02)
    raise KeyboardInterrupt("stopped")

if __name__ == "__main__":
    def press():
        time.sleep(float(sys.argv[1]))
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)  # the stop has ended the ranks by now: a second press within the debounce window
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=press, daemon=True).start()
    try:
        spawn(rank, 2, backend="gloo", timeout_s=60, graceful=True)
    except KeyboardInterrupt as exc:
        time.sleep(1.5)  # the caller writes the partial results
        print("saved after", exc, flush=True)
"""


def test_a_repeated_stop_signal_within_the_debounce_window_does_not_interrupt_the_caller_afterwards(tmp_path):
    """A second Ctrl-C within ``DEBOUNCE_S`` of the first is the same stop, also when it arrives after the ranks
    have ended, while the caller (``gnnpipe train --out``) writes the partial results."""
    script = tmp_path / "repeat.py"
    script.write_text(_REPEAT_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), "8"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0 and "saved after" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])
