"""Memory decisions and checks before a run starts: whether a pipeline recomputes (:func:`choose_recompute`), and
the refusal of a single process (:func:`check_single_process_memory`) or of local ranks (:func:`check_ranks_memory`)
the memory available here cannot hold."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from ....costmodel.hardware import available_memory_bytes
from ....errors import ConfigError
from ..trainer import DTYPES, make_model
from .layouts import LayoutSpec, build_layout_plan, layout_config, single_plan
from .memory import MemoryBreakdown
from .plan_memory import predict_memory
from .profile import Profile, memory_profile


@attrs.define
class RecomputeChoice:
    """What :func:`choose_recompute` decided and why (printed with the plan, stored in ``plan.info``).

    Attributes:
        on: recompute activations in the backward. why: one sentence for the plan printout.
        without, with_, graph_parallel: predicted largest rank's live peak above the runtime floor (bytes)
            of the pipeline without recompute, with it, and of graph parallelism over the same ranks.
    """

    on: bool
    why: str
    without: int = 0
    with_: int = 0
    graph_parallel: int = 0

    def to_dict(self) -> dict:
        return {"on": self.on, "why": self.why, "largest_rank_without_bytes": self.without,
                "largest_rank_with_bytes": self.with_, "largest_graph_parallel_rank_bytes": self.graph_parallel}


def choose_recompute(config, plan, model, profile: Profile) -> RecomputeChoice:
    """Decide ``recompute="auto"`` for a pipeline or hybrid (the defaults must not make a pipeline
    rank hold more than graph parallelism would): predict the largest rank's live peak above the runtime floor
    (:func:`predict_memory`) of the pipeline without recompute, with it, and of graph parallelism over the same
    ``ways × stages`` ranks (its own partition of the graph, :func:`build_layout_plan`). Recompute is chosen when
    the pipeline without it would hold more than graph parallelism and recomputing lowers it; otherwise it is
    off (recomputing costs about one more forward per chunk).

    Args:
        config: the resolved configuration (``stages > 1``). plan: its ``RunPlan``. model: its model.
        profile: a memory profile of the job (:func:`~gnnpipe.tasks.nodes.cost.profile.memory_profile`).
    """
    def largest(cfg, p) -> int:
        return max(int(m.peak) for m in predict_memory(cfg, p, model, profile))

    off = largest(attrs.evolve(config, recompute=False), plan)
    on = largest(attrs.evolve(config, recompute=True), plan)
    R = config.ways * config.stages
    gp_spec = LayoutSpec(R, 1, R, 1, "gpipe")
    gp_cfg = layout_config(config, gp_spec)
    gp = max(int(m.peak) for m in predict_memory(gp_cfg, build_layout_plan(config, plan.data, gp_spec),
                                                            model, profile))
    mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
    if off > gp and on < off:
        why = (f"the memory model predicts {mib(off)} on the largest rank without it, more than graph parallelism "
               f"over the same {R} ranks ({mib(gp)}); with it {mib(on)}; --no-recompute turns it off")
        return RecomputeChoice(True, why, off, on, gp)
    why = (f"the memory model predicts {mib(off)} on the largest rank, {mib(gp)} with graph parallelism over the "
           f"same {R} ranks; --recompute trades compute for memory: {mib(on)}")
    return RecomputeChoice(False, why, off, on, gp)


def format_bytes(n: float) -> str:
    """``n`` bytes as GiB (one decimal) from 1 GiB up, else MiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


#: resident memory of a rank before it holds any data (torch, PyG, the process group; measured 320–350 MiB on
#: this project's CPU machines, docs/RESULTS.md §15): what the distributed memory check adds per local rank
RANK_FLOOR_BYTES = 350 * 2**20


