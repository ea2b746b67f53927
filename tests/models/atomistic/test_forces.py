"""Forces: conservative forces equal finite differences of the energy; direct forces have the atoms' shape and
rotate with the structure while energies stay invariant."""

from __future__ import annotations

import math

import pytest
import torch

from gnnpipe.models import build_model

from .conftest import DIMENET_SMALL, NAMES, SMALL, make_graph

OPTIONS = SMALL


def _rotation(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.det(q) > 0 else -q


@pytest.mark.parametrize("name", NAMES)
def test_conservative_forces_equal_finite_differences(batch, name):
    torch.manual_seed(0)
    model = build_model(name, 0, 1, **OPTIONS[name]).double().eval()
    graph = make_graph(batch, OPTIONS[name]["cutoff"])
    forces = model(batch, graph, forces=True)["forces"]
    assert forces.shape == batch.pos.shape
    h = 1e-5
    for atom, axis in [(0, 0), (3, 1), (7, 2), (12, 0)]:
        shifted = []
        for sign in (1, -1):
            b = batch.clone()
            b.pos = batch.pos.clone()
            b.pos[atom, axis] += sign * h
            with torch.no_grad():
                shifted.append(model(b, graph)["energy"].sum())
        fd = -(shifted[0] - shifted[1]) / (2 * h)
        assert abs(float(fd)) > 1e-6
        assert math.isclose(float(forces[atom, axis]), float(fd), rel_tol=1e-6, abs_tol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_training_forces_are_differentiable(batch, name):
    torch.manual_seed(0)
    model = build_model(name, 0, 1, **OPTIONS[name]).double().train()
    graph = make_graph(batch, OPTIONS[name]["cutoff"])
    out = model(batch, graph, forces=True)
    assert out["forces"].requires_grad  # create_graph=True in training
    out["forces"].pow(2).sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("direct", [True, False])
def test_forces_rotate_and_energy_is_invariant(batch, name, direct):
    torch.manual_seed(0)
    model = build_model(name, 0, 1, direct_forces=direct, **OPTIONS[name]).double().eval()
    graph = make_graph(batch, OPTIONS[name]["cutoff"])
    out = model(batch, graph, forces=True)
    R = _rotation(3)
    rot = batch.clone()
    rot.pos = (batch.pos - 1.0) @ R.T + 0.5  # rotate and translate
    out_rot = model(rot, graph, forces=True)
    assert out["forces"].shape == (batch.num_nodes, 3)
    assert out["forces"].abs().max() > 1e-6
    torch.testing.assert_close(out_rot["energy"], out["energy"], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_rot["forces"], out["forces"] @ R.T, rtol=1e-9, atol=1e-10)


def test_direct_forces_need_one_backward_and_pos_without_grad(batch):
    model = build_model("dimenet++", 0, 1, direct_forces=True, **DIMENET_SMALL).double().train()
    graph = make_graph(batch, DIMENET_SMALL["cutoff"])
    out = model(batch, graph)
    assert not batch.pos.requires_grad
    (out["energy"].sum() + out["forces"].pow(2).sum()).backward()
    assert model.head.forces.lin1.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", NAMES)
def test_periodic_structure_forces_and_image_invariance(name):
    from ase.build import bulk
    from torch_geometric.data import Batch, Data

    from .conftest import make_graph

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)  # 4 atoms, 3.6 Å cell: every atom sees its periodic images
    atoms.rattle(0.1, seed=1)

    def batch_of(pos):
        return Batch.from_data_list([Data(z=torch.tensor(atoms.numbers), pos=pos,
                                          cell=torch.tensor(atoms.cell.array).unsqueeze(0),
                                          pbc=torch.ones(1, 3, dtype=torch.bool), natoms=torch.tensor([4]))])

    pos = torch.tensor(atoms.positions)
    o = {**OPTIONS[name], "cutoff": 3.0}
    torch.manual_seed(0)
    model = build_model(name, 0, 1, **o).double().eval()
    b = batch_of(pos)
    graph = make_graph(b, o["cutoff"])
    assert bool(graph.cell_offsets.any())
    out = model(b, graph, forces=True)
    # an atom moved by a lattice vector is the same structure
    moved = pos.clone()
    moved[1] += torch.tensor(atoms.cell.array[0])
    b2 = batch_of(moved)
    torch.testing.assert_close(model(b2, make_graph(b2, o["cutoff"]))["energy"], out["energy"], rtol=1e-10,
                               atol=1e-10)
    h = 1e-5
    for atom, axis in [(0, 0), (2, 1)]:
        e = []
        for sign in (1, -1):
            p = pos.clone()
            p[atom, axis] += sign * h
            with torch.no_grad():
                e.append(model(batch_of(p), graph)["energy"].sum())
        fd = -(e[0] - e[1]) / (2 * h)
        assert math.isclose(float(out["forces"][atom, axis]), float(fd), rel_tol=1e-6, abs_tol=1e-8)
