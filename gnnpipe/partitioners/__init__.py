"""Vertex partitioners / chunkers, partition metrics, and layer-to-stage partitioners.

Vertex partitioners (one abstract class, one registry; built-ins ``metis``, ``kahip`` (optional
package), ``random``, ``contiguous``, ``bfs``, ``rcm``, ``morton`` (positions))::

    from gnnpipe import partitioners
    parts = partitioners.partition_graph(data, 8, "metis", seed=0)       # LongTensor[N] in [0, 8)
    parts = partitioners.get("metis")(over=4).partition(data, 8, seed=0)  # GNNPipe chunking
    partitioners.available()                                              # ['bfs', 'contiguous', …]

Chunk plans (relabel so every chunk is a contiguous id range)::

    plan = partitioners.ChunkPlan.build(data, num_chunks=16)   # paper default: METIS 50+deg, 4×C, grouped
    start, end = plan.chunk_rows(3); plan.data; plan.to_original(pred)

Metrics and communication-volume predictions::

    m = partitioners.partition_metrics(data.edge_index, data.num_nodes, parts)
    partitioners.predict_gp_bytes(m.mirror_count, [64] * 32)
    partitioners.predict_pipeline_bytes(data.num_nodes, num_stages=4, d_boundary=64)

Edge/triplet partitioners for graph parallelism of atomistic GNNs (separate registry; ``edge-chunk``,
``atom-owner``)::

    plan = partitioners.plan_graph_parallel(graph, 4, "edge-chunk")     # graph: AtomGraph (edges + triplets)
    plan = partitioners.plan_graph_parallel(graph, 4, "atom-owner", vertex="morton")
    plan.edges[r], plan.triplets[r], plan.atoms[r], plan.halo[r], plan.metrics()

Layer partitioners (separate registry)::

    split = partitioners.split_layers(model, 4, "equal")      # StageSplit(bounds=[0, …, U], …)
    split = partitioners.get_layer_partitioner("profiled")().split(unit_costs, 4)   # costs measured by
                                                   # gnnpipe.tasks.nodes.profile.profile_unit_costs (or profiled_split)
"""

from __future__ import annotations

from .base import (
    PARTITIONERS,
    Graph,
    GraphPartitioner,
    PartitionWarning,
    as_graph,
    available,
    balanced_cuts,
    get,
    partition_graph,
    register,
    repair_empty_parts,
    validate_parts,
)
from .chunks import ChunkPlan, relabel_data, way_bounds
from .edges import (
    EDGE_PARTITIONERS,
    AtomOwnerPartitioner,
    EdgeChunkPartitioner,
    EdgePartitioner,
    GraphParallelMetrics,
    GraphParallelPlan,
    TripletGraph,
    as_triplet_graph,
    available_edge_partitioners,
    get_edge_partitioner,
    plan_graph_parallel,
    register_edge_partitioner,
)
from .layers import (
    EqualLayerPartitioner,
    LayerPartitioner,
    ProfiledLayerPartitioner,
    StageSplit,
    UnitPhases,
    action_costs,
    available_layer_partitioners,
    get_layer_partitioner,
    layer_partitioners,
    minmax_split,
    register_layer_partitioner,
    schedule_split,
    split_layers,
    stage_chunk_costs,
)
from .methods import (
    BFSPartitioner,
    ContiguousPartitioner,
    KaHIPPartitioner,
    MetisPartitioner,
    MortonPartitioner,
    RandomPartitioner,
    RCMPartitioner,
    morton_codes,
    vertex_weights,
)
from .metrics import PartitionMetrics, partition_metrics, predict_gp_bytes, predict_pipeline_bytes

__all__ = [
    "PARTITIONERS",
    "BFSPartitioner",
    "ChunkPlan",
    "ContiguousPartitioner",
    "EqualLayerPartitioner",
    "Graph",
    "GraphPartitioner",
    "KaHIPPartitioner",
    "LayerPartitioner",
    "MetisPartitioner",
    "PartitionMetrics",
    "PartitionWarning",
    "ProfiledLayerPartitioner",
    "RCMPartitioner",
    "RandomPartitioner",
    "StageSplit",
    "UnitPhases",
    "action_costs",
    "as_graph",
    "available",
    "available_layer_partitioners",
    "balanced_cuts",
    "get",
    "get_layer_partitioner",
    "layer_partitioners",
    "minmax_split",
    "partition_graph",
    "partition_metrics",
    "predict_gp_bytes",
    "predict_pipeline_bytes",
    "register",
    "register_layer_partitioner",
    "relabel_data",
    "repair_empty_parts",
    "schedule_split",
    "split_layers",
    "stage_chunk_costs",
    "validate_parts",
    "vertex_weights",
    "way_bounds",
    "EDGE_PARTITIONERS",
    "AtomOwnerPartitioner",
    "EdgeChunkPartitioner",
    "EdgePartitioner",
    "GraphParallelMetrics",
    "GraphParallelPlan",
    "TripletGraph",
    "as_triplet_graph",
    "available_edge_partitioners",
    "get_edge_partitioner",
    "plan_graph_parallel",
    "register_edge_partitioner",
    "MortonPartitioner",
    "morton_codes",
]
