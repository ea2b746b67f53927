"""Ranks on emulated links of a set bandwidth: Linux network namespaces, veth pairs and ``tc … tbf``.

A benchmark helper (not a runtime dependency of gnnpipe; needs root, ``ip`` and ``tc``). :class:`Mesh` makes one
network namespace per emulated *node* (``ranks_per_node`` ranks each; default 1: a namespace per rank) and a full
mesh of veth pairs between the nodes, one pair per pair of nodes, each end shaped by a token-bucket filter
(``tc qdisc add dev … root tbf rate R``) at the inter-node rate: every pair of nodes has a link of its own, of the
set bandwidth in each direction — the model of :class:`gnnpipe.costmodel.hardware.Hardware` (``[link.inter]``).
Ranks of one node talk over that namespace's loopback, shaped at the intra-node rate when one is given
(``[link.intra]``; all of the node's local traffic then shares it). ``netem`` is not needed: latency is not
emulated (what the transport and the veth add is measured with the links).

Addressing: node ``n`` has ``10.213.0.(n+1)/32`` on its first veth and a host route to every other node's
address through the veth to that node (the source address set to its own), so a rank bound to its node's address
(``GLOO_SOCKET_IFNAME``) reaches every peer over that pair's own link. The addresses exist only inside the
namespaces this module creates; nothing is configured in the caller's namespace, so no traffic leaves them.

Ranks are started with ``ip netns exec NS`` and the environment ``torchrun`` would give them (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR`` = node 0's address,
``MASTER_PORT``), so ``python -m gnnpipe train …`` runs as under torchrun (``gnnpipe.core.run.launch``).

Teardown: deleting a namespace deletes its veths and their qdiscs; :meth:`Mesh.down` deletes every namespace
the mesh made (on exit of the ``with`` block, on an exception, on SIGINT/SIGTERM, and at interpreter exit), and
:func:`residue` lists what is left of a prefix. Names are ``gnl<6 hex>n<node>`` (the hex token is random per mesh),
so concurrent meshes do not collide.

Command line::

    python benchmarks/netns_links.py --ranks 2 --mbit 250            # make a mesh, measure each link, remove it
    python benchmarks/netns_links.py --ranks 4 --ranks-per-node 2 --mbit 250 --intra-mbit 2000
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "gnl"
SUBNET = "10.213.0."
#: message sizes of the link measurement (the profile's ping-pong sizes: gnnpipe.costmodel.link)
PROBE_SIZES = (4, 65536, 1 << 20, 8 << 20)
#: bytes each rank sends in the exchange of :meth:`Mesh.measure` (both ways at once)
EXCHANGE_BYTES = 8 << 20
#: the host-CPU measurement of :meth:`Mesh.measure`: messages of this many bytes, one way, for about this long
CPU_BYTES, CPU_WALL_S = 8 << 20, 2.0


class NetnsError(RuntimeError):
    """The emulation cannot run here (not root, ``ip``/``tc`` missing) or a command failed."""


# ----------------------------------------------------------------------------------------------- pure parts
def check_environment(euid: int | None = None, which=shutil.which) -> None:
    """Refuse (``NetnsError``, one line naming the fix) unless running as root with ``ip`` and ``tc`` on PATH."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        raise NetnsError("emulated links need root (network namespaces, veth and tc): run as root, e.g. "
                         "sudo -E python benchmarks/...")
    missing = [t for t in ("ip", "tc") if which(t) is None]
    if missing:
        raise NetnsError(f"{' and '.join(missing)} not found on PATH: install iproute2 (apt-get install iproute2)")


def tbf_params(rate_Bps: float) -> dict:
    """``tc … tbf`` settings for ``rate_Bps`` bytes/s: ``rate`` in bit/s, a ``burst`` of 2 ms of the rate (at least
    64 KiB: one GSO super-packet of the veth passes whole) and a queue of 200 ms (at least 1 MiB), so TCP is
    paced, not dropped.

    Raises:
        ValueError: a rate that is not > 0.
    """
    if not rate_Bps > 0:
        raise ValueError(f"link rate must be > 0 bytes/s, got {rate_Bps!r}")
    return {"rate_bit": int(round(rate_Bps * 8)), "burst": max(65536, int(rate_Bps * 0.002)),
            "limit": max(1 << 20, int(rate_Bps * 0.2))}


