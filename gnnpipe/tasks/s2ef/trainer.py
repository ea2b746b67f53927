"""S2EF training: one trainer for every layout, ``D`` data-parallel replicas × ``S`` pipeline stages × ``G``
graph-parallel ranks (:mod:`~gnnpipe.tasks.s2ef.layout`; the single process is the layout 1 × 1 × 1).

Each step takes one global batch (``D × batch_size`` structures, :func:`~gnnpipe.tasks.s2ef.data.epoch_batches`);
replica ``d`` reads its share, and every rank computes its part of the loss as sums divided by the global batch's
counts (:func:`~.loss.s2ef_loss`), so the gradients summed over the ranks are exactly the single process's gradient
of the whole batch (an uneven or empty share included). How a rank computes its part is the layout's:

* **whole model** (``S = 1``, one micro-batch): the model runs on the share — with ``G > 1`` on this rank's
  :class:`~gnnpipe.tasks.s2ef.graph_parallel.LocalGraph` through a
  :class:`~gnnpipe.tasks.s2ef.graph_parallel.GraphParallelComm` over the graph-parallel group (energies and
  conservative forces come back replicated, reduced exactly once inside the model; direct forces are gathered
  with :func:`~.layout.replicate_owned`) — and the loss is back-propagated;
* **pipeline** (``S > 1`` or ``--chunks C > 1``): the share is cut into ``C`` micro-batches of whole structures
  that flow through the stages' :class:`~.stage.AtomisticStage` under the schedule interpreter
  (:class:`~gnnpipe.core.runtime.execute.Executor`; conservative forces: a second-order schedule).

Then, the same in every layout (:meth:`S2EFTrainer.optimizer_step`): one all-reduce of the flattened gradients over
the rank's gradient group (the ``D·G`` ranks holding the same units: every rank when ``S = 1``, a stage's ranks
otherwise; :func:`~gnnpipe.core.comm.all_reduce_gradients`), gradient clipping, the learning rate of the step,
AdamW and the moving average — identically on every rank of the group, so replicas never drift. Only the first rank
of each graph-parallel group reports the loss and the metrics, so each structure counts once.

The trainer plugs into the shared runtime: :func:`~gnnpipe.core.run.loop.epoch_loop` (progress bar, early
stopping, selection on the validation force MAE), :class:`~gnnpipe.core.run.session.RunSession` (epoch lines, CSV,
TensorBoard, best weights, Ctrl-C) and :mod:`gnnpipe.core.run.checkpoint` through ``checkpoint_modules``,
``task_state`` / ``load_task_state`` (moving average, learning-rate schedule) and ``task_meta``. Training by steps
(``--max-steps``, ``--eval-every-steps``, ``--checkpoint-every-steps``) is :class:`~gnnpipe.tasks.s2ef.steps.StepLoop`
inside :meth:`S2EFTrainer.train_epoch`, the same in every layout.

Bytes: the gradient all-reduce's under kind ``weight`` (``bytes_weight``), the graph-parallel collectives' under
``gp`` (``bytes_gp``), the pipeline's boundary tensors under ``layer`` (``bytes_layer``), each summed over ranks.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch_geometric.data import Batch

from ... import schedulers
from ...core.comm import KINDS, Comm, all_reduce_gradients, collective_device
from ...core.run import stopping
from ...core.run.checkpoint import run_meta
from ...core.run.epochlog import REGRESSION_CSV_FIELDS, regression_csv_fields
from ...core.run.launch import rank_device
from ...core.run.loop import epoch_loop
from ...core.run.results import Selection, TrainResult
from ...core.run.session import RunSession
from ...core.runtime.execute import Executor
from ...core.runtime.memory import bound_heap_retention, return_free_memory
from ...core.settings.config import TrainConfig
from ...models.atomistic import LOCAL
from ...partitioners import plan_graph_parallel
from .build import forward, graph_builder, make_model
from .data import DEVICE_GRAPH_ATOMS, StructureLoader, epoch_batches, move_to, resolved_num_workers, share, total_steps
from .graph_parallel import GraphParallelComm
from .labels import Counts, energy_mask, force_mask, label_counts, stress_mask
from .layout import pipelined, rank_grid, replicate_owned, stage_bounds
from .loss import S2EFMetrics, energy_loss, s2ef_loss, stress_loss
from .normalizer import EnergyNormalizer
from .optim import ExponentialMovingAverage, LRSchedule, clip_and_norm
from .scaling import fit_scale_factors
from .stage import EVAL_ENERGY_TAG, AtomisticStage, drop_weights
from .steps import StepLoop

__all__ = ["SELECTION", "S2EFTrainer", "forward", "graph_builder", "make_model", "selection_for", "worker"]

#: S2EF model selection: the lowest validation force MAE (ties: the lower validation loss)
SELECTION = Selection(monitor="val_force_mae", mode="min")


def selection_for(plan_info: dict) -> Selection:
    """The run's model selection: the lowest validation force MAE, or energy MAE for a set without forces (the
    plan's ``monitor``)."""
    return Selection(monitor=plan_info.get("monitor", SELECTION.monitor), mode="min")


