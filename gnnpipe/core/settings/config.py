"""Run configuration: one flat, JSON-serialisable record of everything a training run depends on."""

from __future__ import annotations

import math

import attrs
import torch

from ... import correctors, models, partitioners, schedulers
from ...correctors import parse_spec
from ...errors import ConfigError

#: the dtype names a config may use (``TrainConfig.dtype``) and their torch dtypes
DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: storage dtypes of the history buffers (``TrainConfig.history_dtype``; compute stays in ``dtype``)
HISTORY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                  "float64": torch.float64}


def _int_pos(name):
    def check(inst, attr, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")

    return check


def _opt_int_pos(name):
    def check(inst, attr, value):
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")

    return check


def _num_classes(inst, attr, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"num_classes must be an integer, got {value!r}")
    if value < 2:
        raise ConfigError(f"num_classes must be >= 2 (a classifier needs at least two classes), got {value}; "
                          f"use --num-classes 2 or more")


def _rate(name):
    def check(inst, attr, value):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")

    return check


def _correctors(value):
    """A corrector spec (``"t1,t2,t3"`` as on the command line, or a list) as a list: the one parser,
    :func:`gnnpipe.correctors.parse_spec`."""
    return parse_spec(value)


class _UnsetInt(int):
    """An ``int`` field left at its default: a kind of work may replace it (:func:`is_unset`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return int.__repr__(self)


class _UnsetFloat(float):
    """A ``float`` field left at its default: a kind of work may replace it (:func:`is_unset`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return float.__repr__(self)


def unset(value):
    """``value`` (an int or a float) marked as "not given": it compares, hashes, computes and serialises as the
    plain number, but :func:`is_unset` tells it from the same number given by the user, so a kind of work can put
    its own default in its place (``gnnpipe.tasks.s2ef.defaults``: the S2EF defaults of each atomistic model).
    Arithmetic on it, JSON round trips and every explicit value give plain numbers ("given")."""
    return _UnsetFloat(value) if isinstance(value, float) else _UnsetInt(value)


def is_unset(value) -> bool:
    """Whether ``value`` is a field default marked by :func:`unset` (the user did not set it)."""
    return isinstance(value, (_UnsetInt, _UnsetFloat))


#: the floating dtypes a run may use (``TrainConfig.dtype``)
DTYPE_NAMES = tuple(DTYPES)

#: the torch.distributed backends a run may use (``TrainConfig.backend``; ``None`` picks one)
BACKENDS = ("gloo", "nccl")


def _dtype(inst, attr, value):
    if value not in DTYPE_NAMES:
        raise ConfigError(f"dtype {value!r} is not supported; use one of {', '.join(DTYPE_NAMES)}")


def _recompute(value):
    """``recompute``: ``True``/``False``, or ``None``/``"auto"`` (the memory model decides, see the field)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"recompute must be true, false or 'auto', got {value!r}")


def _backend(inst, attr, value):
    if value is not None and value not in BACKENDS:
        raise ConfigError(f"unknown backend {value!r}; available: {', '.join(BACKENDS)} "
                          f"(gloo: CPU; nccl: one GPU per rank; default: nccl with CUDA, else gloo)")


def _model_args(value):
    if value is None:
        return {}
    return dict(value) if isinstance(value, dict) else value


def _check_model_args(inst, attr, value):
    if not isinstance(value, dict):
        raise ConfigError(f"model_args must be a dict {{option: value}}, e.g. {{'lamda': 0.6}}, got {value!r}")
    if not value:
        return

    if isinstance(inst.model, str) and inst.model in models.MODELS:  # an unknown model fails on its own
        models.check_model_args(inst.model, value)


def _nonneg(name):
    def check(inst, attr, value):
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")

    return check


def _nonneg_opt(name):
    def check(inst, attr, value):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= 0 (0: read in the training "
                              f"process), got {value!r}")
    return check


def _pos(name):
    def check(inst, attr, value):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")  # seconds for timeout_s

    return check


#: S2EF loss functions (``TrainConfig.loss_fn``): mean absolute or mean squared error per energy and force component
LOSS_FNS = ("l1", "mse")
#: S2EF learning-rate schedules after the warm-up (``TrainConfig.lr_schedule``)
LR_SCHEDULES = ("cosine", "plateau", "constant")
#: the fields of S2EF runs (left out of :meth:`TrainConfig.to_dict` of other runs)
S2EF_FIELDS = ("task", "energy_coef", "force_coef", "loss_fn", "direct_forces", "cutoff", "max_neighbors",
               "batch_size", "ema_decay", "warmup_steps", "warmup_factor", "lr_schedule", "clip_grad_norm",
               "energy_key", "forces_key", "stress_key", "virial_key", "stress_coef", "energy_reference",
               "val_datasets", "test_dataset", "frames", "graph_parallel_group_size", "graph_parallel_partitioner",
               "graph_parallel_mode", "max_steps", "eval_every_steps", "val_size",
               "num_workers", "skip_invalid", "replicas", "amp", "tf32")
#: the validation structures a step evaluation of S2EF reads when ``val_size`` is not given (``--val-size``)
DEFAULT_VAL_SIZE = 1000
#: how a graph-parallel group moves the edge rows its triplets read (``TrainConfig.graph_parallel_mode``)
GP_MODES = ("allgather", "halo")


def _choice(name, choices):
    def check(inst, attr, value):
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")

    return check


def _positive(name):
    def check(inst, attr, value):
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")

    return check


def _unit(name, closed=False):
    def check(inst, attr, value):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
            (0 <= value <= 1 if closed else 0 <= value < 1)
        if not ok:
            raise ConfigError(f"{name} must be a number in [0, {'1]' if closed else '1)'}, got {value!r}")

    return check


@attrs.define(kw_only=True)
class TrainConfig:
    """Every setting of a training run (what ``gnnpipe train`` flags set; stored in the ``--out`` JSON).

    ``None`` for ``lr``, ``dropout``, ``weight_decay`` and ``weight_decay_conv`` means "the model's
    recommended default" (``GNNModel.default_hparams``; e.g. GCNII's Cora settings).

    Parallelism: ``ways`` (W graph-parallel ways) × ``stages`` (S pipeline stages) ranks; ``chunks``
    (C) is the total number of chunks. GP = W×1, GNNPipe = 1×S, hybrid = W×S, single
    process = 1×1. ``scheduler``: 1f1b by default (a flush schedule like gpipe, as fast, with at most ``S − s``
    chunks' activations in flight on stage ``s`` instead of all ``C``). ``recompute``: ``True`` recomputes a
    stage's activations in the backward (memory for compute); ``None`` (``"auto"``, the default) lets the memory
    model decide when a pipeline starts (``gnnpipe.tasks.nodes.cost.memory_check.choose_recompute``: on when the largest
    pipeline rank would otherwise hold more than the largest rank of graph parallelism over the same ranks).

    S2EF (atomistic structure → energy and forces; ``task="s2ef"``, set by the ``s2ef`` task): the loss
    ``energy_coef · L(E) + force_coef · L(F)`` over free atoms (``loss_fn`` ``l1`` or ``mse``; fairchem's
    coefficients 1 and 100), conservative forces unless ``direct_forces``; the neighbour graph within ``cutoff``
    Å, at most ``max_neighbors`` per atom; ``batch_size`` structures per rank and step (``replicas`` data-parallel
    replicas); AdamW with a linear warm-up over ``warmup_steps`` steps from ``warmup_factor · lr``, then
    ``lr_schedule``; gradient norm clipped at ``clip_grad_norm`` (``None``/0: off); evaluation with an
    exponential moving average of the weights (``ema_decay``; 0: off); ``energy_key`` / ``forces_key`` / ``stress_key``
    / ``virial_key`` name the labels of a structure file; ``stress_coef``: the weight of the stress term (eV/Å³,
    ASE's convention; structures without a stress label or a 3D cell do not contribute); ``energy_reference``: the
    per-element energy reference (``linear``: fitted on the training split, ``none``, or a file;
    ``gnnpipe.tasks.s2ef.normalizer``); ``val_datasets`` / ``test_dataset``: given validation sets (each reported under
    its own name, the first choosing the best weights) and test set, which make ``dataset`` the training set whole
    (instead of its 80/10/10 split); ``frames``: the size of the generated data set used when no file is given;
    ``num_workers``: loader worker processes per rank (``None``: from the cores left after the ranks); ``skip_invalid``:
    skip and count malformed structures instead of stopping. ``layers``, ``hidden``, ``cutoff``, ``max_neighbors``,
    ``batch_size``, ``energy_coef`` and ``force_coef`` left at their defaults are marked ``unset``, and ``lr`` is
    ``None``: the ``s2ef`` task replaces them by the model's S2EF defaults (``gnnpipe.tasks.s2ef.defaults``); the values
    above are the generic ones. Graph parallelism of atomistic models (Sriram et al., ICLR 2022):
    ``graph_parallel_group_size`` (``G``, ``--gp-size``) ranks share each replica's batch, its edges and triplets split
    by ``graph_parallel_partitioner`` (``edge-chunk`` or ``atom-owner``), edge rows moved by ``graph_parallel_mode``
    (``allgather`` or ``halo``); the world is ``ways × G`` ranks.
    Training by steps (S2EF): ``max_steps`` ends the run after that many optimizer steps (or ``epochs``, whichever
    comes first; ``None``: by epochs only; free to change on resume: the learning-rate schedule spans ``epochs``);
    ``eval_every_steps`` evaluates every k optimizer steps (and at ``max_steps``) on the first ``val_size``
    structures of the validation and of the test split (``None``: ``DEFAULT_VAL_SIZE``, 1000).

    ``model_args``: the model's own options (``gnnpipe.models.model_options``, e.g. GCNII's
    ``{"alpha": 0.1, "lamda": 0.6}``); ``gnnpipe.tasks.nodes.trainer.resolve_config`` fills in the defaults
    of those not given, so a result's config records every value the model was built with.

    ``timeout_s``: how long a rank may wait on a peer before the run is ended as hung (``--timeout``); ``None``
    (the default) derives it (``gnnpipe.core.run.launch.wait_limit``: torch's default, or more when the cost
    model predicts slower epochs). A rank that dies ends the run at once whatever this is.

    ``nan_ok``: keep training after an epoch whose loss is NaN or infinite (default: the run stops there with
    :class:`~gnnpipe.errors.TrainingDivergedError`).

    Raises (on construction): ConfigError for a bad size or rate, ``energy_coef`` and ``force_coef`` both 0 (an S2EF
    loss that trains nothing), an unsupported ``dtype`` (lists
    ``DTYPE_NAMES``), an unknown ``backend`` (lists ``BACKENDS``), or ``model_args`` that the
    model does not have (lists its options). Component names (scheduler, partitioner, …) are checked by
    ``check_names`` when a run starts, so that components registered later still count.
    """

    # data
    dataset: str | None = None
    root: str | None = None
    split: int = 0
    num_nodes: int = 2000
    avg_degree: float = 10.0
    num_classes: int = attrs.field(default=5, validator=_num_classes)
    num_features: int = 32
    undirected: bool = True
    remove_self_loops: bool = True
    dedupe: bool = True
    normalize_features: bool = False
    # model
    model: str = "gcnii"
    layers: int = attrs.field(default=unset(8), validator=_int_pos("layers"))
    hidden: int = attrs.field(default=unset(64), validator=_int_pos("hidden"))
    dropout: float | None = None
    bias: bool = False
    activation: str = "relu"
    model_args: dict = attrs.field(factory=dict, converter=_model_args, validator=_check_model_args)
    # optimisation
    lr: float | None = attrs.field(default=None, validator=_rate("lr"))
    weight_decay: float | None = attrs.field(default=None, validator=_rate("weight_decay"))
    weight_decay_conv: float | None = attrs.field(default=None, validator=_rate("weight_decay_conv"))
    epochs: int = attrs.field(default=200, validator=_pos("epochs"))
    patience: int = attrs.field(default=100, validator=_nonneg("patience"))
    eval_every: int = attrs.field(default=1, validator=_pos("eval_every"))
    seed: int = 0
    nan_ok: bool = False
    # parallelism
    ways: int = attrs.field(default=1, validator=_pos("ways"))
    replicas: int = attrs.field(default=1, validator=_pos("replicas"))
    stages: int = attrs.field(default=1, validator=_pos("stages"))
    chunks: int | None = attrs.field(default=None, validator=_pos("chunks"))
    scheduler: str = "1f1b"
    stash_weights: bool = False
    correctors: list = attrs.field(factory=lambda: ["t1", "t2", "t3"], converter=_correctors)
    partitioner: str = "metis"
    over_partition: int = attrs.field(default=4, validator=_pos("over_partition"))
    layer_split: str = "equal"
    recompute: bool | None = attrs.field(default=None, converter=_recompute)
    threads: int = attrs.field(default=1, validator=_pos("threads"))
    backend: str | None = attrs.field(default=None, validator=_backend)
    # seconds a rank may wait on a peer; None: derived (gnnpipe.core.run.launch.wait_limit)
    timeout_s: float | None = attrs.field(default=None, validator=[_rate("timeout_s"), _pos("timeout_s")])
    dtype: str = attrs.field(default="float32", validator=_dtype)
    history_dtype: str | None = None
    device: str | None = None
    # S2EF on a GPU: bfloat16 autocast of the model's forward (--amp); TF32 matmuls of float32 work on CUDA (--no-tf32)
    amp: bool = False
    tf32: bool = True
    # atomistic structure → energy and forces (S2EF; names as fairchem's); in the config of S2EF runs only
    task: str | None = None
    energy_coef: float = attrs.field(default=unset(1.0), validator=_rate("energy_coef"))
    force_coef: float = attrs.field(default=unset(100.0), validator=_rate("force_coef"))
    stress_coef: float = attrs.field(default=0.0, validator=_rate("stress_coef"))
    loss_fn: str = attrs.field(default="l1", validator=_choice("loss_fn", LOSS_FNS))
    direct_forces: bool = False
    cutoff: float = attrs.field(default=unset(6.0), validator=_positive("cutoff"))
    max_neighbors: int = attrs.field(default=unset(50), validator=_int_pos("max_neighbors"))
    batch_size: int = attrs.field(default=unset(8), validator=_int_pos("batch_size"))
    ema_decay: float = attrs.field(default=0.999, validator=_unit("ema_decay"))
    warmup_steps: int = attrs.field(default=100, validator=_nonneg("warmup_steps"))
    warmup_factor: float = attrs.field(default=0.2, validator=_unit("warmup_factor", closed=True))
    lr_schedule: str = attrs.field(default="cosine", validator=_choice("lr_schedule", LR_SCHEDULES))
    clip_grad_norm: float | None = attrs.field(default=10.0, validator=_rate("clip_grad_norm"))
    energy_key: str | None = None
    forces_key: str | None = None
    stress_key: str | None = None
    virial_key: str | None = None
    energy_reference: str = "linear"
    val_datasets: list = attrs.field(factory=list, converter=lambda v: [str(x) for x in (v or [])])
    test_dataset: str | None = None
    frames: int = attrs.field(default=200, validator=_int_pos("frames"))
    graph_parallel_group_size: int = attrs.field(default=1, validator=_int_pos("graph_parallel_group_size (--gp-size)"))
    graph_parallel_partitioner: str = "edge-chunk"
    graph_parallel_mode: str = attrs.field(default="allgather", validator=_choice("graph_parallel_mode", GP_MODES))
    num_workers: int | None = attrs.field(default=None, validator=_nonneg_opt("num_workers"))
    skip_invalid: bool = False
    max_steps: int | None = attrs.field(default=None, validator=_opt_int_pos("max_steps (--max-steps)"))
    eval_every_steps: int | None = attrs.field(default=None,
                                                  validator=_opt_int_pos("eval_every_steps (--eval-every-steps)"))
    val_size: int | None = attrs.field(default=None, validator=_opt_int_pos("val_size (--val-size)"))

    def __attrs_post_init__(self) -> None:
        if self.energy_coef == 0 and self.force_coef == 0 and not self.stress_coef:  # S2EF: a zero loss
            raise ConfigError("--energy-coef 0 and --force-coef 0 without --stress-coef: the loss is zero and nothing "
                              "would be trained; give one of them > 0")

    def resolved(self, model_defaults: dict) -> TrainConfig:
        """A copy with ``None`` hyper-parameters replaced by the model's defaults."""
        upd = {k: model_defaults[k] for k in ("lr", "dropout", "weight_decay", "weight_decay_conv")
               if getattr(self, k) is None and k in model_defaults}
        if self.weight_decay_conv is None and "weight_decay_conv" not in model_defaults:
            upd["weight_decay_conv"] = upd.get("weight_decay", self.weight_decay)
        return attrs.evolve(self, **upd)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The floating dtype of every embedding, weight, ``Â`` and history buffer of the run.

        Raises:
            ConfigError: a dtype name other than those of ``DTYPES``.
        """
        try:
            return DTYPES[self.dtype]
        except KeyError:
            raise ConfigError(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPES)}") from None

    @property
    def torch_history_dtype(self) -> torch.dtype:
        """The storage dtype of the history buffers ``H_in``/``G_out`` (and of the correctors' snapshots, which
        copy them): ``history_dtype`` (``float32``, ``bfloat16``, ``float16``), default the compute ``dtype``.
        Rows are down-cast when written and up-cast to ``dtype`` when read; compute stays in ``dtype``.

        Raises:
            ConfigError: an unknown name.
        """
        if self.history_dtype is None:
            return self.torch_dtype
        try:
            return HISTORY_DTYPES[self.history_dtype]
        except KeyError:
            raise ConfigError(f"unknown history dtype {self.history_dtype!r}; use one of "
                              f"{', '.join(HISTORY_DTYPES)}") from None

    @property
    def device_type(self) -> str:
        """``"cuda"`` or ``"cpu"``: ``device`` when given, else ``"cuda"`` when CUDA is available.

        Raises:
            ConfigError: an unknown device, or ``cuda`` without a CUDA GPU.
        """
        if self.device is None:
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"unknown device {self.device!r}; use cpu or cuda")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda needs a CUDA GPU, and none is available; use --device cpu")
        return self.device

    @property
    def world_size(self) -> int:
        return self.ways * self.replicas * self.stages * self.graph_parallel_group_size

    def to_dict(self) -> dict:
        """All fields; the synthetic-graph sizes only when the synthetic graph is used."""
        d = attrs.asdict(self)
        if self.dataset not in (None, "synthetic") or self.task == "s2ef":
            for k in ("num_nodes", "avg_degree", "num_classes", "num_features"):
                d.pop(k)
        d["correctors"] = [c if isinstance(c, str) else repr(c) for c in self.correctors]
        if self.task != "s2ef":
            for k in S2EF_FIELDS:
                d.pop(k)
        return d


def check_names(config: TrainConfig) -> None:
    """Check every component name of ``config`` against its registry, in every mode (also where the mode
    does not use the component: a typo is an error wherever it is made).

    Raises:
        UnknownComponentError: an unknown model, scheduler, partitioner, layer split or corrector (the
            message lists the available names). ConfigError: a malformed corrector option, model options
            the model does not have, an unknown backend.
    """
    models.get(config.model)
    if config.model_args:
        models.check_model_args(config.model, config.model_args)
    schedulers.get(config.scheduler)
    partitioners.get(config.partitioner)
    partitioners.get_layer_partitioner(config.layer_split)
    correctors.build_correctors(config.correctors)
    _backend(config, None, config.backend)


def ignored_options(config: TrainConfig) -> list[str]:
    """The options that ``config``'s mode does not use *and* that were set to something other than
    their default (options left at their defaults are not reported: a user who never typed
    ``--correctors`` is not told that graph parallelism ignores them).

    Modes: single process (``ways == stages == 1`` and at most one chunk) ignores every pipeline and
    distribution option; graph parallelism (``stages == 1``, ``ways > 1``) ignores the pipeline options
    and chunk counts other than one per way; pipeline and hybrid use them all.

    Returns:
        Phrases naming the ignored flags and why (e.g. ``"--correctors (graph parallelism is exact: …)"``);
        the callers warn ``"ignored: " + "; ".join(...)``.
    """
    d = TrainConfig()
    out: list[str] = []

    def changed(*names):  # recompute: auto (None) and off (False) both mean "no recompute" there
        return [n for n in names
                if getattr(config, n) != getattr(d, n) and not (n == "recompute" and not config.recompute)]

    flag = {"scheduler": "--scheduler", "stash_weights": "--stash-weights", "correctors": "--correctors",
            "partitioner": "--partitioner", "over_partition": "--over-partition", "layer_split": "--layer-split",
            "recompute": "--recompute", "backend": "--backend", "chunks": "--chunks",
            "history_dtype": "--history-dtype"}
    if config.stages == 1 and config.ways == 1 and (config.chunks or 1) == 1:
        names = changed("scheduler", "stash_weights", "partitioner", "over_partition", "layer_split",
                        "recompute", "backend")
        if config.correctors and changed("correctors"):
            names.insert(2, "correctors")
        if config.history_dtype is not None:
            names.append("history_dtype")
        if names:
            out.append(", ".join(flag[n] for n in names) + " (a single-process run has no pipeline, chunks or ranks)")
    elif config.stages == 1 and config.ways > 1:
        if config.chunks not in (None, config.ways):
            out.append(f"--chunks {config.chunks} (graph parallelism has one part per way)")
        if config.correctors and changed("correctors"):
            out.append("--correctors (graph parallelism is exact: there is no history to correct)")
        names = changed("scheduler", "stash_weights", "over_partition", "layer_split", "recompute")
        if config.history_dtype is not None:
            names.append("history_dtype")
        if names:
            out.append(", ".join(flag[n] for n in names) + " (graph parallelism has no pipeline)")
    return out
