"""Positions and cells relaxed together: ASE's ``FrechetCellFilter`` over a batch of structures, in torch.

A structure of ``n`` atoms relaxes ``n + 3`` rows of generalised coordinates (as the filter's ``get_positions``):
its atoms' positions in the undeformed cell, ``x = r · F⁻ᵀ``, and ``c · log F`` (3 rows), where
``F = (C₀⁻¹ C)ᵀ`` is the deformation gradient from the initial cell ``C₀`` (rows are cell vectors) to the current
``C = C₀ Fᵀ`` and ``c`` the ``exp_cell_factor`` (default ``n``). (ASE's filter holds ``c · log(n F)`` there: a
constant offset, which no step or force depends on.) The generalised forces (the filter's
``get_forces``) are ``F_atoms · F`` on the atom rows and, on the cell rows, the gradient of the energy with respect
to ``log F``: the adjoint of the Fréchet derivative of ``exp`` at ``log F`` applied to ``W F⁻ᵀ``, where
``W = −V (σ + p I)`` is the virial (``σ`` the stress, ``p`` the ``scalar_pressure``), over ``c``. The optimizer
sees the structure's ``n + 3`` rows as ASE's sees the filter's, so each structure takes the steps
``FIRE(FrechetCellFilter(atoms))`` (or L-BFGS) takes on it alone, and stops when the largest row norm, atoms' forces
and cell rows alike, is below ``fmax``.

Sources: ASE's ``ase.filters.FrechetCellFilter`` (after Ortner's ``JuLIP.jl`` ``expcell``); the Fréchet derivative
of the matrix exponential as the upper-right block of ``exp([[A, E], [0, A]])`` (Higham, *Functions of Matrices*,
SIAM 2008, §3.2 and Thm. 10.13), whose adjoint at ``A`` is the derivative at ``Aᵀ``.

Shapes: ``B`` structures, ``N`` atoms; positions and forces float64 ``[N, 3]`` (Å, eV/Å), cells ``[B, 3, 3]`` (Å),
stresses ``[B, 3, 3]`` (eV/Å³), generalised coordinates and forces ``[N + 3B, 3]``: the atoms' rows first, in batch
order, then three rows per structure.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError

__all__ = ["FrechetCell"]


def _expm_frechet_adjoint(log_f: Tensor, grad: Tensor) -> Tensor:
    """``[B, 3, 3]``: ``G ↦ Σ_{μν} ⟨D exp(L)[E_μν], G⟩ E_μν`` (the adjoint of exp's Fréchet derivative at ``L``),
    as ``D exp(Lᵀ)[G]``: the upper-right block of ``exp([[Lᵀ, G], [0, Lᵀ]])``."""
    b = log_f.shape[0]
    block = log_f.new_zeros(b, 6, 6)
    block[:, :3, :3] = log_f.transpose(1, 2)
    block[:, 3:, 3:] = log_f.transpose(1, 2)
    block[:, :3, 3:] = grad
    return torch.linalg.matrix_exp(block)[:, :3, 3:]


class FrechetCell:
    """The cell degrees of freedom of a batch of structures (the module docstring).

    Args:
        cell: float64 ``[B, 3, 3]`` Å, the initial cells ``C₀`` (rows are cell vectors; periodic in 3D).
        batch: int64 ``[N]``, each atom's structure.
        exp_cell_factor: ``c``, scaling the cell rows (``None``: each structure's number of atoms, ASE's default).
        scalar_pressure: ``p`` in eV/Å³ (``ase.units.GPa`` converts): relaxes the enthalpy ``E + pV``.
        hydrostatic_strain: only hydrostatic deformation (the virial replaced by its trace's share on the diagonal).
        constant_volume: deviatoric deformation only (the trace of the cell's generalised force projected out).

    Raises:
        ConfigError: a cell that is not periodic in 3D (volume ≤ 0 or singular).
    """

    def __init__(self, cell: Tensor, batch: Tensor, *, exp_cell_factor: float | None = None,
                 scalar_pressure: float = 0.0, hydrostatic_strain: bool = False, constant_volume: bool = False):
        self.orig = cell.to(torch.float64)
        det = torch.linalg.det(self.orig)
        if bool((det.abs() < 1e-9).any()):
            bad = torch.nonzero(det.abs() < 1e-9).flatten().tolist()
            raise ConfigError(f"--relax-cell needs cells periodic in 3D; structures {bad[:5]} of the batch have no "
                              f"volume (relax them without --relax-cell)")
        self.batch = batch
        self.num = int(cell.shape[0])
        natoms = torch.bincount(batch, minlength=self.num).to(torch.float64)
        self.factor = natoms if exp_cell_factor is None else torch.full_like(natoms, float(exp_cell_factor))
        self.pressure = float(scalar_pressure)
        self.hydrostatic, self.constant_volume = bool(hydrostatic_strain), bool(constant_volume)
        self.n = int(batch.numel())

    # --- coordinates -------------------------------------------------------------------------------------------
    def rows_batch(self) -> Tensor:
        """int64 ``[N + 3B]``: each generalised row's structure."""
        cells = torch.arange(self.num, device=self.batch.device).repeat_interleave(3)
        return torch.cat([self.batch, cells])

    def initial(self, pos: Tensor) -> Tensor:
        """``[N + 3B, 3]``: the generalised coordinates at the initial cells (``F = I``: ``x = r``, ``log F = 0``)."""
        return torch.cat([pos.to(torch.float64), pos.new_zeros(3 * self.num, 3, dtype=torch.float64)])

    def log_deformation(self, x: Tensor) -> Tensor:
        """``[B, 3, 3]``: ``log F`` of each structure."""
        return x[self.n:].reshape(self.num, 3, 3) / self.factor.reshape(-1, 1, 1)

    def structures(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(pos [N, 3], cell [B, 3, 3])`` of the generalised coordinates ``x`` (``F = exp(log F)``,
        ``C = C₀ Fᵀ``, ``r = x Fᵀ``)."""
        f = torch.linalg.matrix_exp(self.log_deformation(x))
        ft = f.transpose(1, 2)
        pos = torch.bmm(x[:self.n].unsqueeze(1), ft[self.batch]).squeeze(1)
        return pos, torch.bmm(self.orig, ft)

    def volumes(self, cell: Tensor) -> Tensor:
        """``[B]`` Å³."""
        return torch.linalg.det(cell).abs()

    def energy(self, energy: Tensor, cell: Tensor) -> Tensor:
        """``[B]`` eV: the relaxed quantity, ``E + p V`` (the filter's ``get_potential_energy``)."""
        return energy + self.pressure * self.volumes(cell)

    def forces(self, x: Tensor, forces: Tensor, stress: Tensor, cell: Tensor) -> tuple[Tensor, Tensor]:
        """``(generalised forces [N + 3B, 3], the convergence stress [B, 3, 3] eV/Å³)`` from the atoms' forces
        (constraints applied) and the stresses at ``x``."""
        vol = self.volumes(cell).reshape(-1, 1, 1)
        eye = torch.eye(3, dtype=torch.float64, device=x.device)
        virial = -vol * (stress.to(torch.float64) + self.pressure * eye)
        log_f = self.log_deformation(x)
        f = torch.linalg.matrix_exp(log_f)
        if self.hydrostatic:
            virial = eye * (virial.diagonal(dim1=1, dim2=2).sum(-1) / 3.0).reshape(-1, 1, 1)
        ucf_grad = virial @ torch.linalg.inv(f.transpose(1, 2))
        cell_force = _expm_frechet_adjoint(log_f, ucf_grad)
        crit = -virial / vol
        if self.constant_volume:
            cell_force = cell_force - eye * (cell_force.diagonal(dim1=1, dim2=2).sum(-1) / 3.0).reshape(-1, 1, 1)
            crit = crit - eye * (crit.diagonal(dim1=1, dim2=2).sum(-1) / 3.0).reshape(-1, 1, 1)
        atoms = torch.bmm(forces.to(torch.float64).unsqueeze(1), f[self.batch]).squeeze(1)
        rows = (cell_force / self.factor.reshape(-1, 1, 1)).reshape(-1, 3)
        return torch.cat([atoms, rows]), crit

    def select(self, keep: Tensor) -> None:
        """Keep the structures where ``keep [B]`` (bool) is true (as :meth:`BatchOptimizer.select`); coordinates are
        compacted with :meth:`rows_of`."""
        atoms = keep[self.batch]
        renumber = torch.cumsum(keep.long(), 0) - 1
        self.batch = renumber[self.batch[atoms]]
        self.orig, self.factor = self.orig[keep], self.factor[keep]
        self.num, self.n = int(keep.sum()), int(atoms.sum())

    def rows_of(self, keep: Tensor) -> Tensor:
        """bool ``[N + 3B]``: the generalised rows of the kept structures (call before :meth:`select`)."""
        return torch.cat([keep[self.batch], keep.repeat_interleave(3)])
