"""Node classification (GNNPipe: full-graph training of a deep GNN on one graph): the ``"node-classification"``
:class:`~gnnpipe.tasks.base.Task`.

The package is the whole engine: the graph datasets (:func:`~gnnpipe.api.load_data`), the adjacency and history
ops (:mod:`.graph`, :mod:`.history`, :mod:`.aggregation`, :mod:`.kinds`), its stage (:mod:`.stage`) and executors
(:mod:`.pipeline`, :mod:`.parallel`, :mod:`.executor`), the single-process trainer and the rank worker
(:mod:`.trainer`, :mod:`.runner`, whose ``build_plan`` cuts chunks, stages and ways), the loss and accuracies
(:mod:`.metrics`), the memory-mapped graph (:mod:`.graphfile`), the unit profiler (:mod:`.profile`) and the cost
model (:mod:`.cost`). From the shared runtime it takes the schedule interpreter, the launcher (local processes or
``torchrun``), the epoch loop, results and checkpoints. It claims every configuration no other task claims.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from typing import Any

import attrs
import torch
import torch.distributed as dist

from ... import models
from ...core.run import launch
from ...core.run.checkpoint import run_meta
from ...core.run.results import TrainResult
from ...core.run.session import RecordCollector, partial_result
from ...core.run.state import assemble_model
from ...core.settings.config import TrainConfig, check_names, ignored_options
from ...data import load_dataset
from ...errors import ConfigError, DistributedError
from ..base import Task
from ..registry import register
from .cost.memory_check import check_ranks_memory, check_single_process_memory, choose_recompute
from .cost.plan_memory import predict_memory
from .cost.profile import memory_profile
from .runner import (
    build_plan,
    check_schedule,
    default_chunks,
    file_backed,
    format_plan,
    num_classes_of,
    share_profiled_split,
    worker,
)
from .trainer import SingleProcessTrainer, make_model, prepare_data, resolve_config


def load_data(config: TrainConfig):
    """Load and prepare (validate + preprocess, optionally row-normalise features) the configured dataset
    (``gnnpipe.tasks.nodes.trainer.prepare_data``).

    Raises:
        ConfigError: unknown dataset, missing files. DataValidationError: a malformed graph (checked on the
            values as stored, before any conversion).
    """
    raw = load_dataset(config.dataset, config.root, split=config.split, seed=config.seed, dtype=config.torch_dtype,
                       **({"num_nodes": config.num_nodes, "avg_degree": config.avg_degree,
                           "num_classes": config.num_classes, "num_features": config.num_features}
                          if config.dataset in (None, "synthetic") else {}))
    return prepare_data(raw, config)


def describe_run(config: TrainConfig, data, given: bool = False) -> str:
    """The line a run starts with: what is trained (dataset and its size, model, layout); ``given``: the graph
    was passed as ``data`` (not loaded from ``config.dataset`` or generated)."""
    name = "the given graph" if given else (config.dataset or "synthetic")
    n, e = int(data.num_nodes), int(data.edge_index.size(1))

    s = (f"training {config.model} (L={config.layers}, hidden {config.hidden}) on {name} "
         f"(N={n:,}, E={e:,}, F={int(data.x.size(1))}, {num_classes_of(data)} classes) "
         f"for {config.epochs} epoch{'s' if config.epochs != 1 else ''}; ")
    W, S = config.ways, config.stages
    if W == 1 and S == 1:
        s += "single process"
    elif S == 1:
        s += f"graph parallel over {W} ways"
    else:
        s += (f"{'hybrid ' + str(W) + ' ways x ' if W > 1 else 'pipeline '}{S} stages, "
              f"{default_chunks(config)} chunks, scheduler {config.scheduler}"
              f"{' (stashed weights)' if config.stash_weights else ''}, "
              f"correctors {','.join(map(str, config.correctors)) or 'none'}")
    return s


@attrs.define(eq=False)
class NodePlan:
    """The layout of one node-classification run, as :meth:`NodeClassification.plan` made it.

    Attributes:
        data: the prepared graph when the run is one process (``ways == stages == 1``, at most one chunk);
            ``None`` otherwise.
        run: the ranks' ``RunPlan`` (``gnnpipe.tasks.nodes.runner``: chunks, stage bounds, ``info``);
            ``None`` for one process. :meth:`NodeClassification.launch` takes it out (``run`` is ``None``
            afterwards), so that the graph it holds is freed once written for the ranks.
        predicted: the memory model's prediction for one process (:meth:`NodeClassification.check`; ``None``
            when none was made). The ranks' predictions are in ``run.info["predicted_mem_bytes"]``.
    """

    data: Any = None
    run: Any = None
    predicted: Any = None

    @property
    def single_process(self) -> bool:
        return self.run is None


@register("node-classification")
class NodeClassification(Task):
    """Node classification on one graph (the GNNPipe task): cross-entropy on the training vertices, accuracy
    on the validation and test masks, every layout (single process, pipeline, graph parallel, hybrid)."""

    name = "node-classification"

    @classmethod
    def claims(cls, config: Any) -> bool:
        """Every configuration: node classification is what a config names unless another task claims it."""
        return True

    def resolve(self, config: TrainConfig) -> TrainConfig:
        """Check every component name (``gnnpipe.core.settings.config.check_names``; also those the mode does
        not use), then fill the model's defaults (``gnnpipe.tasks.nodes.trainer.resolve_config``)."""
        if config.graph_parallel_group_size != 1:
            raise ConfigError(f"--gp-size splits atomistic structures' graphs (S2EF models); --model {config.model} "
                              f"cannot be graph-parallel that way: use --ways W (vertex-partitioned graph "
                              f"parallelism), or an atomistic model (--model {' / '.join(_atomistic_models())})")
        if config.stress_coef:
            raise ConfigError(f"--stress-coef trains the stresses of atomistic S2EF models; --model {config.model} "
                              f"classifies nodes: leave --stress-coef out, or train an atomistic model (--model "
                              f"{' / '.join(_atomistic_models())})")
        if config.replicas != 1:
            raise ConfigError(f"--replicas {config.replicas} makes data-parallel replicas of atomistic S2EF runs; node "
                              f"classification trains on the whole graph: split it over ranks with --ways W, or its "
                              f"layers with --stages S")
        steps = [f for f, v in (("--max-steps", config.max_steps), ("--eval-every-steps", config.eval_every_steps),
                                ("--val-size", config.val_size)) if v is not None]
        if steps:
            raise ConfigError(f"{', '.join(steps)} train atomistic models by optimizer steps (S2EF); node "
                              f"classification takes one step per epoch: use --epochs and --eval-every")
        if config.amp or not config.tf32:
            flag = "--amp" if config.amp else "--no-tf32"
            raise ConfigError(f"{flag} sets the precision of atomistic S2EF training; node classification computes "
                              f"in --dtype ({config.dtype}): leave {flag} out, or choose --dtype")
        check_names(config)
        return resolve_config(config)

    def load(self, config: TrainConfig, data=None):
        """The configured dataset (:func:`~gnnpipe.api.load_data`), or ``data`` validated and preprocessed as
        configured."""
        return load_data(config) if data is None else prepare_data(data, config)

    def describe(self, config: TrainConfig, data, given: bool = False) -> str:
        return describe_run(config, data, given)

    def plan(self, config: TrainConfig, data) -> NodePlan:
        """One process for ``ways == stages == 1`` and at most one chunk; else the ranks' plan
        (``gnnpipe.tasks.nodes.runner.build_plan``: partition into chunks, split the layers into stages)."""
        if config.world_size == 1 and (config.chunks or 1) == 1:
            return NodePlan(data=data)

        return NodePlan(run=build_plan(config, data))

    def check(self, config: TrainConfig, plan: NodePlan, options) -> None:
        """One process: warn of the options it ignores; refuse a run the memory model says cannot fit here
        (``options.memory_check``). Ranks: validate the first epoch's schedule (an invalid custom scheduler
        fails here, before any rank starts), predict each rank's memory and, for ranks started on this
        machine, refuse a layout that cannot fit.

        Raises:
            ConfigError: not enough memory. ScheduleError: an invalid schedule.
        """
        if options is not None and (options.checkpoint_every_steps or options.log_every_steps):
            warnings.warn("ignored: --checkpoint-every-steps, --log-every-steps (node classification takes one step "
                          "per epoch: use --checkpoint-every, --log-every)", stacklevel=3)
        if plan.single_process:
            ignored = ignored_options(config)
            if ignored:
                warnings.warn("ignored: " + "; ".join(ignored), stacklevel=3)
            torch.set_num_threads(config.threads)  # the memory profile runs the model as training will
            if options.memory_check:
                plan.predicted = check_single_process_memory(config, plan.data)  # ConfigError before any allocation
            return

        check_schedule(config, plan.run)
        _predict_memory(config, plan.run, options, local=not launch.under_torchrun())

    def launch(self, config: TrainConfig, plan: NodePlan, progress: bool, options) -> TrainResult | None:
        """Train in this process, or start ``ways × stages`` local ranks (``gnnpipe.core.run.launch.spawn``),
        or — started by ``torchrun`` — join its ranks; return rank 0's
        :class:`~gnnpipe.core.run.results.TrainResult` with the assembled single-process model (``None`` on
        the other ``torchrun`` ranks)."""
        if plan.single_process:
            result = SingleProcessTrainer(plan.data, config, prepared=True).fit(progress=progress, options=options)
            if plan.predicted is not None:  # profiled (a large job): the prediction beside the measured peak
                result.extra["predicted_mem_bytes"] = [int(plan.predicted.peak)]
            return result

        run, plan.run = plan.run, None  # the caller's plan no longer holds the graph
        seconds, why = launch.wait_limit(config.timeout_s, run.info["backend"], run.info.get("predicted_epoch_s"))
        run.info["wait_limit"] = {"seconds": seconds, "why": why}  # printed with the plan
        if launch.under_torchrun():
            return _join_torchrun(config, run, progress, options)
        return _spawn(config, run, progress, options)


