"""A layout's epoch time (:func:`predict_time`): the actual schedule simulated with the profile's costs.

Per stage and chunk, forward and backward seconds from the profile's fits (:mod:`.profile`) on the chunk's rows,
halo and in-edges, corrected by the measured size factor at the chunk's rows
(:func:`~gnnpipe.tasks.nodes.cost.profile.size_factor`) and divided by the hardware's speed factor; a pipeline's
units run their fused chunk step, a hybrid's and graph parallelism's the plain path (:attr:`UnitKind.unfused`). To
the units a rank's main thread adds the runtime's cost per chunk action, graph parallelism's per-op bookkeeping
(:attr:`Profile.gp_op_s`, :attr:`Profile.gp_op_s_per_elem`) or a hybrid's (:attr:`Profile.hybrid_op_s`), and its CPU
per message sent or received (:meth:`Profile.msg_cpu`) — all measured by the profiler on this machine. Ranks of a
CPU node that compute at once share its caches and memory bandwidth: each unit is slowed by the share
``(m − 1)/(P − 1)`` of its measured contention (``gnnpipe.tasks.nodes.cost.profile.measure_contention``: the same
chunk passes on ``P`` cores at once), ``m`` the mean number of the node's ranks computing at once in the simulation
(at most its cores); with more ranks than cores, by the contention measured with that many processes time-sliced on
the cores (:meth:`~gnnpipe.tasks.nodes.cost.profile.UnitKind.contention`). Stage-boundary sends go over the
hardware's links (``latency + bytes/bandwidth``, overlapped with compute as gloo's ``isend`` is; on a link whose
exchange rate is under half its bandwidth the two directions share one channel at twice the exchange rate, first
come first served); the optimizer step costs seconds per parameter; then the discrete-event simulation of the actual
schedule (:func:`gnnpipe.schedulers.simulate`). Graph parallelism: per unit the slowest way, plus a halo exchange
per aggregation op in each direction (the largest halo a rank receives over its link; on links ``per_pair``, the
largest pair's rows over that pair's own link) and one all-reduce. Hybrid: a way's schedule where every slot costs
the slowest way's chunk plus the peers' exchange of the slot's rows per op, and the step adds the peer all-reduce.
Ranks beyond a CPU node's cores share them: compute is slowed by ``max(1, demand / cores)``, with ``demand`` the
mean number of that node's ranks computing at once in the unshared simulation (work / makespan), and the schedule is
simulated again; and the epoch is at least :func:`~.host_costs.shared_cores_bound` — the node's work plus the core
time each blocking wait and each byte sent costs when ranks are time-sliced (measured with more ranks than cores),
over its cores.

The parts: :class:`EpochInputs` (what every part reads), :func:`single_time`, :func:`graph_parallel_time` and
:func:`pipeline_time` (a pipeline's or hybrid's, with :class:`PipelineCosts`, the costs of one way's slots); the
host's costs are :class:`~.host_costs.HostCosts`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ....costmodel.hardware import Hardware, Link
from ....schedulers import build_schedule, simulate
from ....schedulers.simulate import CommModel
from ..trainer import DTYPES
from .epoch_bytes import predict_bytes
from .geometry import Geometry, plan_geometry, stage_units
from .host_costs import HostCosts
from .profile import Profile


@dataclass
class _LinkComm(CommModel):
    """Boundary sends with a per-pair link (``link(src_stage, dst_stage) -> Link``)."""

    link: Callable[[int, int], Link] | None = None

    def time(self, src: int, dst: int, action) -> float:
        return self.link(src, dst).time(self.nbytes(src, dst, action))


def _simulate(scheduler: str, S: int, C: int, fw, bw, step, nbytes, link, duplex: bool = True) -> Any:
    """The simulated ``scheduler`` schedule of ``S`` stages and ``C`` chunks (:func:`gnnpipe.schedulers.simulate`):
    ``fw`` / ``bw`` ``[S][C]`` seconds of each forward / backward, ``step`` ``[S]`` seconds of each optimizer step,
    ``nbytes(src, dst, action)`` a boundary send's bytes over ``link(src, dst)``; ``duplex``: the two directions of
    a link do not share one channel."""
    sched = build_schedule(scheduler, S, C)

    def cost(a) -> float:
        k = a.kind.name if hasattr(a.kind, "name") else str(a.kind)
        if k == "STEP":
            return step[a.stage]
        return (fw if k == "F" else bw)[a.stage][a.chunk]

    comm = _LinkComm(bytes_per_chunk=nbytes, link=link, duplex=duplex)
    return simulate(sched, costs=cost, comm=comm)


@dataclass(frozen=True)
class EpochInputs:
    """What every part of one layout's epoch-time prediction reads.

    Attributes:
        profile: the profile. hardware: the machine. host: the host's costs for the layout's ranks.
        b: bytes per element of ``--dtype``. W: ways. S: stages.
        measured: the profile's point-to-point link (a free one when it measured none). measured_ar: its
            all-reduce link (``measured`` when none).
        step_pp: optimizer step seconds per parameter on this hardware.
        P_units: trained parameters per unit (``[U]``).
        back_units: the units whose aggregation input gradient is exchanged (``GNNModel.backward_aggregation_dims``).
        push_units: the message-passing units (their backward pushes halo gradients).
        recompute: the configured ``recompute`` (true: every backward repeats its forward). scheduler: its name.
        epoch_bytes: the layout's :func:`~.epoch_bytes.predict_bytes`, computed on the first call only if the
            caller did not give it.
    """

    profile: Profile
    hardware: Hardware
    host: HostCosts
    b: int
    W: int
    S: int
    measured: Link
    measured_ar: Link
    step_pp: float
    P_units: list[int]
    back_units: set[int]
    push_units: set[int]
    recompute: Any
    scheduler: str
    epoch_bytes: Callable[[], dict]

    @classmethod
    def of(cls, config, plan, model, profile: Profile, hardware: Hardware,
           epoch_bytes: dict | None = None) -> EpochInputs:
        """The inputs of ``config``'s layout with ``plan`` and ``model`` on ``hardware``."""
        W, S = config.ways, config.stages
        measured = profile.p2p or Link(0.0, 1e12)  # no measured link: communication is (almost) free
        return cls(
            profile=profile, hardware=hardware, host=HostCosts(profile, hardware, W * S),
            b=torch.finfo(DTYPES[config.dtype]).bits // 8, W=W, S=S, measured=measured,
            measured_ar=profile.allreduce or measured, step_pp=profile.step_s_per_param / hardware.speed,
            P_units=[profile.kind(u).params for u in range(len(profile.units))],
            back_units={i for i, _, _ in model.backward_aggregation_dims()},  # ops whose input gradient is exchanged
            push_units={i for i, u in enumerate(model.units) if getattr(u, "message_passing", False)},
            recompute=config.recompute, scheduler=config.scheduler,
            epoch_bytes=lambda: epoch_bytes or predict_bytes(config, plan, model))

    @property
    def R(self) -> int:
        """The layout's ranks, ``W·S``."""
        return self.W * self.S


