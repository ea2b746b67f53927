"""gnnpipe evaluate --task s2ef / is2re and gnnpipe predict --out X.npz on a briefly trained float64 SchNet: the
metrics equal those computed from predict's output and those training reports for the same structures; per-element
and per-size numbers add up; a set is scored on the labels it has; the .npz is fairchem's S2EF layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnnpipe.cli.main import main

TRAIN = {"model": "schnet", "layers": 1, "hidden": 8, "cutoff": 4.0, "max_neighbors": 12, "batch_size": 4,
         "epochs": 2, "dtype": "float64", "warmup_steps": 2, "model_args": {"num_filters": 8, "num_gaussians": 8}}


def _write(path, atoms, sids=True):
    """Write OC20-like frames as extended XYZ with ``sid`` / ``fid`` in their info (as OC20's S2EF frames have)."""
    import ase.io

    frames = []
    for k, a in enumerate(atoms):
        a = a.copy()
        a.calc = atoms[k].calc
        if sids:
            a.info.update(sid=1000 + k // 2, fid=k % 2)
        frames.append(a)
    ase.io.write(str(path), frames, format="extxyz")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``(model file, structure file, training result, config)``: a float64 SchNet trained for two epochs on 16
    OC20-like frames read from an extended XYZ file (several sizes, fixed bottom layers, four elements)."""
    from gnnpipe import api
    from gnnpipe.data.atoms import generate_oc20_like
    from gnnpipe.models import save

    folder = tmp_path_factory.mktemp("evaluate")
    atoms = generate_oc20_like(10, seed=1) + generate_oc20_like(6, seed=2, size=(3, 2, 3))
    data = _write(folder / "oc20.extxyz", atoms)
    r = api.train(dataset=str(data), log_every=0, progress=False, **TRAIN)
    path = folder / "schnet.pt"
    save(r.model, path)
    return path, data, r


def _labels(path):
    from gnnpipe.data.atoms import read_structures

    return read_structures(str(path), dtype=torch.float64)


def test_evaluate_equals_metrics_of_predict_output(trained, tmp_path, capsys):
    model, data, _ = trained
    assert main(["predict", str(model), "--dataset", str(data), "--out", str(tmp_path / "p.pt")]) == 0
    assert main(["evaluate", "--task", "s2ef", str(model), "--dataset", str(data), "--out",
                 str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    assert "energy MAE" in out and "force MAE" in out and "EFwT" in out
    m = json.loads((tmp_path / "e.json").read_text())
    pred = torch.load(tmp_path / "p.pt")
    structures = _labels(data)
    e_err = np.array([abs(float(pred["energy"][i]) - float(d.energy)) for i, d in enumerate(structures)])
    natoms = np.array([d.z.numel() for d in structures])
    free = [~d.fixed for d in structures]
    f_err = [(pred["forces"][i] - d.forces)[free[i]].abs().numpy() for i, d in enumerate(structures)]
    cos = np.concatenate([torch.nn.functional.cosine_similarity(pred["forces"][i][free[i]], d.forces[free[i]],
                                                                dim=-1).numpy() for i, d in enumerate(structures)])
    efwt = np.mean([(e_err[i] < 0.02) and (f_err[i].max() < 0.03) for i in range(len(structures))])
    assert m["task"] == "s2ef" and m["structures"] == len(structures) == 16
    assert m["free_atoms"] == int(sum(int(f.sum()) for f in free)) < int(natoms.sum())  # fixed atoms left out
    assert m["energy_mae"] == pytest.approx(e_err.mean(), abs=1e-9)
    assert m["energy_mae_per_atom"] == pytest.approx((e_err / natoms).mean(), abs=1e-9)
    assert m["force_mae"] == pytest.approx(np.concatenate(f_err).mean(), abs=1e-9)
    assert m["force_cos"] == pytest.approx(cos.mean(), abs=1e-9)
    assert m["efwt"] == pytest.approx(efwt, abs=1e-12) and m["efwt_thresholds"] == {"energy": 0.02, "force": 0.03}


def test_evaluate_equals_what_training_reports(trained, tmp_path):
    """The training run's test split written to a file and evaluated: the run's own test metrics."""
    import ase.io

    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.s2ef import S2EF

    model, data, r = trained
    test = S2EF().load(TrainConfig(dataset=str(data), **TRAIN)).splits["test"].tolist()
    frames = ase.io.read(str(data), ":")
    ase.io.write(str(tmp_path / "test.extxyz"), [frames[i] for i in test])
    assert main(["evaluate", "--task", "s2ef", str(model), "--dataset", str(tmp_path / "test.extxyz"), "--out",
                 str(tmp_path / "t.json")]) == 0
    m = json.loads((tmp_path / "t.json").read_text())
    for k in ("energy_mae", "energy_mae_per_atom", "force_mae", "force_cos", "efwt"):
        assert m[k] == pytest.approx(r.best_metrics[f"test_{k}"], abs=1e-9), k


def test_per_element_and_per_size_numbers_add_up(trained, tmp_path):
    model, data, _ = trained
    assert main(["evaluate", "--task", "s2ef", str(model), "--dataset", str(data), "--out",
                 str(tmp_path / "e.json")]) == 0
    m = json.loads((tmp_path / "e.json").read_text())
    el = m["per_element"]
    assert len(el) >= 3 and sum(r["free_atoms"] for r in el.values()) == m["free_atoms"]
    assert sum(r["free_atoms"] * r["force_mae"] for r in el.values()) == pytest.approx(m["free_atoms"] * m["force_mae"],
                                                                                      rel=1e-12)
    assert sum(r["free_atoms"] * r["force_cos"] for r in el.values()) == pytest.approx(m["free_atoms"] * m["force_cos"],
                                                                                      rel=1e-12)
    sizes = m["per_size"]
    assert len(sizes) >= 2 and sum(r["structures"] for r in sizes) == m["structures"]
    assert sum(r["structures"] * r["energy_mae"] for r in sizes) == pytest.approx(m["structures"] * m["energy_mae"],
                                                                                 rel=1e-12)
    assert sum(r["free_atoms"] * r["force_mae"] for r in sizes) == pytest.approx(m["free_atoms"] * m["force_mae"],
                                                                                rel=1e-12)
    assert sum(r["efwt_structures"] * r["efwt"] for r in sizes) == pytest.approx(m["structures"] * m["efwt"])


def _relabelled(src, dst, keep: str):
    """``src``'s frames with only their forces (``keep="forces"``) or only their energy (``"energy"``)."""
    import ase.io
    from ase.calculators.singlepoint import SinglePointCalculator

    frames = []
    for a in ase.io.read(str(src), ":"):
        e, f = a.get_potential_energy(), a.get_forces(apply_constraint=False)
        a.calc = SinglePointCalculator(a, **({"forces": f} if keep == "forces" else {"energy": e}))
        frames.append(a)
    ase.io.write(str(dst), frames, format="extxyz")
    return dst


def test_a_set_is_scored_on_the_labels_it_has(trained, tmp_path, capsys):
    model, data, _ = trained
    assert main(["evaluate", "--task", "s2ef", str(model), "--dataset", str(data), "--out",
                 str(tmp_path / "both.json")]) == 0
    both = json.loads((tmp_path / "both.json").read_text())
    capsys.readouterr()
    forces_only = _relabelled(data, tmp_path / "forces.extxyz", "forces")
    assert main(["evaluate", "--task", "s2ef", str(model), "--dataset", str(forces_only), "--out",
                 str(tmp_path / "f.json")]) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "f.json").read_text())
    assert m["energy_structures"] == 0 and m["force_structures"] == 16
    assert not {"energy_mae", "energy_mae_per_atom", "efwt"} & set(m)
    assert m["force_mae"] == pytest.approx(both["force_mae"], abs=1e-12)
    assert "(no structure has the labels)" in out and "force MAE" in out
    energy_only = _relabelled(data, tmp_path / "energy.extxyz", "energy")
    assert main(["evaluate", "--task", "s2ef", str(model), "--dataset", str(energy_only), "--out",
                 str(tmp_path / "e.json")]) == 0
    m = json.loads((tmp_path / "e.json").read_text())
    assert m["force_structures"] == 0 and not {"force_mae", "force_cos", "efwt", "per_element"} & set(m)
    assert m["energy_mae"] == pytest.approx(both["energy_mae"], abs=1e-12)
    # nothing labelled: refused with one line
    import ase.io

    bare = ase.io.read(str(data), ":")
    for a in bare:
        a.calc = None
    ase.io.write(str(tmp_path / "bare.extxyz"), bare)
    assert main(["evaluate", "--task", "s2ef", str(model), "--dataset", str(tmp_path / "bare.extxyz")]) == 2
    assert "no structure has an energy or forces label" in capsys.readouterr().err