def tbf_command(ns: str, dev: str, rate_Bps: float) -> list[str]:
    """``ip netns exec NS tc qdisc add dev DEV root tbf rate … burst … limit …`` (argv)."""
    p = tbf_params(rate_Bps)
    return ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
            "rate", f"{p['rate_bit']}bit", "burst", str(p["burst"]), "limit", str(p["limit"])]


def scaled_rate(paper_Bps: float, speed: float) -> float:
    """The link rate that keeps a cluster's communication-to-compute ratio on devices ``speed`` times slower:
    ``paper_Bps / speed`` bytes/s (e.g. 10 Gbit/s = 1.25e9 B/s over speed 40 → 31.25e6 B/s = 250 Mbit/s)."""
    if not (paper_Bps > 0 and speed > 0):
        raise ValueError("paper rate and speed factor must be > 0")
    return paper_Bps / speed


def hardware_toml(name: str, ranks: int, rate_Bps: float, cores: int, intra_Bps: float | None = None,
                  latency_us: float = 0.0, exchange_Bps: float | None = None, per_pair: bool = True,
                  cpu_s_per_byte: float = 0.0) -> str:
    """A ``gnnpipe plan --hardware`` TOML for a mesh on this machine: one node of ``cores`` CPU cores (the ranks
    time-share them, as they do here), every link at ``rate_Bps`` (``[link.inter]`` and ``[link.intra]``:
    within the cost model every rank of the mesh is on this one node; ``intra_Bps`` overrides ``[link.intra]``),
    ``per_pair = true`` as the mesh gives every pair of ranks a link of its own (``per_pair=False``: one link per
    rank, as one network card per node); ``exchange_Bps``: the rate in each direction when both ends send at once
    (``exchange_gbps``; measured by :meth:`Mesh.measure`); ``cpu_s_per_byte``: the host CPU seconds per byte
    carried (``cpu_ns_per_byte``; measured by :meth:`Mesh.measure`; 0: not written)."""
    intra = rate_Bps if intra_Bps is None else intra_Bps
    ex = "" if exchange_Bps is None else f"exchange_gbps = {exchange_Bps / 1e9!r}\n"
    ex += f"cpu_ns_per_byte = {cpu_s_per_byte * 1e9!r}\n" if cpu_s_per_byte > 0 else ""
    ex += f"per_pair = {'true' if per_pair else 'false'}\n"
    return (f'name = "{name}"\n\n[node]\ncount = 1\ndevices = {int(cores)}\nkind = "cpu"\n\n[device]\nspeed = 1.0\n\n'
            f"[link.intra]\nlatency_us = {latency_us}\nbandwidth_gbps = {intra / 1e9!r}\n{ex}\n"
            f"[link.inter]\nlatency_us = {latency_us}\nbandwidth_gbps = {rate_Bps / 1e9!r}\n{ex}")


