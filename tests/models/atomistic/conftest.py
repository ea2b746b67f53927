"""Shared fixtures of the atomistic model tests: small molecules, their graph
(``gnnpipe.data.atoms.build_graph``)
and a brute-force graph of the same contract (edges j→i sorted by target, then distance, then source; triplets
k→j→i without back-tracks, sorted by ``idx_ji``) that checks it."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data


class BruteGraph:
    """All pairs within ``cutoff`` of a batch of non-periodic molecules (O(N²); tests only)."""

    def __init__(self, batch, cutoff: float):
        pos, b = batch.pos.detach(), batch.batch
        n = pos.size(0)
        d = torch.cdist(pos, pos)
        mask = (d < cutoff) & (b[:, None] == b[None, :]) & ~torch.eye(n, dtype=torch.bool)
        i, j = mask.nonzero(as_tuple=True)  # target i, source j
        # sort by target, then distance, then source
        order = sorted(range(i.numel()), key=lambda e: (int(i[e]), float(d[i[e], j[e]]), int(j[e])))
        order = torch.tensor(order, dtype=torch.long)
        i, j = i[order], j[order]
        self.edge_index = torch.stack([j, i])
        self.cell_offsets = torch.zeros(i.numel(), 3, dtype=torch.long)
        self.num_nodes = n
        self.batch = b
        ptr = torch.zeros(n + 1, dtype=torch.long)
        ptr[1:] = torch.bincount(i, minlength=n).cumsum(0)
        kj, ji = [], []
        for e in range(i.numel()):
            jj, ii = int(j[e]), int(i[e])
            for f in range(int(ptr[jj]), int(ptr[jj + 1])):  # in-edges k→j of j
                if int(self.edge_index[0, f]) != ii:
                    kj.append(f)
                    ji.append(e)
        self.idx_kj = torch.tensor(kj, dtype=torch.long)
        self.idx_ji = torch.tensor(ji, dtype=torch.long)

    @property
    def num_edges(self) -> int:
        return self.edge_index.size(1)

    @property
    def num_triplets(self) -> int:
        return self.idx_kj.numel()

    def edge_vectors(self, pos, cell=None):
        return pos.index_select(0, self.edge_index[0]) - pos.index_select(0, self.edge_index[1])


def make_graph(batch, cutoff: float):
    """The graph the models are given: gnnpipe's builder."""
    from gnnpipe.data.atoms import build_graph

    return build_graph(batch, cutoff)


def molecules(sizes=(6, 8), seed: int = 0, dtype=torch.float64, box: float = 2.6) -> Batch:
    """Random molecules (atoms at least 0.7 Å apart) as one batch, ``z`` in H, C, N, O."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for n in sizes:
        pts = []
        while len(pts) < n:
            p = torch.rand(3, generator=g, dtype=torch.float64) * box
            if all(float((p - q).norm()) > 0.7 for q in pts):
                pts.append(p)
        z = torch.tensor([1, 6, 7, 8])[torch.randint(0, 4, (n,), generator=g)]
        data.append(Data(z=z, pos=torch.stack(pts).to(dtype), cell=torch.zeros(1, 3, 3, dtype=dtype),
                         pbc=torch.zeros(1, 3, dtype=torch.bool), natoms=torch.tensor([n])))
    return Batch.from_data_list(data)


@pytest.fixture
def batch():
    return molecules()


#: small sizes that keep the sympy-derived bases and the models fast
DIMENET_SMALL = dict(num_layers=2, hidden=16, int_emb_size=8, basis_emb_size=4, out_emb_channels=16,
                     num_spherical=3, num_radial=4, cutoff=3.0, output_initializer="glorot_orthogonal")
SCHNET_SMALL = dict(num_layers=2, hidden=16, num_filters=12, num_gaussians=10, cutoff=3.0)
GEMNET_SMALL = dict(num_layers=2, hidden=16, emb_size_trip=8, emb_size_rbf=4, emb_size_cbf=4, emb_size_bil_trip=6,
                    num_spherical=4, num_radial=6, num_atom=1, cutoff=3.0)
#: every atomistic model of the zoo with its small sizes
SMALL = {"dimenet++": DIMENET_SMALL, "schnet": SCHNET_SMALL, "gemnet-t": GEMNET_SMALL}
NAMES = list(SMALL)
