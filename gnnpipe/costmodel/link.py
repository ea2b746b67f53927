"""The link between ranks, and what a wait costs when ranks share the cores.

A ping-pong between two ranks over the actual backend (gloo on CPU): one-way time of point-to-point
messages of 4 B … 8 MiB and of all-reduces of the same sizes (the low quantile of many round trips, :mod:`.robust`:
a rank descheduled by other work only makes a round trip slower; for the smallest message, which gives the
latency, their minimum), each fitted as
``latency + bytes / bandwidth`` (wall), and the main thread's CPU per message fitted likewise. A batched exchange
both ways between bursts of compute, as graph parallelism and a hybrid's peer ops run one (:data:`EXCHANGE_PROBE`),
gives the host transport's own time per exchange (from both ranks ready to both done, the minimum of the
exchanges, a floor like the latency), fitted likewise: on the 2-core VM of docs/RESULTS.md an exchange of 64 KiB-1 MiB
that follows a few milliseconds of compute takes 0.7-3.4 ms, against 0.1-0.5 ms back to back; no link between the ranks
makes it faster. With more ranks than cores, an exchange probe measures the core time a
rank's blocking wait costs when ranks share the cores (``switch_costs``).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch_geometric.data  # noqa: F401  (a probe rank unpickles a PyG Data: its memory floor includes PyG)

from ..core.run.launch import spawn
from ..core.runtime.memory import peak_memory_bytes
from .hardware import Link, cores_here
from .robust import low, spread


def _busy(seconds: float) -> None:
    """Spin for ``seconds`` of this thread's CPU time (time the thread is descheduled does not count)."""
    c0 = time.thread_time()
    while time.thread_time() - c0 < seconds:
        pass


#: message sizes (bytes) of the one-way stream of :func:`_probe` (the main thread's CPU per message)
STREAM_SIZES = (65536, 1 << 20, 4 << 20)


#: messages per round of the one-way stream of :func:`_probe`
STREAM_MESSAGES = 12


#: rounds of the one-way stream of :func:`_probe` per message size (the low quantile kept)
STREAM_ROUNDS = 5


#: the exchange probe: busy CPU per iteration, iterations per round, rounds per pattern, bytes per message, the
#: larger message of a third pattern (the ring again) from which the core time per byte moved is taken, and the
#: longer busy CPU (and its iterations) of a fourth (the ring again): a wait costs more after a longer burst
SWITCH_PROBE = {"work_s": 0.002, "iters": 25, "rounds": 3, "nbytes": 65536, "nbytes_large": 1 << 20,
                "work_long_s": 0.008, "iters_long": 8}


#: the host-exchange probe of :func:`_probe`: busy CPU before each exchange (an aggregation op's compute; the
#: exchange's time grows with it up to a few milliseconds, then holds), exchanges per round, rounds (the sizes'
#: rounds interleaved, in two halves seconds apart, the minimum kept), and the bytes each way
EXCHANGE_PROBE = {"work_s": 0.008, "iters": 4, "rounds": 8, "sizes": (65536, 1 << 20, 4 << 20)}


def _exchange_round(send: torch.Tensor, bufs: dict, peers: Sequence[int], work_s: float, iters: int,
                    group=None, stamps: list | None = None) -> tuple[float, float]:
    """One round (after a barrier of ``group``) of ``iters`` times ``work_s`` of busy CPU then one batched exchange:
    ``send`` to each of ``peers``, ``bufs[q]`` received from each source ``q`` (receives posted first, as
    ``Comm.exchange``). Returns its ``(wall, main-thread CPU)`` seconds; ``stamps`` receives per exchange ``(ready,
    done)``: ``time.perf_counter()`` (the machine's monotonic clock, one for all its processes) when this rank's busy
    CPU ended and when its exchange completed."""
    dist.barrier(group=group)
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(iters):
        _busy(work_s)
        ready = time.perf_counter()
        ops = ([dist.P2POp(dist.irecv, b, q) for q, b in bufs.items()]
               + [dist.P2POp(dist.isend, send, q) for q in peers])
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if stamps is not None:
            stamps.append((ready, time.perf_counter()))
    return time.perf_counter() - w0, time.thread_time() - c0


