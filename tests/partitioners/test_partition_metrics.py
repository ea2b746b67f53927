"""Partition metrics against hand-computed values, and the DESIGN §6 byte predictions."""

from __future__ import annotations

import json

import pytest
import torch

from gnnpipe import partitioners as P
from gnnpipe.errors import ConfigError, DataValidationError

from .graphs import undirected


def test_path_graph_by_hand():
    # 0 - 1 | 2 - 3, parts [0, 0, 1, 1]
    ei = undirected([(0, 1), (1, 2), (2, 3)], 4)
    m = P.partition_metrics(ei, 4, torch.tensor([0, 0, 1, 1]))
    assert m.num_nodes == 4 and m.num_edges == 6 and m.num_parts == 2
    assert m.vertices_per_part == [2, 2]
    assert m.edges_per_part == [3, 3]  # in-edges of 0: 1→0; of 1: 0→1, 2→1
    assert m.vertex_imbalance == 1.0 and m.edge_imbalance == 1.0
    assert m.edge_cut == 2  # 1→2 and 2→1
    assert m.undirected_edge_cut == 1
    assert m.mirror_count == 2  # vertex 1 mirrored on part 1, vertex 2 on part 0
    assert m.boundary_vertices == 2
    assert m.cross_chunk_edge_fraction == pytest.approx(2 / 6)


def test_star_by_hand():
    # centre 0 in part 0; leaves 1, 2 in part 1; leaves 3, 4 in part 2
    ei = undirected([(0, 1), (0, 2), (0, 3), (0, 4)], 5)
    m = P.partition_metrics(ei, 5, torch.tensor([0, 1, 1, 2, 2]))
    assert m.vertices_per_part == [1, 2, 2]
    assert m.edges_per_part == [4, 2, 2]
    assert m.vertex_imbalance == pytest.approx(2 / (5 / 3))
    assert m.edge_imbalance == pytest.approx(4 / (8 / 3))
    assert m.edge_cut == 8 and m.undirected_edge_cut == 4
    assert m.mirror_count == 6  # centre on parts 1 and 2 (2) + each leaf on part 0 (4)
    assert m.boundary_vertices == 5
    assert m.cross_chunk_edge_fraction == 1.0


def test_directed_graph_by_hand():
    # 0→1, 0→2, 2→0, 1→2 ; parts [0, 1, 1]
    ei = torch.tensor([[0, 0, 2, 1], [1, 2, 0, 2]])
    m = P.partition_metrics(ei, 3, torch.tensor([0, 1, 1]))
    assert m.edges_per_part == [1, 3]
    assert m.edge_cut == 3  # 0→1, 0→2, 2→0
    assert m.undirected_edge_cut == 2  # {0,1}, {0,2}
    assert m.mirror_count == 2  # (0 → part 1) once although two edges, (2 → part 0)
    assert m.boundary_vertices == 2
    assert m.cross_chunk_edge_fraction == pytest.approx(3 / 4)


def test_self_loops_and_duplicates():
    ei = torch.tensor([[0, 0, 0, 1], [0, 1, 1, 1]])  # self-loop 0→0, 0→1 twice, self-loop 1→1
    m = P.partition_metrics(ei, 2, torch.tensor([0, 1]))
    assert m.edge_cut == 2 and m.undirected_edge_cut == 1 and m.mirror_count == 1
    assert m.edges_per_part == [1, 3]


def test_edgeless_and_single_part():
    m = P.partition_metrics(torch.empty(2, 0, dtype=torch.long), 3, torch.tensor([0, 1, 1]))
    assert m.edge_cut == 0 and m.mirror_count == 0 and m.cross_chunk_edge_fraction == 0.0
    assert m.edge_imbalance == 1.0 and m.edges_per_part == [0, 0]
    ei = undirected([(0, 1), (1, 2)], 3)
    m1 = P.partition_metrics(ei, 3, torch.zeros(3, dtype=torch.long))
    assert (m1.edge_cut, m1.mirror_count, m1.vertex_imbalance) == (0, 0, 1.0)


def test_empty_part_allowed_with_num_parts():
    ei = undirected([(0, 1)], 2)
    m = P.partition_metrics(ei, 2, torch.tensor([0, 2]), num_parts=4)
    assert m.vertices_per_part == [1, 0, 1, 0]
    assert m.vertex_imbalance == pytest.approx(2.0)
    with pytest.raises(DataValidationError):
        P.partition_metrics(ei, 2, torch.tensor([0, 5]), num_parts=4)
    with pytest.raises(DataValidationError):
        P.partition_metrics(ei, 2, torch.tensor([0, 1, 1]))


def test_mirror_count_matches_brute_force(graph):
    parts = P.partition_graph(graph, 5, "random", seed=0)
    m = P.partition_metrics(graph.edge_index, graph.num_nodes, parts)
    pairs = set()
    cut = 0
    for u, v in graph.edge_index.t().tolist():
        if parts[u] != parts[v]:
            cut += 1
            pairs.add((u, int(parts[v])))
    assert m.mirror_count == len(pairs)
    assert m.edge_cut == cut
    assert m.boundary_vertices == len({u for u, _ in pairs})


def test_to_dict_is_json():
    ei = undirected([(0, 1), (1, 2)], 3)
    d = P.partition_metrics(ei, 3, torch.tensor([0, 0, 1])).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["mirror_count"] == 2 and d["vertices_per_part"] == [2, 1]


def test_predictions_design_section_6():
    assert P.predict_gp_bytes(10, [64, 64, 64]) == 2 * 4 * 10 * 192
    assert P.predict_gp_bytes(0, [64] * 8) == 0
    assert P.predict_gp_bytes(5, []) == 0
    assert P.predict_pipeline_bytes(100, 4, 16) == 2 * 4 * 3 * 100 * 16
    assert P.predict_pipeline_bytes(100, 4, 16, shared=True) == 2 * 2 * 4 * 3 * 100 * 16
    assert P.predict_pipeline_bytes(100, 1, 16) == 0
    with pytest.raises(ConfigError):
        P.predict_pipeline_bytes(100, 0, 16)
    with pytest.raises(ConfigError):
        P.predict_gp_bytes(-1, [4])


def test_pipeline_bytes_independent_of_depth_gp_bytes_linear_in_depth(graph):
    parts = P.partition_graph(graph, 4, "metis")
    m = P.partition_metrics(graph.edge_index, graph.num_nodes, parts)
    assert P.predict_gp_bytes(m.mirror_count, [32] * 16) == 2 * P.predict_gp_bytes(m.mirror_count, [32] * 8)
