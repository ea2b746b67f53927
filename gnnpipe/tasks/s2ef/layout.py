"""The S2EF layouts: ``D`` data-parallel replicas × ``S`` pipeline stages × ``G`` graph-parallel ranks, what each
needs of the model and the configuration, and the plan record of a run.

The ranks form one :class:`~gnnpipe.core.grid.RankGrid` ``(replica D, stage S, gp G)``: global rank
``r = (d·S + s)·G + g`` is rank ``g`` of the graph-parallel group of stage ``s`` of replica ``d``::

    D = 2, S = 1, G = 2 (graph parallelism):      replica 0: [0 1]   replica 1: [2 3]
    D = 1, S = 2, G = 2 (pipeline × graph):       stage 0: [0 1]     stage 1: [2 3]

The ``G`` ranks of a group read the same batch share and split each structure's edges and triplets (Sriram, Das,
Wood, Goyal, Zitnick, *Towards Training Billion Parameter Graph Neural Networks for Atomic Simulations*, ICLR 2022);
the ``S`` stages of a replica run contiguous slices of the model's units on micro-batches of whole structures
(GPipe, Huang et al. 2019; PipeDream-Flush, Narayanan et al. 2021); the ``D`` replicas read disjoint shares of
each global batch. Every layout is exact: its gradients equal the single process's on the global batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ... import models, partitioners, schedulers
from ...core.grid import RankGrid
from ...core.settings.config import TrainConfig
from ...errors import ConfigError
from .build import make_model

__all__ = ["check_graph_parallel", "check_pipeline", "graph_parallel_capable", "plan_info", "rank_grid",
           "replicate_owned", "stage_bounds"]


def rank_grid(config: TrainConfig, world: int | None = None) -> RankGrid:
    """The run's grid ``(replica, stage, gp)``; ``world``: the ranks started (``D`` is ``world / (S·G)``;
    ``None``: ``config.replicas``).

    Raises:
        ConfigError: ``S·G`` does not divide ``world``.
    """
    S, G = config.stages, config.graph_parallel_group_size
    if world is None:
        world = config.replicas * S * G
    if world % (S * G):
        raise ConfigError(f"--stages {S} × --gp-size {G} does not divide the {world} ranks started: the world is "
                          f"--replicas D × --stages S × --gp-size G ranks")
    return RankGrid.of(replica=world // (S * G), stage=S, gp=G)


def pipelined(config: TrainConfig) -> bool:
    """Whether ``config`` runs through the pipeline's schedule: ``--stages S > 1`` or ``--chunks C > 1``."""
    return config.stages > 1 or (config.chunks or 1) > 1


def graph_parallel_capable(model_name: str) -> bool:
    """Whether the zoo model ``model_name`` runs under graph parallelism: it declares ``graph_parallel = True``
    (it calls the hooks of :mod:`gnnpipe.models.atomistic.comm` and never indexes across shards itself)."""
    return bool(getattr(models.get(model_name), "graph_parallel", False))


def check_graph_parallel(config: TrainConfig, world: int | None = None) -> None:
    """Refuse a graph-parallel configuration that cannot run, before any process starts.

    Args:
        config: the resolved S2EF configuration (``graph_parallel_group_size`` = ``G``,
            ``graph_parallel_partitioner``, ``graph_parallel_mode``).
        world: the ranks that will run (``torchrun``'s ``WORLD_SIZE``); ``None``: those started here.

    Raises:
        UnknownComponentError: an unknown partitioner (the message lists the edge partitioners).
        ConfigError: ``G`` that does not divide ``world``; a model without graph-parallel hooks (with ``G > 1``).
    """
    G = config.graph_parallel_group_size
    partitioners.get_edge_partitioner(config.graph_parallel_partitioner)  # a typo is refused with any G
    if world is not None and world % G:
        raise ConfigError(f"--gp-size {G} does not divide the {world} ranks started: the world is "
                          f"--replicas D × --gp-size G ranks; start a multiple of {G} ranks or change --gp-size")
    if G > 1 and not graph_parallel_capable(config.model):
        able = [n for n in models.available() if graph_parallel_capable(n)]
        raise ConfigError(f"--model {config.model} cannot be trained graph-parallel (--gp-size {G}): it has no "
                          f"graph-parallel hooks; use --gp-size 1 or --model {' or '.join(able)}")


def stage_bounds(model, num_stages: int, method: str = "equal") -> list[int]:
    """Unit boundaries (``S + 1`` ints) of the stages: the layer partitioner ``method`` over ``model.units``.

    Raises:
        ConfigError: more stages than units; a partitioner other than ``equal`` (the profiled split measures
            node-classification chunks).
    """
    units = len(model.units)
    if num_stages > units:
        raise ConfigError(f"--stages {num_stages} exceeds the {units} units of the model (embedding + "
                          f"{units - 1} interaction blocks): use --stages {units} or fewer, or more --layers")
    if method != "equal":
        raise ConfigError(f"--layer-split {method} is not available for atomistic models; use --layer-split equal")
    return list(partitioners.split_layers(model, num_stages, method).bounds)


