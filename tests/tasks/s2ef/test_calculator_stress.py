"""The calculator's stress (float64, an exported model trained with a stress term on the bulk set): equal to the
finite-difference strain derivative of the energy over the volume (1e-6 relative), intensive (a 2 × 2 × 2 supercell
has its cell's stress, 1e-10), rotating as a tensor (1e-10); ``FrechetCellFilter`` + FIRE relaxes a strained cell
under fmax and ASE's NPT integrator runs on it; a molecule or a direct-forces model has no stress."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnpipe import api
from gnnpipe.calculator import Calculator
from gnnpipe.data.atoms.generate import generate_bulk_like
from gnnpipe.data.atoms.structures import from_atoms

FLAGS = dict(layers=2, hidden=8, cutoff=4.0, max_neighbors=30, batch_size=4, dtype="float64", warmup_steps=2,
             model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0)


def _bulk(n, seed=0):
    return generate_bulk_like(n, seed=seed, max_repeat=1, lattices=("fcc",), metals=("Cu", "Ni"))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from gnnpipe.models import save

    r = api.train(data=from_atoms(_bulk(24, seed=3), dtype=torch.float64), model="schnet", epochs=4,
                  stress_coef=10.0, **FLAGS)
    path = tmp_path_factory.mktemp("calc") / "model.pt"
    save(r.model, path)
    return path


def test_stress_is_the_strain_derivative_of_the_energy_over_the_volume(model_file):
    atoms = _bulk(1, seed=11)[0]
    atoms.calc = Calculator(model_file)
    stress = atoms.get_stress(voigt=False)
    cell, pos, volume = atoms.cell.array.copy(), atoms.positions.copy(), atoms.get_volume()
    h = 1e-5
    fd = np.zeros((3, 3))
    for a in range(3):
        for b in range(3):
            eps = np.zeros((3, 3))
            eps[a, b] += h / 2
            eps[b, a] += h / 2
            e = []
            for s in (1, -1):
                atoms.set_cell(cell @ (np.eye(3) + s * eps), scale_atoms=False)
                atoms.positions = pos @ (np.eye(3) + s * eps)
                e.append(atoms.get_potential_energy())
            fd[a, b] = (e[0] - e[1]) / (2 * h) / volume
    atoms.set_cell(cell)
    atoms.positions = pos
    assert np.abs(fd).max() > 1e-4  # a strained crystal
    np.testing.assert_allclose(stress, fd, rtol=1e-6, atol=1e-6 * np.abs(fd).max())
    assert atoms.get_stress().shape == (6,)  # ASE's Voigt order by default


def test_stress_is_intensive_and_rotates_with_the_structure(model_file):
    atoms = _bulk(1, seed=12)[0]
    calc = Calculator(model_file)
    atoms.calc = calc
    stress = atoms.get_stress(voigt=False)
    big = atoms.repeat((2, 2, 2))
    big.calc = calc
    np.testing.assert_allclose(big.get_stress(voigt=False), stress, rtol=1e-10, atol=1e-13)
    turned = atoms.copy()
    turned.calc = calc
    turned.rotate(37, (1, 2, 0.5), rotate_cell=True)
    rot = np.linalg.solve(atoms.cell.array, turned.cell.array).T  # turned = atoms · Rᵀ
    np.testing.assert_allclose(turned.get_stress(voigt=False), rot @ stress @ rot.T, rtol=1e-10, atol=1e-13)


def test_frechet_cell_filter_relaxes_a_strained_cell(model_file):
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE

    atoms = _bulk(1, seed=13)[0]
    atoms.calc = Calculator(model_file)
    before = np.abs(atoms.get_stress()).max()
    opt = FIRE(FrechetCellFilter(atoms), logfile=None)
    assert opt.run(fmax=0.01, steps=300)
    assert np.abs(atoms.get_stress()).max() < min(before, 0.01 * len(atoms) / atoms.get_volume())


def test_npt_molecular_dynamics_runs(model_file):
    from ase import units
    from ase.md import velocitydistribution as vd
    from ase.md.nose_hoover_chain import IsotropicMTKNPT

    atoms = _bulk(1, seed=14)[0].repeat((2, 1, 1))
    atoms.calc = Calculator(model_file)
    thermalize = getattr(vd, "thermalize_momenta", None) or vd.MaxwellBoltzmannDistribution  # ASE ≥ 3.29 / older
    thermalize(atoms, temperature_K=300, rng=np.random.default_rng(0))
    v0 = atoms.get_volume()
    md = IsotropicMTKNPT(atoms, timestep=1.0 * units.fs, temperature_K=300, pressure_au=0.0,
                         tdamp=50 * units.fs, pdamp=500 * units.fs)
    md.run(20)
    assert np.isfinite(atoms.get_potential_energy()) and atoms.get_volume() != v0  # the cell moved


def test_molecules_and_direct_forces_have_no_stress(model_file, tmp_path):
    from ase.build import molecule
    from ase.calculators.calculator import PropertyNotImplementedError

    from gnnpipe.models import save

    mol = molecule("CH4")
    mol.numbers[:] = 29
    mol.calc = Calculator(model_file)
    with pytest.raises(PropertyNotImplementedError, match="not periodic"):
        mol.get_stress()
    r = api.train(data=from_atoms(_bulk(8), dtype=torch.float64), model="schnet", epochs=1, direct_forces=True,
                  **FLAGS)
    save(r.model, tmp_path / "direct.pt")
    calc = Calculator(tmp_path / "direct.pt")
    assert "stress" not in calc.implemented_properties
    atoms = _bulk(1)[0]
    atoms.calc = calc
    with pytest.raises(PropertyNotImplementedError):  # ASE refuses before asking: not implemented
        atoms.get_stress()
