"""Validation of structures at the boundary (gnnpipe.data.atoms.validate), judged in the training dtype."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, fcc111, molecule
from ase.calculators.singlepoint import SinglePointCalculator

from gnnpipe.data import DataWarning
from gnnpipe.data.atoms import from_atoms, validate_structures
from gnnpipe.errors import DataValidationError


def _good() -> list:
    slab = fcc111("Pt", (2, 2, 3), vacuum=5.0)
    slab.calc = SinglePointCalculator(slab, energy=-3.0, forces=np.zeros((len(slab), 3)))
    mol = molecule("C6H6")
    mol.calc = SinglePointCalculator(mol, energy=1.0, forces=np.zeros((len(mol), 3)))
    return from_atoms([slab, mol], dtype=torch.float64)


def test_good_structures_pass_in_both_dtypes():
    for dtype in (torch.float32, torch.float64):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            validate_structures(_good(), dtype, max_z=100, cutoff=5.0, require_labels=True)


@pytest.mark.parametrize("attr, value, pattern", [
    ("pos", float("nan"), r"structure 1: pos\[3, 1\] is nan"),
    ("forces", float("inf"), r"structure 1: forces\[3, 1\] is inf"),
    ("energy", float("nan"), r"structure 1: energy is nan"),
])
def test_non_finite_values_name_structure_attribute_and_fix(attr, value, pattern):
    data = _good()
    t = getattr(data[1], attr)
    if attr == "energy":
        t[0] = value
    else:
        t[3, 1] = value
    fix = ".*(fix its geometry|recompute its labels) or drop the structure"
    with pytest.raises(DataValidationError, match=pattern + fix):
        validate_structures(data)


def test_values_are_judged_in_the_training_dtype():
    data = _good()
    data[0].energy = torch.tensor([1e300], dtype=torch.float64)
    validate_structures(data, torch.float64)
    with pytest.raises(DataValidationError, match=r"structure 0: energy = 1e\+300 eV is finite in torch.float64 "
                                                  r"but overflows .* torch.float32.*--dtype float64"):
        validate_structures(data, torch.float32)
    data = _good()
    data[1].forces[0, 0] = 1e39
    with pytest.raises(DataValidationError, match=r"structure 1: forces\[0, 0\].*torch.float16"):
        validate_structures(data, torch.float16)


def test_reading_in_a_narrow_dtype_names_the_overflow(tmp_path):
    import ase.io

    mol = molecule("H2O")
    mol.calc = SinglePointCalculator(mol, energy=1e300, forces=np.zeros((3, 3)))
    ase.io.write(str(tmp_path / "big.extxyz"), [molecule("H2O"), mol])
    from gnnpipe.data.atoms import read_structures

    assert read_structures(tmp_path / "big.extxyz", dtype=torch.float64)[1].energy.item() == 1e300
    with pytest.raises(DataValidationError, match=r"big.extxyz: structure 1: energy = 1e\+300 eV is finite in "
                                                  r"torch.float64 but overflows .* torch.float32"):
        read_structures(tmp_path / "big.extxyz")


def test_forces_shape_empty_structure_and_labels():
    data = _good()
    data[1].forces = data[1].forces[:-1]
    with pytest.raises(DataValidationError, match=r"structure 1: forces must be \[12, 3\].*got \[11, 3\]"):
        validate_structures(data)
    data = _good()
    data[0].forces = data[0].forces.reshape(-1)
    with pytest.raises(DataValidationError, match="forces must be"):
        validate_structures(data)
    empty = from_atoms([Atoms()])
    with pytest.raises(DataValidationError, match="structure 0: has no atoms"):
        validate_structures(empty)
    with pytest.raises(DataValidationError, match=r"structure 0: no energy and forces label"):
        validate_structures(from_atoms([molecule("H2O")]), require_labels=True)


def test_duplicated_atoms_and_periodic_images_too_close():
    dup = molecule("CH4")
    dup += dup[:1]
    with pytest.raises(DataValidationError, match=r"structure 0: atoms \d and \d are 0 Å apart.*duplicate"):
        validate_structures(from_atoms([dup]))
    tiny = Atoms("Cu", positions=[[0, 0, 0]], cell=[0.05, 5, 5], pbc=True)   # its own image 0.05 Å away
    with pytest.raises(DataValidationError, match=r"periodic image \[-?1, 0, 0\].*0.05 Å"):
        validate_structures(from_atoms([tiny]))
    validate_structures(from_atoms([tiny]), min_distance=0.01)


def test_atomic_numbers_outside_the_embedding():
    data = _good()
    with pytest.raises(DataValidationError, match=r"structure 0: atomic number 78 .*embeds atomic numbers 1..50"):
        validate_structures(data, max_z=50)
    data[1].z[0] = 0
    with pytest.raises(DataValidationError, match="structure 1: atomic number 0"):
        validate_structures(data)


def test_singular_cell_with_periodic_boundaries():
    flat = Atoms("Cu2", positions=[[0, 0, 0], [1.5, 1.5, 0]], cell=[[3, 0, 0], [6, 0, 0], [0, 0, 10]],
                 pbc=[True, True, False])
    with pytest.raises(DataValidationError, match=r"structure 0: the cell is singular.*pbc False"):
        validate_structures(from_atoms([flat]))
    zero = Atoms("Cu", positions=[[0, 0, 0]], pbc=True)
    with pytest.raises(DataValidationError, match="singular"):
        validate_structures(from_atoms([zero]))
    slab = fcc111("Cu", (2, 2, 2))                        # periodic in-plane, zero cell vector along z: fine
    slab.cell[2] = 0
    validate_structures(from_atoms([slab]))
    validate_structures(from_atoms([bulk("Cu")]))


def test_structures_without_neighbours_warn():
    lone = Atoms("H2", positions=[[0, 0, 0], [0, 0, 9.0]])
    with pytest.warns(DataWarning, match=r"^1 structure \(index 1\) has no pair of atoms within the cutoff 5.0 Å: its "
                                         r"graph has no edges"):
        validate_structures(_good()[:1] + from_atoms([lone]), cutoff=5.0)
    with pytest.warns(DataWarning, match=r"^2 structures of iso1\.extxyz \(indices 0, 2\) have no pair of atoms "
                                         r"within the cutoff 5.0 Å: their graphs have no edges"):
        validate_structures(from_atoms([lone]) + _good()[:1] + from_atoms([lone]), cutoff=5.0,
                            source="iso1.extxyz: structure")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate_structures(from_atoms([lone]), cutoff=10.0)


def test_a_large_cutoff_searches_only_near_the_nearest_pair(monkeypatch):
    """The no-neighbour check does not enumerate every pair within a large cutoff (150 Å on an 8-atom periodic
    cell: ~10 million): it searches at a doubling reach and stops at the first pair found."""
    from gnnpipe.data.atoms import graph

    reaches = []
    search = graph.neighbor_pairs

    def spy(pos, cell, pbc, cutoff, method="auto"):
        reaches.append(cutoff)
        return search(pos, cell, pbc, cutoff, method)

    monkeypatch.setattr(graph, "neighbor_pairs", spy)
    cu = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
    lone = Atoms("H2", positions=[[0, 0, 0], [0, 0, 9.0]], cell=[20, 20, 20], pbc=True)   # nearest pair 9 Å
    validate_structures(from_atoms([cu]), cutoff=150.0)
    assert max(reaches) <= 4.0
    reaches.clear()
    validate_structures(from_atoms([lone]), cutoff=150.0)     # found at 16 Å: not isolated, no warning
    assert max(reaches) == 16.0
