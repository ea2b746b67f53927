"""The ``s2ef`` kind of work: structure → energy and forces (OC20's S2EF task, Chanussot et al. 2021), trained in a
single process, data-parallel over ``--replicas D`` ranks, graph-parallel over ``--gp-size G`` ranks per replica
(``D × G`` ranks), and pipelined over ``--stages S`` with ``--chunks C`` micro-batches of structures
(``D × S × G`` ranks), all by one trainer (:mod:`~gnnpipe.tasks.s2ef.trainer`; the layouts:
:mod:`~gnnpipe.tasks.s2ef.layout`).

``gnnpipe train --dataset FILE.extxyz --model dimenet++`` (or no ``--dataset``: a generated OC20-like set) runs
the steps of :class:`~gnnpipe.tasks.base.Task`: :meth:`S2EF.resolve` (the model must be atomistic; its
hyper-parameters and options filled in), :meth:`S2EF.load` (structures read or generated, validated in the
training dtype, split 80/10/10, the energy reference fitted on the training split), :meth:`S2EF.plan`,
:meth:`S2EF.check`, :meth:`S2EF.launch` (this process, ``D`` ranks started here, or the ranks of ``torchrun``).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from ase.data import chemical_symbols

from ... import models
from ...core.run import launch
from ...core.run.checkpoint import check_checkpoint_dir, check_resume, read_meta
from ...core.run.session import RecordCollector, partial_result
from ...core.settings.options import RunOptions
from ...costmodel.hardware import available_memory_bytes
from ...data.atoms import from_atoms
from ...data.atoms.estimate import check_graph_size
from ...data.atoms.sets import prepare_one
from ...data.atoms.structures import stress_label
from ...data.atoms.validate import check_cells, check_max_z, isolated_structures
from ...data.validation import DataWarning
from ...errors import ConfigError, DataValidationError, DistributedError
from ...models.atomistic.cost import ModelDescriptionError
from ..base import Task
from ..registry import register
from . import cost as A
from .build import make_model
from .cost import num_parameters as count
from .data import (
    GENERATED,
    REFERENCE_SAMPLE,
    is_structure_dataset,
    load_structures,
    open_dataset,
    open_given_splits,
    prepare_structures,
    reference_sample,
    resolved_num_workers,
    split,
    steps_per_epoch,
    total_steps,
)
from .defaults import apply_model_defaults
from .layout import check_graph_parallel, check_pipeline, pipelined, plan_info
from .normalizer import REFERENCES, EnergyNormalizer, read_element_references
from .steps import check_steps
from .trainer import S2EFTrainer, selection_for, worker

__all__ = ["S2EF", "S2EFData", "S2EFPlan", "EnergyNormalizer", "S2EFTrainer"]


@attrs.define
class S2EFData:
    """Loaded S2EF data: ``structures`` (validated PyG ``Data`` in a list, or a lazy
    ``gnnpipe.data.atoms.sets.PreparedSet`` that validates each when it is read), ``splits`` (index tensors),
    the fitted ``normalizer``, ``name`` (what the run trains on), ``mean_atoms`` (atoms per structure of the
    reference sample), ``elements`` (the sorted atomic numbers of the reference sample) and ``labels`` (which of
    ``energy`` and ``forces`` the reference sample carries)."""

    structures: Any
    splits: dict
    normalizer: EnergyNormalizer
    name: str
    mean_atoms: float = 0.0
    elements: tuple = ()
    labels: tuple = ("energy", "forces")


@attrs.define
class S2EFPlan:
    """The layout: ``data`` and ``info`` (:func:`~.layout.plan_info` and the model selection's ``monitor``)."""

    data: S2EFData
    info: dict


def _reference_structures(structures: Any, ids: Any) -> list:
    """The structures of ``ids`` for the energy reference: from memory, or read from a lazy set without the
    geometric checks (only the labels and atomic numbers are used; a set skipping malformed structures skips
    those whose labels are missing here too)."""
    if isinstance(structures, list):
        return [structures[i] for i in ids.tolist()]

    out = []
    for i in ids.tolist():
        try:
            where, k = structures.where(i).rsplit(" ", 1)
            d = prepare_one(structures.base[i], structures.dtype, where, int(k))
            if not bool(torch.isfinite(d.energy).all()):
                raise DataValidationError(f"{where} {k}: energy is {float(d.energy.reshape(-1)[0])} (not finite); "
                                          "recompute its labels or drop the structure")
            out.append(d)
        except DataValidationError:
            if not structures.skip_invalid:
                raise
    return out


def _symbol(z: int) -> str:
    return chemical_symbols[z] if 0 < z < len(chemical_symbols) else f"Z={z}"


def _model_task(name: str) -> str | None:
    try:
        return getattr(models.get(name), "task", None)
    except Exception:  # noqa: BLE001 - an unknown model is not ours to judge here
        return None


def check_structures_for(config: Any, structures: list, warn_isolated: bool = False) -> None:
    """Refuse, before any process starts, structures the model of ``config`` cannot read: a periodic structure with
    a singular cell (:func:`gnnpipe.data.atoms.validate.check_cells`, first: the graph estimate needs the volume),
    an atomic number beyond its embedding (``max_z``; :func:`gnnpipe.data.atoms.validate.check_max_z`), a cutoff
    whose graph cannot be built here (:func:`gnnpipe.data.atoms.estimate.check_graph_size`, which warns about one
    that is merely large), or a set in which no structure has a pair of atoms within the cutoff (no edges anywhere:
    the model would learn per-atom energies and zero forces). ``warn_isolated``: also warn of the structures without
    edges (the structures were not validated whole, which warns of them).

    Raises:
        DataValidationError: a singular cell; an atomic number beyond ``max_z``. ConfigError: a graph too large to
        build; no edges in any structure.
    """
    ds = config.dataset
    source = f"{Path(ds).name}: structure" if is_structure_dataset(ds) and "." in str(ds) else "structure"
    check_cells(structures, source=source)
    if config.model_args.get("max_z") is not None:
        check_max_z(structures, config.model_args["max_z"], source=source, model=config.model)
    triplets = bool(getattr(models.get(config.model), "uses_triplets", True)) or config.graph_parallel_group_size > 1
    check_graph_size(structures, config.cutoff, config.max_neighbors, with_triplets=triplets,
                     batch_size=config.batch_size, available=available_memory_bytes(),
                     fix="lower --cutoff to about {cutoff} Å or less" + (" (or --max-neighbors: the triplets grow "
                                                                         "with its square)" if triplets else ""),
                     source=source)
    isolated = isolated_structures(structures, config.cutoff)
    what = "the" if len(structures) <= REFERENCE_SAMPLE else f"a sample of {len(structures):,} of the"
    name = Path(ds).name if ds else "given"
    if structures and len(isolated) == len(structures):
        raise ConfigError(f"no structure of {what} {name} structures has a pair of atoms within --cutoff "
                          f"{config.cutoff} Å: their graphs have no edges, so the model would see only per-atom terms "
                          f"and predict zero forces; raise --cutoff to the distance between neighbouring atoms")
    if isolated and warn_isolated:
        shown = ", ".join(map(str, isolated[:10])) + (", …" if len(isolated) > 10 else "")
        warnings.warn(f"{len(isolated)} of {what} {len(structures):,} structures (positions {shown}) have no pair "
                      f"of atoms within --cutoff {config.cutoff} Å: their graphs have no edges, so a model sees only "
                      f"per-atom terms; raise the cutoff if this is unintended", DataWarning, stacklevel=3)


def _check_resume_layout(path, config: Any, meta: dict, changed: list) -> None:
    """Refuse resuming a checkpoint written inside an epoch in another layout; warn of an epoch checkpoint resumed
    in another layout (what carries over and what restarts).

    A checkpoint inside an epoch holds each rank's sums of the epoch so far and the position in the epoch's batches
    of its ``--replicas`` (the global batch is ``--batch-size × --replicas``): it continues only in the layout that
    wrote it.

    Raises:
        ConfigError: ``meta`` is a checkpoint inside an epoch and the layout or world size differs.
    """
    world, old_world = config.world_size, meta.get("world")
    if not changed and (old_world is None or old_world == world):
        return
    old = meta.get("config", {})
    was = (f"--replicas {old.get('replicas', old.get('ways'))} --stages {old.get('stages')} --gp-size "
           f"{old.get('graph_parallel_group_size')}")
    steps = int(meta.get("steps_in_epoch", 0) or 0)
    if steps:
        epochs = int(meta.get("epochs", 0))
        raise ConfigError(f"{path} was written inside epoch {epochs + 1} (after {steps} step(s) of it) by {was} "
                          f"({old_world} rank(s)); a checkpoint inside an epoch resumes only in the layout that wrote "
                          f"it (now --replicas {config.replicas} --stages {config.stages} --gp-size "
                          f"{config.graph_parallel_group_size}): resume with {was}, or from an epoch checkpoint "
                          f"(ckpt-{epochs:06d}) in the new layout")
    old_d = int(old.get("replicas", old.get("ways", config.replicas)))
    old_batch = int(old.get("batch_size", config.batch_size)) * old_d
    new_batch = config.batch_size * config.replicas
    batch = (f"; the global batch is now {new_batch} structures (--batch-size {config.batch_size} × --replicas "
             f"{config.replicas}; it was {old_batch}), so an epoch has {'fewer' if new_batch > old_batch else 'more'} "
             f"optimizer steps and the learning-rate schedule runs over them") if new_batch != old_batch else ""
    warnings.warn(f"resuming {path} in another layout ({', '.join(changed) or 'world size'} changed; written by "
                  f"{was}): weights, optimizer state and the epoch records carry over; random states restart, so "
                  f"the continuation is not bit-identical to an uninterrupted run{batch}", stacklevel=3)


@register("s2ef")
class S2EF(Task):
    """Structure → energy and forces (OC20's S2EF: Chanussot et al., ACS Catal. 2021): the ``"s2ef"``
    :class:`~gnnpipe.tasks.base.Task`. Trains an atomistic model on structures in one process, data-parallel
    over ``--replicas D`` ranks, graph-parallel over ``--gp-size G`` ranks per replica (``D × G`` ranks), or pipelined
    over ``--stages S`` (``D × S × G`` ranks)."""

    name = "s2ef"

    def __init__(self) -> None:
        #: the fields :meth:`resolve` took from the model's S2EF defaults (``gnnpipe.tasks.s2ef.defaults``)
        self.defaults_chosen: dict = {}

    @classmethod
    def claims(cls, config: Any) -> bool:
        """A structure file or generated structure set as the dataset, or an atomistic model."""
        return is_structure_dataset(getattr(config, "dataset", None)) or _model_task(config.model) == "s2ef"

    def resolve(self, config: Any) -> Any:
        """``task="s2ef"``; the model's S2EF defaults (``gnnpipe.tasks.s2ef.defaults``: layers, hidden,
        cutoff, neighbour cap, batch size, ``lr``, loss coefficients) and recommended ``dropout``,
        ``weight_decay`` for those left unset (the ones chosen in ``self.defaults_chosen``); its options with
        their defaults, ``cutoff``, ``max_neighbors`` and ``direct_forces`` from the config.

        Raises:
            ConfigError: a model that is not atomistic, a dataset that is not a structure set, model options that
                contradict ``--cutoff`` / ``--max-neighbors`` / ``--direct-forces``.
        """
        if _model_task(config.model) != "s2ef":
            atomistic = [n for n in models.available() if _model_task(n) == "s2ef"]
            models.get(config.model)  # an unknown name: UnknownComponentError listing the models
            raise ConfigError(f"--model {config.model} does not predict energies and forces; with structures "
                              f"({config.dataset or 'oc20-like'}) use --model {' or '.join(atomistic)}")
        if config.dataset is not None and not is_structure_dataset(config.dataset):
            raise ConfigError(f"--dataset {config.dataset!r} is not a structure set; --model {config.model} trains on "
                              f"a structure file (.extxyz, .xyz, .traj, .db, .aselmdb, .lmdb), a folder of such "
                              f"files, or a "
                              f"generated set (oc20-like, md17-like, bulk-like)")
        if config.ways > 1:  # the old spelling: one name per concept (--ways is graph-parallel ways elsewhere)
            if config.replicas > 1:
                raise ConfigError(f"--ways {config.ways} and --replicas {config.replicas} both name the data-parallel "
                                  f"replicas of an S2EF run; give --replicas only")
            warnings.warn(f"--ways {config.ways} for an S2EF run is the old spelling of --replicas {config.ways} "
                          f"(data-parallel replicas; --ways means graph-parallel ways in node classification): "
                          f"use --replicas", FutureWarning, stacklevel=3)
            config = attrs.evolve(config, replicas=config.ways, ways=1)
        if config.energy_reference not in REFERENCES:  # a file: read now, refused before any data is read
            read_element_references(config.energy_reference)
        _ = config.device_type  # an unknown --device, or cuda without a GPU: ConfigError naming the fix
        if config.amp and config.dtype != "float32":
            raise ConfigError(f"--amp runs the model's forward in bfloat16 autocast from float32 weights; with --dtype "
                              f"{config.dtype} there is nothing to autocast: use --dtype float32, or leave --amp out")
        config, self.defaults_chosen = apply_model_defaults(config)
        opts = models.model_options(config.model)
        fixed = {k: getattr(config, k) for k in ("cutoff", "max_neighbors", "direct_forces") if k in opts}
        clash = {k: v for k, v in config.model_args.items() if k in fixed and v != fixed[k]}
        if clash:
            k = next(iter(clash))
            raise ConfigError(f"--model-arg {k}={clash[k]} contradicts --{k.replace('_', '-')} {fixed[k]}; "
                              f"set it with --{k.replace('_', '-')}")
        hp = models.get(config.model).default_hparams
        upd = {k: hp[k] for k in ("lr", "dropout", "weight_decay") if getattr(config, k) is None and k in hp}
        if config.weight_decay_conv is None:
            upd["weight_decay_conv"] = upd.get("weight_decay", config.weight_decay)
        args = {**{k: o.default for k, o in opts.items()}, **config.model_args, **fixed}
        if config.stress_coef and args.get("direct_forces"):
            raise ConfigError(f"--stress-coef {config.stress_coef:g} with --direct-forces: a direct force head has no "
                              f"stress (its forces are not −∂E/∂pos); train conservative forces (leave out "
                              f"--direct-forces) for stresses, or leave out --stress-coef")
        if config.stages > 1 and config.chunks is None:  # micro-batches of structures: 4·S, at most one each
            upd["chunks"] = min(4 * config.stages, config.batch_size)
        return attrs.evolve(config, task="s2ef", model_args=args, **upd)

    def load(self, config: Any, data: Any | None = None) -> S2EFData:
        """Structures of ``config.dataset`` (or ``data``: a list of PyG ``Data`` or ``ase.Atoms``), split, with the
        energy reference fitted on a bounded sample of the training split
        (``gnnpipe.tasks.s2ef.data.reference_sample``). A generated set, a ``.traj`` file and ``data`` are read and
        validated whole, in memory; the other files and folders (``gnnpipe.data.atoms.sets``) are opened lazily: a
        structure is read and validated when a step (a loader worker) needs it."""
        splits = None
        if data is not None and (config.val_datasets or config.test_dataset):
            raise ConfigError("--val-dataset / --test-dataset name files; with structures passed from Python, train "
                              "on a file (--dataset) or leave the split to gnnpipe")
        if data is None and (config.val_datasets or config.test_dataset):  # given splits: --dataset trains whole
            structures, splits = open_given_splits(config)
            name = config.dataset or "oc20-like"
        elif data is None:
            ds = config.dataset or "oc20-like"
            lazy = ds.lower() not in GENERATED and not ds.lower().endswith(".traj")
            structures, name = (open_dataset(config) if lazy else load_structures(config)), ds
        else:
            items = list(data)
            if items and not hasattr(items[0], "pos"):
                items = from_atoms(items)
            structures = prepare_structures(items, config.torch_dtype, cutoff=config.cutoff)
            name = "the given structures"
        lazy_set = not isinstance(structures, list)
        if not lazy_set:
            check_structures_for(config, structures)
        if splits is None:
            splits = split(config, len(structures))
        sample = _reference_structures(structures, reference_sample(splits["train"], config.seed))
        if lazy_set:  # every structure of a set no larger than the sample, else the sample; each structure's
            # atomic numbers are checked again when a worker reads it

            n = len(structures)
            check_structures_for(config, sample if n > REFERENCE_SAMPLE else
                                 _reference_structures(structures, torch.arange(n)), warn_isolated=True)
            structures.max_z = config.model_args.get("max_z")
            structures.release()  # the sample's pages unmapped here: the loader workers read from now on
        normalizer = EnergyNormalizer.fit(sample, reference=config.energy_reference)
        mean_atoms = sum(int(d.z.numel()) for d in sample) / max(len(sample), 1)
        elements = tuple(sorted({int(z) for d in sample for z in d.z.unique().tolist()}))
        labels = tuple(k for k in ("energy", "forces")
                       if any(getattr(d, f"has_{k}", None) is None or bool(getattr(d, f"has_{k}").reshape(-1)[0])
                              for d in sample))
        labels += ("stress",) if any(stress_label(d) is not None for d in sample) else ()
        return S2EFData(structures=structures, splits=splits, normalizer=normalizer, name=name, mean_atoms=mean_atoms,
                        elements=elements, labels=labels)

    def describe(self, config: Any, data: S2EFData, given: bool = False) -> str:
        """The run's header, printed whatever ``--no-progress`` says: the defaults chosen for the flags not given,
        the data (file, structures, split sizes, elements), the model (name, parameters, size, cutoff, forces), the
        layout (``S × G × D`` ranks, partitioner, micro-batches, loader workers), the loss, the optimisation
        (learning rate, warm-up, decay, moving average, clipping; in epochs or steps) and the scale file loaded. A
        layout that cannot run is refused here, before anything is printed
        (``gnnpipe.tasks.s2ef.layout.check_graph_parallel``, ``gnnpipe.tasks.s2ef.layout.check_pipeline``;
        outside torchrun).

        Raises:
            ConfigError, UnknownComponentError: as those checks.
        """
        if not launch.under_torchrun():  # torchrun's ranks refuse in check(), recording the message for its summary
            check_graph_parallel(config, None)
            if pipelined(config):
                check_pipeline(config)
        n = len(data.structures)
        if config.val_datasets or config.test_dataset:  # given splits, named
            sizes = ", ".join(f"{k} {len(v):,}" for k, v in data.splits.items())
        else:
            sizes = "train/val/test " + "/".join(f"{len(data.splits[k]):,}" for k in ("train", "val", "test"))
        lines = []
        if self.defaults_chosen:
            lines.append(f"{config.model}'s S2EF defaults for the flags not given: "
                         + ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in self.defaults_chosen.items()))
        elements = ", ".join(_symbol(z) for z in data.elements) if data.elements else "?"
        lines.append(f"data: {data.name}, {n:,} structures ({data.mean_atoms:.1f} atoms on average), {sizes}; "
                     f"elements {elements}; labels: {', '.join(data.labels)}")
        forces = "direct" if config.direct_forces else "conservative"
        lines.append(f"model: {config.model}, {num_parameters(config):,} parameters ({config.layers} interaction "
                     f"block{'s' if config.layers != 1 else ''}, hidden {config.hidden}), {forces} forces, cutoff "
                     f"{config.cutoff:g} Å, at most "
                     f"{config.max_neighbors} neighbours, {config.dtype}")
        G, S, D = config.graph_parallel_group_size, config.stages, config.replicas
        workers = resolved_num_workers(config, len(data.splits["train"]))
        layout = (f"layout: S {S} × G {G} × D {D} = {S * G * D} rank{'s' if S * G * D != 1 else ''}; batch "
                  f"{config.batch_size} structures per replica (global {config.batch_size * D})")
        if pipelined(config):
            layout += f", {config.chunks} micro-batches, scheduler {config.scheduler}"
        if G > 1:
            layout += f", graph-parallel partitioner {config.graph_parallel_partitioner} ({config.graph_parallel_mode})"
        lines.append(layout + f"; {workers} loader worker{'s' if workers != 1 else ''} per rank")
        lines.append(device_line(config))
        ref = {"linear": f"a per-element linear reference fitted on "
                         f"{min(len(data.splits['train']), REFERENCE_SAMPLE):,} training structures",
               "none": "no per-element reference"}.get(
            config.energy_reference, f"the per-element references of {config.energy_reference}")
        stress = f" + {config.stress_coef:g}·σ" if config.stress_coef else ""
        lines.append(f"loss: {config.energy_coef:g}·E + {config.force_coef:g}·F{stress} ({config.loss_fn}) on "
                     f"normalised targets ({ref}); each structure on the labels it has")
        per_epoch = steps_per_epoch(config, len(data.splits["train"]))
        total = total_steps(config, len(data.splits["train"]))
        length = (f"{config.max_steps:,} optimizer steps (at most {config.epochs} epochs of {per_epoch:,})"
                  if config.max_steps else f"{config.epochs} epoch{'s' if config.epochs != 1 else ''} of "
                  f"{per_epoch:,} step{'s' if per_epoch != 1 else ''}")
        sched = f"lr {config.lr:g}"
        if config.warmup_steps:
            sched += f", linear warm-up over {config.warmup_steps:,} steps from {config.warmup_factor:g}×"
            if config.warmup_steps > total:
                sched += (f" (the run takes {total:,}: the learning rate never reaches {config.lr:g}; lower "
                          f"--warmup-steps)")
        sched += {"cosine": f", cosine decay to 0.01× over {total:,} steps", "plateau": ", ×0.8 on a plateau of the "
                  "validation force MAE", "constant": ", constant"}.get(config.lr_schedule, f", {config.lr_schedule}")
        sched += f"; EMA {config.ema_decay:g}" if config.ema_decay else "; no EMA"
        if config.clip_grad_norm:
            sched += f"; gradient norm clipped at {config.clip_grad_norm:g}"
        if config.patience:
            unit = (f"evaluations (every {config.eval_every_steps:,} steps)" if config.eval_every_steps else
                    "epochs")
            sched += f"; stops after {config.patience} {unit} without a better validation force MAE"
        lines.append(f"training: {length}; {sched}")
        scale = config.model_args.get("scale_file")
        if scale:
            lines.append(f"scale factors: loaded from {scale}")
        return "\n".join(lines)

    def plan(self, config: Any, data: S2EFData) -> S2EFPlan:
        if pipelined(config):
            check_pipeline(config)  # before the stage bounds are computed
        info = plan_info(config, data.splits)
        # model selection on the forces, or the energies of a set without forces
        info["monitor"] = "val_force_mae" if "forces" in data.labels else "val_energy_mae"
        info["labels"] = list(data.labels)
        return S2EFPlan(data=data, info=info)

    def check(self, config: Any, plan: S2EFPlan, options: Any = None) -> None:
        """Refuse an empty training split, ``--eval-every-steps`` without a validation split
        (``gnnpipe.tasks.s2ef.steps.check_steps``, which also warns of a ``--max-steps`` beyond ``--epochs``),
        a torchrun world that is not ``--replicas × --stages × --gp-size``, what
        cannot be pipelined (``gnnpipe.tasks.s2ef.layout.check_pipeline``), a graph-parallel
        group size that does not divide it, an unknown ``--gp-partitioner``, and ``--gp-size G > 1`` with a model
        that has no graph-parallel hooks (``gnnpipe.tasks.s2ef.layout.check_graph_parallel``).

        Raises:
            ConfigError, UnknownComponentError: as above.
        """
        if len(plan.data.splits["train"]) == 0:
            raise ConfigError(f"{plan.data.name} has too few structures for a training split "
                              f"({len(plan.data.structures)}); give at least 3")

        if config.stress_coef and "stress" not in plan.data.labels:
            raise ConfigError(f"--stress-coef {config.stress_coef:g}: no structure of {plan.data.name} has a stress "
                              f"label (read from --stress-key {config.stress_key!r}, or "
                              f"--virial-key {config.virial_key!r}); name the label, or leave out --stress-coef")
        check_steps(config, plan.data.splits, options)
        launch.plan_backend(config)  # an unknown backend, or nccl without one GPU per rank: before any rank starts
        G = config.graph_parallel_group_size
        world = int(os.environ["WORLD_SIZE"]) if launch.under_torchrun() else None
        if world is None and config.device_type == "cuda" and getattr(options, "memory_check", True):
            plan.info["predicted_mem_bytes"] = check_gpu_memory(config, plan.data)
        if pipelined(config):
            try:
                check_graph_parallel(config, None)
                check_pipeline(config, world)
            except ConfigError as exc:
                if world is not None:
                    launch.record_torchrun_error(f"gnnpipe: error: {exc}")
                raise
            return
        try:
            check_graph_parallel(config, world)
        except ConfigError as exc:
            if world is not None:  # every torchrun rank fails with the message (torchrun's summary shows it)
                launch.record_torchrun_error(f"gnnpipe: error: {exc}")
            raise
        launch.check_torchrun_world(config.replicas * G,
                                    f"--replicas {config.replicas}" + (f" × --gp-size {G}" if G > 1 else ""))

    def launch(self, config: Any, plan: S2EFPlan, progress: bool, options: Any) -> Any:
        """Train: in this process (one rank), in ``D`` ranks started here (gloo; a failing rank ends them
        all), or as a rank of ``torchrun``. Returns the :class:`~gnnpipe.core.run.results.TrainResult` (``None`` on
        torchrun ranks other than 0)."""
        options = options or RunOptions()
        # the loader workers counted once, here: every rank (and a test faking this machine's cores) agrees
        config = attrs.evolve(config, num_workers=resolved_num_workers(config, len(plan.data.splits["train"])))
        nparams = num_parameters(config)
        meta = read_meta(options.resume) if options.resume else None
        check_checkpoint_dir(options.checkpoint_dir, meta["epochs"] if meta else 0,
                             meta.get("steps_in_epoch", 0) if meta else 0)
        if meta is not None:
            _check_resume_layout(options.resume, config, meta, check_resume(config, meta))
        d = plan.data
        norm = d.normalizer.to_dict()
        G = config.graph_parallel_group_size
        S = config.stages
        backend, why = launch.plan_backend(config)  # nccl: one GPU per local rank; else gloo (CUDA staged)
        plan.info["backend"], plan.info["backend_reason"] = backend, why
        if launch.under_torchrun():
            rank, world = launch.init_env_process_group(backend, config.timeout_s)  # None: torch's default
            out = worker(rank, world, config, d.structures, d.splits, norm, plan.info, progress, options)
            dist.barrier()
            dist.destroy_process_group()
            return _with_params(out["result"], nparams) if out else None
        if config.replicas * G == 1 and not pipelined(config):
            torch.set_num_threads(config.threads)
            return _with_params(S2EFTrainer(config, d.structures, d.splits, d.normalizer).run(
                progress, options, plan_info=plan.info), nparams)

        wait_s, wait_why = launch.wait_limit(config.timeout_s, backend)
        plan.info["wait_limit"] = {"seconds": wait_s, "why": wait_why}
        print(f"  backend {backend} ({why})", file=sys.stderr)
        print("  " + launch.format_wait_limit(wait_s, wait_why), file=sys.stderr)
        records = RecordCollector().start()
        try:
            outs = launch.spawn(worker, config.replicas * S * G, (config, d.structures, d.splits, norm, plan.info,
                                                                progress, options, records.send_end),
                                backend=backend, timeout_s=wait_s, threads=config.threads, graceful=True)
        except (KeyboardInterrupt, DistributedError) as exc:
            failed = isinstance(exc, DistributedError)
            exc.result = _with_params(partial_result(  # type: ignore[attr-defined]
                config, records.stop(), "failed" if failed else "interrupted", str(exc) if failed else None,
                selection=selection_for(plan.info)), nparams)
            raise
        records.stop()
        return _with_params(outs[0]["result"], nparams)


