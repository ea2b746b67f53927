"""FIRE and L-BFGS over a batch of structures, in torch: every structure keeps its own state (time step, mixing
coefficient, curvature history) and takes exactly the step ASE's optimizer would take on it alone.

A batch holds ``B`` structures with ``N`` rows in all (atoms; with cells relaxed, three more rows per structure,
:mod:`gnnpipe.relax.cell`); ``batch [N]`` (int64, in any order) names each row's structure. Positions, forces and
velocities are float64 ``[N, 3]`` (Å, eV/Å, Å/fs-like FIRE units), energies float64 ``[B]`` eV. Forces given to
:meth:`step` already have the constraints applied (fixed atoms' forces zero, as ``ase.Atoms.get_forces`` returns them),
so fixed atoms never move. Every dot product, norm and maximum that ASE takes over one structure's ``3n`` degrees of
freedom is taken here per structure by a segment reduction.

* :class:`FIRE`: Bitzek, Koskinen, Gähler, Moseler, Gumbsch, *Structural Relaxation Made Simple*, PRL 97, 170201
  (2006), with ASE's update rule (``ase/optimize/fire.py``): mixing ``v ← (1 − a) v + a |v| F / |F|`` while
  ``v · F > 0`` (``dt`` grows by ``finc`` up to ``dtmax`` and ``a`` shrinks by ``fa`` after ``Nmin`` such steps),
  else ``v ← 0``, ``a ← astart``, ``dt ← fdec · dt``; then ``v ← v + dt F``, ``Δr = dt v`` scaled so that its norm
  over the structure is at most ``maxstep``; optionally ASE's ``downhill_check`` (an uphill step is undone).
* :class:`LBFGS`: Nocedal, *Updating quasi-Newton matrices with limited storage*, Math. Comp. 35 (1980), the
  two-loop recursion with ASE's choices (``ase/optimize/lbfgs.py``): initial inverse Hessian ``1/alpha``, the last
  ``memory`` pairs ``(s, y)``, the step scaled so that no atom moves more than ``maxstep``, times ``damping``.

Structures only ever leave a batch (:meth:`BatchOptimizer.select`); they never join, so one step counter serves
them all.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError

__all__ = ["FIRE", "LBFGS", "OPTIMIZERS", "BatchOptimizer", "segment_max", "segment_sum"]


def segment_sum(x: Tensor, batch: Tensor, num: int) -> Tensor:
    """``[B]``: the sum of ``x [N, ...]`` over each structure's atoms (and the trailing dimensions)."""
    flat = x.reshape(x.size(0), -1).sum(1)
    return flat.new_zeros(num).index_add_(0, batch, flat)


def segment_max(x: Tensor, batch: Tensor, num: int) -> Tensor:
    """``[B]``: the maximum of ``x [N]`` over each structure's atoms (``-inf`` for a structure with none)."""
    out = x.new_full((num,), float("-inf"))
    return out.scatter_reduce(0, batch, x, reduce="amax", include_self=True)


class BatchOptimizer:
    """The state of a batched optimizer over the structures still running.

    Args:
        batch: int64 ``[N]``, each row's structure in ``0..B-1``.
        num_structures: ``B``.
        maxstep: Å, the largest move per step (ASE's ``maxstep``, default 0.2).
    """

    name = "base"

    def __init__(self, batch: Tensor, num_structures: int, maxstep: float = 0.2):
        if not maxstep > 0:
            raise ConfigError(f"maxstep must be > 0 Å, got {maxstep}")
        self.batch = batch
        self.num = int(num_structures)
        self.maxstep = float(maxstep)
        self.iteration = 0

    def step(self, pos: Tensor, forces: Tensor, energy: Tensor) -> Tensor:
        """The next positions ``[N, 3]`` from the current positions, forces (constraints applied) and energies."""
        raise NotImplementedError

    def select(self, keep: Tensor) -> None:
        """Keep only the structures where ``keep [B]`` (bool) is true, in order (the others converged or ran out of
        steps); every per-atom and per-structure state tensor is compacted."""
        atoms = keep[self.batch]
        renumber = torch.cumsum(keep.long(), 0) - 1
        self.batch = renumber[self.batch[atoms]]
        self.num = int(keep.sum())
        self._select(keep, atoms)

    def _select(self, keep: Tensor, atoms: Tensor) -> None:
        raise NotImplementedError

    def _per_atom(self, x: Tensor) -> Tensor:
        return x[self.batch].unsqueeze(-1)


