"""Edge/triplet partitioners for graph parallelism (gnnpipe.partitioners.edges) and the morton vertex partitioner."""

from __future__ import annotations

import pytest
import torch

from gnnpipe import partitioners as P
from gnnpipe.errors import ConfigError, DataValidationError, UnknownComponentError

from .atom_graphs import random_batch

METHODS = [("edge-chunk", {}), ("atom-owner", {}), ("atom-owner", {"vertex": "metis"}),
           ("atom-owner", {"vertex": "contiguous"})]


@pytest.fixture(scope="module")
def graph():
    return random_batch(sizes=(14, 9), seed=0)


def test_registry_lists_the_builtins_and_takes_new_ones(graph):
    assert {"edge-chunk", "atom-owner"} <= set(P.available_edge_partitioners())
    assert "morton" in P.available()
    with pytest.raises(UnknownComponentError, match="edge-chunk"):
        P.get_edge_partitioner("nope")

    @P.register_edge_partitioner("test-all-on-last")
    class AllOnLast(P.EdgePartitioner):
        def assign(self, g, num_ranks, seed):
            return torch.full((g.num_edges,), num_ranks - 1), torch.full((g.num_nodes,), num_ranks - 1)

    plan = P.plan_graph_parallel(graph, 3, "test-all-on-last")
    assert plan.edge_counts == [0, 0, graph.edge_index.size(1)] and plan.method == "test-all-on-last"
    assert [t.numel() for t in plan.triplets] == [0, 0, graph.idx_ji.numel()]


@pytest.mark.parametrize("method,opts", METHODS)
@pytest.mark.parametrize("G", [1, 2, 3, 4, 7])
def test_every_edge_triplet_atom_owned_once_triplets_with_their_edge(graph, method, opts, G):
    plan = P.plan_graph_parallel(graph, G, method, **opts)
    E, T, N = graph.edge_index.size(1), graph.idx_ji.numel(), graph.num_nodes
    for ids, total in ((plan.edges, E), (plan.triplets, T), (plan.atoms, N)):
        assert len(ids) == G
        assert torch.equal(torch.sort(torch.cat(ids)).values, torch.arange(total))
    for r in range(G):
        assert torch.equal(plan.edge_owner[graph.idx_ji[plan.triplets[r]]], torch.full((plan.triplets[r].numel(),), r))
        # local idx_ji points at the owned edge; the two local idx_kj point at the same global edge
        assert torch.equal(plan.edges[r][plan.local_idx_ji[r]], graph.idx_ji[plan.triplets[r]])
        assert torch.equal(plan.edge_order()[plan.local_idx_kj_allgather[r]], graph.idx_kj[plan.triplets[r]])
        halo_buffer = torch.cat([plan.edges[r], plan.halo[r]])
        assert torch.equal(halo_buffer[plan.local_idx_kj_halo[r]], graph.idx_kj[plan.triplets[r]])
    if method == "atom-owner":  # edges follow their target atom
        assert torch.equal(plan.edge_owner, plan.atom_owner[graph.edge_index[1]])


@pytest.mark.parametrize("method,opts", METHODS)
def test_halo_rows_match_brute_force(graph, method, opts):
    G = 3
    plan = P.plan_graph_parallel(graph, G, method, **opts)
    owner = {}
    for r in range(G):
        for e in plan.edges[r].tolist():
            owner[e] = r
    for r in range(G):
        reads = {int(graph.idx_kj[t]) for t in range(graph.idx_ji.numel()) if owner[int(graph.idx_ji[t])] == r}
        remote = sorted((owner[e], e) for e in reads if owner[e] != r)
        assert plan.halo[r].tolist() == [e for _, e in remote]
        assert plan.metrics().halo_rows[r] == len(remote)
        for s in range(G):  # what s sends r: its local rows of the edges r reads from it, in r's order
            sent = plan.edges[s][plan.halo_send[s][r]].tolist() if s != r else []
            assert sent == [e for o, e in remote if o == s]
            assert plan.halo_recv_counts[r][s] == len(sent)


