"""The OC20 workflow's data: given validation and test sets (``--val-dataset``, ``--test-dataset``), each structure
trained on the labels it has (force-only, energy-only, mixed sets), and per-element energy references."""

from __future__ import annotations

import math

import ase.io
import numpy as np
import pytest
import torch
from ase.calculators.singlepoint import SinglePointCalculator

from gnnpipe import api
from gnnpipe.cli.main import main

from .toy import emt_clusters, write_extxyz

SMALL = dict(model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=8, batch_size=4, warmup_steps=1,
             dtype="float64", lr=5e-3, model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0,
             progress=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("given")
    return {name: write_extxyz(d / f"{name}.extxyz", n, seed=s)
            for name, n, s in (("train", 24, 1), ("val_id", 6, 2), ("ood", 6, 3), ("test", 5, 4))}


def test_given_validation_sets_are_reported_by_name_and_the_first_chooses_the_best(files):
    r = api.train(dataset=files["train"], val_datasets=[files["val_id"], files["ood"]], test_dataset=files["test"],
                  epochs=4, **SMALL)
    plan = r.extra["plan"]["structures"]
    assert plan == {"train": 24, "val": 6, "val_ood": 6, "test": 5}  # the training file whole
    for rec in r.epochs:
        for prefix in ("val_", "val_ood_", "test_"):
            assert math.isfinite(rec[f"{prefix}force_mae"]), (prefix, rec)
    best = min(range(len(r.epochs)), key=lambda e: (r.epochs[e]["val_force_mae"], r.epochs[e]["val_loss"]))
    assert r.best_epoch == best  # chosen on the first validation set, whatever the second says
    assert r.best_metrics["val_ood_force_mae"] == r.epochs[best]["val_ood_force_mae"]
    assert "val_ood at best val" in r.summary() and "test at best val" in r.summary()



def test_the_csv_log_has_the_columns_of_every_validation_set(files, tmp_path):
    import csv

    log = tmp_path / "log.csv"
    r = api.train(dataset=files["train"], val_datasets=[files["val_id"], files["ood"]], test_dataset=files["test"],
                  epochs=2, max_steps=8, eval_every_steps=3, log_csv=str(log), **SMALL)
    rows = list(csv.DictReader(log.open()))
    assert {"val_force_mae", "val_ood_force_mae", "val_ood_energy_mae", "val_ood_efwt", "test_efwt"} <= set(rows[0])
    at_steps = [row for row in rows if row["step"] and row["val_ood_force_mae"]]
    assert [int(row["step"]) for row in at_steps] == [3, 6, 8]  # the step evaluations, each set by its name
    assert float(at_steps[-1]["val_ood_force_mae"]) == pytest.approx(r.steps[-1]["val_ood_force_mae"])

def test_a_long_set_name_stays_apart_from_its_numbers_in_the_summary():
    from gnnpipe.core.run.results import _regression_lines

    lines = _regression_lines({"val_force_mae": 0.5, "val_ood_ads_force_mae": 0.25, "test_force_mae": 0.75}, 0)
    assert lines[0].startswith("best val              force MAE 0.5 eV/Å")  # the numbers at column 22
    assert lines[1] == "val_ood_ads at best val force MAE 0.25 eV/Å" and lines[2].startswith("test at best val      f")

def test_without_a_test_set_no_test_metric_is_claimed(files):
    r = api.train(dataset=files["train"], val_datasets=[files["val_id"]], epochs=1, **SMALL)
    assert "test_force_mae" not in r.epochs[-1] and "test at best val" not in r.summary()


def test_the_cli_takes_repeated_val_datasets(files, tmp_path, capsys):
    assert main(["train", "--dataset", files["train"], "--val-dataset", files["val_id"], "--val-dataset",
                 files["ood"], "--test-dataset", files["test"], "--model", "schnet", "--layers", "1", "--hidden", "8",
                 "--cutoff", "4", "--epochs", "1", "--no-progress", "--out", str(tmp_path / "r.json")]) == 0
    err = capsys.readouterr()
    assert "train 24, val 6, val_ood 6, test 5" in err.err and "val_ood at best val" in err.out
    assert main(["train", "--dataset", files["train"], "--val-dataset", str(tmp_path / "nope.extxyz"),
                 "--model", "schnet", "--no-progress"]) == 2
    assert "--val-dataset" in capsys.readouterr().err


def _relabelled(path, out, keep: str):
    """The structures of ``path`` with only their ``keep`` label (``"forces"`` or ``"energy"``)."""
    frames = ase.io.read(path, ":")
    for a in frames:
        e, f = a.get_potential_energy(), a.get_forces()
        a.calc = SinglePointCalculator(a, **({"forces": f} if keep == "forces" else {"energy": e}))
    ase.io.write(out, frames, format="extxyz")
    return str(out)


def test_a_force_only_set_trains_its_forces_and_claims_no_energy(files, tmp_path):
    path = _relabelled(files["train"], tmp_path / "forces.extxyz", "forces")
    r = api.train(dataset=path, epochs=6, **SMALL)
    maes = [e["val_force_mae"] for e in r.epochs]
    assert maes[-1] < maes[0] and all(math.isnan(e["val_energy_mae"]) for e in r.epochs)
    assert "energy MAE" not in r.summary().splitlines()[0] and "force MAE" in r.summary()


def test_an_energy_only_set_is_selected_on_its_energies(files, tmp_path):
    path = _relabelled(files["train"], tmp_path / "energy.extxyz", "energy")
    r = api.train(dataset=path, epochs=3, **SMALL)
    assert r.extra["plan"]["monitor"] == "val_energy_mae" and r.best_epoch >= 0
    assert all(math.isnan(e["val_force_mae"]) for e in r.epochs)


def test_a_mixed_set_trains_each_structure_on_its_labels():
    """Half the structures without energies, a few without forces: the loss is that of the labels present; it
    equals the full set's loss with the missing terms left out (float64)."""
    data = emt_clusters(12, seed=5)
    for k, d in enumerate(data):
        if k % 2:
            del d.energy
        elif k % 5 == 0:
            del d.forces
    r = api.train(data=data, epochs=2, **SMALL)
    assert all(math.isfinite(e["loss"]) for e in r.epochs)


def test_an_energy_reference_file_trains_adsorption_like_targets(files, tmp_path):
    """``--energy-reference none`` and a file of per-element energies give other targets than the fitted linear
    reference, so other losses; the reference is recorded in the model file's normaliser."""
    import json

    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"Cu": -0.1, "Ni": -0.2}))
    runs = {ref: api.train(dataset=files["train"], epochs=1, energy_reference=ref, **SMALL)
            for ref in ("linear", "none", str(refs))}
    losses = {k: v.epochs[0]["loss"] for k, v in runs.items()}
    assert len(set(losses.values())) == 3
    coef = runs[str(refs)].model.meta["task_meta"]["normalizer"]["coef"]
    assert coef[29] == -0.1 and coef[28] == -0.2 and np.count_nonzero(coef) == 2
    assert set(runs["none"].model.meta["task_meta"]["normalizer"]["coef"]) == {0.0}
    with pytest.raises(Exception, match="no such file"):
        api.train(dataset=files["train"], epochs=1, energy_reference=str(tmp_path / "missing.json"), **SMALL)


def test_the_pipeline_trains_partial_labels_as_the_single_process():
    data = emt_clusters(12, seed=6, dtype=torch.float64)
    for k, d in enumerate(data):
        if k % 3 == 0:
            del d.energy
    one = api.train(data=data, epochs=1, **SMALL)
    two = api.train(data=data, epochs=1, stages=2, chunks=2, timeout_s=120, **SMALL)
    assert two.epochs[0]["loss"] == pytest.approx(one.epochs[0]["loss"], rel=1e-9)
