"""Fresh-user review fixes of the command line (commit a687f0b and after): one-line errors for missing and unusable
files, model files that are not, ``compare`` with nothing to run, ``predict`` finding a model's data from any folder,
``--keep`` on a model file, ``--num-classes 1``."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from gnnpipe import models
from gnnpipe.cli.compare import layouts
from gnnpipe.cli.main import main
from gnnpipe.cli.predict import resolve_data_paths
from gnnpipe.data import synthetic_graph
from gnnpipe.errors import ConfigError

TRAIN = ["--model", "gcn", "--layers", "2", "--hidden", "8", "--epochs", "3", "--patience", "0", "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run trained in ``run/`` on ``run/data/g.pt`` given as ``--dataset g.pt --root data`` (relative), its
    checkpoint folder ``run/ck`` (best weights), ``run/m.pt`` exported from it, and ``run/old.pt``: the same model
    without the recorded absolute paths (a model file written before they were recorded)."""
    d = tmp_path_factory.mktemp("run")
    (d / "data").mkdir()
    torch.save(synthetic_graph(num_nodes=150, num_features=8, num_classes=3, seed=1, train_per_class=10,
                               val_per_class=10), d / "data" / "g.pt")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["train", "--dataset", "g.pt", "--root", "data", *TRAIN, "--checkpoint-dir", "ck",
                         "--keep", "best"]) == 0
            assert main(["export", "ck", "--out", "m.pt"]) == 0
    finally:
        os.chdir(cwd)
    m = models.load(d / "m.pt")
    assert m.meta["data_paths"] == {"root": str((d / "data").resolve())} and m.meta["config"]["root"] == "data"
    models.save(m, d / "old.pt", meta={k: v for k, v in m.meta.items() if k != "data_paths"})
    return d


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gnnpipe: error: ") and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------------------------- files (main)
def test_an_unusable_output_path_is_one_line_naming_the_file(trained, tmp_path, capsys):
    """An OSError about a path the user gave (here: --out under a file) is one line naming that path, exit 2."""
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["export", str(trained / "ck"), "--out", str(blocker / "m.pt")]) == 2
    assert _one_error_line(capsys.readouterr().err) == f"gnnpipe: error: {blocker}: File exists"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["predict", str(trained / "m.pt"), "--out", str(blocker / "p.pt")]) == 2
    assert _one_error_line(capsys.readouterr().err) == f"gnnpipe: error: {blocker}: File exists"


@pytest.mark.parametrize("exc", [FileNotFoundError(2, "No such file or directory", "/no/such/file.toml"),
                                 IsADirectoryError(21, "Is a directory", "/some/folder"),
                                 PermissionError(13, "Permission denied", "/root/x.json")])
def test_main_maps_file_errors_to_one_line(monkeypatch, capsys, exc):
    from gnnpipe.cli import report

    def run(args):
        raise exc

    monkeypatch.setattr(report, "run", run)
    assert main(["report", "r.jsonl"]) == 2
    assert _one_error_line(capsys.readouterr().err) == f"gnnpipe: error: {exc.filename}: {exc.strerror}"


def test_main_lets_an_os_error_about_no_path_through(monkeypatch):
    """An OSError that names no file is not about the user's input: a bug, so its traceback stays."""
    from gnnpipe.cli import report

    def run(args):
        raise FileNotFoundError("internal")

    monkeypatch.setattr(report, "run", run)
    with pytest.raises(FileNotFoundError, match="internal"):
        main(["report", "r.jsonl"])


# ---------------------------------------------------------------------------------------------- models/io
def test_loading_a_missing_file_or_one_that_is_not_a_model(trained, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"no model file .*nothing\.pt; write one with `gnnpipe export CHECKPOINT "
                                          r"--out nothing\.pt`"):
        models.load(tmp_path / "nothing.pt")
    assert main(["predict", str(tmp_path / "nothing.pt")]) == 2
    assert "no model file" in _one_error_line(capsys.readouterr().err)
    (tmp_path / "text.pt").write_text("not a torch file\n")
    torch.save({"weight": torch.ones(2)}, tmp_path / "state.pt")  # a plain state dict
    torch.save(torch.ones(2), tmp_path / "tensor.pt")
    for name in ("text.pt", "state.pt", "tensor.pt"):
        with pytest.raises(ConfigError, match=rf"{name} is not a gnnpipe model file.*gnnpipe export"):
            models.load(tmp_path / name)
    assert main(["predict", str(tmp_path / "text.pt")]) == 2
    assert "is not a gnnpipe model file" in _one_error_line(capsys.readouterr().err)
    with pytest.raises(ConfigError, match=r"is a folder \(a checkpoint\?\); export it first"):
        models.load(trained / "ck")