class Mesh:
    """A full mesh of shaped links between ``ranks // ranks_per_node`` namespaces (module docstring).

    Args:
        ranks: ranks (>= 2). inter_Bps: bytes/s of each link between nodes, each direction (``math.inf``: the
            veths unshaped, as fast as this machine moves bytes between namespaces).
        intra_Bps: bytes/s of a node's loopback (``None``: unshaped). ranks_per_node: ranks per namespace.
        token: the hex part of the names (default: random).

    Use as a context manager: ``with Mesh(4, 31.25e6) as m: m.run(argv_of_rank)``.
    """

    def __init__(self, ranks: int, inter_Bps: float, intra_Bps: float | None = None, ranks_per_node: int = 1,
                 token: str | None = None) -> None:
        if ranks < 2 or ranks_per_node < 1 or ranks % ranks_per_node:
            raise ValueError(f"ranks ({ranks}) must be >= 2 and a multiple of ranks_per_node ({ranks_per_node})")
        if not math.isinf(inter_Bps):
            tbf_params(inter_Bps)
        if intra_Bps is not None:
            tbf_params(intra_Bps)
        self.ranks, self.rpn = int(ranks), int(ranks_per_node)
        self.nodes = self.ranks // self.rpn
        if self.nodes < 2 and intra_Bps is None:
            raise ValueError("one node and no intra-node rate: nothing to emulate")
        self.inter_Bps, self.intra_Bps = float(inter_Bps), intra_Bps
        self.token = token or secrets.token_hex(3)
        self.prefix = f"{PREFIX}{self.token}"
        self._made: list[str] = []
        self._handlers: dict = {}

    # names and addresses ------------------------------------------------------------------------------
    def netns(self, node: int) -> str:
        return f"{self.prefix}n{node}"

    def node_of(self, rank: int) -> int:
        return int(rank) // self.rpn

    def address(self, node: int) -> str:
        return f"{SUBNET}{node + 1}"

    def ifname(self, node: int) -> str:
        """The veth that holds ``node``'s address (its link to node 0, or node 1's for node 0); ``lo`` alone."""
        if self.nodes == 1:
            return "lo"
        return f"v{1 if node == 0 else 0}"

    def links(self) -> list[tuple[int, int]]:
        return [(a, b) for a in range(self.nodes) for b in range(a + 1, self.nodes)]

    def commands(self) -> list[list[str]]:
        """Every command :meth:`up` runs, in order (argv lists; pure)."""
        cmds: list[list[str]] = []
        for n in range(self.nodes):
            ns = self.netns(n)
            cmds.append(["ip", "netns", "add", ns])
            cmds.append(["ip", "-n", ns, "link", "set", "lo", "up"])
            if self.intra_Bps is not None and self.rpn > 1:
                cmds.append(tbf_command(ns, "lo", self.intra_Bps))
        for a, b in self.links():
            cmds.append(["ip", "link", "add", f"v{b}", "netns", self.netns(a), "type", "veth",
                         "peer", "name", f"v{a}", "netns", self.netns(b)])
        for n in range(self.nodes):
            ns = self.netns(n)
            if self.nodes == 1:
                cmds.append(["ip", "-n", ns, "addr", "add", f"{self.address(n)}/32", "dev", "lo"])
                continue
            for q in range(self.nodes):
                if q != n:
                    cmds.append(["ip", "-n", ns, "link", "set", f"v{q}", "up"])
                    if not math.isinf(self.inter_Bps):
                        cmds.append(tbf_command(ns, f"v{q}", self.inter_Bps))
            cmds.append(["ip", "-n", ns, "addr", "add", f"{self.address(n)}/32", "dev", self.ifname(n)])
            for q in range(self.nodes):
                if q != n:
                    cmds.append(["ip", "-n", ns, "route", "add", f"{self.address(q)}/32", "dev", f"v{q}",
                                 "src", self.address(n)])
        return cmds

    def env(self, rank: int, port: int, base: dict | None = None) -> dict:
        """The environment ``torchrun`` would give ``rank`` (plus ``GLOO_SOCKET_IFNAME``; one torch thread)."""
        e = dict(os.environ if base is None else base)
        n = self.node_of(rank)
        e.update(RANK=str(rank), WORLD_SIZE=str(self.ranks), LOCAL_RANK=str(rank % self.rpn),
                 LOCAL_WORLD_SIZE=str(self.rpn), GROUP_RANK=str(n), NODE_RANK=str(n),
                 MASTER_ADDR=self.address(0), MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=self.ifname(n),
                 OMP_NUM_THREADS="1")
        return e

    def exec_argv(self, rank: int, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns(self.node_of(rank)), *argv]

    # making and removing ------------------------------------------------------------------------------
    def up(self) -> Mesh:
        check_environment()
        self._install_handlers()
        atexit.register(self.down)
        try:
            for cmd in self.commands():
                if cmd[:3] == ["ip", "netns", "add"]:
                    self._made.append(cmd[3])
                _run(cmd)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Delete every namespace this mesh made (their veths and qdiscs go with them); idempotent."""
        while self._made:
            ns = self._made.pop()
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._restore_handlers()

    def __enter__(self) -> Mesh:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def _install_handlers(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum, frame):
            self.down()
            raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._handlers[sig] = signal.signal(sig, on_signal)

    def _restore_handlers(self) -> None:
        for sig, h in self._handlers.items():
            signal.signal(sig, h)
        self._handlers = {}

    # running ranks ------------------------------------------------------------------------------------
    def run(self, argv_of_rank, timeout_s: float = 1800.0, port: int = 29517, cwd: str | None = None,
            env_extra: dict | None = None) -> list[subprocess.CompletedProcess]:
        """Start every rank (``argv_of_rank(rank)`` inside its namespace), wait for all; on a failure or timeout
        the other ranks are killed. Returns the completed processes (stdout/stderr captured as text).

        Raises:
            NetnsError: a rank exited non-zero (its stderr's tail in the message) or the timeout passed.
        """
        procs = []
        for r in range(self.ranks):
            env = self.env(r, port)
            env.update(env_extra or {})
            procs.append(subprocess.Popen(self.exec_argv(r, argv_of_rank(r)), env=env, cwd=cwd or str(ROOT),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        outs: dict[int, tuple[str, str]] = {}
        deadline = time.monotonic() + timeout_s
        failed = None
        threads: list = []
        try:
            import threading

            def drain(r, p):
                outs[r] = p.communicate()

            threads = [threading.Thread(target=drain, args=(r, p), daemon=True) for r, p in enumerate(procs)]
            for t in threads:
                t.start()
            while any(p.poll() is None for p in procs):
                if time.monotonic() > deadline:
                    failed = "timeout"
                    break
                bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
                if bad:
                    failed = bad[0]
                    break
                time.sleep(0.2)
            if failed is None:
                bad = [r for r, p in enumerate(procs) if p.returncode != 0]
                failed = bad[0] if bad else None
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            for t in threads:
                t.join(timeout=10)
        if failed is not None:
            tail = "" if failed == "timeout" else (outs.get(failed, ("", ""))[1] or "")[-2000:]
            what = f"timed out after {timeout_s:.0f} s" if failed == "timeout" else f"rank {failed} failed"
            raise NetnsError(f"{what}: {tail}")
        return [subprocess.CompletedProcess(p.args, p.returncode, *outs.get(r, ("", ""))) for r, p in
                enumerate(procs)]

    def measure(self, pairs: Sequence[tuple[int, int]] | None = None, reps: int = 6,
                port: int = 29518) -> list[dict]:
        """Each link between nodes (``pairs`` of nodes, default all) by the profile's ping-pong
        (``gnnpipe.costmodel.link``: one-way time of 4 B … 8 MiB messages, fitted as latency + bytes /
        bandwidth), with one rank in each of the two namespaces; then an exchange of :data:`EXCHANGE_BYTES` both
        ways at once (the median of 5; ``exchange_Bps``: bytes per second in each direction); then the host's CPU
        per byte carried (``cpu_s_per_byte``: messages of :data:`CPU_BYTES` one way for about :data:`CPU_WALL_S`
        seconds, the busy CPU of all cores from ``/proc/stat`` less that of an idle wait as long, over the bytes;
        nothing else may run on the machine meanwhile). Returns ``[{"nodes", "set_Bps", "measured_Bps",
        "latency_s", "ratio", "exchange_Bps", "exchange_ratio", "cpu_s_per_byte"}]``."""
        out = []
        for a, b in (pairs if pairs is not None else self.links()):
            sub = _PairView(self, a, b)
            res = sub.run(lambda r: [sys.executable, str(Path(__file__).resolve()), "_probe", "--reps", str(reps)],
                          timeout_s=600, port=port)
            rec = json.loads(res[0].stdout.strip().splitlines()[-1])
            # an unshaped link: the ratios are against the measured one-way rate
            ref = rec["measured_Bps"] if math.isinf(self.inter_Bps) else self.inter_Bps
            rec.update(nodes=[a, b], set_Bps=self.inter_Bps, ratio=rec["measured_Bps"] / ref,
                       exchange_ratio=rec["exchange_Bps"] / ref)
            out.append(rec)
        return out


class _PairView(Mesh):
    """Two ranks, one in node ``a``'s namespace and one in node ``b``'s, of an existing mesh (for measuring)."""

    def __init__(self, mesh: Mesh, a: int, b: int) -> None:
        self.mesh, self.pair = mesh, (a, b)
        self.ranks, self.rpn, self.nodes = 2, 1, mesh.nodes

    def netns(self, node: int) -> str:
        return self.mesh.netns(node)

    def node_of(self, rank: int) -> int:
        return self.pair[rank]

    def address(self, node: int) -> str:
        return self.mesh.address(node)

    def ifname(self, node: int) -> str:
        return self.mesh.ifname(node)

    def env(self, rank: int, port: int, base: dict | None = None) -> dict:
        e = super().env(rank, port, base)
        e.update(MASTER_ADDR=self.address(self.pair[0]), GROUP_RANK=str(rank), NODE_RANK=str(rank),
                 LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        return e


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")


def residue(prefix: str = PREFIX) -> list[str]:
    """Namespaces whose name starts with ``prefix`` that exist now (what a mesh would leave behind)."""
    r = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.startswith(prefix)]


# ------------------------------------------------------------------------------------ the probe, one rank
def _probe_main(reps: int) -> int:
    """One rank of :meth:`Mesh.measure` (started under the torchrun environment): the profile's ping-pong of
    :data:`PROBE_SIZES` between ranks 0 and 1; rank 0 prints the fitted link as one JSON line."""
    import datetime

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from gnnpipe.costmodel.link import _fit_link, _probe

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    out = _probe(rank, 2, list(PROBE_SIZES), reps, 0, 0.0, 0, 0, stream_sizes=())
    # an exchange: both ranks send EXCHANGE_BYTES to each other at once, through the runtime's own exchange (a
    # graph-parallel halo exchange: gnnpipe.core.comm.Comm.exchange)
    from gnnpipe.core.comm import Comm

    comm = Comm()
    t = torch.zeros(EXCHANGE_BYTES // 4)
    buf = torch.empty_like(t)
    times = []
    for i in range(6):
        dist.barrier()
        t0 = time.perf_counter()
        comm.exchange([(t, 1 - rank)], [(buf, 1 - rank)], tag=7, kind="graph")
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
    cpu_s_per_byte = _host_cpu_per_byte(rank, EXCHANGE_BYTES / statistics.median(times))
    dist.destroy_process_group()
    if rank == 0:
        link = _fit_link(out["p2p"])
        print(json.dumps({"measured_Bps": link.bandwidth_Bps, "latency_s": link.latency_s,
                          "exchange_Bps": EXCHANGE_BYTES / statistics.median(times), "cpu_s_per_byte": cpu_s_per_byte,
                          "points": [list(p) for p in out["p2p"]]}))
    return 0


def host_busy_s() -> float:
    """CPU seconds this host's cores have been busy since boot (``/proc/stat``: user, nice, system, irq, softirq;
    the whole machine, whichever namespace reads it)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


