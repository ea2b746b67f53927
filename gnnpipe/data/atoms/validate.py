"""Checks of structures at the boundary, in the dtype training uses.

Each failure raises :class:`~gnnpipe.errors.DataValidationError` naming the structure (its index in the list),
the attribute, and the fix. Finiteness is judged after casting to the training dtype: a float64 energy of
1e300 is finite in float64 and infinite in float32.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
from ase.data import chemical_symbols
from torch_geometric.data import Data

from ...errors import DataValidationError
from ..validation import DataWarning
from . import graph

__all__ = ["MAX_ATOMIC_NUMBER", "check_cells", "check_max_z", "isolated_structures", "validate_structures"]

#: the largest atomic number (oganesson)
MAX_ATOMIC_NUMBER = 118


def _where(k: int, source: str) -> str:
    return f"{source} {k}"


def _finite(k: int, source: str, name: str, value: torch.Tensor, dtype: torch.dtype, unit: str) -> None:
    cast = value.to(dtype)
    bad = ~torch.isfinite(cast)
    if not bool(bad.any()):
        return
    first = tuple(int(x) for x in torch.nonzero(bad)[0]) if bad.dim() else ()
    orig = value[first] if first else value
    was_finite = bool(torch.isfinite(orig.double()))
    at = f"[{', '.join(map(str, first))}]" if first else ""
    if was_finite:
        raise DataValidationError(
            f"{_where(k, source)}: {name}{at} = {float(orig):.6g} {unit} is finite in {value.dtype} but overflows "
            f"to {float(cast[first] if first else cast)} in the training dtype {dtype} (largest finite "
            f"{torch.finfo(dtype).max:.3g}); train in a wider dtype (--dtype float64), or fix the value (energies "
            "relative to per-element reference energies are small)")
    fix = "recompute its labels or drop the structure" if name in ("energy", "forces", "stress") else \
        "fix its geometry or drop the structure"
    raise DataValidationError(
        f"{_where(k, source)}: {name}{at} is {float(orig)} (not finite; {int(bad.sum())} such value(s)); {fix}")


def _symbol(z: int) -> str:
    return f" ({chemical_symbols[z]})" if 0 < z < len(chemical_symbols) else ""


def check_max_z(structures: Sequence[Data], max_z: int, *, source: str = "structure",
                model: str = "the model") -> None:
    """Refuse an atomic number beyond what ``model`` embeds (``max_z``), naming the first structure that has one
    (its index in ``structures``, ``source`` saying where they came from: ``"FILE: structure"``), the element and
    the fix; before any process starts (the model's own check would fail the run at its first step).

    Raises:
        DataValidationError: a structure with ``z > max_z``.
    """
    top = int(max_z)
    for k, data in enumerate(structures):
        z = data.z
        if z.numel() and int(z.max()) > top:
            bad = sorted({int(v) for v in z[z > top].tolist()})
            names = ", ".join(f"{_symbol(v).strip(' ()')} (Z = {v})" for v in bad)
            raise DataValidationError(
                f"{_where(k, source)} has {names}, beyond the atomic numbers 1 … {top} {model} embeds (max_z); "
                f"remove the structure, or use a model with a larger embedding (--model-arg max_z={max(bad)})")


def _check_cell(where: str, cell: np.ndarray, pbc: np.ndarray) -> None:
    if pbc.any() and _cell_is_singular(cell, pbc):
        raise DataValidationError(
            f"{where}: the cell is singular along its periodic directions (pbc={pbc.tolist()}, cell rows "
            f"{np.round(cell, 4).tolist()}); give independent non-zero cell vectors for the periodic "
            "directions, or set pbc False where the structure is not periodic")


def check_cells(structures: Sequence[Data], *, source: str = "structure", start: int = 0) -> None:
    """Refuse a periodic structure whose cell vectors along its periodic directions are zero or linearly dependent
    (checked before anything reads the cell: a neighbour search or its estimate divides by the cell's volume).

    Args:
        structures: ``Data`` with optional ``cell`` ``[1, 3, 3]`` (Å, rows) and ``pbc`` ``[1, 3]`` (bool).
        source: how messages name where the structures came from. start: the index of the first structure.

    Raises:
        DataValidationError: the first singular cell, naming the structure, its cell and the fix.
    """
    for k, data in enumerate(structures, start):
        cell, pbc = getattr(data, "cell", None), getattr(data, "pbc", None)
        if cell is None or pbc is None or cell.numel() != 9 or pbc.numel() != 3:
            continue  # no cell to judge (validate_structures names malformed shapes)
        _check_cell(_where(k, source), cell.detach().double().reshape(3, 3).numpy(),
                    pbc.detach().reshape(-1).bool().numpy())


def _cell_is_singular(cell: np.ndarray, pbc: np.ndarray) -> bool:
    rows = cell[pbc]
    if not len(rows):
        return False
    norms = np.linalg.norm(rows, axis=1)
    if np.any(norms < 1e-8):
        return True
    gram = np.linalg.det(rows @ rows.T)            # squared length / area / volume of the periodic vectors
    return not gram > (1e-8 * np.prod(norms)) ** 2


#: Å: the reach of the first search for a pair within the cutoff (a wider one follows only when it finds none)
ISOLATION_PROBE = 4.0


def _no_pair_within(pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray, reach: float, d: np.ndarray,
                    cutoff: float) -> bool:
    """Whether no pair of atoms is closer than ``cutoff``, given the distances ``d`` of the pairs within ``reach``."""
    return not bool(np.any(d < cutoff)) and not _pair_within(pos, cell, pbc, reach, cutoff)


def isolated_structures(structures: Sequence[Data], cutoff: float) -> list[int]:
    """The positions in ``structures`` of those with no pair of atoms (periodic images counted) within ``cutoff``
    Å: their neighbour graphs have no edges. Reads ``pos`` ``[n, 3]``, ``cell`` and ``pbc`` (cells assumed valid:
    :func:`check_cells`)."""
    out = []
    reach = min(float(cutoff), ISOLATION_PROBE)
    for k, data in enumerate(structures):
        pos = data.pos.detach().double().numpy()
        cell = getattr(data, "cell", None)
        pbc = getattr(data, "pbc", None)
        cell_np = np.zeros((3, 3)) if cell is None else cell.detach().double().reshape(3, 3).numpy()
        pbc_np = np.zeros(3, dtype=bool) if pbc is None else pbc.detach().reshape(-1).bool().numpy()
        d = graph.neighbor_pairs(pos, cell_np, pbc_np, reach)[3]
        if _no_pair_within(pos, cell_np, pbc_np, reach, d, cutoff):
            out.append(k)
    return out


def _pair_within(pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray, start: float, cutoff: float) -> bool:
    """Whether some pair (periodic images counted) is closer than ``cutoff``, known to have none closer than
    ``start``: searched at a doubling reach, so the search stops at about twice the nearest pair's distance instead
    of enumerating every pair within a large cutoff."""
    reach = start
    while reach < cutoff:
        reach = min(2.0 * reach, cutoff)
        if len(graph.neighbor_pairs(pos, cell, pbc, reach)[3]):
            return True
    return False


def _check_stress(where: str, k: int, source: str, data: Data, pbc: np.ndarray, dtype: torch.dtype) -> None:
    """A stress slot of the right shape (labelled or not) and a label that is finite on a cell periodic in 3D."""
    stress = getattr(data, "stress", None)
    has = getattr(data, "has_stress", None)
    if has is not None and (has.numel() != 1 or has.dtype != torch.bool):
        raise DataValidationError(f"{where}: has_stress must be one boolean [1] (whether stress is a label), got "
                                  f"{has.dtype} {list(has.shape)}")
    if stress is not None and tuple(stress.shape) not in ((1, 3, 3), (3, 3)):
        raise DataValidationError(f"{where}: stress must be [1, 3, 3] (eV/Å³; a file may give 9 values or 6 in "
                                  f"Voigt order), got {list(stress.shape)}; check stress_key names the structure's "
                                  "stress")
    labelled = bool(has.reshape(-1)[0]) if has is not None else stress is not None
    if not labelled:
        return
    if stress is None:
        raise DataValidationError(f"{where}: has_stress is True but it has no stress; give the stress [1, 3, 3] "
                                  "(eV/Å³) or set has_stress False")
    _finite(k, source, "stress", stress.reshape(3, 3), dtype, "eV/Å³")
    if not pbc.all():
        raise DataValidationError(f"{where}: has a stress label but its cell is not periodic in 3D (pbc="
                                  f"{pbc.tolist()}): a stress is per volume; give the structure its 3D periodic cell, "
                                  "or drop the stress label")


def validate_structures(structures: Sequence[Data], dtype: torch.dtype = torch.float32, *,
                        max_z: int | None = None, cutoff: float | None = None, min_distance: float = 0.1,
                        require_labels: bool = False, source: str = "structure", start: int = 0) -> None:
    """Check structures before training; raise on the first problem, warn for legal oddities.

    Checks, per structure ``k``: it has atoms; ``z`` is int [n] within 1..``max_z``; ``pos`` is [n, 3];
    ``pos``, ``cell``, ``energy``, ``forces`` are finite in ``dtype``; ``forces`` is [n, 3] and ``energy`` one
    value; ``stress`` is [1, 3, 3] and ``has_stress`` one boolean, and a stress label is finite in ``dtype`` on a
    cell periodic in 3D; a periodic direction has a cell vector and the periodic vectors are independent; no two
    atoms (periodic images counted) are closer than ``min_distance``; with ``cutoff``, a structure in which no atom
    has a neighbour within the cutoff gets a :class:`~gnnpipe.data.DataWarning` (it has no edges: only per-atom
    terms).

    Args:
        structures: list of ``Data`` (see :mod:`gnnpipe.data.atoms.structures`).
        dtype: the training dtype the values are judged in.
        max_z: the largest atomic number the model embeds (e.g. 100 for an ``Embedding(100, d)`` indexed by
            ``z`` minus nothing: pass ``num_embeddings - 1``); ``None``: the periodic table.
        cutoff: the model's cutoff in Å (enables the no-neighbour warning).
        min_distance: Å; closer atoms are taken as duplicated.
        require_labels: every structure needs ``energy`` and ``forces``.
        source: how messages name where the structures came from.
        start: the index messages give the first structure (a slice of a larger set).

    Raises:
        DataValidationError: the first failed check, naming the structure, the attribute and the fix.
    """
    top = MAX_ATOMIC_NUMBER if max_z is None else int(max_z)
    isolated = []
    for k, data in enumerate(structures, start):
        where = _where(k, source)
        z = getattr(data, "z", None)
        pos = getattr(data, "pos", None)
        if z is None or pos is None:
            raise DataValidationError(f"{where}: needs z (atomic numbers) and pos (positions, Å); build structures "
                                      "with gnnpipe.data.atoms.from_atoms or read_structures")
        n = int(z.numel())
        if n == 0:
            raise DataValidationError(f"{where}: has no atoms; remove empty structures from the data set")
        if z.dtype.is_floating_point or z.dim() != 1:
            raise DataValidationError(f"{where}: z must be an integer tensor [n], got {z.dtype} {list(z.shape)}; "
                                      "pass atomic numbers as int64")
        if int(z.min()) < 1 or int(z.max()) > top:
            bad = int(z[(z < 1) | (z > top)][0])
            fix = ("the model embeds atomic numbers 1.." + str(top) + "; use a model with a larger embedding "
                   "(max_z) or remove the structure") if max_z is not None else "atomic numbers are 1..118"
            raise DataValidationError(f"{where}: atomic number {bad}{_symbol(bad)} is out of range; {fix}")
        if tuple(pos.shape) != (n, 3):
            raise DataValidationError(f"{where}: pos must be [{n}, 3] (one row per atom), got {list(pos.shape)}")
        _finite(k, source, "pos", pos, dtype, "Å")
        cell = getattr(data, "cell", None)
        pbc = getattr(data, "pbc", None)
        cell_np = np.zeros((3, 3)) if cell is None else cell.detach().double().reshape(-1).numpy()
        if cell is not None:
            if cell.numel() != 9:
                raise DataValidationError(f"{where}: cell must be [1, 3, 3] (or [3, 3]), got {list(cell.shape)}")
            _finite(k, source, "cell", cell.reshape(3, 3), dtype, "Å")
            cell_np = cell_np.reshape(3, 3)
        pbc_np = np.zeros(3, dtype=bool) if pbc is None else pbc.detach().reshape(-1).bool().numpy()
        if pbc_np.size != 3:
            raise DataValidationError(f"{where}: pbc must be [1, 3] booleans, got {list(pbc.shape)}")
        _check_cell(where, cell_np, pbc_np)
        energy = getattr(data, "energy", None)
        forces = getattr(data, "forces", None)
        if require_labels and (energy is None or forces is None):
            missing = " and ".join(w for w, v in (("energy", energy), ("forces", forces)) if v is None)
            raise DataValidationError(f"{where}: no {missing} label; training needs both (read the file with "
                                      "energy_key=/forces_key= naming its keys)")
        if energy is not None:
            if energy.numel() != 1:
                raise DataValidationError(f"{where}: energy must be one value (eV) per structure, got shape "
                                          f"{list(energy.shape)}")
            _finite(k, source, "energy", energy.reshape(()), dtype, "eV")
        if forces is not None:
            if tuple(forces.shape) != (n, 3):
                raise DataValidationError(f"{where}: forces must be [{n}, 3] (one row per atom, eV/Å), got "
                                          f"{list(forces.shape)}; check forces_key and that the file's forces "
                                          "column belongs to this structure")
            _finite(k, source, "forces", forces, dtype, "eV/Å")
        _check_stress(where, k, source, data, pbc_np, dtype)
        pos_np = pos.detach().double().numpy()
        # the duplicate check and a first look for a pair within the cutoff read the pairs within a short reach
        # only: a search at a large cutoff would enumerate every pair in it (millions, for a periodic cell)
        reach = max(min_distance, min(cutoff, ISOLATION_PROBE) if cutoff else 0.0)
        if reach > 0:
            i, j, off, d = graph.neighbor_pairs(pos_np, cell_np, pbc_np, reach)
            if cutoff is not None and _no_pair_within(pos_np, cell_np, pbc_np, reach, d, cutoff):
                isolated.append(k)
            if len(d) and d.min() < min_distance:
                e = int(np.argmin(d))
                image = "" if not off[e].any() else f" (periodic image {off[e].tolist()})"
                raise DataValidationError(
                    f"{where}: atoms {int(i[e])} and {int(j[e])}{image} are {d[e]:.3g} Å apart, closer than "
                    f"{min_distance} Å (a duplicated atom, or a cell too small for its atoms); remove the duplicate "
                    "or fix the cell")
    if isolated:
        one = len(isolated) == 1
        shown = ", ".join(map(str, isolated[:10])) + (", …" if len(isolated) > 10 else "")
        origin = source[: -len("structure")].rstrip(": ") if source.endswith("structure") else source
        of = f" of {origin}" if origin else ""
        warnings.warn(f"{len(isolated)} structure{'' if one else 's'}{of} ({'index' if one else 'indices'} {shown}) "
                      f"{'has' if one else 'have'} no pair of atoms within the cutoff {cutoff} Å: "
                      f"{'its graph has' if one else 'their graphs have'} no edges, so a model sees only per-atom "
                      "terms; raise the cutoff if this is unintended", DataWarning, stacklevel=2)
