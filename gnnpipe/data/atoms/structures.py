"""Structures as PyG data: from ``ase.Atoms``, from the files users have (extended XYZ, ASE trajectories and
databases), and split by structure.

One structure is a ``torch_geometric.data.Data`` with

======== ============== ======================================================================
``z``    int64 [n]      atomic numbers
``pos``  float [n, 3]   positions, Å
``cell`` float [1,3,3]  cell vectors as rows, Å (zeros when non-periodic)
``pbc``  bool [1, 3]    periodic boundaries
``energy`` float [1]    eV (only when labelled)
``forces`` float [n, 3] eV/Å (only when labelled)
``fixed`` bool [n]      constrained atoms (ASE ``FixAtoms``), left out of the force loss
``tags`` int64 [n]      ASE tags (OC20: 0 sub-surface, 1 surface, 2 adsorbate)
``natoms`` int64 [1]    n
======== ============== ======================================================================

``Batch.from_data_list`` concatenates them (``batch [N]``, ``cell [B, 3, 3]``, ``pbc [B, 3]``, ``energy [B]``).
Labels are read as MACE reads them: ``atoms.info[energy_key]`` and ``atoms.arrays[forces_key]``, else the
results of the structure's calculator (what ``ase.io`` attaches for the keys ``energy`` and ``forces``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import DataValidationError
from .validate import _finite

__all__ = ["STRUCTURE_SUFFIXES", "from_atoms", "split_structures", "to_atoms"]

#: file suffixes :func:`read_structures` reads, and the ``ase.io`` format of each
STRUCTURE_SUFFIXES = {".xyz": "extxyz", ".extxyz": "extxyz", ".traj": "traj", ".db": "db"}


def _label(atoms, key: str, kind: str):
    """``atoms.info[key]`` / ``atoms.arrays[key]``, else the calculator's stored result of that name, else None."""
    store = atoms.info if kind == "energy" else atoms.arrays
    if key in store:
        return store[key]
    calc = atoms.calc
    results = getattr(calc, "results", None) or {}
    if key in results:
        return results[key]
    if key == kind and kind == "energy" and "free_energy" in results:
        return results["free_energy"]
    return None


_UNITS = {"pos": "Å", "cell": "Å", "energy": "eV", "forces": "eV/Å"}


def _cast(values, dtype: torch.dtype, k: int, source: str, name: str) -> torch.Tensor:
    """``values`` (float64) as a tensor in ``dtype``; a finite value that overflows there raises now, while the
    original is at hand (the message names the attribute, both dtypes and the fix)."""
    wide = torch.tensor(np.asarray(values, dtype=np.float64))
    cast = wide.to(dtype)
    if cast.dtype != wide.dtype and not bool(torch.isfinite(cast).all()):
        overflow = ~torch.isfinite(cast) & torch.isfinite(wide)
        if bool(overflow.any()):
            _finite(k, source, name, torch.where(overflow, wide, torch.zeros_like(wide)), dtype, _UNITS[name])
    return cast


def _fixed(atoms) -> np.ndarray:
    from ase.constraints import FixAtoms

    fixed = np.zeros(len(atoms), dtype=bool)
    for c in atoms.constraints:
        if isinstance(c, FixAtoms):
            fixed[c.get_indices()] = True
    return fixed


def from_atoms(atoms_list: Iterable, *, energy_key: str = "energy", forces_key: str = "forces",
               dtype: torch.dtype = torch.float32, require_labels: bool = False,
               source: str = "structure") -> list[Data]:
    """``ase.Atoms`` → structures (one ``Data`` each, the fields of this module's table).

    Args:
        atoms_list: ``ase.Atoms`` objects (or one).
        energy_key: where the energy is (eV): ``atoms.info[energy_key]`` or the calculator's result of that name.
        forces_key: where the forces are (eV/Å): ``atoms.arrays[forces_key]`` or the calculator's result.
        dtype: floating dtype of ``pos``, ``cell``, ``energy``, ``forces`` (the training dtype). A finite value
            that overflows in it raises here; :func:`~gnnpipe.data.atoms.validate_structures` checks the rest.
        require_labels: raise if a structure has no energy or no forces.
        source: how errors name where the structures came from (a file name).

    Returns:
        list of ``Data``; a structure without an energy (forces) has no ``energy`` (``forces``) attribute.

    Raises:
        DataValidationError: a structure is not an ``ase.Atoms``, a value overflows in ``dtype``, or a structure
            has no labels when ``require_labels``.
    """
    from ase import Atoms

    if isinstance(atoms_list, Atoms):
        atoms_list = [atoms_list]
    out = []
    for k, atoms in enumerate(atoms_list):
        if not isinstance(atoms, Atoms):
            raise DataValidationError(f"{source} {k}: expected an ase.Atoms, got {type(atoms).__name__}; "
                                      "pass a list of ase.Atoms (e.g. from ase.io.read(path, ':'))")
        n = len(atoms)
        data = Data(
            z=torch.tensor(np.asarray(atoms.numbers), dtype=torch.long),
            pos=_cast(atoms.positions, dtype, k, source, "pos"),
            cell=_cast(atoms.cell.array, dtype, k, source, "cell").reshape(1, 3, 3),
            pbc=torch.tensor(np.asarray(atoms.pbc, dtype=bool)).reshape(1, 3),
            fixed=torch.tensor(_fixed(atoms)),
            tags=torch.tensor(np.asarray(atoms.get_tags()), dtype=torch.long),
            natoms=torch.tensor([n], dtype=torch.long),
        )
        energy = _label(atoms, energy_key, "energy")
        forces = _label(atoms, forces_key, "forces")
        if require_labels and (energy is None or forces is None):
            missing = " and ".join(w for w, v in (("energy", energy), ("forces", forces)) if v is None)
            raise DataValidationError(
                f"{source} {k}: no {missing} label (looked for info[{energy_key!r}] / arrays[{forces_key!r}] "
                f"and the calculator's results); pass energy_key=/forces_key= naming the file's keys "
                f"(e.g. 'REF_energy'), or label the structures (ase.calculators)")
        if energy is not None:
            data.energy = _cast(energy, dtype, k, source, "energy").reshape(-1)
        if forces is not None:
            data.forces = _cast(forces, dtype, k, source, "forces")
        out.append(data)
    return out


