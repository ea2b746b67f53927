"""Structures as data (gnnpipe.data.atoms.structures): from ase.Atoms, the readers, splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import add_adsorbate, fcc111, molecule
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from ase.constraints import FixAtoms
from torch_geometric.data import Batch

from gnnpipe.data.atoms import from_atoms, read_structures, split_structures, to_atoms
from gnnpipe.errors import DataValidationError


def _labelled(seed: int = 0) -> list[Atoms]:
    out = []
    for k in range(3):
        slab = fcc111("Cu", (2, 2, 3), vacuum=5.0)
        add_adsorbate(slab, "O", 1.3, "fcc")
        slab.info.pop("adsorbate_info", None)
        slab.set_constraint(FixAtoms(indices=[8, 9, 10, 11]))
        slab.rattle(0.05, seed=seed + k)
        slab.calc = EMT()
        e, f = slab.get_potential_energy(), slab.get_forces(apply_constraint=False)
        slab.calc = SinglePointCalculator(slab, energy=e, forces=f)
        out.append(slab)
    mol = molecule("CH4")
    mol.calc = SinglePointCalculator(mol, energy=-1.5, forces=np.full((5, 3), 0.25))
    return out + [mol]


def test_from_atoms_fields_shapes_and_dtypes():
    atoms = _labelled()
    data = from_atoms(atoms, dtype=torch.float64)
    d = data[0]
    n = len(atoms[0])
    assert d.z.dtype == torch.long and d.z.tolist() == atoms[0].numbers.tolist()
    assert d.pos.shape == (n, 3) and d.pos.dtype == torch.float64
    assert d.cell.shape == (1, 3, 3) and d.pbc.tolist() == [[True, True, False]]
    assert d.fixed.dtype == torch.bool and d.fixed.nonzero().flatten().tolist() == [8, 9, 10, 11]
    assert d.tags.dtype == torch.long and d.natoms.tolist() == [n]
    assert d.energy.shape == (1,) and d.energy.item() == atoms[0].calc.results["energy"]
    np.testing.assert_array_equal(d.forces.numpy(), atoms[0].calc.results["forces"])
    assert d.forces[8:12].abs().sum() > 0                     # raw forces: fixed atoms keep theirs
    mol = data[3]
    assert torch.all(mol.cell == 0) and not mol.pbc.any() and not mol.fixed.any()
    batch = Batch.from_data_list(data)
    assert batch.cell.shape == (4, 3, 3) and batch.pbc.shape == (4, 3) and batch.energy.shape == (4,)
    assert from_atoms(atoms)[0].pos.dtype == torch.float32
    atoms[0].positions[0] += 1.0                              # the data owns its memory
    assert not torch.equal(from_atoms(atoms, dtype=torch.float64)[0].pos, d.pos)


def test_to_atoms_round_trips():
    atoms = _labelled()[0]
    back = to_atoms(from_atoms([atoms], dtype=torch.float64)[0])
    np.testing.assert_array_equal(back.positions, atoms.positions)
    np.testing.assert_array_equal(back.cell.array, atoms.cell.array)
    assert back.constraints[0].get_indices().tolist() == [8, 9, 10, 11]
    assert back.get_potential_energy() == atoms.get_potential_energy()


def test_unlabelled_structures_and_require_labels():
    mol = molecule("H2O")
    (d,) = from_atoms([mol])
    assert "energy" not in d and "forces" not in d
    with pytest.raises(DataValidationError, match=r"structure 0: no energy and forces label.*energy_key"):
        from_atoms([mol], require_labels=True)
    with pytest.raises(DataValidationError, match="ase.Atoms"):
        from_atoms([mol, "not atoms"])


@pytest.mark.parametrize("suffix", [".extxyz", ".xyz", ".traj", ".db"])
def test_readers_round_trip_every_format(tmp_path, suffix):
    import ase.io

    atoms = _labelled()
    path = tmp_path / f"s{suffix}"
    ase.io.write(str(path), atoms)
    got = read_structures(path, dtype=torch.float64, require_labels=True)
    want = from_atoms(atoms, dtype=torch.float64)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g.z, w.z) and torch.equal(g.pbc, w.pbc)
        torch.testing.assert_close(g.pos, w.pos, atol=1e-7, rtol=0)
        torch.testing.assert_close(g.energy, w.energy, atol=1e-7, rtol=0)
        torch.testing.assert_close(g.forces, w.forces, atol=1e-7, rtol=0)
        torch.testing.assert_close(g.cell, w.cell, atol=1e-7, rtol=0)
    assert torch.equal(got[0].fixed, want[0].fixed) and torch.equal(got[0].tags, want[0].tags)
    assert len(read_structures(path, index="1:3")) == 2
    assert len(read_structures(path, index=-1)) == 1


def test_custom_label_keys_in_extxyz_and_db(tmp_path):
    import ase.db
    import ase.io

    atoms = molecule("NH3")
    atoms.info["REF_energy"] = -3.25
    atoms.arrays["REF_forces"] = np.arange(12, dtype=float).reshape(4, 3)
    ase.io.write(str(tmp_path / "a.extxyz"), [atoms])
    (d,) = read_structures(tmp_path / "a.extxyz", energy_key="REF_energy", forces_key="REF_forces",
                           dtype=torch.float64)
    assert d.energy.item() == -3.25 and d.forces.flatten().tolist() == list(range(12))
    with pytest.raises(DataValidationError, match="energy_key"):
        read_structures(tmp_path / "a.extxyz", require_labels=True)
    with ase.db.connect(str(tmp_path / "a.db")) as db:
        db.write(molecule("NH3"), REF_energy=-3.25, data={"REF_forces": np.ones((4, 3))})
    (d,) = read_structures(tmp_path / "a.db", energy_key="REF_energy", forces_key="REF_forces")
    assert d.energy.item() == -3.25 and torch.all(d.forces == 1)


def test_reader_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_structures(tmp_path / "missing.extxyz")
    (tmp_path / "s.cif2").write_text("x")
    with pytest.raises(DataValidationError, match=r"unknown structure file suffix '.cif2'.*\.extxyz"):
        read_structures(tmp_path / "s.cif2")
    (tmp_path / "bad.extxyz").write_text("3\nnot a comment line\nH 0 0\n")
    with pytest.raises(DataValidationError, match="cannot read it as extxyz"):
        read_structures(tmp_path / "bad.extxyz")


def test_split_structures_is_seeded_disjoint_and_complete():
    tr, va, te = split_structures(100, (0.8, 0.1, 0.1), seed=3)
    assert (len(tr), len(va), len(te)) == (80, 10, 10)
    assert torch.cat([tr, va, te]).sort().values.tolist() == list(range(100))
    again = split_structures(100, (0.8, 0.1, 0.1), seed=3)
    other = split_structures(100, (0.8, 0.1, 0.1), seed=4)
    assert all(torch.equal(a, b) for a, b in zip((tr, va, te), again))
    assert not torch.equal(tr, other[0])
    tr, va, te = split_structures(10, (0.5, 0.2, 0.0))
    assert (len(tr), len(va), len(te)) == (5, 2, 0)


def test_split_structures_given_and_errors():
    tr, va, te = split_structures(5, given=([0, 1, 2], [3], [4]))
    assert tr.tolist() == [0, 1, 2] and va.tolist() == [3] and te.tolist() == [4]
    with pytest.raises(DataValidationError, match="overlap"):
        split_structures(5, given=([0, 1], [1], [4]))
    with pytest.raises(DataValidationError, match=r"\[0, 5\)"):
        split_structures(5, given=([0, 7], [], []))
    with pytest.raises(DataValidationError, match="at most 1"):
        split_structures(5, (0.8, 0.3, 0.1))
    with pytest.raises(DataValidationError, match="empty training set"):
        split_structures(1, (0.2, 0.4, 0.4))
