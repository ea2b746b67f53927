"""The atomistic cost model (gnnpipe.costmodel.atomistic): bytes per interaction block equal the measured "gp"
counters exactly (schnet and dimenet++, G ∈ {2, 3}, both edge-gather modes, conservative forces in the loss),
the memory and time models' arithmetic, and the layout ranking."""

from __future__ import annotations

import pytest
import torch

from gnnpipe.core.run.launch import spawn

MODELS = {
    "schnet": {"num_filters": 6, "num_gaussians": 6},
    "dimenet++": {"int_emb_size": 4, "basis_emb_size": 3, "out_emb_channels": 6, "num_spherical": 3, "num_radial": 3},
}
#: (model, partitioner, mode): both modes and both partitioners for each model
CASES = [("schnet", "edge-chunk", "allgather"), ("schnet", "atom-owner", "halo"),
         ("dimenet++", "edge-chunk", "halo"), ("dimenet++", "atom-owner", "allgather"),
         ("dimenet++", "edge-chunk", "allgather")]


def _batch():
    from torch_geometric.data import Batch

    from tests.tasks.s2ef.toy import emt_clusters

    return Batch.from_data_list(emt_clusters(3, seed=5))


def _model(name: str, direct: bool = False):
    from gnnpipe.models import build_model

    torch.manual_seed(0)
    return build_model(name, 0, 1, num_layers=2, hidden=8, cutoff=3.0, max_neighbors=8, direct_forces=direct,
                       **MODELS[name]).double().train()


def _measure(rank: int, world: int, cases: list) -> list:
    """Bytes this rank's counter saw in one training step of each case (energy + conservative forces in the loss,
    its backward), and the formula's prediction."""
    from gnnpipe.core.ops.comm import Comm
    from gnnpipe.core.ops.graph_parallel import GraphParallelComm
    from gnnpipe.costmodel.atomistic import step_bytes
    from gnnpipe.data.atoms import build_graph
    from gnnpipe.partitioners import plan_graph_parallel
    from gnnpipe.tasks.s2ef.graph_parallel import replicate_owned

    batch = _batch()
    graph = build_graph(batch, 3.0, 8)
    out = []
    for name, method, mode, direct in cases:
        model = _model(name, direct)
        plan = plan_graph_parallel(graph, world, method, pos=batch.pos)
        counter = Comm("cpu")
        comm = GraphParallelComm(plan, mode=mode, comm=counter)
        pred = model(batch, comm.local_graph(graph), comm, forces=True)
        forces = replicate_owned(pred["forces"], comm) if direct else pred["forces"]  # as the trainer does
        loss = (pred["energy"] ** 2).sum() + (forces ** 2).sum()
        loss.backward()
        formula = step_bytes(model, plan, num_structures=batch.num_graphs, mode=mode, element_size=8)[rank]
        out.append((counter.counters()["bytes_gp"], sum(formula.values())))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("G", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_step_bytes_equal_the_measured_counters(G):
    cases = [(*c, False) for c in CASES] + [("dimenet++", "edge-chunk", "halo", True)]
    outs = spawn(_measure, G, (cases,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=280)
    for r, rows in enumerate(outs):
        for case, (measured, formula) in zip(cases, rows):
            assert measured > 0, (case, r)
            assert measured == pytest.approx(formula, rel=1e-12, abs=0), (case, r, measured, formula)  # sum order
