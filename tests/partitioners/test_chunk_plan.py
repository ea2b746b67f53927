"""ChunkPlan: relabelling round-trips, contiguous chunks, way grouping, the paper-default build."""

from __future__ import annotations

import warnings

import pytest
import torch

from gnnpipe import partitioners as P
from gnnpipe.errors import ConfigError, DataValidationError, UnknownComponentError

from .graphs import two_communities


def check_plan(plan: P.ChunkPlan, data, parts: torch.Tensor) -> None:
    n = data.num_nodes
    c = int(parts.max()) + 1
    assert torch.equal(plan.perm[plan.inv_perm], torch.arange(n))
    assert torch.equal(plan.inv_perm[plan.perm], torch.arange(n))
    assert plan.num_chunks == c and plan.chunk_ptr.tolist()[0] == 0 and int(plan.chunk_ptr[-1]) == n
    for k in range(c):
        start, end = plan.chunk_rows(k)
        assert sorted(plan.perm[start:end].tolist()) == sorted((parts == k).nonzero().flatten().tolist())
    # relabelled tensors, and the round trip back to original ids
    assert torch.equal(plan.data.x, data.x[plan.perm])
    assert torch.equal(plan.data.y, data.y[plan.perm])
    assert torch.equal(plan.data.train_mask, data.train_mask[plan.perm])
    assert torch.equal(plan.to_original(plan.data.x), data.x)
    assert torch.equal(plan.to_original(plan.data.train_mask), data.train_mask)
    assert torch.equal(plan.to_new(data.y), plan.data.y)
    assert torch.equal(plan.perm[plan.data.edge_index], data.edge_index)
    assert torch.equal(plan.to_original(plan.chunk_of()), parts)
    assert torch.equal(plan.parts, parts)


def test_from_parts_round_trip(graph):
    parts = P.partition_graph(graph, 5, "random", seed=0)
    x0, ei0 = graph.x.clone(), graph.edge_index.clone()
    plan = P.ChunkPlan.from_parts(graph, parts)
    check_plan(plan, graph, parts)
    assert torch.equal(graph.x, x0) and torch.equal(graph.edge_index, ei0)  # input untouched
    assert plan.num_ways == 1 and plan.way_ptr.tolist() == [0, 5]
    assert sum(plan.chunk_sizes()) == graph.num_nodes


def test_stable_order_within_chunk():
    data = two_communities(n_per=5, extra_isolated=0)
    parts = torch.tensor([1, 0] * 6 + [1])
    plan = P.ChunkPlan.from_parts(data, parts)
    assert plan.perm.tolist() == [1, 3, 5, 7, 9, 11, 0, 2, 4, 6, 8, 10, 12]
    assert plan.chunk_ptr.tolist() == [0, 6, 13]


def test_within_key_orders_vertices_inside_chunks():
    data = two_communities(n_per=5, extra_isolated=0)
    parts = torch.tensor([1, 0] * 6 + [1])
    within = torch.tensor([5, 4, 3, 2, 1, 0, 0, 0, 9, 9, 9, 9, 0])  # ties keep the original order
    plan = P.ChunkPlan.from_parts(data, parts, within=within)
    assert plan.perm.tolist() == [5, 7, 3, 1, 9, 11, 6, 12, 4, 2, 0, 8, 10]
    assert plan.chunk_ptr.tolist() == [0, 6, 13]
    check_plan(plan, data, parts)
    with pytest.raises(DataValidationError, match="within"):
        P.ChunkPlan.from_parts(data, parts, within=torch.zeros(4, dtype=torch.long))
    with pytest.raises(DataValidationError, match="within"):
        P.ChunkPlan.from_parts(data, parts, within=torch.zeros(13))


def test_partition_levels_fine_parts_nest_in_output_parts(graph):
    m = P.get("metis")(over=4)
    parts, fine = m.partition_levels(graph, 5, seed=3)
    assert torch.equal(parts, m.partition(graph, 5, seed=3))
    assert int(fine.max()) + 1 == 20
    for f in range(20):  # every fine part lies inside one output part
        assert (parts[fine == f] == parts[fine == f][0]).all()
    parts1, fine1 = P.get("metis")(over=1).partition_levels(graph, 5, seed=3)
    assert torch.equal(parts1, fine1)


