"""Batched FIRE and L-BFGS give every structure ASE's own trajectory (same model as calculator, float64, eight
structures of different sizes in one batch, some with fixed atoms); batched L-BFGS ends at ASE's minimum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnpipe.calculator import Calculator
from gnnpipe.errors import ConfigError
from gnnpipe.models import load
from gnnpipe.relax import relax

from .conftest import mixed_structures


def _ase_run(atoms, model, cls, fmax, steps, **kw):
    a = atoms.copy()
    a.calc = Calculator(model)
    opt = cls(a, logfile=None, **kw)
    opt.run(fmax=fmax, steps=steps)
    return a, opt.nsteps


@pytest.mark.parametrize("name, options", [
    ("fire", {}), ("lbfgs", {}),
    pytest.param("fire", {"downhill_check": True, "dt": 0.3}, marks=pytest.mark.slow),
    pytest.param("lbfgs", {"memory": 3, "damping": 0.8, "alpha": 50.0}, marks=pytest.mark.slow),
], ids=["fire", "lbfgs", "fire-downhill", "lbfgs-memory3"])
def test_batched_optimizer_is_ase_per_structure(request, name, options):
    """20 steps, float64, 8 structures of 4 sizes in one batch, 6 with fixed atoms: positions within 1e-6 Å (FIRE
    with a trained SchNet; L-BFGS's long steps push that model's atoms together, so it runs on the Morse model)."""
    from ase.optimize import FIRE, LBFGS

    model = load(request.getfixturevalue("schnet_file")) if name == "fire" else request.getfixturevalue("morse")
    structures = mixed_structures()
    assert len({len(a) for a in structures}) >= 4 and any(a.constraints for a in structures)
    res = relax(model, structures, optimizer=name, fmax=1e-9, steps=20, **options)
    assert int(res.steps.max()) == 20
    assert all(p.requires_grad for p in model.parameters())  # frozen for the relaxation only, then given back
    for k, atoms in enumerate(structures):
        ref, nsteps = _ase_run(atoms, model, FIRE if name == "fire" else LBFGS, 1e-9, 20, **options)
        assert nsteps == int(res.steps[k])  # 20, or where its forces vanished (atoms pushed apart)
        moved = np.abs(ref.positions - atoms.positions).max()
        assert moved > 1e-3  # the structures did move
        np.testing.assert_allclose(res.structures[k].pos.numpy(), ref.positions, rtol=0, atol=1e-6)
        fixed = res.structures[k].fixed.numpy()
        np.testing.assert_array_equal(res.structures[k].pos.numpy()[fixed], atoms.positions[fixed])


@pytest.mark.slow
def test_batched_lbfgs_is_ase_lbfgs_and_ends_at_its_minimum(morse):
    from ase.optimize import LBFGS

    structures = mixed_structures()
    res = relax(morse, structures, optimizer="lbfgs", fmax=0.01, steps=300)
    assert bool(res.converged.all())
    assert len(set(res.steps.tolist())) > 1  # structures left the batch at different steps
    for k, atoms in enumerate(structures):
        ref, nsteps = _ase_run(atoms, morse, LBFGS, 0.01, 300)
        assert nsteps < 300  # ASE converged too
        np.testing.assert_allclose(res.structures[k].pos.numpy(), ref.positions, rtol=0, atol=1e-3)
        assert abs(float(res.energies[k]) - ref.get_potential_energy()) < 1e-6


def test_fire_stops_each_structure_where_ase_does(morse):
    from ase.optimize import FIRE

    structures = [mixed_structures()[k] for k in (0, 6, 7)]
    res = relax(morse, structures, optimizer="fire", fmax=0.1, steps=100, batch_size=2)
    for k, atoms in enumerate(structures):
        ref, nsteps = _ase_run(atoms, morse, FIRE, 0.1, 100)
        assert int(res.steps[k]) == nsteps and bool(res.converged[k])
        assert float(res.fmax[k]) < 0.1
        np.testing.assert_allclose(res.structures[k].pos.numpy(), ref.positions, rtol=0, atol=1e-6)


def test_bad_arguments_are_refused(morse):
    s = mixed_structures()[:1]
    for kwargs, match in (({"fmax": 0.0}, "fmax must be > 0"), ({"steps": -1}, "steps must be >= 0"),
                          ({"optimizer": "bfgs"}, "unknown optimizer"), ({"nonsense": 1}, "optimizer 'fire'")):
        with pytest.raises(ConfigError, match=match):
            relax(morse, s, **kwargs)


def test_interrupt_returns_the_structures_relaxed_so_far(morse, monkeypatch):
    from gnnpipe.tasks.s2ef import predict

    structures = mixed_structures()
    real, calls = predict.energies_forces, {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 6:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(predict, "energies_forces", flaky)
    res = relax(morse, structures, optimizer="fire", fmax=0.05, steps=200, batch_size=4)
    assert res.interrupted and not bool(res.done.all())
    assert all(s is not None for s in res.structures)
    moved = [not np.allclose(s.pos.numpy(), a.positions) for s, a in zip(res.structures, structures)]
    assert any(moved[:4]) and not any(moved[4:])  # the first batch moved, the second never started
    atoms = res.to_atoms()
    assert [a.info["relax_done"] for a in atoms] == res.done.tolist()
    assert torch.is_tensor(res.steps)
