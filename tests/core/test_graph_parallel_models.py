"""Graph parallelism with the zoo's atomistic models (schnet, dimenet++): energy, conservative forces in the loss
(a second backward through every collective) and parameter gradients summed over the group equal the single
process in float64, for both partitioners and both edge-gather modes. Skips where the models or the graph builder
are not installed."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gnnpipe.models.atomistic")
pytest.importorskip("gnnpipe.data.atoms")

from torch_geometric.data import Batch, Data  # noqa: E402

from gnnpipe import partitioners as P  # noqa: E402
from gnnpipe.core.run import launch  # noqa: E402
from gnnpipe.tasks.s2ef.graph_parallel import GraphParallelComm  # noqa: E402

#: a minute or more of spawning and building the models' bases per world size on a loaded 2-core machine
pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(600)]

OPTIONS = {
    "schnet": dict(num_layers=2, hidden=16, num_filters=12, num_gaussians=10, cutoff=3.0),
    "dimenet++": dict(num_layers=2, hidden=16, int_emb_size=8, basis_emb_size=4, out_emb_channels=16,
                      num_spherical=3, num_radial=4, cutoff=3.0),
}
LAYOUTS = [(m, mode) for m in ("edge-chunk", "atom-owner") for mode in ("allgather", "halo")]


def molecules(sizes=(6, 8, 3), seed=0):
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


def train_epoch(name, G=1, method=None, mode=None):
    from gnnpipe.data.atoms import build_graph
    from gnnpipe.models import build_model

    torch.manual_seed(0)
    model = build_model(name, 0, 1, **OPTIONS[name]).double().train()
    batch = molecules()
    graph = build_graph(batch, OPTIONS[name]["cutoff"])
    comm = None
    if method is not None:
        comm = GraphParallelComm(P.plan_graph_parallel(graph, G, method, pos=batch.pos), mode=mode)
        graph = comm.local_graph(graph)
    out = model(batch, graph, comm, forces=True)
    loss = ((out["energy"] - 1.0) ** 2).sum() + ((out["forces"] - 0.1) ** 2).sum()
    loss.backward()
    grads = {k: torch.zeros_like(p) if p.grad is None else p.grad.clone() for k, p in model.named_parameters()}
    return out["energy"].detach(), out["forces"].detach(), grads


#: a quick pair of the full matrix
QUICK = [("dimenet++", "edge-chunk", "halo"), ("schnet", "atom-owner", "allgather")]


def _ranks(rank, world, cases):
    torch.set_num_threads(1)
    return {(name, m, mode): train_epoch(name, world, m, mode) for name, m, mode in cases}


@pytest.mark.parametrize("G,full", [(2, False), (2, True), (3, True), (4, True)])
def test_models_under_graph_parallelism_equal_the_single_process(G, full):
    cases = [(name, m, mode) for name in OPTIONS for m, mode in LAYOUTS] if full else QUICK
    refs = {name: train_epoch(name) for name in {c[0] for c in cases}}
    outs = launch.spawn(_ranks, G, (cases,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=500)
    for key in outs[0]:
        E0, F0, g0 = refs[key[0]]
        for r in range(G):
            assert torch.allclose(outs[r][key][0], E0, rtol=1e-9, atol=1e-12), (key, r, "energy")
            assert torch.allclose(outs[r][key][1], F0, rtol=1e-9, atol=1e-12), (key, r, "forces")
        for k, ref in g0.items():
            total = sum(outs[r][key][2][k] for r in range(G))
            assert torch.allclose(total, ref, rtol=1e-9, atol=1e-12), (key, k, "parameter gradient")
