"""Physics of the atomistic models on periodic cells (float64): a one-atom primitive cell whose cutoff sphere holds
many self-images (its energy's cell derivative equals finite differences, its forces vanish), a triclinic cell
(forces equal finite differences), supercells (``E(2×2×2) = 8·E``), and invariance of the energy under a
permutation of the atoms (forces permute with them)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from gnnpipe.data.atoms import build_graph
from gnnpipe.models import build_model

from .conftest import SMALL, molecules

#: the models these tests cover (the older models' periodic forces: test_forces.py)
PERIODIC = ["gemnet-t"]


def _batch(atoms, pos=None, cell=None) -> Batch:
    pos = torch.tensor(atoms.positions) if pos is None else pos
    cell = torch.tensor(atoms.cell.array) if cell is None else cell
    return Batch.from_data_list([Data(z=torch.tensor(atoms.numbers), pos=pos, cell=cell.unsqueeze(0),
                                      pbc=torch.tensor(atoms.pbc).unsqueeze(0), natoms=torch.tensor([len(atoms)]))])


def _model(name, cutoff, direct=False):
    torch.manual_seed(0)
    return build_model(name, 0, 1, **{**SMALL[name], "cutoff": cutoff}, direct_forces=direct).double().eval()


def _graph(b, model):
    return build_graph(b, model.cutoff, with_reverse=True)


def _triclinic():
    from ase import Atoms

    rng = np.random.default_rng(0)
    cell = np.array([[4.0, 0.0, 0.0], [1.2, 3.8, 0.0], [0.7, 0.9, 4.2]])
    return Atoms("CuAgCuAu", cell=cell, pbc=True, scaled_positions=rng.random((4, 3)))


@pytest.mark.parametrize("name", PERIODIC)
def test_one_atom_cell_with_many_self_images(name):
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.6)  # 1 atom; a 5 Å cutoff sphere holds 42 of its images
    model = _model(name, 5.0)
    cell = torch.tensor(atoms.cell.array, requires_grad=True)
    b = _batch(atoms, cell=cell)
    graph = _graph(b, model)
    assert graph.num_edges >= 40 and bool((graph.edge_index == 0).all())
    out = model(b, graph, forces=True)
    assert float(out["forces"].abs().max()) < 1e-10  # every image pulls and pushes alike
    (g,) = torch.autograd.grad(model(b, graph)["energy"].sum(), cell)
    h = 1e-5
    for r, c in [(0, 0), (1, 2), (2, 1)]:
        e = []
        for s in (h, -h):
            cl = cell.detach().clone()
            cl[r, c] += s
            bs = _batch(atoms, cell=cl)
            with torch.no_grad():
                e.append(float(model(bs, graph)["energy"].sum()))
        fd = (e[0] - e[1]) / (2 * h)
        assert abs(fd) > 1e-6
        assert math.isclose(float(g[r, c]), fd, rel_tol=1e-6, abs_tol=1e-9)
    # the 2×2×2 supercell is the same crystal
    big = _batch(atoms * (2, 2, 2))
    with torch.no_grad():
        e8 = model(big, _graph(big, model))["energy"]
    assert math.isclose(float(e8), 8 * float(out["energy"].detach()), rel_tol=1e-10)


@pytest.mark.parametrize("name", PERIODIC)
def test_triclinic_cell_forces_and_supercell(name):
    atoms = _triclinic()
    model = _model(name, 4.0)
    b = _batch(atoms)
    graph = _graph(b, model)
    assert bool(graph.cell_offsets.any())
    out = model(b, graph, forces=True)
    h = 1e-5
    for atom, axis in [(0, 0), (1, 2), (3, 1)]:
        e = []
        for s in (h, -h):
            p = torch.tensor(atoms.positions)
            p[atom, axis] += s
            with torch.no_grad():
                e.append(float(model(_batch(atoms, pos=p), graph)["energy"].sum()))
        fd = -(e[0] - e[1]) / (2 * h)
        assert abs(fd) > 1e-6
        assert math.isclose(float(out["forces"][atom, axis]), fd, rel_tol=1e-6, abs_tol=1e-9)
    big = _batch(atoms * (2, 2, 2))
    with torch.no_grad():
        e8 = model(big, _graph(big, model))["energy"]
    assert math.isclose(float(e8), 8 * float(out["energy"].detach()), rel_tol=1e-10)


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("name", PERIODIC)
def test_permuting_atoms_permutes_forces(name, direct):
    b = molecules((7,), seed=2)
    model = _model(name, 3.0, direct)
    out = model(b, _graph(b, model), forces=True)
    perm = torch.randperm(b.num_nodes, generator=torch.Generator().manual_seed(1))
    p = b.clone()
    p.z, p.pos = b.z[perm], b.pos[perm]
    out_p = model(p, _graph(p, model), forces=True)
    assert float(out["forces"].detach().abs().max()) > 1e-6
    torch.testing.assert_close(out_p["energy"], out["energy"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out_p["forces"], out["forces"][perm], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", PERIODIC)
def test_a_structure_without_edges(name):
    """Atoms farther apart than the cutoff (no edge, no triplet: an empty shard under graph parallelism too)."""
    b = molecules((2,), seed=0)
    b.pos = torch.tensor([[0.0, 0.0, 0.0], [9.0, 0.0, 0.0]], dtype=torch.float64)
    for direct in (False, True):
        model = _model(name, 3.0, direct)
        graph = _graph(b, model)
        assert graph.num_edges == 0
        out = model(b, graph, forces=True)
        assert out["forces"].shape == (2, 3) and float(out["forces"].abs().max()) == 0.0
        assert bool(torch.isfinite(out["energy"]).all())
