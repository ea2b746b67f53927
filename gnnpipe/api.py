"""The Python API: compose components and train.

>>> from gnnpipe import api
>>> result = api.train(dataset=None, model="gcnii", layers=8, stages=2, chunks=8, epochs=5)  # doctest: +SKIP
>>> result.best_val_acc, result.epochs[-1]["bytes_layer"]                                     # doctest: +SKIP
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Optional

import attrs

from .core.config import TrainConfig, check_names, ignored_options
from .core.results import TrainResult
from .core.trainer import SingleProcessTrainer, prepare_data, resolve_config


def load_data(config: TrainConfig):
    """Load and prepare (validate + preprocess, optionally row-normalise features) the configured dataset
    (DESIGN §4 steps 1–2; :func:`~gnnpipe.core.trainer.prepare_data`).

    Raises:
        ConfigError: unknown dataset, missing files. DataValidationError: a malformed graph (checked on the
            values as stored, before any conversion).
    """
    from .data import load_dataset

    raw = load_dataset(config.dataset, config.root, split=config.split, seed=config.seed,
                       **({"num_nodes": config.num_nodes, "avg_degree": config.avg_degree,
                           "num_classes": config.num_classes, "num_features": config.num_features}
                          if config.dataset in (None, "synthetic") else {}))
    return prepare_data(raw, config)


def _as_config(config: Optional[TrainConfig], overrides: dict) -> TrainConfig:
    if config is None:
        config = TrainConfig()
    if overrides:  # the config's converter parses a corrector string (correctors.parse_spec)
        if overrides.get("model", config.model) != config.model and "model_args" not in overrides:
            from .models import model_options

            if config.model_args == {k: o.default for k, o in model_options(config.model).items()}:
                overrides["model_args"] = {}  # the old model's defaults (a resolved config): not the user's choice
        config = attrs.evolve(config, **overrides)
    return config


def train(config: Optional[TrainConfig] = None, *, data=None, progress: bool = True, **overrides: Any) -> Optional[TrainResult]:
    """Train as configured and return a :class:`~gnnpipe.core.results.TrainResult`.

    ``ways == stages == 1`` (and at most one chunk) trains exactly in this process; otherwise
    ``ways × stages`` ranks run: local processes started here, or — when this process was started by
    ``torchrun`` — the ranks torchrun started (then only rank 0 returns the result; others return ``None``).

    Args:
        config: a :class:`TrainConfig` (default: all defaults); keyword ``overrides`` replace its fields.
        data: an optional PyG ``Data`` to train on instead of ``config.dataset``.
        progress: show a progress bar.

    Every mode checks the same things first: component names (:func:`~gnnpipe.core.config.check_names`;
    also those the mode does not use), then the data (:func:`~gnnpipe.core.trainer.prepare_data`). Options
    the mode ignores are named in a warning when they differ from their defaults.

    Raises:
        ConfigError / UnknownComponentError / DataValidationError: before any process starts (under
            ``torchrun``: also when it started a number of ranks other than ``ways × stages``, raised in
            every rank before the process group starts).
        ScheduleError: the scheduler builds an invalid schedule (the problems and its picture), before any
            process starts.
        DistributedError: a rank failed (all ranks are stopped; the message names it).
    """
    from .core import launch
    from .core.runner import build_plan, check_schedule, choose_backend, file_backed, format_plan, share_profiled_split, worker

    config = _as_config(config, overrides)
    check_names(config)
    config = resolve_config(config)
    launch.check_torchrun_world(config.world_size, f"--ways {config.ways} × --stages {config.stages}")
    data = load_data(config) if data is None else prepare_data(data, config)
    if config.world_size == 1 and (config.chunks or 1) == 1:
        import torch

        ignored = ignored_options(config)
        if ignored:
            warnings.warn("ignored: " + "; ".join(ignored), stacklevel=2)
        torch.set_num_threads(config.threads)
        return SingleProcessTrainer(data, config, prepared=True).fit(progress=progress)
    plan = build_plan(config, data)
    check_schedule(config, plan)  # an invalid (custom) schedule fails here, before any rank starts
    if launch.under_torchrun():
        rank, world = launch.init_env_process_group(choose_backend(config), config.timeout_s)
        import torch.distributed as dist

        share_profiled_split(config, plan)
        if rank == 0:
            print(format_plan(plan.info), file=sys.stderr)

        import tempfile

        with tempfile.TemporaryDirectory(prefix="gnnpipe-rank-") as folder:
            # each rank partitioned the graph itself (deterministic); it keeps only the slices its role reads
            own = file_backed(plan, folder)
            del data, plan
            out = worker(rank, world, config, own, progress)
        dist.barrier()
        dist.destroy_process_group()  # a live gloo group at interpreter exit aborts the process
        return out["result"] if out else None
    print(format_plan(plan.info), file=sys.stderr)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gnnpipe-run-") as folder:
        # the graph is written once; every rank memory-maps it and reads only the slices its role needs
        shipped = file_backed(plan, folder)
        del data, plan
        outs = launch.spawn(worker, config.world_size, (config, shipped, progress), backend=choose_backend(config),
                            timeout_s=config.timeout_s, threads=config.threads)
    return outs[0]["result"]