def to_atoms(data: Data):
    """One structure (``Data``) → ``ase.Atoms`` with its cell, pbc, tags, ``FixAtoms`` and a
    ``SinglePointCalculator`` holding its energy and forces when present."""
    from ase import Atoms
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.constraints import FixAtoms

    cell = data.cell.reshape(3, 3).double().numpy() if getattr(data, "cell", None) is not None else None
    pbc = data.pbc.reshape(3).numpy() if getattr(data, "pbc", None) is not None else False
    atoms = Atoms(numbers=data.z.numpy(), positions=data.pos.detach().double().numpy(), cell=cell, pbc=pbc)
    if getattr(data, "tags", None) is not None:
        atoms.set_tags(data.tags.numpy())
    if getattr(data, "fixed", None) is not None and bool(data.fixed.any()):
        atoms.set_constraint(FixAtoms(mask=data.fixed.numpy()))
    results = {}
    if getattr(data, "energy", None) is not None:
        results["energy"] = float(data.energy.reshape(-1)[0])
    if getattr(data, "forces", None) is not None:
        results["forces"] = data.forces.detach().double().numpy()
    if results:
        atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


def _row_atoms(row, energy_key: str, forces_key: str):
    """One database row as ``ase.Atoms``, its labels put where :func:`from_atoms` looks: the energy from a key-value
    pair, the row's calculator column or its ``data`` (SchNetPack's databases keep every property there, the energy as
    a one-element array); the forces from the row's column or its ``data``."""
    atoms = row.toatoms()
    energy = row.key_value_pairs.get(energy_key, row.get(energy_key))
    if energy is None and energy_key in row.data:
        energy = np.asarray(row.data[energy_key], dtype=np.float64).reshape(-1)
        energy = energy[0] if energy.size == 1 else None  # not one value per structure: not an energy label
    forces = row.get(forces_key)
    if forces is None and forces_key in row.data:
        forces = row.data[forces_key]
    if energy is not None:
        atoms.info[energy_key] = float(energy)
    if forces is not None:
        atoms.arrays[forces_key] = np.asarray(forces, dtype=np.float64).reshape(len(atoms), -1)
    return atoms


def split_structures(n: int, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0, *,
                     given: Sequence[Sequence[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train / validation / test indices of ``n`` structures (a split by structure, never by atom).

    Args:
        n: number of structures.
        fractions: shares of train, val, test (summing to at most 1; what is left over is unused). Each share
            gets ``round(f · n)`` structures, the test set at most what is left.
        seed: seed of the permutation (``torch.Generator``), so a split is reproducible.
        given: three index lists (train, val, test) to use instead (checked: in range, disjoint).

    Returns:
        ``(train, val, test)``: int64 index tensors; with ``fractions`` each is sorted.

    Raises:
        DataValidationError: fractions that are negative or sum above 1, an empty training set, or ``given``
            lists that are out of range or overlap.
    """
    if given is not None:
        if len(given) != 3:
            raise DataValidationError(f"given= needs three index lists (train, val, test), got {len(given)}")
        parts = tuple(torch.as_tensor(list(g), dtype=torch.long) for g in given)
        allidx = torch.cat(parts)
        if allidx.numel() and (allidx.min() < 0 or allidx.max() >= n):
            raise DataValidationError(f"given split indices must lie in [0, {n}); got {int(allidx.min())}.."
                                      f"{int(allidx.max())}")
        if allidx.unique().numel() != allidx.numel():
            raise DataValidationError("given split lists overlap (a structure in two sets, or twice in one); "
                                      "make train, val and test disjoint")
        return parts  # type: ignore[return-value]
    fr = [float(f) for f in fractions]
    if len(fr) != 3 or any(f < 0 for f in fr) or sum(fr) > 1 + 1e-9:
        raise DataValidationError(f"fractions must be three shares >= 0 summing to at most 1, got {tuple(fractions)}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    n_train, n_val = round(fr[0] * n), round(fr[1] * n)
    n_test = min(round(fr[2] * n), n - n_train - n_val)
    if n_train < 1:
        raise DataValidationError(f"{n} structures give an empty training set with fractions {tuple(fractions)}; "
                                  "add structures or raise the training share")
    a, b = n_train, n_train + n_val
    return perm[:a].sort().values, perm[a:b].sort().values, perm[b:b + n_test].sort().values
