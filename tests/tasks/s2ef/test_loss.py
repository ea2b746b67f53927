"""The S2EF loss and metrics (gnnpipe.tasks.s2ef.loss) and the energy normaliser (…normalizer)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from gnnpipe.tasks.s2ef.loss import S2EFMetrics, s2ef_loss
from gnnpipe.tasks.s2ef.normalizer import EnergyNormalizer


def _parts():
    g = torch.Generator().manual_seed(0)
    e, et = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    f, ft = torch.randn(12, 3, generator=g, dtype=torch.float64), torch.randn(12, 3, generator=g, dtype=torch.float64)
    free = torch.ones(12, dtype=torch.bool)
    free[[0, 5]] = False
    return e, et, f, ft, free


@pytest.mark.parametrize("loss_fn", ["l1", "mse"])
def test_loss_by_hand_over_free_atoms(loss_fn):
    e, et, f, ft, free = _parts()
    got = s2ef_loss(e, et, f, ft, free, num_structures=5, num_free=10, energy_coef=2.0, force_coef=100.0,
                    loss_fn=loss_fn)
    p = 1 if loss_fn == "l1" else 2
    want = 2.0 * ((e - et).abs() ** p).mean() + 100.0 * ((f[free] - ft[free]).abs() ** p).mean()
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    f2 = f.clone()
    f2[0] += 100.0  # a fixed atom's force error does not count
    assert float(s2ef_loss(e, et, f2, ft, free, num_structures=5, num_free=10, energy_coef=2.0, force_coef=100.0,
                           loss_fn=loss_fn)) == pytest.approx(float(got), rel=1e-12)


def test_shares_with_global_counts_sum_to_the_whole():
    e, et, f, ft, free = _parts()
    whole = s2ef_loss(e, et, f, ft, free, num_structures=5, num_free=10, energy_coef=1.0, force_coef=100.0)
    a = s2ef_loss(e[:2], et[:2], f[:4], ft[:4], free[:4], num_structures=5, num_free=10, energy_coef=1.0,
                  force_coef=100.0)
    b = s2ef_loss(e[2:], et[2:], f[4:], ft[4:], free[4:], num_structures=5, num_free=10, energy_coef=1.0,
                  force_coef=100.0)
    assert float(a + b) == pytest.approx(float(whole), rel=1e-12)


def test_metrics_by_hand():
    m = S2EFMetrics()
    energy, target = torch.tensor([1.0, 2.0]), torch.tensor([1.01, 2.5])  # |dE| 0.01 (within EFwT), 0.5
    forces = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    ft = torch.tensor([[1.02, 0, 0], [0, -1.0, 0], [0, 0, 1.0]])
    free = torch.tensor([True, True, True])
    m.update(energy, target, forces, ft, free, natoms=torch.tensor([1, 2]), batch=torch.tensor([0, 1, 1]))
    r = m.compute()
    assert r["energy_mae"] == pytest.approx(0.255)
    assert r["energy_mae_per_atom"] == pytest.approx((0.01 + 0.25) / 2)
    assert r["force_mae"] == pytest.approx((0.02 + 2.0) / 9)
    assert r["force_cos"] == pytest.approx((1 - 1 + 1) / 3)
    assert r["efwt"] == pytest.approx(0.5)  # structure 0: |dE| 0.01, max |dF| 0.02; structure 1 fails both


def _structure(z, energy):
    z = torch.tensor(z)
    return Data(z=z, pos=torch.zeros(len(z), 3), energy=torch.tensor([energy], dtype=torch.float64))


def test_the_reference_recovers_per_element_energies():
    coef = {1: -3.0, 8: -5.0, 29: -4.0}
    zs = [[1, 1, 8], [29, 29, 29, 8], [29, 1], [8, 8, 1, 29], [29]]
    s = [_structure(z, sum(coef[a] for a in z) + 0.1 * k) for k, z in enumerate(zs)]
    n = EnergyNormalizer.fit(s)
    resid = torch.tensor([0.1 * k for k in range(5)], dtype=torch.float64)
    counts = torch.tensor([[z.count(a) for a in (1, 8, 29)] for z in zs], dtype=torch.float64)
    proj = resid - counts @ torch.linalg.lstsq(counts, resid.unsqueeze(1)).solution.squeeze(1)  # what stays
    assert n.mean == pytest.approx(float(proj.mean()), abs=1e-9) and n.std == pytest.approx(float(proj.std()), rel=1e-6)
    z = torch.tensor([1, 8, 29])
    ref = n.reference(z, torch.tensor([0, 0, 1]), 2)
    assert ref[0] == pytest.approx(n.coef[1] + n.coef[8]) and ref[1] == pytest.approx(n.coef[29])
    e = torch.tensor([-8.0, -4.0], dtype=torch.float64)
    assert torch.allclose(n.denormalise(n.normalise(e, ref), ref), e)
    assert EnergyNormalizer.from_dict(n.to_dict()) == n


def test_the_reference_fits_on_the_structures_with_energies():
    """Structures without an energy (force-only) are left out of the fit; a set with none gets no reference, mean 0
    and std 1 (forces trained in eV/Å as given)."""
    with_e = [Data(z=torch.tensor([1, 8]), pos=torch.zeros(2, 3), energy=torch.tensor([-2.0])),
              Data(z=torch.tensor([1, 1, 8]), pos=torch.zeros(3, 3), energy=torch.tensor([-3.5])),
              Data(z=torch.tensor([8]), pos=torch.zeros(1, 3), energy=torch.tensor([-0.4]))]
    without = Data(z=torch.tensor([1]), pos=torch.zeros(1, 3), energy=torch.tensor([99.0]),
                   has_energy=torch.tensor([False]))
    a, b = EnergyNormalizer.fit(with_e), EnergyNormalizer.fit([*with_e, without])
    assert a.coef == b.coef and a.mean == b.mean and a.std == b.std and b.elements == [1, 8]
    none = EnergyNormalizer.fit([Data(z=torch.tensor([1]), pos=torch.zeros(1, 3))])
    assert (none.mean, none.std, set(none.coef)) == (0.0, 1.0, {0.0})
    with pytest.raises(ValueError, match="no structures"):
        EnergyNormalizer.fit([])


def test_the_energy_reference_can_be_none_or_a_file(tmp_path):
    """``none``: the energies as given (e.g. adsorption energies); a file: fairchem's element_references (.pt, .npz)
    or a table {element: eV} (.json, .toml), refused with a message when it cannot be read."""
    import json

    import numpy as np

    from gnnpipe.errors import ConfigError

    data = [Data(z=torch.tensor([1, 8]), pos=torch.zeros(2, 3), energy=torch.tensor([-2.0])),
            Data(z=torch.tensor([1, 1, 8]), pos=torch.zeros(3, 3), energy=torch.tensor([-3.5]))]
    none = EnergyNormalizer.fit(data, reference="none")
    assert set(none.coef) == {0.0} and none.mean == pytest.approx(-2.75)
    refs = torch.zeros(100)
    refs[1], refs[8] = -1.5, -0.5
    (tmp_path / "r.json").write_text(json.dumps({"H": -1.5, "O": -0.5}))
    (tmp_path / "r.toml").write_text("H = -1.5\n8 = -0.5\n")
    torch.save({"element_references": refs}, tmp_path / "r.pt")
    np.savez(tmp_path / "r.npz", element_references=refs.numpy())
    for name in ("r.json", "r.toml", "r.pt", "r.npz"):
        n = EnergyNormalizer.fit(data, reference=str(tmp_path / name))
        assert n.coef[1] == -1.5 and n.coef[8] == -0.5, name
        ref = n.reference(data[1].z, torch.zeros(3, dtype=torch.long), 1)
        assert float(ref[0]) == pytest.approx(-3.5)  # 2 H + 1 O
    (tmp_path / "bad.json").write_text(json.dumps({"Xx": 1.0}))
    with pytest.raises(ConfigError, match="unknown element 'Xx'"):
        EnergyNormalizer.fit(data, reference=str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="no such file"):
        EnergyNormalizer.fit(data, reference=str(tmp_path / "missing.json"))
