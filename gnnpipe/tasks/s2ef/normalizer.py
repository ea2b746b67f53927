"""Energy targets referenced and normalised (fairchem's per-element linear reference, then mean and std).

A structure's energy is first reduced by a per-element linear reference fitted on the training split by least
squares, ``E_ref = Σ_a c[z_a]`` (a composition model: what atoms of each element contribute on average), then
normalised: ``ê = (E − E_ref − μ) / σ`` with ``μ``, ``σ`` the mean and standard deviation of the referenced
training energies. Forces are divided by the same ``σ`` (``F̂ = F / σ``), so a model trained on ``ê`` with
conservative forces ``−∂ê/∂pos`` predicts ``F = σ · F̂`` in eV/Å: the normalisation keeps forces conservative.
"""

from __future__ import annotations

from typing import Optional, Sequence

import attrs
import torch
from torch import Tensor


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
    elements: Optional[list] = None

    @classmethod
    def fit(cls, structures: Sequence, max_z: int = 118) -> "EnergyNormalizer":
        """Fit on ``structures`` (each with ``z`` ``[n]`` and ``energy`` ``[1]`` in eV): least squares of the
        energies on the element counts (``torch.linalg.lstsq``, minimum-norm for elements that always appear
        together), then the mean and std of the residuals.

        Raises:
            ValueError: no structure, or one without an energy label.
        """
        if not structures:
            raise ValueError("cannot fit the energy reference on no structures (an empty training split)")
        counts = torch.zeros(len(structures), max_z + 1, dtype=torch.float64)
        energy = torch.empty(len(structures), dtype=torch.float64)
        for s, d in enumerate(structures):
            if getattr(d, "energy", None) is None:
                raise ValueError(f"structure {s} of the training split has no energy label")
            counts[s] += torch.bincount(d.z.long(), minlength=max_z + 1).to(torch.float64)
            energy[s] = float(d.energy.reshape(-1)[0])
        present = counts.sum(0) > 0
        sol = torch.linalg.lstsq(counts[:, present], energy.unsqueeze(1), driver="gelsd").solution.squeeze(1)
        coef = torch.zeros(max_z + 1, dtype=torch.float64)
        coef[present] = sol
        resid = energy - counts @ coef
        std = float(resid.std()) if len(structures) > 1 else 0.0
        return cls(coef=coef.tolist(), mean=float(resid.mean()), std=std if std > 1e-8 else 1.0,
                   elements=torch.nonzero(present).flatten().tolist())

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
    def from_dict(cls, d: dict) -> "EnergyNormalizer":
        elements = d.get("elements")
        return cls(coef=list(d["coef"]), mean=float(d["mean"]), std=float(d["std"]),
                   elements=None if elements is None else [int(z) for z in elements])
