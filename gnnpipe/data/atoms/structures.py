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
``stress`` float [1,3,3] eV/Å³, ASE's sign (only when labelled)
``has_stress`` bool [1] whether ``stress`` is a label (prepared structures: see below)
======== ============== ======================================================================

``Batch.from_data_list`` concatenates them (``batch [N]``, ``cell [B, 3, 3]``, ``pbc [B, 3]``, ``energy [B]``,
``stress [B, 3, 3]``, ``has_stress [B]``).
Labels are read as MACE reads them: ``atoms.info[energy_key]`` and ``atoms.arrays[forces_key]``, else the
results of the structure's calculator (what ``ase.io`` attaches for the keys ``energy`` and ``forces``).

**Stress.** ASE's convention (``atoms.get_stress(voigt=False)``): ``σ = (1/V) ∂E/∂ε`` for a symmetric strain ε of
positions and cell, eV/Å³: positive when stretched (tensile), negative when compressed (the pressure is −trace/3);
Voigt order ``xx yy zz yz xz xy`` where six values are given. It is read from ``atoms.info[stress_key]``, else the
calculator's result of that name (what ``ase.io`` attaches for ``stress=`` in an extended-XYZ comment line or a
database row's stress column) as 9 values (3 × 3, row-major) or 6 (Voigt); else from a virial (``info[virial_key]``
or the calculator's result, 9 or 6 values, eV): ``σ = −virial / V``, which needs a cell of non-zero volume.

The contract, as for energies and forces: a structure *read* (:func:`from_atoms`, the readers and lazy sets) has
``stress`` only when it is labelled, and no ``has_stress``; a structure *prepared* for batching
(:func:`with_stress_slot`; :class:`~gnnpipe.data.atoms.sets.PreparedSet` does it to every structure) has both: an
unlabelled one a zero ``stress`` and ``has_stress = [False]``, a labelled one ``has_stress = [True]``, so that
labelled and unlabelled structures batch together (``Batch.from_data_list`` needs the same keys in each). A stress
loss is taken over ``batch.stress[batch.has_stress]`` only; :func:`stress_label` is the label of either form (a
``stress`` without ``has_stress`` is one), and the writers write a stress only where there is one, so an unlabelled
structure stays unlabelled. A stress label needs a cell periodic in 3D (it is per volume):
:func:`~gnnpipe.data.atoms.validate_structures` refuses one on any other structure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from torch_geometric.data import Data

from ...errors import DataValidationError
from .validate import _finite

__all__ = ["STRUCTURE_SUFFIXES", "from_atoms", "split_structures", "stress_label", "to_atoms",
           "with_label_slots", "with_stress_slot"]

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


_UNITS = {"pos": "Å", "cell": "Å", "energy": "eV", "forces": "eV/Å", "stress": "eV/Å³"}


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


def _per_structure(atoms, key: str):
    """``atoms.info[key]``, else the calculator's stored result of that name, else None."""
    if atoms.info.get(key) is not None:
        return atoms.info[key]
    results = getattr(atoms.calc, "results", None) or {}
    return results.get(key)


def stress_3x3(value, where: str, key: str = "stress") -> np.ndarray:
    """A stress (or virial) label as a 3 × 3 float64 array: 9 values (3 × 3 row-major, or ``[1, 3, 3]``) as they
    are, 6 values as Voigt ``xx yy zz yz xz xy`` (ASE's order) made symmetric.

    Raises:
        DataValidationError: not numbers, or neither 9 nor 6 of them (``where`` and ``key`` name the label).
    """
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataValidationError(f"{where}: {key} is not numbers ({str(value)[:40]!r}); a stress is 9 values "
                                  f"(3 × 3) or 6 (Voigt xx yy zz yz xz xy), eV/Å³") from exc
    if a.size == 9:
        return a.reshape(3, 3).copy()
    if a.size == 6:
        xx, yy, zz, yz, xz, xy = a.reshape(6)
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    raise DataValidationError(f"{where}: {key} has {a.size} value(s) (shape {list(a.shape)}); a stress or virial is "
                              f"9 values (3 × 3) or 6 (Voigt xx yy zz yz xz xy); check the key names the structure's "
                              f"stress (stress_key) or fix the label")


