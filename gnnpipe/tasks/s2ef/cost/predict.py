"""One layout's prediction (bytes, memory, step time) and the ranking of every layout of a number of ranks.

**Step time** (:func:`predict_step`): the profiled single-process seconds of a step on this machine (a short
profile: :func:`profile_step`) split by work: a rank computes ``t₁ · work(E_r, T_r, N_r) / work(E, T, N)`` with the
analytic multiply-add counts per edge, triplet and atom (:func:`work_weights`), slowed by ``ranks / cores`` when
more ranks than cores share a CPU node and divided by the hardware's speed; plus the collectives' bytes over the
group's link (latency per message) and the gradient all-reduce (``2(R−1)/R·P_s·b`` over the ``D·G`` ranks of a
stage). Pipelining: the stage's share ``1/S`` of the blocks, the gpipe bubble ``(S−1)/(C+S−1)``
(``step = (C+S−1)·t_stage/C``), and the boundary tensors (per micro-batch and boundary the edge messages
``E·H``, the radial basis ``E·R``, the running per-atom output ``N``, forward and back; with conservative forces
again in ``G`` and ``D`` with the position gradients' ``3N``) over the link.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from ....costmodel.hardware import Hardware, Link, local_hardware
from ....errors import ConfigError
from .bytes import padded_slots, step_bytes, step_collectives
from .layouts import AtomJob, AtomLayout, enumerate_atom_layouts, job_plan, stage_bounds
from .memory import GPU_FLOOR_BYTES, format_gib, rank_memory, read_edges
from .profile import AtomProfile
from .schedule import pipeline_compute
from .widths import boundary_widths, unit_parameters, work_weights


@attrs.define
class AtomPrediction:
    """Predictions for one layout: ``step_s`` seconds per training step (slowest rank, with the gradient
    all-reduce), ``compute_s``/``comm_s`` per rank, ``bytes`` per step summed over ranks (``gp``: the graph-parallel
    collectives, exact for ``S = 1``; ``grad``: the gradient all-reduce; ``boundary``: pipeline boundaries),
    ``memory`` per rank, ``fits`` the hardware's memory, ``bubble`` (gpipe's idle share), ``work_s`` per rank the
    predicted CPU seconds of its step's compute (from the profile's CPU seconds: compare with a run's CPU time when
    other processes share the cores)."""

    layout: AtomLayout
    step_s: float
    compute_s: list
    comm_s: list
    bytes: dict
    memory: list
    fits: bool
    bubble: float = 0.0
    floor_bytes: int = 0
    structures: int = 0
    work_s: list = attrs.field(factory=list)

    @property
    def throughput(self) -> float:
        """Structures per second: ``D`` replicas' batches per step."""
        return self.layout.replicas * self.structures / self.step_s if self.step_s > 0 else float("inf")

    @property
    def max_rank_bytes(self) -> int:
        return max(m.peak for m in self.memory) + self.floor_bytes

    def to_record(self) -> dict:
        L = self.layout
        return {"layout": L.label(), "stages": L.stages, "gp": L.gp, "replicas": L.replicas, "chunks": L.chunks,
                "scheduler": L.scheduler, "step_s": self.step_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
                "bytes": self.bytes, "bubble": self.bubble, "fits": self.fits, "floor_bytes": self.floor_bytes,
                "max_rank_bytes": self.max_rank_bytes,
                "structures_per_s": self.throughput, "memory": [m.to_dict() for m in self.memory]}


#: a link for a prediction without a measured one or a hardware description's (loopback gloo, order of magnitude)
FALLBACK_LINK = (50e-6, 1e9)