def predict_time(config, plan, model, profile: Profile, hardware: Hardware,
                 epoch_bytes: dict | None = None) -> tuple[float, list[float], float, list]:
    """``(epoch seconds, compute seconds per rank, CPU-sharing slowdown, CPU work seconds per rank)`` for ``plan``
    on ``hardware`` (the work is the compute without the sharing slowdown: what the rank's thread CPU time measures).
    ``epoch_bytes``: the plan's :func:`~.epoch_bytes.predict_bytes`, if the caller has it (computed here only when
    needed).

    Work of a rank: its units on its chunks or part (``UnitKind.time``, the plain path for graph parallelism
    and hybrids; a pipeline's scaled by :attr:`Profile.executor_scale`), the runtime's cost per chunk action
    (pipeline, hybrid) or graph parallelism's bookkeeping per op (:attr:`Profile.gp_op_s`), its main thread's CPU
    per message sent or received (:meth:`Profile.msg_cpu`; a stage boundary's also half its link's
    ``cpu_s_per_byte`` per byte, where that is more) and the optimizer step. A batched exchange (graph
    parallelism's per op, a hybrid's peer op) takes the link's time, and on a CPU node at least the host
    transport's (:attr:`Profile.host_exchange`). The epoch is the simulated
    schedule (module docstring); on a CPU node with more ranks than cores, at least
    :func:`~.host_costs.shared_cores_bound` of its ranks, each byte sent costing the host the larger of
    :attr:`Profile.switch_byte_s` and its links' ``cpu_s_per_byte`` (:class:`gnnpipe.costmodel.hardware.Link`)."""
    x = EpochInputs.of(config, plan, model, profile, hardware, epoch_bytes)
    if x.W == 1 and x.S == 1:
        return single_time(x)
    g = plan_geometry(plan, config)
    if x.S == 1:
        return graph_parallel_time(x, g)
    return pipeline_time(x, g)