def virial_to_stress(virial, cell, where: str, key: str = "virial") -> np.ndarray:
    """The stress (eV/Å³, 3 × 3) of a virial label (eV; 9 or 6 values): ``−virial / V``, V the cell's volume.

    Raises:
        DataValidationError: a malformed virial, or a cell without volume (named by ``where``).
    """
    v = stress_3x3(virial, where, key)
    volume = abs(float(np.linalg.det(np.asarray(cell, dtype=np.float64).reshape(3, 3))))
    if not volume > 0.0:
        raise DataValidationError(f"{where}: a {key} label gives a stress only with a cell of non-zero volume "
                                  f"(stress = −virial / volume), but the cell's volume is 0; give the structure "
                                  f"its periodic cell, or drop the {key} label")
    return -v / volume


def voigt_of(stress) -> np.ndarray:
    """A 3 × 3 stress (eV/Å³) as ASE's 6 Voigt values ``xx yy zz yz xz xy`` (off-diagonals averaged: exact for a
    symmetric stress)."""
    s = np.asarray(stress, dtype=np.float64).reshape(3, 3)
    return np.array([s[0, 0], s[1, 1], s[2, 2], (s[1, 2] + s[2, 1]) / 2, (s[0, 2] + s[2, 0]) / 2,
                     (s[0, 1] + s[1, 0]) / 2])


def stress_label(data: Data) -> torch.Tensor | None:
    """The stress label of one structure as ``[3, 3]`` (eV/Å³), or ``None`` when it has none (``has_stress``
    False, or no ``stress``; a ``stress`` without ``has_stress`` counts as a label)."""
    stress = getattr(data, "stress", None)
    if stress is None:
        return None
    has = getattr(data, "has_stress", None)
    if has is not None and has.numel() and not bool(has.reshape(-1)[0]):
        return None
    return stress.reshape(3, 3)


def with_stress_slot(data: Data, dtype: torch.dtype | None = None) -> Data:
    """``data`` (changed in place) with both ``has_stress`` and ``stress``: a ``stress`` without ``has_stress`` is a
    label; none at all gives ``has_stress = [False]`` and a zero ``stress`` ``[1, 3, 3]`` in ``dtype`` (default: that
    of ``pos``), so it batches with labelled structures."""
    stress = getattr(data, "stress", None)
    if getattr(data, "has_stress", None) is None:
        data.has_stress = torch.tensor([stress is not None])
    if stress is None and not bool(data.has_stress.reshape(-1)[0]):
        data.stress = torch.zeros(1, 3, 3, dtype=dtype or data.pos.dtype)
    return data


def with_label_slots(data: Data, source: str = "structure", k: int | None = None) -> Data:
    """``data`` (changed in place) with ``has_energy`` / ``has_forces`` flags (``[1]`` bool) and zero placeholders
    for the labels it lacks (``energy`` ``[1]``, ``forces`` ``[n, 3]`` in the dtype of ``pos``), so that structures
    with different labels batch together; flags already set are kept. Training uses each structure's labels only
    (``gnnpipe.tasks.s2ef.labels``).

    Raises:
        DataValidationError: neither an energy nor forces (nothing to train on); the message names ``source`` ``k``.
    """
    n = int(data.z.numel())

    def present(name: str) -> bool:
        flag = getattr(data, f"has_{name}", None)
        return bool(flag.reshape(-1)[0]) if flag is not None else getattr(data, name, None) is not None

    has_e, has_f = present("energy"), present("forces")
    if not (has_e or has_f):
        where = source if k is None else f"{source} {k}"
        raise DataValidationError(f"{where} has no energy or forces label: nothing to train on (name the labels "
                                  f"with --energy-key / --forces-key, or drop the structure)")
    if not has_e:
        data.energy = torch.zeros(1, dtype=data.pos.dtype)
    if not has_f:
        data.forces = torch.zeros(n, 3, dtype=data.pos.dtype)
    data.has_energy = torch.tensor([has_e])
    data.has_forces = torch.tensor([has_f])
    return data


