"""GemNet-T / GemNet-dT in S2EF runs: the scale factors are fitted at the start of a run (the same whatever the
batch size), recorded in the model file and reused with ``scale_file``; an exported model predicts through the
ASE calculator, and molecular dynamics with the conservative model conserves the total energy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnpipe import api

from .toy import emt_clusters

ARGS = {"emb_size_trip": 4, "emb_size_rbf": 3, "emb_size_cbf": 3, "emb_size_bil_trip": 5, "num_spherical": 3,
        "num_radial": 6, "num_atom": 1}
KW = dict(model="gemnet-t", layers=1, hidden=8, cutoff=4.0, max_neighbors=12, batch_size=4, warmup_steps=2,
          dtype="float64", log_every=0, progress=False)


@pytest.fixture(scope="module")
def trained():
    data = emt_clusters(16, seed=4, dtype=torch.float64)
    return data, api.train(data=data, epochs=2, model_args=ARGS, **KW)


def test_scale_factors_are_fitted_recorded_and_reused(trained, tmp_path):
    from gnnpipe.models import load, save
    from gnnpipe.tasks.s2ef.scaling import write_scale_file

    data, r = trained
    values = r.model.scale_factor_values()
    assert len(values) == 2 + 3 * 1 and all(v > 0 for v in values.values())
    assert all(abs(v - 1.0) > 1e-3 for v in values.values())  # fitted, not the initial 1
    path = tmp_path / "m.pt"
    save(r.model, path)
    assert load(path).scale_factor_values() == values  # the model file carries them
    import json

    from gnnpipe.cli.main import main

    assert main(["atoms", "scales", str(path), "--out", str(tmp_path / "s.json")]) == 0  # the CLI writes them
    assert json.loads((tmp_path / "s.json").read_text()) == values
    # the same factors whatever the batch size (fitted on epoch 0's first structures, not on batches)
    other = api.train(data=data, epochs=1, model_args=ARGS, **{**KW, "batch_size": 3})
    first = api.train(data=data, epochs=1, model_args=ARGS, **KW)
    fitted = first.model.scale_factor_values()
    assert other.model.scale_factor_values() == pytest.approx(fitted, rel=1e-12)
    # a scale file is loaded instead of fitting: the run starts from the same model
    scale = write_scale_file(fitted, str(tmp_path / "scales.json"))
    reused = api.train(data=data, epochs=1, model_args={**ARGS, "scale_file": str(scale)}, **KW)
    assert reused.epochs[0]["loss"] == pytest.approx(first.epochs[0]["loss"], rel=1e-12)


def _cluster():
    from ase import Atoms

    pos = np.array([[0, 0, 0], [2.4, 0.1, 0], [0.1, 2.5, 0.2], [0.2, 0.1, 2.6], [2.3, 2.2, 0.3]], dtype=float)
    return Atoms(numbers=[29, 29, 28, 29, 28], positions=pos)


@pytest.mark.parametrize("direct", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_calculator_predicts_what_the_model_does(trained, direct):
    from gnnpipe.calculator import Calculator
    from gnnpipe.data.atoms import from_atoms
    from gnnpipe.tasks.s2ef.predict import predict_structures

    data, r = trained
    if direct:  # GemNet-dT
        r = api.train(data=data, epochs=1, model_args=ARGS, direct_forces=True, **KW)
    atoms = _cluster()
    atoms.calc = Calculator(r.model)
    e, f = predict_structures(r.model, from_atoms([atoms], dtype=torch.float64))
    assert atoms.get_potential_energy() == pytest.approx(float(e[0]), rel=1e-12)
    assert np.abs(atoms.get_forces()).max() > 1e-3
    np.testing.assert_allclose(atoms.get_forces(), f[0].numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # ~10 s on the loaded 2-core machine: 100 force calls
def test_nve_molecular_dynamics_conserves_the_energy(trained):
    """100 steps of 1 fs velocity Verlet at 300 K with the conservative model drift by at most 0.01 meV/atom."""
    from ase import units
    from ase.md.verlet import VelocityVerlet

    from gnnpipe.calculator import Calculator

    _, r = trained
    atoms = _cluster()
    atoms.calc = Calculator(r.model)
    rng = np.random.default_rng(0)
    sigma = np.sqrt(units.kB * 300 / atoms.get_masses())[:, None]
    atoms.set_momenta(rng.normal(size=(len(atoms), 3)) * sigma * atoms.get_masses()[:, None])
    e0 = atoms.get_total_energy()
    energies = []
    md = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    md.attach(lambda: energies.append(atoms.get_total_energy()), interval=5)
    md.run(100)
    drift = max(abs(e - e0) for e in energies) / len(atoms)
    print(f"NVE: max |E_total - E_0| = {drift * 1e3:.2e} meV/atom over 100 fs")
    assert np.abs(atoms.get_forces()).max() > 1e-3  # not vacuous
    assert drift <= 1e-5, f"{drift * 1e3:.4f} meV/atom"


def test_a_bad_scale_file_is_refused(tmp_path):
    from gnnpipe.errors import ConfigError
    from gnnpipe.models import build_model

    with pytest.raises(ConfigError, match="no scale file"):
        build_model("gemnet-t", 0, 1, num_layers=1, hidden=8, scale_file=str(tmp_path / "missing.json"), **ARGS)
    (tmp_path / "s.json").write_text('{"units.0.output.energy.scale_sum": 1.5, "units.9.x": 2.0}')
    with pytest.raises(ConfigError, match=r"another GemNet \(this model's .* and 1 more missing; units.9.x not in"):
        build_model("gemnet-t", 0, 1, num_layers=1, hidden=8, scale_file=str(tmp_path / "s.json"), **ARGS)
    (tmp_path / "n.json").write_text('{"units.0.output.energy.scale_sum": -1}')
    with pytest.raises(ConfigError, match="to positive numbers"):
        build_model("gemnet-t", 0, 1, num_layers=1, hidden=8, scale_file=str(tmp_path / "n.json"), **ARGS)


GEMNET_FLAGS = ["--model", "gemnet-t", "--layers", "1", "--hidden", "8", "--cutoff", "4",
                "--max-neighbors", "12", "--batch-size", "4", "--warmup-steps", "2", "--lr", "3e-3", "--no-progress",
                *[a for k, v in ARGS.items() for a in ("--model-arg", f"{k}={v}")]]


@pytest.mark.parametrize("direct", [False, True], ids=["gemnet-t", "gemnet-dt"])
def test_cli_trains_on_an_extxyz_file_with_falling_errors(tmp_path, direct):
    """``gnnpipe train --model gemnet-t --dataset FILE.extxyz`` (and ``--direct-forces``): the
    training energy and force MAE of the last epoch are below the first's."""
    import json

    from gnnpipe.cli.main import main

    from .toy import write_extxyz

    xyz = write_extxyz(tmp_path / "clusters.extxyz", 16, seed=3)
    out = tmp_path / "r.json"
    assert main(["train", "--dataset", xyz, *GEMNET_FLAGS, *(["--direct-forces"] if direct else []),
                 "--epochs", "4", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["status"] == "completed" and rec["config"]["direct_forces"] is direct
    first, last = rec["epochs"][0], rec["epochs"][-1]
    assert last["train_force_mae"] < first["train_force_mae"]
    assert last["train_energy_mae"] < first["train_energy_mae"]