def single_time(x: EpochInputs) -> tuple[float, list[float], float, list]:
    """A single process's epoch: every unit's whole-graph forward and backward seconds over the speed factor, and
    the optimizer step; :func:`predict_time`'s tuple with one rank and no slowdown."""
    profile = x.profile
    U = len(profile.units)
    t = sum(profile.kind(u).whole_forward_s + profile.kind(u).whole_backward_s for u in range(U))
    t = t / x.host.speed + x.step_pp * sum(x.P_units)
    return t, [t], 1.0, [t]


def graph_parallel_pass(x: EpochInputs, g: Geometry, k: float, cont: float = 0.0) -> tuple[float, list[float]]:
    """One epoch of graph parallelism with compute slowed by ``k`` (the CPU-sharing slowdown, ≥ 1) and the units'
    contention at level ``cont`` (:meth:`~.host_costs.HostCosts.contended`): per unit and phase the slowest way's
    seconds (its units, bookkeeping and messages per op), a batched exchange per op and direction, the all-reduce
    and the optimizer step.

    Returns:
        ``(epoch seconds, compute seconds per way [W])``.
    """
    profile, hardware, hc = x.profile, x.hardware, x.host
    W, R, b, U = x.W, x.R, x.b, len(profile.units)
    speed, host, msg, exchange_s = hc.speed, hc.host_speed, hc.msg, hc.exchange_s
    measured, measured_ar, step_pp, P_units, back_units = x.measured, x.measured_ar, x.step_pp, x.P_units, x.back_units
    sent, pairs_out, pairs_in = g.way_sent, g.way_peers_out, g.way_peers_in
    halo = g.way_feats[:, 2]
    comp = [0.0] * W
    total = 0.0
    link = hardware.group_link(list(range(W)), R, measured)
    for u in range(U):
        for phase in ("F", "B"):
            ts = []
            for w in range(W):
                f = g.way_feats[w]
                t = profile.kind(u).time(f, phase, fused=False, contended=cont) * k / speed
                if phase == "F" or u in back_units:  # the op's exchange: bookkeeping and messages
                    for d in profile.agg_dims[u]:
                        t += (profile.gp_op_s + profile.gp_op_s_per_elem * (f[1] + f[2]) * d) * k / host
                        out_b, in_b = (sent[w], halo[w]) if phase == "F" else (halo[w], sent[w])
                        t += (pairs_out[w] * msg(out_b * d * b / max(pairs_out[w], 1))
                              + pairs_in[w] * msg(in_b * d * b / max(pairs_in[w], 1))) * k
                ts.append(t)
            total += max(ts)
            for w in range(W):
                comp[w] += ts[w]
    if link.per_pair:  # every pair its own link, all at once: the largest pair's rows (either way)
        rows = max((max(n, g.pair_sent.get((q, p), 0)) for (p, q), n in g.pair_sent.items()), default=0)
    else:  # one link per rank: the largest halo any rank receives
        rows = max(float(halo.max()), g.mirror_fwd / W)
    for u in range(U):
        for d in profile.agg_dims[u]:
            n_dir = 2 if u in back_units else 1  # forward rows, and their gradients back where needed
            total += n_dir * exchange_s(link, rows * d * b)  # batched: both ways
    P = sum(P_units)
    ar = hardware.group_link(list(range(W)), R, measured_ar)
    total += ar.allreduce_time(P * b, W) + step_pp * P * k
    return total, [c + step_pp * P * k for c in comp]


