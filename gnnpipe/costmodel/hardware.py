"""The hardware description the cost model predicts for: a TOML file (``gnnpipe plan --hardware FILE``).

A machine is ``count`` identical nodes of ``devices`` compute devices each (CPU cores, or GPUs), a speed
factor of one device relative to the device the profile was measured on, memory, and two links
(within a node, between nodes). Ranks are placed in blocks: ``ranks_per_node = ceil(R / count)``, rank
``r`` on node ``r // ranks_per_node``. On a CPU node, ranks beyond its cores share them (as on a
2-core machine running 4 ranks): the simulation slows compute down by the mean number of ranks that
compute at the same time per core, and the epoch takes at least the node's work plus the measured cost of
every blocking wait of time-sliced ranks over its cores (see
:func:`gnnpipe.tasks.nodes.cost.epoch_time.predict_time`; the cost of a wait is measured on the machine that
profiles, with more ranks than its cores).

Format (every key below; ``[link.*]`` may be left out, then the link measured by the profile's
ping-pong over the actual backend is used)::

    name = "8x RTX A5000 over 2 nodes"
    [node]
    count = 2            # nodes
    devices = 4          # compute devices per node: CPU cores (kind = "cpu") or GPUs (kind = "gpu")
    kind = "gpu"
    memory_gib = 256     # host memory per node (optional)
    [device]
    speed = 40.0         # compute speed of one device / the profiled device's (> 0)
    memory_gib = 24      # memory of one device (optional; GPUs)
    [link.intra]         # between two ranks of one node
    latency_us = 10.0
    bandwidth_gbps = 12.0   # GB/s (10^9 bytes per second), one direction
    [link.inter]         # between nodes
    latency_us = 25.0
    bandwidth_gbps = 1.25
    exchange_gbps = 0.625   # optional: GB/s in each direction while both ends send at once (default: bandwidth)
    per_pair = false        # optional: every pair of ranks has a link of its own (default: one per rank)
    cpu_ns_per_byte = 4.0   # optional: host CPU the transport and kernel spend per byte carried (default: 0)

``exchange_gbps`` describes a link on which the transport does not get the full rate both ways at once (measured
by ``benchmarks/netns_links.py`` through the runtime's own exchange: 0.92–0.95 of a shaped veth's rate each way
with gloo; half of it when each side's send is posted before its receive, which
:meth:`gnnpipe.core.comm.Comm.exchange` avoids). Graph parallelism's halo exchanges and a hybrid's peer
exchanges (both ways at once) take it; the pipeline's one-way boundary transfers take ``bandwidth_gbps``.

``per_pair`` says how a rank's traffic to several peers shares the wire. By default (``false``) a rank has one link
of this kind, as a node has one network card: a graph-parallel rank's whole halo, from all its peers, crosses it.
With ``per_pair = true`` every pair of ranks has a link of its own at the rate (a full mesh of point-to-point
links, as ``benchmarks/netns_links.py`` builds): the peers of an exchange send at once, each over its own link, and
the exchange takes as long as its largest pair.

``cpu_ns_per_byte`` is the host's CPU time, summed over its cores, that carrying one byte over the link costs (the
transport's threads and the kernel's network stack). A pipeline's boundary send and its receive each take half of
it per byte on their ranks' main threads (where it is more than the profile's own per-byte message cost), so it
lengthens the schedule; where ranks share cores, the time-sliced bound
(:func:`gnnpipe.tasks.nodes.cost.host_costs.shared_cores_bound`) charges each byte a rank sends the larger of this
and the profile's own per-byte cost (:attr:`gnnpipe.tasks.nodes.cost.profile.Profile.switch_byte_s`, measured on the
loopback).
A batched exchange (graph parallelism's, a hybrid's peer op) waits on the link while the host moves its bytes: only
the bound charges it.
A link shaped to a low rate costs more per byte than the loopback (``benchmarks/netns_links.py`` measures it: 4–7.5
ns per byte through a veth shaped by ``tbf`` at 250 Mbit/s, under 1 ns unshaped, on a 2-core VM).

Shipped examples: :func:`shipped_hardware` names (``local-2core``, ``cpu-16core``, ``paper-a5000``, ``h200x8``,
``h200x64``), in
``gnnpipe/costmodel/machines/``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigError

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

MACHINES = Path(__file__).parent / "machines"
GIB = 2 ** 30

_TOP = {"name", "node", "device", "link"}
_NODE = {"count", "devices", "kind", "memory_gib"}
_DEVICE = {"speed", "memory_gib"}
_LINK = {"latency_us", "bandwidth_gbps", "exchange_gbps", "per_pair", "cpu_ns_per_byte"}
_LINK_REQUIRED = {"latency_us", "bandwidth_gbps"}


@attrs.frozen
class Link:
    """A point-to-point link: a transfer of ``n`` bytes takes ``latency_s + n / bandwidth_Bps`` seconds.

    Attributes:
        latency_s: seconds per message (>= 0). bandwidth_Bps: bytes per second, one direction (> 0).
        exchange_Bps: bytes per second in each direction while both ends send at once (> 0; ``None``: full
            duplex, ``bandwidth_Bps``). See the module docstring (``exchange_gbps``).
        per_pair: every pair of ranks has a link of its own (``True``) rather than one link per rank shared by
            all its peers (module docstring, ``per_pair``).
        cpu_s_per_byte: host CPU seconds, summed over cores, per byte carried (>= 0; module docstring,
            ``cpu_ns_per_byte``).
    """

    latency_s: float
    bandwidth_Bps: float
    exchange_Bps: float | None = None
    per_pair: bool = False
    cpu_s_per_byte: float = 0.0

    def __attrs_post_init__(self) -> None:
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"link latency must be a finite number >= 0 seconds, got {self.latency_s!r}")
        for what, v in (("bandwidth", self.bandwidth_Bps), ("exchange bandwidth", self.exchange_Bps)):
            # finite, and large enough that a byte takes a finite time (1 / 1e-320 overflows)
            if v is not None and not (v > 0 and math.isfinite(v) and math.isfinite(1.0 / v)):
                raise ConfigError(f"link {what} must be a finite number > 0 bytes/s, got {v!r}")
        if not (math.isfinite(self.cpu_s_per_byte) and self.cpu_s_per_byte >= 0):
            raise ConfigError(f"link CPU per byte must be a finite number >= 0 seconds, got {self.cpu_s_per_byte!r}")

    @property
    def exchange_bandwidth_Bps(self) -> float:
        """The rate in bytes per second of each direction of an exchange in which both ends send at once
        (``exchange_Bps``, or ``bandwidth_Bps`` on a full-duplex link)."""
        return self.bandwidth_Bps if self.exchange_Bps is None else self.exchange_Bps

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` (0 bytes: nothing is sent, 0 s)."""
        return self.latency_s + nbytes / self.bandwidth_Bps if nbytes > 0 else 0.0

    def allreduce_time(self, nbytes: float, group: int) -> float:
        """Ring all-reduce of ``nbytes`` over ``group`` ranks: ``2(G−1)`` steps of ``nbytes / G`` each
        (Patarasuk & Yuan 2009; the byte count of ``gnnpipe.core.comm.Comm``)."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        return 2 * (group - 1) * (self.latency_s + nbytes / group / self.bandwidth_Bps)


@attrs.frozen
class Hardware:
    """A machine to predict for (module docstring).

    Attributes:
        name: label. nodes: node count. devices_per_node: CPU cores or GPUs per node. kind: ``"cpu"`` or
        ``"gpu"``. speed: compute speed of one device relative to the profiled device (compute seconds
        are divided by it). node_memory_bytes / device_memory_bytes: limits (``None``: unknown, not checked).
        intra / inter: links (``None``: use the profile's measured link).
    """

    name: str
    nodes: int = 1
    devices_per_node: int = 1
    kind: str = "cpu"
    speed: float = 1.0
    node_memory_bytes: int | None = None
    device_memory_bytes: int | None = None
    intra: Link | None = None
    inter: Link | None = None

    def __attrs_post_init__(self) -> None:
        for key in ("nodes", "devices_per_node"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"hardware {self.name!r}: {key} must be an integer >= 1, got {v!r}")
        if self.kind not in ("cpu", "gpu"):
            raise ConfigError(f"hardware {self.name!r}: node kind must be 'cpu' or 'gpu', got {self.kind!r}")
        if not (isinstance(self.speed, (int, float)) and math.isfinite(self.speed) and self.speed > 0):
            raise ConfigError(f"hardware {self.name!r}: device speed must be a finite number > 0, got {self.speed!r}")

    # ------------------------------------------------------------------ placement
    def check_ranks(self, ranks: int) -> None:
        """Refuse more ranks than a GPU machine has devices (a rank computes on a GPU of its own; ranks sharing CPU
        cores are modelled, ranks sharing a GPU are not).

        Raises:
            ConfigError: ``kind == "gpu"`` and ``ranks > nodes · devices_per_node``.
        """
        total = self.nodes * self.devices_per_node
        if self.kind == "gpu" and int(ranks) > total:
            raise ConfigError(f"hardware {self.name!r} has {total} GPU(s) ({self.nodes} node(s) x "
                              f"{self.devices_per_node}); {ranks} ranks need one each: give --ranks {total} or "
                              "fewer, or a hardware file with more nodes")

    def ranks_per_node(self, ranks: int) -> int:
        """``ceil(R / nodes)``: ranks fill the nodes in blocks."""
        return -(-int(ranks) // self.nodes)

    def node_of(self, rank: int, ranks: int) -> int:
        """Node of global ``rank`` among ``ranks`` (block placement)."""
        return int(rank) // self.ranks_per_node(ranks)

    def link(self, a: int, b: int, ranks: int, measured: Link) -> Link:
        """The link between global ranks ``a`` and ``b``: ``intra`` on one node, else ``inter``; a link the
        description leaves out is the ``measured`` one."""
        same = self.node_of(a, ranks) == self.node_of(b, ranks)
        chosen = self.intra if same else self.inter
        return chosen if chosen is not None else measured

    def group_link(self, members: list[int], ranks: int, measured: Link) -> Link:
        """The slowest link among ``members`` (a collective is as fast as its slowest hop)."""
        nodes = {self.node_of(r, ranks) for r in members}
        if len(nodes) > 1:
            return self.inter if self.inter is not None else measured
        return self.intra if self.intra is not None else measured

    def oversubscription(self, ranks: int) -> float:
        """Ranks per device on the fullest node (>= 1 means devices are shared; GPUs are not shared by the model)."""
        return self.ranks_per_node(ranks) / self.devices_per_node

    def fits(self, per_rank_bytes: list[int]) -> bool:
        """Whether every rank fits its device's memory and every node's ranks fit the node's memory
        (limits that are ``None`` are not checked)."""
        R = len(per_rank_bytes)
        if self.device_memory_bytes is not None and max(per_rank_bytes, default=0) > self.device_memory_bytes:
            return False
        if self.node_memory_bytes is not None:
            per_node: dict[int, int] = {}
            for r, b in enumerate(per_rank_bytes):
                per_node[self.node_of(r, R)] = per_node.get(self.node_of(r, R), 0) + int(b)
            if max(per_node.values(), default=0) > self.node_memory_bytes:
                return False
        return True

    def to_dict(self) -> dict:
        return attrs.asdict(self)


def _section(doc: dict, key: str, allowed: set[str], where: str, table: str | None = None) -> dict:
    """The table ``doc[key]`` (``{}`` when absent), its keys checked against ``allowed``; ``table``: its name in
    messages (default ``key``, e.g. ``link.inter``)."""
    table = table or key
    sec = doc.get(key, {})
    if not isinstance(sec, dict):
        raise ConfigError(f"{where}: [{table}] must be a table, got {type(sec).__name__}")
    unknown = set(sec) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} in [{table}]; "
                          f"allowed: {', '.join(sorted(allowed))}")
    return sec


#: the least value a positive number of a hardware file may take (a bandwidth of 1e-9 Gbit/s is 1 bit/s)
MIN_POSITIVE = 1e-9
#: the largest value any number of a hardware file may take (1e12 GiB of memory, 1e12 us = 11.6 days of latency)
MAX_NUMBER = 1e12


def _number(sec: dict, key: str, where: str, table: str, *, positive: bool = True, default: Any = None) -> Any:
    if key not in sec:
        return default
    v = sec[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ConfigError(f"{where}: [{table}] {key} must be a {'positive' if positive else 'non-negative'} number, "
                          f"got {v!r}")
    if positive and v < MIN_POSITIVE:  # a rate or size this small gives no finite time (1 / 1e-320 overflows)
        raise ConfigError(f"{where}: [{table}] {key} must be at least {MIN_POSITIVE:g}, got {v!r}")
    if v > MAX_NUMBER:  # beyond any machine: in bytes (memory_gib · 2³⁰) it overflows, in a time it prints absurdly
        raise ConfigError(f"{where}: [{table}] {key} must be at most {MAX_NUMBER:g}, got {v!r}")
    return v


def _link(doc: dict, key: str, where: str) -> Link | None:
    links = doc.get("link", {})
    if not isinstance(links, dict):
        raise ConfigError(f"{where}: [link] must hold tables [link.intra] / [link.inter]")
    unknown = set(links) - {"intra", "inter"}
    if unknown:
        raise ConfigError(f"{where}: unknown link(s) {', '.join(sorted(unknown))}; use [link.intra] and [link.inter]")
    if key not in links:
        return None
    sec = _section(links, key, _LINK, where, f"link.{key}")
    missing = _LINK_REQUIRED - set(sec)
    if missing:
        raise ConfigError(f"{where}: [link.{key}] needs {', '.join(sorted(missing))}")
    t = f"link.{key}"
    lat = _number(sec, "latency_us", where, t, positive=False)
    bw = _number(sec, "bandwidth_gbps", where, t)
    ex = _number(sec, "exchange_gbps", where, t)
    cpu = _number(sec, "cpu_ns_per_byte", where, t, positive=False, default=0.0)
    if ex is not None and ex > bw:
        raise ConfigError(f"{where}: [{t}] exchange_gbps ({ex!r}) is the rate of each direction while both send: it "
                          f"cannot exceed bandwidth_gbps ({bw!r})")
    pp = sec.get("per_pair", False)
    if not isinstance(pp, bool):
        raise ConfigError(f"{where}: [link.{key}] per_pair must be true or false, got {pp!r}")
    return Link(latency_s=lat * 1e-6, bandwidth_Bps=bw * 1e9, exchange_Bps=None if ex is None else ex * 1e9,
                per_pair=pp, cpu_s_per_byte=cpu * 1e-9)


def parse_hardware(doc: dict, where: str = "hardware") -> Hardware:
    """A :class:`Hardware` from a parsed TOML document (module docstring).

    Raises:
        ConfigError: unknown keys, missing ``[node] devices``, non-positive or non-numeric values, bad kind.
    """
    unknown = set(doc) - _TOP
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_TOP))}")
    node = _section(doc, "node", _NODE, where)
    dev = _section(doc, "device", _DEVICE, where)
    if "devices" not in node:
        raise ConfigError(f"{where}: [node] needs devices (CPU cores or GPUs per node)")
    for key in ("count", "devices"):
        if key in node and (isinstance(node[key], bool) or not isinstance(node[key], int) or node[key] < 1):
            raise ConfigError(f"{where}: [node] {key} must be an integer >= 1, got {node[key]!r}")
    node_mem = _number(node, "memory_gib", where, "node")
    dev_mem = _number(dev, "memory_gib", where, "device")
    if node.get("kind", "cpu") not in ("cpu", "gpu"):
        raise ConfigError(f"{where}: [node] kind must be \"cpu\" or \"gpu\", got {node['kind']!r}")
    name = doc.get("name", where)
    if not isinstance(name, str):
        raise ConfigError(f"{where}: name must be a string")
    return Hardware(
        name=name, nodes=int(node.get("count", 1)), devices_per_node=int(node["devices"]),
        kind=str(node.get("kind", "cpu")), speed=float(_number(dev, "speed", where, "device", default=1.0)),
        node_memory_bytes=None if node_mem is None else int(node_mem * GIB),
        device_memory_bytes=None if dev_mem is None else int(dev_mem * GIB),
        intra=_link(doc, "intra", where), inter=_link(doc, "inter", where),
    )


def shipped_hardware() -> dict[str, Path]:
    """``{name: path}`` of the example descriptions shipped with gnnpipe."""
    return {p.stem: p for p in sorted(MACHINES.glob("*.toml"))}


def load_hardware(path_or_name: str | Path) -> Hardware:
    """Read a hardware TOML file, or a shipped example by name (:func:`shipped_hardware`).

    Raises:
        ConfigError: the file does not exist (the message lists the shipped names), is not valid TOML
            (with the parser's line and column), or is not a valid description (see ``parse_hardware``).
    """
    p = Path(path_or_name)
    if not p.exists():
        shipped = shipped_hardware()
        if str(path_or_name) in shipped:
            p = shipped[str(path_or_name)]
        else:
            raise ConfigError(f"hardware file {str(path_or_name)!r} not found; give a TOML file or one of the "
                              f"shipped descriptions: {', '.join(shipped)}")
    if p.is_dir():
        raise ConfigError(f"hardware {str(path_or_name)!r} is a directory; give a TOML file or one of the shipped "
                          f"descriptions: {', '.join(shipped_hardware())}")
    try:
        doc = tomllib.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the hardware file {str(p)!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_hardware(doc, str(p))


def local_hardware(memory_bytes: int | None = None) -> Hardware:
    """This machine: one CPU node with ``os.cpu_count()`` cores, its physical memory, the measured link."""
    if memory_bytes is None:
        try:
            pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
            memory_bytes = int(pages * size)
        except (ValueError, OSError, AttributeError):  # pragma: no cover
            memory_bytes = None
    return Hardware(name=f"this machine ({os.cpu_count()} CPU cores)", nodes=1, devices_per_node=os.cpu_count() or 1,
                    kind="cpu", speed=1.0, node_memory_bytes=memory_bytes)


def cores_here() -> int:
    """CPU cores this process may run on (``sched_getaffinity``, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text in ("", "max") else int(text)
    except (OSError, ValueError):
        return None


def available_memory_bytes() -> int | None:
    """What this machine can still give a process: ``MemAvailable`` of ``/proc/meminfo`` (Linux), lowered to
    the room left under the process's cgroup memory limit when there is one (a container: cgroup v2
    ``memory.max − memory.current``, v1 ``memory.limit_in_bytes − memory.usage_in_bytes``); ``None`` elsewhere."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:  # pragma: no cover - not Linux
        return None
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        lim, use = _read_int(limit), _read_int(usage)
        if lim is not None and use is not None and lim < (1 << 60):  # v1 writes a huge number for "no limit"
            room = max(0, lim - use)
            avail = room if avail is None else min(avail, room)
            break
    return avail