def _stress_of(atoms, stress_key: str, virial_key: str, where: str) -> np.ndarray | None:
    """The stress label of ``atoms`` (3 × 3, eV/Å³): ``stress_key``, else ``−virial / V`` of ``virial_key``."""
    stress = _per_structure(atoms, stress_key)
    if stress is not None:
        return stress_3x3(stress, where, stress_key)
    virial = _per_structure(atoms, virial_key)
    if virial is not None:
        return virial_to_stress(virial, atoms.cell.array, where, virial_key)
    return None


def from_atoms(atoms_list: Iterable, *, energy_key: str = "energy", forces_key: str = "forces",
               stress_key: str = "stress", virial_key: str = "virial",
               dtype: torch.dtype = torch.float32, require_labels: bool = False,
               source: str = "structure", start: int = 0) -> list[Data]:
    """``ase.Atoms`` → structures (one ``Data`` each, the fields of this module's table).

    Args:
        atoms_list: ``ase.Atoms`` objects (or one).
        energy_key: where the energy is (eV): ``atoms.info[energy_key]`` or the calculator's result of that name.
        forces_key: where the forces are (eV/Å): ``atoms.arrays[forces_key]`` or the calculator's result.
        stress_key: where the stress is (eV/Å³, 9 or 6 values): ``atoms.info[stress_key]`` or the calculator's result.
        virial_key: where a virial is (eV), read when there is no stress: the stress is ``−virial / V``.
        dtype: floating dtype of ``pos``, ``cell``, ``energy``, ``forces``, ``stress`` (the training dtype). A finite
            value that overflows in it raises here; :func:`~gnnpipe.data.atoms.validate_structures` checks the rest.
        require_labels: raise if a structure has no energy or no forces.
        source: how errors name where the structures came from (a file name).
        start: the index errors give the first structure (one structure of a larger file).

    Returns:
        list of ``Data``; a structure without an energy (forces, stress) has no ``energy`` (``forces``, ``stress``)
        attribute (:func:`with_stress_slot` gives it the placeholder for batching).

    Raises:
        DataValidationError: a structure is not an ``ase.Atoms``, a value overflows in ``dtype``, a stress or
            virial is not 9 or 6 numbers (or a virial's cell has no volume), or a structure has no labels when
            ``require_labels``.
    """
    if isinstance(atoms_list, Atoms):
        atoms_list = [atoms_list]
    out = []
    for k, atoms in enumerate(atoms_list, start):
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
        stress = _stress_of(atoms, stress_key, virial_key, f"{source} {k}")
        if stress is not None:
            data.stress = _cast(stress, dtype, k, source, "stress").reshape(1, 3, 3)
        out.append(data)
    return out


def to_atoms(data: Data):
    """One structure (``Data``) → ``ase.Atoms`` with its cell, pbc, tags, ``FixAtoms`` and a
    ``SinglePointCalculator`` holding its energy, forces and stress (:func:`stress_label`; as ASE's 6 Voigt values)
    when present."""
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
    stress = stress_label(data)
    if stress is not None:
        results["stress"] = voigt_of(stress.detach().double().numpy())
    if results:
        atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


def _row_atoms(row, energy_key: str, forces_key: str, stress_key: str = "stress", virial_key: str = "virial"):
    """One database row as ``ase.Atoms``, its labels put where :func:`from_atoms` looks: the energy from a key-value
    pair, the row's calculator column or its ``data`` (SchNetPack's databases keep every property there, the energy as
    a one-element array); the forces, the stress and a virial from the row's column or its ``data``."""
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
    for key in (stress_key, virial_key):
        value = row.get(key)
        if value is None and key in row.data:
            value = row.data[key]
        if value is not None:
            atoms.info[key] = value
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
