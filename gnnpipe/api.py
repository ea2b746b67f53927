"""The Python API: compose components and train.

>>> from gnnpipe import api
>>> result = api.train(dataset=None, model="gcnii", layers=8, stages=2, chunks=8, epochs=5)  # doctest: +SKIP
>>> result.best_val_acc, result.epochs[-1]["bytes_layer"]                                     # doctest: +SKIP
"""

from __future__ import annotations

import os
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

    raw = load_dataset(config.dataset, config.root, split=config.split, seed=config.seed, dtype=config.torch_dtype,
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


def plan(config: Optional[TrainConfig] = None, *, ranks: int, hardware: Any = None, data=None,
         chunks_per_stage=(4,), over_partitions=(1, 4), schedulers=("gpipe", "1f1b"), profile_in=None,
         profile_out=None, progress: bool = True, contention: bool = True, **overrides: Any):
    """Profile the model on the graph here and predict every feasible layout of ``ranks`` ranks (cost model,
    :mod:`gnnpipe.costmodel`): epoch time, bytes per epoch, peak memory per rank.

    Args:
        config / overrides: as for :func:`train` (its ``ways``, ``stages``, ``chunks`` are ignored).
        ranks: ``R``. hardware: a :class:`~gnnpipe.costmodel.Hardware`, a TOML path or shipped name, or
            ``None`` (this machine with the measured link). data: optional PyG ``Data`` instead of the dataset.
        chunks_per_stage, over_partitions, schedulers: the candidates (see
            :func:`gnnpipe.costmodel.enumerate_layouts`).
        profile_in / profile_out: load / save the profile JSON (a loaded profile must have been taken for this
            model and graph: :meth:`~gnnpipe.costmodel.Profile.check_matches`).
        contention: let the profile measure how ranks computing at once on this machine's cores slow each other
            (:func:`gnnpipe.costmodel.profile.measure_contention`; about doubles the units' part of the profile).
            ``False`` (``--no-contention``): skip it; the prediction then assumes none (docs/RESULTS.md §14i).

    Returns:
        ``(predictions sorted best first — those that fit first, hardware, profile)``.

    Raises:
        ConfigError: bad ranks or hardware file; a ``profile_in`` that is missing, not a profile, or another job's;
        a ``profile_out`` that cannot be written (checked before profiling); no feasible layout.
    """
    config = _as_config(config, overrides)
    check_names(config)
    config = resolve_config(config)
    given = data is not None
    data = load_data(config) if data is None else prepare_data(data, config)
    return _plan_prepared(config, data, ranks, hardware, chunks_per_stage, over_partitions, schedulers,
                          profile_in, profile_out, progress, contention)


def _plan_prepared(config, data, ranks, hardware, chunks_per_stage=(4,), over_partitions=(1, 4),
                   schedulers=("gpipe", "1f1b"), profile_in=None, profile_out=None, progress=True, contention=True):
    from .costmodel import Profile, load_hardware, plan_layouts, profile
    from .costmodel.hardware import Hardware, local_hardware
    from .errors import ConfigError

    if ranks is None or isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be an integer >= 1 (--ranks R), got {ranks!r}")
    from . import schedulers as _schedulers

    for name in schedulers:  # before minutes of profiling, not after
        if isinstance(name, str):
            _schedulers.get(name)
    if hardware is None:
        hw = local_hardware()
    elif isinstance(hardware, Hardware):
        hw = hardware
    else:
        hw = load_hardware(hardware)
    if profile_out:
        _check_writable(profile_out, "--profile-out")  # before profiling, not after
    if profile_in:
        prof = Profile.load(profile_in)
        prof.check_matches(config, data)
    else:
        if progress:
            print("gnnpipe: profiling the model on this graph (unit chunk costs, activations, link)…", file=sys.stderr)
        # more ranks than this machine's cores: the probe also measures what a wait costs when they share them
        prof = profile(config, data, verbose=progress, ranks=ranks if hw.kind == "cpu" else None,
                       contention=contention)
    if profile_out:
        try:
            prof.save(profile_out)
        except OSError as exc:
            raise ConfigError(f"cannot write the profile to {str(profile_out)!r}: {exc.strerror}") from None
    preds = plan_layouts(config, data, ranks, prof, hw, chunks_per_stage=chunks_per_stage,
                         over_partitions=over_partitions, schedulers=schedulers)
    return preds, hw, prof


def _check_writable(path, what: str) -> None:
    """``ConfigError`` unless ``path`` names a file whose folder exists and is writable (``what``: the argument)."""
    from pathlib import Path

    from .errors import ConfigError

    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a directory; give the JSON file to write")
    parent = target.resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ConfigError(f"{what} {str(path)!r} cannot be written (its folder is missing or not writable); "
                          f"pick another path")


_OPTION_FIELDS = {"keep", "log_every", "log_csv", "tensorboard", "checkpoint_dir", "checkpoint_every", "resume",
                  "memory_check"}


def describe_run(config: TrainConfig, data, given: bool = False) -> str:
    """The line a run starts with: what is trained (dataset and its size, model, layout); ``given``: the graph
    was passed as ``data`` (not loaded from ``config.dataset`` or generated)."""
    name = "the given graph" if given else (config.dataset or "synthetic")
    n, e = int(data.num_nodes), int(data.edge_index.size(1))
    from .core.runner import num_classes_of

    s = (f"training {config.model} (L={config.layers}, hidden {config.hidden}) on {name} "
         f"(N={n:,}, E={e:,}, F={int(data.x.size(1))}, {num_classes_of(data)} classes) for {config.epochs} epoch{'s' if config.epochs != 1 else ''}; ")
    W, S = config.ways, config.stages
    if W == 1 and S == 1:
        s += "single process"
    elif S == 1:
        s += f"graph parallel over {W} ways"
    else:
        from .core.runner import default_chunks

        s += (f"{'hybrid ' + str(W) + ' ways x ' if W > 1 else 'pipeline '}{S} stages, "
              f"{default_chunks(config)} chunks, scheduler {config.scheduler}"
              f"{' (stashed weights)' if config.stash_weights else ''}, "
              f"correctors {','.join(map(str, config.correctors)) or 'none'}")
    return s


def train(config: Optional[TrainConfig] = None, *, data=None, progress: bool = True, options=None,
          layout: Optional[str] = None, ranks: Optional[int] = None, hardware: Any = None,
          plan_options: Optional[dict] = None,
          **overrides: Any) -> Optional[TrainResult]:
    """Train as configured and return a :class:`~gnnpipe.core.results.TrainResult`.

    ``ways == stages == 1`` (and at most one chunk) trains exactly in this process; otherwise
    ``ways × stages`` ranks run: local processes started here, or — when this process was started by
    ``torchrun`` — the ranks torchrun started (then only rank 0 returns the result; others return ``None``).
    ``result.model`` is the trained single-process model (:mod:`gnnpipe.core.assemble`).

    Structures (a ``dataset`` that is a structure file or ``oc20-like`` / ``md17-like``, or an atomistic ``model``
    such as ``schnet``, ``dimenet++``) train energies and forces (S2EF, :mod:`gnnpipe.tasks.s2ef`): ``data`` may
    then be a list of structures (PyG ``Data`` or ``ase.Atoms``), and ``ways`` is the number of data-parallel
    replicas.

    Args:
        config: a :class:`TrainConfig` (default: all defaults); keyword ``overrides`` replace its fields.
        data: an optional PyG ``Data`` to train on instead of ``config.dataset``.
        progress: show a progress bar on a terminal, and (unless ``log_every`` is given) epoch lines elsewhere.
        options: a :class:`~gnnpipe.core.options.RunOptions`; its fields (``keep``, ``log_every``, ``log_csv``,
            ``tensorboard``, ``checkpoint_dir``, ``checkpoint_every``, ``resume``) may also be keywords.
        layout: ``None``/``"manual"`` (use ``ways``/``stages``/``chunks`` as configured) or ``"auto"``: profile,
            predict every layout of ``ranks`` ranks (:func:`plan`), print the ranking and train the best that fits
            (the ranking and the choice are stored in ``result.extra["layout_auto"]``).
        ranks: ``R`` for ``layout="auto"``. hardware: for ``layout="auto"`` (see :func:`plan`).
        plan_options: for ``layout="auto"``, more keywords of :func:`plan` (``chunks_per_stage``,
            ``over_partitions``, ``schedulers``, ``profile_in``, ``profile_out``, ``contention``).

    Every mode checks the same things first: component names (:func:`~gnnpipe.core.config.check_names`;
    also those the mode does not use), then the data (:func:`~gnnpipe.core.trainer.prepare_data`). Options
    the mode ignores are named in a warning when they differ from their defaults.

    Raises:
        ConfigError: also a single-process run the memory model predicts cannot fit in the memory available
            here (:func:`~gnnpipe.costmodel.predict.check_single_process_memory`; ``memory_check=False`` or
            ``--no-memory-check`` tries anyway), before anything is allocated.
        ConfigError / UnknownComponentError / DataValidationError: before any process starts (under
            ``torchrun``: also when it started a number of ranks other than ``ways × stages``, raised in
            every rank before the process group starts).
        ScheduleError: the scheduler builds an invalid schedule (the problems and its picture), before any
            process starts.
        DistributedError: a rank failed (all ranks are stopped; the message names it).
        KeyboardInterrupt: SIGINT/SIGTERM. Both (and failures during training) carry ``.result``: the
            :class:`TrainResult` of the completed epochs with ``status`` ``"interrupted"`` / ``"failed"``.
    """
    from .core import launch
    from .core.options import RunOptions

    opt_kw = {k: overrides.pop(k) for k in list(overrides) if k in _OPTION_FIELDS}
    if options is None:
        if not progress and "log_every" not in opt_kw:
            opt_kw["log_every"] = 0
        options = RunOptions(**opt_kw)
    elif opt_kw:
        options = attrs.evolve(options, **opt_kw)
    config = _as_config(config, overrides)
    from .tasks import s2ef

    if s2ef.S2EF.claims(config):  # structures → energy and forces: the steps of gnnpipe.tasks.Task
        return _train_task(s2ef.S2EF(), config, data, progress, options)
    if config.graph_parallel_group_size != 1:
        from .errors import ConfigError

        raise ConfigError(f"--gp-size splits atomistic structures' graphs (S2EF models); --model {config.model} "
                          f"cannot be graph-parallel that way: use --ways W (vertex-partitioned graph parallelism)")
    check_names(config)
    config = resolve_config(config)
    if layout not in (None, "manual", "auto"):
        from .errors import ConfigError

        raise ConfigError(f"unknown layout {layout!r}; use 'auto' (cost model) or 'manual' (--ways/--stages)")
    if layout != "auto":
        launch.check_torchrun_world(config.world_size, f"--ways {config.ways} × --stages {config.stages}")
        _check_resume(config, options)  # refuse a changed configuration before loading data or starting ranks
    given = data is not None
    data = load_data(config) if data is None else prepare_data(data, config)
    auto = None
    if layout == "auto":
        config, auto = _auto_layout(config, data, ranks, hardware, progress, plan_options or {})
        launch.check_torchrun_world(config.world_size, f"the layout --layout auto picked ({config.ways} × "
                                    f"{config.stages})")
        _check_resume(config, options)
    if progress and os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 only
        print(describe_run(config, data, given), file=sys.stderr)
    result = _train_prepared(config, data, progress, options)
    if result is not None and auto is not None:
        result.extra["layout_auto"] = auto
    if result is not None and given and getattr(result, "model", None) is not None:
        # its config's dataset fields describe no graph: `gnnpipe predict` must be given one, not guess one
        result.model.meta = dict(getattr(result.model, "meta", None) or {}, data_paths={}, data_given=True)
    return result


def _train_task(task, config, data, progress, options):
    """The steps of a :class:`~gnnpipe.tasks.Task`: resolve, load, plan, check, launch."""
    given = data is not None
    config = task.resolve(config)
    data = task.load(config, data)
    plan = task.plan(config, data)
    task.check(config, plan)
    if progress and os.environ.get("RANK", "0") == "0":
        print(task.describe(config, data, given), file=sys.stderr)
    return task.launch(config, plan, progress, options)


def _check_resume(config: TrainConfig, options) -> None:
    """Warn when ``options.resume`` names a checkpoint of another layout
    (:func:`~gnnpipe.core.checkpoint.check_resume`); refuse a ``checkpoint_dir`` with checkpoints this run would
    not continue (:func:`~gnnpipe.core.checkpoint.check_checkpoint_dir`)."""
    from .core.checkpoint import check_checkpoint_dir, check_resume, read_meta

    meta = read_meta(options.resume) if options.resume else None
    check_checkpoint_dir(options.checkpoint_dir, meta["epochs"] if meta else 0)
    if meta is None:
        return
    changed = check_resume(config, meta)
    if changed:
        warnings.warn(f"resuming {options.resume} in another layout ({', '.join(changed)} changed): weights, "
                      f"optimizer state and the epoch records carry over; history, corrector state and random "
                      f"states restart, so the continuation is not bit-identical to an uninterrupted run",
                      stacklevel=3)


def _auto_layout(config, data, ranks, hardware, progress, options):
    """Plan, print the ranking, pick the best layout that fits; returns ``(config, record)``."""
    from .costmodel.predict import format_ranking, layout_config
    from .errors import ConfigError

    preds, hw, _ = _plan_prepared(config, data, ranks, hardware, progress=progress, **options)
    print(format_ranking(preds, hw), file=sys.stderr)
    best = next((p for p in preds if p.fits), None)
    if best is None:
        raise ConfigError(f"no layout of {ranks} rank(s) fits the memory of {hw.name}; use more ranks, a smaller "
                          f"model, --recompute, or --hardware with more memory")
    s = best.spec
    print(f"gnnpipe: --layout auto picked {s.label()}, {s.chunks} chunk(s), over-partition {s.over_partition}"
          f"{', ' + s.scheduler if s.stages > 1 else ''} (predicted {1000 * best.epoch_s:,.1f} ms/epoch)",
          file=sys.stderr)
    return layout_config(config, s), {"chosen": best.to_record(), "ranking": [p.to_record() for p in preds]}


def _train_prepared(config, data, progress, options):
    from .core import launch
    from .core.runner import build_plan, check_schedule, file_backed, format_plan, share_profiled_split, worker

    if config.world_size == 1 and (config.chunks or 1) == 1:
        import torch

        ignored = ignored_options(config)
        if ignored:
            warnings.warn("ignored: " + "; ".join(ignored), stacklevel=3)
        torch.set_num_threads(config.threads)
        if options.memory_check:
            from .costmodel.predict import check_single_process_memory

            predicted = check_single_process_memory(config, data)  # ConfigError before any allocation
        else:
            predicted = None
        result = SingleProcessTrainer(data, config, prepared=True).fit(progress=progress, options=options)
        if predicted is not None:  # profiled (a large job): the prediction beside the measured peak
            result.extra["predicted_mem_bytes"] = [int(predicted.peak)]
        return result
    plan = build_plan(config, data)
    check_schedule(config, plan)  # an invalid (custom) schedule fails here, before any rank starts
    _predict_memory(config, plan, options, local=not launch.under_torchrun())
    if launch.under_torchrun():
        rank, world = launch.init_env_process_group(plan.info["backend"], config.timeout_s)
        import torch.distributed as dist

        share_profiled_split(config, plan)
        if rank == 0:
            print(format_plan(plan.info), file=sys.stderr)

        import tempfile

        with tempfile.TemporaryDirectory(prefix="gnnpipe-rank-") as folder:
            # each rank partitioned the graph itself (deterministic); it keeps only the slices its role reads
            own = file_backed(plan, folder)
            del data, plan
            out = worker(rank, world, config, own, progress, None, options)
        dist.barrier()
        dist.destroy_process_group()  # a live gloo group at interpreter exit aborts the process
        return _with_model(out["result"], out["model_state"], config, own) if out else None
    print(format_plan(plan.info), file=sys.stderr)
    import tempfile

    from .core.session import RecordCollector, partial_result
    from .errors import DistributedError

    records = RecordCollector().start()
    with tempfile.TemporaryDirectory(prefix="gnnpipe-run-") as folder:
        # the graph is written once; every rank memory-maps it and reads only the slices its role needs
        shipped = file_backed(plan, folder)
        del data, plan
        try:
            outs = launch.spawn(worker, config.world_size, (config, shipped, progress, None, options, records.send_end),
                                backend=shipped.info["backend"], timeout_s=config.timeout_s, threads=config.threads,
                                graceful=True)
        except (KeyboardInterrupt, DistributedError) as exc:
            failed = isinstance(exc, DistributedError)
            exc.result = partial_result(config, records.stop(), "failed" if failed else "interrupted",  # type: ignore[attr-defined]
                                        str(exc) if failed else None)
            raise
    records.stop()
    return _with_model(outs[0]["result"], outs[0]["model_state"], config, shipped)


def _predict_memory(config: TrainConfig, plan, options, local: bool) -> None:
    """Put the memory model's per-rank prediction (bytes above the runtime floor) into ``plan.info``
    (``predicted_mem_bytes``: printed with the plan, stored in the result's ``plan`` and beside
    ``peak_mem_bytes``). With ``local`` ranks (started here, sharing this machine's memory) and
    ``options.memory_check``, refuse the run when they cannot fit together
    (:func:`~gnnpipe.costmodel.predict.check_ranks_memory`). A model the memory model cannot profile gets a
    warning, not a failed run."""
    from .core.trainer import make_model
    from .costmodel.predict import check_ranks_memory, predict_memory
    from .costmodel.profile import memory_profile

    try:
        prof = memory_profile(config, plan.data)
        model = make_model(config, plan.num_features, plan.num_classes)
        plan.info["predicted_mem_bytes"] = [int(m.peak) for m in predict_memory(config, plan, model, prof)]
    except Exception as exc:  # noqa: BLE001 - a prediction must never stop a run
        warnings.warn(f"no memory prediction for this run ({type(exc).__name__}: {exc})", stacklevel=3)
        return
    if local and options.memory_check and config.device_type == "cpu":
        check_ranks_memory(plan.info["predicted_mem_bytes"])


def _with_model(result: TrainResult, state: dict, config: TrainConfig, plan) -> TrainResult:
    from .core.assemble import assemble_model
    from .core.trainer import make_model

    from .core.checkpoint import run_meta

    result.model = assemble_model(make_model(config, plan.num_features, plan.num_classes), state, config)
    result.model.meta = run_meta(config, len(result.epochs))  # saved with it: `gnnpipe predict` finds the data
    return result


def predict(model, data, *, preprocess: bool = True):
    """Class scores of every vertex of ``data`` by a trained model (``result.model`` or
    :func:`gnnpipe.models.load`), in ``data``'s vertex order: :meth:`gnnpipe.models.GNNModel.predict`.

    Returns:
        ``[N, C]`` float logits.
    """
    return model.predict(data, preprocess=preprocess)
