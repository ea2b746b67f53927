"""What the host costs the ranks of a layout, whatever their schedule: the main thread's CPU per message, a
batched exchange's seconds, the slowdown of ranks that share a CPU node's cores or caches, and the least epoch
of time-sliced ranks (:func:`shared_cores_bound`). :class:`HostCosts` holds them for one layout's ranks on one
machine; :mod:`.epoch_time` builds the epoch from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ....costmodel.hardware import Hardware, Link
from ....errors import ConfigError
from .profile import Profile


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
        raise ConfigError(f"one work, wait and peer count per rank: got {len(work_s)}, {len(waits)}, "
                          f"{len(extra_peers)}")
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


class HostCosts:
    """The host's costs for the ``ranks`` ranks of one layout on ``hardware``, from ``profile``.

    Attributes:
        profile: the profile. hardware: the machine. ranks: the layout's ranks ``R = W·S``.
        speed: the hardware's compute speed factor (one device over the profiled one).
        host_speed: the factor that shortens the host's main-thread costs (message handling, bookkeeping): the
            speed on a CPU node, 1 on GPUs (a faster GPU does not shorten them).
        cores: a CPU node's cores (``None`` on GPUs: ranks do not share compute).
        floor: on a CPU node the host transport's own exchange (:attr:`Profile.host_exchange`), the least any
            batched exchange takes; ``None`` on GPUs.
    """

    def __init__(self, profile: Profile, hardware: Hardware, ranks: int):
        self.profile = profile
        self.hardware = hardware
        self.ranks = ranks
        self.speed = hardware.speed
        self.host_speed = self.speed if hardware.kind == "cpu" else 1.0
        self.cores = hardware.devices_per_node if hardware.kind == "cpu" else None
        self.floor = profile.host_exchange if hardware.kind == "cpu" else None

    def msg(self, nbytes: float, cpu_per_byte: float = 0.0) -> float:
        """Main-thread CPU seconds of one message (a send or a receive) of ``nbytes`` bytes over a link whose host
        CPU per byte is ``cpu_per_byte`` (seconds per byte, ``Link.cpu_s_per_byte``, both ends together): the
        profile's, and half the link's per byte where that is more than the profile's; 0 for an empty message. A
        stage boundary's send and receive pay the link's; a batched exchange (graph parallelism's, a hybrid's peer
        op) waits on the link while the host moves its bytes, so its messages are given ``0`` and the link's CPU
        only counts where ranks share cores (:func:`shared_cores_bound`)."""
        profile, host = self.profile, self.host_speed
        extra = max(0.0, cpu_per_byte / 2 - profile.msg_cpu_s_per_byte / host)
        return profile.msg_cpu(nbytes) / host + nbytes * extra if nbytes > 0 else 0.0

    def link_cpu_on_work(self, cpu_per_byte: float) -> float:
        """Of a byte's host CPU on a link (``cpu_per_byte``, seconds per byte), the seconds per byte :meth:`msg`
        puts in the two ends' work together."""
        return 2 * max(0.0, cpu_per_byte / 2 - self.profile.msg_cpu_s_per_byte / self.host_speed)

    def exchange_s(self, link: Link, nbytes: float) -> float:
        """Seconds of one batched exchange of ``nbytes`` bytes each way over ``link``: the link's, and at least the
        host transport's (:attr:`floor`) on a CPU node."""
        floor = self.floor
        t = link.latency_s + nbytes / link.exchange_bandwidth_Bps
        return max(t, floor.time(nbytes)) if floor is not None else t

    def share_factor(self, per_rank_compute: list[float], makespan: float) -> float:
        """The CPU-sharing slowdown of compute, ``max(1, demand / cores)``: ``demand`` the busiest node's compute
        seconds (``per_rank_compute``, one per rank) over the schedule's ``makespan`` seconds, i.e. the mean
        number of its ranks computing at once; 1 on GPUs or for an empty schedule."""
        cores, hardware, R = self.cores, self.hardware, self.ranks
        if cores is None or makespan <= 0:
            return 1.0
        per_node: dict[int, float] = {}
        for r, c in enumerate(per_rank_compute):
            per_node[hardware.node_of(r, R)] = per_node.get(hardware.node_of(r, R), 0.0) + c
        demand = max(per_node.values()) / makespan
        return max(1.0, demand / cores)

    def contended(self, per_rank_compute: list[float], makespan: float) -> float:
        """The level of the units' measured contention (:meth:`UnitKind.contention`) that applies, from the ranks'
        compute seconds (``per_rank_compute``, one per rank) in a schedule of ``makespan`` seconds: on a CPU node
        with more ranks ``n`` than cores ``c``, ``1 + (n − c) / (P' − c)`` (at most 2) with ``P'`` the processes of
        the profile's time-sliced measurement (:attr:`Profile.oversubscribed_ranks`); otherwise ``(m − 1) /
        (P − 1)`` (at most 1), with ``m`` the mean number of the node's ranks computing at once and ``P`` the
        processes the profile ran at once; 0 on GPUs and for one rank."""
        profile, cores, hardware, R = self.profile, self.cores, self.hardware, self.ranks
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

    def bound(self, work: list[float], waits: list[float], extra: list[float],
              epoch_bytes: Callable[[], dict]) -> float:
        """The largest :func:`shared_cores_bound` over the nodes, in seconds (0 on GPUs or without
        oversubscription), from per rank its CPU ``work`` seconds, blocking ``waits`` and ``extra`` peers (one
        entry per rank, ``rank = way·S + stage``). Every rank sends an equal share of the epoch's bytes
        (``epoch_bytes()``: :func:`~.epoch_bytes.predict_bytes` of the layout, asked for only when a node is
        oversubscribed), each costing the host the larger of the profile's per-byte cost
        (:attr:`Profile.switch_byte_s`, the loopback's) and its links' (``Link.cpu_s_per_byte``), less what the
        boundary messages' work holds of it already (:meth:`msg`)."""
        profile, cores, hardware, R = self.profile, self.cores, self.hardware, self.ranks
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
            nb = epoch_bytes()
            # every byte costs the larger per-byte cost; the boundary sends' messages (msg) hold some of it already
            full = max(profile.switch_byte_s, cpb)
            per_byte = full
            if full > 0:
                per_rank = (sum(nb.values()) - nb["layer"] * self.link_cpu_on_work(cpb) / full) / R
        return max(shared_cores_bound([work[r] for r in rs], [waits[r] for r in rs], [extra[r] for r in rs], cores,
                                      profile.switch_s, profile.switch_peer_s, [per_rank] * len(rs),
                                      per_byte, profile.switch_curve) for rs in nodes.values())