class S2EFTrainer:
    """The trainer of one rank of any S2EF layout (``world = 1``: the single process).

    Args:
        config: the resolved S2EF configuration (``stages`` = ``S``, ``graph_parallel_group_size`` = ``G``,
            ``chunks`` = ``C``). structures: all structures (every rank holds them all, or the same lazy set; the
            shares are chosen per step). splits: ``{"train", "val", "test"}`` index tensors.
        normalizer: the energy reference and normalisation fitted on the training split.
        rank, world: this rank and the number of ranks ``D·S·G`` (a process group is initialised when
            ``world > 1``; ``D = world / (S·G)``).
        model: a pre-built model (default :func:`make_model`, its data-dependent scale factors fitted).
        graph_fn: ``batch → graph`` (default :func:`graph_builder` with the config's cutoff and neighbour cap,
            triplets when :meth:`needs_triplets`).

    Raises:
        ConfigError: ``S·G`` does not divide ``world``; more stages than units (:func:`~.layout.stage_bounds`).
    """

    log_fields = REGRESSION_CSV_FIELDS

    def __init__(self, config: TrainConfig, structures, splits: dict, normalizer: EnergyNormalizer, *,
                 rank: int = 0, world: int = 1, model=None, graph_fn: Callable | None = None):
        bound_heap_retention()  # weight-sized temporaries must not leave resident holes step after step
        self.config, self.structures, self.splits, self.normalizer = config, structures, splits, normalizer
        self.log_fields = regression_csv_fields(splits)  # with the columns of each further validation set
        self.rank, self.world = rank, world
        self.grid = rank_grid(config, world)
        at = self.grid.coords(rank)
        self.replica, self.stage, self.g = at["replica"], at["stage"], at["gp"]
        self.D, self.S, self.G = (self.grid.axis_size(a) for a in ("replica", "stage", "gp"))
        self.C = config.chunks or 1
        self.replicas, self.reporting = self.D, self.g == 0
        #: the pipeline's schedule runs the steps (``S > 1`` or ``C > 1``); else the whole model runs on the share
        self.pipelined = pipelined(config)
        #: where this rank computes: the CPU, or GPU ``LOCAL_RANK mod #GPUs`` with ``--device cuda``
        self.device = rank_device(config)
        #: the model's forward in bfloat16 autocast (``--amp``; weights, optimizer state and losses in float32)
        self.amp = bool(getattr(config, "amp", False))
        if self.device.type == "cuda":  # TF32 for float32 matmuls and convolutions unless --no-tf32
            torch.backends.cuda.matmul.allow_tf32 = bool(getattr(config, "tf32", True))
            torch.backends.cudnn.allow_tf32 = bool(getattr(config, "tf32", True))
        self.model = model if model is not None else make_model(config)
        if model is None:  # data-dependent initialisation (GemNet's scale factors), the same in every layout
            fit_scale_factors(self.model, config, structures, splits)  # on the CPU: the same on every device
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.direct = bool(getattr(self.model, "direct_forces", False))
        #: the steps compute stresses: a stress loss (``--stress-coef``), or stress labels to report (:meth:`run`)
        self.with_stress = bool(config.stress_coef) and not self.direct
        reverse = bool(getattr(self.model, "uses_reverse_edges", False))
        self.graph_fn = graph_fn or graph_builder(config.cutoff, config.max_neighbors, self.needs_triplets(), reverse)
        #: the graph of a step whose structures are large, built where the positions are (on the GPU)
        self.device_graph_fn = graph_builder(config.cutoff, config.max_neighbors, self.needs_triplets(), reverse,
                                             method="device")
        self.data_wait_s = 0.0  # seconds this rank waited for the loader's steps (all epochs)
        self.bounds = stage_bounds(self.model, self.S, config.layer_split) if self.pipelined else [0, 0]
        self.trained = self.trained_module()
        self.params = [p for p in self.trained.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay or 0.0)
        n_train = len(splits["train"])
        self.steps_per_epoch = max(math.ceil(n_train / (config.batch_size * self.replicas)), 1)
        self.schedule = LRSchedule(self.optimizer, config.lr, config.lr_schedule, total_steps(config, n_train),
                                   config.warmup_steps, config.warmup_factor)
        self.ema = ExponentialMovingAverage(self.trained, config.ema_decay)
        # free atoms per structure when they are in memory; a lazy set's counts come with its batches
        self.label_counts = (torch.tensor([label_counts(d) for d in structures], dtype=torch.int64).reshape(-1, 3)
                             if isinstance(structures, list) else None)
        self.skipped = 0  # malformed structures skipped in the epoch in progress (--skip-invalid)
        self.metrics = S2EFMetrics()  # the training metrics of the epoch in progress (this rank's sums)
        self.lr = float("nan")  # the learning rate of the last step
        self.epoch_losses: list[float] = []  # the global-batch loss of each step of the epoch in progress
        self._pending: list = []  # step losses not yet made global (:meth:`flush_losses`)
        self.steps_loop = None  # the run's StepLoop (:meth:`run`); None: whole epochs (a trainer driven directly)
        # the process groups, from the one grid: a graph-parallel group shares each structure's graph; a gradient
        # group holds the same units (every rank when S = 1)
        self.gp_group = self.grid.new_group(("gp",), rank)
        self.grad_group = self.grid.new_group(("replica", "gp"), rank) if self.pipelined else None
        self.grad_comm = Comm(self.device)  # the gradient all-reduce (:meth:`optimizer_step`), as "weight"
        self.gp_comm = Comm(self.device)  # the graph-parallel collectives, as "gp"
        self.comm = Comm(self.device)  # the pipeline's boundary tensors, as "layer"
        in_loader = self.graph_in_loader and graph_fn is None
        self.loader = StructureLoader(structures, self.num_workers(), self.graph_fn if in_loader else None,
                                      device=self.device,
                                      device_graph_atoms=DEVICE_GRAPH_ATOMS if in_loader and self.device.type == "cuda"
                                      else None)
        self.steps = 0  # optimizer steps taken (the pipeline's schedule counter)
        self.monitor = SELECTION.monitor  # what the plateau schedule watches (the run's selection: :meth:`run`)
        if self.pipelined:
            self.pipe_stage = AtomisticStage(self)
            self.ranks = [self.grid.rank(replica=self.replica, stage=s, gp=self.g) for s in range(self.S)]
            scheduler = schedulers.make_scheduler(config.scheduler, **({} if self.direct else {"second_order": True}))
            self.executor = Executor(self.pipe_stage, num_stages=self.S, ranks=self.ranks, chunks=range(self.C),
                                     scheduler=scheduler, order_policy=schedulers.order_policy("fixed"),
                                     comm=self.comm)
        return_free_memory()  # what building freed (a stage's dropped weights) stays out of training's peak

    # ------------------------------------------------------------------ layout
    @property
    def graph_in_loader(self) -> bool:
        """Whether the loader's workers build each step's batch and graph: the whole model without graph
        parallelism; graph parallelism builds its plan, and the pipeline one graph per step split by micro-batch,
        from the structures the workers read."""
        return not self.pipelined and self.G == 1

    def num_workers(self) -> int:
        """Loader workers of this rank (:func:`~.data.resolved_num_workers`; the launcher resolves the count once)."""
        return resolved_num_workers(self.config, len(self.splits["train"]))

    def needs_triplets(self) -> bool:
        """Whether the default graph builds triplets: when the model reads them (``uses_triplets``; SchNet does
        not, so its steps skip the ``O(edges × neighbours)`` enumeration), and always under graph parallelism (its
        partitioners balance the shards by triplets)."""
        return self.config.graph_parallel_group_size > 1 or bool(getattr(self.model, "uses_triplets", True))

    def trained_module(self) -> nn.Module:
        """The module this rank trains, averages and checkpoints, its ``state_dict`` names the single-process
        model's: the whole model, or a pipeline stage's units (and the readout on the last stage), the other
        units' weights moved to the ``meta`` device (no storage)."""
        if not self.pipelined:
            return self.model
        lo, hi = self.bounds[self.stage], self.bounds[self.stage + 1]
        mod = nn.Module()
        mod.units = nn.ModuleDict({str(i): self.model.units[i] for i in range(lo, hi)})
        if self.stage == self.S - 1:
            mod.head = self.model.head
        else:
            drop_weights(self.model.head)
        for i, u in enumerate(self.model.units):
            if not lo <= i < hi:
                drop_weights(u)
        return mod

    def share(self, ids: Tensor) -> Tensor:
        """This rank's part of a global batch (its replica's share)."""
        return share(ids, self.replica, self.replicas)

    def make_comm(self, graph, batch) -> GraphParallelComm | None:
        """The graph-parallel hooks of a batch's graph (``None`` with ``G = 1``): every rank of the group builds
        the same deterministic plan (``--gp-partitioner``) and takes its local view (``--gp-mode``)."""
        if self.G == 1:
            return None
        cfg = self.config
        plan = plan_graph_parallel(graph, self.G, cfg.graph_parallel_partitioner, pos=batch.pos)
        return GraphParallelComm(plan, group=self.gp_group, mode=cfg.graph_parallel_mode, comm=self.gp_comm,
                                 device=self.device, dtype=cfg.torch_dtype if self.amp else None)

    def autocast(self):
        """The context of the model's forward: bfloat16 autocast on this rank's device with ``--amp`` (the
        conservative forces' autograd runs through its graph), else nothing."""
        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def to_device(self, batch, graph):
        """``(batch, graph)`` on this rank's device (from pinned memory, without blocking the host); on the CPU
        the objects themselves."""
        if self.device.type == "cpu":
            return batch, graph
        return move_to(batch, self.device), move_to(graph, self.device)

    def hooks(self, mb):
        """The graph-parallel hooks a micro-batch's model calls (the identity without graph parallelism)."""
        return LOCAL if mb.comm is None else mb.comm

    def replicate(self, rows: Tensor, mb) -> Tensor:
        """A micro-batch's direct forces of the owned atoms as every rank of the group needs them for the loss."""
        return rows if mb.comm is None else replicate_owned(rows, mb.comm)

    def comms(self) -> list:
        """The communication wrappers whose byte counters the epoch record reports."""
        return [self.comm, self.gp_comm, self.grad_comm]

    # ------------------------------------------------------------------ the checkpoint interface
    def checkpoint_modules(self) -> dict:
        return {"": self.trained}

    def task_state(self) -> dict | None:
        """The moving average and the schedule (restored on resume); ``weights``: the averaged parameters, what
        ``gnnpipe export --keep last`` exports (:func:`gnnpipe.core.run.checkpoint.read_weights`). Collective in a
        pipeline: on rank 0 every stage's moving average and weights, ``None`` on the other ranks (the checkpoint
        stores rank 0's, which every rank reads on resume)."""
        weights = self.weights()
        ema = self.ema.state_dict()
        if self.pipelined and self.world > 1:
            parts = [None] * self.world if self.rank == 0 else None
            dist.gather_object(ema if self.replica == 0 and self.g == 0 else None, parts, dst=0)
            if parts is None:
                return None
            shadow = {}
            for p in parts:
                if p:
                    shadow.update(p["shadow"])
            ema = {"updates": ema["updates"], "shadow": shadow}
        return {"ema": ema, "schedule": self.schedule.state_dict(), "weights": weights}

    def load_task_state(self, state: dict) -> None:
        own = set(self.ema.shadow)
        ema = state["ema"]
        self.ema.load_state_dict({"updates": ema["updates"], "shadow": {k: v for k, v in ema["shadow"].items()
                                                                           if k in own}})
        self.schedule.load_state_dict(state["schedule"])

    def task_meta(self) -> dict:
        """What a model file needs to be used (:mod:`gnnpipe.tasks.s2ef.predict`): plain values only."""
        return {"task": "s2ef", "normalizer": self.normalizer.to_dict(), "cutoff": float(self.config.cutoff),
                "max_neighbors": int(self.config.max_neighbors), "direct_forces": bool(self.config.direct_forces)}

    def weights(self) -> dict[str, Tensor]:
        """CPU copies of the weights evaluation uses (the moving average, when kept), by ``state_dict`` names.
        Collective in a pipeline: on rank 0 every stage's merged (the single-process ``state_dict``), elsewhere the
        rank's own stage's. Gathered on rank 0 only: a rank holding every stage's weights (and the buffers of an
        all-gather: ``world`` pickles of a stage) would hold far more than its stage."""
        with self.ema.averaged(self.trained) as m:
            own = {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}
        if not self.pipelined or self.world == 1:
            return own
        parts = [None] * self.world if self.rank == 0 else None
        dist.gather_object(own if self.replica == 0 and self.g == 0 else {}, parts, dst=0)
        if parts is None:
            return own
        merged: dict[str, Tensor] = {}
        for p in parts:
            merged.update(p)
        return merged

    # ------------------------------------------------------------------ training
    def _update_metrics(self, batch, e_hat: Tensor, f_hat: Tensor, ref: Tensor, free: Tensor, has_e: Tensor,
                        loss: float = 0.0, s_hat: Tensor | None = None) -> None:
        """Add a batch's metrics (energies, forces and stresses in eV, eV/Å, eV/Å³) over the labels its structures
        have."""
        has_f = getattr(batch, "has_forces", None)
        with torch.no_grad():
            self.metrics.update(self.normalizer.denormalise(e_hat.detach(), ref), batch.energy.reshape(-1),
                                f_hat.detach() * self.normalizer.std, batch.forces, free, batch.natoms.reshape(-1),
                                batch.batch, loss=loss, energy_mask=has_e,
                                forces_mask=None if has_f is None else has_f.reshape(-1).bool())
            if s_hat is not None:
                self.metrics.update_stress(s_hat.detach() * self.normalizer.std, batch.stress, stress_mask(batch))

    def _targets(self, batch) -> tuple[Tensor, Tensor, Tensor]:
        ref = self.normalizer.reference(batch.z, batch.batch, batch.num_graphs)
        e_t = self.normalizer.normalise(batch.energy.reshape(-1), ref)
        return e_t, batch.forces / self.normalizer.std, ref

    def global_counts(self, ids: Tensor, step) -> tuple[Counts, int]:
        """``(counts, skipped)`` of the global batch ``ids``: its structures with an energy label, the free atoms of
        its structures with forces and its structures with a stress (the loss's denominators, :mod:`.labels`), and
        the malformed structures skipped; from the in-memory counts, or summed over the replicas' shares (one
        all-reduce; every rank of a replica read the same share)."""
        if self.label_counts is not None:
            e, f, s = self.label_counts[ids].sum(0).tolist() if len(ids) else (0, 0, 0)
            return Counts(int(e), int(f), int(s)), 0
        t = torch.tensor([step.num_energy, step.num_free, step.num_stress, step.skipped], dtype=torch.int64)
        if self.world > 1:
            t = self._all_reduce(t) // (self.world // self.replicas)
        return Counts(int(t[0]), int(t[1]), int(t[2])), int(t[3])

    def forward(self, structures: list, step=None) -> tuple[Tensor, Tensor, object, Tensor | None]:
        """``(ê [b], F̂ [n, 3], batch, σ̂ [b, 3, 3] or None)`` of ``structures`` with the whole model (normalised
        energies, forces and, when the run computes them, :attr:`with_stress`, stresses), replicated on every rank
        of the graph-parallel group (on the batch and graph a loader worker built, when ``step`` holds them)."""
        kw = {"forces": True, "stress": True} if self.with_stress else {"forces": True}
        if step is not None and step.batch is not None and structures is step.structures:
            batch, graph, comm = step.batch, step.graph, None  # on this rank's device (the loader moved them)
            if graph is None:  # large structures: the graph built where the positions are
                graph = self.device_graph_fn(batch)
        else:
            batch = Batch.from_data_list(structures)
            graph = self.graph_fn(batch)
            comm = self.make_comm(graph, batch)  # the plan from the CPU graph, the same on every rank
            batch, graph = self.to_device(batch, graph)
        with self.autocast():
            out = (self.model(batch, graph, **kw) if comm is None
                   else self.model(batch, comm.local_graph(graph), comm, **kw))
        forces = replicate_owned(out["forces"], comm) if self.direct and comm is not None else out["forces"]
        return out["energy"].reshape(-1), forces, batch, out.get("stress")

    def train_epoch(self, epoch: int) -> dict:
        """One epoch of steps (from the resumed batch of a checkpoint written inside it). Returns ``loss`` (mean
        over steps of the global batch's loss), ``lr`` (of the last step), ``train_energy_mae``,
        ``train_force_mae`` (of the training forward passes, eV and eV/Å; ``train_stress_mae``, eV/Å³, where the
        steps compute stresses), ``bytes_weight`` (the gradient all-reduces, summed over ranks), ``cpu_s`` (per
        rank); with graph parallelism ``bytes_gp``,
        ``gp_comm_s`` and ``compute_s`` (per rank, seconds); in a pipeline ``bytes_layer`` (boundary tensors),
        ``bytes_gp`` and ``idle_s`` (per rank: seconds blocked on a peer). ``{"loss": nan}`` when the run ended
        inside the epoch (``--max-steps``: the epoch loop then records nothing)."""
        c0, t0 = time.thread_time(), time.perf_counter()
        for c in self.comms():
            c.reset()
        if not self.epoch_steps(epoch):
            return {"loss": float("nan")}
        m = self.metrics.compute(self._all_reduce(self.metrics.totals().clone()))
        c, gp = self.comm.counters(), self.gp_comm.counters()
        per = torch.tensor([c["bytes_layer"], c["idle_s"], gp["bytes_gp"], gp["comm_s"], time.thread_time() - c0,
                            self.grad_comm.counters()["bytes_weight"], time.perf_counter() - t0],
                           dtype=torch.float64)
        r = torch.stack(self._gather(per))
        n = len(self.epoch_losses)
        out = {"loss": sum(self.epoch_losses) / n if n else 0.0, "lr": self.lr, "train_energy_mae": m["energy_mae"],
               "train_force_mae": m["force_mae"], "cpu_s": r[:, 4].tolist(),
               "bytes_weight": round(float(r[:, 5].sum()))}
        if "stress_mae" in m:
            out["train_stress_mae"] = m["stress_mae"]
        if self.pipelined:
            out.update(bytes_layer=round(float(r[:, 0].sum())), idle_s=r[:, 1].tolist(),
                       bytes_gp=round(float(r[:, 2].sum())))
        elif self.G > 1:
            out.update(bytes_gp=round(float(r[:, 2].sum())), gp_comm_s=r[:, 3].tolist(),
                       compute_s=(r[:, 6] - r[:, 3]).tolist())
        if self.steps_loop is not None:
            out["time_s"] = self.steps_loop.epoch_time(t0)
        if getattr(self.config, "skip_invalid", False):
            out["skipped_structures"] = self.skipped
        self.skipped = 0
        return out

    def epoch_steps(self, epoch: int) -> bool:
        """Run the optimizer steps of ``epoch`` (:meth:`train_batch` on each global batch of
        :func:`~gnnpipe.tasks.s2ef.data.epoch_batches`, from the batch a resumed checkpoint stopped at), with the
        step bookkeeping of :attr:`steps_loop`; afterwards :attr:`epoch_losses` holds every step's global loss and
        :attr:`metrics` this rank's sums. Returns ``False`` when the run ended inside the epoch."""
        cfg = self.config
        t0 = time.perf_counter()
        self.model.train()
        self.metrics, self.lr, self.epoch_losses, self._pending = S2EFMetrics(), float("nan"), [], []
        train = self.splits["train"]
        batches = epoch_batches(len(train), cfg.batch_size * self.replicas, cfg.seed, epoch)
        loop = self.steps_loop
        start = loop.begin_epoch(epoch) if loop is not None else 0
        steps = self._timed(self.loader.iterate([self.share(train[gb]) for gb in batches[start:]]))
        for j, step in zip(range(start, len(batches)), steps):
            self.train_batch(train[batches[j]], step)
            if loop is not None and loop.after_step(epoch, j, len(batches), t0):
                return False
        self.flush_losses()
        return True

    def _timed(self, steps: Iterable) -> Iterator:
        """``steps``, the seconds spent waiting for each added to :attr:`data_wait_s`."""
        it = iter(steps)
        while True:
            t0 = time.perf_counter()
            try:
                step = next(it)
            except StopIteration:
                return
            self.data_wait_s += time.perf_counter() - t0
            yield step

    def train_batch(self, ids: Tensor, step=None) -> None:
        """One optimizer step on the global batch ``ids`` (this rank computes its share, ``step``: as the loader
        read it; ``None``: read here); its loss joins the step losses (:meth:`flush_losses` makes them global)."""
        if step is None:
            step = next(iter(self.loader.iterate([self.share(ids)])))
        counts, skip = self.global_counts(ids, step)
        self.skipped += skip
        if self.pipelined:
            self.pipe_stage.set_batches(self._groups(step.structures), counts)
            self._pending.append(float(self.executor.train_epoch(self.steps)["loss"]))  # its STEP: optimizer_step
        else:
            self._whole_model_step(step, counts)
        self.steps += 1

    def _loss(self, batch, e_hat: Tensor, f_hat: Tensor, s_hat: Tensor | None, counts: Counts) -> Tensor:
        """This rank's part of the global batch's loss (:func:`~.loss.s2ef_loss`, and the stress term with
        ``--stress-coef``), each term over the structures with its label."""
        cfg = self.config
        e_t, f_t, _ = self._targets(batch)
        loss = s2ef_loss(e_hat, e_t, f_hat, f_t, force_mask(batch), num_structures=counts.energy,
                         num_free=counts.forces, energy_coef=cfg.energy_coef, force_coef=cfg.force_coef,
                         loss_fn=cfg.loss_fn, energy_mask=energy_mask(batch))
        if s_hat is not None and cfg.stress_coef:
            loss = loss + stress_loss(s_hat, batch.stress / self.normalizer.std, stress_mask(batch),
                                      num_stress=counts.stress, stress_coef=cfg.stress_coef, loss_fn=cfg.loss_fn)
        return loss

    def _whole_model_step(self, step, counts: Counts) -> None:
        """The whole model on this rank's share, the loss back-propagated, then :meth:`optimizer_step` with the
        loss (made global by the gradients' all-reduce)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = torch.zeros((), dtype=torch.float64, device=self.device)
        if step.structures:
            e_hat, f_hat, batch, s_hat = self.forward(step.structures, step)
            loss = self._loss(batch, e_hat, f_hat, s_hat, counts)
            loss.backward()
            if self.reporting:
                loss_value = loss.detach().to(torch.float64)
                ref = self._targets(batch)[2]
                self._update_metrics(batch, e_hat, f_hat, ref, force_mask(batch), energy_mask(batch), s_hat=s_hat)
        self.epoch_losses.append(self.optimizer_step(loss_value))  # global: it travelled with the gradients

    def optimizer_step(self, loss: Tensor | None = None) -> float | None:
        """The step of every layout (the pipeline interpreter's ``STEP``): the gradients summed over the gradient
        group with one all-reduce (:func:`~gnnpipe.core.comm.all_reduce_gradients`; the whole model's in
        float64 with its ``loss`` riding along, a stage's in their own dtype), clipped at the norm of the whole
        model's gradient, the learning rate of the step, AdamW, the moving average. Returns the global ``loss``."""
        group_size = self.D * self.G
        if group_size > 1 and self.params:
            summed = all_reduce_gradients(self.params, self.grad_comm, self.grad_group,
                                          dtype=None if self.pipelined else torch.float64, extra=loss)
        else:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            summed = loss
        self._clip()
        self.lr = self.schedule.apply()
        self.optimizer.step()
        self.ema.update(self.trained)
        return None if summed is None else float(summed.reshape(-1)[0])

    def _clip(self) -> None:
        """Clip at ``--clip-grad-norm`` the norm of the whole model's gradient: this rank's own where it holds the
        whole model; over every stage in a pipeline (each stage's squared norm counted once per rank of its
        gradient group: ``D·G`` times)."""
        max_norm = self.config.clip_grad_norm
        if not self.pipelined:
            clip_and_norm(self.params, max_norm)
            return
        if not max_norm:
            return
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.params:
            sq += p.grad.double().square().sum()
        if self.world > 1:
            sq = self._all_reduce(sq)
            sq /= self.D * self.G
        coef = min(max_norm / (float(sq.sqrt()) + 1e-6), 1.0)
        if coef < 1.0:
            for p in self.params:
                p.grad.mul_(coef)

    def flush_losses(self) -> None:
        """Collective (``world > 1``): the step losses since the last call summed over the ranks (each stage's and
        replica's part) and appended to :attr:`epoch_losses`."""
        if not self._pending:
            return
        vec = self._all_reduce(torch.tensor(self._pending, dtype=torch.float64))
        self.epoch_losses.extend(vec.tolist())
        self._pending = []

    def _groups(self, structures: list) -> list[list]:
        """A replica's share (the structures a loader step read) cut into ``C`` micro-batches."""
        return [[structures[i] for i in part.tolist()]
                for part in torch.tensor_split(torch.arange(len(structures)), self.C)]

    def _all_reduce(self, t: Tensor) -> Tensor:
        """``t`` summed over every rank in place (control traffic, not counted), through the device the backend
        collects on (:func:`~gnnpipe.core.comm.collective_device`: nccl's GPU, else the CPU)."""
        if self.world > 1:
            dev = collective_device(self.device)
            if t.device == dev:
                dist.all_reduce(t)
            else:
                moved = t.to(dev)
                dist.all_reduce(moved)
                t.copy_(moved)
        return t

    def _gather(self, t: Tensor) -> list[Tensor]:
        if self.world == 1:
            return [t]
        dev = collective_device(self.device)
        moved = t.to(dev)
        rows = [torch.zeros_like(moved) for _ in range(self.world)]
        dist.all_gather(rows, moved)
        return [r.to(t.device) for r in rows]

    def _rank_sums(self) -> Tensor:
        parts = [self.metrics.totals()]
        parts += [torch.tensor([float(c.bytes.get(k, 0.0)) for k in KINDS], dtype=torch.float64) for c in self.comms()]
        return torch.cat(parts)

    def partial_state(self, time_s: float) -> dict:
        """Collective: the sums of the epoch in progress for a checkpoint written inside it (``LoopState.partial``):
        ``losses`` (each step's global loss), ``ranks`` (each rank's training metric sums and bytes sent, in rank
        order), ``lr``, ``time_s`` (its training seconds)."""
        self.flush_losses()
        rows = self._gather(self._rank_sums())
        return {"losses": list(self.epoch_losses), "ranks": [r.tolist() for r in rows], "lr": self.lr,
                "time_s": float(time_s), "metric_fields": len(S2EFMetrics.FIELDS)}

    def restore_partial(self, part: dict) -> None:
        """Continue the sums of a checkpoint written inside an epoch (:meth:`partial_state`): each rank its own
        (so the epoch record equals an uninterrupted run's, bit for bit); into another world size, rank 0 all of
        them (the epoch's all-reduce counts them once)."""
        self.epoch_losses = [float(v) for v in part["losses"]]
        rows = torch.tensor(part["ranks"], dtype=torch.float64)
        if len(rows) == self.world:
            mine = rows[self.rank]
        else:
            mine = rows.sum(0) if self.rank == 0 else torch.zeros_like(rows[0])
        n = len(S2EFMetrics.FIELDS)
        old = int(part.get("metric_fields", 8))  # a checkpoint of a version that summed fewer metric fields
        if old < n:
            extra = [mine[:1]] + [torch.zeros(1, dtype=mine.dtype)] * (n - old - 1) if old == 8 else \
                [torch.zeros(n - old, dtype=mine.dtype)]  # EFwT's own count, 8 fields: every structure counted
            mine = torch.cat([mine[:old], *extra, mine[old:]])
        self.metrics.sums += mine[:n]
        # bytes by kind, whatever wrappers wrote them, into the wrapper that reports each kind
        by_kind = mine[n:n + (len(mine) - n) // len(KINDS) * len(KINDS)].view(-1, len(KINDS)).sum(0)
        owner = {"gp": self.gp_comm, "weight": self.grad_comm}
        for k, v in zip(KINDS, by_kind.tolist()):
            if v:
                c = owner.get(k, self.comm)
                c.bytes[k] = c.bytes.get(k, 0.0) + v
        self.lr = float(part["lr"])

    def export_model(self):
        """A whole single-process model object to load the final weights into (``result.model``)."""
        return make_model(self.config)

    # ------------------------------------------------------------------ evaluation
    def eval_counts(self, ids: Tensor, parts: list) -> Counts:
        """The :class:`~.labels.Counts` of a whole split ``ids`` (this rank's ``parts`` of it): the in-memory counts,
        or one pass of the loader over the parts (structures only, no graphs) and an all-reduce."""
        if self.label_counts is not None:
            e, f, s = self.label_counts[ids].sum(0).tolist() if len(ids) else (0, 0, 0)
            return Counts(int(e), int(f), int(s))
        counter = StructureLoader(self.structures, self.loader.num_workers)
        n = torch.zeros(3, dtype=torch.int64)
        for step in counter.iterate(parts):
            n += torch.tensor([step.num_energy, step.num_free, step.num_stress])
        if self.world > 1:
            n = self._all_reduce(n) // (self.world // self.replicas)
        return Counts(int(n[0]), int(n[1]), int(n[2]))

    def _eval_split(self, ids: Tensor) -> None:
        """This rank's metric sums of the split ``ids`` into :attr:`metrics` (its share, batch by batch)."""
        cfg = self.config
        if self.pipelined:
            parts = [self.share(gb) for gb in ids.split(cfg.batch_size * self.replicas)]
        else:
            mine = self.share(ids)
            parts = list(mine.split(cfg.batch_size)) if len(mine) else []
        counts = self.eval_counts(ids, parts)
        for k, step in enumerate(self.loader.iterate(parts)):
            if self.pipelined:
                self._eval_pipeline_step(step, k, counts)
            elif step.structures:
                self._eval_whole_model_step(step, counts)
        if self.pipelined:
            self.executor.comm.wait_sends()

    def _eval_whole_model_step(self, step, counts: Counts) -> None:
        with torch.no_grad():
            e_hat, f_hat, batch, s_hat = self.forward(step.structures, step)
            if not self.reporting:
                return
            loss = self._loss(batch, e_hat, f_hat, s_hat, counts)
            ref = self._targets(batch)[2]
            self._update_metrics(batch, e_hat, f_hat, ref, force_mask(batch), energy_mask(batch), loss=float(loss),
                                 s_hat=s_hat)

    def _eval_pipeline_step(self, step, k: int, counts: Counts) -> None:
        """Exact inference through the stages, ``C`` micro-batches: ``F`` (and ``G`` without a graph for
        conservative forces, whose energies the last stage then sends to stage 0); the metrics are summed where
        energies and forces are together (direct: the last stage; conservative: stage 0)."""
        st, ex = self.pipe_stage, self.executor
        st.set_batches(self._groups(step.structures), counts, training=False)
        st.eval_energy, st.eval_forces, st.eval_stress = {}, {}, {}
        for c in range(self.C):
            ex.forward(c, k)
        if not self.direct:
            for c in reversed(range(self.C)):
                ex.force_grad(c, k)
            self._conservative_metrics(st)
        st.ctx.clear()

    def _conservative_metrics(self, st: AtomisticStage) -> None:
        """The last stage sends its micro-batches' energies to stage 0, which adds the metrics of each."""
        if not self.reporting or not (st.is_first or st.is_last):
            return
        chunks = [c for c, mb in enumerate(st.mbs) if mb is not None]
        if st.is_last and not st.is_first:
            if chunks:
                self.comm.isend(torch.cat([st.eval_energy[c] for c in chunks]), self.ranks[0], EVAL_ENERGY_TAG,
                                "eval")
            return
        if not chunks:
            return
        if not st.is_last:
            n = sum(int(st.mbs[c].batch.num_graphs) for c in chunks)
            flat = self.comm.recv((n,), st.dtype, self.ranks[-1], EVAL_ENERGY_TAG)
            sizes = [int(st.mbs[c].batch.num_graphs) for c in chunks]
            st.eval_energy = dict(zip(chunks, flat.split(sizes)))
        cfg = self.config
        for c in chunks:
            mb = st.mbs[c]
            e_t = self._targets(mb.batch)[0]
            loss = (energy_loss(st.eval_energy[c], e_t, num_structures=st.counts.energy,
                                energy_coef=cfg.energy_coef, loss_fn=cfg.loss_fn, mask=energy_mask(mb.batch))
                    + st.ctx[c]["force_loss"])
            st.record(mb, st.eval_energy[c], st.eval_forces[c], float(loss.detach()), st.eval_stress.get(c))

    def eval_splits(self) -> list[str]:
        """The splits evaluated, in order: ``val`` (it chooses the best weights), the other given validation sets
        (``--val-dataset``: ``val_<name>``), and ``test`` unless it is empty (given validation sets without a
        ``--test-dataset``)."""
        return [k for k in self.splits if k != "train" and (k != "test" or len(self.splits[k]))]

    def evaluate(self, size: int | None = None) -> dict:
        """Metrics with the averaged weights of every evaluated split (:meth:`eval_splits`; ``<split>_`` prefixes:
        ``val_``, ``val_<name>_``, ``test_``): ``loss``, ``energy_mae`` (eV), ``energy_mae_per_atom`` (eV/atom),
        ``force_mae`` (eV/Å), ``force_cos``, ``efwt`` (fractions; NaN for a label no structure has); ``size``: only
        the first ``size`` structures of each split (a step evaluation, ``--val-size``)."""
        out = {}
        kept = self.metrics
        names = self.eval_splits()
        with self.ema.averaged(self.trained):
            self.model.eval()
            totals = []
            for k in names:
                self.metrics = S2EFMetrics()
                self._eval_split(self.splits[k][:size])
                totals.append(self.metrics.totals())
            sums = self._all_reduce(torch.stack(totals))
            for j, k in enumerate(names):
                out[f"{k}_loss"] = float(sums[j, S2EFMetrics.FIELDS.index("loss")])
                out.update(S2EFMetrics().compute(sums[j], prefix=f"{k}_"))
        self.metrics = kept
        self.schedule.observe(out.get(self.monitor, float("nan")))
        return out

    # ------------------------------------------------------------------ a run
    def run(self, progress: bool, options, *, plan_info: dict, records=None) -> TrainResult:
        """Train with the shared epoch loop and session (collective when ``world > 1``); returns this rank's
        result (``result.model``: the trained model with its ``meta`` on rank 0)."""
        lead = self.rank == 0
        if "stress" in plan_info.get("labels", ()) and not self.direct:  # report the stresses the data has
            self.with_stress = True
        selection = selection_for(plan_info)
        self.monitor = selection.monitor
        session = RunSession(self.config, options, self, lead=lead, rank=self.rank, world=self.world,
                             plan_info=plan_info)
        hooks = list(session.hooks)
        if records is not None and lead:
            hooks.insert(len(hooks) - 1, lambda epoch, rec, st: records.send(rec))  # before the stop hook
        try:
            state = session.start_state()
            if records is not None and lead:
                for rec in state.result.epochs:
                    records.send(rec)
            self.steps_loop = StepLoop(self, session.options, session, state, selection, lead=lead,
                                       progress=progress)
            with stopping.installed(announce=lead, unit="step" if self.steps_loop.watch else "epoch"):
                if self.steps_loop.spent():  # a resumed run already at --max-steps
                    if lead:
                        warnings.warn(f"nothing to train: the resumed run has already done {state.step} step(s) and "
                                      f"--max-steps is {self.config.max_steps}; raise --max-steps to continue it",
                                      stacklevel=2)
                    result = state.result
                else:
                    result = epoch_loop(self.config, self.train_epoch, self.evaluate, progress=progress and lead,
                                        desc=f"s2ef {self.world}x" if self.world > 1 else "s2ef", state=state,
                                        on_best=session.on_best, after_epoch=hooks, warn=lead, selection=selection)
            session.finish()
        finally:
            if self.steps_loop is not None:
                self.steps_loop.close()
            session.close()
        session.annotate(result, plan_info, self.device)
        final = session.final_state()  # collective in a pipeline (merged on rank 0)
        if self.rank == 0:  # the rank whose result is returned: the only one to build the whole model
            model = self.export_model()
            model.load_state_dict(final)
            model.meta = dict(run_meta(self.config, len(result.epochs)), task_meta=self.task_meta())
            model.preprocessing = None  # no graph preprocessing: the neighbour graph is built from task_meta
            result.model = model.eval()
        return result


def worker(rank: int, world: int, config: TrainConfig, structures, splits: dict, normalizer: dict, info: dict,
           progress: bool = True, options=None, records=None) -> dict | None:
    """The function each rank of any S2EF layout runs (:func:`gnnpipe.core.run.launch.spawn`, or a torchrun rank);
    ``info``: the plan's record (:func:`~.layout.plan_info`, with what the launcher added).

    Returns ``{"result": TrainResult}`` on rank 0 (its ``model`` holds the trained weights;
    ``extra["peak_mem_bytes"]``: every rank's peak), ``None`` elsewhere.
    """
    torch.set_num_threads(config.threads)
    tr = S2EFTrainer(config, structures, splits, EnergyNormalizer.from_dict(normalizer), rank=rank, world=world)
    result = tr.run(progress, options, plan_info=info, records=records)
    peaks = [None] * world
    if world > 1:
        dist.all_gather_object(peaks, result.extra["peak_mem_bytes"][0])
    else:
        peaks = result.extra["peak_mem_bytes"]
    result.extra["peak_mem_bytes"] = peaks
    return {"result": result} if rank == 0 else None
