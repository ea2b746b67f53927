"""Energy targets referenced and normalised (fairchem's per-element linear reference, then mean and std).

A structure's energy is first reduced by a per-element reference ``E_ref = Σ_a c[z_a]`` (a composition model: what
atoms of each element contribute), then normalised. The reference (``--energy-reference``) is ``linear``: fitted
on the training split by least squares (the default); ``none``: no reference (``c = 0``: the targets are the
energies as given, e.g. adsorption energies); or a file of per-element energies (eV per atom): fairchem's
``element_references`` (``.pt``: a state dict with an ``element_references`` tensor indexed by atomic number;
``.npz`` with ``element_references`` or ``coeff``), or a JSON / TOML table ``{element symbol or atomic number:
eV}``. Then ``ê = (E − E_ref − μ) / σ`` with ``μ``, ``σ`` the mean and standard deviation of the referenced
training energies. Forces are divided by the same ``σ`` (``F̂ = F / σ``), so a model trained on ``ê`` with
conservative forces ``−∂ê/∂pos`` predicts ``F = σ · F̂`` in eV/Å: the normalisation keeps forces conservative.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import tomllib
import torch
from ase.data import atomic_numbers
from torch import Tensor

from ...errors import ConfigError


@attrs.define
class EnergyNormalizer:
    """The fitted reference ``coef`` (eV per atom of each element, indexed by atomic number) and ``mean``, ``std``
    (eV per structure) of the referenced training energies.

    Attributes:
        coef: ``[Z_max + 1]`` float64 list (0 for elements absent from the training split).
        mean, std: floats in eV (``std`` is 1 when the referenced energies do not vary).
        elements: the atomic numbers of the training split, ascending: the elements whose reference was fitted
            and whose embedding was trained (what a model file records of them; ``None`` in files written before
            it was recorded).
    """

    coef: list
    mean: float = 0.0
    std: float = 1.0
    elements: list | None = None

    @classmethod
    def fit(cls, structures: Sequence, max_z: int = 118, reference: str = "linear") -> EnergyNormalizer:
        """Fit on the ``structures`` with an energy label (each with ``z`` ``[n]`` and ``energy`` ``[1]`` in eV;
        structures flagged ``has_energy`` False are left out): the reference (module docstring: ``linear``, least
        squares of the energies on the element counts, ``torch.linalg.lstsq``, minimum-norm for elements that always
        appear together; ``none``; or a file), then the mean and std of the referenced energies. A set without any
        energy (force-only) gets ``mean`` 0 and ``std`` 1 (forces are then trained in eV/Å as given).

        Raises:
            ValueError: no structure. ConfigError: a reference file that cannot be read or names unknown elements.
        """
        if not structures:
            raise ValueError("cannot fit the energy reference on no structures (an empty training split)")
        labelled = [d for d in structures if getattr(d, "energy", None) is not None
                    and (getattr(d, "has_energy", None) is None or bool(d.has_energy.reshape(-1)[0]))]
        present = torch.zeros(max_z + 1, dtype=torch.bool)
        for d in structures:
            present[d.z.long().clamp(max=max_z)] = True
        elements = torch.nonzero(present).flatten().tolist()
        counts = torch.zeros(len(labelled), max_z + 1, dtype=torch.float64)
        energy = torch.empty(len(labelled), dtype=torch.float64)
        for s, d in enumerate(labelled):
            counts[s] += torch.bincount(d.z.long(), minlength=max_z + 1).to(torch.float64)
            energy[s] = float(d.energy.reshape(-1)[0])
        coef = torch.zeros(max_z + 1, dtype=torch.float64)
        if reference == "linear" and labelled:
            used = counts.sum(0) > 0
            sol = torch.linalg.lstsq(counts[:, used], energy.unsqueeze(1), driver="gelsd").solution.squeeze(1)
            coef[used] = sol
        elif reference not in ("linear", "none"):
            coef = read_element_references(reference, max_z)
        if not labelled:
            return cls(coef=coef.tolist(), mean=0.0, std=1.0, elements=elements)
        resid = energy - counts @ coef
        std = float(resid.std()) if len(labelled) > 1 else 0.0
        return cls(coef=coef.tolist(), mean=float(resid.mean()), std=std if std > 1e-8 else 1.0, elements=elements)

    def reference(self, z: Tensor, batch: Tensor, num_structures: int) -> Tensor:
        """``[B]`` float64: ``E_ref`` of each structure of a batch (``z``, ``batch`` ``[N]``)."""
        c = torch.tensor(self.coef, dtype=torch.float64, device=z.device)
        zz = z.long().clamp(max=len(self.coef) - 1)
        out = torch.zeros(num_structures, dtype=torch.float64, device=z.device)
        return out.index_add_(0, batch, c[zz])

    def normalise(self, energy: Tensor, ref: Tensor) -> Tensor:
        """``(E − E_ref − μ) / σ`` in ``energy``'s dtype."""
        return ((energy.to(torch.float64) - ref - self.mean) / self.std).to(energy.dtype)

    def denormalise(self, e_hat: Tensor, ref: Tensor) -> Tensor:
        """``ê · σ + μ + E_ref`` (eV) in ``e_hat``'s dtype (differentiable in ``e_hat``)."""
        return e_hat * self.std + (ref + self.mean).to(e_hat.dtype)

    def to_dict(self) -> dict:
        out = {"coef": list(self.coef), "mean": self.mean, "std": self.std}
        if self.elements is not None:
            out["elements"] = [int(z) for z in self.elements]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> EnergyNormalizer:
        elements = d.get("elements")
        return cls(coef=list(d["coef"]), mean=float(d["mean"]), std=float(d["std"]),
                   elements=None if elements is None else [int(z) for z in elements])


#: the ``--energy-reference`` values besides a file
REFERENCES = ("linear", "none")


def read_element_references(path: str, max_z: int = 118) -> Tensor:
    """Per-element reference energies (eV per atom) ``[max_z + 1]`` float64 from a file (module docstring).

    Raises:
        ConfigError: a missing or unreadable file, an unknown element, a value that is not a finite number.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"--energy-reference {path!r}: no such file; give linear, none, or a file of per-element "
                          f"energies (.pt / .npz as fairchem writes them, .json / .toml {{element: eV}})")
    out = torch.zeros(max_z + 1, dtype=torch.float64)
    try:
        if p.suffix == ".pt":
            values = torch.load(p, map_location="cpu", weights_only=True)["element_references"]
            table = {z: float(v) for z, v in enumerate(torch.as_tensor(values).reshape(-1).tolist())}
        elif p.suffix == ".npz":
            with np.load(p) as f:
                values = f["element_references"] if "element_references" in f else f["coeff"]
            table = {z: float(v) for z, v in enumerate(values.reshape(-1).tolist())}
        elif p.suffix == ".toml":
            table = tomllib.loads(p.read_text())
        else:
            table = json.loads(p.read_text())
    except Exception as exc:  # noqa: BLE001 - every reader's error is a file the user must fix
        raise ConfigError(f"--energy-reference {p}: cannot read it ({type(exc).__name__}: {exc}); give a .pt / .npz "
                          f"of fairchem's element_references or a .json / .toml {{element: eV}}") from None
    for key, value in table.items():
        z = int(key) if str(key).isdigit() else atomic_numbers.get(str(key))
        if z is None or not 0 <= z <= max_z:
            raise ConfigError(f"--energy-reference {p}: unknown element {key!r}; name elements by symbol or atomic "
                              f"number")
        if not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise ConfigError(f"--energy-reference {p}: {key} = {value!r} is not a finite energy in eV")
        out[z] = float(value)
    return out
