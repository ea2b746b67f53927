"""IS2RS and IS2RE metrics: how close relaxed structures are to the reference, how relaxed they truly are, and how
well their energies match.

Definitions: Chanussot et al., *Open Catalyst 2020 (OC20) Dataset and Community Challenges*, ACS Catal. 11, 6059
(2021), §IS2RS and §IS2RE; fairchem's ``ocpmodels/modules/evaluator.py`` (``average_distance_within_threshold``,
``min_diff``, ``energy_within_threshold``) for the three it implements, checked against its code:

* **distance** of a structure: the mean over its *free* atoms of ``|Δr|``, ``Δr`` the minimum-image displacement
  between the predicted and the reference relaxed position. fairchem's relaxations write the free atoms' positions
  only (``fixed == 0``) and its ``min_diff`` takes the fractional displacement in the reference cell, wraps it into
  ``[0, 1)`` along periodic directions and subtracts 1 above ½, so every component lies in ``(−½, ½]``. Here the
  wrap applies to periodic directions only: OC20's structures are periodic along all three cell vectors, where both
  agree; along a non-periodic direction (``pbc = [T, T, F]`` slabs) fairchem would also subtract a cell vector from
  a displacement above half the cell, which this module does not (a non-periodic displacement is what it is). A
  structure with no free atom counts all of its atoms (fairchem: an empty mean);
* **ADwT** (average distance within threshold): the fraction of structures whose distance is strictly below ``t``,
  averaged over ``t`` = 0.01, 0.011, …, 0.499 Å (:data:`ADWT_THRESHOLDS`, fairchem's ``np.arange(0.01, 0.5,
  0.001)``: 490 thresholds);
* **FbT** (forces below threshold): the fraction of predicted relaxed structures whose largest oracle force norm
  on a free atom is below 0.05 eV/Å — the oracle (DFT in OC20; any ASE calculator here, EMT by default) is
  evaluated *at the model's relaxed structure*, so FbT says whether the structure is truly relaxed, whether or not
  it is the reference's minimum (ADwT says that);
* **AFbT**: FbT averaged over the force thresholds 0.01, 0.011, …, 0.399 eV/Å (:data:`AFBT_THRESHOLDS`, 390
  thresholds; the paper's 0.01 to 0.4 eV/Å), over *all* structures — not only those within an ADwT threshold.
  fairchem's evaluator has no FbT / AFbT (they need the oracle's single points; OC20's evaluation server runs DFT),
  so these two follow the paper's text;
* **IS2RE energy MAE**: mean ``|E_model(relaxed) − E_ref(relaxed)|`` (eV), and **EwT**: the fraction of
  structures with that error strictly below 0.02 eV (fairchem's ``energy_within_threshold``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import numpy as np
from ase import Atoms
from ase.geometry import complete_cell

from ..data.atoms import to_atoms
from ..data.atoms.structures import _fixed, _label
from ..errors import ConfigError, DataValidationError

__all__ = ["ADWT_THRESHOLDS", "AFBT_THRESHOLDS", "EWT_THRESHOLD", "FBT_THRESHOLD", "ORACLES", "adwt", "afbt",
           "check_pairs", "energy_metrics", "evaluate_is2rs", "fbt", "get_oracle", "mean_distances",
           "oracle_max_forces", "structure_energies"]

#: Å: ADwT's thresholds (0.01 … 0.499, step 0.001; fairchem's ``np.arange(0.01, 0.5, 0.001)``)
ADWT_THRESHOLDS = np.arange(0.01, 0.5, 0.001)
#: eV/Å: AFbT's thresholds (0.01 … 0.399, step 0.001)
AFBT_THRESHOLDS = np.arange(0.01, 0.4, 0.001)
#: eV/Å: FbT's threshold
FBT_THRESHOLD = 0.05
#: eV: EwT's threshold (fairchem's ``energy_within_threshold``)
EWT_THRESHOLD = 0.02

#: oracles by name: ``module:Class`` of an ASE calculator built with no arguments
ORACLES = {"emt": "ase.calculators.emt:EMT", "lj": "ase.calculators.lj:LennardJones"}


def _arrays(s):
    """``(numbers [n], pos [n, 3], cell [3, 3], pbc [3], fixed [n])`` of an ``ase.Atoms`` or a structure ``Data``."""
    if isinstance(s, Atoms):
        return s.numbers, s.positions, s.cell.array, np.asarray(s.pbc, bool), _fixed(s)
    fixed = getattr(s, "fixed", None)
    n = int(s.z.numel())
    return (s.z.numpy(), s.pos.detach().double().numpy(), s.cell.reshape(3, 3).double().numpy(),
            s.pbc.reshape(3).numpy().astype(bool),
            fixed.numpy().astype(bool) if fixed is not None else np.zeros(n, bool))


def check_pairs(predicted: Sequence, reference: Sequence, what: str = "relaxed") -> None:
    """Raise unless ``predicted`` and ``reference`` hold the same structures in the same order (atomic numbers,
    fixed atoms, cell).

    Raises:
        DataValidationError: different counts, or the first structure that differs (named, with the fix).
    """
    if len(predicted) != len(reference):
        raise DataValidationError(f"{len(predicted)} {what} structures but {len(reference)} reference structures; "
                                  "give the reference file generated with the initial one (same structures, order)")
    for k, (p, r) in enumerate(zip(predicted, reference)):
        zp, _, cp, _, fp = _arrays(p)
        zr, _, cr, _, fr = _arrays(r)
        if len(zp) != len(zr) or not np.array_equal(zp, zr):
            raise DataValidationError(f"structure {k}: its atoms ({len(zp)}) differ from the reference's ({len(zr)}) "
                                      "in number or element order; the initial and reference files must hold the "
                                      "same structures in the same order")
        if not np.array_equal(fp, fr) or not np.allclose(cp, cr, atol=1e-6):
            raise DataValidationError(f"structure {k}: fixed atoms or cell differ from the reference's; the initial "
                                      "and reference files must hold the same structures in the same order")


def _min_image(diff: np.ndarray, cell: np.ndarray, pbc: np.ndarray) -> np.ndarray:
    """Minimum-image displacements ``[n, 3]`` Å: fractional components along periodic directions wrapped into
    ``(−½, ½]`` (fairchem's ``min_diff``; non-periodic components left as they are)."""
    if not pbc.any():
        return diff

    full = complete_cell(cell)
    frac = np.linalg.solve(full.T, diff.T).T
    for c in range(3):
        if pbc[c]:
            frac[:, c] = np.mod(frac[:, c], 1.0)
            frac[:, c] = np.mod(frac[:, c], 1.0)
            frac[frac[:, c] > 0.5, c] -= 1.0
    return frac @ full


def mean_distances(predicted: Sequence, reference: Sequence) -> np.ndarray:
    """float64 ``[S]`` Å: per structure, the mean minimum-image distance of its free atoms between ``predicted`` and
    ``reference`` positions (``ase.Atoms`` or structure ``Data``; the reference's cell and pbc). A structure with
    no free atom counts all of its atoms.

    Raises:
        DataValidationError: the two lists do not hold the same structures in order (``check_pairs``).
    """
    check_pairs(predicted, reference)
    out = np.zeros(len(predicted))
    for k, (p, r) in enumerate(zip(predicted, reference)):
        _, pp, _, _, _ = _arrays(p)
        _, pr, cell, pbc, fixed = _arrays(r)
        d = np.linalg.norm(_min_image(pp - pr, cell, pbc), axis=1)
        free = ~fixed if (~fixed).any() else np.ones_like(fixed)
        out[k] = float(d[free].mean()) if len(d) else 0.0
    return out


def _within(values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``[T]``: the fraction of ``values`` strictly below each threshold."""
    v = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    if v.size == 0:
        return np.zeros(len(thresholds))
    return (v < np.asarray(thresholds).reshape(1, -1)).mean(axis=0)


def adwt(distances: np.ndarray, thresholds: np.ndarray = ADWT_THRESHOLDS) -> float:
    """ADwT of per-structure mean distances (float ``[S]``, Å): the fraction strictly below each threshold, averaged
    over the thresholds (OC20 §IS2RS; fairchem's ``average_distance_within_threshold``). 0 for no structure."""
    return float(_within(distances, thresholds).mean())


def fbt(max_forces: np.ndarray, threshold: float = FBT_THRESHOLD) -> float:
    """FbT: the fraction of structures whose largest oracle force norm on a free atom (float ``[S]``, eV/Å) is
    strictly below ``threshold`` (OC20 §IS2RS: 0.05 eV/Å)."""
    return float(_within(max_forces, np.array([threshold]))[0])


def afbt(max_forces: np.ndarray, thresholds: np.ndarray = AFBT_THRESHOLDS) -> float:
    """AFbT: FbT averaged over ``thresholds`` (eV/Å; OC20 §IS2RS: 0.01 to 0.4 eV/Å), every structure counted."""
    return float(_within(max_forces, thresholds).mean())


def get_oracle(oracle="emt"):
    """An ASE calculator: a name of ``ORACLES``, ``"module:Class"`` (built with no arguments), or a calculator.

    Raises:
        ConfigError: an unknown name, or a class that cannot be imported or built.
    """
    if not isinstance(oracle, str):
        if not hasattr(oracle, "get_forces") and not hasattr(oracle, "calculate"):
            raise ConfigError(f"oracle {oracle!r} is not an ASE calculator")
        return oracle
    spec = ORACLES.get(oracle.lower(), oracle)
    if ":" not in spec:
        raise ConfigError(f"unknown oracle {oracle!r}; use one of {', '.join(ORACLES)} or module:Class of an ASE "
                          "calculator (e.g. ase.calculators.emt:EMT)")
    module, _, name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
        return cls()
    except Exception as exc:  # noqa: BLE001 - an import error, a missing class, a constructor that needs arguments
        raise ConfigError(f"cannot build oracle {oracle!r} ({type(exc).__name__}: {exc}); give module:Class of an "
                          "ASE calculator that needs no arguments, or one of " + ", ".join(ORACLES)) from None


def oracle_max_forces(structures: Sequence, oracle="emt") -> np.ndarray:
    """float64 ``[S]`` eV/Å: the largest force norm on a free atom, by the oracle, at each structure (``ase.Atoms``
    or ``Data``; ``FixAtoms`` / ``fixed`` zero the fixed atoms' forces, as ``Atoms.get_forces`` does).

    Raises:
        ConfigError: an unknown oracle. DataValidationError: the oracle cannot compute a structure (e.g. an element
            EMT has no parameters for).
    """
    calc = get_oracle(oracle)
    out = np.zeros(len(structures))
    for k, s in enumerate(structures):
        a = s.copy() if isinstance(s, Atoms) else to_atoms(s)
        a.calc = calc
        try:
            f = a.get_forces()
        except Exception as exc:  # noqa: BLE001 - whatever the calculator raises
            raise DataValidationError(f"structure {k}: the oracle {type(calc).__name__} cannot compute it "
                                      f"({type(exc).__name__}: {exc}); choose an oracle for its elements") from None
        out[k] = float(np.linalg.norm(f, axis=1).max()) if len(f) else 0.0
    return out


def _energy(s) -> float | None:
    if isinstance(s, Atoms):
        e = _label(s, "energy", "energy")
        return None if e is None else float(e)
    e = getattr(s, "energy", None)
    return None if e is None else float(e.reshape(-1)[0])


def structure_energies(structures: Sequence) -> list[float | None]:
    """The energy (eV) of each structure (``ase.Atoms``: ``info["energy"]`` or its calculator's; ``Data``: its
    ``energy``), ``None`` where it has none."""
    return [_energy(s) for s in structures]


def energy_metrics(predicted: Sequence[float], reference: Sequence[float]) -> dict:
    """The IS2RE energy metrics of predicted against reference relaxed energies (eV, same order): ``energy_mae``
    (eV), ``ewt`` (the fraction strictly within :data:`EWT_THRESHOLD`) and ``ewt_threshold``; ``{}`` for no
    structure.

    Raises:
        DataValidationError: the two lists differ in length, or a value is missing (``None``).
    """
    if len(predicted) != len(reference):
        raise DataValidationError(f"{len(predicted)} predicted energies but {len(reference)} reference energies")
    if not len(predicted):
        return {}
    missing = [k for k, (p, r) in enumerate(zip(predicted, reference)) if p is None or r is None]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataValidationError(f"structure {missing[0]}{more} has no energy; the IS2RE metrics need the relaxed "
                                  "energy of every structure and of its reference")
    err = np.abs(np.asarray(predicted, dtype=np.float64) - np.asarray(reference, dtype=np.float64))
    return {"energy_mae": float(err.mean()), "ewt": float((err < EWT_THRESHOLD).mean()),
            "ewt_threshold": EWT_THRESHOLD}


def evaluate_is2rs(relaxed: Sequence, reference: Sequence, *, oracle="emt", initial: Sequence | None = None) -> dict:
    """The IS2RS and IS2RE metrics of model-relaxed structures against reference relaxed structures.

    Args:
        relaxed: the model's relaxed structures (``ase.Atoms`` or ``Data``) with their model energies (eV).
        reference: the reference relaxed structures, same order, with reference energies (eV).
        oracle: the ASE calculator whose forces at ``relaxed`` give FbT / AFbT (:func:`get_oracle`); ``None``
            skips them.
        initial: the initial structures, when given checked against ``reference`` too.

    Returns:
        dict: JSON-ready, ``task`` (``"is2rs"``), ``structures``, ``adwt``, ``fbt``, ``afbt``, ``fbt_threshold``
        (eV/Å), ``energy_mae`` (eV), ``ewt``, ``ewt_threshold`` (eV), ``mean_distance`` (Å, mean over structures),
        ``distances`` and ``max_forces`` (per structure), ``curves`` (``adwt``: thresholds Å and fractions;
        ``fbt``: thresholds eV/Å and fractions), ``oracle``.

    Raises:
        DataValidationError: the lists differ in structures or order; a structure without an energy.
        ConfigError: an unknown oracle.
    """
    if initial is not None:
        check_pairs(initial, reference, what="initial")
    dist = mean_distances(relaxed, reference)
    out = {"task": "is2rs", "structures": len(relaxed), "adwt": adwt(dist), "mean_distance": float(dist.mean())
           if len(dist) else 0.0, "distances": dist.tolist(),
           "curves": {"adwt": {"thresholds": ADWT_THRESHOLDS.round(6).tolist(),
                               "fraction": _within(dist, ADWT_THRESHOLDS).tolist()}}}
    if oracle is not None:
        calc = get_oracle(oracle)
        fmax = oracle_max_forces(relaxed, calc)
        out.update(oracle=type(calc).__name__, fbt=fbt(fmax), fbt_threshold=FBT_THRESHOLD, afbt=afbt(fmax),
                   max_forces=fmax.tolist())
        out["curves"]["fbt"] = {"thresholds": AFBT_THRESHOLDS.round(6).tolist(),
                                "fraction": _within(fmax, AFBT_THRESHOLDS).tolist()}
    e_pred, e_ref = structure_energies(relaxed), structure_energies(reference)
    if all(e is not None for e in e_pred + e_ref):
        out.update(energy_metrics(e_pred, e_ref))
    return out
