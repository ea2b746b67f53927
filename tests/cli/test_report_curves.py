"""gnnpipe report RESULT.json of one training run: its learning curves (PNG) and a table of its evaluated points,
against epochs or optimizer steps, for S2EF runs (every validation set) and node classification."""

from __future__ import annotations

import json
import sys

import pytest

from gnnpipe.cli.main import main
from gnnpipe.experiments.curves import curve_points, validation_sets
from tests.tasks.s2ef.toy import write_extxyz

S2EF = {"model": "schnet", "layers": 1, "hidden": 8, "cutoff": 4.0, "max_neighbors": 12, "batch_size": 4,
        "model_args": {"num_filters": 8, "num_gaussians": 8}, "log_every": 0, "progress": False}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Results of real short runs written as ``gnnpipe train --out`` writes them: S2EF by epochs, S2EF by steps
    (evaluated every 2 steps), and node classification (evaluated every 2 epochs)."""
    from gnnpipe import api

    folder = tmp_path_factory.mktemp("curves")
    data = write_extxyz(folder / "toy.extxyz", 12, seed=0)
    paths = {}
    for name, kw in (("epochs", {"epochs": 3}), ("steps", {"epochs": 3, "max_steps": 5, "eval_every_steps": 2})):
        paths[name] = folder / f"{name}.json"
        api.train(dataset=data, **S2EF, **kw).save(paths[name])
    paths["nodes"] = folder / "nodes.json"
    api.train(dataset="synthetic", model="gcn", layers=2, hidden=8, epochs=4, eval_every=2, log_every=0,
              progress=False).save(paths["nodes"])
    return paths


def _table(md: str) -> list[list[str]]:
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in rows]


def test_s2ef_run_by_epochs(runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    result = json.loads(runs["epochs"].read_text())
    assert main(["report", str(runs["epochs"]), "--out-dir", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| epoch | loss |" in capsys.readouterr().out  # the table is printed too
    assert (tmp_path / "r" / "curves.png").read_bytes()[:8] == PNG
    assert "against epochs" in md and "![curves](curves.png)" in md
    head, *rows = _table(md)
    assert head == ["epoch", "loss", "lr", "val energy MAE (meV)", "val force MAE (eV/Å)"]
    assert len(rows) == len(result["epochs"]) == 3
    for row, rec in zip(rows, result["epochs"]):
        assert row[0].split()[0].strip("*") == str(rec["epoch"] + 1)  # counted from 1, as the run's lines
        assert row[1] == f"{rec['loss']:.4f}" and row[2] == f"{rec['lr']:.3g}"
        assert row[3] == f"{1000 * rec['val_energy_mae']:.1f}" and row[4] == f"{rec['val_force_mae']:.4f}"
    best = min(range(3), key=lambda i: result["epochs"][i]["val_force_mae"])
    assert [i for i, r in enumerate(rows) if "(best)" in r[0]] == [best]


def test_s2ef_run_by_steps(runs, tmp_path):
    pytest.importorskip("matplotlib")
    result = json.loads(runs["steps"].read_text())
    evaluated = [s for s in result["steps"] if "val_force_mae" in s]
    assert [s["step"] for s in evaluated] == [2, 4, 5]
    points = curve_points(result)
    assert points["unit"] == "step" and points["sets"] == ["val"]
    assert main(["report", str(runs["steps"]), "--out-dir", str(tmp_path / "r"), "--title", "by steps"]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.startswith("# by steps") and "against optimizer steps" in md
    assert (tmp_path / "r" / "curves.png").read_bytes()[:8] == PNG
    head, *rows = _table(md)
    assert head[:4] == ["step", "epoch", "loss", "lr"] and head[-1] == "evaluated on"
    steps = [r for r in rows if "epoch end" not in r[-1]]
    assert [r[0].split()[0].strip("*") for r in steps] == ["2", "4", "5"]
    for row, rec in zip(steps, evaluated):
        assert row[1] == str(rec["epoch"] + 1) and row[2] == f"{rec['loss']:.4f}"
        assert row[5] == f"{rec['val_force_mae']:.4f}" and row[-1] == f"first {rec['val_size']} structures"
    # the epoch that ended inside the run (3 steps of 4 structures each: epoch 1 ends at step 3) is drawn there,
    # evaluated on the whole split
    ends = [r for r in rows if "epoch end" in r[-1]]
    assert [r[0] for r in ends] == ["3"] and ends[0][5] == f"{result['epochs'][0]['val_force_mae']:.4f}"


def test_every_validation_set_is_drawn(runs, tmp_path):
    """Records carrying a second validation set (``val_<name>_*``) get its columns and lines beside the first's."""
    pytest.importorskip("matplotlib")
    result = json.loads(runs["epochs"].read_text())
    for k, rec in enumerate(result["epochs"]):
        rec.update(val_ood_energy_mae=0.5 + k, val_ood_force_mae=0.25 + k, val_ood_force_cos=0.9)
    path = tmp_path / "two.json"
    path.write_text(json.dumps(result))
    assert validation_sets(result["epochs"]) == ["val", "ood"]
    assert main(["report", str(path), "--out-dir", str(tmp_path / "r")]) == 0
    head, *rows = _table((tmp_path / "r" / "report.md").read_text())
    assert head[3:] == ["val energy MAE (meV)", "val force MAE (eV/Å)", "ood energy MAE (meV)",
                        "ood force MAE (eV/Å)"]
    assert [r[5] for r in rows] == ["500.0", "1500.0", "2500.0"] and [r[6] for r in rows] == ["0.2500", "1.2500",
                                                                                              "2.2500"]
    assert (tmp_path / "r" / "curves.png").read_bytes()[:8] == PNG


def test_node_classification_run(runs, tmp_path):
    pytest.importorskip("matplotlib")
    result = json.loads(runs["nodes"].read_text())
    assert main(["report", str(runs["nodes"])]) == 0  # default folder: beside the result
    out = runs["nodes"].with_name("nodes.report")
    md = (out / "report.md").read_text()
    assert (out / "curves.png").read_bytes()[:8] == PNG
    head, *rows = _table(md)
    assert head == ["epoch", "loss", "val loss", "train acc %", "val acc %", "test acc %"]  # no lr recorded
    evaluated = [r for r in result["epochs"] if r.get("val_acc") is not None]
    assert len(rows) == len(evaluated) == 2
    for row, rec in zip(rows, evaluated):
        assert row[0].split()[0].strip("*") == str(rec["epoch"] + 1)
        assert row[4] == f"{100 * rec['val_acc']:.2f}" and row[5] == f"{100 * rec['test_acc']:.2f}"


def test_without_matplotlib_the_table_alone(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["report", str(runs["epochs"]), "--out-dir", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "matplotlib is not installed" in err and not (tmp_path / "r" / "curves.png").exists()
    md = (tmp_path / "r" / "report.md").read_text()
    assert "matplotlib is not installed" in md and len(_table(md)) == 4


def test_bad_results_get_one_line(runs, tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"config": {"model": "gcn"}, "epochs": [{"epoch": 0}]}))
    assert main(["report", str(empty)]) == 2
    assert "nothing to draw" in capsys.readouterr().err
    assert main(["report", str(runs["epochs"]), str(runs["nodes"])]) == 2
    assert "one training result at a time" in capsys.readouterr().err