@pytest.mark.parametrize("method,opts", METHODS)
def test_the_plan_is_deterministic(graph, method, opts):
    a = P.plan_graph_parallel(graph, 3, method, **opts)
    b = P.plan_graph_parallel(random_batch(sizes=(14, 9), seed=0), 3, method, **opts)
    for name in ("edge_owner", "atom_owner", "triplet_owner"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    for r in range(3):
        assert torch.equal(a.halo[r], b.halo[r]) and torch.equal(a.local_idx_kj_halo[r], b.local_idx_kj_halo[r])
    assert a.metrics() == b.metrics()


def test_edge_chunk_ranges_are_contiguous_and_balanced_by_weight(graph):
    for G in (2, 3, 4):
        plan = P.plan_graph_parallel(graph, G, "edge-chunk")
        assert torch.equal(plan.edge_owner, torch.sort(plan.edge_owner).values)  # contiguous ranges in edge order
        assert torch.equal(plan.triplet_owner, torch.sort(plan.triplet_owner).values)  # so are the triplets
        m = plan.metrics()
        w = 1.0 + plan.triplets_per_edge.double()
        assert sum(m.weight) == pytest.approx(float(w.sum()))
        # each range is within one edge's weight of the mean
        assert max(m.weight) - float(w.sum()) / G <= float(w.max()) + 1e-9
        assert m.weight_imbalance == pytest.approx(max(m.weight) / (sum(m.weight) / G))
        assert max(m.atoms) - min(m.atoms) <= 1
    # beta = 0: plain edge counts, sizes differ by at most one
    plan = P.plan_graph_parallel(graph, 4, "edge-chunk", beta=0.0)
    assert max(plan.edge_counts) - min(plan.edge_counts) <= 1
    # the triplet-aware weight balances triplets better than plain edge counts on this graph
    wt = P.plan_graph_parallel(graph, 4, "edge-chunk").metrics()
    assert wt.weight_imbalance <= P.plan_graph_parallel(graph, 4, "edge-chunk", beta=0.0).metrics().weight_imbalance


def test_fewer_edges_and_atoms_than_ranks():
    tiny = random_batch(sizes=(2,), seed=3, box=1.0)  # 2 atoms, 2 edges, 0 triplets
    assert tiny.edge_index.size(1) == 2 and tiny.idx_ji.numel() == 0
    for method in ("edge-chunk", "atom-owner"):
        plan = P.plan_graph_parallel(tiny, 4, method)
        m = plan.metrics()
        assert m.edges == [1, 1, 0, 0] and m.atoms == [1, 1, 0, 0] and m.triplets == [0, 0, 0, 0]
        assert m.edge_imbalance == 2.0 and m.triplet_imbalance == 1.0
        assert all(x.numel() == 0 for x in plan.halo)


def test_bad_input_is_named(graph):
    with pytest.raises(ConfigError, match="integer >= 1"):
        P.plan_graph_parallel(graph, 0)
    with pytest.raises(ConfigError, match="alpha"):
        P.plan_graph_parallel(graph, 2, "edge-chunk", alpha=0, beta=0)
    with pytest.raises(DataValidationError, match="idx_kj"):
        P.plan_graph_parallel(type("G", (), {"edge_index": graph.edge_index, "num_nodes": graph.num_nodes})(), 2)
    bad = random_batch(sizes=(5,), seed=1)
    bad.idx_kj = bad.idx_kj + 1000
    with pytest.raises(DataValidationError, match="idx_kj holds edge ids outside"):
        P.plan_graph_parallel(bad, 2)
    with pytest.raises(ConfigError, match="vertex_options"):
        P.plan_graph_parallel(graph, 2, "atom-owner", vertex_options={"nonsense": 1})
    nopos = random_batch(sizes=(6,), seed=1)
    del nopos.pos
    with pytest.raises(ConfigError, match="positions"):
        P.plan_graph_parallel(nopos, 2, "atom-owner")


# ----------------------------------------------------------------------------------------------- morton
def test_morton_codes_interleave_the_bits():
    pts = torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])
    assert P.morton_codes(pts, bits=1).tolist() == [0, 1, 2, 4, 7]
    # 2 bits: x = 3 (binary 11), y = 0, z = 0 → bits 0 and 3
    assert P.morton_codes(torch.tensor([[0.0, 0, 0], [3.0, 3, 3], [3.0, 0, 0]]), bits=2).tolist()[2] == 0b1001


