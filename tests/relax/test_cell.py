"""Cell relaxation (``relax(..., relax_cell=True)``, ``gnnpipe relax --relax-cell``): the batched filter's
generalised forces equal ASE's ``FrechetCellFilter.get_forces`` at a deformed cell (1e-10), and every structure of a
batch takes the steps ``FIRE`` / ``LBFGS`` over ``FrechetCellFilter(atoms)`` takes on it alone (float64, the Morse
model with a true minimum): the same step count, cells within 1e-3 Å per cell vector, with pressure, hydrostatic
and constant-volume options too; bad requests are refused before any work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnpipe.calculator import Calculator
from gnnpipe.errors import ConfigError
from gnnpipe.relax import relax


def _bulk(seed: int, repeat=(1, 1, 1), strain: float = 0.04):
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat(repeat)
    eps = rng.uniform(-strain, strain, (3, 3))
    eps = (eps + eps.T) / 2
    atoms.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
    atoms.positions += rng.normal(0, 0.05, atoms.positions.shape)
    return atoms


def _ase(atoms, model, cls, fmax, steps, filter_kw=None, **kw):
    from ase.filters import FrechetCellFilter

    a = atoms.copy()
    a.calc = Calculator(model)
    opt = cls(FrechetCellFilter(a, **(filter_kw or {})), logfile=None, **kw)
    opt.run(fmax=fmax, steps=steps)
    return a, opt.nsteps


def test_generalised_forces_are_the_filters(morse):
    from ase.filters import FrechetCellFilter
    from torch_geometric.data import Batch

    from gnnpipe.data.atoms import from_atoms
    from gnnpipe.relax.cell import FrechetCell

    atoms = _bulk(0)
    atoms.calc = Calculator(morse)
    filt = FrechetCellFilter(atoms, scalar_pressure=0.003)
    x0 = filt.get_positions()
    x = x0 + np.random.default_rng(1).normal(0, 0.05, x0.shape)  # a deformed cell and moved atoms
    filt.set_positions(x)
    ref = filt.get_forces()
    batch = Batch.from_data_list(from_atoms([_bulk(0)], dtype=torch.float64))
    ours = FrechetCell(batch.cell.double(), batch.batch, scalar_pressure=0.003)
    n = len(atoms)
    x = x.copy()
    x[n:] -= n * np.log(n) * np.eye(3)  # ASE's cell rows are n·log(n·F): a constant offset from n·log F
    pos, cell = ours.structures(torch.as_tensor(x))
    np.testing.assert_allclose(pos.numpy(), atoms.positions, atol=1e-12)
    np.testing.assert_allclose(cell[0].numpy(), atoms.cell.array, atol=1e-12)
    stress = torch.as_tensor(atoms.get_stress(voigt=False)).unsqueeze(0)
    got, crit = ours.forces(torch.as_tensor(x), torch.as_tensor(atoms.get_forces()), stress, cell)
    assert np.abs(ref[len(atoms):]).max() > 1e-3  # the cell rows carry a force
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(crit[0].numpy(), filt.stress[[0, 5, 4, 5, 1, 3, 4, 3, 2]].reshape(3, 3), atol=1e-12)


CASES = [("fire", {}, {}), ("lbfgs", {}, {}),
         pytest.param("fire", {"scalar_pressure": 0.002}, {}, marks=pytest.mark.slow),
         pytest.param("fire", {"hydrostatic_strain": True}, {}, marks=pytest.mark.slow),
         pytest.param("fire", {"constant_volume": True}, {"maxstep": 0.1}, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, filter_kw, opt_kw", CASES,
                         ids=["fire", "lbfgs", "fire-pressure", "fire-hydrostatic", "fire-constant-volume"])
def test_batched_cell_relaxation_is_ase_frechet_cell_filter_per_structure(morse, name, filter_kw, opt_kw):
    from ase.optimize import FIRE, LBFGS

    structures = [_bulk(1), _bulk(2, (2, 1, 1)), _bulk(3, (1, 2, 2), strain=0.02)]
    res = relax(morse, structures, optimizer=name, fmax=0.005, steps=150, relax_cell=True, **filter_kw, **opt_kw)
    assert bool(res.converged.all()) and len(set(res.steps.tolist())) > 1  # left the batch at different steps
    for k, atoms in enumerate(structures):
        ref, nsteps = _ase(atoms, morse, FIRE if name == "fire" else LBFGS, 0.005, 150, filter_kw, **opt_kw)
        assert nsteps == int(res.steps[k])
        cell = res.structures[k].cell[0].numpy()
        assert np.abs(cell - atoms.cell.array).max() > 1e-2  # the cell did move
        assert np.linalg.norm(cell - ref.cell.array, axis=1).max() < 1e-3
        np.testing.assert_allclose(res.structures[k].pos.numpy(), ref.positions, atol=1e-3)
        assert res.structures[k].stress.shape == (1, 3, 3)
    if filter_kw.get("constant_volume"):
        for k, atoms in enumerate(structures):
            assert float(torch.linalg.det(res.structures[k].cell[0])) == pytest.approx(atoms.get_volume(), rel=1e-3)


def test_cell_relaxation_requests_are_checked(morse, tmp_path):
    from ase import Atoms

    molecule = Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 2.5]])
    with pytest.raises(ConfigError, match="not periodic in 3D"):
        relax(morse, [_bulk(0), molecule], relax_cell=True)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="the pressure must be finite"):
            relax(morse, [_bulk(0)], relax_cell=True, scalar_pressure=bad)
    with pytest.raises(ConfigError, match="leaves the cell no freedom"):
        relax(morse, [_bulk(0)], relax_cell=True, hydrostatic_strain=True, constant_volume=True)
    morse.direct_forces = True
    try:
        with pytest.raises(ConfigError, match="direct forces"):
            relax(morse, [_bulk(0)], relax_cell=True)
    finally:
        del morse.direct_forces


def test_cli_relax_cell_writes_cells_and_stresses(tmp_path, capsys):
    """A SchNet trained with a stress term on the bulk set, relaxed with --relax-cell from the command line."""
    import ase.io

    from gnnpipe import api
    from gnnpipe.cli.main import main
    from gnnpipe.data.atoms import from_atoms
    from gnnpipe.data.atoms.generate import generate_bulk_like
    from gnnpipe.models import save

    r = api.train(data=from_atoms(generate_bulk_like(16, seed=2, max_repeat=1), dtype=torch.float64), model="schnet",
                  layers=1, hidden=8, cutoff=4.0, max_neighbors=30, batch_size=4, epochs=2, dtype="float64",
                  warmup_steps=2, stress_coef=10.0, model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0)
    model = tmp_path / "schnet.pt"
    save(r.model, model)
    src, out = tmp_path / "bulk.extxyz", tmp_path / "relaxed.extxyz"
    ase.io.write(src, [_bulk(4), _bulk(5, (2, 1, 1))])
    base = ["relax", str(model), "--dataset", str(src), "--out", str(out), "--no-progress", "--log-every-steps", "0"]
    assert main([*base, "--pressure", "1"]) == 2
    assert "add --relax-cell" in capsys.readouterr().err
    assert main([*base, "--relax-cell", "--steps", "5", "--fmax", "1e-6"]) == 0
    for a, b in zip(ase.io.read(out, ":"), ase.io.read(src, ":")):
        assert a.info["relax_steps"] == 5
        assert np.abs(a.cell.array - b.cell.array).max() > 1e-4  # the cells moved
        assert a.get_stress().shape == (6,)  # the model's stress at the relaxed cell
