"""Training by optimizer steps (S2EF): ``--max-steps``, ``--eval-every-steps`` / ``--val-size``,
``--checkpoint-every-steps`` (exact resume inside an epoch), step lines and records, and the refusals."""

from __future__ import annotations

import json
import os

import pytest
import torch

from gnnpipe import api
from gnnpipe.cli.main import main
from gnnpipe.errors import ConfigError

from .toy import emt_clusters, write_extxyz

SMALL = dict(model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=12, batch_size=4, warmup_steps=2,
             model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0)
FLAGS = ["--model", "schnet", "--layers", "1", "--hidden", "8", "--cutoff", "4", "--max-neighbors", "12",
         "--batch-size", "4", "--warmup-steps", "2", "--model-arg", "num_filters=8", "--model-arg", "num_gaussians=8",
         "--no-progress"]
#: float64, every step recorded (log_every_steps=1): 20 training structures, 5 steps per epoch, 15 in all; a constant
#: learning rate after the warm-up, so a run cut by --max-steps takes the steps an uninterrupted run takes (a cosine
#: decay spans --max-steps when it is given)
EXACT = dict(dtype="float64", epochs=3, ema_decay=0.9, keep="last", log_every_steps=1, progress=False,
             lr_schedule="constant", **SMALL)


@pytest.fixture(scope="module")
def xyz(tmp_path_factory):
    return write_extxyz(tmp_path_factory.mktemp("steps") / "clusters.extxyz", 24, seed=1)


@pytest.fixture(scope="module")
def data():
    return emt_clusters(24, seed=2, dtype=torch.float64)


@pytest.fixture(scope="module")
def uninterrupted(data):
    return api.train(data=data, eval_every_steps=4, **EXACT)


def _ckpts(folder) -> list[str]:
    """The checkpoints of a folder (it also holds the run's config.toml)."""
    return [n for n in os.listdir(folder) if n.startswith("ckpt-")]


def _losses(result) -> list[float]:
    return [s["loss"] for s in result.steps]


def _strip(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records]  # timings (time_s, idle_s, …)


def _assert_same_run(resumed, full) -> None:
    assert _losses(resumed) == _losses(full) and len(_losses(full)) == 15  # every step, exactly (float64)
    assert _strip(resumed.epochs) == _strip(full.epochs)  # the epoch cut by the checkpoint included
    for k, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k


def test_max_steps_inside_an_epoch_then_resume_is_exact(tmp_path, data, uninterrupted):
    ck = tmp_path / "ck"
    stopped = api.train(data=data, eval_every_steps=4, max_steps=7, checkpoint_dir=str(ck), checkpoint_every_steps=3,
                        **EXACT)
    assert stopped.status == "completed" and len(stopped.epochs) == 1 and stopped.steps[-1]["step"] == 7
    assert "val_force_mae" in stopped.steps[-1] and stopped.steps[-1]["val_size"] == 2  # evaluated at --max-steps
    assert sorted(_ckpts(ck)) == ["ckpt-000001-s000001", "ckpt-000001-s000002"]  # steps 6 and 7; two kept
    assert _losses(stopped) == _losses(uninterrupted)[:7]
    resumed = api.train(data=data, eval_every_steps=4, resume=str(ck), checkpoint_dir=str(ck), **EXACT)
    _assert_same_run(resumed, uninterrupted)
    assert [s["step"] for s in resumed.steps if "val_force_mae" in s] == [4, 7, 8, 12]
    assert sorted(_ckpts(ck))[-1] == "ckpt-000003"


def test_an_interrupted_run_checkpoints_its_step_and_resumes_exactly(tmp_path, data, uninterrupted, monkeypatch):
    from gnnpipe.tasks.s2ef.steps import StepLoop

    ck = tmp_path / "ck"
    monkeypatch.setattr(StepLoop, "_stop_requested", lambda self: self.st.step == 8)  # a signal during step 8
    with pytest.raises(KeyboardInterrupt) as info:
        api.train(data=data, eval_every_steps=4, checkpoint_dir=str(ck), checkpoint_every_steps=100, **EXACT)
    assert info.value.result.status == "interrupted" and len(info.value.result.epochs) == 1
    assert sorted(_ckpts(ck)) == ["ckpt-000001-s000003"]
    monkeypatch.undo()
    resumed = api.train(data=data, eval_every_steps=4, resume=str(ck), **EXACT)
    _assert_same_run(resumed, uninterrupted)