def predicted_gpu_memory(config: Any, data: S2EFData) -> list[int]:
    """Per rank of ``config``'s layout, the memory model's peak on a GPU (bytes;
    :func:`gnnpipe.tasks.s2ef.cost.layout_memory`), from a profile of the model's training step taken on this
    process's GPU (``torch.cuda.max_memory_allocated``; one replica batch: the training split's first
    ``--batch-size`` structures, in ``--amp`` when the run uses it).

    Raises:
        ModelDescriptionError: a model that does not describe its widths.
    """
    ids = data.splits["train"][: config.batch_size]
    structs = [d for d in (data.structures[int(i)] for i in ids) if d is not None]
    model = make_model(config)
    job = A.AtomJob(model, structs, config.cutoff, config.max_neighbors,
                    partitioner=config.graph_parallel_partitioner, mode=config.graph_parallel_mode,
                    element_size=torch.empty((), dtype=config.torch_dtype).element_size(),
                    ema=bool(config.ema_decay), backend=launch_backend(config))
    batch, graph = A.job_graph(job)
    prof = A.profile_step(model, batch, graph, steps=1, warmup=1, name=config.model, device="cuda", amp=config.amp)
    S = config.stages
    layout = A.AtomLayout(S, config.graph_parallel_group_size, config.replicas,
                          chunks=(config.chunks or 1) if S > 1 else 1, scheduler=config.scheduler if S > 1 else "gpipe")
    return A.layout_memory(job, layout, prof)


