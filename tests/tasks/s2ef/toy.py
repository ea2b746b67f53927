"""A small pairwise potential following the atomistic model contract (``model(batch, graph, forces=True)``), and
EMT-labelled clusters, for tests of the S2EF trainer that need no atomistic model of the zoo."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Data


class PairPotential(nn.Module):
    """``E = Σ_atoms w·h_z + Σ_edges MLP(rbf(d)) · (h_i ⊙ h_j) · C(d)`` with a cosine cutoff ``C``."""

    def __init__(self, hidden: int = 8, cutoff: float = 4.0, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.cutoff = cutoff
        self.emb = nn.Embedding(40, hidden)
        self.mlp = nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, hidden))
        self.atom = nn.Linear(hidden, 1)
        self.units = nn.ModuleList([self.emb, self.mlp])

    def forward(self, batch, graph, comm=None, *, forces: bool = False):
        grad_was = torch.is_grad_enabled()
        with torch.enable_grad():
            pos = batch.pos if batch.pos.requires_grad else batch.pos.detach().requires_grad_(True)
            vec = graph.edge_vectors(pos, batch.cell)
            d = vec.norm(dim=-1)
            j, i = graph.edge_index
            centres = torch.linspace(0.5, self.cutoff, 6, dtype=d.dtype)
            rbf = torch.exp(-4.0 * (d.unsqueeze(-1) - centres) ** 2)
            h = self.emb(batch.z)
            fc = 0.5 * (torch.cos(d * math.pi / self.cutoff) + 1.0)
            e_edge = (self.mlp(rbf) * h[i] * h[j]).sum(-1) * fc
            e_atom = self.atom(h).squeeze(-1).index_add(0, i, e_edge)
            energy = torch.zeros(batch.num_graphs, dtype=d.dtype).index_add(0, batch.batch, e_atom)
            out = {"energy": energy}
            if forces:
                (g,) = torch.autograd.grad(energy.sum(), pos, create_graph=grad_was and self.training)
                out["forces"] = -g
        if not grad_was:
            out = {k: v.detach() for k, v in out.items()}
        return out


def emt_clusters(n: int, seed: int = 0, dtype=torch.float64) -> list[Data]:
    """``n`` rattled Cu/Ni clusters of 4–7 atoms (some atoms fixed), labelled by ASE's EMT."""
    from ase import Atoms
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(4, 8))
        base = np.array([[0, 0, 0], [2.5, 0, 0], [0, 2.5, 0], [0, 0, 2.5], [2.5, 2.5, 0], [2.5, 0, 2.5], [0, 2.5, 2.5]])
        pos = base[:k] + rng.normal(0, 0.15, (k, 3))
        atoms = Atoms(numbers=rng.choice([28, 29], size=k), positions=pos)
        atoms.calc = EMT()
        e, f = atoms.get_potential_energy(), atoms.get_forces()
        fixed = torch.zeros(k, dtype=torch.bool)
        fixed[0] = bool(rng.integers(0, 2))
        out.append(Data(z=torch.as_tensor(atoms.numbers, dtype=torch.long), pos=torch.as_tensor(pos, dtype=dtype),
                        cell=torch.zeros(1, 3, 3, dtype=dtype), pbc=torch.zeros(1, 3, dtype=torch.bool),
                        energy=torch.tensor([e], dtype=dtype), forces=torch.as_tensor(f, dtype=dtype), fixed=fixed,
                        tags=torch.zeros(k, dtype=torch.long), natoms=torch.tensor([k])))
    return out


def write_extxyz(path, n: int, seed: int = 0) -> str:
    """``n`` EMT-labelled clusters (:func:`emt_clusters`) as an extended XYZ file (fixed atoms as ``FixAtoms``)."""
    import ase.io
    from ase import Atoms
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.constraints import FixAtoms

    frames = []
    for d in emt_clusters(n, seed):
        a = Atoms(numbers=d.z.numpy(), positions=d.pos.numpy())
        if bool(d.fixed.any()):
            a.set_constraint(FixAtoms(indices=d.fixed.nonzero().flatten().tolist()))
        a.calc = SinglePointCalculator(a, energy=float(d.energy), forces=d.forces.numpy())
        frames.append(a)
    ase.io.write(str(path), frames, format="extxyz")
    return str(path)
