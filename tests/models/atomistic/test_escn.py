"""eSCN-MD (``escn-md``) on its own: the SO(3) helpers (spherical harmonics, Wigner-D, edge frames, the S² grid), the
physics in float64 (rotations rotate forces and leave energies unchanged, the frames' roll does not matter, finite
differences equal conservative forces, a 2×2×1 supercell has 4× the energy), the fairchem state-dict mapping
round-trips without fairchem installed, a 2-stage split of the units equals the whole model (values and the force
and weight gradients across the boundary), the hooks it calls and the widths it describes to the cost model (what
autograd saves, per edge and atom, in every stage of a split). Its equality with fairchem's own eSCN-MD is
checked by benchmarks/escn_fairchem_check.py (fairchem is no dependency)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from gnnpipe.cli.main import main
from gnnpipe.data.atoms import build_graph
from gnnpipe.errors import ConfigError
from gnnpipe.models import build_model, model_options
from gnnpipe.models.atomistic import LocalHooks, so3
from gnnpipe.models.atomistic.escn import (
    ESCNMD,
    export_fairchem_state_dict,
    fairchem_key_map,
    import_fairchem_state_dict,
)
from gnnpipe.tasks.s2ef.cost import stage_widths

from .conftest import molecules

#: tiny sizes (mmax < lmax exercises the cut of the edge frames' orders)
SMALL = {"num_layers": 2, "hidden": 6, "lmax": 2, "mmax": 1, "hidden_channels": 8, "edge_channels": 4,
         "num_distance_basis": 8, "cutoff": 3.0, "max_neighbors": 30}


def _model(direct=False, **kw) -> ESCNMD:
    torch.manual_seed(0)
    model = build_model("escn-md", 0, 1, **{**SMALL, "direct_forces": direct, **kw}).double()
    with torch.no_grad():  # norm biases and the like start at zero: make every weight count
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _graph(b, model):
    return build_graph(b, model.cutoff, model.max_neighbors, with_triplets=False)


def _cell_batch(atoms, pos=None) -> Batch:
    pos = torch.tensor(atoms.positions) if pos is None else pos
    return Batch.from_data_list([Data(z=torch.tensor(atoms.numbers), pos=pos,
                                      cell=torch.tensor(atoms.cell.array).unsqueeze(0),
                                      pbc=torch.tensor(atoms.pbc).unsqueeze(0), natoms=torch.tensor([len(atoms)]))])


def _triclinic():
    from ase import Atoms

    rng = np.random.default_rng(0)
    cell = np.array([[4.0, 0.0, 0.0], [1.2, 3.8, 0.0], [0.7, 0.9, 4.2]])
    return Atoms("CuAgCuAu", cell=cell, pbc=True, scaled_positions=rng.random((4, 3)))


def _rot(axis: str, t: float) -> torch.Tensor:
    c, s = math.cos(t), math.sin(t)
    m = {"x": [[1, 0, 0], [0, c, -s], [0, s, c]], "y": [[c, 0, s], [0, 1, 0], [-s, 0, c]],
         "z": [[c, -s, 0], [s, c, 0], [0, 0, 1]]}[axis]
    return torch.tensor(m, dtype=torch.float64)


# ------------------------------------------------------------------------------------------ the SO(3) helpers
def _random_rotations(n, seed=0):
    q = torch.nn.functional.normalize(torch.randn(n, 4, generator=torch.Generator().manual_seed(seed),
                                                  dtype=torch.float64), dim=-1)
    w, x, y, z = q.unbind(-1)
    return torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).view(n, 3, 3)


def test_spherical_harmonics_are_orthonormal_and_degree_one_is_cartesian():
    lmax = 4
    to_grid, from_grid = so3.s2_grid_matrices(lmax, 2 * (lmax + 1), 2 * lmax + 3)
    L = so3.num_coefficients(lmax)
    gram = from_grid.reshape(-1, L).T @ to_grid.reshape(-1, L)  # quadrature of Y_i Y_j over the sphere
    torch.testing.assert_close(gram, torch.eye(L, dtype=torch.float64), rtol=0, atol=1e-12)
    r = torch.nn.functional.normalize(torch.randn(20, 3, dtype=torch.float64), dim=-1)
    Y = so3.spherical_harmonics(lmax, r)
    torch.testing.assert_close(Y[:, 1:4], math.sqrt(3 / (4 * math.pi)) * r)
    torch.testing.assert_close(Y[:, 0], torch.full((20,), 0.5 / math.sqrt(math.pi), dtype=torch.float64))


def test_wigner_d_rotates_the_harmonics_and_is_a_representation():
    lmax = 3
    R1, R2 = _random_rotations(6, 1), _random_rotations(6, 2)
    D1, D2 = so3.wigner_d(R1, lmax), so3.wigner_d(R2, lmax)
    r = torch.nn.functional.normalize(torch.randn(6, 3, dtype=torch.float64), dim=-1)
    Yr = so3.spherical_harmonics(lmax, r)
    torch.testing.assert_close(so3.spherical_harmonics(lmax, torch.einsum("eij,ej->ei", R1, r)),
                               torch.einsum("eij,ej->ei", D1, Yr), rtol=0, atol=1e-12)
    torch.testing.assert_close(so3.wigner_d(R1 @ R2, lmax), D1 @ D2, rtol=0, atol=1e-12)
    torch.testing.assert_close(D1 @ D1.transpose(1, 2), torch.eye(16, dtype=torch.float64).expand(6, -1, -1),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(D1[:, 1:4, 1:4], R1, rtol=0, atol=1e-12)


def test_edge_rotation_takes_every_direction_to_y_poles_included():
    v = torch.randn(50, 3, dtype=torch.float64) * 2
    v[:4] = torch.tensor([[0, 1.0, 0], [0, -2.0, 0], [1e-12, -1.0, 0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    R = so3.edge_rotation(v)
    n = v / v.norm(dim=-1, keepdim=True)
    y = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64).expand(50, -1)
    torch.testing.assert_close(torch.einsum("eij,ej->ei", R, n), y, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(50, dtype=torch.float64))
    roll = torch.rand(50, dtype=torch.float64) * 6
    torch.testing.assert_close(torch.einsum("eij,ej->ei", so3.edge_rotation(v, roll), n), y, rtol=0, atol=1e-12)
    # smooth where the charts are: finite gradients at the poles
    p = v[:3].clone().requires_grad_(True)
    (g,) = torch.autograd.grad(so3.wigner_d(so3.edge_rotation(p), 2).square().sum()
                               + so3.edge_rotation(p)[:, 0, 0].sum(), p)
    assert bool(torch.isfinite(g).all())


def test_m_major_order():
    assert so3.m_major_index(2, 2) == [0, 2, 6, 3, 7, 1, 5, 8, 4]  # (l,0); (1,1) (2,1), (1,-1) (2,-1); (2,2), (2,-2)
    assert so3.m_major_index(2, 1) == [0, 2, 6, 3, 7, 1, 5]
    assert so3.m_major_degrees(2, 1) == [0, 1, 2, 1, 2, 1, 2]


# ------------------------------------------------------------------------------------------ physics (float64)
@pytest.mark.parametrize("direct", [False, True])
def test_rotations_rotate_forces_and_leave_the_energy(direct):
    """Exact (1e-10) for rotations that map the feed-forward's S² grid onto itself (about y by 2π/7, by π about z)
    and, on a fine grid, for any rotation; on the default grid a generic rotation changes the energy only by the
    grid's aliasing (small, not zero: a pointwise nonlinearity on a finite grid)."""
    b = molecules((7, 5), seed=1)
    for grid, rotations in ((0, [_rot("y", 2 * math.pi / 7), _rot("z", math.pi),
                                 _rot("y", 4 * math.pi / 7) @ _rot("z", math.pi)]),
                            (40, [_rot("y", 0.3) @ _rot("x", 1.1) @ _rot("z", 0.7)])):
        model = _model(direct, grid_resolution=grid)
        out = model(b, _graph(b, model), forces=True)
        assert float(out["forces"].detach().abs().max()) > 1e-4
        for R in rotations:
            r = b.clone()
            r.pos = b.pos @ R.T
            rot = model(r, _graph(r, model), forces=True)
            torch.testing.assert_close(rot["energy"], out["energy"], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(rot["forces"], out["forces"] @ R.T, rtol=1e-10, atol=1e-12)
    model = _model(direct)
    r = b.clone()
    R = _rot("y", 0.3) @ _rot("x", 1.1)
    r.pos = b.pos @ R.T
    out, rot = model(b, _graph(b, model), forces=True), model(r, _graph(r, model), forces=True)
    assert float((rot["energy"] - out["energy"]).detach().abs().max() / out["energy"].detach().abs().max()) < 1e-3


@pytest.mark.parametrize("direct", [False, True])
def test_the_roll_of_the_edge_frames_does_not_matter(direct):
    b = molecules((7, 5), seed=1)
    model = _model(direct)
    graph = _graph(b, model)
    out = model(b, graph, forces=True)
    model.units[0].random_roll = True  # fairchem's behaviour: a random roll per edge and call
    for _ in range(2):
        rolled = model(b, graph, forces=True)
        torch.testing.assert_close(rolled["energy"], out["energy"], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(rolled["forces"], out["forces"], rtol=1e-10, atol=1e-12)


def test_conservative_forces_equal_finite_differences():
    atoms = _triclinic()
    model = _model(cutoff=4.0)
    b = _cell_batch(atoms)
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
                e.append(float(model(_cell_batch(atoms, pos=p), graph)["energy"].sum()))
        fd = -(e[0] - e[1]) / (2 * h)
        assert abs(fd) > 1e-6
        assert math.isclose(float(out["forces"][atom, axis]), fd, rel_tol=1e-6, abs_tol=1e-9)


@pytest.mark.parametrize("direct", [False, True])
def test_a_supercell_has_four_times_the_energy(direct):
    atoms = _triclinic()
    model = _model(direct, cutoff=4.0)
    b, big = _cell_batch(atoms), _cell_batch(atoms * (2, 2, 1))
    out, out4 = model(b, _graph(b, model), forces=True), model(big, _graph(big, model), forces=True)
    assert math.isclose(float(out4["energy"].detach()), 4 * float(out["energy"].detach()), rel_tol=1e-10)
    torch.testing.assert_close(out4["forces"], out["forces"].repeat(4, 1), rtol=1e-9, atol=1e-12)


def test_a_structure_without_edges():
    b = molecules((2,), seed=0)
    b.pos = torch.tensor([[0.0, 0.0, 0.0], [9.0, 0.0, 0.0]], dtype=torch.float64)
    for direct in (False, True):
        model = _model(direct)
        graph = _graph(b, model)
        assert graph.num_edges == 0
        out = model(b, graph, forces=True)
        # conservative: exactly zero; direct: the l = 1 coefficients the grid's quadrature leaves (rounding)
        assert out["forces"].shape == (2, 3) and float(out["forces"].detach().abs().max()) < 1e-12
        assert bool(torch.isfinite(out["energy"]).all())


def test_training_forces_are_differentiable():
    b = molecules((6,), seed=3)
    model = _model().train()
    out = model(b, _graph(b, model), forces=True)
    assert out["forces"].requires_grad
    (out["forces"].square().sum() + out["energy"].sum()).backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())


# ------------------------------------------------------------------------------------------ fairchem's weights
@pytest.mark.parametrize("direct", [False, True])
def test_the_fairchem_state_dict_round_trips(direct):
    model = _model(direct)
    sd = export_fairchem_state_dict(model)
    C = SMALL["hidden"]
    # fairchem's names and shapes (escnmd_backbone, MLP_Energy_Head, Linear_Force_Head)
    assert sd["backbone.sphere_embedding.weight"].shape == (100, C)
    assert sd["backbone.mix_csd.weight"].shape == (C, 2 * C)
    assert "backbone.edge_degree_embedding.rad_func.net.6.weight" in sd
    assert sd["backbone.blocks.1.edge_wise.so2_conv_1.so2_m_conv.0.fc.weight"].shape == (2 * 2 * 8, 2 * 2 * C)
    assert "backbone.blocks.0.edge_wise.so2_conv_1.rad_func.net.3.bias" in sd
    assert "backbone.blocks.0.atom_wise.grid_mlp.4.weight" in sd
    assert sd["backbone.blocks.0.norm_2.affine_weight"].shape == (3, C)
    assert "backbone.norm.affine_bias" in sd and "output_heads.energy.energy_block.4.bias" in sd
    if direct:
        assert sd["output_heads.forces.linear.weight"].shape == (2, 1, C)
    assert len(set(fairchem_key_map(model).values())) == len(model.state_dict())
    other = _model(direct)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    # as a fairchem checkpoint would hold it: under "module.", other heads beside
    import_fairchem_state_dict(other, {f"module.{k}": v for k, v in sd.items()})
    for k, v in model.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    assert torch.equal(export_fairchem_state_dict(other)["backbone.blocks.0.norm_1.affine_bias"],
                       sd["backbone.blocks.0.norm_1.affine_bias"])


def test_importing_a_mismatched_state_dict_is_refused():
    model = _model()
    sd = export_fairchem_state_dict(model)
    with pytest.raises(ConfigError, match="has no 'backbone.blocks.1.norm_1.affine_weight'"):
        import_fairchem_state_dict(model, {k: v for k, v in sd.items()
                                           if k != "backbone.blocks.1.norm_1.affine_weight"})
    with pytest.raises(ConfigError, match="build escn-md with the checkpoint's sizes"):
        import_fairchem_state_dict(_model(lmax=3), sd)
    bad = dict(sd)
    bad["backbone.mix_csd.weight"] = torch.zeros(6, 18, dtype=torch.float64)
    with pytest.raises(ConfigError, match="dataset embedding"):
        import_fairchem_state_dict(model, bad)


# ------------------------------------------------------------------------------------------ units and hooks
def _boundary_split(model, b, graph, k):
    """Stage 1 runs units [0, k) from ``pos1``, stage 2 receives the boundary tensors (detached leaves) and runs
    [k, L) from its own ``pos2``; returns (energy, stage-2 state, boundary in / out, pos1, pos2)."""
    s1 = model.initial_state(b, graph, pos_grad=True)
    s1 = model.run_units(0, k, s1, graph)
    out = {name: s1[name] for name in model.pipeline_boundary()}
    s2 = model.initial_state(b, graph, pos_grad=True)
    ins = {name: t.detach().clone().requires_grad_(True) for name, t in out.items()}
    s2 = model.stage_geometry({**s2, **ins}, graph)
    s2 = model.run_units(k, model.num_units, s2, graph)
    return model.readout(s2, graph), out, ins, s1["pos"], s2["pos"]


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_a_two_stage_split_equals_the_whole_model(direct, k):
    b = molecules((6, 8), seed=0)
    model = _model(direct, num_layers=3).train()
    graph = _graph(b, model)
    whole = model(b, graph, forces=True)
    loss = whole["energy"].square().sum() + whole["forces"].square().sum()
    ref = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    out, bout, bin_, pos1, pos2 = _boundary_split(model, b, graph, k)
    shapes = model.boundary_shapes(graph)
    assert list(shapes) == list(bout) and all(tuple(bout[n].shape) == shapes[n] for n in shapes)
    torch.testing.assert_close(out["energy"], whole["energy"], rtol=1e-12, atol=1e-12)
    params = list(model.parameters())
    if direct:
        forces = out["forces"]
    else:  # −∂E/∂pos: stage 2's own share plus stage 1's through the boundary
        g2 = torch.autograd.grad(out["energy"].sum(), [pos2, *bin_.values()], create_graph=True)
        g1 = torch.autograd.grad(list(bout.values()), pos1, grad_outputs=list(g2[1:]), create_graph=True)[0]
        forces = -(g2[0] + g1)
    torch.testing.assert_close(forces, whole["forces"], rtol=1e-10, atol=1e-12)
    # the weights' gradients of an energy and force loss: along every path inside the stages, plus stage 1's
    # through the boundary tensors' gradients
    loss = out["energy"].square().sum() + forces.square().sum()
    grads = torch.autograd.grad(loss, [*params, *bin_.values()], allow_unused=True, retain_graph=True)
    g_direct, g_in = grads[:len(params)], grads[len(params):]
    assert all(g is not None for g in g_in)
    g_through = torch.autograd.grad(list(bout.values()), params, grad_outputs=list(g_in), allow_unused=True)
    for p, r, a, c in zip(params, ref, g_direct, g_through):
        parts = [g for g in (a, c) if g is not None]
        total = sum(parts) if parts else torch.zeros_like(p)
        torch.testing.assert_close(total, torch.zeros_like(p) if r is None else r, rtol=1e-9, atol=1e-12)


class RecordingComm(LocalHooks):
    """The identity hooks, recording each call's name and shape."""

    def __init__(self):
        self.calls = []

    def _rec(self, name, x):
        self.calls.append((name, tuple(x.shape)))
        return x

    def atoms_gather(self, h):
        return self._rec("atoms_gather", h)

    def atoms_reduce(self, h):
        return self._rec("atoms_reduce", h)

    def edges_gather(self, x):
        return self._rec("edges_gather", x)

    def sum(self, x):
        return self._rec("sum", x)

    def replicated_grad(self, g):
        return self._rec("replicated_grad", g)


@pytest.mark.parametrize("direct", [False, True])
def test_the_hooks_it_calls(direct):
    b = molecules((6, 8), seed=0)
    model = _model(direct)
    comm = RecordingComm()
    model(b, _graph(b, model), comm, forces=True)
    N, C, L = b.num_nodes, SMALL["hidden"], 9
    expected = [("atoms_reduce", (N, L * C))]  # the element embeddings are looked up per edge: no gather
    for _ in range(SMALL["num_layers"]):
        expected += [("atoms_gather", (N, L * C)), ("atoms_reduce", (N, L * C))]
    expected += [("sum", (2,))] + ([] if direct else [("replicated_grad", (N, 3))])
    assert comm.calls == expected
    # the model's own description (for the cost model): the same calls and widths (direct: + the trainer's gather)
    described = [(c.hook, c.width) for c in model.hook_calls(N, 2) if not c.forward_only]
    assert described == [(h, shape[1] if h not in ("sum", "replicated_grad") else math.prod(shape))
                         for h, shape in expected]


# ------------------------------------------------------------------------------------------ its own cost
def _saved_values(model, b, graph, lo: int, hi: int) -> int:
    """Values autograd saves in a pipeline stage running units ``[lo, hi)`` of ``model`` (the readout when ``hi`` is
    the last unit) on ``b``: floating tensors counted once per storage, the parameters, buffers, positions and the
    boundary tensors the stage receives left out. A stage after the first receives the boundary (from a run of
    units ``[0, lo)``) and recomputes the geometry (:meth:`stage_geometry`), as the pipeline does."""
    cons = not model.direct_forces
    seen = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    got = [0]

    def pack(t):
        st = t.untyped_storage()
        if t.is_floating_point() and st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            got[0] += st.nbytes() // t.element_size()
        return t

    state = model.initial_state(b, graph, pos_grad=cons)
    if lo > 0:
        before = model.run_units(0, lo, model.initial_state(b, graph, pos_grad=cons), graph)
        state = {**state, **{k: before[k].detach().requires_grad_(True) for k in model.pipeline_boundary()}}
    seen |= {t.untyped_storage().data_ptr() for t in state.values() if isinstance(t, torch.Tensor)}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if lo > 0:
            state = model.stage_geometry(state, graph)
        state = model.run_units(lo, hi, state, graph)
        if hi == model.num_units:
            model.readout(state, graph)
    return got[0]


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("sizes", [{}, {"lmax": 3, "mmax": 2}, {"lmax": 1, "mmax": 0, "num_layers": 3}])
def test_the_widths_it_describes_are_what_autograd_saves(direct, sizes):
    """The activation, geometry and embedding-stage widths the cost model reads (stage_widths combines them) equal
    the values autograd's saved-tensor hooks see, per owned edge and atom, in every stage of a pipeline split and in
    the single process; what is left is a per-call constant (the norms' per-degree weights, the system embedding),
    equal on batches of other sizes."""
    model = _model(direct, **sizes).train()
    n = model.num_units
    batches = [molecules((6, 8), seed=1), molecules((5, 9, 7), seed=2), _cell_batch(_triclinic())]
    for lo, hi in [(0, n), (0, 1), (1, n), (1, 2), (0, 2)]:
        kept, _ = stage_widths(model, lo, hi)
        rest = []
        for b in batches:
            graph = _graph(b, model)
            measured = _saved_values(model, b, graph, lo, hi)
            predicted = kept.total(graph.num_edges, 0, b.num_nodes)
            rest.append(measured - predicted)
            assert 0 <= rest[-1] < 0.02 * predicted, (lo, hi, measured, predicted)
        assert len(set(rest)) == 1, (lo, hi, rest)


@pytest.mark.slow  # ~16 s on the loaded 2-core machine: it profiles a training step
def test_plan_ranks_its_layouts(capsys):
    """``gnnpipe plan`` costs escn-md's layouts (it asks the model for its widths and hook calls)."""
    rc = main(["plan", "--model", "escn-md", "--ranks", "2", "--frames", "4", "--layers", "1", "--hidden", "8",
               "--model-arg=edge_channels=4", "--model-arg=num_distance_basis=8", "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "S1xG2xD1" in out and "S1xG1xD2" in out


def test_weights_are_seeded_per_unit():
    a = build_model("escn-md", 0, 1, **SMALL)
    bigger = build_model("escn-md", 0, 1, **{**SMALL, "num_layers": 3})
    a.reset_parameters(seed=7)
    bigger.reset_parameters(seed=7)
    for u in range(a.num_units):
        for (k, p), (k2, q) in zip(a.units[u].state_dict().items(), bigger.units[u].state_dict().items()):
            assert k == k2 and torch.equal(p, q), k


def test_registered_with_options_and_refuses_bad_ones():
    from gnnpipe.cli.models import describe

    opts = model_options("escn-md")
    for name in ("lmax", "mmax", "sphere_channels", "hidden_channels", "edge_channels", "num_distance_basis",
                 "cutoff", "max_neighbors", "direct_forces", "norm_type", "grid_resolution"):
        assert name in opts and opts[name].help, name
    text = describe("escn-md")
    assert "Charge, spin and dataset embeddings may come later" in text
    m = build_model("escn-md", 0, 1, num_layers=1, hidden=8, edge_channels=4, num_distance_basis=4)
    assert m.config["sphere_channels"] == 8 and m.config["hidden_channels"] == 8 and m.num_units == 2
    assert not m.uses_triplets and m.graph_parallel
    for kw, match in [({"mmax": 3}, "mmax"), ({"hidden": 7}, "even sphere_channels"), ({"lmax": 0}, "lmax"),
                      ({"norm_type": "layer_norm"}, "norm_type"), ({"ff_type": "spectral"}, "ff_type"),
                      ({"dropout": 0.1}, "dropout"), ({"grid_resolution": 5}, "grid_resolution"),
                      ({"num_distance_basis": 1}, "num_distance_basis"), ({"cutoff": 0.0}, "cutoff")]:
        with pytest.raises(ConfigError, match=match):
            build_model("escn-md", 0, 1, **{**SMALL, **kw})