def predict_layout(job: AtomJob, layout: AtomLayout, profile: AtomProfile, hardware: Any = None, *,
                   cache: dict | None = None, floor_bytes: int | None = None) -> AtomPrediction:
    """Predict one layout (module docstring): step time, bytes, per-rank memory and whether it fits."""

    hw = hardware if hardware is not None else local_hardware()
    cache = {} if cache is None else cache
    S, G, D, C = layout.stages, layout.gp, layout.replicas, layout.chunks
    R = layout.ranks
    model, b = job.model, job.element_size
    plan = job_plan(job, G, cache)
    B = len(job.structures)
    conservative = not bool(getattr(model, "direct_forces", False))
    per_unit_bytes = step_bytes(model, plan, num_structures=B, mode=job.mode, element_size=b, backend=job.backend)
    colls = step_collectives(model, plan, num_structures=B, mode=job.mode, element_size=b, backend=job.backend)
    bounds = stage_bounds(len(model.units), S)
    works = work_weights(model)
    per_unit_p = unit_parameters(model)
    edges, triplets, atoms = plan.edge_counts, [int(t.numel()) for t in plan.triplets], plan.atom_counts
    reads = read_edges(plan, job.mode)
    pads = padded_slots(plan)
    measured = Link(*(profile.link or FALLBACK_LINK))
    members = list(range(G))  # one GP group of the first replica (block placement: the tightest group)
    gp_link = hw.group_link(members, R, measured)
    grad_link = hw.group_link(list(range(0, R, S)) if S > 1 else list(range(R)), R, measured)
    stage_link = hw.link(0, G, R, measured) if S > 1 else measured
    slow = max(1.0, hw.oversubscription(R)) if hw.kind == "cpu" else 1.0
    spw = profile.seconds_per_work / hw.speed
    bw_unit = boundary_widths(model)
    work_s: dict[tuple[int, int], float] = {}  # (stage, gp rank) -> seconds of the stage's compute on the share
    comm_s: dict[tuple[int, int], float] = {}  # (stage, gp rank) -> seconds of its communication outside compute
    cpu = []
    gp_total = bnd_total = grad_total = 0.0
    for s, (lo, hi) in enumerate(bounds):
        P = sum(per_unit_p[lo:hi])
        units = set(range(lo, hi)) | ({-1} if hi == len(model.units) else set())
        # a pipeline stage's flat gradient is of the training dtype; one stage's also holds the loss (float64)
        ar_bytes = P * b if S > 1 else (P + 1) * job.allreduce_element_size
        ar_s = grad_link.allreduce_time(ar_bytes, D * G)
        grad_total += D * G * (2.0 * (D * G - 1) * ar_bytes / (D * G) if D * G > 1 else 0.0)
        for g in range(G):
            work = sum(w.total(edges[g], triplets[g], atoms[g], reads[g], pads[g]) for w in works[lo:hi])
            work_s[s, g] = spw * work * slow
            gb = sum(v for u, v in per_unit_bytes[g].items() if u in units)
            share = (hi - lo) / len(model.units)
            n_coll = colls[g] * share * (C if S > 1 else 1)
            t_gp = gb / gp_link.bandwidth_Bps + n_coll * 2 * max(G - 1, 0) * gp_link.latency_s if G > 1 else 0.0
            nb = 0.0
            if S > 1:
                sides = (s > 0) + (s < S - 1)
                # per side: F (or B) carries the boundary; with conservative forces G and D carry it again with
                # the running position gradient (3 per atom)
                nb = sides * b * (bw_unit.total(edges[g], 0, atoms[g]) * (2 if conservative else 1)
                                  + (3 * atoms[g] if conservative else 0))
            t_b = nb / stage_link.bandwidth_Bps + (C * (2 if conservative else 1) * sides * stage_link.latency_s
                                                   if S > 1 else 0.0)
            gp_total += D * gb
            bnd_total += D * nb
            cpu.append(profile.step_cpu_s / max(profile.work, 1.0) * work / hw.speed)
            comm_s[s, g] = t_gp + t_b + ar_s
    # the stages' compute through the run's own schedule (its bubbles, unequal stages), per graph-parallel rank
    makespan, idle = pipeline_compute(layout, conservative, [[work_s[s, g] for s in range(S)] for g in range(G)])
    compute = [makespan[g] for s in range(S) for g in range(G)]
    comm = [comm_s[s, g] for s in range(S) for g in range(G)]
    step = max(makespan[g] + comm_s[s, g] for s in range(S) for g in range(G))
    mem = rank_memory(job, layout, plan, profile.kappa, profile.retained_kappa, cache=cache)
    if floor_bytes is None:
        floor_bytes = GPU_FLOOR_BYTES if hw.kind == "gpu" else profile.floor_bytes
    fits = hw.fits([m.peak + floor_bytes for m in mem] * D)
    return AtomPrediction(layout=layout, step_s=step, compute_s=compute, comm_s=comm,
                          bytes={"gp": gp_total, "grad": grad_total, "boundary": bnd_total}, memory=mem, fits=fits,
                          bubble=idle, floor_bytes=int(floor_bytes), structures=B,
                          work_s=cpu)