def _join_torchrun(config: TrainConfig, plan, progress: bool, options) -> TrainResult | None:
    """This process is one of ``torchrun``'s ranks: join the group and run the rank worker."""
    rank, world = launch.init_env_process_group(plan.info["backend"], plan.info["wait_limit"]["seconds"])
    share_profiled_split(config, plan)
    if rank == 0:
        print(format_plan(plan.info), file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="gnnpipe-rank-") as folder:
        # each rank partitioned the graph itself (deterministic); it keeps only the slices its role reads
        own = file_backed(plan, folder)
        del plan
        out = worker(rank, world, config, own, progress, None, options)
    dist.barrier()
    dist.destroy_process_group()  # a live gloo group at interpreter exit aborts the process
    return _with_model(out["result"], out["model_state"], config, own) if out else None


def _spawn(config: TrainConfig, plan, progress: bool, options) -> TrainResult:
    """Start ``world_size`` local ranks on the rank worker; collect rank 0's result (the completed epochs'
    records travel with an interrupted or failed run's exception as ``.result``)."""
    print(format_plan(plan.info), file=sys.stderr)
    records = RecordCollector().start()
    with tempfile.TemporaryDirectory(prefix="gnnpipe-run-") as folder:
        # the graph is written once; every rank memory-maps it and reads only the slices its role needs
        shipped = file_backed(plan, folder)
        del plan
        try:
            outs = launch.spawn(worker, config.world_size, (config, shipped, progress, None, options, records.send_end),
                                backend=shipped.info["backend"], timeout_s=shipped.info["wait_limit"]["seconds"],
                                threads=config.threads,
                                graceful=True)
        except (KeyboardInterrupt, DistributedError) as exc:
            failed = isinstance(exc, DistributedError)
            exc.result = partial_result(config, records.stop(), "failed" if failed else "interrupted",  # type: ignore[attr-defined]
                                        str(exc) if failed else None)
            raise
    records.stop()
    return _with_model(outs[0]["result"], outs[0]["model_state"], config, shipped)