def _busy_exchanges(send: torch.Tensor, bufs: dict, peers: Sequence[int], work_s: float, iters: int, rounds: int,
                    group=None) -> list[tuple[float, float]]:
    """``rounds`` timed rounds of :func:`_exchange_round` after a warm-up round. Returns each round's ``(wall,
    main-thread CPU)`` seconds."""
    out = [_exchange_round(send, bufs, peers, work_s, iters, group) for _ in range(rounds + 1)]
    return out[1:]


def _host_exchange(rank: int, pair, sizes: Sequence[int], work_s: float, iters: int, rounds: int) -> list:
    """Ranks 0 and 1: per size, batched exchanges both ways (receive posted first, as ``Comm.exchange``), each after
    ``work_s`` of busy CPU: a round of ``iters`` of them per size in turn, ``rounds`` times after a warm-up round of
    each (interleaved: a burst of load hits one round of each size). Returns ``[(bytes, [[(ready, done) per
    exchange] per round]), …]`` (:func:`_exchange_round`'s stamps; :func:`_exchange_seconds` combines the two
    ranks')."""
    other = 1 - rank
    sends = [torch.zeros(max(1, int(n) // 4)) for n in sizes]
    bufs = [{other: torch.empty_like(t)} for t in sends]
    per: list[list] = [[] for _ in sizes]
    for r in range(rounds + 1):
        for k, send in enumerate(sends):
            stamps: list = []
            _exchange_round(send, bufs[k], [other], work_s, iters, pair, stamps)
            if r:
                per[k].append(stamps)
    return [(t.numel() * 4, p) for t, p in zip(sends, per)]


def _exchange_seconds(mine: list, theirs: list) -> list[float]:
    """The seconds of every exchange of two ranks from the moment both were ready (their busy CPU done) to the
    moment both had it: ``max(done) − max(ready)`` over the two ranks' stamps (:func:`_host_exchange`, per round per
    exchange; one clock for the machine's processes). A rank descheduled during its busy CPU (a shared machine)
    makes the other wait, but that wait is not the exchange's, and it is left out."""
    return [max(0.0, max(da, db) - max(ra, rb))
            for a, b in zip(mine, theirs) for (ra, da), (rb, db) in zip(a, b)]


def _ping_pong(rank: int, t: torch.Tensor, k: int, pair) -> tuple[list[float], list[float]]:
    """``k`` round trips of ``t`` between ranks 0 and 1 (after a barrier of ``pair`` and one untimed round trip
    that warms the pair up): the one-way wall and main-thread CPU seconds of each (half a round trip)."""
    walls, cpus = [], []
    dist.barrier(group=pair)
    for i in range(k + 1):
        w0, c0 = time.perf_counter(), time.thread_time()
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)
        if i:
            walls.append((time.perf_counter() - w0) / 2)
            cpus.append((time.thread_time() - c0) / 2)
    return walls, cpus


def _probe(rank: int, world: int, sizes: list[int], reps: int, rounds: int, work_s: float, iters: int,
           nbytes: int, stream_sizes: Sequence[int] = STREAM_SIZES, pipe: tuple | None = None,
           nbytes_large: int = 0, exchange: dict | None = None, work_long_s: float = 0.0,
           iters_long: int = 0, preload: Sequence[str] = ()) -> dict:
    """One rank of :func:`profile_link`: ranks 0 and 1 ping-pong, then rank 0 streams messages of each of
    ``stream_sizes`` to rank 1 (pre-posted receives; the main thread's CPU per send and per receive, the low
    quantile of :data:`STREAM_ROUNDS` rounds of :data:`STREAM_MESSAGES`) while the others wait; then, with ``rounds``,
    every rank runs ``rounds + 1`` rounds (the first a warm-up) of each exchange pattern: ``iters`` times ``work_s``
    of busy CPU, then one batched exchange of ``nbytes`` with its ring neighbours (``ring``) or with every other
    rank (``all``), with ``nbytes_large`` the ring again with messages of that size (``ring_large``), and with
    ``work_long_s`` the ring again, ``iters_long`` times ``work_long_s`` of busy CPU per exchange (``ring_long``). With
    ``pipe`` (``(fn, args)``: a 2-rank pipeline's rank function and its arguments after ``rank, world``), ranks 0
    and 1 then run ``fn(rank, 2, *args)`` (node classification's runtime overhead probe). Each rank first imports
    the modules ``preload`` names (what a training rank imports: the floor includes them). With ``exchange``
    (:data:`EXCHANGE_PROBE`), ranks 0 and 1 time the host's batched exchange (:func:`_host_exchange`), half of its
    rounds after the stream and half at the end. Returns the low quantiles
    (:func:`.robust.low`) of the ping-pong and each round's wall and main-thread CPU seconds (and ``"pipeline"``: the
    pipeline rank's result, ``"exchange"``: the host exchange's points, ``"spread"``: per measurement the spread of
    its repeats, ``robust.spread``)."""

    for name in preload:  # what a training rank imports
        importlib.import_module(name)

    out: dict = {"p2p": [], "allreduce": [], "floor": peak_memory_bytes(torch.device("cpu")), "ring": [], "all": [],
                 "ring_large": [], "ring_long": [], "stream": [], "exchange": [],
                 "spread": {"p2p": [], "allreduce": [], "stream": [], "exchange": []}}
    pair = dist.new_group([0, 1]) if world > 2 else None  # every rank takes part in making the group
    if rank < 2:
        for n in sizes:
            t = torch.zeros(max(1, n // 4), dtype=torch.float32)
            k = max(3, 3 * reps if n <= (1 << 16) else reps if n <= (1 << 20) else reps // 4)
            walls, cpus = _ping_pong(rank, t, k, pair)
            # the smallest message gives the latency, a floor: its minimum (a round trip is one operation, and on a
            # loaded machine most of them wait for a rank to be scheduled); the other sizes their low quantile
            out["p2p"].append((t.numel() * 4, min(walls) if n == sizes[0] else low(walls), low(cpus)))
            out["spread"]["p2p"].append(spread(walls))
            walls, cpus = [], []
            dist.barrier(group=pair)
            for i in range(k + 1):
                w0, c0 = time.perf_counter(), time.thread_time()
                dist.all_reduce(t, group=pair)
                if i:
                    walls.append(time.perf_counter() - w0)
                    cpus.append(time.thread_time() - c0)
            out["allreduce"].append((t.numel() * 4, min(walls) if n == sizes[0] else low(walls), low(cpus)))
            out["spread"]["allreduce"].append(spread(walls))
    if rank < 2:  # a one-way stream, as a pipeline sends: the main thread's CPU per send and per receive
        for n in stream_sizes:
            t = torch.zeros(max(1, n // 4), dtype=torch.float32)
            bufs = [torch.empty_like(t) for _ in range(STREAM_MESSAGES)]
            per = []
            for r in range(STREAM_ROUNDS):
                dist.barrier(group=pair)
                cpu = 0.0
                if rank == 0:
                    works = []
                    for k in range(STREAM_MESSAGES):
                        _busy(0.001)
                        c0 = time.thread_time()
                        works.append(dist.isend(t, 1, tag=k))
                        cpu += time.thread_time() - c0
                    c0 = time.thread_time()
                    for work in works:
                        work.wait()
                    cpu += time.thread_time() - c0
                else:
                    works = [dist.irecv(bufs[k], 0, tag=k) for k in range(STREAM_MESSAGES)]
                    for work in works:
                        c0 = time.thread_time()
                        work.wait()
                        cpu += time.thread_time() - c0
                per.append(cpu / STREAM_MESSAGES)
            out["stream"].append((t.numel() * 4, low(per)))
            out["spread"]["stream"].append(spread(per))
    if rank < 2 and exchange:  # the first half of the host's exchanges (the second half at the end)
        out["exchange"] = _host_exchange(rank, pair, exchange["sizes"], exchange["work_s"], exchange["iters"],
                                         (exchange["rounds"] + 1) // 2)
    if rank < 2 and sizes:  # the smallest message once more: a transient (a rank still starting) is not the latency
        t = torch.zeros(max(1, sizes[0] // 4), dtype=torch.float32)
        walls, _ = _ping_pong(rank, t, 3 * reps, pair)
        b0, w_0, c_0 = out["p2p"][0]
        out["p2p"][0] = (b0, min(w_0, *walls), c_0)
    dist.barrier()
    if rounds > 0:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        patterns = ["ring", "all"] + (["ring_large"] if nbytes_large else []) + (["ring_long"] if work_long_s else [])
        for pattern in patterns:
            send = torch.zeros(max(1, (nbytes_large if pattern == "ring_large" else nbytes) // 4))
            busy, n_it = (work_long_s, iters_long) if pattern == "ring_long" else (work_s, iters)
            peers = [q for q in range(world) if q != rank] if pattern == "all" else [nxt]
            sources = [q for q in range(world) if q != rank] if pattern == "all" else [prv]
            out[pattern] = _busy_exchanges(send, {q: torch.empty_like(send) for q in sources}, peers, busy, n_it,
                                           rounds)
    dist.barrier()
    if pipe is not None and rank < 2:
        fn, args = pipe
        out["pipeline"] = fn(rank, 2, *args)
    if rank < 2 and exchange and exchange["rounds"] > 1:
        # the host's exchanges again, seconds after the first half: on a shared machine two ranks share one core for
        # seconds at a time, and every exchange of such a stretch waits; two stretches apart more often find one
        # where each rank has a core
        late = _host_exchange(rank, pair, exchange["sizes"], exchange["work_s"], exchange["iters"],
                              exchange["rounds"] // 2)
        out["exchange"] = [(b, early + more) for (b, early), (_, more) in zip(out["exchange"], late)]
    dist.barrier()
    return out


def _fit_link(points: list[tuple[int, float, float]], col: int = 1) -> Link:
    """``t = latency + bytes / bandwidth`` of column ``col``: the latency is the time of the smallest message,
    the bandwidth the least-squares slope of the others' excess over it (robust to one erratic size, which a
    free fit of both turns into a latency of milliseconds); both clipped to be physical. A message that took longer
    than a larger one is taken at the larger one's time first (fewer bytes do not take longer: the excess is
    noise, which only adds time)."""
    pts = sorted((float(p[0]), float(p[col])) for p in points)
    for k in range(len(pts) - 2, -1, -1):
        pts[k] = (pts[k][0], min(pts[k][1], pts[k + 1][1]))
    lat = max(0.0, pts[0][1])
    b = np.array([q[0] for q in pts[1:]])
    t = np.array([q[1] - lat for q in pts[1:]])
    inv_bw = float((b @ t) / (b @ b)) if b.size and float(b @ b) > 0 else 0.0
    if inv_bw <= 0:
        inv_bw = max(pts[-1][1], 1e-12) / max(pts[-1][0], 1.0)
    return Link(latency_s=lat, bandwidth_Bps=1.0 / max(inv_bw, 1e-15))  # at most 1 PB/s: a finite rate


def _lost_per_wait_rounds(rounds_by_rank, cores: int, iters: int) -> list[float]:
    """Per round, the core seconds lost per wait of a rank, ``(cores · wall − Σ CPU) / (R · iters)``;
    ``rounds_by_rank``: per rank, per round, ``(wall, main-thread CPU)``."""
    R = len(rounds_by_rank)
    n = min(len(r) for r in rounds_by_rank)
    vals = []
    for k in range(n):
        wall = max(r[k][0] for r in rounds_by_rank)
        cpu = sum(r[k][1] for r in rounds_by_rank)
        vals.append((cores * wall - cpu) / (R * iters))
    return vals


def _lost_per_wait(rounds_by_rank, cores: int, iters: int) -> float:
    """Core seconds lost per wait of a rank: the low quantile (:func:`.robust.low`: other work on the machine only
    adds lost time) over rounds of ``(cores · wall − Σ CPU) / (R · iters)`` (clipped at 0); ``rounds_by_rank``:
    per rank, per round, ``(wall, main-thread CPU)``."""
    vals = _lost_per_wait_rounds(rounds_by_rank, cores, iters)
    return max(0.0, low(vals)) if vals else 0.0


def switch_byte_cost(ring: Sequence[Sequence[Sequence[float]]], ring_large: Sequence[Sequence[Sequence[float]]],
                     cores: int, iters: int, nbytes: int, nbytes_large: int) -> float:
    """Core seconds lost per byte a rank sends while ranks share the cores (the transport's threads and the
    kernel moving the bytes): the growth of the ring's lost core time per wait (``switch_costs``) from
    messages of ``nbytes`` to messages of ``nbytes_large``, over the difference, clipped at 0.

    Raises:
        ValueError: ``nbytes_large`` not above ``nbytes``.
    """
    if nbytes_large <= nbytes:
        raise ValueError(f"nbytes_large ({nbytes_large}) must exceed nbytes ({nbytes})")
    small, large = _lost_per_wait(ring, cores, iters), _lost_per_wait(ring_large, cores, iters)
    return max(0.0, (large - small) / (nbytes_large - nbytes))


def switch_costs(ring: Sequence[Sequence[Sequence[float]]], every: Sequence[Sequence[Sequence[float]]], cores: int,
                 work_s: float, iters: int) -> tuple[float, float]:
    """``(switch_s, switch_peer_s)`` from the exchange rounds of :func:`_probe` (per rank, per round, ``(wall,
    main-thread CPU)``; ``ring``: one peer per exchange, ``every``: all ``R − 1``).

    A round on ``R`` ranks over ``cores`` cores (``R > cores``) gives the core time it did not spend on the ranks'
    main threads, ``cores · wall − Σ main-thread CPU``, lost to the exchanges: the transport's threads, the
    switches between ranks, and cores left idle while the ranks that could run wait for a message. Per wait of a
    rank that is ``(cores · wall − Σ CPU) / (R · iters)``; the low quantile over rounds is kept (:mod:`.robust`).
    ``switch_peer_s`` is the extra per further peer: ``(δ_all − δ_ring) / (R − 2)`` (0 for ``R = 2``). Both are clipped
    at 0.
    """

    R = len(ring)
    d_ring = _lost_per_wait(ring, cores, iters)
    d_all = _lost_per_wait(every, cores, iters) if R > 2 else d_ring
    return d_ring, (max(0.0, (d_all - d_ring) / (R - 2)) if R > 2 else 0.0)


def profile_link(backend: str = "gloo", sizes: Sequence[int] = (4, 65536, 1 << 20, 8 << 20), reps: int = 10,
                 timeout_s: float = 60.0, ranks: int = 2, pipeline: tuple | None = None,
                 exchange: dict | None = EXCHANGE_PROBE, preload: Sequence[str] = ()) -> tuple[Link, Link, dict]:
    """Measure the link between two local ranks over ``backend``: ``(p2p, allreduce, raw points)``.

    ``p2p``: one-way time of a message (half a round trip; the low quantile of ``reps`` round trips per size, the
    minimum for the smallest);
    ``allreduce``: the per-hop link of a ring all-reduce (for two ranks an all-reduce takes
    ``2·(latency + bytes/2/bandwidth)``, so the fitted ``t = a + bytes/bw`` gives ``Link(a/2, bw)``).
    ``raw``: ``{"p2p": [(bytes, wall_s, thread_cpu_s)…], "allreduce": […], "floor": peak resident bytes of a rank
    before any data, "msg_cpu": (s, s per byte) — the main thread's CPU per message op,
    "stream": {"send": [(bytes, s)…], "recv": […]} the one-way stream's CPU per message, "cores", "ranks",
    "switch": (switch_s, switch_peer_s, switch_byte_s) or None, "switch_curve": ``[(busy seconds, switch_s)…]``
    at ``SWITCH_PROBE``'s two bursts of compute before each wait (``[]`` without the probe), "exchange": the host
    exchange (a ``Link``: wall seconds of a batched exchange both ways after a burst of compute,
    ``latency + bytes / bandwidth``, bytes each way; ``None`` with ``exchange=None``), "spread":
    ``{"p2p", "allreduce", "msg_cpu", "exchange"[, "switch"]}`` the spread of each measurement's repeats
    (``robust.spread``, the mean over its sizes)}``. ``msg_cpu`` is fitted on the stream (the mean of a send and a
    receive: a rank does both alike).
    ``pipeline``: ``(fn, args)`` that ranks 0 and 1 run after the probe (``raw["pipeline"]``: their results);
    ``preload``: modules every rank imports before it reads its floor (what the task's training ranks import).

    With ``ranks`` greater than this machine's cores, that many ranks are started and, after the ping-pong of
    ranks 0 and 1, all of them run the exchange probe (``SWITCH_PROBE``, ``switch_costs``): the core time
    a rank's blocking wait costs when ranks share cores, and per byte a rank sends (``switch_byte_cost``).

    Raises:
        DistributedError: a rank failed.
    """
    cores = cores_here()
    world = max(2, int(ranks))
    rounds = SWITCH_PROBE["rounds"] if world > cores else 0
    outs = spawn(_probe, world, (list(sizes), int(reps), rounds, SWITCH_PROBE["work_s"], SWITCH_PROBE["iters"],
                                 SWITCH_PROBE["nbytes"], STREAM_SIZES, pipeline, SWITCH_PROBE["nbytes_large"],
                                 exchange, SWITCH_PROBE["work_long_s"], SWITCH_PROBE["iters_long"], tuple(preload)),
                 backend=backend,
                 timeout_s=timeout_s, threads=1)
    raw = dict(outs[0])
    p2p = _fit_link(raw["p2p"])
    ar2 = _fit_link(raw["allreduce"])
    # ring all-reduce of G=2: 2(G-1)=2 steps of bytes/2 → t = 2·lat + bytes/bw: per-hop latency lat, bandwidth bw
    allreduce = Link(latency_s=ar2.latency_s / 2, bandwidth_Bps=ar2.bandwidth_Bps)
    # a message costs its sender's main thread (the copy into the transport, on loopback also its delivery) and
    # its receiver's (the wait); a rank sends and receives alike, so a message op (send or receive) costs the mean
    sends = [(b, c) for b, c in outs[0]["stream"]]
    recvs = [(b, c) for b, c in outs[1]["stream"]]
    both = [(b, 0.0, (cs + cr) / 2) for (b, cs), (_, cr) in zip(sends, recvs)]
    cpu = _fit_link(both, col=2) if both else _fit_link(raw["p2p"], col=2)
    raw["msg_cpu"] = (cpu.latency_s, 1.0 / cpu.bandwidth_Bps)
    raw["stream"] = {"send": sends, "recv": recvs}
    raw["cores"], raw["ranks"] = cores, world
    # per size, the exchanges from both ranks ready to both done: their minimum (each is one operation whose time
    # has a floor, like a round trip; on a loaded 2-core machine the ranks share one core for seconds at a time and
    # a quarter or more of the exchanges wait for the other's threads: 0.3-3.9 ms for the low quantile of 28
    # exchanges of 64 KiB, 0.2-0.5 ms for their minimum), and the spread of the others above it
    per_size = [(b, _exchange_seconds(s0, s1)) for (b, s0), (_, s1) in zip(outs[0]["exchange"], outs[1]["exchange"])]
    ex = [(b, min(ts)) for b, ts in per_size if ts]
    raw["exchange"] = _fit_link(ex) if ex else None
    raw["exchange_points"] = ex
    outs[0]["spread"]["exchange"] = [spread(ts, min(ts)) for _, ts in per_size if ts]
    raw["switch"] = (switch_costs([o["ring"] for o in outs], [o["all"] for o in outs], cores,
                                  SWITCH_PROBE["work_s"], SWITCH_PROBE["iters"]) if rounds else None)
    # the lost core time per wait against the busy CPU before it: (work_s, switch_s) points
    raw["switch_curve"] = ([(SWITCH_PROBE["work_s"], raw["switch"][0]),
                            (SWITCH_PROBE["work_long_s"], _lost_per_wait([o["ring_long"] for o in outs], cores,
                                                                         SWITCH_PROBE["iters_long"]))]
                           if rounds else [])
    if rounds:
        raw["switch"] += (switch_byte_cost([o["ring"] for o in outs], [o["ring_large"] for o in outs], cores,
                                           SWITCH_PROBE["iters"], SWITCH_PROBE["nbytes"],
                                           SWITCH_PROBE["nbytes_large"]),)
    raw["spread"] = _link_spread(outs, cores, rounds)
    for key in ("ring", "all", "ring_large", "ring_long"):
        raw.pop(key, None)
    if pipeline is not None:
        raw["pipeline"] = [o["pipeline"] for o in outs[:2]]
    return p2p, allreduce, raw


def _link_spread(outs: list, cores: int, rounds: int) -> dict:
    """``{measurement: spread}`` of the link probe (``robust.spread`` of each size's repeats, the mean over the
    sizes and over ranks 0 and 1): ``p2p``, ``allreduce``, ``msg_cpu`` (the stream), ``exchange``, and ``switch``
    (the ring's lost core time per wait) when the exchange rounds ran."""
    def mean(key: str) -> float:
        vals = [v for o in outs[:2] for v in o.get("spread", {}).get(key, [])]
        return float(np.mean(vals)) if vals else 0.0

    got = {"p2p": mean("p2p"), "allreduce": mean("allreduce"), "msg_cpu": mean("stream"),
           "exchange": mean("exchange")}
    if rounds:
        lost = _lost_per_wait_rounds([o["ring"] for o in outs], cores, SWITCH_PROBE["iters"])
        got["switch"] = spread(lost) if lost and low(lost) > 0 else 0.0
    return got


def link_fields(p2p: Link, allreduce: Link, raw: dict) -> dict:
    """The :data:`LINK_FIELDS` of a :class:`Profile` from :func:`profile_link`'s result (pass it to :func:`profile`
    as ``link_result`` to profile several jobs with one probe)."""
    sw = raw.get("switch")
    a, b = raw.get("msg_cpu", (0.0, 0.0))
    return {"p2p": p2p, "allreduce": allreduce, "runtime_floor_bytes": int(raw.get("floor", 0)),
            "msg_cpu_s": float(a), "msg_cpu_s_per_byte": float(b), "switch_s": float(sw[0]) if sw else 0.0,
            "switch_peer_s": float(sw[1]) if sw else 0.0,
            "switch_byte_s": float(sw[2]) if sw and len(sw) > 2 else 0.0,
            "switch_ranks": int(raw.get("ranks", 0)) if sw else 0,
            "switch_curve": [tuple(map(float, p)) for p in raw.get("switch_curve") or []] if sw else [],
            "host_exchange": raw.get("exchange"),
            "link_spread": {k: float(v) for k, v in (raw.get("spread") or {}).items()}}
