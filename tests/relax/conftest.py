"""Models and structures shared by the relaxation tests: a briefly trained float64 SchNet (a real S2EF model file)
and a Morse pair potential behind the same contract (smooth, with a true minimum near every structure)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn


class MorsePotential(nn.Module):
    """``E = ½ Σ_edges D ((1 − e^{−a(d − r0)})² − 1) · C(d)``, ``C`` a cosine cutoff; an S2EF model's contract
    (``model(batch, graph, forces=True, stress=…)``, ``meta["task_meta"]``) so the relaxer and the calculator take
    it."""

    uses_triplets = False

    def __init__(self, cutoff: float = 5.0, D: float = 0.35, a: float = 1.36, r0: float = 2.6):
        super().__init__()
        self.scale = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.cutoff, self.D, self.a, self.r0 = cutoff, D, a, r0
        self.meta = {"task_meta": {"task": "s2ef", "cutoff": cutoff, "max_neighbors": None,
                                   "normalizer": {"coef": [0.0] * 100, "mean": 0.0, "std": 1.0}}}

    def forward(self, batch, graph, comm=None, *, forces: bool = False, stress: bool = False):
        with torch.enable_grad():
            pos = batch.pos.detach().requires_grad_(True)
            eps = torch.zeros(batch.num_graphs, 3, 3, dtype=pos.dtype, requires_grad=True)
            sym = (eps + eps.transpose(1, 2)) / 2  # a symmetric strain: x → x·(1 + ε), cell rows too
            strained = pos + torch.bmm(pos.unsqueeze(1), sym[batch.batch]).squeeze(1)
            cell = batch.cell + torch.bmm(batch.cell, sym)
            d = graph.edge_vectors(strained, cell).norm(dim=-1)
            fc = 0.5 * (torch.cos(d * math.pi / self.cutoff) + 1.0)
            e_edge = 0.5 * self.scale * self.D * ((1 - torch.exp(-self.a * (d - self.r0))) ** 2 - 1) * fc
            i = graph.edge_index[1]
            energy = torch.zeros(batch.num_graphs, dtype=d.dtype).index_add(0, batch.batch[i], e_edge)
            g, de = torch.autograd.grad(energy.sum(), (pos, eps))
        out = {"energy": energy.detach(), "forces": -g.detach()}
        if stress:
            out["stress"] = de.detach() / torch.linalg.det(batch.cell).abs().reshape(-1, 1, 1)
        return out


@pytest.fixture(scope="session")
def morse():
    return MorsePotential().eval()


@pytest.fixture(scope="session")
def schnet_file(tmp_path_factory):
    """A float64 SchNet trained for two epochs on 16 OC20-like frames, written as a model file."""
    from gnnpipe import api
    from gnnpipe.data.atoms import from_atoms, generate_oc20_like
    from gnnpipe.models import save

    data = from_atoms(generate_oc20_like(16, seed=1), dtype=torch.float64)
    r = api.train(data=data, model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=12, batch_size=4, epochs=2,
                  dtype="float64", warmup_steps=2, model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0)
    path = tmp_path_factory.mktemp("relax") / "schnet.pt"
    save(r.model, path)
    return path


def mixed_structures():
    """8 OC20-like structures of 3 sizes (13, 19 and 28 atoms), 6 with a fixed bottom layer, 2 with none, and one
    non-periodic molecule-sized cluster."""
    from ase import Atoms

    from gnnpipe.data.atoms import generate_oc20_like

    out = generate_oc20_like(3, seed=5, relax_share=0.0, rattle=0.1)
    out += generate_oc20_like(2, seed=6, relax_share=0.0, rattle=0.1, size=(3, 2, 3))
    out += generate_oc20_like(1, seed=7, relax_share=0.0, rattle=0.1, size=(3, 3, 3))
    out += generate_oc20_like(1, seed=8, relax_share=0.0, rattle=0.1, fixed_layers=0)
    rng = np.random.default_rng(0)
    base = np.array([[0, 0, 0], [2.5, 0, 0], [0, 2.5, 0], [0, 0, 2.5], [2.5, 2.5, 0]], float)
    out.append(Atoms("Cu5", positions=base + rng.normal(0, 0.15, base.shape)))
    for a in out:
        a.calc = None
    return out