def check_ranks_memory(predicted: Sequence[int], *, available: int | None = None) -> None:
    """Refuse, before any rank starts, local ranks whose predicted peaks (bytes above the runtime floor, one per
    rank) plus :data:`RANK_FLOOR_BYTES` each exceed the memory available here (they all share it).

    Raises:
        ConfigError: with the total, the largest rank, the available memory and the ways out.
    """
    available = available_memory_bytes() if available is None else int(available)
    if available is None or not predicted:
        return
    need = sum(int(p) for p in predicted) + RANK_FLOOR_BYTES * len(predicted)
    if need > available:
        raise ConfigError(
            f"the {len(predicted)} ranks would need about {format_bytes(need)} together (memory model; the largest "
            f"rank {format_bytes(max(predicted) + RANK_FLOOR_BYTES)}), but {format_bytes(available)} are available "
            f"here; use more stages or chunks, --recompute, --history-dtype bfloat16, or pass --no-memory-check "
            f"to try anyway")


def single_process_memory(config, data) -> MemoryBreakdown:
    """The memory model's prediction for training ``config`` on ``data`` in this one process (bytes above the
    runtime floor; the graph is counted although it is already loaded). Uses :func:`~gnnpipe.tasks.nodes.cost.profile.
    memory_profile` (a few seconds on any graph)."""
    prof = memory_profile(config, data)
    plan = single_plan(config, data)
    model = make_model(config, prof.num_features, prof.num_classes)
    return predict_memory(config, plan, model, prof)[0]


def check_single_process_memory(config, data, *, available: int | None = None) -> MemoryBreakdown | None:
    """Refuse, before it starts, a single-process run the memory model says this machine cannot hold.

    The prediction (:func:`single_process_memory`; the live peak, without glibc's retention, so that only runs
    that cannot fit are refused) is compared with the
    memory available now (``MemAvailable``) plus what the loaded graph already holds (it is part of the
    prediction). A run refused here would otherwise end in the kernel's out-of-memory killer.

    Args:
        config: a resolved :class:`~gnnpipe.core.settings.config.TrainConfig`
            (``gnnpipe.tasks.nodes.trainer.resolve_config``).
        data: the prepared graph. available: bytes available (default: :func:`available_memory_bytes`).

    Returns:
        the prediction, or ``None`` when the available memory is unknown or a cheap upper bound is below half
        of it (no profile is taken then).

    Raises:
        ConfigError: the predicted peak exceeds the available memory; the message gives both, the largest
            kinds, and the ways out (a pipeline: ``--stages``/``--chunks``/``--recompute``/``--history-dtype``;
            or ``--no-memory-check`` to try anyway).
    """
    on_gpu = available is None and config.device_type == "cuda"
    if on_gpu:  # the job's tensors live in GPU memory; the graph is not there yet
        available = int(torch.cuda.mem_get_info()[0])
    available = available_memory_bytes() if available is None else int(available)
    if available is None:
        return None
    # a cheap bound first, so small jobs do not pay for the measured profile: 16 values of every unit's width
    # per row (the zoo's units save at most ~3), the features, and 64 bytes per edge
    N, E, F = int(data.num_nodes), int(data.edge_index.size(1)), int(data.x.size(1))
    b = torch.finfo(DTYPES[config.dtype]).bits // 8 if config.dtype in DTYPES else 4
    bound = N * b * (2 * F + 16 * (config.layers + 2) * max(int(config.hidden), 1)) + 64 * E
    if bound < available // 2:
        return None
    m = single_process_memory(config, data)
    held = 0 if on_gpu else m.graph  # already resident (CPU): the prepared graph
    need = m.peak
    if need > available + held:
        kinds = sorted(((getattr(m, k), k) for k in ("graph", "adjacency", "parameters", "activations", "transient")),
                       reverse=True)[:3]
        top = ", ".join(f"{k} {format_bytes(v)}" for v, k in kinds)
        where = "on the GPU" if on_gpu else "here"
        raise ConfigError(
            f"a single process would need about {format_bytes(need)} for this job (memory model: {top}), but "
            f"{format_bytes(available + held)} are available {where} (free {format_bytes(available)} + the "
            f"loaded graph {format_bytes(held)}); train it as a pipeline (e.g. --stages 4 --chunks 16 --recompute, "
            f"--history-dtype bfloat16), or pass --no-memory-check to try anyway")
    return m