def launch_backend(config: Any) -> str:
    """The backend the run's ranks use (:func:`gnnpipe.core.run.launch.plan_backend`; ``gloo`` for one process)."""
    ranks = config.replicas * config.stages * config.graph_parallel_group_size
    return launch.plan_backend(config)[0] if ranks > 1 else "gloo"


def check_gpu_memory(config: Any, data: S2EFData) -> list[int] | None:
    """Refuse, before any rank starts, a layout whose ranks the memory model predicts do not fit their GPUs
    (:func:`predicted_gpu_memory` against each GPU's free memory, ranks placed round robin:
    :func:`gnnpipe.tasks.s2ef.cost.check_device_memory`). Returns the per-rank prediction, or ``None`` for a model
    the memory model does not describe (a warning says the run is not checked).

    Raises:
        ConfigError: a GPU's ranks need more than it has free (the message gives the fixes and
            ``--no-memory-check``).
    """
    try:
        per_rank = predicted_gpu_memory(config, data)
    except ModelDescriptionError as exc:
        warnings.warn(f"no GPU memory check: {exc}", stacklevel=3)
        return None
    n = torch.cuda.device_count()
    free = [int(torch.cuda.mem_get_info(g)[0]) for g in range(n)]
    names = [torch.cuda.get_device_name(g) for g in range(n)]
    S, G, D = config.stages, config.graph_parallel_group_size, config.replicas
    A.check_device_memory(per_rank, free, names=names, what=f" (S {S} × G {G} × D {D}, batch {config.batch_size})")
    return per_rank


