"""S2EF training: one executor for a single process and for each of ``D`` data-parallel ranks.

Each step takes one global batch (``D × batch_size`` structures, :func:`~gnnpipe.tasks.s2ef.data.epoch_batches`);
rank ``r`` computes the loss of its share as sums divided by the global counts (:func:`~.loss.s2ef_loss`) and
back-propagates; the ranks' gradients are summed with one all-reduce, so every rank holds exactly the gradient of
the global batch — the same as one process training on it (an uneven or empty share included). Then every rank
clips, steps AdamW and updates the moving average identically, so the replicas never drift.

The executor plugs into the shared runtime: :func:`~gnnpipe.core.training.trainer.epoch_loop` (progress bar, early
stopping, selection on the validation force MAE), :class:`~gnnpipe.core.run.session.RunSession` (epoch lines, CSV,
TensorBoard, best weights, Ctrl-C) and :mod:`gnnpipe.core.run.checkpoint` through ``checkpoint_modules``,
``task_state`` / ``load_task_state`` (moving average, learning-rate schedule) and ``task_meta``. Training by steps
(``--max-steps``, ``--eval-every-steps``, ``--checkpoint-every-steps``) is :class:`~gnnpipe.tasks.s2ef.steps.StepLoop`
inside :meth:`S2EFTrainer.train_step`, the same in every layout (:meth:`~S2EFTrainer.train_batch` is a layout's
optimizer step, :meth:`~S2EFTrainer.flush_losses` its step losses made global).
"""

from __future__ import annotations

import copy
import functools
import math
import time
import warnings
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from ...core.settings.config import TrainConfig
from ...core.run.epochlog import REGRESSION_CSV_FIELDS
from ...core.run.results import Selection, TrainResult
from .data import StructureLoader, epoch_batches, resolved_num_workers, share
from .loss import S2EFMetrics, s2ef_loss
from .normalizer import EnergyNormalizer
from .optim import ExponentialMovingAverage, LRSchedule, clip_and_norm

#: S2EF model selection: the lowest validation force MAE (ties: the lower validation loss)
SELECTION = Selection(monitor="val_force_mae", mode="min")


def make_model(config: TrainConfig):
    """The atomistic model of ``config`` (``layers`` interaction blocks, ``hidden`` channels, the ``cutoff``, the
    model's own options), its weights drawn after ``torch.manual_seed(config.seed)`` (the same on every rank)."""
    from ...models import build_model, model_options

    opts = model_options(config.model)
    kw = dict(config.model_args)
    for name, value in (("cutoff", config.cutoff), ("direct_forces", config.direct_forces),
                        ("max_neighbors", config.max_neighbors)):
        if name in opts:
            kw.setdefault(name, value)
    torch.manual_seed(config.seed)
    model = build_model(config.model, 0, 1, num_layers=config.layers, hidden=config.hidden,
                        dropout=config.dropout or 0.0, **kw)
    return model.to(config.torch_dtype)


def graph_builder(cutoff: float, max_neighbors: int, with_triplets: bool = True, with_reverse: bool = False) -> Callable:
    """``batch → AtomGraph`` (:func:`gnnpipe.data.atoms.build_graph`; triplets only ``with_triplets``, each edge's
    reverse with ``with_reverse``: models with ``uses_reverse_edges``, GemNet). Picklable: loader workers started
    with ``spawn`` (inside a rank) receive it."""
    from ...data.atoms import build_graph

    return functools.partial(build_graph, cutoff=cutoff, max_neighbors=max_neighbors, with_triplets=with_triplets,
                             with_reverse=with_reverse)


def forward(model, structures: list, graph_fn: Callable) -> tuple[Tensor, Tensor, object]:
    """``(ê [b], F̂ [n, 3], batch)``: the model's (normalised) energies and forces of ``structures`` (the model's
    direct head, or conservative ``−∂ê/∂pos``, differentiable again while the model trains and grad is on)."""
    from torch_geometric.data import Batch

    batch = Batch.from_data_list(structures)
    out = model(batch, graph_fn(batch), forces=True)
    return out["energy"].reshape(-1), out["forces"], batch


