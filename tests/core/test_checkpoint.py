"""Checkpoints and bit-identical resume in every layout (issue #13)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gnnpipe import api
from gnnpipe.core.run.checkpoint import STALL_ENV, find_checkpoint, read_meta, read_weights
from gnnpipe.errors import ConfigError

from .distutil import small_graph

K = 3
BASE = dict(model="gcnii", layers=4, hidden=8, dropout=0.5, patience=0, seed=3, correctors="t1,t2,t3:2,ema",
            keep="last", timeout_s=60.0)


def _run(data, epochs, **kw):
    return api.train(data=data, progress=False, epochs=epochs, **dict(BASE, **kw))


def _same_run(a, b):
    assert len(a.epochs) == len(b.epochs)
    for ea, eb in zip(a.epochs, b.epochs):
        for key in ("loss", "train_acc", "val_acc", "test_acc", "val_loss"):
            assert ea[key] == eb[key], (ea["epoch"], key, ea[key], eb[key])
    assert (a.best_epoch, a.best_val_acc, a.test_acc_at_best_val) == (b.best_epoch, b.best_val_acc,
                                                                      b.test_acc_at_best_val)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


LAYOUTS = [
    pytest.param({}, id="single"),
    pytest.param(dict(stages=2), id="pipeline-gpipe", marks=[pytest.mark.dist, pytest.mark.slow]),
    pytest.param(dict(stages=2, scheduler="1f1b"), id="pipeline-1f1b", marks=[pytest.mark.dist, pytest.mark.slow]),
    pytest.param(dict(stages=2, scheduler="async-stale"), id="pipeline-async",
                 marks=[pytest.mark.dist, pytest.mark.slow]),
    pytest.param(dict(stages=2, scheduler="async-stale", stash_weights=True), id="pipeline-async-stash",
                 marks=pytest.mark.dist),
    pytest.param(dict(ways=2), id="gp", marks=[pytest.mark.dist, pytest.mark.slow]),
    pytest.param(dict(ways=2, stages=2, chunks=4), id="hybrid", marks=[pytest.mark.dist, pytest.mark.slow]),
    # issue #12: history stored in bfloat16 (H_in, G_out, T3's snapshot, EMA's average) round-trips bit-identically
    pytest.param(dict(stages=2, history_dtype="bfloat16"), id="pipeline-bf16-history", marks=pytest.mark.dist),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_resume_is_bit_identical(tmp_path, layout):
    """2K straight epochs == K epochs + resume for K more: every loss and accuracy, and the final weights."""
    data = small_graph()
    straight = _run(data, 2 * K, **layout)
    _run(data, K, checkpoint_dir=str(tmp_path / "ck"), **layout)
    assert read_meta(tmp_path / "ck")["epochs"] == K
    resumed = _run(data, 2 * K, resume=str(tmp_path / "ck"), **layout)
    _same_run(straight, resumed)


def test_periodic_checkpoints_keep_the_two_newest_and_best_weights(tmp_path):
    data = small_graph()
    res = _run(data, 5, checkpoint_dir=str(tmp_path), checkpoint_every=2, keep="best")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-")) == ["ckpt-000004", "ckpt-000005"]
    best = read_weights(tmp_path, "best")
    for k, v in res.model.state_dict().items():
        assert torch.equal(best[k], v)


def test_resume_refuses_a_changed_configuration(tmp_path):
    data = small_graph()
    _run(data, 2, checkpoint_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"seed: checkpoint 3, now 4.*lr|lr.*seed"):
        _run(data, 4, resume=str(tmp_path), seed=4, lr=0.5)
    with pytest.raises(ConfigError, match="no checkpoint"):
        _run(data, 4, resume=str(tmp_path / "nothing"))


@pytest.mark.dist
@pytest.mark.slow
def test_weights_of_a_four_stage_pipeline_load_into_single_process_and_graph_parallel(tmp_path):
    data = small_graph()
    pipe = _run(data, 2, stages=4, checkpoint_dir=str(tmp_path))
    for layout in ({}, dict(ways=2)):
        with pytest.warns(UserWarning, match="another layout"):
            # resumed with no epoch left to run: the model holds exactly the loaded weights
            other = _run(data, 2, resume=str(tmp_path), **layout)
        assert len(other.epochs) == 2
        for k, v in pipe.model.state_dict().items():
            assert torch.equal(other.model.state_dict()[k], v), (layout, k)
    # and training continues from them in another layout
    with pytest.warns(UserWarning, match="another layout"):
        more = _run(data, 3, resume=str(tmp_path), ways=2)
    assert [e["epoch"] for e in more.epochs] == [0, 1, 2]


@pytest.mark.dist
def test_pipeline_weights_load_into_the_single_process_trainer(tmp_path):
    data = small_graph()
    pipe = _run(data, 2, stages=2, checkpoint_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="another layout"):
        single = _run(data, 2, resume=str(tmp_path))
    for k, v in pipe.model.state_dict().items():
        assert torch.equal(single.model.state_dict()[k], v), k


# ---------------------------------------------------------------------------------------------- processes
ARGS = ["--model", "gcn", "--layers", "4", "--hidden", "8", "--num-nodes", "200", "--patience", "0",
        "--no-progress", "--stages", "2", "--timeout", "20"]


def _train(cwd: Path, *extra: str, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gnnpipe", "train", *ARGS, *extra], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env=dict(os.environ, **(env or {})))


def _wait(pred, p, timeout=120.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return
        if p.poll() is not None:
            raise AssertionError(f"train ended early: {p.communicate()}")
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.mark.dist
@pytest.mark.slow
def test_a_rank_killed_while_writing_leaves_the_previous_checkpoint_resumable(tmp_path):
    ck = tmp_path / "ck"
    p = _train(tmp_path, "--epochs", "100", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
               env={STALL_ENV: "4:1"})  # rank 1 stalls inside the write of the checkpoint after epoch 4
    _wait(lambda: (ck / ".tmp-ckpt-000004").is_dir() and any((ck / ".tmp-ckpt-000004").iterdir()), p)
    time.sleep(1.0)
    ranks = [int(c) for c in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
             if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    os.kill(sorted(ranks)[1], signal.SIGKILL)
    _, err = p.communicate(timeout=90)
    assert p.returncode == 2, err
    assert find_checkpoint(ck).name == "ckpt-000002"
    assert read_meta(ck)["epochs"] == 2
    q = _train(tmp_path, "--epochs", "4", "--resume", str(ck), "--out", str(tmp_path / "r.json"))
    _, err = q.communicate(timeout=180)
    assert q.returncode == 0, err
    straight = _train(tmp_path, "--epochs", "4", "--out", str(tmp_path / "s.json"))
    _, err = straight.communicate(timeout=180)
    assert straight.returncode == 0, err
    a, b = (json.loads((tmp_path / f).read_text())["epochs"] for f in ("r.json", "s.json"))
    assert [e["loss"] for e in a] == [e["loss"] for e in b]


@pytest.mark.dist
def test_ctrl_c_leaves_the_json_and_a_checkpoint_and_resume_finishes(tmp_path):
    ck, out = tmp_path / "ck", tmp_path / "r.json"
    p = _train(tmp_path, "--epochs", "100000", "--out", str(out), "--checkpoint-dir", str(ck),
               "--checkpoint-every", "3", "--log-csv", str(tmp_path / "log.csv"))
    _wait(lambda: (tmp_path / "log.csv").exists() and len((tmp_path / "log.csv").read_text().splitlines()) > 4, p)
    os.killpg(p.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the launcher and every rank
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err.count(b"stopping after this epoch") == 1, err  # announced once, not once per rank
    rec = json.loads(out.read_text())
    assert rec["status"] == "interrupted" and rec["epochs"]
    done = read_meta(ck)["epochs"]
    assert done == len(rec["epochs"]), err  # the ranks stopped after one epoch and wrote a final checkpoint
    q = _train(tmp_path, "--epochs", str(done + 2), "--resume", str(ck), "--out", str(out))
    _, err = q.communicate(timeout=180)
    assert q.returncode == 0, err
    assert f"resumed from {ck}: {done} epoch(s) done, training to {done + 2}".encode() in err
    rec = json.loads(out.read_text())
    assert rec["status"] == "completed" and len(rec["epochs"]) == done + 2


def test_history_loads_only_into_the_same_layout(tmp_path):
    from gnnpipe.core.run.checkpoint import load_checkpoint
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer, resolve_config

    data = small_graph()
    _run(data, 2, checkpoint_dir=str(tmp_path))
    cfg = resolve_config(TrainConfig(**{k: v for k, v in BASE.items() if k != "keep"}, epochs=2))
    t = SingleProcessTrainer(data, cfg)
    info = {"chunks": 2, "chunk_sizes": [48, 48], "stage_bounds": [0, 6], "way_ptr": [0, 1]}
    with pytest.raises(ConfigError, match="chunk_sizes"):
        load_checkpoint(tmp_path, t, 0, cfg, info, 1, require_history=True)


@pytest.mark.dist
@pytest.mark.parametrize("layout", [pytest.param(dict(stages=2), id="pipeline"),
                                    pytest.param(dict(stages=2, history_dtype="bfloat16"), id="pipeline-bf16-history",
                                                 marks=pytest.mark.slow),
                                    pytest.param(dict(ways=2, stages=2, chunks=4), id="hybrid",
                                                 marks=pytest.mark.slow)])
def test_resume_of_a_halo_gradient_model_is_bit_identical(tmp_path, layout):
    """GAT (a message-passing unit: halo-gradient op, PushHistory): the checkpoint holds H_in, G_in and every
    chunk's last push (History.state_tensors), so K epochs + resume == 2K straight epochs. Without T2 (which
    clears the pushes at every epoch end) the pushes outlive the epoch and must be restored."""
    data = small_graph()
    gat = dict(model="gat", layers=3, hidden=8, correctors="t1,t3:2,ema", **layout)
    straight = _run(data, 2 * K, **gat)
    _run(data, K, checkpoint_dir=str(tmp_path / "ck"), **gat)
    resumed = _run(data, 2 * K, resume=str(tmp_path / "ck"), **gat)
    _same_run(straight, resumed)


@pytest.mark.dist
def test_a_lean_rank_checkpoints_only_what_it_holds(tmp_path):
    """Issue #12 with #13: each pipeline rank writes the weights and optimizer state of its own units and its own
    history (in --history-dtype: H_in bfloat16); together the ranks' weights are the whole single-process model,
    which result.model holds."""
    from gnnpipe.core.run.checkpoint import _metadata

    data = small_graph()
    res = _run(data, 2, stages=2, history_dtype="bfloat16", checkpoint_dir=str(tmp_path))
    md = _metadata(find_checkpoint(tmp_path))
    bounds = read_meta(tmp_path)["plan"]["stage_bounds"]
    weights = {k[len("model."):] for k in md if k.startswith("model.")}
    assert weights == set(res.model.state_dict())  # every unit, each from the rank that holds it
    for rank in range(2):
        units = {int(k.split(".")[2][len("unit"):]) for k in md if k.startswith(f"rank{rank}.history.")}
        assert units and units <= set(range(bounds[rank], bounds[rank + 1]))
        for k in md:
            if k.startswith(f"rank{rank}.history.") and k.endswith(".H_in"):
                assert md[k].properties.dtype == torch.bfloat16, k


# ---------------------------------------------------------------------------------------------- review fixes (a687f0b)
def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_checkpoint_dir_holding_another_runs_later_checkpoints_is_refused_and_kept(tmp_path):
    """A new run (or a resume from an older checkpoint) into a --checkpoint-dir with later checkpoints would have its
    own checkpoints pruned as the older ones and a later --resume DIR pick the other run's: refused before training,
    naming the folder, the checkpoints and the fix; nothing in the folder changes."""
    from gnnpipe.core.run.checkpoint import check_checkpoint_dir, list_checkpoints

    data = small_graph()
    ck = tmp_path / "ck"
    _run(data, 3, checkpoint_dir=str(ck), checkpoint_every=1)
    assert [n for n, _ in list_checkpoints(ck)] == [2, 3]
    before = _tree(ck)
    with pytest.raises(ConfigError, match=r"already holds an earlier run's checkpoints \(ckpt-000002, ckpt-000003\)"
                                          r".*--resume .*ck, or give an empty or new folder"):
        _run(data, 2, checkpoint_dir=str(ck))
    with pytest.raises(ConfigError, match=r"checkpoints after epoch 2 \(ckpt-000003\)"):
        _run(data, 4, checkpoint_dir=str(ck), resume=str(ck / "ckpt-000002"))
    assert _tree(ck) == before
    check_checkpoint_dir(ck, 3)  # continuing from the newest one is fine
    check_checkpoint_dir(tmp_path / "new", 0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file; give a folder"):
        check_checkpoint_dir(tmp_path / "file")


@pytest.mark.parametrize("damage", ["truncate-data", "garble-metadata"])
def test_a_damaged_checkpoint_names_itself_and_the_older_one(tmp_path, damage):
    """A damaged newest checkpoint: a ConfigError naming it and the older one to resume from; the command line
    prints that one line and no traceback (DCP logs its own to the root logger for a garbled .metadata, which a
    process without logging handlers prints: a subprocess, as pytest installs handlers)."""
    data = small_graph()
    ck = tmp_path / "ck"
    _run(data, 2, checkpoint_dir=str(ck), checkpoint_every=1)
    newest = ck / "ckpt-000002"
    if damage == "truncate-data":
        f = next(newest.glob("*.distcp"))
        f.write_bytes(f.read_bytes()[:100])
    else:
        (newest / ".metadata").write_bytes(b"\x80\x04garbage" * 5)
    want = (rf"checkpoint {newest} cannot be read \(damaged or incomplete: "
            rf".*resume from an older one \({ck / 'ckpt-000001'}\)")
    with pytest.raises(ConfigError, match=want):
        read_meta(ck)
    with pytest.raises(ConfigError, match=want):
        _run(data, 3, resume=str(ck))
    r = subprocess.run([sys.executable, "-m", "gnnpipe", "export", str(ck), "--out", str(tmp_path / "m.pt")],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gnnpipe: error: checkpoint {newest} cannot be read"), r.stderr
    assert read_meta(ck / "ckpt-000001")["epochs"] == 1  # the older one still resumes


def test_checkpoints_record_the_absolute_data_paths(tmp_path, monkeypatch):
    """gnnpipe predict finds a model's data from any folder: the checkpoint (and the model exported from it)
    records the run's --root and --dataset file as absolute paths."""
    from gnnpipe.core.run.checkpoint import model_from_checkpoint

    (tmp_path / "data").mkdir()
    torch.save(small_graph(), tmp_path / "data" / "g.pt")
    monkeypatch.chdir(tmp_path)
    _run(None, 1, dataset="g.pt", root="data", checkpoint_dir="ck")
    meta = read_meta(tmp_path / "ck")
    assert meta["data_paths"] == {"root": str((tmp_path / "data").resolve())}
    assert meta["config"]["root"] == "data"  # the configuration itself is kept as given
    assert model_from_checkpoint(tmp_path / "ck").meta["data_paths"] == meta["data_paths"]
    _run(None, 1, dataset="data/g.pt", checkpoint_dir="ck2")
    assert read_meta(tmp_path / "ck2")["data_paths"] == {"dataset": str((tmp_path / "data" / "g.pt").resolve())}