@pytest.mark.parametrize("num_ways", [1, 2])
def test_build_locality_order_keeps_fine_parts_contiguous_in_rcm_order(graph, num_ways):
    """order="locality": inside a chunk, each fine METIS part is one contiguous run, ordered by RCM rank;
    the chunk membership is that of order="original" (only the order inside chunks differs)."""
    loc = P.ChunkPlan.build(graph, 4, seed=1, num_ways=num_ways)
    orig = P.ChunkPlan.build(graph, 4, seed=1, num_ways=num_ways, order="original")
    assert torch.equal(loc.parts, orig.parts) and torch.equal(loc.chunk_ptr, orig.chunk_ptr)
    check_plan(loc, graph, loc.parts)
    m = P.get("metis")(over=4)
    if num_ways == 1:
        _, fine = m.partition_levels(graph, 4, seed=1)
    else:
        fine = torch.empty_like(loc.parts)
        for w in range(num_ways):  # as build does: ways first, then chunks inside each way
            members = (P.get("metis")(over=1).partition(graph, num_ways, seed=1) == w).nonzero().flatten()
            fine[members] = m.partition_levels(P.as_graph(graph).subgraph(members), 2, seed=2 + w)[1]
    rank = torch.empty(graph.num_nodes, dtype=torch.long)
    rank[torch.from_numpy(P.as_graph(graph).rcm_order)] = torch.arange(graph.num_nodes)
    fine_new, rank_new = fine[loc.perm], rank[loc.perm]
    for c in range(4):
        lo, hi = loc.chunk_rows(c)
        f, r = fine_new[lo:hi].tolist(), rank_new[lo:hi].tolist()
        runs = [f[0]] + [b for a, b in zip(f, f[1:]) if a != b]
        assert len(runs) == len(set(runs)), f"chunk {c}: a fine part is split {f}"
        for i in range(len(f) - 1):
            if f[i] == f[i + 1]:
                assert r[i] < r[i + 1]
    assert torch.equal(orig.perm, torch.sort(orig.parts, stable=True).indices)
    with pytest.raises(ConfigError, match="order"):
        P.ChunkPlan.build(graph, 4, order="bfs")


def test_edge_attributes_and_multi_split_masks_follow(graph):
    e, n = graph.edge_index.size(1), graph.num_nodes
    data = graph.clone()
    data.edge_attr = torch.arange(e, dtype=torch.float).unsqueeze(1)
    data.split_masks = torch.rand(n, 3) > 0.5
    data.note = "kept"
    parts = P.partition_graph(data, 4, "metis", seed=0)
    plan = P.ChunkPlan.from_parts(data, parts)
    assert torch.equal(plan.data.edge_attr, data.edge_attr)  # edge order kept
    assert torch.equal(plan.data.split_masks, data.split_masks[plan.perm])
    assert plan.data.note == "kept"


def test_build_paper_default_deterministic(graph):
    a = P.ChunkPlan.build(graph, 4, seed=7)
    b = P.ChunkPlan.build(graph, 4, seed=7)
    assert torch.equal(a.perm, b.perm) and torch.equal(a.chunk_ptr, b.chunk_ptr)
    expected = P.get("metis")(over=4, vertex_weight="50+degree").partition(graph, 4, seed=7)
    assert torch.equal(a.parts, expected)
    check_plan(a, graph, a.parts)


def test_metrics_same_in_new_and_original_ids(graph):
    plan = P.ChunkPlan.build(graph, 4, "bfs", over=1)
    m_new = plan.metrics()
    m_old = P.partition_metrics(graph.edge_index, graph.num_nodes, plan.parts)
    assert m_new.to_dict() == m_old.to_dict()


def test_way_bounds():
    assert P.way_bounds(5, 2).tolist() == [0, 3, 5]
    assert P.way_bounds(8, 4).tolist() == [0, 2, 4, 6, 8]
    assert P.way_bounds(3, 1).tolist() == [0, 3]
    with pytest.raises(ConfigError):
        P.way_bounds(2, 3)
    with pytest.raises(ConfigError):
        P.way_bounds(2, 0)