def device_line(config: Any) -> str:
    """The run header's line on where the ranks compute and in what precision: the device (the GPU's name on
    CUDA), whether TF32 matmuls are allowed for float32 work on CUDA (``--tf32``, the default; ``--no-tf32``), and
    ``--amp`` (bfloat16 autocast of the model's forward), with the backend of several ranks.

    Raises:
        ConfigError: an unknown ``--device``, or ``cuda`` without a GPU; a backend the layout cannot use
            (:func:`gnnpipe.core.run.launch.plan_backend`).
    """
    dev = config.device_type
    if dev == "cuda":
        n = torch.cuda.device_count()
        text = f"device: cuda ({torch.cuda.get_device_name(0)}{f', {n} GPUs' if n > 1 else ''})"
        if config.dtype == "float32":
            text += ("; TF32 matmuls allowed for float32 work (--no-tf32: exact float32)" if config.tf32 else
                     "; TF32 off (--no-tf32): exact float32 matmuls")
    else:
        text = "device: cpu"
    if config.amp:
        text += "; --amp: the forward in bfloat16 autocast (energies, forces, losses, optimizer state in float32)"
    else:
        text += f"; {config.dtype} throughout"
    ranks = config.replicas * config.stages * config.graph_parallel_group_size
    if ranks > 1:
        backend, why = launch.plan_backend(config)
        text += f"; backend {backend} ({why})"
    return text


def num_parameters(config: Any) -> int:
    """Trained parameters of the model ``config`` describes (built on the ``meta`` device: no memory, no
    time), the ``num_params`` of an S2EF run's result (``gnnpipe report`` plots metrics against it)."""
    with torch.device("meta"):
        return count(make_model(config))


def _with_params(result: Any, nparams: int) -> Any:
    if result is not None:
        result.extra["num_params"] = int(nparams)
    return result