def test_the_held_weights_are_named_in_the_model_meta(tmp_path):
    """keep="best" on a run that kept no best weights loads the last ones; meta["weights"] says so."""
    from gnnpipe.core.run.checkpoint import model_from_checkpoint

    _run(small_graph(), 2, checkpoint_dir=str(tmp_path / "last"))  # BASE: keep="last"
    assert model_from_checkpoint(tmp_path / "last", "best").meta["weights"] == "last"
    _run(small_graph(), 2, checkpoint_dir=str(tmp_path / "best"), keep="best")
    assert model_from_checkpoint(tmp_path / "best", "best").meta["weights"] == "best"
    assert model_from_checkpoint(tmp_path / "best", "last").meta["weights"] == "last"


@pytest.mark.dist
def test_the_nothing_to_train_warning_of_a_resumed_pipeline_is_printed_once(tmp_path, capfd):
    """Resuming into 2 stages a run that has no epoch left: the ranks' warning comes from rank 0 only."""
    data = small_graph()
    _run(data, 2, checkpoint_dir=str(tmp_path))  # single process: one start of ranks less
    capfd.readouterr()
    with pytest.warns(UserWarning, match="another layout"):
        _run(data, 2, stages=2, resume=str(tmp_path))
    err = capfd.readouterr().err
    assert err.count("nothing to train: the resumed run has already completed 2 epoch(s)") == 1, err


def test_resume_takes_a_dataset_file_named_by_another_path(tmp_path, monkeypatch):
    """The same extended XYZ file, named relative at the start and absolute on resume, is the same data set; another
    file is refused."""
    from gnnpipe.core.run.checkpoint import FORMAT_VERSION, check_resume, data_paths
    from gnnpipe.core.settings.config import TrainConfig

    (tmp_path / "a.extxyz").write_text("")
    (tmp_path / "b.extxyz").write_text("")
    monkeypatch.chdir(tmp_path)
    first = TrainConfig(dataset="a.extxyz", model="schnet")
    meta = {"format": FORMAT_VERSION, "config": first.to_dict(), "data_paths": data_paths(first)}
    assert check_resume(TrainConfig(dataset=str(tmp_path / "a.extxyz"), model="schnet"), meta) == []
    with pytest.raises(ConfigError, match="dataset"):
        check_resume(TrainConfig(dataset="b.extxyz", model="schnet"), meta)