class FIRE(BatchOptimizer):
    """Batched FIRE with ASE's parameters and defaults (``ase.optimize.FIRE``): ``dt=0.1``, ``maxstep=0.2``,
    ``dtmax=1.0``, ``Nmin=5``, ``finc=1.1``, ``fdec=0.5``, ``astart=0.1``, ``fa=0.99``, ``a=0.1``,
    ``downhill_check=False`` (see the module docstring for the rule and its source)."""

    name = "fire"

    def __init__(self, batch: Tensor, num_structures: int, *, dt: float = 0.1, maxstep: float = 0.2,
                 dtmax: float = 1.0, Nmin: int = 5, finc: float = 1.1, fdec: float = 0.5, astart: float = 0.1,
                 fa: float = 0.99, a: float = 0.1, downhill_check: bool = False):
        super().__init__(batch, num_structures, maxstep)
        opts = dict(device=batch.device, dtype=torch.float64)
        self.dt = torch.full((self.num,), float(dt), **opts)
        self.a = torch.full((self.num,), float(a), **opts)
        self.nsteps = torch.zeros(self.num, dtype=torch.long, device=batch.device)
        self.dtmax, self.Nmin, self.finc, self.fdec = float(dtmax), int(Nmin), float(finc), float(fdec)
        self.astart, self.fa, self.downhill_check = float(astart), float(fa), bool(downhill_check)
        self.vel: Tensor | None = None
        self.e_last: Tensor | None = None
        self.r_last: Tensor | None = None

    def step(self, pos: Tensor, forces: Tensor, energy: Tensor) -> Tensor:
        b, num = self.batch, self.num
        if self.vel is None:
            self.vel = torch.zeros_like(pos)
            if self.downhill_check:
                self.e_last, self.r_last = energy.clone(), pos.clone()
        else:
            uphill = torch.zeros(num, dtype=torch.bool, device=pos.device)
            if self.downhill_check:
                uphill = energy > self.e_last
                pos = torch.where(uphill[b].unsqueeze(-1), self.r_last, pos)   # back to the last positions
                self.e_last = torch.where(uphill, self.e_last, energy)        # the energy there
                self.r_last = pos.clone()
            vf = segment_sum(forces * self.vel, b, num)
            f2 = segment_sum(forces * forces, b, num)
            v2 = segment_sum(self.vel * self.vel, b, num)
            downhill = (vf > 0) & ~uphill
            mixed = (1.0 - self._per_atom(self.a)) * self.vel + \
                self._per_atom(self.a) * forces / self._per_atom(f2.sqrt()) * self._per_atom(v2.sqrt())
            grow = downhill & (self.nsteps > self.Nmin)
            self.dt = torch.where(grow, torch.clamp(self.dt * self.finc, max=self.dtmax), self.dt)
            self.a = torch.where(grow, self.a * self.fa, self.a)
            self.nsteps = torch.where(downhill, self.nsteps + 1, torch.zeros_like(self.nsteps))
            self.vel = torch.where(downhill[b].unsqueeze(-1), mixed, torch.zeros_like(mixed))
            self.a = torch.where(downhill, self.a, torch.full_like(self.a, self.astart))
            self.dt = torch.where(downhill, self.dt, self.dt * self.fdec)
        dt = self._per_atom(self.dt)
        self.vel = self.vel + dt * forces
        dr = dt * self.vel
        norm = segment_sum(dr * dr, b, num).sqrt()
        scale = torch.where(norm > self.maxstep, self.maxstep / norm, torch.ones_like(norm))
        dr = torch.where(self._per_atom(norm > self.maxstep), self._per_atom(scale) * dr, dr)
        self.iteration += 1
        return pos + dr

    def _select(self, keep: Tensor, atoms: Tensor) -> None:
        self.dt, self.a, self.nsteps = self.dt[keep], self.a[keep], self.nsteps[keep]
        if self.vel is not None:
            self.vel = self.vel[atoms]
        if self.e_last is not None:
            self.e_last, self.r_last = self.e_last[keep], self.r_last[atoms]


class LBFGS(BatchOptimizer):
    """Batched L-BFGS with ASE's parameters and defaults (``ase.optimize.LBFGS`` without line search):
    ``maxstep=0.2``, ``memory=100``, ``damping=1.0``, ``alpha=70.0`` (see the module docstring)."""

    name = "lbfgs"

    def __init__(self, batch: Tensor, num_structures: int, *, maxstep: float = 0.2, memory: int = 100,
                 damping: float = 1.0, alpha: float = 70.0):
        super().__init__(batch, num_structures, maxstep)
        if maxstep > 1.0:
            raise ConfigError(f"maxstep {maxstep} Å is too large for L-BFGS (ASE refuses above 1 Å); use <= 1")
        if memory < 1 or not alpha > 0:
            raise ConfigError(f"L-BFGS needs memory >= 1 and alpha > 0, got memory={memory}, alpha={alpha}")
        self.memory, self.damping, self.alpha = int(memory), float(damping), float(alpha)
        self.s: list[Tensor] = []
        self.y: list[Tensor] = []
        self.rho: list[Tensor] = []
        self.r0: Tensor | None = None
        self.f0: Tensor | None = None

    def step(self, pos: Tensor, forces: Tensor, energy: Tensor) -> Tensor:
        b, num = self.batch, self.num
        if self.iteration > 0:
            s, y = pos - self.r0, self.f0 - forces                 # y: the change of the gradient −F
            self.s.append(s)
            self.y.append(y)
            self.rho.append(1.0 / segment_sum(y * s, b, num))
            if self.iteration > self.memory:
                self.s.pop(0), self.y.pop(0), self.rho.pop(0)
        q = -forces.clone()
        alphas = []
        for s, y, rho in zip(reversed(self.s), reversed(self.y), reversed(self.rho)):
            a = rho * segment_sum(s * q, b, num)
            alphas.append(a)
            q = q - self._per_atom(a) * y
        z = q / self.alpha
        for s, y, rho, a in zip(self.s, self.y, self.rho, reversed(alphas)):
            beta = rho * segment_sum(y * z, b, num)
            z = z + s * self._per_atom(a - beta)
        p = -z
        longest = segment_max(p.norm(dim=1), b, num)
        big = longest >= self.maxstep
        scale = torch.where(big, self.maxstep / longest, torch.ones_like(longest))
        dr = torch.where(self._per_atom(big), p * self._per_atom(scale), p) * self.damping
        self.r0, self.f0 = pos, forces
        self.iteration += 1
        return pos + dr

    def _select(self, keep: Tensor, atoms: Tensor) -> None:
        self.s = [s[atoms] for s in self.s]
        self.y = [y[atoms] for y in self.y]
        self.rho = [r[keep] for r in self.rho]
        if self.r0 is not None:
            self.r0, self.f0 = self.r0[atoms], self.f0[atoms]


#: the batched optimizers by name
OPTIMIZERS = {"fire": FIRE, "lbfgs": LBFGS}
