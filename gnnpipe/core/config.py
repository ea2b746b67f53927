"""Run configuration: one flat, JSON-serialisable record of everything a training run depends on."""

from __future__ import annotations

from typing import Optional

import math

import attrs

from ..errors import ConfigError


def _int_pos(name):
    def check(inst, attr, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")

    return check


def _rate(name):
    def check(inst, attr, value):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")

    return check


def _correctors(value):
    if value is None:
        return []
    if isinstance(value, str):  # "t1,t2,t3" as on the command line
        return [c.strip() for c in value.split(",") if c.strip() and c.strip() != "none"]
    return list(value)


def _nonneg(name):
    def check(inst, attr, value):
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")

    return check


def _pos(name):
    def check(inst, attr, value):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")  # seconds for timeout_s

    return check


@attrs.define(kw_only=True)
class TrainConfig:
    """Every setting of a training run (what ``gnnpipe train`` flags set; stored in the ``--out`` JSON).

    ``None`` for ``lr``, ``dropout``, ``weight_decay`` and ``weight_decay_conv`` means "the model's
    recommended default" (``GNNModel.default_hparams``; e.g. GCNII's Cora settings).

    Parallelism: ``ways`` (W graph-parallel ways) × ``stages`` (S pipeline stages) ranks; ``chunks``
    (C) is the total number of chunks (DESIGN §2). GP = W×1, GNNPipe = 1×S, hybrid = W×S, single
    process = 1×1.
    """

    # data
    dataset: Optional[str] = None
    root: Optional[str] = None
    split: int = 0
    num_nodes: int = 2000
    avg_degree: float = 10.0
    num_classes: int = 5
    num_features: int = 32
    undirected: bool = True
    remove_self_loops: bool = True
    dedupe: bool = True
    normalize_features: bool = False
    # model
    model: str = "gcnii"
    layers: int = attrs.field(default=8, validator=_int_pos("layers"))
    hidden: int = attrs.field(default=64, validator=_int_pos("hidden"))
    dropout: Optional[float] = None
    bias: bool = False
    activation: str = "relu"
    # optimisation
    lr: Optional[float] = attrs.field(default=None, validator=_rate("lr"))
    weight_decay: Optional[float] = attrs.field(default=None, validator=_rate("weight_decay"))
    weight_decay_conv: Optional[float] = attrs.field(default=None, validator=_rate("weight_decay_conv"))
    epochs: int = attrs.field(default=200, validator=_pos("epochs"))
    patience: int = attrs.field(default=100, validator=_nonneg("patience"))
    eval_every: int = attrs.field(default=1, validator=_pos("eval_every"))
    seed: int = 0
    # parallelism
    ways: int = attrs.field(default=1, validator=_pos("ways"))
    stages: int = attrs.field(default=1, validator=_pos("stages"))
    chunks: Optional[int] = attrs.field(default=None, validator=_pos("chunks"))
    scheduler: str = "gpipe"
    stash_weights: bool = False
    correctors: list = attrs.field(factory=lambda: ["t1", "t2", "t3"], converter=_correctors)
    partitioner: str = "metis"
    over_partition: int = attrs.field(default=4, validator=_pos("over_partition"))
    layer_split: str = "equal"
    recompute: bool = False
    threads: int = attrs.field(default=1, validator=_pos("threads"))
    backend: Optional[str] = None
    timeout_s: float = attrs.field(default=60.0, validator=[_rate("timeout_s"), _pos("timeout_s")])
    dtype: str = "float32"

    def resolved(self, model_defaults: dict) -> "TrainConfig":
        """A copy with ``None`` hyper-parameters replaced by the model's defaults."""
        upd = {k: model_defaults[k] for k in ("lr", "dropout", "weight_decay", "weight_decay_conv")
               if getattr(self, k) is None and k in model_defaults}
        if self.weight_decay_conv is None and "weight_decay_conv" not in model_defaults:
            upd["weight_decay_conv"] = upd.get("weight_decay", self.weight_decay)
        return attrs.evolve(self, **upd)

    @property
    def world_size(self) -> int:
        return self.ways * self.stages

    def to_dict(self) -> dict:
        """All fields; the synthetic-graph sizes only when the synthetic graph is used."""
        d = attrs.asdict(self)
        if self.dataset not in (None, "synthetic"):
            for k in ("num_nodes", "avg_degree", "num_classes", "num_features"):
                d.pop(k)
        d["correctors"] = [c if isinstance(c, str) else repr(c) for c in self.correctors]
        return d
