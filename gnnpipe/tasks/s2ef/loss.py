"""The S2EF loss and metrics, written as sums over a rank's structures and atoms divided by global counts.

Loss (fairchem's): ``energy_coef · L(ê, e) + force_coef · L(F̂, F)`` with ``L`` the mean absolute (``l1``) or
mean squared (``mse``) error — over the ``B`` structures of the (global) batch with an energy label for the
energy, over the ``3·n_free`` force components of the free atoms (``fixed`` False) of its structures with forces
(:mod:`.labels`). Each rank computes the *sum* over its share
and divides by the *global* ``B`` and ``n_free``; the ranks' gradients summed are then exactly the gradient of the
loss of the whole batch, whatever the shares (an uneven or empty last share included).

Metrics (OC20's): energy MAE (eV, and per atom: ``|ΔE| / n_atoms``), force MAE (eV/Å, over the components of free
atoms), force cosine (mean over free atoms of ``cos(F̂_a, F_a)``), EFwT (the share of structures whose energy is
within 0.02 eV and every free atom's force components within 0.03 eV/Å; Chanussot et al. 2021, OC20). Each over
the structures that have its labels (EFwT: both); a metric no structure is labelled for is NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: EFwT thresholds: energy (eV) and force component (eV/Å)
EFWT_ENERGY, EFWT_FORCE = 0.02, 0.03
#: GPa per eV/Å³
GPA_PER_EV_A3 = 160.21766208


def _elementwise(diff: Tensor, loss_fn: str) -> Tensor:
    return diff.abs() if loss_fn == "l1" else diff.square()


def s2ef_loss(energy: Tensor, energy_target: Tensor, forces: Tensor, forces_target: Tensor, free: Tensor, *,
              num_structures: int, num_free: int, energy_coef: float, force_coef: float,
              loss_fn: str = "l1", energy_mask: Tensor | None = None) -> Tensor:
    """This rank's part of the loss of a global batch (normalised targets).

    Args:
        energy, energy_target: ``[b]`` this rank's structures. forces, forces_target: ``[n, 3]`` its atoms.
        free: ``[n]`` bool, atoms in the force loss (free atoms of structures with forces: :func:`.labels.force_mask`).
        num_structures, num_free: ``B`` (structures with an energy) and ``n_free`` (atoms in the force loss) of the
            global batch (all ranks together).
        loss_fn: ``"l1"`` or ``"mse"``. energy_mask: ``[b]`` bool, structures in the energy loss (``None``: all).

    Returns:
        a scalar; the ranks' values (and gradients) summed give the loss of the global batch.
    """
    return (energy_loss(energy, energy_target, num_structures=num_structures, energy_coef=energy_coef,
                        loss_fn=loss_fn, mask=energy_mask)
            + force_loss(forces, forces_target, free, num_free=num_free, force_coef=force_coef, loss_fn=loss_fn))


def stress_loss(stress: Tensor, stress_target: Tensor, mask: Tensor, *, num_stress: int, stress_coef: float,
                loss_fn: str = "l1") -> Tensor:
    """The stress term: ``stress_coef · L(σ̂, σ)`` over the 9 components of this rank's structures with a stress label
    (``mask`` ``[b]``; ``[b, 3, 3]`` normalised stresses), divided by ``9 · num_stress`` of the global batch."""
    err = _elementwise(stress[mask] - stress_target[mask], loss_fn)
    return stress_coef * (err.sum() / max(9 * num_stress, 1))


def energy_loss(energy: Tensor, energy_target: Tensor, *, num_structures: int, energy_coef: float,
                loss_fn: str = "l1", mask: Tensor | None = None) -> Tensor:
    """The energy term of :func:`s2ef_loss` (``[b]`` energies; ``num_structures``: the global ``B``; ``mask``: the
    structures with an energy label); a pipeline adds it where the energies are (the last stage)."""
    err = _elementwise(energy - energy_target, loss_fn)
    if mask is not None and not bool(mask.all()):
        err = err[mask]
    return energy_coef * (err.sum() / max(num_structures, 1))


def force_loss(forces: Tensor, forces_target: Tensor, free: Tensor, *, num_free: int, force_coef: float,
               loss_fn: str = "l1") -> Tensor:
    """The force term of :func:`s2ef_loss` (``[n, 3]`` forces, ``[n]`` free mask; ``num_free``: the global
    ``n_free``); a pipeline with conservative forces adds it where the forces are formed (the first stage)."""
    return force_coef * (_elementwise(forces[free] - forces_target[free], loss_fn).sum() / max(3 * num_free, 1))


def _on_cpu(*tensors):
    """The tensors on the CPU (a GPU rank's metrics are summed there; CPU tensors are returned as they are)."""
    return [t if t is None or not isinstance(t, Tensor) else t.cpu() for t in tensors]


class S2EFMetrics:
    """Sums of the metrics over the structures one rank saw (:meth:`update`); :meth:`totals` is a float64 CPU
    tensor to all-reduce, :meth:`compute` the means. Energies in eV, forces in eV/Å. The updates take tensors on
    any device (they are summed on the CPU)."""

    FIELDS = ("n_structures", "energy_ae", "energy_ae_per_atom", "n_free", "force_ae", "force_cos", "efwt", "loss",
              "n_efwt", "n_stress", "stress_ae")

    def __init__(self):
        self.sums = torch.zeros(len(self.FIELDS), dtype=torch.float64)

    @torch.no_grad()
    def update(self, energy: Tensor, energy_target: Tensor, forces: Tensor, forces_target: Tensor, free: Tensor,
               natoms: Tensor, batch: Tensor, loss: float = 0.0, energy_mask: Tensor | None = None,
               forces_mask: Tensor | None = None) -> None:
        """Add a batch (``energy`` ``[b]`` eV, ``forces`` ``[n, 3]`` eV/Å, ``free`` ``[n]``: the atoms in the force
        metrics, ``natoms`` ``[b]``, ``batch`` ``[n]``; ``loss``: its loss term, summed as given;
        ``energy_mask`` ``[b]``: structures with an energy label, ``forces_mask`` ``[b]``: with forces (``None``:
        all))."""
        energy, energy_target, forces, forces_target, free, natoms, batch, energy_mask, forces_mask = _on_cpu(
            energy, energy_target, forces, forces_target, free, natoms, batch, energy_mask, forces_mask)
        e_err = (energy.double() - energy_target.double()).abs()
        f_err = (forces.double() - forces_target.double()).abs()
        fe = f_err[free]
        cos = torch.nn.functional.cosine_similarity(forces.double()[free], forces_target.double()[free], dim=-1,
                                                    eps=1e-12)
        worst = torch.zeros(energy.numel(), dtype=torch.float64)
        if fe.numel():
            worst = worst.scatter_reduce(0, batch[free], fe.amax(-1), reduce="amax", include_self=True)
        ok = (e_err < EFWT_ENERGY) & (worst < EFWT_FORCE)
        both = torch.ones(energy.numel(), dtype=torch.bool)
        if energy_mask is not None:
            both &= energy_mask.cpu()
            e_err = e_err[energy_mask]
            natoms = natoms[energy_mask]
        if forces_mask is not None:
            both &= forces_mask.cpu()
        self.sums[:9] += torch.tensor([e_err.numel(), e_err.sum(), (e_err / natoms.double()).sum(), int(free.sum()),
                                       fe.sum(), cos.sum(), (ok & both.to(ok.device)).sum(), loss, both.sum()],
                                      dtype=torch.float64)

    @torch.no_grad()
    def update_stress(self, stress: Tensor, stress_target: Tensor, mask: Tensor) -> None:
        """Add the stresses (eV/Å³, ``[b, 3, 3]``) of the structures with a stress label (``mask`` ``[b]``)."""
        stress, stress_target, mask = _on_cpu(stress, stress_target, mask)
        err = (stress.double() - stress_target.double()).abs()[mask.to(stress.device)]
        self.sums[9:11] += torch.tensor([err.shape[0], err.sum()], dtype=torch.float64)

    @torch.no_grad()
    def update_energy(self, energy: Tensor, energy_target: Tensor, natoms: Tensor, loss: float = 0.0,
                      mask: Tensor | None = None) -> None:
        """Add only the energy fields of a batch (a pipeline stage that holds the energies, not the forces;
        ``mask``: the structures with an energy label)."""
        energy, energy_target, natoms, mask = _on_cpu(energy, energy_target, natoms, mask)
        e_err = (energy.double() - energy_target.double()).abs()
        if mask is not None:
            e_err, natoms = e_err[mask], natoms[mask]
        self.sums[:3] += torch.tensor([e_err.numel(), e_err.sum(), (e_err / natoms.double()).sum()],
                                      dtype=torch.float64)
        self.sums[7] += loss

    @torch.no_grad()
    def update_forces(self, forces: Tensor, forces_target: Tensor, free: Tensor, loss: float = 0.0) -> None:
        """Add only the force fields of a batch (a pipeline stage that holds the forces, not the energies)."""
        forces, forces_target, free = _on_cpu(forces, forces_target, free)
        fe = (forces.double() - forces_target.double()).abs()[free]
        cos = torch.nn.functional.cosine_similarity(forces.double()[free], forces_target.double()[free], dim=-1,
                                                    eps=1e-12)
        self.sums[3:6] += torch.tensor([int(free.sum()), fe.sum(), cos.sum()], dtype=torch.float64)
        self.sums[7] += loss

    def totals(self) -> Tensor:
        return self.sums

    def compute(self, sums: Tensor | None = None, prefix: str = "") -> dict:
        """The means (``sums``: all-reduced :meth:`totals`, default this rank's): ``energy_mae``,
        ``energy_mae_per_atom``, ``force_mae``, ``force_cos``, ``efwt``, and, where structures have stresses,
        ``stress_mae`` (eV/Å³) and ``stress_mae_gpa``."""
        s = dict(zip(self.FIELDS, (sums if sums is not None else self.sums).tolist()))
        nb, nf, ne = s["n_structures"], s["n_free"], s["n_efwt"]
        nan = float("nan")
        stress = {} if not s["n_stress"] else {
            f"{prefix}stress_mae": s["stress_ae"] / (9 * s["n_stress"]),
            f"{prefix}stress_mae_gpa": s["stress_ae"] / (9 * s["n_stress"]) * GPA_PER_EV_A3}
        return stress | {f"{prefix}energy_mae": s["energy_ae"] / nb if nb else nan,
                f"{prefix}energy_mae_per_atom": s["energy_ae_per_atom"] / nb if nb else nan,
                f"{prefix}force_mae": s["force_ae"] / (3 * nf) if nf else nan,
                f"{prefix}force_cos": s["force_cos"] / nf if nf else nan,
                f"{prefix}efwt": s["efwt"] / ne if ne else nan}