class S2EFTrainer:
    """The executor of one rank (``world = 1``: the single process).

    Args:
        config: the resolved S2EF configuration. structures: all structures (each rank holds them all; the
            shares are chosen per step). splits: ``{"train", "val", "test"}`` index tensors.
        normalizer: the energy reference and normalisation fitted on the training split.
        rank, world: this rank and the number of data-parallel ranks ``D`` (a process group is initialised
            when ``world > 1``). Subclasses may place several ranks on one replica (graph parallelism,
            :mod:`~gnnpipe.tasks.s2ef.graph_parallel`): ``replica`` / ``replicas`` say which batch share a rank
            reads, ``reporting`` whether its loss and metrics count, :meth:`forward` how it computes them.
        model: a pre-built model (default :func:`make_model`). graph_fn: ``batch → graph`` (default
            :func:`graph_builder` with the config's cutoff and neighbour cap, triplets when
            :meth:`needs_triplets`).
    """

    log_fields = REGRESSION_CSV_FIELDS

    def __init__(self, config: TrainConfig, structures: list, splits: dict, normalizer: EnergyNormalizer, *,
                 rank: int = 0, world: int = 1, model=None, graph_fn: Optional[Callable] = None):
        from ...core.runtime.metrics import bound_heap_retention, return_free_memory

        bound_heap_retention()  # weight-sized temporaries must not leave resident holes step after step
        self.config, self.structures, self.splits, self.normalizer = config, structures, splits, normalizer
        self.rank, self.world = rank, world
        self.replica, self.replicas, self.reporting = self.replica_of(rank, world)
        self.device = torch.device("cpu")
        self.model = model if model is not None else make_model(config)
        if model is None:  # data-dependent initialisation (GemNet's scale factors), the same in every layout
            from .scaling import fit_scale_factors

            fit_scale_factors(self.model, config, structures, splits)
        self.units = range(len(getattr(self.model, "units", ())))
        self.graph_fn = graph_fn or graph_builder(config.cutoff, config.max_neighbors, self.needs_triplets(),
                                                  bool(getattr(self.model, "uses_reverse_edges", False)))
        self.trained = self.trained_module()
        self.params = [p for p in self.trained.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay or 0.0)
        n_train = len(splits["train"])
        self.steps_per_epoch = max(math.ceil(n_train / (config.batch_size * self.replicas)), 1)
        self.schedule = LRSchedule(self.optimizer, config.lr, config.lr_schedule, config.epochs * self.steps_per_epoch,
                                   config.warmup_steps, config.warmup_factor)
        self.ema = ExponentialMovingAverage(self.trained, config.ema_decay)
        # free atoms per structure when they are in memory; a lazy set's counts come with its batches
        self.free_counts = (torch.tensor([int((~d.fixed).sum()) for d in structures])
                            if isinstance(structures, list) else None)
        self.skipped = 0  # malformed structures skipped in the epoch in progress (--skip-invalid)
        self.metrics = S2EFMetrics()  # the training metrics of the epoch in progress (this rank's sums)
        self.lr = float("nan")  # the learning rate of the last step
        self.epoch_losses: list[float] = []  # the global-batch loss of each step of the epoch in progress
        self._pending: list = []  # step losses not yet made global (:meth:`flush_losses`)
        self.steps_loop = None  # the run's StepLoop (:meth:`run`); None: whole epochs (a trainer driven directly)
        from ...core.ops.comm import Comm

        self.grad_comm = Comm(self.device)  # the gradient all-reduce (:meth:`_sync_grads`): its bytes, as "weight"
        self.loader = StructureLoader(structures, self.num_workers(),
                                      self.graph_fn if self.graph_in_loader and graph_fn is None else None)
        return_free_memory()  # what building freed (a stage's dropped weights) stays out of training's peak

    #: whether the loader's workers build each step's batch and graph (the single process and data parallelism);
    #: graph parallelism and the pipeline build them from the structures the workers read
    graph_in_loader = True

    def num_workers(self) -> int:
        """Loader workers of this rank (:func:`~.data.resolved_num_workers`; the launcher resolves the count once)."""
        return resolved_num_workers(self.config, len(self.splits["train"]))

    def global_counts(self, ids: Tensor, step) -> tuple[int, int, int]:
        """``(B, n_free, skipped)`` of the global batch ``ids``: from the in-memory counts, or summed over the
        replicas' shares (one all-reduce; every rank of a replica read the same share)."""
        if self.free_counts is not None:
            return len(ids), int(self.free_counts[ids].sum()), 0
        t = torch.tensor([len(step.structures), step.num_free, step.skipped], dtype=torch.int64)
        if self.world > 1:
            dist.all_reduce(t)
            t = t // (self.world // self.replicas)
        return int(t[0]), int(t[1]), int(t[2])

    def forward_step(self, step) -> tuple[Tensor, Tensor, object]:
        """:meth:`forward` of a loader step's structures (which finds the batch and graph its worker built)."""
        self._step = step
        try:
            return self.forward(step.structures)
        finally:
            self._step = None

    def trained_module(self) -> torch.nn.Module:
        """The module this rank trains, averages and checkpoints (its ``state_dict`` names are the single-process
        model's): the whole model here; a pipeline stage's units (:mod:`~gnnpipe.tasks.s2ef.pipeline`)."""
        return self.model

    def needs_triplets(self) -> bool:
        """Whether the default graph builds triplets: when the model reads them (``uses_triplets``; SchNet does
        not, so its steps skip the ``O(edges × neighbours)`` enumeration)."""
        return bool(getattr(self.model, "uses_triplets", True))

    # ------------------------------------------------------------------ the checkpoint interface
    def checkpoint_modules(self) -> dict:
        return {"": self.trained}

    def task_state(self) -> dict:
        """The moving average and the schedule (restored on resume); ``weights``: the averaged parameters, what
        ``gnnpipe export --keep last`` exports (:func:`gnnpipe.core.run.checkpoint.read_weights`)."""
        return {"ema": self.ema.state_dict(), "schedule": self.schedule.state_dict(),
                "weights": self.weights()}  # by state_dict names, shared modules under each of their names

    def load_task_state(self, state: dict) -> None:
        self.ema.load_state_dict(state["ema"])
        self.schedule.load_state_dict(state["schedule"])

    def task_meta(self) -> dict:
        """What a model file needs to be used (:mod:`gnnpipe.tasks.s2ef.predict`): plain values only."""
        return {"task": "s2ef", "normalizer": self.normalizer.to_dict(), "cutoff": float(self.config.cutoff),
                "max_neighbors": int(self.config.max_neighbors), "direct_forces": bool(self.config.direct_forces)}

    def weights(self) -> dict[str, Tensor]:
        """CPU copies of the weights evaluation uses (the moving average, when kept), by ``state_dict`` names."""
        with self.ema.averaged(self.trained) as m:
            return {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}

    # ------------------------------------------------------------------ training
    def _targets(self, batch) -> tuple[Tensor, Tensor, Tensor]:
        ref = self.normalizer.reference(batch.z, batch.batch, batch.num_graphs)
        e_t = self.normalizer.normalise(batch.energy.reshape(-1), ref)
        return e_t, batch.forces / self.normalizer.std, ref

    def replica_of(self, rank: int, world: int) -> tuple[int, int, bool]:
        """``(replica, replicas, reporting)`` of ``rank`` among ``world`` ranks: here every rank is a replica."""
        return rank, world, True

    def share(self, ids: Tensor) -> Tensor:
        """This rank's part of a global batch (its replica's share)."""
        return share(ids, self.replica, self.replicas)

    def forward(self, structures: list) -> tuple[Tensor, Tensor, object]:
        """``(ê [b], F̂ [n, 3], batch)`` of ``structures`` (:func:`forward`; on the batch and graph a loader worker
        built, when these are the structures of the step :meth:`forward_step` runs)."""
        step = getattr(self, "_step", None)
        if step is not None and step.graph is not None and structures is step.structures:
            out = self.model(step.batch, step.graph, forces=True)
            return out["energy"].reshape(-1), out["forces"], step.batch
        return forward(self.model, structures, self.graph_fn)

    def _all_reduce(self, t: Tensor) -> Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def train_step(self, epoch: int) -> dict:
        """One epoch of steps (from the resumed batch of a checkpoint written inside it); returns ``loss`` (mean over
        steps of the global batch's loss), ``lr`` (of the last step), ``train_energy_mae``, ``train_force_mae`` (of
        the training forward passes, eV and eV/Å); ``{"loss": nan}`` when the run ended inside the epoch
        (``--max-steps``: the epoch loop then records nothing)."""
        c0, t0 = time.thread_time(), time.perf_counter()
        self.grad_comm.reset()
        if not self.epoch_steps(epoch):
            return {"loss": float("nan")}
        totals = self.metrics.totals()
        vec = torch.cat([totals.to(torch.float64), torch.tensor([self.grad_comm.bytes.get("weight", 0.0)],
                                                                dtype=torch.float64)])
        vec = self._all_reduce(vec)
        m = self.metrics.compute(vec[:-1].to(totals.dtype))
        out = {"loss": sum(self.epoch_losses) / max(len(self.epoch_losses), 1), "lr": self.lr,
               "train_energy_mae": m["energy_mae"], "train_force_mae": m["force_mae"],
               "cpu_s": [time.thread_time() - c0], "bytes_weight": round(float(vec[-1]))}
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
        steps = self.loader.iterate([self.share(train[gb]) for gb in batches[start:]])
        for j, step in zip(range(start, len(batches)), steps):
            self._pending.append(self.train_batch(train[batches[j]], step))
            if loop is not None and loop.after_step(epoch, j, len(batches), t0):
                return False
        self.flush_losses()
        return True

    def train_batch(self, ids: Tensor, step=None) -> float:
        """One optimizer step on the global batch ``ids`` (this rank computes its share, ``step``: as the loader
        read it; ``None``: read here); returns the global batch's loss (every rank has it)."""
        cfg = self.config
        if step is None:
            step = next(iter(self.loader.iterate([self.share(ids)])))
        num_structures, num_free, skip = self.global_counts(ids, step)
        self.skipped += skip
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = torch.zeros((), dtype=torch.float64)
        if step.structures:
            e_hat, f_hat, batch = self.forward_step(step)
            e_t, f_t, ref = self._targets(batch)
            free = ~batch.fixed
            loss = s2ef_loss(e_hat, e_t, f_hat, f_t, free, num_structures=num_structures, num_free=num_free,
                             energy_coef=cfg.energy_coef, force_coef=cfg.force_coef, loss_fn=cfg.loss_fn)
            loss.backward()
            if self.reporting:
                loss_value = loss.detach().to(torch.float64)
            with torch.no_grad():
                s = self.normalizer.std
                if self.reporting:
                    self.metrics.update(self.normalizer.denormalise(e_hat.detach(), ref), batch.energy.reshape(-1),
                                        f_hat.detach() * s, batch.forces, free, batch.natoms.reshape(-1),
                                        batch.batch)
        losses: list[float] = []
        self._sync_grads(loss_value, losses)
        clip_and_norm(self.params, cfg.clip_grad_norm)
        self.lr = self.schedule.apply()
        self.optimizer.step()
        self.ema.update(self.trained)
        return losses[0]

    def flush_losses(self) -> None:
        """Append the step losses of :meth:`train_batch` since the last call to :attr:`epoch_losses`, made global
        (here they are already; a pipeline all-reduces them: collective)."""
        self.epoch_losses.extend(float(v) for v in self._pending)
        self._pending = []

    def comms(self) -> list:
        """The communication wrappers (:class:`~gnnpipe.core.ops.comm.Comm`) whose byte counters the epoch record
        reports (here the gradient all-reduce's; graph parallelism and the pipeline add theirs)."""
        return [self.grad_comm]

    def _rank_sums(self) -> Tensor:
        from ...core.ops.comm import KINDS

        parts = [self.metrics.totals()]
        parts += [torch.tensor([float(c.bytes.get(k, 0.0)) for k in KINDS], dtype=torch.float64) for c in self.comms()]
        return torch.cat(parts)

    def partial_state(self, time_s: float) -> dict:
        """Collective: the sums of the epoch in progress for a checkpoint written inside it (``LoopState.partial``):
        ``losses`` (each step's global loss), ``ranks`` (each rank's training metric sums and bytes sent, in rank
        order), ``lr``, ``time_s`` (its training seconds)."""
        self.flush_losses()
        mine = self._rank_sums()
        rows = [torch.zeros_like(mine) for _ in range(self.world)] if self.world > 1 else [mine]
        if self.world > 1:
            dist.all_gather(rows, mine)
        return {"losses": list(self.epoch_losses), "ranks": [r.tolist() for r in rows], "lr": self.lr,
                "time_s": float(time_s)}

    def restore_partial(self, part: dict) -> None:
        """Continue the sums of a checkpoint written inside an epoch (:meth:`partial_state`): each rank its own
        (so the epoch record equals an uninterrupted run's, bit for bit); into another world size, rank 0 all of
        them (the epoch's all-reduce counts them once)."""
        from ...core.ops.comm import KINDS

        self.epoch_losses = [float(v) for v in part["losses"]]
        rows = torch.tensor(part["ranks"], dtype=torch.float64)
        if len(rows) == self.world:
            mine = rows[self.rank]
        else:
            mine = rows.sum(0) if self.rank == 0 else torch.zeros_like(rows[0])
        n = len(S2EFMetrics.FIELDS)
        self.metrics.sums += mine[:n]
        for i, c in enumerate(self.comms()):
            for j, k in enumerate(KINDS):
                if n + i * len(KINDS) + j >= len(mine):  # a checkpoint of a version that counted fewer wrappers
                    break
                v = float(mine[n + i * len(KINDS) + j])
                if v:
                    c.bytes[k] = c.bytes.get(k, 0.0) + v
        self.lr = float(part["lr"])

    def _sync_grads(self, loss_value: Tensor, losses: list) -> None:
        """Every parameter's gradient (zeros where this rank had none) summed over the ranks, with the loss."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.world > 1:
            flat = torch.cat([g.reshape(-1).to(torch.float64) for g in grads] + [loss_value.reshape(1)])
            self.grad_comm.all_reduce(flat, kind="weight")  # counts the ring's bytes (Comm)
            off = 0
            for p, g in zip(self.params, grads):
                n = g.numel()
                p.grad = flat[off:off + n].view_as(g).to(g.dtype).clone()
                off += n
            losses.append(float(flat[-1]))
        else:
            for p, g in zip(self.params, grads):
                p.grad = g
            losses.append(float(loss_value))

    def export_model(self):
        """A whole single-process model object to load the final weights into (``result.model``)."""
        return copy.deepcopy(self.model)

    # ------------------------------------------------------------------ evaluation
    def eval_counts(self, ids: Tensor, parts: list) -> tuple[int, int]:
        """``(B, n_free)`` of a whole split ``ids`` (this rank's ``parts`` of it): the in-memory counts, or one pass
        of the loader over the parts (structures only, no graphs) and an all-reduce."""
        if self.free_counts is not None:
            return len(ids), int(self.free_counts[ids].sum())
        counter = StructureLoader(self.structures, self.loader.num_workers)
        n = torch.zeros(2, dtype=torch.int64)
        for step in counter.iterate(parts):
            n += torch.tensor([len(step.structures), step.num_free])
        if self.world > 1:
            dist.all_reduce(n)
            n = n // (self.world // self.replicas)
        return int(n[0]), int(n[1])

    def _eval_split(self, ids: Tensor, metrics: S2EFMetrics) -> None:
        cfg = self.config
        mine = self.share(ids)
        parts = list(mine.split(cfg.batch_size)) if len(mine) else []
        num_structures, num_free = self.eval_counts(ids, parts)
        for step in self.loader.iterate(parts):
            if not step.structures:
                continue
            with torch.no_grad():
                e_hat, f_hat, batch = self.forward_step(step)
                if not self.reporting:
                    continue
                e_t, f_t, ref = self._targets(batch)
                free = ~batch.fixed
                loss = s2ef_loss(e_hat, e_t, f_hat, f_t, free, num_structures=num_structures, num_free=num_free,
                                 energy_coef=cfg.energy_coef, force_coef=cfg.force_coef, loss_fn=cfg.loss_fn)
                s = self.normalizer.std
                metrics.update(self.normalizer.denormalise(e_hat.detach(), ref), batch.energy.reshape(-1),
                               f_hat.detach() * s, batch.forces, free, batch.natoms.reshape(-1), batch.batch,
                               loss=float(loss))

    def evaluate(self, size: Optional[int] = None) -> dict:
        """Validation and test metrics with the averaged weights: ``{val,test}_loss``, ``_energy_mae`` (eV),
        ``_energy_mae_per_atom`` (eV/atom), ``_force_mae`` (eV/Å), ``_force_cos``, ``_efwt`` (fractions);
        ``size``: only the first ``size`` structures of each split (a step evaluation, ``--val-size``)."""
        out = {}
        with self.ema.averaged(self.trained):
            self.model.eval()
            ms = {k: S2EFMetrics() for k in ("val", "test")}
            for k, m in ms.items():
                self._eval_split(self.splits[k][:size], m)
            sums = self._all_reduce(torch.stack([ms["val"].totals(), ms["test"].totals()]))
            for j, k in enumerate(("val", "test")):
                out[f"{k}_loss"] = float(sums[j, S2EFMetrics.FIELDS.index("loss")])
                out.update(ms[k].compute(sums[j], prefix=f"{k}_"))
        self.schedule.observe(out["val_force_mae"])
        return out

    # ------------------------------------------------------------------ a run
    def run(self, progress: bool, options, *, plan_info: dict, records=None) -> TrainResult:
        """Train with the shared epoch loop and session (collective when ``world > 1``); returns this rank's
        result (``result.model``: the trained model with its ``meta`` on rank 0)."""
        from ...core.run import stopping
        from ...core.run.checkpoint import run_meta
        from ...core.run.session import RunSession
        from ...core.training.trainer import epoch_loop

        from .steps import StepLoop

        lead = self.rank == 0
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
            self.steps_loop = StepLoop(self, session.options, session, state, SELECTION, lead=lead,
                                       progress=progress)
            with stopping.installed(announce=lead, unit="step" if self.steps_loop.watch else "epoch"):
                if self.steps_loop.spent():  # a resumed run already at --max-steps
                    if lead:
                        warnings.warn(f"nothing to train: the resumed run has already done {state.step} step(s) and "
                                      f"--max-steps is {self.config.max_steps}; raise --max-steps to continue it",
                                      stacklevel=2)
                    result = state.result
                else:
                    result = epoch_loop(self.config, self.train_step, self.evaluate, progress=progress and lead,
                                        desc=f"s2ef {self.world}x" if self.world > 1 else "s2ef", state=state,
                                        on_best=session.on_best, after_epoch=hooks, warn=lead, selection=SELECTION)
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


def plan_info(config: TrainConfig, splits: dict) -> dict:
    """The layout of an S2EF run (stored in results and checkpoints)."""
    return {"task": "s2ef", "ways": config.ways, "stages": 1, "world_size": config.ways,
            "data_parallel": config.ways, "batch_size": config.batch_size,
            "global_batch": config.batch_size * config.ways,
            "structures": {k: int(len(v)) for k, v in splits.items()}}


def worker(rank: int, world: int, config: TrainConfig, structures: list, splits: dict, normalizer: dict,
           progress: bool = True, options=None, records=None) -> Optional[dict]:
    """The function each data-parallel rank runs (:func:`gnnpipe.core.run.launch.spawn`, or a torchrun rank).

    Returns ``{"result": TrainResult}`` on rank 0 (its ``model`` holds the trained weights), ``None`` elsewhere.
    """
    torch.set_num_threads(config.threads)
    tr = S2EFTrainer(config, structures, splits, EnergyNormalizer.from_dict(normalizer), rank=rank, world=world)
    result = tr.run(progress, options, plan_info=plan_info(config, splits), records=records)
    peaks = [None] * world
    dist.all_gather_object(peaks, result.extra["peak_mem_bytes"][0])
    result.extra["peak_mem_bytes"] = peaks
    return {"result": result} if rank == 0 else None