def test_cli_max_steps_3_writes_the_result_and_a_checkpoint(tmp_path, xyz, capsys):
    out, ck, csv = tmp_path / "r.json", tmp_path / "ck", tmp_path / "log.csv"
    assert main(["train", "--dataset", xyz, *FLAGS, "--max-steps", "3", "--out", str(out), "--checkpoint-dir",
                 str(ck), "--log-csv", str(csv)]) == 0
    rec = json.loads(out.read_text())
    assert rec["status"] == "completed" and rec["epochs"] == [] and rec["config"]["max_steps"] == 3
    assert [s["step"] for s in rec["steps"]] == [1, 2, 3] and "val_force_mae" in rec["steps"][-1]
    assert rec["best_metrics"]["step"] == 3 and rec["best_metrics"]["test_force_mae"] > 0
    assert _ckpts(ck) == ["ckpt-000000-s000003"]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert len(lines) == 3 and lines[-1].startswith("step 3/3 (epoch 1)") and "F-MAE" in lines[-1]
    rows = csv.read_text().splitlines()
    assert rows[0].endswith(",step") and rows[-1].split(",")[-1] == "3"
    assert main(["export", str(ck), "--out", str(tmp_path / "m.pt")]) == 0  # a model file from a step checkpoint
    with pytest.warns(UserWarning, match="nothing to train"):  # resumed at --max-steps: said, not trained again
        r = api.train(dataset=xyz, max_steps=3, resume=str(ck), progress=False, **SMALL)
    assert [s["step"] for s in r.steps] == [1, 2, 3]


def test_max_steps_at_an_epoch_end_records_that_epoch(data):
    r = api.train(data=data, max_steps=5, epochs=4, progress=False, **SMALL)  # 5 steps per epoch
    assert len(r.epochs) == 1 and "val_force_mae" in r.epochs[0] and r.steps == []


def test_bad_step_settings_are_refused(tmp_path, data, capsys):
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.core.settings.options import RunOptions

    for field, flag in (("max_steps", "--max-steps"), ("eval_every_steps", "--eval-every-steps"),
                        ("val_size", "--val-size")):
        with pytest.raises(ConfigError, match=f"{flag}\\) must be >= 1, got 0"):
            TrainConfig(**{field: 0})
    with pytest.raises(ConfigError, match="checkpoint-every-steps must be an integer >= 0, got -2"):
        RunOptions(checkpoint_every_steps=-2)
    with pytest.raises(ConfigError, match="--eval-every-steps 2 needs validation data"):
        api.train(data=data[:4], eval_every_steps=2, epochs=1, progress=False, **SMALL)
    with pytest.raises(ConfigError, match="--max-steps train atomistic models"):
        api.train(max_steps=3, epochs=1, progress=False, log_every=0)
    with pytest.warns(UserWarning, match="exceeds the 15 steps of --epochs 3"):
        api.train(data=data, max_steps=16, epochs=3, progress=False, **SMALL)
    capsys.readouterr()
    assert main(["train", "--model", "schnet", "--max-steps", "-1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gnnpipe: error: max_steps (--max-steps) must be >= 1, got -1"]


def test_step_checkpoints_are_ordered_after_their_epoch(tmp_path):
    from gnnpipe.core.run.checkpoint import check_checkpoint_dir, checkpoint_name, find_checkpoint, list_checkpoints

    names = [checkpoint_name(2), checkpoint_name(1, 12), checkpoint_name(1), checkpoint_name(1, 3)]
    for n in names:
        (tmp_path / n).mkdir()
        (tmp_path / n / ".metadata").write_text("")
    assert [p.name for _, p in list_checkpoints(tmp_path)] == ["ckpt-000001", "ckpt-000001-s000003",
                                                               "ckpt-000001-s000012", "ckpt-000002"]
    assert find_checkpoint(tmp_path).name == "ckpt-000002"
    check_checkpoint_dir(tmp_path, 2)
    with pytest.raises(ConfigError, match=r"checkpoints after epoch 1, step 3 \(ckpt-000001-s000012, ckpt-000002\)"):
        check_checkpoint_dir(tmp_path, 1, 3)


@pytest.mark.slow  # four runs of two gloo ranks: a few minutes on a loaded machine
@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", [dict(graph_parallel_group_size=2), dict(stages=2, chunks=2)],
                         ids=["gp2", "pipeline2"])