def check_pipeline(config: TrainConfig, world: int | None = None) -> None:
    """Refuse a pipelined S2EF configuration that cannot run, before any process starts.

    Raises:
        ConfigError: a model without pipeline boundary (cannot be staged), more stages than units, more chunks
            than structures per replica batch, a scheduler that does not flush (stale weights are not exact), a
            scheduler without the ``G``/``D`` passes for conservative forces, an unknown layer split, a torchrun
            world other than ``D·S·G``.
        UnknownComponentError: an unknown scheduler.
    """
    S, C = config.stages, config.chunks or 1
    G, D = config.graph_parallel_group_size, config.replicas
    if C > config.batch_size:
        raise ConfigError(f"--chunks {C} exceeds the {config.batch_size} structures of a replica's batch "
                          f"(--batch-size): a micro-batch is a group of whole structures; use --chunks "
                          f"{config.batch_size} or fewer, or a larger --batch-size")
    cls = schedulers.get(config.scheduler)
    if not getattr(cls, "flush", True):
        flushing = ", ".join(n for n in schedulers.available() if getattr(schedulers.get(n), "flush", True))
        raise ConfigError(f"--scheduler {config.scheduler} does not flush: its stale weights would make the S2EF "
                          f"pipeline inexact; use a flush scheduler ({flushing})")
    if not config.direct_forces:
        try:
            sch = schedulers.make_scheduler(config.scheduler, second_order=True).build(S, list(range(C)))
        except ConfigError:
            sch = None
        if sch is None or not getattr(sch, "second_order", False):
            raise ConfigError(f"--scheduler {config.scheduler} has no G/D passes, which training through "
                              f"conservative forces needs in a pipeline; use --scheduler gpipe or 1f1b, or "
                              f"--direct-forces")
    with torch.device("meta"):  # only its structure is read: no weights drawn (minutes for a 10^8-parameter model)
        model = make_model(config)
    if not model.pipeline_boundary():
        raise ConfigError(f"--model {config.model} cannot be split into pipeline stages (it declares no "
                          f"pipeline boundary); use --stages 1")
    stage_bounds(model, S, config.layer_split)
    if world is not None and world != D * S * G:
        raise ConfigError(f"torchrun started {world} ranks, but --replicas {D} × --stages {S} × --gp-size {G} needs "
                          f"{D * S * G}")


def plan_info(config: TrainConfig, splits: dict) -> dict:
    """The layout of an S2EF run (stored in results and checkpoints; a checkpoint resumes in the layout whose
    record it holds): the replicas, the batch, the split sizes, and with graph parallelism or a pipeline the grid
    ``(D, S, G)``, the graph-parallel partitioner and mode, the stages' unit ``bounds`` and the micro-batches."""
    D, S, G = config.replicas, config.stages, config.graph_parallel_group_size
    info = {"task": "s2ef", "replicas": D, "stages": 1, "world_size": D, "data_parallel": D,
            "batch_size": config.batch_size, "global_batch": config.batch_size * D,
            "structures": {k: int(len(v)) for k, v in splits.items()}}
    if pipelined(config):
        with torch.device("meta"):
            model = make_model(config)
        info.update(stages=S, chunks=config.chunks or 1, scheduler=config.scheduler, world_size=D * S * G,
                    graph_parallel=G, bounds=stage_bounds(model, S, config.layer_split))
        if G > 1:
            info.update(graph_parallel_partitioner=config.graph_parallel_partitioner,
                        graph_parallel_mode=config.graph_parallel_mode)
        return info
    info.update(world_size=D * G, graph_parallel=G, graph_parallel_partitioner=config.graph_parallel_partitioner,
                graph_parallel_mode=config.graph_parallel_mode)
    return info


def replicate_owned(rows: Tensor, comm) -> Tensor:
    """``[N_r, d]`` rows of the owned atoms (in ``comm.atom_ids`` order) → ``[N, d]`` of all atoms, the same on
    every rank, for a parameter-free use that every rank repeats identically (the loss of direct forces).

    Forward: an all-gather. Backward: the rows' own gradient only (no communication): every rank holds the same
    gradient of the replicated rows, so summing it over the group (the gather's own adjoint) would count it ``G``
    times.
    """
    with torch.no_grad():
        full = comm.atoms_gather(rows)
    placed = rows.new_zeros(full.shape).index_copy(0, comm.atom_ids, rows)
    return full + (placed - placed.detach())
