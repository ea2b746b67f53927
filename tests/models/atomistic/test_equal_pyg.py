"""Our ``dimenet++`` and ``schnet`` equal PyG's ``DimeNetPlusPlus`` and ``SchNet`` (float64, same weights),
PyG's graph functions (``radius_graph``, DimeNet's ``triplets``) replaced by our graph."""

from __future__ import annotations

import pytest
import torch
import torch_geometric.nn.models.dimenet as pyg_dimenet
import torch_geometric.nn.models.schnet as pyg_schnet

from gnnpipe.models import build_model
from gnnpipe.models.atomistic.dimenet import CachedSphericalBasis

from .conftest import DIMENET_SMALL, SCHNET_SMALL, make_graph


def patch_pyg_graph(monkeypatch, graph) -> None:
    """PyG's ``radius_graph`` and ``triplets`` return our graph's edges and triplets."""
    def radius_graph(pos, r, batch=None, max_num_neighbors=32, **kw):
        return graph.edge_index

    def triplets(edge_index, num_nodes):
        j, i = graph.edge_index
        kj, ji = graph.idx_kj, graph.idx_ji
        return i, j, i[ji], j[ji], j[kj], kj, ji

    monkeypatch.setattr(pyg_dimenet, "radius_graph", radius_graph)
    monkeypatch.setattr(pyg_dimenet, "triplets", triplets)
    monkeypatch.setattr(pyg_schnet, "radius_graph", radius_graph)
    # the same sympy-derived functions and forward, derived once per process
    monkeypatch.setattr(pyg_dimenet, "SphericalBasisLayer", CachedSphericalBasis)


def pyg_dimenet_pp(o: dict):
    return pyg_dimenet.DimeNetPlusPlus(
        hidden_channels=o["hidden"], out_channels=1, num_blocks=o["num_layers"],
        int_emb_size=o["int_emb_size"],
        basis_emb_size=o["basis_emb_size"], out_emb_channels=o["out_emb_channels"],
        num_spherical=o["num_spherical"], num_radial=o["num_radial"], cutoff=o["cutoff"],
        output_initializer=o.get("output_initializer", "zeros"))


def pyg_schnet_model(o: dict):
    return pyg_schnet.SchNet(hidden_channels=o["hidden"], num_filters=o["num_filters"],
                             num_interactions=o["num_layers"], num_gaussians=o["num_gaussians"],
                             cutoff=o["cutoff"])


def _energy_and_forces(fn, pos):
    pos = pos.detach().requires_grad_(True)
    e = fn(pos)
    (g,) = torch.autograd.grad(e.sum(), pos)
    return e.detach(), -g


@pytest.mark.parametrize("name", ["dimenet++", "schnet"])
def test_energy_and_forces_equal_pyg(monkeypatch, batch, name):
    o = DIMENET_SMALL if name == "dimenet++" else SCHNET_SMALL
    graph = make_graph(batch, o["cutoff"])
    assert graph.num_triplets > 0
    patch_pyg_graph(monkeypatch, graph)
    torch.manual_seed(1)
    theirs = (pyg_dimenet_pp(o) if name == "dimenet++" else pyg_schnet_model(o)).double()
    ours = build_model(name, 0, 1, **o).double()
    ours.load_pyg_state_dict(theirs.state_dict())

    def pyg_fn(pos):
        return theirs(batch.z, pos, batch.batch).squeeze(-1)

    def our_fn(pos):
        b = batch.clone()
        b.pos = pos
        return ours(b, graph)["energy"]

    e_pyg, f_pyg = _energy_and_forces(pyg_fn, batch.pos)
    e_ours, f_ours = _energy_and_forces(our_fn, batch.pos)
    assert e_ours.shape == (2,)
    assert e_pyg.abs().min() > 1e-3  # a non-trivial energy (no zero-initialised output layer)
    torch.testing.assert_close(e_ours, e_pyg, rtol=0, atol=1e-6)
    torch.testing.assert_close(f_ours, f_pyg, rtol=0, atol=1e-6)
    # the response module gives the same forces
    out = ours(batch, graph, forces=True)
    torch.testing.assert_close(out["forces"], f_pyg, rtol=0, atol=1e-6)


def test_loading_pyg_weights_of_other_sizes_is_refused(monkeypatch):
    from gnnpipe.errors import ConfigError

    theirs = pyg_schnet_model({**SCHNET_SMALL, "hidden": 8})
    ours = build_model("schnet", 0, 1, **SCHNET_SMALL)
    with pytest.raises(ConfigError, match="same sizes"):
        ours.load_pyg_state_dict(theirs.state_dict())


def test_the_graph_builder_meets_the_contract_the_models_assume(batch):
    from .conftest import BruteGraph, make_graph

    ours, brute = make_graph(batch, 3.0), BruteGraph(batch, 3.0)
    assert torch.equal(ours.edge_index, brute.edge_index)
    assert torch.equal(ours.idx_kj, brute.idx_kj) and torch.equal(ours.idx_ji, brute.idx_ji)


def test_the_radial_basis_by_order_equals_pygs_functions():
    """The spherical basis's radial part evaluated one order at a time on all its roots equals PyG's ``S·R``
    sympy-derived functions (float64; the closed forms' cancellation at small arguments bounds the agreement)."""
    from gnnpipe.models.atomistic.dimenet import SphericalBasis

    basis = SphericalBasis(7, 6, 6.0)
    x = torch.linspace(0.5, 6.0, 2001, dtype=torch.float64) / 6.0
    theirs = torch.stack([f(x) for f in basis.bessel_funcs], dim=1)
    torch.testing.assert_close(basis.radial(x), theirs, rtol=1e-6, atol=1e-8)
