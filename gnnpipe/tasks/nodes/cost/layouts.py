"""The layouts a ranking compares: one candidate (:class:`LayoutSpec`), its predictions (:class:`LayoutPrediction`),
every feasible layout of a number of ranks (:func:`enumerate_layouts`), a configuration with a layout applied
(:func:`layout_config`) and the plan its run will build (:func:`build_layout_plan`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import attrs
import torch

from ....errors import ConfigError
from ..runner import RunPlan, build_plan, num_classes_of

SCHEDULERS = ("gpipe", "1f1b")


@attrs.frozen
class LayoutSpec:
    """One candidate layout: ``ways × stages`` ranks, ``chunks`` in total, METIS over-partitioning, scheduler."""

    ways: int
    stages: int
    chunks: int
    over_partition: int
    scheduler: str

    @property
    def mode(self) -> str:
        if self.ways == 1 and self.stages == 1:
            return "single"
        if self.stages == 1:
            return "GP"
        return "GNNPipe" if self.ways == 1 else "hybrid"

    def label(self) -> str:
        return f"{self.mode} {self.ways}x{self.stages}"


@attrs.define
class LayoutPrediction:
    """Predictions for one layout.

    Attributes:
        spec: the layout. epoch_s: predicted seconds per training epoch. bytes: ``{"layer", "graph", "weight"}``
        per epoch summed over ranks. memory: one :class:`MemoryBreakdown` per rank (bytes above the runtime
        floor). floor_bytes: the runtime floor per process. fits: every rank fits the hardware's memory.
        compute_s: per rank, predicted compute seconds per epoch. share: the CPU-sharing slowdown applied.
        work_s: per rank, predicted CPU work per epoch (compute without the sharing slowdown; compare with
        the ``cpu_s`` a run records).
        plan_info: the plan's description (chunk sizes, mirror count, …).
        recompute: whether the layout recomputes activations in the backward (a pipeline's or hybrid's
            ``recompute="auto"`` decided by ``choose_recompute``, as ``gnnpipe train``
            decides it).
        spread_s: per timed quantity of the profile with a spread (``Profile.spreads``), the seconds the
            prediction grows with that quantity at the high end of its spread (``Profile.raised``); filled by
            :func:`~.predict.plan_layouts` for the best layouts (empty otherwise, and for a profile without spreads).
    """

    spec: LayoutSpec
    epoch_s: float
    bytes: dict
    memory: list
    floor_bytes: int
    fits: bool
    compute_s: list
    share: float
    work_s: list = attrs.field(factory=list)
    plan_info: dict = attrs.field(factory=dict, repr=False)
    recompute: bool = False
    spread_s: dict = attrs.field(factory=dict)

    @property
    def total_bytes(self) -> int:
        return int(sum(self.bytes.values()))

    @property
    def peak_bytes_per_rank(self) -> list[int]:
        """Predicted peak resident bytes per rank (runtime floor + the model's resident peak; the live peak
        with glibc's retention, ``gnnpipe.tasks.nodes.cost.memory.RETENTION``)."""
        return [self.floor_bytes + m.resident_peak for m in self.memory]

    def to_record(self) -> dict:
        """The ``plan.json`` record (the plan's keys, then details)."""
        s = self.spec
        return {
            "ways": s.ways, "stages": s.stages, "chunks": s.chunks, "over_partition": s.over_partition,
            "scheduler": s.scheduler, "predicted_epoch_s": self.epoch_s, "predicted_bytes": self.total_bytes,
            "predicted_peak_bytes_per_rank": self.peak_bytes_per_rank, "fits": self.fits,
            "mode": s.mode, "predicted_bytes_by_kind": dict(self.bytes),
            "predicted_mem_bytes": [m.peak for m in self.memory],
            "predicted_resident_above_floor_bytes": [m.resident_peak for m in self.memory],
            "runtime_floor_bytes": self.floor_bytes,
            "memory_breakdown": [m.to_dict() for m in self.memory], "predicted_compute_s": self.compute_s,
            "cpu_share_slowdown": self.share, "predicted_work_s": self.work_s, "recompute": self.recompute,
            "predicted_epoch_spread_s": dict(self.spread_s),
        }


def enumerate_layouts(ranks: int, num_units: int, num_nodes: int, *, chunks_per_stage: Sequence[int] = (4,),
                      over_partitions: Sequence[int] = (1, 4),
                      schedulers: Sequence[str] = SCHEDULERS) -> list[LayoutSpec]:
    """Every feasible layout of ``ranks`` ranks: ``W·S = R`` with ``S ≤`` units; single process for ``R = 1``;
    GP (``S = 1``) with one part per way; pipelines and hybrids with ``C = k·S`` chunks per way for each
    ``k`` in ``chunks_per_stage``, each over-partitioning factor and each scheduler.

    Raises:
        ConfigError: ``ranks < 1``.
    """
    if int(ranks) != ranks or ranks < 1:
        raise ConfigError(f"--ranks must be an integer >= 1, got {ranks!r}")
    out = []
    for W in range(1, ranks + 1):
        if ranks % W:
            continue
        S = ranks // W
        if S > num_units:
            continue
        if S == 1:
            if W <= num_nodes:
                out.append(LayoutSpec(W, 1, W, 1, "gpipe"))
            continue
        for k in chunks_per_stage:
            C = W * k * S
            if C > num_nodes:
                continue
            for over in over_partitions:
                for sch in schedulers:
                    out.append(LayoutSpec(W, S, C, int(over), sch))
    return out


def layout_config(config, spec: LayoutSpec):
    """``config`` with the layout applied (GP: no correctors, gpipe — it has no history and no pipeline)."""
    if spec.stages == 1:
        # over-partitioning does not apply to GP (one part per way): the configured value is left alone
        return attrs.evolve(config, ways=spec.ways, stages=1, chunks=None, correctors=[], scheduler="gpipe",
                            stash_weights=False, layer_split="equal", recompute=False)
    return attrs.evolve(config, ways=spec.ways, stages=spec.stages, chunks=spec.chunks,
                        over_partition=spec.over_partition, scheduler=spec.scheduler)


def build_layout_plan(config, data, spec: LayoutSpec):
    """The ``RunPlan`` (``gnnpipe.tasks.nodes.runner``) the run of ``spec`` will build (same chunking and
    split)."""
    cfg = layout_config(config, spec)
    if spec.ways == 1 and spec.stages == 1:
        return single_plan(cfg, data)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_plan(cfg, data)


def single_plan(config, data):
    """The ``RunPlan`` of a single process: one way, one stage, one chunk of every vertex, all units."""
    return RunPlan(data=data, chunk_ptr=torch.tensor([0, int(data.num_nodes)]), way_ptr=torch.tensor([0, 1]),
                   bounds=[0, config.layers + 2], num_features=int(data.x.size(1)), num_classes=num_classes_of(data),
                   info={"ways": 1, "stages": 1, "chunks": 1})

