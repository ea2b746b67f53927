"""Graph parallelism for S2EF training: ``D`` data-parallel replicas × ``G`` graph-parallel ranks each.

Sriram, Das, Wood, Goyal, Zitnick, *Towards Training Billion Parameter Graph Neural Networks for Atomic
Simulations* (ICLR 2022, arXiv 2203.09697); the rules are those of ATOMISTIC.md §3–4.

The rank grid (``--ways D --gp-size G``, ``D × G`` ranks): global rank ``r = d·G + g`` is rank ``g`` of the
graph-parallel group of replica ``d`` (ranks ``d·G … d·G + G − 1``)::

    replica 0:  rank 0   rank 1  … rank G−1      ← one graph-parallel group, one batch share
    replica 1:  rank G   rank G+1 … rank 2G−1
    …

Per step, every rank of a group reads its replica's share of the global batch (the share data parallelism gives
replica ``d``), builds the same neighbour graph and the same deterministic
:class:`~gnnpipe.partitioners.GraphParallelPlan` (``--gp-partitioner``), takes its
:class:`~gnnpipe.core.ops.graph_parallel.LocalGraph` view and a :class:`~gnnpipe.core.ops.graph_parallel.GraphParallelComm`
over its group (``--gp-mode``), and runs the unchanged model. Energies (an all-reduce of partial energies) and
conservative forces (an all-reduce of partial position gradients) come back replicated on every rank of the group,
reduced exactly once inside the model; direct forces (owned atoms' rows) are gathered with
:func:`replicate_owned`. The loss of the replicated predictions is parameter-free, so each rank back-propagates it
through its own partial graph only: a parameter's gradient on a rank is its partial gradient, the group's sum is
the replica's gradient, and the one all-reduce (sum) over all ``D × G`` ranks that data parallelism already does
(:meth:`~gnnpipe.tasks.s2ef.trainer.S2EFTrainer._sync_grads`, with the loss normalised by the global batch's
counts) gives every rank the global batch's gradient: summed over each group, then over the replicas. Only the
first rank of each group (``g = 0``) reports the loss and the metrics, so each structure counts once.

Bytes moved by the graph-parallel collectives (kind ``"gp"`` of :class:`~gnnpipe.core.ops.comm.Comm`) are summed over
the ranks into the epoch record's ``bytes_gp``; ``gp_comm_s`` lists each rank's seconds inside them.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from ...core.settings.config import TrainConfig
from ...errors import ConfigError
from .normalizer import EnergyNormalizer
from .trainer import S2EFTrainer, plan_info

__all__ = ["GraphParallelS2EFTrainer", "check_graph_parallel", "grid", "replicate_owned", "worker"]


def grid(rank: int, group_size: int) -> tuple[int, int]:
    """``(d, g)``: the replica and the rank within its graph-parallel group of global rank ``rank``
    (``rank = d·G + g``)."""
    return divmod(int(rank), int(group_size))


def graph_parallel_capable(model_name: str) -> bool:
    """Whether the zoo model ``model_name`` runs under graph parallelism: it declares ``graph_parallel = True``
    (it calls the hooks of :mod:`gnnpipe.models.atomistic.comm` and never indexes across shards itself)."""
    from ... import models

    return bool(getattr(models.get(model_name), "graph_parallel", False))


def check_graph_parallel(config: TrainConfig, world: Optional[int] = None) -> None:
    """Refuse a graph-parallel configuration that cannot run, before any process starts.

    Args:
        config: the resolved S2EF configuration (``ways`` = ``D``, ``graph_parallel_group_size`` = ``G``,
            ``graph_parallel_partitioner``, ``graph_parallel_mode``).
        world: the ranks that will run (``torchrun``'s ``WORLD_SIZE``); ``None``: ``D × G`` started here.

    Raises:
        UnknownComponentError: an unknown partitioner (the message lists the edge partitioners).
        ConfigError: ``G`` that does not divide ``world``; a model without graph-parallel hooks (with ``G > 1``).
    """
    from ... import partitioners

    G = config.graph_parallel_group_size
    partitioners.get_edge_partitioner(config.graph_parallel_partitioner)  # a typo is refused with any G
    if world is not None and world % G:
        raise ConfigError(f"--gp-size {G} does not divide the {world} ranks started: the world is "
                          f"--ways D × --gp-size G ranks; start a multiple of {G} ranks or change --gp-size")
    if G > 1 and not graph_parallel_capable(config.model):
        from ... import models

        able = [n for n in models.available() if graph_parallel_capable(n)]
        raise ConfigError(f"--model {config.model} cannot be trained graph-parallel (--gp-size {G}): it has no "
                          f"graph-parallel hooks; use --gp-size 1 or --model {' or '.join(able)}")


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


class GraphParallelS2EFTrainer(S2EFTrainer):
    """The S2EF executor of one rank of a ``D × G`` grid (see the module docstring).

    Args: as :class:`~gnnpipe.tasks.s2ef.trainer.S2EFTrainer`; ``world`` = ``D × G`` (every rank creates the
    ``D`` group of ``G`` ranks in the same order, so a process group must be initialised when ``world > 1``).

    Raises:
        ConfigError: ``G`` does not divide ``world``.
    """

    def __init__(self, config: TrainConfig, structures: list, splits: dict, normalizer: EnergyNormalizer, *,
                 rank: int = 0, world: int = 1, model=None, graph_fn=None):
        from ...core.ops.comm import Comm

        self.group_size = config.graph_parallel_group_size
        if world % self.group_size:
            raise ConfigError(f"--gp-size {self.group_size} does not divide the {world} ranks")
        super().__init__(config, structures, splits, normalizer, rank=rank, world=world, model=model,
                         graph_fn=graph_fn)
        G, D = self.group_size, world // self.group_size
        self.gp_group = None
        if world > 1 and D > 1:  # every rank creates every group, in the same order
            for d in range(D):
                g = dist.new_group(list(range(d * G, (d + 1) * G)))
                if d == self.replica:
                    self.gp_group = g
        self.gp_comm = Comm(self.device)
        self.direct = bool(getattr(self.model, "direct_forces", False))

    graph_in_loader = False  # each rank builds the graph and its plan from the structures the workers read

    def comms(self) -> list:
        return [self.gp_comm, self.grad_comm]

    def needs_triplets(self) -> bool:
        """Always: the graph-parallel partitioners balance the shards by triplets."""
        return True

    def replica_of(self, rank: int, world: int) -> tuple[int, int, bool]:
        d, g = grid(rank, self.group_size)
        return d, world // self.group_size, g == 0

    def forward(self, structures: list) -> tuple[Tensor, Tensor, Any]:
        """``(ê [b], F̂ [n, 3], batch)`` of ``structures``, replicated on every rank of the group."""
        from torch_geometric.data import Batch

        from ...core.ops.graph_parallel import GraphParallelComm
        from ...partitioners import plan_graph_parallel

        cfg = self.config
        batch = Batch.from_data_list(structures)
        graph = self.graph_fn(batch)
        plan = plan_graph_parallel(graph, self.group_size, cfg.graph_parallel_partitioner, pos=batch.pos)
        comm = GraphParallelComm(plan, group=self.gp_group, mode=cfg.graph_parallel_mode, comm=self.gp_comm,
                                 device=self.device)
        out = self.model(batch, comm.local_graph(graph), comm, forces=True)
        forces = replicate_owned(out["forces"], comm) if self.direct else out["forces"]
        return out["energy"].reshape(-1), forces, batch

    def train_step(self, epoch: int) -> dict:
        """:meth:`S2EFTrainer.train_step`, with ``bytes_gp`` (bytes the graph-parallel collectives sent in the
        epoch's training steps, summed over ranks), ``gp_comm_s`` and ``compute_s`` (per rank, seconds)."""
        self.gp_comm.reset()
        t0 = time.perf_counter()
        out = super().train_step(epoch)
        wall = time.perf_counter() - t0
        c = self.gp_comm.counters()
        vec = torch.tensor([c["bytes_gp"], c["comm_s"], wall], dtype=torch.float64)
        rows = [torch.zeros_like(vec) for _ in range(self.world)] if self.world > 1 else [vec]
        if self.world > 1:
            dist.all_gather(rows, vec)
        m = torch.stack(rows)
        out.update(bytes_gp=round(float(m[:, 0].sum())), gp_comm_s=m[:, 1].tolist(),
                   compute_s=(m[:, 2] - m[:, 1]).tolist())
        return out


def gp_plan_info(config: TrainConfig, splits: dict) -> dict:
    """:func:`~gnnpipe.tasks.s2ef.trainer.plan_info` with the graph-parallel grid: ``world_size`` = ``D × G``,
    ``graph_parallel`` = ``G``, the partitioner and the mode."""
    info = plan_info(config, splits)
    G = config.graph_parallel_group_size
    info.update(world_size=config.ways * G, graph_parallel=G,
                graph_parallel_partitioner=config.graph_parallel_partitioner,
                graph_parallel_mode=config.graph_parallel_mode)
    return info


def worker(rank: int, world: int, config: TrainConfig, structures: list, splits: dict, normalizer: dict,
           progress: bool = True, options=None, records=None) -> Optional[dict]:
    """The function each rank of a ``D × G`` grid runs (:func:`gnnpipe.core.run.launch.spawn`, or a torchrun rank).

    Returns ``{"result": TrainResult}`` on rank 0 (``extra["peak_mem_bytes"]``: every rank's peak), ``None``
    elsewhere.
    """
    torch.set_num_threads(config.threads)
    tr = GraphParallelS2EFTrainer(config, structures, splits, EnergyNormalizer.from_dict(normalizer), rank=rank,
                                  world=world)
    result = tr.run(progress, options, plan_info=gp_plan_info(config, splits), records=records)
    peaks = [None] * world
    if world > 1:
        dist.all_gather_object(peaks, result.extra["peak_mem_bytes"][0])
    else:
        peaks = result.extra["peak_mem_bytes"]
    result.extra["peak_mem_bytes"] = peaks
    return {"result": result} if rank == 0 else None