def test_predict_npz_is_fairchems_layout(trained, tmp_path):
    model, data, _ = trained
    assert main(["predict", str(model), "--dataset", str(data), "--out", str(tmp_path / "p.pt")]) == 0
    assert main(["predict", str(model), "--dataset", str(data), "--out", str(tmp_path / "p.npz")]) == 0
    assert main(["predict", str(model), "--dataset", str(data), "--out", str(tmp_path / "all.npz"), "--npz-atoms",
                 "all", "--npz-dtype", "float64"]) == 0
    pt = torch.load(tmp_path / "p.pt")
    structures = _labels(data)
    natoms = np.array([d.z.numel() for d in structures])
    z = np.load(tmp_path / "p.npz")
    assert sorted(z.files) == ["chunk_idx", "energy", "forces", "ids", "natoms"]
    assert z["ids"].tolist() == [f"{1000 + k // 2}_{k % 2}" for k in range(16)]  # fairchem's "sid_fid"
    assert z["energy"].dtype == np.float32 and z["forces"].dtype == np.float32
    np.testing.assert_array_equal(z["energy"], pt["energy"].numpy().astype(np.float32))
    np.testing.assert_array_equal(z["natoms"], natoms)
    free = [(~d.fixed).numpy() for d in structures]
    np.testing.assert_array_equal(z["chunk_idx"], np.cumsum([f.sum() for f in free])[:-1])
    parts = np.split(z["forces"], z["chunk_idx"])
    assert len(parts) == 16
    for i, p in enumerate(parts):  # the free atoms' forces, as fairchem writes them
        np.testing.assert_array_equal(p, pt["forces"][i].numpy()[free[i]].astype(np.float32))
    a = np.load(tmp_path / "all.npz")
    np.testing.assert_array_equal(a["chunk_idx"], np.cumsum(natoms)[:-1])
    np.testing.assert_array_equal(a["energy"], pt["energy"].numpy())
    for i, p in enumerate(np.split(a["forces"], a["chunk_idx"])):
        np.testing.assert_array_equal(p, pt["forces"][i].numpy())


