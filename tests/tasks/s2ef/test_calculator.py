"""The ASE calculator of a trained S2EF model (gnnpipe.calculator): forces are the energy's finite differences, and
a BFGS relaxation with it lowers the energy and ends under fmax."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from gnnpipe import api
from gnnpipe.calculator import Calculator
from gnnpipe.errors import ConfigError

from .toy import emt_clusters


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from gnnpipe.models import save

    r = api.train(data=emt_clusters(24, seed=4, dtype=torch.float64), model="schnet", layers=1, hidden=8, cutoff=4.0,
                  max_neighbors=12, batch_size=4, epochs=3, dtype="float64", warmup_steps=2,
                  model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0)
    path = tmp_path_factory.mktemp("calc") / "model.pt"
    save(r.model, path)
    return path


def _cluster():
    from ase import Atoms

    pos = np.array([[0, 0, 0], [2.4, 0.1, 0], [0.1, 2.5, 0.2], [0.2, 0.1, 2.6], [2.3, 2.2, 0.3]], dtype=float)
    return Atoms(numbers=[29, 29, 28, 29, 28], positions=pos)


def test_forces_are_finite_differences_of_the_energy(model_file):
    atoms = _cluster()
    atoms.calc = Calculator(model_file)
    forces = atoms.get_forces()
    h = 1e-5
    fd = np.zeros_like(forces)
    for a in range(len(atoms)):
        for c in range(3):
            p = atoms.positions.copy()
            e = []
            for s in (h, -h):
                q = p.copy()
                q[a, c] += s
                atoms.positions = q
                e.append(atoms.get_potential_energy())
            atoms.positions = p
            fd[a, c] = -(e[0] - e[1]) / (2 * h)
    assert np.abs(forces).max() > 1e-3  # not vacuous
    np.testing.assert_allclose(forces, fd, rtol=1e-6, atol=1e-7)


def test_bfgs_relaxation_lowers_the_energy_under_fmax(model_file):
    from ase.optimize import BFGS

    atoms = _cluster()
    atoms.calc = Calculator(model_file)
    e0 = atoms.get_potential_energy()
    opt = BFGS(atoms, logfile=None)
    assert opt.run(fmax=0.05, steps=300)
    assert atoms.get_potential_energy() < e0
    assert np.linalg.norm(atoms.get_forces(), axis=1).max() < 0.05


def test_a_node_classification_model_is_refused(tmp_path):
    from gnnpipe.models import save

    r = api.train(model="gcn", layers=2, hidden=8, num_nodes=100, epochs=1, log_every=0)
    save(r.model, tmp_path / "gcn.pt")
    with pytest.raises(ConfigError, match="not trained on energies and forces"):
        Calculator(tmp_path / "gcn.pt")


@pytest.mark.parametrize("device,match", [("tpu0", "unknown device 'tpu0'"),
                                          ("cuda:64", "cuda:64")])
def test_a_device_that_is_not_here_is_refused_when_the_calculator_is_made(model_file, device, match):
    if device.startswith("cuda") and torch.cuda.device_count() > 64:
        pytest.skip("a machine with more than 64 GPUs")
    with pytest.raises(ConfigError, match=re.escape(match)):
        Calculator(model_file, device=device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_the_calculator_on_a_gpu_equals_the_cpu(model_file):
    atoms = _cluster()
    atoms.calc = Calculator(model_file)
    e, f = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = Calculator(model_file, device="cuda")
    assert isinstance(atoms.get_forces(), np.ndarray)
    assert abs(atoms.get_potential_energy() - e) < 1e-9
    np.testing.assert_allclose(atoms.get_forces(), f, atol=1e-9)
