"""The neighbour graph and triplets (gnnpipe.data.atoms.graph) against ASE's neighbour list and brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import add_adsorbate, bulk, fcc111, molecule
from ase.neighborlist import neighbor_list
from torch_geometric.data import Batch, Data

from gnnpipe.data.atoms import build_graph, concat_graphs, split_graph, triplets
from gnnpipe.data.atoms.graph import AtomGraph


def _data(atoms: Atoms, dtype=torch.float64) -> Data:
    return Data(z=torch.tensor(atoms.numbers), pos=torch.tensor(atoms.positions, dtype=dtype),
                cell=torch.tensor(atoms.cell.array, dtype=dtype).reshape(1, 3, 3),
                pbc=torch.tensor(atoms.pbc).reshape(1, 3), natoms=torch.tensor([len(atoms)]))


def _structures() -> list[Atoms]:
    rng = np.random.default_rng(0)
    slab = fcc111("Cu", (2, 2, 3), vacuum=5.0)
    add_adsorbate(slab, "O", 1.4, "fcc")
    tiny = bulk("Cu", "fcc", a=3.6)                          # one atom: its neighbours are its own images
    tiny.rattle(0.05, seed=1)
    chain = Atoms("H2", positions=[[0, 0, 0], [0.4, 0.1, 0.0]], cell=[1.2, 8, 8], pbc=[True, False, False])
    mol = molecule("CH3CH2OH")
    skew = bulk("Al", "fcc", a=4.05) * (2, 1, 1)
    skew.positions += rng.normal(0, 0.05, skew.positions.shape)
    unwrapped = skew.copy()                                  # atoms far outside the cell they repeat
    unwrapped.positions[1] += 2 * unwrapped.cell[0] - 3 * unwrapped.cell[2]
    return [slab, tiny, chain, mol, skew, unwrapped]


def _edge_set(graph: AtomGraph, pos, cell, lo=0, hi=None):
    vec = graph.edge_vectors(pos, cell).detach().numpy()
    out = {}
    for e, (j, i) in enumerate(graph.edge_index.t().tolist()):
        if lo <= i < (hi if hi is not None else graph.num_nodes):
            out[(i - lo, j - lo, tuple(graph.cell_offsets[e].tolist()))] = vec[e]
    return out


@pytest.mark.parametrize("method", ["ase", "torch"])
@pytest.mark.parametrize("k", range(6))
def test_edges_equal_ase_neighbor_list_pairs_shifts_and_distances(k, method):
    atoms = _structures()[k]
    cutoff = 3.1
    graph = build_graph(_data(atoms), cutoff, with_triplets=False, method=method)
    i, j, shifts, dist, vec = neighbor_list("ijSdD", atoms, cutoff)
    ours = _edge_set(graph, torch.tensor(atoms.positions), torch.tensor(atoms.cell.array).reshape(1, 3, 3))
    theirs = {(a, b, tuple(s)): v for a, b, s, v in zip(i.tolist(), j.tolist(), shifts.tolist(), vec)}
    assert len(theirs) > 0 and set(ours) == set(theirs)
    for key, v in theirs.items():
        np.testing.assert_allclose(ours[key], v, atol=1e-10)
    d = graph.distances(torch.tensor(atoms.positions), torch.tensor(atoms.cell.array).reshape(1, 3, 3))
    assert torch.all(d < cutoff) and np.isclose(d.sum().item(), dist.sum())


def test_order_is_target_then_distance_and_cap_keeps_the_nearest():
    atoms = _structures()[0]
    data = _data(atoms)
    full = build_graph(data, 6.0, with_triplets=False)
    capped = build_graph(data, 6.0, max_neighbors=7, with_triplets=False)
    for g in (full, capped):
        dst = g.edge_index[1]
        assert torch.all(dst[1:] >= dst[:-1])
    d_full = full.distances(data.pos, data.cell)
    d_cap = capped.distances(data.pos, data.cell)
    counts = torch.bincount(capped.edge_index[1], minlength=len(atoms))
    assert counts.max() == 7 and torch.all(counts == torch.clamp(torch.bincount(full.edge_index[1]), max=7))
    for a in range(len(atoms)):
        df = d_full[full.edge_index[1] == a]
        dc = d_cap[capped.edge_index[1] == a]
        assert torch.all(df[1:] >= df[:-1] - 1e-12)
        torch.testing.assert_close(dc, df[:7])


def test_keep_ties_keeps_symmetric_neighbours_together():
    data = _data(bulk("Cu", "fcc", a=3.6))                 # 12 nearest neighbours at 2.55 Å, 6 next at 3.6 Å
    strict = build_graph(data, 4.0, max_neighbors=8, with_triplets=False)
    ties = build_graph(data, 4.0, max_neighbors=8, with_triplets=False, keep_ties=True)
    assert strict.num_edges == 8 and ties.num_edges == 12
    assert build_graph(data, 4.0, max_neighbors=12, with_triplets=False, keep_ties=True).num_edges == 12
    assert build_graph(data, 4.0, max_neighbors=13, with_triplets=False, keep_ties=True).num_edges == 18


@pytest.mark.parametrize("k", range(6))
def test_deterministic_and_the_torch_path_equals_the_ase_path(k):
    data = _data(_structures()[k])
    a = build_graph(data, 4.5, 9, method="ase")
    for g in (build_graph(data, 4.5, 9, method="torch"), build_graph(data, 4.5, 9)):
        assert torch.equal(a.edge_index, g.edge_index) and torch.equal(a.cell_offsets, g.cell_offsets)
        assert torch.equal(a.idx_kj, g.idx_kj) and torch.equal(a.idx_ji, g.idx_ji)
    with pytest.raises(ValueError, match="method"):
        build_graph(data, 3.0, method="cells")


def test_batch_offsets_atom_indices_per_structure():
    structures = _structures()
    datas = [_data(a) for a in structures]
    batch = Batch.from_data_list(datas)
    graph = build_graph(batch, 3.1)
    ptr = batch.ptr.tolist()
    cells = batch.cell
    got = 0
    for s, (lo, hi) in enumerate(itertools.pairwise(ptr)):
        one = build_graph(datas[s], 3.1)
        mask = (graph.edge_index[1] >= lo) & (graph.edge_index[1] < hi)
        assert torch.equal(graph.edge_index[:, mask] - lo, one.edge_index)
        assert torch.equal(graph.cell_offsets[mask], one.cell_offsets)
        assert torch.all(graph.batch[graph.edge_index[0, mask]] == s)
        got += one.num_triplets
    assert graph.num_triplets == got
    joined = concat_graphs([build_graph(d, 3.1) for d in datas])
    for name in ("edge_index", "cell_offsets", "batch", "idx_kj", "idx_ji"):
        assert torch.equal(getattr(joined, name), getattr(graph, name)), name
    assert joined.num_nodes == graph.num_nodes and joined.num_structures == graph.num_structures == len(datas)
    with pytest.raises(ValueError, match="different cutoff"):
        concat_graphs([build_graph(datas[0], 3.1), build_graph(datas[1], 3.0)])
    torch.testing.assert_close(graph.distances(batch.pos, cells),
                               torch.cat([build_graph(d, 3.1).distances(d.pos, d.cell) for d in datas]))


@pytest.mark.parametrize("with_triplets", [True, False])
def test_split_graph_is_the_inverse_of_concat(with_triplets):
    datas = [_data(a) for a in _structures()]
    kw = dict(with_triplets=with_triplets, with_reverse=with_triplets)  # reverse edges travel like triplets
    graph = build_graph(Batch.from_data_list(datas), 3.1, **kw)
    sizes = [1, 0, len(datas) - 1]
    parts = split_graph(graph, sizes)
    assert [p.num_structures for p in parts] == sizes
    expected = [build_graph(Batch.from_data_list(datas[:1]), 3.1, **kw), None,
                build_graph(Batch.from_data_list(datas[1:]), 3.1, **kw)]
    names = ("edge_index", "cell_offsets", "batch") + (("idx_kj", "idx_ji", "id_swap") if with_triplets else ())
    for got, want in zip(parts, expected):
        if want is None:
            assert got.num_nodes == got.num_edges == 0
            continue
        for name in names:
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert got.num_nodes == want.num_nodes
    joined = concat_graphs([p for p in parts if p.num_structures])
    for name in names:
        assert torch.equal(getattr(joined, name), getattr(graph, name)), name
    with pytest.raises(ValueError, match="sum to"):
        split_graph(graph, [1])
    flipped = AtomGraph(graph.edge_index.flip(1), graph.cell_offsets, graph.batch, graph.num_nodes,
                        num_structures=graph.num_structures)
    with pytest.raises(ValueError, match="sorted by target"):
        split_graph(flipped, [len(datas)])


def _brute_triplets(graph: AtomGraph, pos, cell):
    """Every (kj, ji) with kj ending where ji starts, minus the pairs whose k lands on i (geometry, not offsets)."""
    vec = graph.edge_vectors(pos, cell)
    src, dst = graph.edge_index.tolist()
    out = []
    for ji, kj in itertools.product(range(graph.num_edges), repeat=2):
        if dst[kj] != src[ji]:
            continue
        # the image of k seen from i: (j's image from i) + (k's image from j)
        if src[kj] == dst[ji] and torch.norm(vec[ji] + vec[kj]) < 1e-9:
            continue
        out.append((ji, kj))
    return sorted(out)


@pytest.mark.parametrize("k", range(6))
def test_triplets_equal_brute_force_with_periodic_images(k):
    data = _data(_structures()[k])
    cutoff = 3.1 if k != 1 else 4.0    # the one-atom cell: 12 + 6 of its own images
    graph = build_graph(data, cutoff)
    got = sorted(zip(graph.idx_ji.tolist(), graph.idx_kj.tolist()))
    assert got == _brute_triplets(graph, data.pos, data.cell)
    assert graph.num_triplets > 0
    assert torch.all(graph.idx_ji[1:] >= graph.idx_ji[:-1])
    assert torch.equal(graph.triplets_per_edge, torch.bincount(graph.idx_ji, minlength=graph.num_edges))


def test_self_image_edge_pairs_with_itself_and_k_equal_i_in_another_image_is_kept():
    data = _data(_structures()[1])                  # one atom, every edge is 0 → 0 with a nonzero offset
    graph = build_graph(data, 4.0)
    assert torch.all(graph.edge_index == 0)
    pairs = set(zip(graph.idx_kj.tolist(), graph.idx_ji.tolist()))
    assert all((e, e) in pairs for e in range(graph.num_edges))
    off = graph.cell_offsets
    back = [(kj, ji) for kj, ji in pairs if torch.all(off[kj] + off[ji] == 0)]
    assert back == []
    assert graph.num_triplets == graph.num_edges * (graph.num_edges - 1)


@pytest.mark.parametrize("cap", [None, 3])
def test_reverse_edges_join_the_same_pair_the_other_way(cap):
    datas = [_data(a) for a in _structures()]
    graph = build_graph(Batch.from_data_list(datas), 3.1, cap, with_reverse=True)
    rev = graph.id_swap
    has = rev >= 0
    src, dst = graph.edge_index
    assert torch.equal(src[rev[has]], dst[has]) and torch.equal(dst[rev[has]], src[has])
    assert torch.equal(graph.cell_offsets[rev[has]], -graph.cell_offsets[has])
    assert torch.equal(rev[rev[has]], torch.arange(graph.num_edges)[has])  # an involution
    if cap is None:
        assert bool(has.all())  # without a cap every pair is there both ways
    else:  # a cap keeps some edges whose reverse it dropped
        assert 0 < int((~has).sum()) < graph.num_edges
        assert build_graph(Batch.from_data_list(datas), 3.1, cap).id_swap is None


def test_triplets_reject_unsorted_edges():
    with pytest.raises(ValueError, match="sorted by target"):
        triplets(torch.tensor([[0, 1], [1, 0]]), None, 2)


def test_gradient_of_edge_vectors_reaches_pos_and_cell_finite_differences():
    data = _data(_structures()[0])
    graph = build_graph(data, 4.0)
    pos = data.pos.clone().requires_grad_(True)
    cell = data.cell.clone().requires_grad_(True)

    def energy(p, c):
        vec = graph.edge_vectors(p, c)
        d = vec.norm(dim=-1)
        a, b = vec[graph.idx_ji], vec[graph.idx_kj]
        cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
        return torch.exp(-d).sum() + (cos ** 2).sum() * 1e-2

    assert torch.autograd.gradcheck(energy, (pos, cell), eps=1e-6, atol=1e-6)
    g_pos, g_cell = torch.autograd.grad(energy(pos, cell), (pos, cell))
    assert g_pos.abs().sum() > 0 and g_cell.abs().sum() > 0


def test_edge_vectors_needs_a_cell_when_edges_cross_boundaries():
    data = _data(_structures()[1])
    graph = build_graph(data, 3.0)
    with pytest.raises(ValueError, match="cell"):
        graph.edge_vectors(data.pos)


def test_bad_arguments():
    data = _data(molecule("H2O"))
    with pytest.raises(ValueError, match="cutoff"):
        build_graph(data, 0.0)
    with pytest.raises(ValueError, match="max_neighbors"):
        build_graph(data, 3.0, max_neighbors=0)
    unsorted = Data(pos=torch.rand(3, 3) * 5, batch=torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="non-decreasing"):
        build_graph(unsorted, 3.0)
    with pytest.raises(ValueError, match="without triplets"):
        _ = build_graph(data, 3.0, with_triplets=False).num_triplets


def test_a_structure_without_edges_gives_empty_tensors():
    batch = Batch.from_data_list([Data(pos=torch.zeros(1, 3)), Data(pos=torch.tensor([[0.0, 0, 0], [0, 0, 0.7]]))])
    graph = build_graph(batch, 3.0)
    assert graph.edge_index.tolist() == [[2, 1], [1, 2]] and graph.num_triplets == 0
    assert graph.edge_vectors(batch.pos).shape == (2, 3)