def graph_parallel_time(x: EpochInputs, g: Geometry) -> tuple[float, list[float], float, list]:
    """Graph parallelism's epoch (``S = 1``; :func:`predict_time`'s tuple): :func:`graph_parallel_pass` unshared,
    then again with the CPU-sharing slowdown and the contention it finds; at least the time-sliced bound."""
    profile, hc, W, U = x.profile, x.host, x.W, len(x.profile.units)
    pairs_out, pairs_in = g.way_peers_out, g.way_peers_in
    t1, comp1 = graph_parallel_pass(x, g, 1.0)
    k, cont = hc.share_factor(comp1, t1), hc.contended(comp1, t1)
    work = list(graph_parallel_pass(x, g, 1.0, cont)[1])  # CPU work: contended, not time-sliced
    if k > 1.0 or cont > 0.0:
        t1, comp1 = graph_parallel_pass(x, g, k, cont)
    n_ex = sum(len(profile.agg_dims[u]) * (2 if u in x.back_units else 1) for u in range(U))
    waits = [n_ex + 2 * (W - 1)] * W  # the exchanges, and the steps of the ring all-reduce
    extra = [n_ex * max(0, max(pairs_out[w], pairs_in[w]) - 1) for w in range(W)]
    return max(t1, hc.bound(work, waits, extra, x.epoch_bytes)), comp1, k, work