def test_saving_to_a_folder_is_refused(trained, tmp_path, capsys):
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(ConfigError, match=rf"{folder} is a folder; give the model file to write \(e\.g\. "
                                          rf"{folder / 'model.pt'}\)"):
        models.save(models.load(trained / "m.pt"), folder)
    assert main(["export", str(trained / "ck"), "--out", str(folder)]) == 2
    assert "is a folder; give the model file to write" in _one_error_line(capsys.readouterr().err)
    assert list(folder.iterdir()) == []


# ---------------------------------------------------------------------------------------------- compare
def test_compare_with_nothing_to_run_says_so(capsys):
    with pytest.raises(ConfigError, match=r"nothing to compare: 3 ranks have no hybrid layout W x S with W, S > 1; "
                                          r"use a rank count with one \(e\.g\. --ranks 4\) or add gp/gnnpipe"):
        layouts(3, None, ["hybrid"])
    with pytest.raises(ConfigError, match="nothing to compare: --modes names none of gp, gnnpipe, hybrid"):
        layouts(4, None, [])
    assert layouts(3, None, ["gp", "hybrid"]) == {"gp": (3, 1)}  # the hybrid alone is skipped, with a note
    assert "skipping the hybrid" in capsys.readouterr().err
    assert main(["compare", "--ranks", "3", "--modes", "hybrid", "--num-nodes", "100", "--epochs", "1",
                 "--no-progress"]) == 2
    assert "nothing to compare" in _one_error_line(capsys.readouterr().err)


# ---------------------------------------------------------------------------------------------- predict's data
def _train_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("train"))


@pytest.mark.parametrize("model", ["m.pt", "old.pt", "ck"])
def test_predict_finds_a_relative_root_from_another_folder(trained, tmp_path, monkeypatch, capsys, model):
    """--root data (relative) at training: predict from an unrelated folder finds it through the recorded absolute
    root (m.pt, ck) or, for a file without it, against the model file's folder (old.pt)."""
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["predict", str(trained / model)]) == 0
        here = capsys.readouterr().out
        monkeypatch.chdir(trained)
        assert main(["predict", model]) == 0
    assert _train_line(here) == _train_line(capsys.readouterr().out)  # the same graph, the same accuracy


