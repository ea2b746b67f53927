"""Per-rank memory of an ``S × G × D`` layout, and the check of a GPU's ranks against its free memory.

**Memory of a rank** (bytes above the runtime floor; :func:`rank_memory`): ``parameters`` ``P_s·b`` (``P_s = P/S``
for stage ``s``), ``gradients`` ``P_s·b``, ``optimizer`` ``2·P_s·b`` (Adam's moments; the trainer keeps them in the
training dtype), the flattened gradient all-reduce buffer when ``D·G > 1`` (``P_s·b`` on a pipeline stage; the
single process's and graph parallelism's holds the loss too, in float64), and ``activations``: what a
step keeps alive at its peak, ``κ·b·(w_E·E_r + w_T·T_r + w_N·N + w_A·N_r)`` with the rank's edges ``E_r``, triplets
``T_r``, the batch's atoms ``N`` (gathered atom rows are replicated) and its owned atoms ``N_r``; the widths
``w_*`` count the values autograd saves per edge, triplet and atom in the forward (:func:`activation_widths`,
written from the models' code) and ``κ`` is the double-backward factor: the step's peak of live bytes over the
forward's saved bytes (measured by :func:`profile_step` on a sample of the job; :data:`DEFAULT_KAPPA` without a
profile). Gathered edge rows (``allgather``: all ``E`` rows of the gathered width; ``halo``: the halo rows) add
``κ·b·Σ width·rows`` to the rank's edges' share. A pipeline stage counts its own units, the parameter-free geometry
once where it runs an interaction block, in the force mode's widths (:func:`stage_widths`), and, outside ``κ``, the
boundary tensors it receives and sends; a gpipe stage holds all ``C`` micro-batches until the flush, a 1f1b stage
``s`` at most ``S − s``. With conservative forces a stage's ``D`` pass back-propagates the force loss with the graph
retained for ``B``, so one micro-batch peaks at ``κ_D`` (the profiled step run as ``G``, ``D``, ``B``) where the single
process's combined backward frees as it goes; the others hold ``κ`` (gpipe: every ``G`` has run) or their forward
alone (1f1b: ``G`` runs only in the micro-batch's ``G``, ``D``, ``B`` block), each the largest micro-batch's share
(:func:`micro_batch_sizes`); with direct forces a 1f1b stage holds ``k`` of the largest at ``κ``. ``graph``: the
step's graph, ``40·E + 8·N`` bytes (int64 edge index and cell offsets, batch) and ``16·T`` when triplets are built
(the model reads them, or graph parallelism balances by them), plus a graph-parallel rank's local view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ....errors import ConfigError
from .bytes import padded_slots
from .layouts import AtomJob, AtomLayout, job_plan, micro_batch_sizes, stage_bounds
from .profile import DEFAULT_KAPPA_D_RATIO, AtomProfile
from .widths import conservative_forces, stage_widths, unit_parameters


@attrs.define
class AtomRankMemory:
    """Predicted bytes of one rank above the runtime floor, by kind (module docstring)."""

    rank: int
    stage: int
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    ema: int = 0
    allreduce: int = 0
    activations: int = 0
    graph: int = 0

    @property
    def states(self) -> int:
        """Parameters, gradients and optimizer state (with the EMA copy)."""
        return self.parameters + self.gradients + self.optimizer + self.ema

    @property
    def peak(self) -> int:
        return self.states + self.allreduce + self.activations + self.graph

    def to_dict(self) -> dict:
        return {**attrs.asdict(self), "peak": self.peak}



def read_edges(plan: Any, mode: str) -> list[int]:
    """Per rank, the edge rows its triplets read: all ``E`` (``allgather``; one rank: its own), or its own and its
    halo rows (``halo``)."""
    if plan.num_ranks == 1:
        return [plan.num_edges]
    if mode == "allgather":
        return [plan.num_edges] * plan.num_ranks
    return [int(e) + int(h.numel()) for e, h in zip(plan.edge_counts, plan.halo)]



def rank_memory(job: AtomJob, layout: AtomLayout, plan: Any, kappa: float, kappa_d: float | None = None, *,
                cache: dict | None = None) -> list[AtomRankMemory]:
    """Per rank of one replica (``S × G`` ranks; the other replicas' are alike or smaller), the predicted bytes
    above the runtime floor (module docstring). Stage ``s`` trains its units' parameters; a gpipe stage keeps
    every micro-batch's activations of its units until the flush, a 1f1b stage ``s`` at most ``k = S − s``
    micro-batches' (``C`` in all). With conservative forces (``S > 1``) one micro-batch peaks in its ``D`` pass at
    ``kappa_d`` (default ``kappa`` × :data:`DEFAULT_KAPPA_D_RATIO`): a gpipe stage holds ``κ·kept + (κ_D − κ)·m``,
    a 1f1b stage ``κ_D·m`` and the forward of ``k − 1`` others (at most ``(k − 1)·m``), ``m`` the largest micro-batch's
    kept bytes (:func:`micro_batch_sizes`); with direct forces a 1f1b stage ``κ·k·m`` (at most ``κ·kept``)."""
    model, b = job.model, job.element_size
    per_unit = unit_parameters(model)
    bounds = stage_bounds(len(model.units), layout.stages)
    edges, triplets, atoms = plan.edge_counts, [int(t.numel()) for t in plan.triplets], plan.atom_counts
    reads = read_edges(plan, job.mode)
    pads = padded_slots(plan)
    # the step's graph (int64): edge_index and cell offsets per edge, batch per atom, idx_kj / idx_ji per triplet
    # (built when the model reads triplets or under graph parallelism), and a graph-parallel rank's local view
    tri = bool(getattr(model, "uses_triplets", True)) or layout.gp > 1
    E, T, N = plan.num_edges, plan.num_triplets, plan.num_nodes

    def allreduce(P: int) -> int:
        # the gradients are summed over the D·G ranks of a stage only: none alone or in a pure pipeline; the
        # single process's and graph parallelism's flat buffer holds the loss too (allreduce_element_size), a
        # pipeline stage's is of the training dtype
        if layout.gp * layout.replicas == 1:
            return 0
        return P * b if layout.stages > 1 else (P + 1) * job.allreduce_element_size

    second = layout.stages > 1 and conservative_forces(model)  # the pipeline's G, D, B passes
    if layout.stages > 1:
        kappa_d = kappa * DEFAULT_KAPPA_D_RATIO if kappa_d is None else kappa_d
        mbs = micro_batch_sizes(job, layout.chunks, cache)
        K = sum(pads) / E if E else 0.0  # the padded slots per edge
    out = []
    for s, (lo, hi) in enumerate(bounds):
        P = sum(per_unit[lo:hi])
        k = min(layout.stages - s, layout.chunks) if layout.stages > 1 and layout.scheduler == "1f1b" else layout.chunks
        widths, boundary = stage_widths(model, lo, hi)
        factor = kappa
        if layout.stages > 1:  # the largest micro-batch's share of the stage's kept bytes
            whole = widths.total(E, T, N, E, K * E)
            largest = max(widths.total(e, t, n, e, K * e) for e, t, n in mbs) / whole if whole else 0.0
            if second:
                factor = (min((k - 1) * largest, 1.0 - largest) + kappa_d * largest if layout.scheduler == "1f1b"
                          else kappa + (kappa_d - kappa) * largest)
            elif layout.scheduler == "1f1b":
                factor = kappa * min(k * largest, 1.0)
        for g in range(layout.gp):
            gbytes = 40 * E + 8 * N + (16 * T if tri else 0)
            if layout.gp > 1:
                gbytes += 40 * edges[g] + 16 * triplets[g]
            kept = factor * b * widths.total(edges[g], triplets[g], atoms[g], reads[g], pads[g])
            kept += b * boundary.total(edges[g], 0, atoms[g]) * k / layout.chunks
            out.append(AtomRankMemory(
                rank=s * layout.gp + g, stage=s, parameters=P * b, gradients=P * b, optimizer=2 * P * b,
                ema=P * b if job.ema else 0, allreduce=allreduce(P),
                activations=int(kept), graph=int(gbytes)))
    return out


#: the runtime floor per GPU rank assumed for projections (CUDA context, allocator reserve, NCCL buffers)
GPU_FLOOR_BYTES = 2 * 2 ** 30



def layout_memory(job: AtomJob, layout: AtomLayout, profile: AtomProfile, *, floor_bytes: int | None = None
                  ) -> list[int]:
    """Per rank of ``layout`` (``D × S × G`` ranks in rank order, rank ``(d·S + s)·G + g``), the predicted peak
    in bytes: :func:`rank_memory` of the first replica (the others' are alike) plus the runtime floor
    (``floor_bytes``; default the profile's on the CPU, :data:`GPU_FLOOR_BYTES` for a profile taken on a GPU).

    Raises:
        ModelDescriptionError: a model that does not describe its widths.
    """
    cache: dict = {}
    plan = job_plan(job, layout.gp, cache)
    mem = rank_memory(job, layout, plan, profile.kappa, profile.retained_kappa, cache=cache)
    if floor_bytes is None:
        floor_bytes = GPU_FLOOR_BYTES if profile.device == "cuda" else profile.floor_bytes
    return [m.peak + int(floor_bytes) for m in mem] * layout.replicas



def check_device_memory(per_rank: Sequence[int], free: Sequence[int], *, names: Sequence[str] | None = None,
                        what: str = "") -> None:
    """Refuse, before any rank starts, ranks whose predicted peaks do not fit their GPUs: local rank ``r`` computes
    on GPU ``r mod len(free)`` (round robin, as the ranks place themselves), so each GPU must hold the sum of its
    ranks' predictions.

    Args:
        per_rank: predicted bytes of each local rank (:func:`layout_memory`). free: free bytes of each GPU
            (``torch.cuda.mem_get_info``). names: the GPUs' names for the message. what: the layout, for the message.

    Raises:
        ConfigError: a GPU whose ranks need more than it has free; the message gives the prediction, the free
            memory and the ways out.
    """

    if not free:
        return
    need = [0] * len(free)
    ranks: list[list[int]] = [[] for _ in free]
    for r, b in enumerate(per_rank):
        need[r % len(free)] += int(b)
        ranks[r % len(free)].append(r)
    for g, (n, f) in enumerate(zip(need, free)):
        if n > f:
            name = f" ({names[g]})" if names else ""
            who = f"rank {ranks[g][0]}" if len(ranks[g]) == 1 else f"ranks {', '.join(map(str, ranks[g]))}"
            raise ConfigError(
                f"the memory model predicts {format_gib(n)} GiB on GPU {g}{name} for {who}{what} (the largest "
                f"{format_gib(max(per_rank[r] for r in ranks[g]))} GiB), but {format_gib(f)} GiB are free there; "
                f"spread the "
                f"structures' graphs over more ranks (--gp-size), the blocks over --stages, use a smaller "
                f"--batch-size or --amp, or pass --no-memory-check to try anyway")



def format_gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f}"
