"""``escn-md`` under graph parallelism is exact (float64): G ranks of the ``atom-owner`` partitioner (each edge with
its target atom's owner: the messages' sums onto atoms stay local) and, at G = 2, of ``edge-chunk`` (the sums are
reduce-scattered), with conservative forces in the loss (a second backward through every collective) and with
direct forces; energies, forces and every parameter's gradient summed over the group equal the single process
within 1e-9. One batch holds a structure of 3 atoms, so at G = 3 a rank owns few atoms of it."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from gnnpipe import partitioners as P
from gnnpipe.core.run import launch
from gnnpipe.tasks.s2ef.graph_parallel import GraphParallelComm

pytestmark = pytest.mark.dist

OPTIONS = {"num_layers": 2, "hidden": 6, "lmax": 2, "mmax": 1, "hidden_channels": 8, "edge_channels": 4,
           "num_distance_basis": 8, "cutoff": 3.0, "max_neighbors": 30}


def _molecules(sizes=(6, 8, 3), seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    data = []
    for n in sizes:
        pts = []
        while len(pts) < n:
            p = torch.rand(3, generator=g, dtype=torch.float64) * 2.6
            if all(float((p - q).norm()) > 0.7 for q in pts):
                pts.append(p)
        z = torch.tensor([1, 6, 7, 8])[torch.randint(0, 4, (n,), generator=g)]
        data.append(Data(z=z, pos=torch.stack(pts), cell=torch.zeros(1, 3, 3, dtype=torch.float64),
                         pbc=torch.zeros(1, 3, dtype=torch.bool), natoms=torch.tensor([n])))
    return Batch.from_data_list(data)


def _step(direct: bool, G: int = 1, method: str | None = None) -> tuple:
    """One training step's energies ``[B]``, forces ``[N, 3]`` (every atom's) and parameter gradients (this rank's
    share) of an energy and force loss."""
    from gnnpipe.data.atoms import build_graph
    from gnnpipe.models import build_model

    torch.manual_seed(0)
    model = build_model("escn-md", 0, 1, direct_forces=direct, **OPTIONS).double().train()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    batch = _molecules()
    graph = build_graph(batch, OPTIONS["cutoff"], OPTIONS["max_neighbors"])
    comm, ids = None, torch.arange(batch.num_nodes)
    if method is not None:
        comm = GraphParallelComm(P.plan_graph_parallel(graph, G, method, pos=batch.pos))
        graph = comm.local_graph(graph)
        ids = comm.atom_ids
    out = model(batch, graph, comm, forces=True)
    forces = out["forces"]
    if direct:  # each rank's owned atoms' forces: its share of the force loss
        loss_f = ((forces - 0.1) ** 2).sum()
        full = torch.zeros(batch.num_nodes, 3, dtype=torch.float64).index_copy(0, ids, forces.detach())
    else:  # every rank holds every atom's forces (all-reduced); the gradient reaches each rank's own share once
        loss_f = ((forces - 0.1) ** 2).sum()
        full = forces.detach()
    loss = ((out["energy"] - 1.0) ** 2).sum() + loss_f
    loss.backward()
    grads = {k: torch.zeros_like(p) if p.grad is None else p.grad.clone() for k, p in model.named_parameters()}
    return out["energy"].detach(), full, grads


def _ranks(rank, world, cases):
    torch.set_num_threads(1)
    return {case: _step(case[0], world, case[1]) for case in cases}


def _check(G: int, cases: list) -> None:
    refs = {direct: _step(direct) for direct in {c[0] for c in cases}}
    outs = launch.spawn(_ranks, G, (cases,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=280)
    for case in cases:
        E0, F0, g0 = refs[case[0]]
        for r in range(G):
            assert torch.allclose(outs[r][case][0], E0, rtol=1e-9, atol=1e-12), (case, r, "energy")
        if case[0]:  # direct forces: each rank's owned rows
            F = sum(outs[r][case][1] for r in range(G))
            assert torch.allclose(F, F0, rtol=1e-9, atol=1e-12), (case, "forces")
        else:
            for r in range(G):
                assert torch.allclose(outs[r][case][1], F0, rtol=1e-9, atol=1e-12), (case, r, "forces")
        for k, ref in g0.items():
            total = sum(outs[r][case][2][k] for r in range(G))
            assert torch.allclose(total, ref, rtol=1e-9, atol=1e-12), (case, k, "parameter gradient")


@pytest.mark.timeout(300)
def test_two_ranks_equal_the_single_process():
    _check(2, [(False, "atom-owner"), (True, "atom-owner"), (False, "edge-chunk")])


@pytest.mark.timeout(300)
def test_three_ranks_equal_the_single_process():
    _check(3, [(False, "atom-owner"), (True, "atom-owner")])
