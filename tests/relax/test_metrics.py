"""IS2RS / IS2RE metrics against hand-computed values on tiny cases (OC20's definitions, fairchem's evaluator)."""

from __future__ import annotations

import numpy as np
import pytest

from gnnpipe.errors import ConfigError, DataValidationError
from gnnpipe.relax import ADWT_THRESHOLDS, AFBT_THRESHOLDS, adwt, afbt, evaluate_is2rs, fbt, mean_distances


def _slab(metal="Cu"):
    from ase.build import add_adsorbate, fcc111
    from ase.constraints import FixAtoms

    slab = fcc111(metal, size=(2, 2, 3), vacuum=6.0)
    add_adsorbate(slab, "O", 1.5, "fcc")
    slab.set_constraint(FixAtoms(mask=slab.get_tags() == 3))   # the bottom layer (4 atoms)
    return slab


@pytest.fixture(scope="module")
def relaxed_pair():
    """Two EMT-relaxed slabs (fmax 0.01) with their energies."""
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.optimize import BFGS

    out = []
    for metal in ("Cu", "Pt"):
        s = _slab(metal)
        s.calc = EMT()
        BFGS(s, logfile=None).run(fmax=0.01, steps=200)
        e = s.get_potential_energy()
        s.calc = SinglePointCalculator(s, energy=e, forces=s.get_forces())
        out.append(s)
    return out


def _copies(structures):
    from ase.calculators.singlepoint import SinglePointCalculator

    out = []
    for r in structures:
        a = r.copy()
        a.calc = SinglePointCalculator(a, energy=r.get_potential_energy(), forces=r.get_forces())
        out.append(a)
    return out


def test_threshold_grids():
    assert len(ADWT_THRESHOLDS) == 490 and ADWT_THRESHOLDS[0] == 0.01 and abs(ADWT_THRESHOLDS[-1] - 0.499) < 1e-12
    assert len(AFBT_THRESHOLDS) == 390 and abs(AFBT_THRESHOLDS[-1] - 0.399) < 1e-12


def test_perfect_prediction_scores_one(relaxed_pair):
    m = evaluate_is2rs(_copies(relaxed_pair), relaxed_pair)
    assert m["adwt"] == 1.0 and m["fbt"] == 1.0 and m["afbt"] > 0.95 and m["energy_mae"] == 0.0 and m["ewt"] == 1.0


def test_displaced_structure_gives_the_known_fraction(relaxed_pair):
    pred = _copies(relaxed_pair)
    free = ~np.isin(np.arange(len(pred[1])), pred[1].constraints[0].get_indices())
    pos = pred[1].positions.copy()
    pos[free, 0] += 0.2005                                      # every free atom 0.2005 Å along x
    pos[~free, 2] += 1.0                                        # fixed atoms are not counted
    pred[1].set_constraint()
    pred[1].positions = pos
    pred[1].set_constraint(relaxed_pair[1].constraints[0].copy())
    pred[0].positions[4] += pred[0].cell[0]                      # one atom a whole cell vector away: distance 0
    d = mean_distances(pred, relaxed_pair)
    np.testing.assert_allclose(d, [0.0, 0.2005], atol=1e-9)
    # thresholds above 0.2005 Å: 0.201 … 0.499 = 299 of 490
    assert adwt(d) == pytest.approx((490 + 299) / 980)
    m = evaluate_is2rs(pred, relaxed_pair)
    assert m["adwt"] == pytest.approx((490 + 299) / 980)
    assert m["fbt"] == 0.5                                      # EMT forces at the displaced slab are large
    assert m["energy_mae"] == pytest.approx(0.0)


def test_fbt_and_afbt_by_hand():
    f = np.array([0.0, 0.1005, 0.5])
    assert fbt(f) == pytest.approx(1 / 3)
    # thresholds 0.01 … 0.100 (91) see one structure below, 0.101 … 0.399 (299) see two
    assert afbt(f) == pytest.approx((91 * 1 / 3 + 299 * 2 / 3) / 390)


def test_different_structures_or_orders_are_refused(relaxed_pair):
    with pytest.raises(DataValidationError, match="structure 0"):
        mean_distances(relaxed_pair, relaxed_pair[::-1])
    with pytest.raises(DataValidationError, match="2 relaxed structures but 1 reference"):
        mean_distances(relaxed_pair, relaxed_pair[:1])


