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
    a = s2ef_loss(e[:2], et[:2], f[:4], ft[:4], free[:4], num_structures=5, num_free=10, energy_coef=1.0, force_coef=100.0)
    b = s2ef_loss(e[2:], et[2:], f[4:], ft[4:], free[4:], num_structures=5, num_free=10, energy_coef=1.0, force_coef=100.0)
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


def test_the_reference_needs_energies():
    with pytest.raises(ValueError, match="no energy"):
        EnergyNormalizer.fit([Data(z=torch.tensor([1]), pos=torch.zeros(1, 3))])
