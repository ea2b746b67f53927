"""Built-in vertex partitioners: ``metis``, ``kahip``, ``random``, ``contiguous``, ``bfs``, ``rcm``, ``morton``.

Each registers through :func:`gnnpipe.partitioners.register`, the door user code uses, and inherits
the edge-case handling and over-partitioning of :class:`~gnnpipe.partitioners.GraphPartitioner`.

Stated balance (``sizes`` = vertices per part, ``P`` parts, ``N`` vertices; before any
over-partitioning grouping, which keeps the bound only on average):

=============  ====================================================================================
method         balance promise
=============  ====================================================================================
metis          vertex *weight* per part ≤ ``(1 + ufactor/1000) ×`` mean for k-way (METIS's own target,
               ufactor 30 by default; not a hard guarantee). Vertex counts follow from the weights.
kahip          vertex weight per part ≤ ``(1 + imbalance) ×`` mean (KaHIP guarantees it).
random         sizes differ by at most one (exact).
contiguous     ``balance="vertices"``: sizes differ by at most one. ``balance="edges"``: every part's
               in-edge count is within one vertex's in-degree of ``E / P``.
bfs            sizes differ by at most one (exact; regions may be disconnected when a component ends).
rcm            as ``contiguous`` over the RCM order.
morton         as ``contiguous`` over the Morton (Z-order) of the vertex positions.
=============  ====================================================================================
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
from collections import deque
from typing import Any

import numpy as np
import pymetis
import torch
from scipy.sparse.csgraph import connected_components
from torch import Tensor

from ..errors import ConfigError
from .base import Graph, GraphPartitioner, _ranges_to_parts, balanced_cuts, register

__all__ = [
    "BFSPartitioner",
    "ContiguousPartitioner",
    "KaHIPPartitioner",
    "MetisPartitioner",
    "MortonPartitioner",
    "RCMPartitioner",
    "RandomPartitioner",
    "morton_codes",
    "vertex_weights",
]

_WEIGHT_RE = re.compile(r"^\s*(\d+)\s*\+\s*degree\s*$")


def vertex_weights(spec: Any, graph: Graph) -> np.ndarray | None:
    """Resolve a vertex-weight option to ``np.ndarray[N]`` of ``int64`` (or ``None`` = unit weights).

    Args:
        spec: ``"A+degree"`` for an integer ``A >= 0`` (GNNPipe's preprocessing is ``"50+degree"``),
            ``"degree"`` (same as ``"1+degree"``, so isolated vertices still weigh 1), ``"uniform"`` or
            ``None`` (all 1), or a tensor/array/list of ``N`` non-negative integers. *degree* is the
            number of distinct neighbours in the symmetrised simple graph (:attr:`Graph.degree`).
        graph: the graph being partitioned.

    Raises:
        ConfigError: an unknown string, wrong length, negative or non-integer weights, or all zero.
    """
    if spec is None or (isinstance(spec, str) and spec.strip() in ("uniform", "none", "1")):
        return None
    if isinstance(spec, str):
        s = spec.strip()
        if s == "degree":
            return graph.degree + 1
        m = _WEIGHT_RE.match(s)
        if not m:
            raise ConfigError(
                f"unknown vertex_weight {spec!r}; use 'A+degree' (e.g. '50+degree'), 'degree', 'uniform', "
                "or a tensor of N non-negative integers"
            )
        return graph.degree + int(m.group(1))
    w = torch.as_tensor(spec).flatten()
    if w.numel() != graph.num_nodes:
        raise ConfigError(f"vertex_weight has {w.numel()} entries; the graph has {graph.num_nodes} vertices")
    if w.dtype.is_floating_point and not torch.equal(w, w.round()):
        raise ConfigError("vertex_weight must hold integers (METIS and KaHIP take integer weights)")
    w = w.long().numpy()
    if (w < 0).any() or w.sum() == 0:
        raise ConfigError("vertex_weight must be non-negative and not all zero")
    return w


def _flush_c_stdio() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def _captured_c_output(out: list[str]):
    """Capture C-level writes to file descriptors 1 and 2 (METIS prints warnings such as ``***Cannot
    bisect …`` to stdout when asked for nearly as many parts as vertices, and ``METIS Error: …`` to
    stderr before pymetis raises an opaque ``RuntimeError``). The captured text is appended to ``out``;
    Python-level ``sys.stdout``/``sys.stderr`` are flushed and the descriptors restored."""
    saved: list[tuple[int, int]] = []
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd in (1, 2):
            saved.append((fd, os.dup(fd)))
    except (OSError, ValueError, AttributeError):  # no real fds (e.g. some embedded consoles)
        for _, dup in saved:
            os.close(dup)
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        _flush_c_stdio()
        for fd, _ in saved:
            os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            _flush_c_stdio()  # METIS's buffered printf output goes to the file, not to the restored fd
            for fd, dup in saved:
                os.dup2(dup, fd)
                os.close(dup)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))


@register("metis")
class MetisPartitioner(GraphPartitioner):
    """METIS multilevel k-way / recursive-bisection partitioning (Karypis & Kumar, *A fast and high
    quality multilevel scheme for partitioning irregular graphs*, SIAM J. Sci. Comput. 20(1), 1998),
    through ``pymetis``, minimising the edge cut of the symmetrised simple graph under a vertex-weight
    balance constraint.

    GNNPipe's chunking (arXiv 2308.10087, §4) is ``MetisPartitioner(over=4)`` with the default
    ``vertex_weight="50+degree"``; graph parallelism uses plain METIS (``over=1``).

    Args:
        over: over-partitioning factor (see :class:`GraphPartitioner`).
        vertex_weight: see :func:`vertex_weights`; default ``"50+degree"``.
        recursive: ``True`` = recursive bisection, ``False`` = k-way; ``None`` = pymetis's rule
            (recursive for at most 8 parts), except that ``contiguous=True`` always uses k-way.
        ufactor: METIS load-imbalance tolerance in 1/1000 (``None`` = METIS default: 30 for k-way,
            1 for recursive bisection).
        contiguous: ask METIS for connected parts. METIS honours this only in k-way mode and only on a
            connected graph (of the symmetrised simple graph :attr:`Graph.csr`), so both are checked
            before METIS runs (see Raises). With ``over > 1`` the promise holds for the ``over·P`` fine
            parts METIS cuts; the random grouping of fine parts into ``P`` parts may join fine parts that
            do not touch.
        ncuts: number of METIS runs (the best cut is kept).

    Deterministic for a seed: METIS's own RNG is seeded with ``seed mod (2³¹ − 1)``. METIS can
    return empty parts when ``P`` is close to ``N`` or weights are very uneven; they are repaired
    with a :class:`~gnnpipe.partitioners.PartitionWarning` (see :func:`~gnnpipe.partitioners.repair_empty_parts`).
    METIS's own C-level messages are captured: silenced when it succeeds, quoted when it fails.

    Raises:
        ConfigError: bad option values; ``contiguous=True`` with ``recursive=True`` (recursive
            bisection ignores METIS's contiguity option) or on a graph with more than one connected
            component (METIS refuses it; the message gives the number and sizes of the components);
            any other failure of METIS (its own message quoted), never pymetis's bare
            ``RuntimeError: Caught an unknown exception!``.
    """

    def __init__(
        self,
        *,
        over: int = 1,
        vertex_weight: Any = "50+degree",
        recursive: bool | None = None,
        ufactor: int | None = None,
        contiguous: bool = False,
        ncuts: int = 1,
    ):
        super().__init__(over=over)
        if isinstance(vertex_weight, str):
            vertex_weight = vertex_weight.strip()
        self.vertex_weight = vertex_weight
        self.recursive = recursive
        if ufactor is not None and (int(ufactor) != ufactor or ufactor < 1):
            raise ConfigError(f"ufactor must be an integer >= 1 (1/1000 units); got {ufactor!r}")
        self.ufactor = ufactor
        self.contiguous = bool(contiguous)
        if self.contiguous and recursive:
            raise ConfigError(
                "METIS ignores contiguous=True in recursive bisection (recursive=True); use recursive=False "
                "(k-way) or leave recursive unset, which picks k-way when contiguous parts are asked for"
            )
        if int(ncuts) != ncuts or ncuts < 1:
            raise ConfigError(f"ncuts must be an integer >= 1; got {ncuts!r}")
        self.ncuts = int(ncuts)

    def assign(self, graph: Graph, num_parts: int, seed: int) -> Tensor:
        csr = graph.csr
        if self.contiguous:
            _require_connected(graph, num_parts)
        dt = pymetis.zero_copy_dtype()
        adj = pymetis.CSRAdjacency(
            adj_starts=np.ascontiguousarray(csr.indptr, dtype=dt), adjacent=np.ascontiguousarray(csr.indices, dtype=dt)
        )
        vw = vertex_weights(self.vertex_weight, graph)
        opts = pymetis.Options(seed=int(seed) % (2**31 - 1), ncuts=self.ncuts)
        if self.ufactor is not None:
            opts.ufactor = int(self.ufactor)
        recursive = self.recursive
        if self.contiguous:
            opts.contig = 1
            recursive = False  # METIS's contiguity option exists in k-way only
        said: list[str] = []
        try:
            with _captured_c_output(said):
                res = pymetis.part_graph(
                    num_parts,
                    adj,
                    vweights=None if vw is None else np.ascontiguousarray(vw, dtype=dt),
                    recursive=recursive,
                    options=opts,
                )
        except (RuntimeError, MemoryError) as exc:
            text = " ".join(" ".join(said).split()) or str(exc)
            raise ConfigError(
                f"METIS could not cut the graph ({graph.num_nodes} vertices) into {num_parts} parts with "
                f"{self!r}: {text}; try other options (recursive, ufactor, contiguous) or another partitioner"
            ) from None
        return torch.from_numpy(np.asarray(res.vertex_part, dtype=np.int64))


def _require_connected(graph: Graph, num_parts: int) -> None:
    """Raise :class:`ConfigError` unless the symmetrised graph is connected (what METIS needs for
    contiguous parts)."""
    k, labels = connected_components(graph.csr, directed=False)
    if k > 1:
        sizes = np.sort(np.bincount(labels))[::-1]
        shown = ", ".join(str(int(x)) for x in sizes[:5]) + (", …" if k > 5 else "")
        isolated = int((sizes == 1).sum())
        raise ConfigError(
            f"contiguous=True needs a connected graph, and this one has {k} connected components "
            f"(sizes {shown}; {isolated} isolated vertices), so METIS cannot make {num_parts} connected "
            "parts; drop contiguous=True, or partition the largest component on its own"
        )


@register("kahip")
class KaHIPPartitioner(GraphPartitioner):
    """KaHIP's ``kaffpa`` multilevel partitioner (Sanders & Schulz, *Think Locally, Act Globally:
    Highly Balanced Graph Partitioning*, SEA 2013), an optional backend: it needs the ``kahip``
    Python package (``pip install kahip``).

    Args:
        over: over-partitioning factor (see :class:`GraphPartitioner`).
        vertex_weight: see :func:`vertex_weights`; default ``"50+degree"`` as for METIS.
        imbalance: allowed vertex-weight imbalance ``ε`` (part weight ≤ ``(1 + ε)`` × mean).
        mode: ``"fast"``, ``"eco"``, ``"strong"`` or their ``"…social"`` variants for power-law graphs.

    Raises:
        ConfigError: the ``kahip`` package is missing (at construction), or bad options.
    """

    MODES = ("fast", "eco", "strong", "fastsocial", "ecosocial", "strongsocial")

    def __init__(self, *, over: int = 1, vertex_weight: Any = "50+degree", imbalance: float = 0.03, mode: str = "eco"):
        super().__init__(over=over)
        if not self.is_available():
            raise ConfigError("the 'kahip' partitioner needs the optional package kahip: pip install kahip")
        if mode not in self.MODES:
            raise ConfigError(f"unknown KaHIP mode {mode!r}; use one of {', '.join(self.MODES)}")
        if not 0 <= float(imbalance) < 1:
            raise ConfigError(f"imbalance must lie in [0, 1); got {imbalance!r}")
        self.vertex_weight = vertex_weight
        self.imbalance = float(imbalance)
        self.mode = mode

    @staticmethod
    def is_available() -> bool:
        """``True`` when the ``kahip`` package can be imported."""
        try:
            import kahip  # noqa: F401
        except ImportError:
            return False
        return True

    def assign(self, graph: Graph, num_parts: int, seed: int) -> Tensor:
        import kahip

        csr = graph.csr
        vw = vertex_weights(self.vertex_weight, graph)
        n = graph.num_nodes
        vwgt = (np.ones(n, dtype=np.int64) if vw is None else vw).tolist()
        xadj = csr.indptr.tolist()
        adjncy = csr.indices.tolist()
        _cut, blocks = kahip.kaffpa(
            vwgt, xadj, [1] * len(adjncy), adjncy, int(num_parts), self.imbalance, True,
            int(seed) % (2**31 - 1), self.MODES.index(self.mode),
        )
        return torch.as_tensor(np.asarray(blocks, dtype=np.int64))


@register("random")
class RandomPartitioner(GraphPartitioner):
    """Seeded balanced random assignment: a random permutation of the vertices dealt round-robin.

    Part sizes differ by at most one. The baseline every locality-aware method is compared with
    (its expected directed edge cut is ``(1 − 1/P) · E``).
    """

    def assign(self, graph: Graph, num_parts: int, seed: int) -> Tensor:
        gen = torch.Generator().manual_seed(int(seed))
        perm = torch.randperm(graph.num_nodes, generator=gen)
        parts = torch.empty(graph.num_nodes, dtype=torch.long)
        parts[perm] = torch.arange(graph.num_nodes) % num_parts
        return parts


def _check_balance(balance: str) -> str:
    if balance not in ("vertices", "edges"):
        raise ConfigError(f"balance must be 'vertices' or 'edges'; got {balance!r}")
    return balance


@register("contiguous")
class ContiguousPartitioner(GraphPartitioner):
    """Vertex-id ranges: part ``i`` is ``[b_i, b_{i+1})`` (:func:`~gnnpipe.partitioners.balanced_cuts`).

    Args:
        over: over-partitioning factor (see :class:`GraphPartitioner`).
        balance: ``"vertices"`` (sizes differ by at most one) or ``"edges"`` (each range holds about
            ``E / P`` edges by destination, i.e. in-degree sum; within one vertex's in-degree).

    Ignores ``seed`` (deterministic). Good when the input order already has locality (e.g. after
    :class:`RCMPartitioner`'s relabelling or a crawl order), terrible otherwise.
    """

    deterministic_in_seed = False

    def __init__(self, *, over: int = 1, balance: str = "vertices"):
        super().__init__(over=over)
        self.balance = _check_balance(balance)

    def assign(self, graph: Graph, num_parts: int, seed: int) -> Tensor:
        n = graph.num_nodes
        w = np.ones(n) if self.balance == "vertices" else graph.in_degree
        return _ranges_to_parts(np.arange(n), balanced_cuts(w, num_parts))


@register("rcm")
class RCMPartitioner(GraphPartitioner):
    """Reverse Cuthill–McKee order cut into balanced ranges.

    The RCM order (Cuthill & McKee, *Reducing the bandwidth of sparse symmetric matrices*, ACM 1969;
    reversed per George 1971), from :func:`scipy.sparse.csgraph.reverse_cuthill_mckee` on the
    symmetrised graph (:attr:`Graph.rcm_order`), is a BFS-like low-bandwidth order; consecutive ranges
    of it are local.

    Args:
        over: over-partitioning factor (see :class:`GraphPartitioner`).
        balance: ``"vertices"`` or ``"edges"`` as in :class:`ContiguousPartitioner`.

    Ignores ``seed`` (deterministic).
    """

    deterministic_in_seed = False

    def __init__(self, *, over: int = 1, balance: str = "vertices"):
        super().__init__(over=over)
        self.balance = _check_balance(balance)

    def assign(self, graph: Graph, num_parts: int, seed: int) -> Tensor:
        order = graph.rcm_order
        w = np.ones(order.size) if self.balance == "vertices" else graph.in_degree[order]
        return _ranges_to_parts(order, balanced_cuts(w, num_parts))


@register("bfs")
class BFSPartitioner(GraphPartitioner):
    """Greedy graph growing: regions grown one after another by breadth-first search.

    Rule: the target sizes are ``⌈N/P⌉`` for the first ``N mod P`` parts and ``⌊N/P⌋`` for the rest.
    Region ``p`` starts at a seed vertex and absorbs unassigned neighbours in BFS order until it
    reaches its target. The seed of region 0 is a uniformly random vertex (``seed``); each later
    region starts at an unassigned neighbour of the previous region's BFS frontier (so regions
    tile the graph), or, when that frontier is exhausted, at the next unassigned vertex of a seeded
    random order. The same fallback restarts a region whose component ran out of vertices, so
    regions can be disconnected on disconnected graphs. Sizes differ by at most one.
    Cost ``O(N + E)`` (with per-vertex Python overhead, about 1 s per 100k vertices).

    After the greedy graph-growing idea of Karypis & Kumar (SIAM J. Sci. Comput. 1998, §4.1 GGP)
    applied to ``P`` parts directly.
    """

    def assign(self, graph: Graph, num_parts: int, seed: int) -> Tensor:
        n = graph.num_nodes
        csr = graph.csr
        indptr, indices = csr.indptr, csr.indices
        rng = np.random.default_rng(int(seed))
        fallback = rng.permutation(n).tolist()
        ptr = 0
        part = np.full(n, -1, dtype=np.int64)
        carry: deque[int] = deque()

        def next_seed() -> int:
            nonlocal ptr
            while carry:
                u = carry[0]
                nb = indices[indptr[u] : indptr[u + 1]]
                nb = nb[part[nb] < 0]
                if nb.size:
                    return int(nb[0])
                carry.popleft()
            while part[fallback[ptr]] >= 0:
                ptr += 1
            return fallback[ptr]

        base, extra = divmod(n, num_parts)
        for p in range(num_parts):
            need = base + (1 if p < extra else 0)
            queue: deque[int] = deque()
            last = -1
            while need:
                if not queue:
                    s = next_seed()
                    part[s] = p
                    need -= 1
                    queue.append(s)
                    continue
                v = last = queue.popleft()
                nb = indices[indptr[v] : indptr[v + 1]]
                nb = nb[part[nb] < 0]
                if nb.size > need:
                    nb = nb[:need]
                part[nb] = p
                need -= nb.size
                queue.extend(nb.tolist())
            # the next region starts next to this one: at the last expanded vertex, then this BFS frontier
            if last >= 0 or queue:
                carry = deque(([last] if last >= 0 else []) + list(queue))
        return torch.from_numpy(part)


#: bits per coordinate of a Morton code (3 · 21 = 63 bits fit a signed 64-bit integer)
MORTON_BITS = 21


def _spread_bits(v: np.ndarray) -> np.ndarray:
    """Insert two zero bits after each of the low 21 bits of ``v`` (``uint64``): bit ``k`` moves to ``3k``."""
    v = v & np.uint64(0x1FFFFF)
    v = (v | (v << np.uint64(32))) & np.uint64(0x1F00000000FFFF)
    v = (v | (v << np.uint64(16))) & np.uint64(0x1F0000FF0000FF)
    v = (v | (v << np.uint64(8))) & np.uint64(0x100F00F00F00F00F)
    v = (v | (v << np.uint64(4))) & np.uint64(0x10C30C30C30C30C3)
    v = (v | (v << np.uint64(2))) & np.uint64(0x1249249249249249)
    return v


def morton_codes(pos: Tensor, bits: int = MORTON_BITS) -> np.ndarray:
    """Morton (Z-order) codes of points: coordinates quantised on a ``2**bits`` grid over their bounding box,
    bits interleaved (``x`` lowest, then ``y``, ``z``).

    Morton, *A computer oriented geodetic data base and a new technique in file sequencing* (IBM 1966).

    Args:
        pos: ``Tensor[N, D]`` with ``1 <= D <= 3`` (Å for atoms; any unit). Missing dimensions count as zero.
        bits: grid bits per coordinate (``1..21``).

    Returns:
        ``np.ndarray[N]`` (``int64``) of codes; nearby points tend to have nearby codes.

    Raises:
        ConfigError: ``D`` outside ``1..3``, ``bits`` outside ``1..21`` or non-finite coordinates.
    """
    p = torch.as_tensor(pos).detach().to("cpu", torch.float64).numpy()
    if p.ndim != 2 or not 1 <= p.shape[1] <= 3:
        raise ConfigError(f"morton needs positions of shape [N, D] with D in 1..3; got {tuple(p.shape)}")
    if not 1 <= int(bits) <= MORTON_BITS:
        raise ConfigError(f"morton bits must lie in 1..{MORTON_BITS}; got {bits}")
    if not np.isfinite(p).all():
        raise ConfigError("morton needs finite positions; got NaN or inf")
    if p.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = p.min(0), p.max(0)
    scale = np.where(hi > lo, (2 ** int(bits) - 1) / np.where(hi > lo, hi - lo, 1.0), 0.0)
    q = np.floor((p - lo) * scale).astype(np.uint64)
    code = np.zeros(p.shape[0], dtype=np.uint64)
    for d in range(p.shape[1]):
        code |= _spread_bits(q[:, d]) << np.uint64(d)
    return code.astype(np.int64)


@register("morton")
class MortonPartitioner(GraphPartitioner):
    """Space-filling-curve ranges: vertices sorted by the Morton (Z-order) code of their positions
    (:func:`morton_codes`), the order cut into balanced contiguous ranges.

    A geometric partitioner for atomistic graphs, whose edges join atoms within a cutoff: a range of the
    Z-order is a compact region of space, so few edges cross parts (the ordering fairchem's graph-parallel
    code partitions atoms with). Ties (equal codes) keep the vertex-id order. A batch of structures
    (``graph.batch``) is ordered structure by structure (codes within each structure's own bounding box), so a
    part never interleaves structures that overlap in space. The graph's edges are used only for
    ``balance="edges"``.

    Args:
        over: over-partitioning factor (see :class:`GraphPartitioner`).
        balance: ``"vertices"`` or ``"edges"`` as in :class:`ContiguousPartitioner`.
        bits: grid bits per coordinate (``1..21``).

    Raises:
        ConfigError: the graph has no positions (pass a ``Data`` with ``pos``, or a :class:`Graph` with ``pos``).

    Ignores ``seed`` (deterministic).
    """

    deterministic_in_seed = False

    def __init__(self, *, over: int = 1, balance: str = "vertices", bits: int = MORTON_BITS):
        super().__init__(over=over)
        self.balance = _check_balance(balance)
        if not _is_int_in(bits, 1, MORTON_BITS):
            raise ConfigError(f"morton bits must be an integer in 1..{MORTON_BITS}; got {bits!r}")
        self.bits = int(bits)

    def assign(self, graph: Graph, num_parts: int, seed: int) -> Tensor:
        if graph.pos is None:
            raise ConfigError("the morton partitioner needs vertex positions: pass a Data with pos, a "
                              "Graph(edge_index, N, pos=...), or plan_graph_parallel(..., pos=batch.pos) for atoms")
        if graph.batch is None:
            order = np.argsort(morton_codes(graph.pos, self.bits), kind="stable")
        else:
            batch = graph.batch.numpy()
            codes = np.zeros(graph.num_nodes, dtype=np.int64)
            for b in np.unique(batch):
                members = batch == b
                codes[members] = morton_codes(graph.pos[torch.from_numpy(members)], self.bits)
            order = np.lexsort((codes, batch))  # by structure, then code (stable: then vertex id)
        w = np.ones(order.size) if self.balance == "vertices" else graph.in_degree[order]
        return _ranges_to_parts(order, balanced_cuts(w, num_parts))


def _is_int_in(value: Any, lo: int, hi: int) -> bool:
    return not isinstance(value, (bool, str)) and isinstance(value, (int, np.integer)) and lo <= int(value) <= hi