@pytest.fixture(scope="module")
def is2rs_files(tmp_path_factory):
    from gnnpipe.data.atoms import generated_file
    from gnnpipe.data.atoms.generate import reference_path

    path = generated_file("oc20-is2rs", 3, seed=2, out=tmp_path_factory.mktemp("is2rs") / "is2rs.extxyz")
    return path, reference_path(path)


def test_is2re_relaxed_energies(trained, is2rs_files, tmp_path, capsys):
    model, _, _ = trained
    initial, reference = is2rs_files
    assert main(["evaluate", "--task", "is2re", str(model), "--dataset", str(initial), "--reference",
                 str(reference), "--steps", "3", "--no-progress", "--save-relaxed", str(tmp_path / "r.extxyz"),
                 "--out", str(tmp_path / "is2re.json")]) == 0
    assert "IS2RE on 3 structures" in capsys.readouterr().out
    m = json.loads((tmp_path / "is2re.json").read_text())
    assert m["task"] == "is2re" and m["structures"] == 3 and m["relax"]["steps"] == 3
    err = np.abs(np.array(m["energies"]) - np.array(m["reference_energies"]))
    assert m["energy_mae"] == pytest.approx(err.mean(), abs=1e-12) and m["ewt"] == (err < 0.02).mean()
    assert "adwt" not in m
    # the energy metrics is2rs reports of the same relaxed structures
    for task in ("is2re", "is2rs"):
        assert main(["evaluate", "--task", task, str(model), "--dataset", str(initial), "--reference",
                     str(reference), "--relaxed", str(tmp_path / "r.extxyz"), "--out",
                     str(tmp_path / f"{task}2.json")]) == 0
    re2 = json.loads((tmp_path / "is2re2.json").read_text())
    rs2 = json.loads((tmp_path / "is2rs2.json").read_text())
    assert re2["energy_mae"] == pytest.approx(m["energy_mae"], abs=1e-9) == rs2["energy_mae"]
    assert re2["ewt"] == rs2["ewt"]
    capsys.readouterr()
    assert main(["evaluate", "--task", "is2re", str(model), "--dataset", str(initial)]) == 2
    assert "needs --reference" in capsys.readouterr().err


def test_help_promises_what_evaluate_does(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("evaluate"))
    assert "IS2RE" in line and "S2EF" in line
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert "{s2ef,is2re,is2rs}" in capsys.readouterr().out


def test_evaluate_reports_the_stress_of_a_set_with_stresses(tmp_path, capsys):
    """A conservative model on a set with stress labels: ``stress_mae`` as the mean absolute difference of the 9
    components of ``predict_structures(stress=True)`` and the labels (eV/Å³), printed in meV/Å³."""
    from gnnpipe import api
    from gnnpipe.data.atoms import generate_bulk_like, read_structures
    from gnnpipe.models import load, save
    from gnnpipe.tasks.s2ef.predict import predict_structures

    data = _write(tmp_path / "bulk.extxyz", generate_bulk_like(8, seed=3, max_repeat=1), sids=False)
    r = api.train(dataset=str(data), log_every=0, progress=False, **{**TRAIN, "stress_coef": 10.0})
    path = tmp_path / "bulk.pt"
    save(r.model, path)
    out = tmp_path / "m.json"
    assert main(["evaluate", "--task", "s2ef", str(path), "--dataset", str(data), "--out", str(out)]) == 0
    assert "stress MAE" in capsys.readouterr().out
    m = json.loads(out.read_text())
    structures = read_structures(data, dtype=torch.float64)
    _, _, stress = predict_structures(load(path), structures, stress=True)
    target = torch.stack([d.stress.reshape(3, 3) for d in structures]).to(next(load(path).parameters()).dtype)
    assert m["stress_structures"] == 8
    assert m["stress_mae"] == pytest.approx(float((stress - target.double()).abs().mean()), rel=1e-9)