def test_a_moved_model_file_finds_its_data_by_the_recorded_root_or_names_every_place_it_looked(
        trained, tmp_path, monkeypatch, capsys):
    """Model files moved away from their data: one with the recorded absolute root still finds it; one without
    (written before it was recorded) fails with an error naming the places tried."""
    (tmp_path / "moved").mkdir()
    for name in ("m.pt", "old.pt"):
        (tmp_path / "moved" / name).write_bytes((trained / name).read_bytes())
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["predict", "moved/m.pt"]) == 0
    capsys.readouterr()
    assert main(["predict", "moved/old.pt"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert "the dataset file 'g.pt' of the model's training run is in none of the places looked at (" in err
    for place in (tmp_path / "moved" / "g.pt", tmp_path / "g.pt", tmp_path / "moved" / "data" / "g.pt",
                  tmp_path / "data" / "g.pt"):
        assert str(place) in err
    assert err.endswith("give --dataset FILE")


def test_resolve_data_paths_for_a_named_dataset(tmp_path, monkeypatch):
    base, cwd = tmp_path / "models", tmp_path / "cwd"
    for d in (base / "data", cwd / "data2"):
        d.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    cfg = {"dataset": "Cora", "root": "data"}
    assert resolve_data_paths(cfg, {}, base)["root"] == str(base / "data")  # the model's folder first
    assert resolve_data_paths({"dataset": "Cora", "root": "data2"}, {}, base)["root"] == str(cwd / "data2")
    rec = {"data_paths": {"root": str(cwd / "data2")}}
    assert resolve_data_paths(cfg, rec, base)["root"] == str(cwd / "data2")  # the recorded absolute root wins
    gone = {"data_paths": {"root": str(tmp_path / "gone")}}
    assert resolve_data_paths(cfg, gone, base)["root"] == str(base / "data")  # ... while it exists
    with pytest.raises(ConfigError, match=rf"the data root 'nowhere' of the model's training run is in none of the "
                                          rf"places looked at \({base / 'nowhere'}, {cwd / 'nowhere'}\); give --root "
                                          rf"\(the folder holding Cora\)"):
        resolve_data_paths({"dataset": "Cora", "root": "nowhere"}, {}, base)
    given = {"dataset": "Cora", "root": "nowhere"}
    assert resolve_data_paths(given, {}, base, root_given=True) == given  # the user's --root stays as typed
    assert resolve_data_paths({"dataset": None, "root": "nowhere"}, {}, base)["root"] == "nowhere"  # synthetic


# ---------------------------------------------------------------------------------------------- predict --keep
def test_keep_on_a_model_file_warns_that_it_holds_one_set(trained, capsys):
    with pytest.warns(UserWarning, match=r"--keep last has no effect on a model file: .*m\.pt holds one set of "
                                         r"weights only \(the best weights of its run\); predict from the checkpoint "
                                         r"folder to choose, or export it again with --keep last"):
        assert main(["predict", str(trained / "m.pt"), "--keep", "last"]) == 0
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert main(["predict", str(trained / "m.pt"), "--keep", "best"]) == 0  # what it holds: nothing to say
        assert main(["predict", str(trained / "m.pt")]) == 0
        assert main(["predict", str(trained / "ck"), "--keep", "last"]) == 0  # a checkpoint holds both
    assert not [x for x in w if "--keep" in str(x.message)]


# ---------------------------------------------------------------------------------------------- --num-classes
def test_num_classes_1_is_refused_at_the_command_line(capsys):
    assert main(["train", "--num-classes", "1", "--num-nodes", "50", "--epochs", "1", "--no-progress"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "gnnpipe: error: num_classes must be >= 2 (a classifier needs at least two classes), got 1; "
        "use --num-classes 2 or more")


# ---------------------------------------------------------------------------------------------- second review
def test_predict_refuses_to_guess_the_graph_of_a_model_trained_on_a_python_data(tmp_path, capsys):
    """A model trained on a ``Data`` passed from Python records no dataset; ``predict`` without ``--dataset`` says so
    instead of scoring the synthetic default graph, and with ``--dataset FILE`` predicts on that file."""
    from gnnpipe import api

    g = synthetic_graph(num_nodes=120, num_features=6, num_classes=3, seed=2, train_per_class=10, val_per_class=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = api.train(model="gcn", layers=2, hidden=8, epochs=2, patience=0, progress=False, data=g)
    assert r.model.meta["data_given"] is True and r.model.meta["data_paths"] == {}
    models.save(r.model, tmp_path / "m.pt")
    assert main(["predict", str(tmp_path / "m.pt")]) == 2
    assert "passed from Python" in _one_error_line(capsys.readouterr().err)
    torch.save(g, tmp_path / "g.pt")
    out = tmp_path / "p.pt"
    assert main(["predict", str(tmp_path / "m.pt"), "--dataset", str(tmp_path / "g.pt"), "--out", str(out)]) == 0
    assert torch.load(out)["pred"].shape == (120,)


def test_train_names_only_the_ignored_flags_given_and_warns_about_checkpoint_every_without_a_dir(tmp_path):
    from gnnpipe.cli.main import main as cli

    args = ["train", "--num-nodes", "200", *TRAIN, "--out", str(tmp_path / "r.json")]
    with pytest.warns(UserWarning) as rec:
        assert cli([*args, "--ranks", "2", "--checkpoint-every", "1"]) == 0
    msgs = [str(w.message) for w in rec]
    assert any(m.startswith("ignored: --ranks (") for m in msgs), msgs  # not "--ranks, --hardware"
    assert any(m.startswith("ignored: --checkpoint-every 1 (no --checkpoint-dir") for m in msgs), msgs


def test_plan_of_an_atomistic_job_names_an_ignored_gp_size():
    import warnings

    from gnnpipe.cli.train import warn_layout_flags
    from gnnpipe.core.settings.config import TrainConfig

    names = ("ways", "stages", "chunks", "scheduler", "gp-size")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        warn_layout_flags(TrainConfig(graph_parallel_group_size=2), "plan chooses", names=names)
        warn_layout_flags(TrainConfig(), "plan chooses", names=names)
    assert [str(w.message) for w in got] == ["ignored: --gp-size (plan chooses)"]


def test_report_on_a_train_result_without_records_says_so(tmp_path, capsys):
    """A ``gnnpipe train --out`` file is one JSON document, read as a run's learning curves (not as a study's empty
    results); one without a loss or a metric to draw is refused with one line."""
    import json

    res = tmp_path / "run.json"
    res.write_text(json.dumps({"config": {"model": "gcn"}, "epochs": [{"epoch": 0}]}, indent=1))
    assert main(["report", str(res)]) == 2
    err = capsys.readouterr().err
    assert "nothing to draw" in _one_error_line(err) and "skipped" not in err