def test_build_with_ways_is_hierarchical(graph):
    plan = P.ChunkPlan.build(graph, 8, "metis", over=1, num_ways=2, seed=0)
    assert plan.num_ways == 2 and plan.way_ptr.tolist() == [0, 4, 8]
    assert list(plan.way_chunks(1)) == [4, 5, 6, 7]
    ways = P.get("metis")().partition(graph, 2, seed=0)
    assert torch.equal(plan.way_parts(), ways)  # way w's vertices = METIS part w
    start, end = plan.way_rows(0)
    assert end - start == int((ways == 0).sum())
    assert start == 0 and plan.way_rows(1)[1] == graph.num_nodes
    check_plan(plan, graph, plan.parts)
    # the two communities are the two ways: few edges between ways
    m = P.partition_metrics(graph.edge_index, graph.num_nodes, plan.way_parts())
    assert m.edge_cut <= 6 + 2  # the 3 bridges both ways, plus the triangle/isolated placement


def test_errors(graph):
    with pytest.raises(ConfigError):
        P.ChunkPlan.build(graph, graph.num_nodes + 1, "random")
    with pytest.raises(ConfigError):
        P.ChunkPlan.build(graph, 2, "random", num_ways=3)
    with pytest.raises(UnknownComponentError):
        P.ChunkPlan.build(graph, 2, "nope")
    with pytest.raises(DataValidationError):
        P.ChunkPlan.from_parts(graph, torch.tensor([0, 2] * (graph.num_nodes // 2) + [0] * (graph.num_nodes % 2)))
    plan = P.ChunkPlan.build(graph, 3, "random", over=1)
    with pytest.raises(ConfigError):
        plan.chunk_rows(3)
    with pytest.raises(ConfigError):
        plan.way_chunks(1)
    with pytest.raises(DataValidationError):
        plan.to_original(torch.zeros(3))


def test_build_small_graph_reduces_over_with_warning():
    data = two_communities(n_per=4, extra_isolated=0)  # 11 vertices, 4 chunks × over 4 > 11
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", P.PartitionWarning)
        plan = P.ChunkPlan.build(data, 4)
    assert any("over=" in str(w.message) for w in caught)
    assert plan.num_chunks == 4 and min(plan.chunk_sizes()) >= 1


@pytest.mark.data
def test_cora_paper_chunking(cora):
    plan = P.ChunkPlan.build(cora, 16, seed=0)
    check_plan(plan, cora, plan.parts)
    assert torch.equal(plan.data.test_mask, cora.test_mask[plan.perm])
    m = plan.metrics()
    rnd = P.partition_metrics(cora.edge_index, cora.num_nodes, P.partition_graph(cora, 16, "random"))
    assert m.edge_cut < rnd.edge_cut


def test_build_with_user_partitioner_without_over_argument(graph):
    @P.register("test-mod")
    class Mod(P.GraphPartitioner):
        def __init__(self):  # no `over`: build sets the attribute itself
            pass

        def assign(self, g, num_parts, seed):
            return torch.arange(g.num_nodes) % num_parts

    try:
        plan = P.ChunkPlan.build(graph, 3, "test-mod", over=2, seed=0)
        assert plan.num_chunks == 3
        fine = torch.arange(graph.num_nodes) % 6
        for q in range(6):  # 2 fine parts grouped per chunk
            assert plan.parts[fine == q].unique().numel() == 1
    finally:
        P.PARTITIONERS._items.pop("test-mod")


def test_build_uses_a_partitioner_that_overrides_partition(graph):
    """A user partitioner overriding ``partition`` (not ``assign``) is what ChunkPlan.build runs."""
    @P.register("test-whole")
    class Whole(P.GraphPartitioner):
        def assign(self, g, num_parts, seed):
            raise AssertionError("build must call the overridden partition()")

        def partition(self, graph, num_parts, *, seed=0):
            return torch.arange(P.as_graph(graph).num_nodes) * num_parts // P.as_graph(graph).num_nodes

    try:
        plan = P.ChunkPlan.build(graph, 3, "test-whole", seed=0)
        assert torch.equal(plan.parts, torch.arange(graph.num_nodes) * 3 // graph.num_nodes)
        check_plan(plan, graph, plan.parts)
    finally:
        P.PARTITIONERS._items.pop("test-whole")