def test_a_distributed_run_resumed_inside_an_epoch_is_exact(tmp_path, xyz, layout):
    kw = dict(dataset=xyz, eval_every_steps=4, **layout, **EXACT)
    full = api.train(**kw)
    ck = tmp_path / "ck"
    stopped = api.train(max_steps=7, checkpoint_dir=str(ck), checkpoint_every_steps=3, **kw)
    assert stopped.status == "completed" and stopped.steps[-1]["step"] == 7
    assert sorted(_ckpts(ck)) == ["ckpt-000001-s000001", "ckpt-000001-s000002"]
    resumed = api.train(resume=str(ck), **kw)
    _assert_same_run(resumed, full)


def test_a_checkpoint_inside_an_epoch_is_refused_in_another_layout(tmp_path, data, capsys):
    ck = tmp_path / "ck"
    api.train(data=data, max_steps=2, epochs=1, checkpoint_dir=str(ck), progress=False, **SMALL)
    assert _ckpts(ck) == ["ckpt-000000-s000002"]
    for layout in (dict(replicas=2), dict(stages=2), dict(graph_parallel_group_size=2)):  # refused before ranks start
        with pytest.raises(ConfigError, match="written inside epoch 1 \\(after 2 step\\(s\\) of it\\) by --replicas 1 "
                                              "--stages 1 --gp-size 1 \\(1 rank\\(s\\)\\); a checkpoint inside an "
                                              "epoch resumes only in the layout that wrote it"):
            api.train(data=data, max_steps=3, epochs=1, resume=str(ck), progress=False, **SMALL, **layout)
    with pytest.warns(UserWarning, match="the run ends after 1 epoch; raise --epochs"):  # not "1 epochs"
        api.train(data=data, max_steps=6, epochs=1, progress=False, **SMALL)


def test_a_run_ended_inside_its_first_epoch_prints_no_nan_epoch_time():
    from gnnpipe.core.run.results import TrainResult

    r = TrainResult(config={}, steps=[{"step": 3, "epoch": 0, "loss": 1.0}])  # --max-steps 3 in a 5-step epoch
    text = r.summary()
    assert "optimizer steps       3" in text and "nan" not in text
    assert "mean epoch time       none (no epoch completed)" in text
    r.epochs, r.mean_epoch_time_s = [{"time_s": 0.5}], 0.5
    assert "mean epoch time       500.0 ms over 1 epoch" in r.summary()


def test_val_size_without_step_evaluations_is_said_to_be_ignored():
    import warnings

    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.s2ef.steps import check_steps

    splits = {"train": list(range(8)), "val": list(range(4)), "test": list(range(4))}
    with pytest.warns(UserWarning, match="ignored: --val-size 4 \\(it sizes the evaluations at steps"):
        check_steps(TrainConfig(model="schnet", val_size=4), splits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # used: no word
        check_steps(TrainConfig(model="schnet", val_size=4, eval_every_steps=2), splits)
        check_steps(TrainConfig(model="schnet", val_size=4, max_steps=2, epochs=1, batch_size=4), splits)


def test_a_max_steps_cosine_run_spans_its_steps_and_ends_at_the_floor(data):
    """``--max-steps 20``: warm-up and cosine decay span the 20 steps (not ``--epochs``' 200 epochs of steps), so the
    last step runs at the schedule's floor (0.01 of ``--lr``)."""
    r = api.train(data=data, max_steps=20, lr=1e-3, **{**EXACT, "epochs": 200, "lr_schedule": "cosine"})
    lrs = [s["lr"] for s in r.steps]
    assert len(lrs) == 20 and lrs[-1] == pytest.approx(1e-3 * 0.01) and lrs[2] > lrs[-1]


def test_patience_counts_evaluations_at_steps(data):
    """With ``--eval-every-steps`` the run stops after ``--patience`` evaluations without a better validation force
    MAE, inside an epoch, and says so."""
    r = api.train(data=data, eval_every_steps=1, patience=1, lr=0.5, warmup_steps=0,
                  **{k: v for k, v in EXACT.items() if k != "warmup_steps"})  # a learning rate too high: no gain
    es = r.extra["early_stop"]
    assert es["unit"] == "evaluations" and es["patience"] == 1 and es["step"] < 15
    assert "stopped early         at step" in r.summary()