def test_unknown_oracle_is_refused(relaxed_pair):
    with pytest.raises(ConfigError, match="unknown oracle 'dft'"):
        evaluate_is2rs(relaxed_pair, relaxed_pair, oracle="dft")
    m = evaluate_is2rs(relaxed_pair, relaxed_pair, oracle="ase.calculators.emt:EMT")
    assert m["oracle"] == "EMT" and m["fbt"] == 1.0


def test_minimum_image_wraps_periodic_directions_only():
    """Hand-computed distances: a free atom across the periodic boundary is 0.1 of a cell vector away, not 0.9; a
    displacement along the non-periodic axis larger than half the cell stays as it is; fixed atoms are not counted."""
    from ase import Atoms
    from ase.constraints import FixAtoms

    cell = [[4.0, 0, 0], [2.0, 3.0, 0], [0, 0, 10.0]]
    ref = Atoms("Cu3", positions=[[0.2, 0.3, 5.0], [1.0, 1.0, 5.0], [2.0, 2.0, 2.0]], cell=cell,
                pbc=[True, True, False])
    ref.set_constraint(FixAtoms(indices=[2]))
    pred = ref.copy()
    pos = ref.positions.copy()
    pos[0] += 0.9 * np.array(cell[0]) + 0.9 * np.array(cell[1])   # the image 0.1·(a + b) away on the other side
    pos[1, 2] += 6.0                                              # 6 Å along the non-periodic z (cell height 10 Å)
    pos[2] += [0.3, 0.0, 0.0]                                     # the fixed atom: not counted
    pred.set_constraint()
    pred.positions = pos
    pred.set_constraint(FixAtoms(indices=[2]))
    d0 = 0.1 * np.linalg.norm(np.array(cell[0]) + np.array(cell[1]))  # |0.1 (a + b)| = 0.1 · √(36 + 9)
    expected = (d0 + 6.0) / 2
    np.testing.assert_allclose(mean_distances([pred], [ref]), [expected], atol=1e-12)
    # 0.3 Å along the periodic a-axis of a 4 Å cell, and 3 Å (beyond half of 4 Å) the other way round
    pred2 = ref.copy()
    pred2.positions[0, 0] += 3.0                                  # = −1 Å through the boundary
    pred2.positions[1, 0] += 0.3
    np.testing.assert_allclose(mean_distances([pred2], [ref]), [(1.0 + 0.3) / 2], atol=1e-12)


def test_adwt_of_mixed_distances_by_hand():
    # 0.0105 Å: below thresholds 0.011 … 0.499 (489 of 490); 0.3 Å: below 0.301 … 0.499 (199); 0.6 Å: none
    d = np.array([0.0105, 0.3, 0.6])
    assert adwt(d) == pytest.approx((489 + 199 + 0) / (3 * 490))
    assert adwt(np.array([])) == 0.0


def test_fbt_takes_the_oracle_forces_on_free_atoms_only():
    """The oracle's force on a fixed atom does not count (FixAtoms), its largest norm on a free atom does."""
    from ase import Atoms
    from ase.calculators.calculator import Calculator, all_changes
    from ase.constraints import FixAtoms

    from gnnpipe.relax import oracle_max_forces

    class Prescribed(Calculator):
        implemented_properties = ["energy", "forces"]

        def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
            super().calculate(atoms, properties, system_changes)
            f = np.zeros((len(self.atoms), 3))
            f[0] = [5.0, 0, 0]                     # the fixed atom
            f[1] = [0.06, 0.08, 0.0]               # |f| = 0.1 on a free atom
            f[2] = [0.0, 0.0, -0.03]
            self.results = {"energy": 0.0, "forces": f}

    a = Atoms("Cu3", positions=[[0, 0, 0], [2.5, 0, 0], [0, 2.5, 0]])
    a.set_constraint(FixAtoms(indices=[0]))
    fm = oracle_max_forces([a], Prescribed())
    np.testing.assert_allclose(fm, [0.1], atol=1e-12)
    # thresholds 0.101 … 0.399 (299 of 390) see it below; FbT (0.05) does not
    assert fbt(fm) == 0.0 and afbt(fm) == pytest.approx(299 / 390)