class PipelineCosts:
    """The costs of one way's schedule of a pipeline or hybrid, every slot (a chunk's index within its way) the
    slowest way's chunk, plus a hybrid's peer exchange per op.

    Attributes:
        x: the inputs. g: the plan's geometry. Cw: chunks per way. bases: each way's first chunk (``[W]``).
        fused: the units run their fused chunk step (a pipeline; a hybrid's peer op runs a unit's plain path).
        unit_scale: the pipeline executor against the fitted units (:attr:`Profile.executor_scale`, measured with
            the fused path; 1 for a hybrid). overhead: the runtime's seconds per chunk action on the host.
        duplex: the two directions of every stage boundary's link have a channel each (see :meth:`link`).
    """

    def __init__(self, x: EpochInputs, g: Geometry):
        W, S, hardware, R, measured = x.W, x.S, x.hardware, x.R, x.measured
        self.x, self.g = x, g
        # the runtime's per-action bookkeeping runs on the host CPU: a GPU's speed factor does not shorten it
        self.overhead = x.profile.action_overhead_s / x.host.host_speed
        self.Cw = (len(g.chunk_ptr) - 1) // W
        self.bases = [g.way_ptr[w] for w in range(W)]
        self.fused = W == 1  # a hybrid's peer op runs a unit's plain path
        # the pipeline executor against the fitted units (measured with the fused path: a pipeline's, not a hybrid's)
        self.unit_scale = x.profile.executor_scale if self.fused else 1.0
        # a transport that gets less than the full rate each way while both ends send (``exchange_gbps`` under half
        # the bandwidth: gloo over a shaped veth) shares one channel per pair of stages between the two directions
        self.duplex = all(lk.exchange_Bps is None or 2 * lk.exchange_Bps >= lk.bandwidth_Bps
                          for lk in (hardware.link(w * S + s, w * S + s + 1, R, measured) for w in range(W)
                                     for s in range(S - 1)))

    def exch(self, c_local: int, s: int, backward: bool) -> tuple[float, float]:
        """``(link seconds, main-thread CPU seconds)`` of the peer exchanges of slot ``c_local`` on stage ``s``
        (forward, or ``backward``); ``(0, 0)`` for a pipeline."""
        x, g, bases = self.x, self.g, self.bases
        W, S, R, b, profile = x.W, x.S, x.R, x.b, x.profile
        msg, exchange_s = x.host.msg, x.host.exchange_s
        if W == 1:
            return 0.0, 0.0
        lo, hi = stage_units(g.bounds, s)
        members = [w * S + s for w in range(W)]
        link = x.hardware.group_link(members, R, x.measured)
        t = cpu = 0.0
        for u in range(lo, hi):
            if backward and u not in x.back_units:
                continue
            rows_tab = (g.peer_rows_push if u in x.push_units else g.peer_rows_bwd) if backward else g.peer_rows
            pairs = [rows_tab.get(bases[w] + c_local, (0, 0)) for w in range(W)]
            rows = max(max(p) for p in pairs)
            sent, recv = max(p[0] for p in pairs), max(p[1] for p in pairs)
            for d in profile.agg_dims[u]:
                t += exchange_s(link, rows * d * b)  # one batched exchange, both ways
                cpu += (W - 1) * (msg(sent * d * b / (W - 1)) + msg(recv * d * b / (W - 1)))
        return t, cpu

    def boundary_bytes(self, s: int, c_local: int) -> float:
        """Bytes of the boundary tensor between stages ``s`` and ``s + 1`` of slot ``c_local`` (slowest way)."""
        x, g = self.x, self.g
        hi = stage_units(g.bounds, s)[1]
        d = x.profile.unit_dims[hi - 1][1] + x.profile.shared_dim
        return max(g.chunk_feats[self.bases[w] + c_local][1] for w in range(x.W)) * d * x.b

    def boundary_cpb(self, s: int) -> float:
        """The host CPU per byte (``Link.cpu_s_per_byte``, seconds) of the link between stages ``s`` and ``s + 1``,
        the largest over the ways."""
        x = self.x
        W, S = x.W, x.S
        return max(x.hardware.link(w * S + s, w * S + s + 1, x.R, x.measured).cpu_s_per_byte for w in range(W))

    def hyb(self, c_local: int, s: int, backward: bool) -> float:
        """A hybrid's peer-op bookkeeping seconds of slot ``c_local`` on stage ``s`` (the slowest way's), summed
        over its ops; 0 for a pipeline."""
        x, g, bases = self.x, self.g, self.bases
        W, profile = x.W, x.profile
        if W == 1:
            return 0.0
        lo, hi = stage_units(g.bounds, s)
        t = 0.0
        for u in range(lo, hi):
            if backward and u not in x.back_units:
                continue
            rows_tab = (g.peer_rows_push if u in x.push_units else g.peer_rows_bwd) if backward else g.peer_rows
            rows = max(sum(rows_tab.get(bases[w] + c_local, (0, 0))) for w in range(W))
            for d in profile.agg_dims[u]:
                t += profile.hybrid_op_s + profile.hybrid_op_s_per_elem * rows * d
        return t / x.host.host_speed

    def costs(self, k: float, cont: float = 0.0) -> tuple[list[list[float]], list[list[float]], list[float]]:
        """``(fw, bw, step)``: seconds of each slot's forward and backward (``[S][Cw]``: units, recompute, the
        runtime's action cost, boundary messages, peer exchanges and bookkeeping) and of each stage's optimizer
        step with its peer all-reduce (``[S]``), compute slowed by ``k`` at contention level ``cont``."""
        x, g, bases, Cw = self.x, self.g, self.bases, self.Cw
        W, S, R, b, profile, hardware = x.W, x.S, x.R, x.b, x.profile, x.hardware
        msg, speed, step_pp, P_units = x.host.msg, x.host.speed, x.step_pp, x.P_units
        fused, unit_scale, overhead = self.fused, self.unit_scale, self.overhead
        boundary_bytes, boundary_cpb, exch, hyb = self.boundary_bytes, self.boundary_cpb, self.exch, self.hyb
        fw = [[0.0] * Cw for _ in range(S)]
        bw = [[0.0] * Cw for _ in range(S)]
        for s in range(S):
            lo, hi = stage_units(g.bounds, s)
            for c in range(Cw):
                fw[s][c] = max(profile.stage_time(lo, hi, g.chunk_feats[bases[w] + c], "F", fused, cont)
                               for w in range(W)) * k * unit_scale / speed
                bw[s][c] = max(profile.stage_time(lo, hi, g.chunk_feats[bases[w] + c], "B", fused, cont)
                               for w in range(W)) * k * unit_scale / speed
                if x.recompute:
                    bw[s][c] += fw[s][c]
                # messages on the main thread: F receives from s-1 and sends to s+1, B the reverse
                m_f = ((msg(boundary_bytes(s - 1, c), boundary_cpb(s - 1)) if s > 0 else 0.0)
                       + (msg(boundary_bytes(s, c), boundary_cpb(s)) if s < S - 1 else 0.0))
                m_b = m_f
                ef, cf = exch(c, s, False)
                eb, cb = exch(c, s, True)
                fw[s][c] += ef + (overhead + m_f + cf + hyb(c, s, False)) * k
                bw[s][c] += eb + (overhead + m_b + cb + hyb(c, s, True)) * k
        step = []
        for s in range(S):
            lo, hi = stage_units(g.bounds, s)
            P_s = sum(P_units[lo:hi])
            t = step_pp * P_s * k
            if W > 1:
                members = [w * S + s for w in range(W)]
                t += hardware.group_link(members, R, x.measured_ar).allreduce_time(P_s * b, W)
            step.append(t)
        return fw, bw, step

    def nbytes(self, src: int, dst: int, a) -> float:
        """Bytes of the boundary send of action ``a`` between stages ``src`` and ``dst``."""
        return self.boundary_bytes(min(src, dst), a.chunk)

    def link(self, src: int, dst: int) -> Link:
        """The slowest way's link between stages ``src`` and ``dst`` (slowest at 1 MiB); on a link whose exchange
        rate is under half its bandwidth, one channel for the pair at twice the exchange rate."""
        x = self.x
        W, S = x.W, x.S
        # the slowest way's link between these two stages
        worst = None
        for w in range(W):
            lk = x.hardware.link(w * S + src, w * S + dst, x.R, x.measured)
            if worst is None or lk.time(1 << 20) > worst.time(1 << 20):
                worst = lk
        if worst.exchange_Bps is not None and 2 * worst.exchange_Bps < worst.bandwidth_Bps:
            # both directions at once get less than the full rate each: one channel for the pair, at the rate
            # the two directions get together
            worst = Link(worst.latency_s, 2 * worst.exchange_Bps)
        return worst

    def run(self, k: float, cont: float = 0.0):
        """``(makespan seconds, compute seconds per rank [R], (fw, bw, step))``: the schedule simulated with
        :meth:`costs` ``(k, cont)``; a rank's compute is its stage's forwards, backwards and step."""
        x = self.x
        W, S = x.W, x.S
        fw, bw, step = self.costs(k, cont)
        res = _simulate(x.scheduler, S, self.Cw, fw, bw, step, self.nbytes, self.link, self.duplex)
        comp = [sum(fw[s]) + sum(bw[s]) + step[s] for s in range(S)]
        per_rank = [comp[s] for w in range(W) for s in range(S)]
        return res.makespan, per_rank, (fw, bw, step)


