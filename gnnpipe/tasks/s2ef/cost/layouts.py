"""The layouts an atomistic job can take (:class:`AtomLayout`: ``S`` stages × ``G`` graph-parallel ranks × ``D``
replicas, micro-batches and scheduler), their enumeration for a number of ranks, the job they are costed for
(:class:`AtomJob`: model, replica batch, graph, partitioner, mode) and its graphs and micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch_geometric.data import Batch

from ....data.atoms import build_graph
from ....errors import ConfigError
from ....partitioners import plan_graph_parallel, split_layers


@attrs.frozen
class AtomLayout:
    """``stages × gp × replicas`` ranks (S pipeline stages, G graph-parallel ranks, D data-parallel replicas),
    ``chunks`` micro-batches of structures per replica (1 without a pipeline), the pipeline's ``scheduler``."""

    stages: int
    gp: int
    replicas: int
    chunks: int = 1
    scheduler: str = "gpipe"

    @property
    def ranks(self) -> int:
        return self.stages * self.gp * self.replicas

    def label(self) -> str:
        s = f"S{self.stages}xG{self.gp}xD{self.replicas}"
        return s + (f" C{self.chunks} {self.scheduler}" if self.stages > 1 else "")



def enumerate_atom_layouts(ranks: int, num_units: int, num_structures: int, *, chunks_per_stage: Sequence[int] = (1, 4),
                           schedulers: Sequence[str] = ("gpipe", "1f1b"), stages: bool = True) -> list[AtomLayout]:
    """Every ``S × G × D = ranks`` with ``S ≤ num_units`` (a stage runs at least one unit), ``C = k·S`` micro-batches
    for ``k`` in ``chunks_per_stage`` (at most ``num_structures``, the replica's batch; ``S = 1``: ``C = 1``) and each
    scheduler (one when ``C = 1``); ``stages=False``: ``S = 1`` only (D × G).

    Raises:
        ConfigError: ``ranks < 1``.
    """

    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be an integer >= 1 (--ranks R), got {ranks!r}")
    out = []
    for S in range(1, ranks + 1):
        if ranks % S or S > num_units or (S > 1 and not stages):
            continue
        for G in range(1, ranks // S + 1):
            if (ranks // S) % G:
                continue
            D = ranks // (S * G)
            if S == 1:
                out.append(AtomLayout(1, G, D))
                continue
            cs = sorted({min(k * S, num_structures) for k in chunks_per_stage})
            out += [AtomLayout(S, G, D, C, sch) for C in cs for sch in (schedulers if C > 1 else schedulers[:1])]
    return out



def stage_bounds(num_units: int, stages: int) -> list[tuple[int, int]]:
    """Units ``[lo, hi)`` of each stage: the ``equal`` layer partitioner the S2EF pipeline runs
    (:func:`~gnnpipe.partitioners.split_layers`; the first stages one longer, the embedding is unit 0)."""

    b = list(split_layers(int(num_units), int(stages), "equal").bounds)
    return list(zip(b[:-1], b[1:]))



@attrs.frozen
class AtomJob:
    """What the cost model predicts for: a model, the global batch (``structures``: PyG ``Data``), the graph
    settings, the graph-parallel partitioner and mode, dtype size, the optimizer's states.

    Attributes:
        model: the zoo model (may live on the ``meta`` device: only its sizes are read).
        structures: one replica's batch (``--batch-size`` structures: every replica steps on a batch of this
            size, the global batch is ``D`` of them, as the S2EF trainer does).
        element_size: ``b`` of the training dtype. ema: the trainer keeps an EMA copy of the weights.
        allreduce_element_size: bytes per value of the gradient all-reduce (the S2EF trainer's flat buffer is
            float64: 8).
    """

    model: Any
    structures: list
    cutoff: float
    max_neighbors: int | None
    partitioner: str = "edge-chunk"
    mode: str = "allgather"
    element_size: int = 4
    ema: bool = False
    allreduce_element_size: int = 8
    backend: str = "gloo"



def job_graph(job: AtomJob, cache: dict | None = None):
    """``(batch, graph)`` of the job's replica batch (built once per ``cache``)."""
    cache = {} if cache is None else cache
    if "graph" not in cache:


        batch = Batch.from_data_list(job.structures)
        cache["graph"] = (batch, build_graph(batch, job.cutoff, job.max_neighbors,
                                             with_reverse=bool(getattr(job.model, "uses_reverse_edges", False))))
    return cache["graph"]



def job_plan(job: AtomJob, G: int, cache: dict):
    if ("plan", G) not in cache:

        batch, graph = job_graph(job, cache)
        cache[("plan", G)] = plan_graph_parallel(graph, G, job.partitioner, pos=batch.pos)
    return cache[("plan", G)]



def micro_batch_sizes(job: AtomJob, chunks: int, cache: dict | None = None) -> list[tuple[int, int, int]]:
    """``(edges, triplets, atoms)`` of each of the ``chunks`` micro-batches the S2EF pipeline cuts the job's replica
    batch into (``torch.tensor_split`` of its structures: contiguous, as even as possible; an empty one is
    ``(0, 0, 0)``)."""

    _, graph = job_graph(job, cache)
    B = len(job.structures)
    of_edge = graph.batch[graph.edge_index[1]]
    e = torch.bincount(of_edge, minlength=B)
    t = (torch.bincount(of_edge[graph.idx_ji], minlength=B) if graph.idx_ji is not None
         else torch.zeros(B, dtype=torch.long))
    n = torch.bincount(graph.batch, minlength=B)
    return [(int(e[part].sum()), int(t[part].sum()), int(n[part].sum()))
            for part in torch.tensor_split(torch.arange(B), chunks)]
