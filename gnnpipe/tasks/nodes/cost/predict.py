"""Predict a layout's epoch time, bytes per epoch and per-rank memory, and rank every feasible layout.

**Bytes** (exact for the plan — the same chunking and way partition the run will build):

* ``layer``  = ``Σ_ways Σ_{stage boundaries} 2·b·N_way·(d_boundary + d_h0)`` (forward embeddings and their
  gradients; ``d_h0`` is GCNII's shared tensor, which travels with the boundary);
* ``graph``  = GP: ``b·M·(Σd + Σ_back d)`` (:func:`gnnpipe.partitioners.predict_gp_bytes`, ``b/4`` times its fp32
  bytes): forward every op's mirror rows, backward their gradients for the ops whose input needs one
  (``GNNModel.backward_aggregation_dims``: not a first layer reading the raw features, e.g. GAT's); hybrid:
  ``h·(M_fwd·Σd + M_bwd·Σ_back,pull d) + b·M_C·Σ_back,push d`` — forward the mirror rows ``j → i`` across
  ways; backward, for the pull op the reverse pairs (``M_bwd``, equal to ``M_fwd`` for undirected graphs), for a
  message-passing unit's halo-gradient op the pushed halo rows of other ways, ``M_C = Σ_c |{v ∈ halo(c) :
  way(v) ≠ way(c)}|`` (docs/HALO_GRADIENT.md). Peers send rows of their history buffers, so ``h`` is the element
  size of ``--history-dtype`` (``b`` by default); pushes are in ``--dtype``;
* ``weight`` = ``2·(W−1)·b·P`` (ring all-reduce of every trained parameter within each stage's peer group).

**Time**: per stage and chunk, forward and backward seconds from the profile's fits (:mod:`.profile`) on the
chunk's rows, halo and in-edges, corrected by the measured size factor at the chunk's rows
(:func:`~gnnpipe.tasks.nodes.cost.profile.size_factor`) and divided by the hardware's speed factor; a pipeline's units
run their fused chunk step, a hybrid's and graph parallelism's the plain path (:attr:`UnitKind.unfused`). To the
units a rank's main thread adds the runtime's cost per chunk action, graph parallelism's per-op bookkeeping
(:attr:`Profile.gp_op_s`, :attr:`Profile.gp_op_s_per_elem`) or a hybrid's (:attr:`Profile.hybrid_op_s`), and
its CPU per message sent or received (:meth:`Profile.msg_cpu`) — all measured by the profiler on this machine.
Ranks of a CPU node that compute at once share its caches and memory bandwidth: each unit is slowed by the share
``(m − 1)/(P − 1)`` of its measured contention (``gnnpipe.tasks.nodes.cost.profile.measure_contention``: the same
chunk passes on ``P`` cores at once), ``m`` the mean number of the node's ranks computing at once in the
simulation (at most its cores); with more ranks than cores, by the contention measured with that many processes
time-sliced on the cores (:meth:`~gnnpipe.tasks.nodes.cost.profile.UnitKind.contention`).
Stage-boundary sends go over the hardware's links (``latency + bytes/bandwidth``, overlapped with compute as
gloo's ``isend`` is; on a link whose exchange rate is under half its bandwidth the two directions share one
channel at twice the exchange rate, first come first served); the optimizer step costs seconds per parameter; then the discrete-event simulation of the
actual schedule (:func:`gnnpipe.schedulers.simulate`). Graph parallelism: per unit the slowest way, plus a halo
exchange per aggregation op in each direction (the largest halo a rank receives over its link; on links
``per_pair``, the largest pair's rows over that pair's own link) and one all-reduce. Hybrid: a way's schedule where every slot
costs the slowest way's chunk plus the peers' exchange of the slot's rows per op, and the step adds the peer
all-reduce. Ranks beyond a CPU node's cores share them: compute is slowed by ``max(1, demand / cores)``, with
``demand`` the mean number of that node's ranks computing at once in the unshared simulation (work / makespan),
and the schedule is simulated again; and the epoch is at least :func:`shared_cores_bound` — the node's work plus
the core time each blocking wait and each byte sent costs when ranks are time-sliced (measured with more ranks than
cores), over its cores.

**Memory**: :mod:`.memory`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import attrs
import numpy as np
import torch

from ....costmodel.hardware import Hardware, Link, available_memory_bytes, local_hardware
from ....errors import ConfigError
from ....schedulers.simulate import CommModel
from .memory import MemoryBreakdown, rank_memory, single_memory
from .profile import Profile, chunk_features

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
            :func:`plan_layouts` for the best layouts (empty otherwise, and for a profile without spreads).
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


# ---------------------------------------------------------------------------------------------- layouts
def enumerate_layouts(ranks: int, num_units: int, num_nodes: int, *, chunks_per_stage: Sequence[int] = (4,),
                      over_partitions: Sequence[int] = (1, 4), schedulers: Sequence[str] = SCHEDULERS) -> list[LayoutSpec]:
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


# ---------------------------------------------------------------------------------------------- geometry
@dataclass
class _Geometry:
    """Sizes of one plan that the predictions need."""

    N: int
    E: int
    F: int
    W: int
    S: int
    bounds: list
    chunk_ptr: list
    way_ptr: list
    chunk_feats: np.ndarray  # [C, 4]
    way_feats: np.ndarray  # [W, 4]
    mirror_fwd: int = 0
    mirror_bwd: int = 0
    mirror_push: int = 0  # M_C: Σ_c |{v ∈ halo(c) : way(v) ≠ way(c)}| (hybrid halo-gradient pushes)
    peer_rows: dict = field(default_factory=dict)  # chunk -> (sent rows, received rows) per op, forward
    peer_rows_bwd: dict = field(default_factory=dict)
    peer_rows_push: dict = field(default_factory=dict)  # backward of a message-passing unit's op
    way_sent: list = field(default_factory=list)  # GP: rows each way sends per op (its mirrors towards all others)
    way_peers_out: list = field(default_factory=list)  # GP: ways each way sends to / receives from
    way_peers_in: list = field(default_factory=list)
    pair_sent: dict = field(default_factory=dict)  # GP: (way p, way q) -> rows p sends q per op


def _geometry(plan, config) -> _Geometry:
    data = plan.data
    ei = data.edge_index
    N = int(data.num_nodes)
    ptr = [int(v) for v in plan.chunk_ptr.tolist()]
    wptr = [int(v) for v in plan.way_ptr.tolist()]
    W = len(wptr) - 1
    way_rows = [ptr[w] for w in wptr]
    g = _Geometry(N=N, E=int(ei.size(1)), F=int(data.x.size(1)), W=W, S=config.stages, bounds=list(plan.bounds),
                  chunk_ptr=ptr, way_ptr=wptr, chunk_feats=chunk_features(ei, ptr),
                  way_feats=chunk_features(ei, way_rows))
    if W > 1:
        from ....partitioners import partition_metrics
        from ..parallel import send_lists

        way_of = torch.repeat_interleave(torch.arange(W), torch.tensor(np.diff(way_rows)))
        g.mirror_fwd = int(partition_metrics(ei, N, way_of).mirror_count)
        g.mirror_bwd = int(partition_metrics(ei.flip(0), N, way_of).mirror_count)
        if config.stages == 1:
            lists = send_lists(ei, way_of, way_of, W)
            g.way_sent = [sum(int(t.numel()) for (p, _), t in lists.items() if p == w) for w in range(W)]
            g.way_peers_out = [sum(1 for (p, _) in lists if p == w) for w in range(W)]
            g.way_peers_in = [sum(1 for (_, q) in lists if q == w) for w in range(W)]
            g.pair_sent = {pq: int(t.numel()) for pq, t in lists.items()}
        if config.stages > 1:
            chunk_of = torch.repeat_interleave(torch.arange(len(ptr) - 1), torch.tensor(np.diff(ptr)))
            for backward, dest in ((False, g.peer_rows), (True, g.peer_rows_bwd)):
                lists = send_lists(ei, chunk_of, way_of, W, backward=backward)
                sent: dict[int, int] = {}
                recv: dict[int, int] = {}
                for (c, q), idx in lists.items():
                    sent[c] = sent.get(c, 0) + int(idx.numel())
                    # chunk c's rows go to way q's chunk of the same slot
                    w = int(np.searchsorted(wptr, c, side="right") - 1)
                    peer = wptr[q] + (c - wptr[w])
                    recv[peer] = recv.get(peer, 0) + int(idx.numel())
                for c in range(len(ptr) - 1):
                    dest[c] = (sent.get(c, 0), recv.get(c, 0))
            # the halo-gradient op's backward: chunk c pushes the gradient of each halo row v of another way
            # to way(v), which adds it under c's id (docs/HALO_GRADIENT.md)
            src, dst = ei[0].long(), ei[1].long()
            cut = way_of[src] != way_of[dst]
            pairs = torch.unique(chunk_of[dst[cut]] * N + src[cut])
            pc, pv = (pairs // N).tolist(), (pairs % N).tolist()
            g.mirror_push = len(pc)
            sent_p: dict[int, int] = {}
            recv_p: dict[int, int] = {}
            for c, v in zip(pc, pv):
                sent_p[c] = sent_p.get(c, 0) + 1
                w = int(np.searchsorted(wptr, c, side="right") - 1)
                peer = wptr[int(way_of[v])] + (c - wptr[w])
                recv_p[peer] = recv_p.get(peer, 0) + 1
            for c in range(len(ptr) - 1):
                g.peer_rows_push[c] = (sent_p.get(c, 0), recv_p.get(c, 0))
    return g


# ---------------------------------------------------------------------------------------------- bytes
def predict_bytes(config, plan, model) -> dict:
    """Bytes per epoch by kind, summed over ranks (module docstring), exact for ``plan``.

    Args:
        config: the layout's configuration. plan: its ``RunPlan`` (``gnnpipe.tasks.nodes.runner``).
        model: the model.

    Returns:
        ``{"layer": int, "graph": int, "weight": int}``.
    """
    from ..trainer import DTYPES

    b = torch.finfo(DTYPES[config.dtype]).bits // 8
    hb = torch.finfo(config.torch_history_dtype).bits // 8  # --history-dtype (default: --dtype)
    W, S = config.ways, config.stages
    N = int(plan.data.num_nodes)
    sh = model.units[0].out_dim if model.shared_tensor else 0
    bounds = list(plan.bounds)
    layer = sum(2 * b * N * (model.units[bounds[s + 1] - 1].out_dim + sh) for s in range(S - 1))
    graph = weight = 0
    if W > 1:
        from ....partitioners.metrics import FP32_BYTES, predict_gp_bytes

        dims = [d for _, _, d in model.aggregation_dims()]
        back = model.backward_aggregation_dims()
        g = _geometry(plan, config) if "mirror_count" not in plan.info or S > 1 else None
        if S == 1:
            m = int(plan.info["mirror_count"]) if g is None else g.mirror_fwd
            graph = predict_gp_bytes(m, dims, [d for _, _, d in back]) * b // FP32_BYTES  # counts fp32 elements
        else:
            push = [d for i, _, d in back if getattr(model.units[i], "message_passing", False)]
            pull = [d for i, _, d in back if not getattr(model.units[i], "message_passing", False)]
            # peers exchange rows of the history buffers (H_in forward, G_out backward), stored in
            # --history-dtype; a halo-gradient op's pushes stay in --dtype (docs/HALO_GRADIENT.md)
            hist_rows = predict_gp_bytes(g.mirror_fwd, dims, []) + predict_gp_bytes(g.mirror_bwd, [], pull)
            graph = (hist_rows * hb + predict_gp_bytes(g.mirror_push, [], push) * b) // FP32_BYTES
        P = sum(p.numel() for p in model.parameters() if p.requires_grad)
        weight = 2 * (W - 1) * b * P
    if W == 1 and S == 1:
        layer = 0
    return {"layer": int(layer), "graph": int(graph), "weight": int(weight)}


# ---------------------------------------------------------------------------------------------- time
@dataclass
class _LinkComm(CommModel):
    """Boundary sends with a per-pair link (``link(src_stage, dst_stage) -> Link``)."""

    link: Callable[[int, int], Link] | None = None

    def time(self, src: int, dst: int, action) -> float:
        return self.link(src, dst).time(self.nbytes(src, dst, action))


def _stage_units(bounds, s):
    return int(bounds[s]), int(bounds[s + 1])


def _simulate(scheduler: str, S: int, C: int, fw, bw, step, nbytes, link, duplex: bool = True) -> Any:
    from ....schedulers import build_schedule, simulate

    sched = build_schedule(scheduler, S, C)

    def cost(a) -> float:
        k = a.kind.name if hasattr(a.kind, "name") else str(a.kind)
        if k == "STEP":
            return step[a.stage]
        return (fw if k == "F" else bw)[a.stage][a.chunk]

    comm = _LinkComm(bytes_per_chunk=nbytes, link=link, duplex=duplex)
    return simulate(sched, costs=cost, comm=comm)


def shared_cores_bound(work_s: Sequence[float], waits: Sequence[float], extra_peers: Sequence[float], cores: int,
                       switch_s: float, switch_peer_s: float, bytes_sent: Sequence[float] | None = None,
                       switch_byte_s: float = 0.0, switch_curve: Sequence[Sequence[float]] | None = None) -> float:
    """Least epoch seconds of the ranks of one node that share ``cores`` CPU cores (``len(work_s) > cores``;
    otherwise 0: every rank has a core of its own and the schedule's simulation decides).

    Ranks that share cores are time-sliced: while one waits for a message another runs, so the node's cores are
    at best always busy, and every blocking wait costs core time the ranks' own threads do not use (the transport
    threads, the switch between ranks, a core left idle when the ranks that could run are all waiting). With
    ``switch_s`` core seconds per wait of a rank for one peer and ``switch_peer_s`` per further peer of the same
    wait, and ``switch_byte_s`` per byte a rank sends (the transport's threads and the kernel moving it; both
    measured by :func:`gnnpipe.costmodel.link.profile_link` with more ranks than cores), the epoch takes at least
    ``(Σ work + switch_s · Σ waits + switch_peer_s · Σ extra_peers + switch_byte_s · Σ bytes_sent) / cores``.
    A wait costs more after a longer burst of compute: with ``switch_curve`` (``[(busy seconds, switch seconds)…]``,
    measured after bursts of each length), a rank's ``switch_s`` is the curve's at its work per wait, linear in the
    log of the burst and held at the ends.

    Args:
        work_s: per rank on the node, its main thread's CPU seconds per epoch (compute and message handling).
        waits: per rank, its blocking waits per epoch (receives, exchanges, all-reduce steps).
        extra_peers: per rank, the peers beyond the first summed over its waits (an exchange with ``p`` peers
            adds ``p − 1``).
        cores: the node's cores (>= 1).
        bytes_sent: per rank, the bytes it sends per epoch (``None``: not counted).
        switch_curve: the measured points (two or more; otherwise ``switch_s`` holds for every rank).

    Raises:
        ConfigError: the lists differ in length, or ``cores < 1``.
    """
    sent = [0.0] * len(work_s) if bytes_sent is None else list(bytes_sent)
    if not (len(work_s) == len(waits) == len(extra_peers) == len(sent)):
        raise ConfigError(f"one work, wait and peer count per rank: got {len(work_s)}, {len(waits)}, {len(extra_peers)}")
    if int(cores) < 1:
        raise ConfigError(f"a node needs at least one core, got {cores!r}")
    if len(work_s) <= cores:
        return 0.0
    pts = sorted((float(w), float(c)) for w, c in (switch_curve or []) if w > 0)
    if len(pts) >= 2:
        xs, ys = np.log([w for w, _ in pts]), [c for _, c in pts]
        lost = sum(float(np.interp(np.log(max(wk / n, 1e-9)), xs, ys)) * n for wk, n in zip(work_s, waits) if n > 0)
    else:
        lost = switch_s * sum(waits)
    return (sum(work_s) + lost + switch_peer_s * sum(extra_peers) + switch_byte_s * sum(sent)) / int(cores)


def predict_time(config, plan, model, profile: Profile, hardware: Hardware,
                 epoch_bytes: dict | None = None) -> tuple[float, list[float], float, list]:
    """``(epoch seconds, compute seconds per rank, CPU-sharing slowdown, CPU work seconds per rank)`` for ``plan``
    on ``hardware`` (the work is the compute without the sharing slowdown: what the rank's thread CPU time measures).
    ``epoch_bytes``: the plan's :func:`predict_bytes`, if the caller has it (computed here only when needed).

    Work of a rank: its units on its chunks or part (``UnitKind.time``, the plain path for graph parallelism
    and hybrids; a pipeline's scaled by :attr:`Profile.executor_scale`), the runtime's cost per chunk action
    (pipeline, hybrid) or graph parallelism's bookkeeping per op (:attr:`Profile.gp_op_s`), its main thread's CPU
    per message sent or received (:meth:`Profile.msg_cpu`; a stage boundary's also half its link's
    ``cpu_s_per_byte`` per byte, where that is more) and the optimizer step. A batched exchange (graph
    parallelism's per op, a hybrid's peer op) takes the link's time, and on a CPU node at least the host
    transport's (:attr:`Profile.host_exchange`). The epoch is the simulated
    schedule (module docstring); on a CPU node with more ranks than cores, at least :func:`shared_cores_bound` of
    its ranks, each byte sent costing the host the larger of :attr:`Profile.switch_byte_s` and its links'
    ``cpu_s_per_byte`` (:class:`gnnpipe.costmodel.hardware.Link`)."""
    from ..trainer import DTYPES

    b = torch.finfo(DTYPES[config.dtype]).bits // 8
    W, S = config.ways, config.stages
    R = W * S
    speed = hardware.speed
    measured = profile.p2p or Link(0.0, 1e12)  # no measured link: communication is (almost) free
    measured_ar = profile.allreduce or measured
    step_pp = profile.step_s_per_param / speed
    sh = profile.shared_dim
    U = len(profile.units)
    P_units = [profile.kind(u).params for u in range(U)]
    cores = hardware.devices_per_node if hardware.kind == "cpu" else None
    back_units = {i for i, _, _ in model.backward_aggregation_dims()}  # ops whose input gradient is exchanged
    push_units = {i for i, u in enumerate(model.units) if getattr(u, "message_passing", False)}
    # the host's main-thread costs (message handling, bookkeeping) shrink with a faster CPU only
    host = speed if hardware.kind == "cpu" else 1.0
    def msg(nbytes: float, cpu_per_byte: float = 0.0) -> float:
        """Main-thread CPU seconds of one message (a send or a receive) of ``nbytes`` over a link whose host CPU
        per byte is ``cpu_per_byte`` (``Link.cpu_s_per_byte``, both ends together): the profile's, and half the
        link's per byte where that is more than the profile's. A stage boundary's send and receive pay the link's;
        a batched exchange (graph parallelism's, a hybrid's peer op) waits on the link while the host moves its
        bytes, so its messages are given ``0`` and the link's CPU only counts where ranks share cores
        (:func:`shared_cores_bound`)."""
        extra = max(0.0, cpu_per_byte / 2 - profile.msg_cpu_s_per_byte / host)
        return profile.msg_cpu(nbytes) / host + nbytes * extra if nbytes > 0 else 0.0

    def link_cpu_on_work(cpu_per_byte: float) -> float:
        """Of a byte's host CPU on a link (``cpu_per_byte``), what :func:`msg` puts in the two ends' work."""
        return 2 * max(0.0, cpu_per_byte / 2 - profile.msg_cpu_s_per_byte / host)

    # gloo on a CPU node: no exchange takes less than the host transport's own (Profile.host_exchange)
    floor = profile.host_exchange if hardware.kind == "cpu" else None

    def exchange_s(link: Link, nbytes: float) -> float:
        """Seconds of one batched exchange of ``nbytes`` each way over ``link``: the link's, and at least the host
        transport's on a CPU node."""
        t = link.latency_s + nbytes / link.exchange_bandwidth_Bps
        return max(t, floor.time(nbytes)) if floor is not None else t

    def share_factor(per_rank_compute: list[float], makespan: float) -> float:
        if cores is None or makespan <= 0:
            return 1.0
        per_node: dict[int, float] = {}
        for r, c in enumerate(per_rank_compute):
            per_node[hardware.node_of(r, R)] = per_node.get(hardware.node_of(r, R), 0.0) + c
        demand = max(per_node.values()) / makespan
        return max(1.0, demand / cores)

    def contended(per_rank_compute: list[float], makespan: float) -> float:
        """The level of the units' measured contention (:meth:`UnitKind.contention`) that applies: on a CPU node
        with more ranks ``n`` than cores ``c``, ``1 + (n − c) / (P' − c)`` (at most 2) with ``P'`` the processes of
        the profile's time-sliced measurement (:attr:`Profile.oversubscribed_ranks`); otherwise ``(m − 1) /
        (P − 1)`` (at most 1), with ``m`` the mean number of the node's ranks computing at once and ``P`` the
        processes the profile ran at once; 0 on GPUs and for one rank."""
        P = int(profile.contention_ranks)
        if cores is None or makespan <= 0 or P < 2:
            return 0.0
        per_node: dict[int, float] = {}
        count: dict[int, int] = {}
        for r, c in enumerate(per_rank_compute):
            nd = hardware.node_of(r, R)
            per_node[nd] = per_node.get(nd, 0.0) + c
            count[nd] = count.get(nd, 0) + 1
        most = max(count.values())
        P_over = int(profile.oversubscribed_ranks)
        if most > cores and P_over > cores:
            return 1.0 + min(1.0, (most - cores) / (P_over - cores))
        m = min(float(cores), max(per_node.values()) / makespan)
        return min(1.0, max(0.0, (m - 1.0) / (P - 1.0)))

    def bound(work: list[float], waits: list[float], extra: list[float]) -> float:
        """The largest :func:`shared_cores_bound` over the nodes (0 on GPUs or without oversubscription); every
        rank sends an equal share of the epoch's bytes, each costing the host the larger of the profile's per-byte
        cost (:attr:`Profile.switch_byte_s`, the loopback's) and its links' (``Link.cpu_s_per_byte``), less what
        the boundary messages' work holds of it already (:func:`msg`)."""
        if cores is None:
            return 0.0
        nodes: dict[int, list[int]] = {}
        for r in range(R):
            nodes.setdefault(hardware.node_of(r, R), []).append(r)
        used = [lk for lk in [hardware.intra] + ([hardware.inter] if len(nodes) > 1 else []) if lk is not None]
        cpb = max([lk.cpu_s_per_byte for lk in used], default=0.0)
        per_byte = 0.0
        per_rank = 0.0
        if any(len(rs) > cores for rs in nodes.values()):
            nb = epoch_bytes or predict_bytes(config, plan, model)
            # every byte costs the larger per-byte cost; the boundary sends' messages (msg) hold some of it already
            full = max(profile.switch_byte_s, cpb)
            per_byte = full
            if full > 0:
                per_rank = (sum(nb.values()) - nb["layer"] * link_cpu_on_work(cpb) / full) / R
        return max(shared_cores_bound([work[r] for r in rs], [waits[r] for r in rs], [extra[r] for r in rs], cores,
                                      profile.switch_s, profile.switch_peer_s, [per_rank] * len(rs),
                                      per_byte, profile.switch_curve) for rs in nodes.values())

    if W == 1 and S == 1:
        t = sum(profile.kind(u).whole_forward_s + profile.kind(u).whole_backward_s for u in range(U))
        t = t / speed + step_pp * sum(P_units)
        return t, [t], 1.0, [t]

    g = _geometry(plan, config)
    if S == 1:  # graph parallelism: per unit the slowest way; an exchange per op and direction
        sent, pairs_out, pairs_in = g.way_sent, g.way_peers_out, g.way_peers_in
        halo = g.way_feats[:, 2]

        def gp_time(k: float, cont: float = 0.0) -> tuple[float, list[float]]:
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

        t1, comp1 = gp_time(1.0)
        k, cont = share_factor(comp1, t1), contended(comp1, t1)
        work = list(gp_time(1.0, cont)[1])  # CPU work: contended, not time-sliced
        if k > 1.0 or cont > 0.0:
            t1, comp1 = gp_time(k, cont)
        n_ex = sum(len(profile.agg_dims[u]) * (2 if u in back_units else 1) for u in range(U))
        waits = [n_ex + 2 * (W - 1)] * W  # the exchanges, and the steps of the ring all-reduce
        extra = [n_ex * max(0, max(pairs_out[w], pairs_in[w]) - 1) for w in range(W)]
        return max(t1, bound(work, waits, extra)), comp1, k, work

    # pipeline / hybrid: one way's schedule, every slot the slowest way's chunk (+ peer exchange per op)
    # the runtime's per-action bookkeeping runs on the host CPU: a GPU's speed factor does not shorten it
    overhead = profile.action_overhead_s / host
    Cw = (len(g.chunk_ptr) - 1) // W
    bases = [g.way_ptr[w] for w in range(W)]
    fused = W == 1  # a hybrid's peer op runs a unit's plain path
    # the pipeline executor against the fitted units (measured with the fused path: a pipeline's, not a hybrid's)
    unit_scale = profile.executor_scale if fused else 1.0

    def exch(c_local: int, s: int, backward: bool) -> tuple[float, float]:
        """``(link seconds, main-thread CPU seconds)`` of the peer exchanges of slot ``c_local`` on stage ``s``."""
        if W == 1:
            return 0.0, 0.0
        lo, hi = _stage_units(g.bounds, s)
        members = [w * S + s for w in range(W)]
        link = hardware.group_link(members, R, measured)
        t = cpu = 0.0
        for u in range(lo, hi):
            if backward and u not in back_units:
                continue
            rows_tab = (g.peer_rows_push if u in push_units else g.peer_rows_bwd) if backward else g.peer_rows
            pairs = [rows_tab.get(bases[w] + c_local, (0, 0)) for w in range(W)]
            rows = max(max(p) for p in pairs)
            sent, recv = max(p[0] for p in pairs), max(p[1] for p in pairs)
            for d in profile.agg_dims[u]:
                t += exchange_s(link, rows * d * b)  # one batched exchange, both ways
                cpu += (W - 1) * (msg(sent * d * b / (W - 1)) + msg(recv * d * b / (W - 1)))
        return t, cpu

    def boundary_bytes(s: int, c_local: int) -> float:
        """Bytes of the boundary tensor between stages ``s`` and ``s + 1`` of slot ``c_local`` (slowest way)."""
        hi = _stage_units(g.bounds, s)[1]
        d = profile.unit_dims[hi - 1][1] + sh
        return max(g.chunk_feats[bases[w] + c_local][1] for w in range(W)) * d * b

    def boundary_cpb(s: int) -> float:
        """The host CPU per byte (``Link.cpu_s_per_byte``) of the link between stages ``s`` and ``s + 1``, the
        largest over the ways."""
        return max(hardware.link(w * S + s, w * S + s + 1, R, measured).cpu_s_per_byte for w in range(W))

    def hyb(c_local: int, s: int, backward: bool) -> float:
        """A hybrid's peer-op bookkeeping of slot ``c_local`` on stage ``s`` (the slowest way's), per op."""
        if W == 1:
            return 0.0
        lo, hi = _stage_units(g.bounds, s)
        t = 0.0
        for u in range(lo, hi):
            if backward and u not in back_units:
                continue
            rows_tab = (g.peer_rows_push if u in push_units else g.peer_rows_bwd) if backward else g.peer_rows
            rows = max(sum(rows_tab.get(bases[w] + c_local, (0, 0))) for w in range(W))
            for d in profile.agg_dims[u]:
                t += profile.hybrid_op_s + profile.hybrid_op_s_per_elem * rows * d
        return t / host

    def costs(k: float, cont: float = 0.0):
        fw = [[0.0] * Cw for _ in range(S)]
        bw = [[0.0] * Cw for _ in range(S)]
        for s in range(S):
            lo, hi = _stage_units(g.bounds, s)
            for c in range(Cw):
                fw[s][c] = max(profile.stage_time(lo, hi, g.chunk_feats[bases[w] + c], "F", fused, cont)
                               for w in range(W)) * k * unit_scale / speed
                bw[s][c] = max(profile.stage_time(lo, hi, g.chunk_feats[bases[w] + c], "B", fused, cont)
                               for w in range(W)) * k * unit_scale / speed
                if config.recompute:
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
            lo, hi = _stage_units(g.bounds, s)
            P_s = sum(P_units[lo:hi])
            t = step_pp * P_s * k
            if W > 1:
                members = [w * S + s for w in range(W)]
                t += hardware.group_link(members, R, measured_ar).allreduce_time(P_s * b, W)
            step.append(t)
        return fw, bw, step

    def nbytes(src: int, dst: int, a) -> float:
        return boundary_bytes(min(src, dst), a.chunk)

    def link(src: int, dst: int) -> Link:
        # the slowest way's link between these two stages
        worst = None
        for w in range(W):
            lk = hardware.link(w * S + src, w * S + dst, R, measured)
            if worst is None or lk.time(1 << 20) > worst.time(1 << 20):
                worst = lk
        if worst.exchange_Bps is not None and 2 * worst.exchange_Bps < worst.bandwidth_Bps:
            # both directions at once get less than the full rate each: one channel for the pair, at the rate
            # the two directions get together
            worst = Link(worst.latency_s, 2 * worst.exchange_Bps)
        return worst

    # a transport that gets less than the full rate each way while both ends send (``exchange_gbps`` under half
    # the bandwidth: gloo over a shaped veth) shares one channel per pair of stages between the two directions
    duplex = all(lk.exchange_Bps is None or 2 * lk.exchange_Bps >= lk.bandwidth_Bps
                 for lk in (hardware.link(w * S + s, w * S + s + 1, R, measured) for w in range(W)
                            for s in range(S - 1)))

    def run(k: float, cont: float = 0.0):
        fw, bw, step = costs(k, cont)
        res = _simulate(config.scheduler, S, Cw, fw, bw, step, nbytes, link, duplex)
        comp = [sum(fw[s]) + sum(bw[s]) + step[s] for s in range(S)]
        per_rank = [comp[s] for w in range(W) for s in range(S)]
        return res.makespan, per_rank, (fw, bw, step)

    t1, comp1, parts = run(1.0)
    k, cont = share_factor(comp1, t1), contended(comp1, t1)
    if cont > 0.0:  # ranks computing at once share the caches and the memory bandwidth: the units slow
        parts = run(1.0, cont)[2]
    # CPU work per rank: the costs without the link time of the peer exchanges (not CPU) and the all-reduce
    fw, bw, _ = parts
    work_stage = []
    for s in range(S):
        lo, hi = _stage_units(g.bounds, s)
        link_s = sum(exch(c, s, False)[0] + exch(c, s, True)[0] for c in range(Cw))
        work_stage.append(sum(fw[s]) + sum(bw[s]) - link_s + step_pp * sum(P_units[lo:hi]))
    work = [work_stage[s] for w in range(W) for s in range(S)]
    if k > 1.0 or cont > 0.0:
        t1, comp1, _ = run(k, cont)
    waits, extra = [], []
    for w in range(W):
        for s in range(S):
            lo, hi = _stage_units(g.bounds, s)
            n_f = sum(len(profile.agg_dims[u]) for u in range(lo, hi))
            n_b = sum(len(profile.agg_dims[u]) for u in range(lo, hi) if u in back_units)
            peer = (n_f + n_b) if W > 1 else 0
            waits.append(Cw * ((s > 0) + (s < S - 1) + peer) + (2 * (W - 1) if W > 1 else 0))
            extra.append(Cw * peer * max(0, W - 2))
    return max(t1, bound(work, waits, extra)), comp1, k, work


# ---------------------------------------------------------------------------------------------- memory
def predict_memory(config, plan, model, profile: Profile) -> list[MemoryBreakdown]:
    """Per-rank :class:`MemoryBreakdown` (live bytes above the runtime floor) for ``plan`` (:mod:`.memory`).

    The bytes per row of each role come from :func:`~gnnpipe.tasks.nodes.cost.footprint.role_footprint` on the plan's
    graph, measured once per role and kept in ``profile.footprints``."""
    from ....core.comm import MAX_PENDING_SENDS
    from ....schedulers import build_schedule, simulate
    from ..trainer import DTYPES

    b = torch.finfo(DTYPES[config.dtype]).bits // 8
    hb = torch.finfo(config.torch_history_dtype).bits // 8  # --history-dtype (default: --dtype)
    copies = _history_copies(config)
    W, S = config.ways, config.stages
    t2 = S > 1 and any(str(c).partition(":")[0] == "t2" or type(c).__name__ == "T2UnbiasedGradient"
                       for c in config.correctors)
    data = plan.data
    N, E, F = int(data.num_nodes), int(data.edge_index.size(1)), int(data.x.size(1))
    bx = int(data.x.element_size())
    U = len(profile.units)
    sh = profile.shared_dim
    P = sum(profile.kind(u).params for u in range(U))
    weight = getattr(data, "edge_weight", None)
    symmetric_graph = _symmetric(profile, data)
    symmetric = {k: symmetric_graph and weight is None and k in ("gcn", "sum")
                 for u in range(U) for k in profile.agg_kinds[u]}
    ew = 0 if weight is None else int(weight.numel() * weight.element_size())

    def nnz(kind: str) -> int:
        return E + (N if kind == "gcn" else 0)

    def footprint(role: str, s: int = 0):
        return _footprint(profile, config, data, role, plan.bounds, s, plan.num_classes)

    max_dim = max(d for _, d in profile.unit_dims)  # widest unit output (the input features are the graph kind)
    push_units = {i for i, u in enumerate(model.units) if getattr(u, "message_passing", False)}
    if W == 1 and S == 1:
        kinds = {k: nnz(k) for u in range(U) for k in profile.agg_kinds[u]}
        build = {k: _build_per_nnz(profile, config, data, k) for k in kinds}
        return [single_memory(N=N, F=F, E=E, b=b, bx=bx, kinds_nnz=kinds, symmetric=symmetric, params=P,
                              footprint=footprint("single"), build_per_nnz=max(build.values(), default=0.0))]
    g = _geometry(plan, config)
    out = []
    if S == 1:
        kinds = sorted({k for u in range(U) for k in profile.agg_kinds[u]})
        fp = footprint("gp")
        for w in range(W):
            f = g.way_feats[w]
            part = (int(f[1]), int(f[2]), int(f[3]) + (int(f[1]) if "gcn" in kinds else 0))
            out.append(rank_memory(rank=w, way=w, stage=0, N=N, F=F, E=E, b=b, bx=bx, kinds=kinds, chunks=[part],
                                   symmetric=symmetric, params_trained=P, allreduce=True, history=0, footprint=fp,
                                   inflight=1, first=True, last=True, recv_width=0, send_width=0, pending_sends=0,
                                   graph_parallel=True, way_part=part, max_dim=max_dim, edge_weight_bytes=ew))
        return out
    Cw = (len(g.chunk_ptr) - 1) // W
    sched = build_schedule(config.scheduler, S, Cw)
    inflight = simulate(sched).peak_inflight
    for w in range(W):
        chunks = range(g.way_ptr[w], g.way_ptr[w + 1])
        f = g.way_feats[w] if W > 1 else None
        for s in range(S):
            lo, hi = _stage_units(g.bounds, s)
            kinds = sorted({k for u in range(lo, hi) for k in profile.agg_kinds[u]})
            parts = sorted(((int(g.chunk_feats[c][1]), int(g.chunk_feats[c][2]),
                             int(g.chunk_feats[c][3]) + (int(g.chunk_feats[c][1]) if "gcn" in kinds else 0))
                            for c in chunks), reverse=True)
            P_s = sum(profile.kind(u).params for u in range(lo, hi))
            hist = [d for u in range(lo, hi) for d in profile.agg_dims[u]]
            halo_rows = sum(int(g.chunk_feats[c][2]) for c in chunks)
            history = sum(2 * N * d * hb for d in hist) + copies * N * sum(hist) * hb
            history += sum(halo_rows * d * b for u in range(lo, hi) if u in push_units for d in profile.agg_dims[u])
            # T2 zeroes every G_out at an epoch's end, which under --recompute releases it until the next backward:
            # not held while the run evaluates (History.zero_grads, History.release_grads)
            released = sum(N * d * hb for u in range(lo, hi) if u not in push_units for d in profile.agg_dims[u]) \
                if t2 and config.recompute else 0
            d_in, d_out = profile.unit_dims[lo][0], profile.unit_dims[hi - 1][1]
            fwd_w, bwd_w = (d_in + sh) * b if s > 0 else 0, (d_out + sh) * b if s < S - 1 else 0
            if int(inflight[s]) >= Cw:
                # every chunk in flight (gpipe): the peak is the first backward, beside the receive posted for the
                # next backward's gradient and the last forward sends still outstanding (none on the last stage)
                recv, send = bwd_w, bwd_w
            else:  # forwards and backwards interleave: a receive of either kind posted ahead, sends of both
                recv, send = max(fwd_w, bwd_w), max(fwd_w, bwd_w)
            way_part = None
            if W > 1:
                way_part = (int(f[1]), int(f[2]), int(f[3]) + (int(f[1]) if "gcn" in kinds else 0))
            m = rank_memory(rank=w * S + s, way=w, stage=s, N=N, F=F, E=E, b=b, bx=bx, kinds=kinds, chunks=parts,
                            symmetric=symmetric, params_trained=P_s, allreduce=W > 1, history=history,
                            history_eval=history - released,
                            footprint=footprint("hybrid" if W > 1 else "pipeline", s), inflight=int(inflight[s]),
                            first=s == 0, last=s == S - 1, recv_width=recv, send_width=send,
                            pending_sends=MAX_PENDING_SENDS, hybrid=W > 1, way_part=way_part, max_dim=max_dim,
                            edge_weight_bytes=ew)
            if W > 1:  # the peer index lists of every chunk (forward and backward) and the way of every vertex
                lists = 8 * sum(g.peer_rows[c][0] + g.peer_rows_bwd[c][0] for c in range(len(g.chunk_ptr) - 1))
                m.adjacency += lists + N * 8
                for attr in ("steady", "train_peak", "eval_peak"):
                    setattr(m, attr, getattr(m, attr) + lists + N * 8)
            out.append(m)
    return out


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


def _footprint(profile: Profile, config, data, role: str, bounds, s: int, num_classes: int):
    """The role's measured ``gnnpipe.tasks.nodes.cost.footprint.RoleFootprint``, cached in ``profile.footprints``."""
    from .footprint import RoleFootprint, role_footprint

    lo, hi = (0, len(profile.units)) if role in ("single", "gp") else (int(bounds[s]), int(bounds[s + 1]))
    pipe = role in ("pipeline", "hybrid")
    key = "|".join(str(v) for v in (
        role, lo, hi, lo == 0, hi == len(profile.units), config.model, config.layers, config.hidden, config.dropout,
        config.activation, config.bias, sorted(config.model_args.items()), config.dtype,
        config.history_dtype or config.dtype, pipe and bool(config.recompute), pipe and config.scheduler))
    if key not in profile.footprints:
        fp = role_footprint(config, data, role, bounds, s, num_classes=num_classes)
        profile.footprints[key] = fp.to_dict()
    return RoleFootprint(**profile.footprints[key])


def _build_per_nnz(profile: Profile, config, data, kind: str) -> float:
    """Peak bytes per non-zero while the single process builds ``Â`` and ``Âᵀ`` of ``kind`` (measured, cached)."""
    from .footprint import adjacency_build_per_nnz

    key = f"build:{kind}:{config.dtype}"
    if key not in profile.footprints:
        profile.footprints[key] = {"per_nnz": adjacency_build_per_nnz(config, data, kind)}
    return float(profile.footprints[key]["per_nnz"])


def _symmetric(profile: Profile, data) -> bool:
    """Whether the graph's edge list is symmetric (every edge ``j → i`` has its ``i → j``, as often): then
    ``Â`` of ``gcn`` and ``sum`` without edge weights equals ``Âᵀ`` bit for bit and the runtime keeps one copy
    (cached in ``profile.footprints``; invariant under the plan's relabelling)."""
    key = "symmetric"
    if key not in profile.footprints:
        src, dst = data.edge_index[0].long(), data.edge_index[1].long()
        N = int(data.num_nodes)
        profile.footprints[key] = bool(torch.equal(torch.sort(src * N + dst).values, torch.sort(dst * N + src).values))
    return bool(profile.footprints[key])


def _history_copies(config) -> int:
    """Full copies of every ``H_in`` the configured correctors keep: EMA's average always; T3's snapshot once the
    run reaches the end of its first period (``epochs ≥ P``; before that it restores zeros and holds nothing)."""
    n = 0
    for spec in config.correctors:
        name, _, opt = str(spec).partition(":") if isinstance(spec, str) else (type(spec).__name__.lower(), "", "")
        if name == "ema":
            n += 1
        elif name == "t3" and config.epochs >= int(float(opt or 23)):
            n += 1
    return n


# ---------------------------------------------------------------------------------------------- ranking
def predict_layout(config, data, spec: LayoutSpec, profile: Profile, hardware: Hardware, floor_bytes: int = 0,
                   plan=None, memory_profiles: dict | None = None) -> LayoutPrediction:
    """Build the layout's plan (the same chunking the run will use) and predict it; a pipeline's or hybrid's
    ``recompute="auto"`` (``None``) is decided first, as the run decides it (:func:`choose_recompute`: with
    recompute every backward repeats its forward). ``memory_profiles``: a cache of those memory profiles by graph,
    shared by the layouts of one ranking."""
    from ..trainer import make_model

    cfg = layout_config(config, spec)
    if plan is None:
        plan = build_layout_plan(config, data, spec)
    model = make_model(cfg, profile.num_features, profile.num_classes)
    if cfg.stages > 1 and cfg.recompute is None:
        # the run's own decision: its memory profile of the plan's graph (``gnnpipe.tasks.nodes``), not this
        # profile's activation sizes, which are measured on other rows and can tip the choice the other way
        from .profile import memory_profile

        cache = {} if memory_profiles is None else memory_profiles
        if id(plan.data) not in cache:
            cache[id(plan.data)] = (plan.data, memory_profile(cfg, plan.data))  # the graph kept alive with its id
        choice = choose_recompute(cfg, plan, model, cache[id(plan.data)][1])
        cfg = attrs.evolve(cfg, recompute=choice.on)
    nbytes = predict_bytes(cfg, plan, model)
    t, comp, k, work = predict_time(cfg, plan, model, profile, hardware, nbytes)
    mem = predict_memory(cfg, plan, model, profile)
    fits = hardware.fits([floor_bytes + m.resident_peak for m in mem])
    return LayoutPrediction(spec=spec, epoch_s=t, bytes=nbytes, memory=mem, floor_bytes=int(floor_bytes), fits=fits,
                            compute_s=comp, share=k, work_s=work, plan_info=dict(plan.info),
                            recompute=bool(cfg.recompute))


def build_layout_plan(config, data, spec: LayoutSpec):
    """The ``RunPlan`` (``gnnpipe.tasks.nodes.runner``) the run of ``spec`` will build (same chunking and
    split)."""
    from ..runner import build_plan

    cfg = layout_config(config, spec)
    if spec.ways == 1 and spec.stages == 1:
        return _single_plan(cfg, data)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_plan(cfg, data)


def _single_plan(config, data):
    from ..runner import RunPlan, num_classes_of

    return RunPlan(data=data, chunk_ptr=torch.tensor([0, int(data.num_nodes)]), way_ptr=torch.tensor([0, 1]),
                   bounds=[0, config.layers + 2], num_features=int(data.x.size(1)), num_classes=num_classes_of(data),
                   info={"ways": 1, "stages": 1, "chunks": 1})


def plan_layouts(config, data, ranks: int, profile: Profile, hardware: Hardware | None = None, *,
                 chunks_per_stage: Sequence[int] = (4,), over_partitions: Sequence[int] = (1, 4),
                 schedulers: Sequence[str] = SCHEDULERS, floor_bytes: int | None = None,
                 progress: bool = False) -> list[LayoutPrediction]:
    """Predict every feasible layout of ``ranks`` ranks; sorted: layouts that fit first, then by predicted time.

    Raises:
        ConfigError: no feasible layout.
    """
    hardware = hardware or local_hardware()
    floor = profile_floor(profile) if floor_bytes is None else int(floor_bytes)
    specs = enumerate_layouts(ranks, len(profile.units), profile.num_nodes, chunks_per_stage=chunks_per_stage,
                              over_partitions=over_partitions, schedulers=schedulers)
    if not specs:
        raise ConfigError(f"no feasible layout of {ranks} rank(s) for a model of {len(profile.units)} units")
    preds = []
    plans: dict[tuple, Any] = {}
    memory_profiles: dict = {}
    for spec in specs:
        key = (spec.ways, spec.stages, spec.chunks, spec.over_partition)
        if progress:
            print(f"gnnpipe plan: predicting {spec.label()} C={spec.chunks} over={spec.over_partition} "
                  f"{spec.scheduler}", file=sys.stderr)
        if key not in plans:
            plans[key] = build_layout_plan(config, data, spec)
        preds.append(predict_layout(config, data, spec, profile, hardware, floor, plan=plans[key],
                                    memory_profiles=memory_profiles))
    preds.sort(key=lambda p: (not p.fits, p.epoch_s))
    _predict_spread(config, preds, profile, hardware, plans)
    return preds


#: the layouts :func:`plan_layouts` predicts again at the profile's spread: the best that fits and this many rivals,
#: the fastest after it that could overtake it
SPREAD_RIVALS = 3


def _predict_spread(config, preds: list[LayoutPrediction], profile: Profile, hardware: Hardware,
                    plans: dict) -> None:
    """Fill :attr:`LayoutPrediction.spread_s` of the best layout that fits and of up to :data:`SPREAD_RIVALS`
    layouts that fit and could overtake it within the profile's spread: predicted again from
    :meth:`Profile.raised` of each timed quantity with a spread (each is measured on its own, so each may be high
    on its own in a profile taken again). All of them together raise a prediction by at most the product of their
    ``1 + spread``: a layout slower than the best by more cannot overtake it and is not predicted again."""
    from ..trainer import make_model
    from .profile import SPREAD_GROUPS

    spreads = profile.spreads()
    quantities = [q for g in SPREAD_GROUPS for q in SPREAD_GROUPS[g] if spreads.get(q, 0.0) > 0]
    fitting = [p for p in preds if p.fits]
    if not quantities or not fitting:
        return
    limit = fitting[0].epoch_s * float(np.prod([1.0 + spreads[q] for q in quantities]))
    raised = {q: profile.raised(q) for q in quantities}
    for p in [fitting[0]] + [p for p in fitting[1:] if p.epoch_s <= limit][:SPREAD_RIVALS]:
        spec = p.spec
        cfg = layout_config(config, spec)
        if cfg.stages > 1 and cfg.recompute is None:
            cfg = attrs.evolve(cfg, recompute=p.recompute)  # as predict_layout decided it
        plan = plans[(spec.ways, spec.stages, spec.chunks, spec.over_partition)]
        model = make_model(cfg, profile.num_features, profile.num_classes)
        p.spread_s = {q: max(0.0, predict_time(cfg, plan, model, raised[q], hardware, p.bytes)[0] - p.epoch_s)
                      for q in quantities}


#: a layout is said to possibly overtake the best only if the profile's spread could put it ahead by more than
#: this share of the best's predicted time (layouts that differ less, e.g. by their over-partitioning alone, tie)
OVERTAKE_MARGIN = 0.01


def ranking_may_change(preds: list[LayoutPrediction]) -> list[tuple[LayoutPrediction, dict]]:
    """The layouts that fit and could overtake the best that fits within the profile's spread, each with
    ``{quantity: seconds}``, the timed quantities whose spread moves the best more than it: ``b`` could be faster
    than the best ``a`` when ``Σ_q max(0, Δa_q − Δb_q) > (b − a) + OVERTAKE_MARGIN · a``, with ``Δ_q`` a
    prediction's growth with the quantity ``q`` at its spread (:attr:`LayoutPrediction.spread_s`: each quantity
    may or may not be high in a profile taken again, and the worst case for ``a`` raises those that raise it more).
    Empty without spreads."""
    fitting = [p for p in preds if p.fits]
    if not fitting or not fitting[0].spread_s:
        return []
    best, out = fitting[0], []
    for p in fitting[1:]:
        if not p.spread_s:
            continue
        lead = {q: best.spread_s[q] - p.spread_s.get(q, 0.0) for q in best.spread_s}
        lead = {q: v for q, v in lead.items() if v > 0}
        if sum(lead.values()) > (p.epoch_s - best.epoch_s) + OVERTAKE_MARGIN * best.epoch_s:
            out.append((p, lead))
    return out


def _layout_name(p: LayoutPrediction) -> str:
    s = p.spec
    return (f"{s.label()} (C {s.chunks}, over {s.over_partition}" + (f", {s.scheduler}" if s.stages > 1 else "")
            + f", {1e3 * p.epoch_s:,.1f} ms)")


def format_spread(preds: list[LayoutPrediction], profile: Profile | None = None) -> list[str]:
    """The lines printed under the ranking: the profile's spread per group of timed quantities (with ``profile``),
    and a warning naming the layouts whose order with the best the spread could change (:func:`ranking_may_change`)
    and the quantities that move the best most against them."""
    from .profile import SPREAD_GROUPS

    lines = []
    if profile is not None and profile.spreads():
        parts = ", ".join(f"{g} {100 * profile.group_spread(g):.0f} %" for g in SPREAD_GROUPS)
        lines.append(f"profile spread (a typical repeat above the figure used): {parts}")
    risky = ranking_may_change(preds)
    if risky:
        best = next(p for p in preds if p.fits)
        moved: dict = {}
        for _, lead in risky:
            for q, v in lead.items():
                moved[q] = max(moved.get(q, 0.0), v)
        top = sorted(moved, key=lambda q: -moved[q])
        names = ", ".join(top[:3]) + (", …" if len(top) > 3 else "")
        lines.append(f"warning: the ranking may change within the profile's spread ({names}): "
                     + "; ".join(_layout_name(p) for p, _ in risky)
                     + f" could be faster than the best, {_layout_name(best)}. Treat them as a tie, or profile "
                       "again on a quieter machine (--profile-out keeps a good profile)")
    return lines


def profile_floor(profile: Profile) -> int:
    """The runtime floor of a rank the profile measured (0 when unknown)."""
    return int(profile.runtime_floor_bytes or 0)


def format_ranking(preds: list[LayoutPrediction], hardware: Hardware | None = None,
                   profile: Profile | None = None) -> str:
    """The ranking as a text table (time in ms, bytes and memory in MiB); ``*`` marks the best that fits. Under it
    :func:`format_spread`: the profile's spread (with ``profile``) and a warning when it could change which layout
    is best."""
    head = ["", "layout", "C", "over", "scheduler", "recompute", "ms/epoch", "layer MiB", "graph MiB", "weight MiB",
            "peak MiB/rank", "fits"]
    best = next((i for i, p in enumerate(preds) if p.fits), None)
    rows = []
    for i, p in enumerate(preds):
        s = p.spec
        rows.append(["*" if i == best else "", s.label(), str(s.chunks), str(s.over_partition),
                     s.scheduler if s.stages > 1 else "-", ("on" if p.recompute else "off") if s.stages > 1 else "-",
                     f"{1000 * p.epoch_s:,.1f}",
                     f"{p.bytes['layer'] / 2**20:,.2f}", f"{p.bytes['graph'] / 2**20:,.2f}",
                     f"{p.bytes['weight'] / 2**20:,.2f}", f"{max(p.peak_bytes_per_rank) / 2**20:,.0f}",
                     "yes" if p.fits else "NO"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = []
    if hardware is not None:
        lines.append(f"hardware: {hardware.name}")
    lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines += format_spread(preds, profile)
    return "\n".join(lines)


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
    from ..trainer import make_model
    from .profile import memory_profile

    prof = memory_profile(config, data)
    plan = _single_plan(config, data)
    model = make_model(config, prof.num_features, prof.num_classes)
    return predict_memory(config, plan, model, prof)[0]


def check_single_process_memory(config, data, *, available: int | None = None) -> MemoryBreakdown | None:
    """Refuse, before it starts, a single-process run the memory model says this machine cannot hold.

    The prediction (:func:`single_process_memory`; the live peak, without glibc's retention, so that only runs
    that cannot fit are refused) is compared with the
    memory available now (``MemAvailable``) plus what the loaded graph already holds (it is part of the
    prediction). A run refused here would otherwise end in the kernel's out-of-memory killer.

    Args:
        config: a resolved :class:`~gnnpipe.core.settings.config.TrainConfig` (``gnnpipe.tasks.nodes.trainer.resolve_config``).
        data: the prepared graph. available: bytes available (default: :func:`available_memory_bytes`).

    Returns:
        the prediction, or ``None`` when the available memory is unknown or a cheap upper bound is below half
        of it (no profile is taken then).

    Raises:
        ConfigError: the predicted peak exceeds the available memory; the message gives both, the largest
            kinds, and the ways out (a pipeline: ``--stages``/``--chunks``/``--recompute``/``--history-dtype``;
            or ``--no-memory-check`` to try anyway).
    """
    from ..trainer import DTYPES

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