def pipeline_time(x: EpochInputs, g: Geometry) -> tuple[float, list[float], float, list]:
    """A pipeline's or hybrid's epoch (``S > 1``; :func:`predict_time`'s tuple): one way's schedule
    (:class:`PipelineCosts`) simulated unshared, then with the CPU-sharing slowdown and the contention it finds; at
    least the time-sliced bound of waits per rank (boundary receives, peer exchanges, all-reduce steps)."""
    hc, profile = x.host, x.profile
    W, S, step_pp, P_units = x.W, x.S, x.step_pp, x.P_units
    pc = PipelineCosts(x, g)
    Cw, exch = pc.Cw, pc.exch
    t1, comp1, parts = pc.run(1.0)
    k, cont = hc.share_factor(comp1, t1), hc.contended(comp1, t1)
    if cont > 0.0:  # ranks computing at once share the caches and the memory bandwidth: the units slow
        parts = pc.run(1.0, cont)[2]
    # CPU work per rank: the costs without the link time of the peer exchanges (not CPU) and the all-reduce
    fw, bw, _ = parts
    work_stage = []
    for s in range(S):
        lo, hi = stage_units(g.bounds, s)
        link_s = sum(exch(c, s, False)[0] + exch(c, s, True)[0] for c in range(Cw))
        work_stage.append(sum(fw[s]) + sum(bw[s]) - link_s + step_pp * sum(P_units[lo:hi]))
    work = [work_stage[s] for w in range(W) for s in range(S)]
    if k > 1.0 or cont > 0.0:
        t1, comp1, _ = pc.run(k, cont)
    waits, extra = [], []
    for w in range(W):
        for s in range(S):
            lo, hi = stage_units(g.bounds, s)
            n_f = sum(len(profile.agg_dims[u]) for u in range(lo, hi))
            n_b = sum(len(profile.agg_dims[u]) for u in range(lo, hi) if u in x.back_units)
            peer = (n_f + n_b) if W > 1 else 0
            waits.append(Cw * ((s > 0) + (s < S - 1) + peer) + (2 * (W - 1) if W > 1 else 0))
            extra.append(Cw * peer * max(0, W - 2))
    return max(t1, hc.bound(work, waits, extra, x.epoch_bytes)), comp1, k, work