def _host_cpu_per_byte(rank: int, rate_Bps: float) -> float:
    """Ranks 0 and 1 (inside the process group): the host's busy CPU seconds per byte while rank 0 sends messages
    of :data:`CPU_BYTES` to rank 1 for about :data:`CPU_WALL_S` seconds at ``rate_Bps`` (rank 0's estimate
    decides the count), less the busy CPU of an idle wait as long (>= 0; rank 0's figure, 0.0 on rank 1)."""
    import torch
    import torch.distributed as dist

    n = torch.tensor([max(1, min(1000, round(CPU_WALL_S * rate_Bps / CPU_BYTES)))])
    dist.broadcast(n, 0)
    t = torch.zeros(CPU_BYTES // 4)
    dist.barrier()
    b0, w0 = host_busy_s(), time.perf_counter()
    for _ in range(int(n)):
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
    dist.barrier()
    wall, b1 = time.perf_counter() - w0, host_busy_s()
    dist.barrier()
    i0 = host_busy_s()
    time.sleep(wall)
    i1 = host_busy_s()
    dist.barrier()
    return max(0.0, (b1 - b0) - (i1 - i0)) / (int(n) * t.numel() * 4) if rank == 0 else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_probe"]:
        reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 6
        return _probe_main(reps)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--mbit", type=float, default=250.0, help="inter-node link rate, Mbit/s (default: 250)")
    p.add_argument("--intra-mbit", type=float, help="intra-node (loopback) rate, Mbit/s (default: unshaped)")
    p.add_argument("--reps", type=int, default=6, help="round trips per message size")
    args = p.parse_args(argv)
    try:
        check_environment()
        mesh = Mesh(args.ranks, args.mbit * 1e6 / 8, None if args.intra_mbit is None else args.intra_mbit * 1e6 / 8,
                    args.ranks_per_node)
        with mesh:
            for rec in mesh.measure(reps=args.reps):
                print(f"link {rec['nodes'][0]}-{rec['nodes'][1]}: set {rec['set_Bps'] * 8 / 1e6:.1f} Mbit/s, "
                      f"measured {rec['measured_Bps'] * 8 / 1e6:.1f} Mbit/s ({rec['ratio']:.3f}), latency "
                      f"{rec['latency_s'] * 1e6:.0f} us; both ways at once {rec['exchange_Bps'] * 8 / 1e6:.1f} "
                      f"Mbit/s each ({rec['exchange_ratio']:.3f}); host CPU {rec['cpu_s_per_byte'] * 1e9:.2f} ns/byte")
        left = residue(mesh.prefix)
        print("left behind: " + (", ".join(left) if left else "nothing"))
        return 1 if left else 0
    except (NetnsError, ValueError) as e:
        print(f"netns_links: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("netns_links: interrupted; the namespaces are removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
