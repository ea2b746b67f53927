"""The Python API: compose components and train.

>>> from gnnpipe import api
>>> result = api.train(dataset=None, model="gcnii", layers=8, stages=2, chunks=8, epochs=5)  # doctest: +SKIP
>>> result.best_val_acc, result.epochs[-1]["bytes_layer"]                                     # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import attrs
import torch

from . import schedulers as _schedulers
from . import tasks
from .core.run import launch
from .core.run.checkpoint import check_checkpoint_dir, check_resume, read_meta
from .core.run.epochlog import tensorboard_writer
from .core.run.results import TrainResult
from .core.settings.config import TrainConfig
from .core.settings.options import RunOptions
from .costmodel.hardware import Hardware, load_hardware, local_hardware
from .errors import ConfigError
from .models import model_options
from .tasks.nodes import cost as nodes_cost
from .tasks.nodes import describe_run, load_data  # noqa: F401  (the node-classification task's; public here)
from .tasks.nodes.cost import Profile, plan_layouts
from .tasks.nodes.cost import predict as nodes_predict
from .tasks.nodes.cost.layouts import layout_config
from .tasks.s2ef import check_structures_for
from .tasks.s2ef import cost as A
from .tasks.s2ef.build import make_model


def _as_config(config: TrainConfig | None, overrides: dict) -> TrainConfig:
    if config is None:
        config = TrainConfig()
    if overrides:  # the config's converter parses a corrector string (correctors.parse_spec)
        if overrides.get("model", config.model) != config.model and "model_args" not in overrides:
            if config.model_args == {k: o.default for k, o in model_options(config.model).items()}:
                overrides["model_args"] = {}  # the old model's defaults (a resolved config): not the user's choice
        config = attrs.evolve(config, **overrides)
    return config


def plan(config: TrainConfig | None = None, *, ranks: int, hardware: Any = None, data=None,
         chunks_per_stage=(4,), over_partitions=(1, 4), schedulers=("gpipe", "1f1b"), profile_in=None,
         profile_out=None, progress: bool = True, contention: bool = True, **overrides: Any):
    """Profile the model on the graph here and predict every feasible layout of ``ranks`` ranks (cost model,
    :mod:`gnnpipe.costmodel`): epoch time, bytes per epoch, peak memory per rank.

    Args:
        config, overrides: as for :func:`train` (its ``ways``, ``stages``, ``chunks`` are ignored).
        ranks: ``R``. hardware: a :class:`~gnnpipe.costmodel.Hardware`, a TOML path or shipped name, or
            ``None`` (this machine with the measured link). data: optional PyG ``Data`` instead of the dataset.
        chunks_per_stage, over_partitions, schedulers: the candidates (see
            ``gnnpipe.tasks.nodes.cost.enumerate_layouts``).
        profile_in, profile_out: load / save the profile JSON (a loaded profile must have been taken for this
            model and graph: ``Profile.check_matches``).
        contention: let the profile measure how ranks computing at once on this machine's cores slow each other
            (``gnnpipe.tasks.nodes.cost.profile.measure_contention``; about doubles the units' part of the profile).
            ``False`` (``--no-contention``): skip it; the prediction then assumes none (docs/RESULTS.md, "Cost model").

    Returns:
        ``(predictions sorted best first — those that fit first, hardware, profile)``.

    Raises:
        ConfigError: bad ranks or hardware file; a ``profile_in`` that is missing, not a profile, or another job's;
            a ``profile_out`` that cannot be written (checked before profiling); no feasible layout.
    """
    config = _as_config(config, overrides)
    task = tasks.for_config(config)
    auto_recompute = config.recompute is None
    config = task.resolve(config)
    if auto_recompute and task.name != "s2ef":
        # "auto" resolves to off for the single process this config describes; each pipeline layout decides it as
        # its run will (gnnpipe.tasks.nodes.cost.predict.predict_layout)
        config = attrs.evolve(config, recompute=None)
    if task.name == "s2ef":
        return plan_s2ef(config, ranks=ranks, hardware=hardware, chunks_per_stage=chunks_per_stage,
                         schedulers=schedulers, profile_in=profile_in, profile_out=profile_out,
                         progress=progress)[:3]
    data = task.load(config, data)
    return _plan_prepared(config, data, ranks, hardware, chunks_per_stage, over_partitions, schedulers,
                          profile_in, profile_out, progress, contention)


def plan_s2ef(config: TrainConfig, *, ranks: int, hardware: Any = None, chunks_per_stage=(1, 4),
              schedulers=("gpipe", "1f1b"), profile_in=None, profile_out=None, progress: bool = True,
              params: float | None = None, projection_hidden: int | None = None, structures: str | None = None,
              stages: bool = True):
    """Rank the ``S × G × D`` layouts of ``ranks`` for an S2EF job (:mod:`gnnpipe.tasks.s2ef.cost`): step time,
    bytes per step, memory per rank, what fits ``hardware``.

    The job is one replica's batch of ``config.batch_size`` structures (the training split's first, or with
    ``structures="oc20-sized"`` generated OC20-sized slabs, :func:`~gnnpipe.tasks.s2ef.cost.oc20_sized_structures`)
    and ``config``'s model; the model is profiled on that batch here (one step's seconds and peak live bytes, and the
    link when ``G > 1`` layouts run on this machine). With ``params`` the prediction is for a model of that many
    parameters (:func:`~gnnpipe.tasks.s2ef.cost.size_for_params`, built on the ``meta`` device), from the
    profile of ``config``'s model (seconds per unit of work and the double-backward factor carry over).

    ``config.graph_parallel_group_size`` (``--gp-size G``) above 1 keeps the layouts with ``G`` graph-parallel
    ranks only (``G`` must divide ``ranks``). A ``profile_in`` must have been taken for this model, with this
    ``config``'s threads, dtype and force mode (a profile written before the force mode was recorded is not
    checked for it).

    Returns:
        ``(predictions best first, hardware, profile, predicted model's build arguments)``; the build arguments'
        ``"batch"`` holds the planned replica batch's ``structures``, ``atoms``, ``edges`` and ``triplets``.

    Raises:
        ConfigError: bad ranks, hardware, profile file or ``structures``; a model the cost model does not describe;
            a ``--gp-size`` that does not divide ``ranks``; a ``profile_in`` taken for another model, thread count,
            dtype or force mode; a cutoff whose graph cannot be built here
            (:func:`gnnpipe.data.atoms.estimate.check_graph_size`).
    """
    if ranks is None or isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be an integer >= 1 (--ranks R), got {ranks!r}")
    G = config.graph_parallel_group_size
    if ranks % G:
        raise ConfigError(f"--gp-size {G} does not divide --ranks {ranks}: every layout is S x G x D = {ranks} ranks; "
                          f"give a --gp-size among {', '.join(str(g) for g in range(1, ranks + 1) if ranks % g == 0)}, "
                          "or leave it out to rank every G")
    on_gpu = config.device_type == "cuda"  # --device cuda (or the default with a GPU): profiled on the GPU
    here = A.local_gpu_hardware if on_gpu else local_hardware
    hw = hardware if isinstance(hardware, Hardware) else (here() if hardware is None else load_hardware(hardware))
    hw.check_ranks(ranks)
    if profile_out:
        _check_writable(profile_out, "--profile-out")
    dtype = config.torch_dtype
    if structures in (None, "dataset"):
        data = tasks.get("s2ef")().load(config, None)
        batch_structs = [d for d in (data.structures[int(i)] for i in data.splits["train"][: config.batch_size])
                         if d is not None]  # a lazy set skipping malformed structures reads them as None
    elif structures == "oc20-sized":
        batch_structs = A.oc20_sized_structures(config.batch_size, seed=config.seed, dtype=dtype)
        check_structures_for(config, batch_structs)
    else:
        raise ConfigError(f"--plan-structures must be 'dataset' or 'oc20-sized', got {structures!r}")
    model = make_model(config)
    job_model, build = model, {"num_layers": config.layers, "hidden": config.hidden, **config.model_args}
    if params is not None:
        defaults = {k: o.default for k, o in model_options(config.model).items()}
        opts = {k: v for k, v in config.model_args.items()  # widths follow the projection's H unless set
                if not (k in ("int_emb_size", "out_emb_channels") and v == defaults.get(k))}
        opts.update(cutoff=config.cutoff, max_neighbors=config.max_neighbors, direct_forces=config.direct_forces)
        job_model, build = A.size_for_params(config.model, float(params), hidden=projection_hidden, **opts)
    build = {**build, "parameters": A.num_parameters(job_model)}
    job = A.AtomJob(job_model, batch_structs, config.cutoff, config.max_neighbors,
                    partitioner=config.graph_parallel_partitioner, mode=config.graph_parallel_mode,
                    element_size=torch.empty((), dtype=dtype).element_size(), ema=bool(config.ema_decay),
                    backend="nccl" if hw.kind == "gpu" else "gloo")
    if profile_in:
        try:
            prof = A.AtomProfile.from_dict(json.loads(Path(profile_in).read_text()))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the profile {str(profile_in)!r}: {exc}") from None
        if prof.model != config.model:
            raise ConfigError(f"the profile {str(profile_in)!r} was taken for {prof.model!r}, not {config.model!r}")
        if prof.device != ("cuda" if on_gpu else "cpu"):
            raise ConfigError(f"the profile {str(profile_in)!r} was taken on the {prof.device.upper()}, and this plan "
                              f"is for --device {'cuda' if on_gpu else 'cpu'}: profile again on this device (leave "
                              f"out --profile-in)")
        _check_atom_profile(prof, str(profile_in), config)
    else:
        if progress:
            print("gnnpipe: profiling the model's training step on the batch…", file=sys.stderr)
        torch.set_num_threads(config.threads)
        batch, graph = A.job_graph(attrs.evolve(job, model=model))
        link = hw.kind == "cpu" and (hw.intra is None) and ranks > 1 and not on_gpu
        prof = A.profile_step(model, batch, graph, link=link, name=config.model, device="cuda" if on_gpu else None,
                              amp=config.amp)
    if profile_out:
        Path(profile_out).write_text(json.dumps(prof.to_dict(), indent=1))
    preds = A.plan_atomistic(job, ranks, prof, hw, chunks_per_stage=chunks_per_stage, schedulers=schedulers,
                             stages=stages)
    if G > 1:
        preds = [p for p in preds if p.layout.gp == G]
    batch, graph = A.job_graph(job)
    build["batch"] = {"structures": len(batch_structs), "atoms": int(batch.num_nodes), "edges": graph.num_edges,
                      "triplets": graph.num_triplets}
    return preds, hw, prof, build


def _check_atom_profile(prof, name: str, config: TrainConfig) -> None:
    """Refuse an atomistic profile taken with other threads, dtype or force mode than ``config`` asks: its step
    time and memory would not apply (a profile without a recorded force mode is not checked for it).

    Raises:
        ConfigError: naming each difference and the fix.
    """
    b = torch.empty((), dtype=config.torch_dtype).element_size()
    names = {2: "16-bit", 4: "float32", 8: "float64"}
    forces = {True: "--direct-forces", False: "conservative forces"}
    diffs = []
    if prof.threads != config.threads:
        diffs.append(f"--threads {prof.threads} (this plan: --threads {config.threads})")
    if prof.element_size != b:
        diffs.append(f"{names.get(prof.element_size, f'{prof.element_size}-byte')} values (this plan: --dtype "
                     f"{config.dtype})")
    if prof.direct_forces is not None and bool(prof.direct_forces) != bool(config.direct_forces):
        diffs.append(f"{forces[bool(prof.direct_forces)]} (this plan: {forces[bool(config.direct_forces)]})")
    if diffs:
        raise ConfigError(f"the profile {name!r} was taken with {'; '.join(diffs)}: its step time and memory do not "
                          "apply to this plan; profile again (leave out --profile-in, or write a new profile with "
                          "--profile-out)")


def _plan_prepared(config, data, ranks, hardware, chunks_per_stage=(4,), over_partitions=(1, 4),
                   schedulers=("gpipe", "1f1b"), profile_in=None, profile_out=None, progress=True, contention=True):
    if ranks is None or isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be an integer >= 1 (--ranks R), got {ranks!r}")

    for name in schedulers:  # before minutes of profiling, not after
        if isinstance(name, str):
            _schedulers.get(name)
    if hardware is None:
        hw = local_hardware()
    elif isinstance(hardware, Hardware):
        hw = hardware
    else:
        hw = load_hardware(hardware)
    hw.check_ranks(ranks)
    if profile_out:
        _check_writable(profile_out, "--profile-out")  # before profiling, not after
    if profile_in:
        prof = Profile.load(profile_in)
        prof.check_matches(config, data)
    else:
        if progress:
            print("gnnpipe: profiling the model on this graph (unit chunk costs, activations, link)…", file=sys.stderr)
        # more ranks than this machine's cores: the probe also measures what a wait costs when they share them
        prof = nodes_cost.profile(config, data, verbose=progress, ranks=ranks if hw.kind == "cpu" else None,
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
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a directory; give the JSON file to write")
    parent = target.resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ConfigError(f"{what} {str(path)!r} cannot be written (its folder is missing or not writable); "
                          f"pick another path")


_OPTION_FIELDS = {"keep", "log_every", "log_csv", "tensorboard", "checkpoint_dir", "checkpoint_every", "resume",
                  "memory_check", "checkpoint_every_steps", "log_every_steps"}


def train(config: TrainConfig | None = None, *, data=None, progress: bool = True, options=None,
          layout: str | None = None, ranks: int | None = None, hardware: Any = None,
          plan_options: dict | None = None,
          **overrides: Any) -> TrainResult | None:
    """Train as configured and return a :class:`~gnnpipe.core.run.results.TrainResult`.

    ``ways == stages == 1`` (and at most one chunk) trains exactly in this process; otherwise
    ``ways × stages`` ranks run: local processes started here, or — when this process was started by
    ``torchrun`` — the ranks torchrun started (then only rank 0 returns the result; others return ``None``).
    ``result.model`` is the trained single-process model (``gnnpipe.core.run.state``).

    Structures (a ``dataset`` that is a structure file or ``oc20-like`` / ``md17-like`` / ``bulk-like``, or an
    atomistic ``model`` such as ``schnet``, ``dimenet++``) train energies and forces (S2EF, ``gnnpipe.tasks.s2ef``;
    and stresses with ``stress_coef``): ``data`` may
    then be a list of structures (PyG ``Data`` or ``ase.Atoms``), and ``replicas`` is the number of data-parallel
    replicas.

    Args:
        config: a :class:`TrainConfig` (default: all defaults); keyword ``overrides`` replace its fields.
        data: an optional PyG ``Data`` to train on instead of ``config.dataset``.
        progress: show a progress bar on a terminal, and (unless ``log_every`` is given) epoch lines elsewhere.
        options: a ``gnnpipe.core.settings.options.RunOptions``; its fields (``keep``, ``log_every``,
            ``log_csv``, ``tensorboard``, ``checkpoint_dir``, ``checkpoint_every``, ``resume``) may also be
            keywords.
        layout: ``None``/``"manual"`` (use ``ways``/``stages``/``chunks`` as configured) or ``"auto"``: profile,
            predict every layout of ``ranks`` ranks (:func:`plan`), print the ranking and train the best that fits
            (the ranking and the choice are stored in ``result.extra["layout_auto"]``).
        ranks: ``R`` for ``layout="auto"``. hardware: for ``layout="auto"`` (see :func:`plan`).
        plan_options: for ``layout="auto"``, more keywords of :func:`plan` (``chunks_per_stage``,
            ``over_partitions``, ``schedulers``, ``profile_in``, ``profile_out``, ``contention``).

    Every mode checks the same things first: component names (``gnnpipe.core.settings.config.check_names``;
    also those the mode does not use), then the data (``gnnpipe.tasks.nodes.trainer.prepare_data``). Options
    the mode ignores are named in a warning when they differ from their defaults.

    Raises:
        ConfigError: also a single-process run the memory model predicts cannot fit in the memory available
            here (``gnnpipe.tasks.nodes.cost.memory_check.check_single_process_memory``; ``memory_check=False`` or
            ``--no-memory-check`` tries anyway), before anything is allocated.
        ConfigError, UnknownComponentError, DataValidationError: before any process starts (under
            ``torchrun``: also when it started a number of ranks other than ``ways × stages``, raised in
            every rank before the process group starts).
        ScheduleError: the scheduler builds an invalid schedule (the problems and its picture), before any
            process starts.
        DistributedError: a rank failed (all ranks are stopped; the message names it).
        KeyboardInterrupt: SIGINT/SIGTERM. Both (and failures during training) carry ``.result``: the
            :class:`TrainResult` of the completed epochs with ``status`` ``"interrupted"`` / ``"failed"``.
    """
    options = _run_options(options, progress, overrides)
    config = _as_config(config, overrides)
    task = tasks.for_config(config)                   # which kind of work: its data, models, loss, plan
    auto_recompute = config.recompute is None
    config = task.resolve(config)                     # names checked (all of them), defaults filled in
    _check_layout(layout)
    if layout == "auto" and auto_recompute and task.name != "s2ef":
        config = attrs.evolve(config, recompute=None)  # each layout decides it, as in gnnpipe plan
    nodes = task.name == "node-classification"        # the cost model's layouts and layout changes: node work
    if layout == "auto" and not nodes:
        raise ConfigError(f"--layout auto ranks node-classification layouts; {task.name} takes --ways / --gp-size")
    if layout != "auto" and nodes:
        launch.check_torchrun_world(config.world_size, f"--ways {config.ways} × --stages {config.stages}")
        _check_resume(config, options)  # refuse a changed configuration before loading data or starting ranks
    given = data is not None
    data = task.load(config, data)                    # read or take, validate, preprocess
    auto = None
    if layout == "auto":                              # the cost model picks ways × stages
        config, auto = _auto_layout(config, data, ranks, hardware, progress, plan_options or {})
        launch.check_torchrun_world(config.world_size, f"the layout --layout auto picked ({config.ways} × "
                                    f"{config.stages})")
        _check_resume(config, options)
    # the header whenever the run reports anything: a progress bar or epoch lines (logged runs, --no-progress,
    # need it most); torchrun: rank 0 only
    if (progress or options.log_every != 0) and os.environ.get("RANK", "0") == "0":
        print(task.describe(config, data, given), file=sys.stderr)
    plan = task.plan(config, data)                    # one process, or the ranks and what each holds
    if auto is not None and getattr(plan, "run", None) is not None:  # bounds the ranks' wait limit (launch.wait_limit)
        plan.run.info["predicted_epoch_s"] = auto["chosen"]["predicted_epoch_s"]
    task.check(config, plan, options)                 # ignored options, schedule, memory: before any rank starts
    result = task.launch(config, plan, progress, options)  # run here or start the ranks; rank 0's result
    return _collect(result, auto, given)


def _run_options(options, progress: bool, overrides: dict):
    """The run's ``RunOptions``: ``options`` with the option keywords popped from
    ``overrides``; without ``options`` and ``progress``, no epoch lines unless ``log_every`` is given."""
    opt_kw = {k: overrides.pop(k) for k in list(overrides) if k in _OPTION_FIELDS}
    if options is None:
        if not progress and "log_every" not in opt_kw:
            opt_kw["log_every"] = 0
        options = RunOptions(**opt_kw)
    elif opt_kw:
        options = attrs.evolve(options, **opt_kw)
    if options.tensorboard:
        tensorboard_writer()  # a missing package is refused before any data is read or file written
    return options


def _check_layout(layout) -> None:
    if layout not in (None, "manual", "auto"):
        raise ConfigError(f"unknown layout {layout!r}; use 'auto' (cost model) or 'manual' (--ways/--stages)")


def _collect(result: TrainResult | None, auto: dict | None, given: bool) -> TrainResult | None:
    """``result`` with ``extra["layout_auto"]`` (the ranking and the choice of ``layout="auto"``); a model trained
    on a given graph marked so (its config's dataset fields describe no graph: ``gnnpipe predict`` must be
    given one, not guess one). ``None`` (a ``torchrun`` rank other than 0) stays ``None``."""
    if result is not None and auto is not None:
        result.extra["layout_auto"] = auto
    if result is not None and given and getattr(result, "model", None) is not None:
        result.model.meta = dict(getattr(result.model, "meta", None) or {}, data_paths={}, data_given=True)
    return result


def _check_resume(config: TrainConfig, options) -> None:
    """Warn when ``options.resume`` names a checkpoint of another layout
    (:func:`~gnnpipe.core.run.checkpoint.check_resume`); refuse a ``checkpoint_dir`` with checkpoints this run would
    not continue (:func:`~gnnpipe.core.run.checkpoint.check_checkpoint_dir`)."""
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
    preds, hw, _ = _plan_prepared(config, data, ranks, hardware, progress=progress, **options)
    print(nodes_predict.format_ranking(preds, hw), file=sys.stderr)
    best = next((p for p in preds if p.fits), None)
    if best is None:
        raise ConfigError(f"no layout of {ranks} rank(s) fits the memory of {hw.name}; use more ranks, a smaller "
                          f"model, --recompute, or --hardware with more memory")
    if not math.isfinite(best.epoch_s):
        raise ConfigError(f"the cost model predicts no finite epoch time on {hw.name} (its fastest layout: "
                          f"{best.epoch_s} s); check the hardware description's link and device values")
    s = best.spec
    print(f"gnnpipe: --layout auto picked {s.label()}, {s.chunks} chunk(s), over-partition {s.over_partition}"
          f"{', ' + s.scheduler if s.stages > 1 else ''} (predicted {1000 * best.epoch_s:,.1f} ms/epoch)",
          file=sys.stderr)
    return layout_config(config, s), {"chosen": best.to_record(), "ranking": [p.to_record() for p in preds]}


def predict(model, data, *, preprocess: bool = True):
    """Class scores of every vertex of ``data`` by a trained model (``result.model`` or
    :func:`gnnpipe.models.load`), in ``data``'s vertex order: :meth:`gnnpipe.models.GNNModel.predict`.

    Returns:
        ``[N, C]`` float logits.
    """
    return model.predict(data, preprocess=preprocess)

__all__ = [
    "TrainConfig",
    "TrainResult",
    "describe_run",
    "load_data",
    "plan",
    "predict",
    "train"
]