def local_gpu_hardware() -> Any:
    """This machine's GPUs as a :class:`~gnnpipe.costmodel.hardware.Hardware` of kind ``"gpu"`` (one node, a device
    per GPU, each GPU's total memory as the device limit; links: the profile's), for plans profiled on CUDA.

    Raises:
        ConfigError: no CUDA GPU here.
    """


    if not torch.cuda.is_available():
        raise ConfigError("--device cuda needs a CUDA GPU, and none is available; use --device cpu")
    n = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    return Hardware(name=f"this machine's {n} x {props.name}", nodes=1, devices_per_node=n, kind="gpu", speed=1.0,
                    device_memory_bytes=int(props.total_memory))



def plan_atomistic(job: AtomJob, ranks: int, profile: AtomProfile, hardware: Any = None, *,
                   chunks_per_stage: Sequence[int] = (1, 4), schedulers: Sequence[str] = ("gpipe", "1f1b"),
                   stages: bool = True, floor_bytes: int | None = None) -> list[AtomPrediction]:
    """Predict every ``S × G × D`` layout of ``ranks`` (:func:`enumerate_atom_layouts`); those that fit first, then by
    step time.

    Sorted by throughput (structures per second: ``D·B / step``), those that fit first.

    Raises:
        ConfigError: bad ``ranks``.
    """
    layouts = enumerate_atom_layouts(ranks, len(job.model.units), len(job.structures),
                                     chunks_per_stage=chunks_per_stage, schedulers=schedulers, stages=stages)
    cache: dict = {}
    preds = [predict_layout(job, lay, profile, hardware, cache=cache, floor_bytes=floor_bytes) for lay in layouts]
    return sorted(preds, key=lambda p: (not p.fits, p.step_s / p.layout.replicas))



def format_atom_ranking(preds: Sequence[AtomPrediction], hardware: Any = None, *, params: int | None = None) -> str:
    """The ranking as a table: layout, step seconds, structures per second, MB per step (gp, gradient, boundary),
    the largest rank's parameters+gradients+Adam (GiB), its activations (GiB), its total with the floor (GiB), fits."""
    head = (f"{'layout':<22} {'step s':>9} {'struct/s':>9} {'gp MB':>9} {'grad MB':>9} {'bnd MB':>8} "
            f"{'states GiB':>10} {'act GiB':>8} {'rank GiB':>9} {'bubble':>6}  fits")
    lines = []
    if hardware is not None:
        lines.append(f"hardware: {hardware.name}" + (f"; {params:.3g} parameters" if params else ""))
    lines.append(head)
    for p in preds:
        top = max(p.memory, key=lambda m: m.peak)
        lines.append(f"{p.layout.label():<22} {p.step_s:>9.3g} {p.throughput:>9.3g} {p.bytes['gp'] / 1e6:>9.2f} "
                     f"{p.bytes['grad'] / 1e6:>9.1f} {p.bytes['boundary'] / 1e6:>8.2f} "
                     f"{format_gib(top.states + top.allreduce):>10} {format_gib(top.activations):>8} "
                     f"{format_gib(p.max_rank_bytes):>9} {p.bubble:>6.2f}  {'yes' if p.fits else 'NO'}")
    return "\n".join(lines)