def test_morton_partitioner_gives_compact_balanced_regions():
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(400, 3, generator=g)
    graph = P.Graph(torch.empty(2, 0, dtype=torch.long), 400, pos)
    parts = P.get("morton")().partition(graph, 8)
    sizes = torch.bincount(parts, minlength=8)
    assert int(sizes.max() - sizes.min()) <= 1
    # spatially compact: the mean distance to the part's centroid is well below that of a random split
    def spread(p):
        return sum(float((pos[p == k] - pos[p == k].mean(0)).norm(dim=1).mean()) for k in range(8)) / 8
    rand = P.get("random")().partition(graph, 8, seed=0)
    assert spread(parts) < 0.7 * spread(rand)
    assert torch.equal(parts, P.get("morton")().partition(graph, 8, seed=5))  # ignores the seed


def test_morton_needs_positions():
    with pytest.raises(ConfigError, match="positions"):
        P.get("morton")().partition((torch.tensor([[0, 1], [1, 0]]), 2), 2)
    with pytest.raises(ConfigError, match="bits"):
        P.get("morton")(bits=40)


def test_morton_orders_a_batch_structure_by_structure():
    """Two structures in the same box: morton cuts between them (no halo at G = 2), as METIS does."""
    g = random_batch(sizes=(30, 30), seed=0, box=6.0, cutoff=3.0)
    for vertex in ("morton", "metis"):
        plan = P.plan_graph_parallel(g, 2, "atom-owner", vertex=vertex)
        assert plan.metrics().halo_rows == [0, 0]
        assert torch.equal(plan.atom_owner, g.batch)
    parts = P.get("morton")().partition(P.Graph(g.edge_index, g.num_nodes, g.pos), 2)  # no batch: mixed
    assert not torch.equal(parts, g.batch)


def test_positions_can_come_from_the_batch(graph):
    """An AtomGraph holds no positions: plan(..., pos=batch.pos) gives them to morton."""
    from types import SimpleNamespace

    bare = SimpleNamespace(edge_index=graph.edge_index, idx_kj=graph.idx_kj, idx_ji=graph.idx_ji,
                           num_nodes=graph.num_nodes, batch=graph.batch)
    with pytest.raises(ConfigError, match="pos=batch.pos"):
        P.plan_graph_parallel(bare, 3, "atom-owner")
    a = P.plan_graph_parallel(bare, 3, "atom-owner", pos=graph.pos)
    assert torch.equal(a.atom_owner, P.plan_graph_parallel(graph, 3, "atom-owner").atom_owner)
    with pytest.raises(DataValidationError, match="pos must have shape"):
        P.plan_graph_parallel(bare, 3, "atom-owner", pos=graph.pos[:3])


@pytest.mark.parametrize("method,opts", METHODS[:2])
@pytest.mark.parametrize("G", [2, 3])
def test_a_graph_with_reverse_edges_adds_them_to_the_rows_a_rank_reads(graph, method, opts, G):
    """GemNet reads each edge's reverse: its row in either buffer is the reverse edge (−1 where there is none)."""
    from types import SimpleNamespace

    from gnnpipe.data.atoms import reverse_edges

    swap = reverse_edges(graph.edge_index)
    swap[0] = -1  # as if a neighbour cap had dropped edge 0's reverse
    rev = SimpleNamespace(**vars(graph), id_swap=swap)
    plain, plan = P.plan_graph_parallel(graph, G, method, **opts), P.plan_graph_parallel(rev, G, method, **opts)
    assert plain.local_idx_swap_halo is None
    for r in range(G):
        want = swap[plan.edges[r]]
        for buffer, rows in ((plan.edge_order(), plan.local_idx_swap_allgather[r]),
                             (torch.cat([plan.edges[r], plan.halo[r]]), plan.local_idx_swap_halo[r])):
            has = rows >= 0
            assert torch.equal(has, want >= 0)
            assert torch.equal(buffer[rows[has]], want[has])
        remote = {int(e) for e in want[want >= 0] if int(plan.edge_owner[e]) != r}
        assert set(plan.halo[r].tolist()) == set(plain.halo[r].tolist()) | remote  # the triplets' reads and these
        halo_buffer = torch.cat([plan.edges[r], plan.halo[r]])
        assert torch.equal(halo_buffer[plan.local_idx_kj_halo[r]], graph.idx_kj[plan.triplets[r]])