def _predict_memory(config: TrainConfig, plan, options, local: bool) -> None:
    """Decide ``recompute="auto"`` of a pipeline (:func:`~gnnpipe.tasks.nodes.cost.memory_check.choose_recompute`; the
    choice is set on ``config`` and described in ``plan.info["recompute"]``). Put the memory model's per-rank prediction
    (bytes above the runtime floor) into ``plan.info`` (``predicted_mem_bytes``: printed with the plan, stored in the
    result's ``plan`` and beside ``peak_mem_bytes``). With ``local`` ranks (started here, sharing this machine's memory)
    and ``options.memory_check``, refuse the run when they cannot fit together
    (:func:`~gnnpipe.tasks.nodes.cost.memory_check.check_ranks_memory`). A model the memory model cannot profile gets a
    warning, not a failed run."""
    auto = config.stages > 1 and config.recompute is None
    try:
        prof = memory_profile(config, plan.data)
        model = make_model(config, plan.num_features, plan.num_classes)
        if auto:  # recompute="auto": the memory model decides, before the ranks see the config
            choice = choose_recompute(config, plan, model, prof)
            config.recompute = choice.on
            plan.info["recompute"] = dict(choice.to_dict(), why="auto: " + choice.why)
        plan.info["predicted_mem_bytes"] = [int(m.peak) for m in predict_memory(config, plan, model, prof)]
    except Exception as exc:  # noqa: BLE001 - a prediction must never stop a run
        if auto:
            config.recompute = False
            plan.info["recompute"] = {"on": False, "why": "auto: off (no memory prediction)"}
        warnings.warn(f"no memory prediction for this run ({type(exc).__name__}: {exc})", stacklevel=3)
        return
    if local and options.memory_check and config.device_type == "cpu":
        check_ranks_memory(plan.info["predicted_mem_bytes"])


def _with_model(result: TrainResult, state: dict, config: TrainConfig, plan) -> TrainResult:
    """``result`` with ``.model``: the single-process model assembled from the ranks' ``state``, its ``meta``
    the run's (:func:`~gnnpipe.core.run.checkpoint.run_meta`: ``gnnpipe predict`` finds the data with it)."""
    result.model = assemble_model(make_model(config, plan.num_features, plan.num_classes), state, config)
    result.model.meta = run_meta(config, len(result.epochs))
    return result


def _atomistic_models() -> list:
    """The registered models that predict energies and forces (those ``--gp-size`` splits)."""
    return sorted(n for n in models.available() if getattr(models.get(n), "task", None) == "s2ef") or ["schnet"]
