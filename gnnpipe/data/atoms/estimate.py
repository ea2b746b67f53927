"""How large the neighbour graph of a cutoff will be, estimated before any list is built, and the check that refuses a
cutoff whose graph cannot be built here (or warns about one that is merely large).

The neighbour search enumerates every pair within the cutoff, periodic images included, before ``max_neighbors``
keeps the nearest of each atom (:func:`~gnnpipe.data.atoms.build_graph`): a cutoff of 150 Å on an 8-atom copper
cell enumerates ~10 million pairs per structure although the graph keeps 400. The estimate counts both, per
structure, from the geometry alone, in time linear in the atoms (a sample of target atoms for large structures)::

    expected images of atom j within r of atom i  =  |ball of radius sqrt(r² − h²) in the periodic subspace| / V_k

where ``k`` is the number of periodic directions, ``V_k`` the cell's ``k``-volume (length, area, volume) spanned
by their cell vectors, and ``h`` the distance from ``i`` to ``j`` perpendicular to them (the lattice average of
the count; ``k = 3``: density × sphere volume; ``k = 0``: exact, ``1`` when ``|x_j − x_i| < r``). Summed over
``j`` (less the atom itself) it is atom ``i``'s neighbour count ``c_i``; the search enumerates ``Σ c_i`` pairs,
the graph keeps ``Σ min(c_i, max_neighbors)`` edges and about ``Σ d_i (d_i − 1)`` triplets (``d_i`` the kept
in-degree; each edge ``j → i`` pairs with the in-edges of ``j`` but the back-track). A non-periodic structure
never has more than ``n (n − 1)`` pairs.

Costs: the search and its sort hold about :data:`SEARCH_BYTES_PER_PAIR` bytes per enumerated pair at their peak
and take about :data:`SEARCH_SECONDS_PER_PAIR` per pair (measured on this project's 2-core CPU machine: 130–460 B
and 1.8–4.1 µs per pair between the torch and ASE cell-list paths, the larger taken); the graph keeps
:data:`EDGE_BYTES` per edge and :data:`TRIPLET_BYTES` per triplet. A step builds one batch's graph structure by
structure, so its peak is the largest structure's search plus the batch's kept graph, and its time the sum of its
structures' searches (every step rebuilds it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ..validation import DataWarning
from .validate import check_cells

__all__ = ["GraphEstimate", "check_graph_size", "estimate_graph", "neighbor_counts"]

#: bytes the neighbour search and build_graph's sort and cap hold per enumerated pair at their peak
SEARCH_BYTES_PER_PAIR = 500
#: seconds per enumerated pair of the neighbour search with build_graph's sort and cap
SEARCH_SECONDS_PER_PAIR = 4e-6
#: bytes per kept edge (``edge_index`` 16, ``cell_offsets`` 24)
EDGE_BYTES = 40
#: bytes per triplet (``idx_kj``, ``idx_ji`` 16, and the temporaries of :func:`~gnnpipe.data.atoms.triplets`)
TRIPLET_BYTES = 64
#: refuse a batch's graph needing more than this fraction of the memory available here
MEMORY_FRACTION = 0.5
#: refuse a batch's graph taking longer than this to build (seconds; it is rebuilt at every step)
MAX_BUILD_SECONDS = 60.0
#: warn above this fraction of the available memory
WARN_MEMORY_FRACTION = 0.1
#: warn above this many seconds per batch's graph
WARN_BUILD_SECONDS = 2.0
#: at most this many structures of a larger set are estimated (evenly spaced; totals scaled up)
SAMPLE_STRUCTURES = 2048
#: at most this many target atoms of a larger structure are counted (evenly spaced; counts scaled up)
SAMPLE_ATOMS = 256


def neighbor_counts(pos, cell, pbc, cutoff: float, sample: int = SAMPLE_ATOMS) -> tuple[np.ndarray, int]:
    """``(c, n)``: the expected number of neighbours within ``cutoff`` (periodic images counted, self excluded) of
    each of up to ``sample`` target atoms (evenly spaced), float64 ``[m]``, and the structure's atoms ``n``.

    Args:
        pos: ``[n, 3]`` Å. cell: ``[3, 3]`` Å (rows; only the periodic directions' rows are read). pbc: ``[3]``
            bool. cutoff: Å.
    """
    pos = np.asarray(pos, dtype=np.float64).reshape(-1, 3)
    cell = np.asarray(cell, dtype=np.float64).reshape(3, 3)
    pbc = np.asarray(pbc, dtype=bool).reshape(3)
    n = len(pos)
    if n == 0:
        return np.zeros(0), 0
    targets = pos if n <= sample else pos[np.linspace(0, n - 1, sample).round().astype(np.int64)]
    r2 = float(cutoff) ** 2
    periodic = cell[pbc]
    k = len(periodic)
    if k:
        basis, _ = np.linalg.qr(periodic.T)                     # [3, k], orthonormal basis of the periodic subspace
        vol = math.sqrt(max(float(np.linalg.det(periodic @ periodic.T)), 1e-300))
    counts = np.zeros(len(targets))
    for lo in range(0, n, 4096):                              # [m, 4096, 3] at a time
        delta = pos[None, lo:lo + 4096] - targets[:, None]
        if k:
            delta = delta - (delta @ basis) @ basis.T          # the part perpendicular to the periodic directions
        room = np.clip(r2 - np.einsum("mjc,mjc->mj", delta, delta), 0.0, None)   # squared slice radius
        if k == 0:
            counts += (room > 0).sum(1)
        elif k == 1:
            counts += (2.0 * np.sqrt(room)).sum(1) / vol
        elif k == 2:
            counts += (math.pi * room).sum(1) / vol
        else:
            counts += (4.0 / 3.0 * math.pi * room ** 1.5).sum(1) / vol
    return np.clip(counts - 1.0, 0.0, None), n                # less the atom itself (its own zero offset)


@dataclass
class GraphEstimate:
    """The estimated neighbour graph of a set of structures at one cutoff.

    Attributes:
        cutoff: Å. max_neighbors: the per-atom cap (``None``: none). with_triplets: whether triplets are counted.
        structures: in the set. estimated: how many were estimated (all, or an evenly spaced sample).
        pairs: ``[estimated]`` pairs each structure's neighbour search enumerates (directed, images counted).
        edges, triplets: ``[estimated]`` kept edges and triplets per structure (triplets 0 when not counted).
        atoms: ``[estimated]`` atoms per structure.
        batch_size: structures per batch; the batch figures are those of the ``batch_size`` structures with the
            most pairs.
    """

    cutoff: float
    max_neighbors: int | None
    with_triplets: bool
    structures: int
    estimated: int
    pairs: np.ndarray
    edges: np.ndarray
    triplets: np.ndarray
    atoms: np.ndarray
    batch_size: int
    #: ``[estimated]`` index in ``structures`` of each estimated structure
    ids: np.ndarray | None = None

    def _batch(self) -> np.ndarray:
        return np.argsort(-self.pairs, kind="stable")[: max(1, min(self.batch_size, self.structures))]

    @property
    def batch_pairs(self) -> float:
        return float(self.pairs[self._batch()].sum())

    @property
    def batch_edges(self) -> float:
        return float(self.edges[self._batch()].sum())

    @property
    def batch_triplets(self) -> float:
        return float(self.triplets[self._batch()].sum())

    @property
    def batch_bytes(self) -> float:
        """Peak bytes of building one batch's graph: the largest search plus the batch's kept graph."""
        b = self._batch()
        return float(SEARCH_BYTES_PER_PAIR * self.pairs[b].max() + EDGE_BYTES * self.edges[b].sum()
                     + TRIPLET_BYTES * self.triplets[b].sum())

    @property
    def batch_seconds(self) -> float:
        """Seconds to build one batch's graph (its structures' searches)."""
        return SEARCH_SECONDS_PER_PAIR * self.batch_pairs

    @property
    def neighbors_per_atom(self) -> float:
        """Mean enumerated neighbours per atom."""
        return float(self.pairs.sum() / max(self.atoms.sum(), 1))


def _geometry(data) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pos = data.pos.detach().cpu().double().numpy().reshape(-1, 3)
    cell = getattr(data, "cell", None)
    pbc = getattr(data, "pbc", None)
    cell_np = np.zeros((3, 3)) if cell is None else cell.detach().cpu().double().numpy().reshape(3, 3)
    pbc_np = np.zeros(3, dtype=bool) if pbc is None else pbc.detach().cpu().numpy().reshape(3).astype(bool)
    return pos, cell_np, pbc_np


def estimate_graph(structures: Sequence, cutoff: float, max_neighbors: int | None = None, *,
                   with_triplets: bool = False, batch_size: int = 1,
                   sample: int = SAMPLE_STRUCTURES) -> GraphEstimate:
    """Estimate, without building it, the neighbour graph of ``structures`` (PyG ``Data`` with ``pos``, optional
    ``cell`` and ``pbc``, as :func:`~gnnpipe.data.atoms.from_atoms` makes; see the module docstring).

    Args:
        structures: a sequence (only ``sample`` of them, evenly spaced, are read when there are more).
        cutoff: Å. max_neighbors: the per-atom cap of the graph (``None``: none).
        with_triplets: count the triplets (for models that read them, or graph parallelism).
        batch_size: structures per built graph (a step's batch).
    """
    total = len(structures)
    ids = range(total) if total <= sample else np.linspace(0, total - 1, sample).round().astype(np.int64).tolist()
    pairs, edges, trip, atoms = [], [], [], []
    for s in ids:
        c, n = neighbor_counts(*_geometry(structures[int(s)]), cutoff)
        scale = n / max(len(c), 1)
        d = c if max_neighbors is None else np.minimum(c, max_neighbors)
        pairs.append(float(c.sum()) * scale)
        edges.append(float(d.sum()) * scale)
        trip.append(float(np.clip(d * (d - 1.0), 0.0, None).sum()) * scale if with_triplets else 0.0)
        atoms.append(n)
    return GraphEstimate(float(cutoff), max_neighbors, with_triplets, total, len(pairs), np.asarray(pairs, float),
                         np.asarray(edges, float), np.asarray(trip, float), np.asarray(atoms, float), int(batch_size),
                         np.asarray(list(ids), dtype=np.int64))


def _num(x: float) -> str:
    return f"{x:,.0f}" if x < 1e6 else f"{x:.2g}"


def _bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _time(s: float) -> str:
    return f"{s:.2g} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.0f} h"


def _fitting_cutoff(structures: Sequence, est: GraphEstimate, avail: int | None, iterations: int = 12) -> float:
    """The largest cutoff (to ~0.1 %) whose batch graph stays within both refusal limits: bisection on the estimate
    of the structures of the batch ``est`` refused (pairs grow as the cube of the cutoff in a bulk cell, as its
    square in a slab, and stop growing in a molecule, so no one power law holds)."""
    batch = [structures[int(est.ids[i])] for i in est._batch()] if est.ids is not None else list(structures)

    def fits(r: float) -> bool:
        e = estimate_graph(batch, r, est.max_neighbors, with_triplets=est.with_triplets, batch_size=len(batch))
        return ((avail is None or e.batch_bytes <= MEMORY_FRACTION * avail)
                and e.batch_seconds <= MAX_BUILD_SECONDS)

    lo, hi = 0.0, est.cutoff
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    if lo > 0:  # rounded down to the 3 digits the message prints: the cutoff said fits
        q = 10.0 ** (math.floor(math.log10(lo)) - 2)
        lo = math.floor(lo / q) * q
    return lo


def check_graph_size(structures: Sequence, cutoff: float, max_neighbors: int | None = None, *,
                     with_triplets: bool = False, batch_size: int = 1, what: str = "--cutoff",
                     when: str = "at every step",
                     fix: str = "lower --cutoff to about {cutoff} Å or less",
                     available: int | None = None, source: str = "structure") -> GraphEstimate:
    """Refuse a cutoff whose graph cannot be built here, warn about one that is large (:func:`estimate_graph`).

    Refused when building one batch's graph would need more than :data:`MEMORY_FRACTION` of the memory available
    here (``available`` bytes: the runs, predictions and plans pass ``MemAvailable`` under the cgroup limit,
    ``gnnpipe.costmodel.hardware.available_memory_bytes``; ``None``: the memory is not judged) or take longer than
    :data:`MAX_BUILD_SECONDS`; warned about (:class:`~gnnpipe.data.DataWarning`) above
    :data:`WARN_MEMORY_FRACTION` or :data:`WARN_BUILD_SECONDS`. Messages name the cutoff, the estimated pairs,
    edges (and triplets), the memory and time, and ``fix`` (with the cutoff that would fit).

    Args:
        what: how the message names the cutoff (``"--cutoff"``, ``"the model's cutoff"``). when: how often the
            graph is built (``"at every step"``). fix: the way out;
            ``{cutoff}`` in it becomes the cutoff that would fit (the pairs grow as its cube). source: how
            messages name the structures (``"FILE: structure"``).

    Returns:
        The estimate.

    Raises:
        DataValidationError: a periodic structure with a singular cell (checked first: the estimate divides by the
            cell's volume; :func:`gnnpipe.data.atoms.validate.check_cells`).
        ConfigError: the graph would not fit or would take too long to build.
    """
    check_cells(structures, source=source)
    est = estimate_graph(structures, cutoff, max_neighbors, with_triplets=with_triplets, batch_size=batch_size)
    if not est.estimated:
        return est
    avail = available
    mem, secs = est.batch_bytes, est.batch_seconds
    over_mem = avail is not None and mem > MEMORY_FRACTION * avail
    over_time = secs > MAX_BUILD_SECONDS
    warn = (avail is not None and mem > WARN_MEMORY_FRACTION * avail) or secs > WARN_BUILD_SECONDS
    if not (over_mem or over_time or warn):
        return est
    nb = len(est._batch())
    kept = (f"of which the graph keeps ~{_num(est.batch_edges)} edges"
            + (f" (at most {est.max_neighbors} per atom)" if est.max_neighbors is not None else "")
            + (f" and ~{_num(est.batch_triplets)} triplets" if est.with_triplets else ""))
    text = (f"{what} {est.cutoff:g} Å: the neighbour search of a batch of {nb} structure{'s' if nb != 1 else ''} "
            f"enumerates ~{_num(est.batch_pairs)} atom pairs (~{_num(est.neighbors_per_atom)} neighbours per atom, "
            f"periodic images counted), {kept}: ~{_bytes(mem)} and ~{_time(secs)} to build it, {when}")
    if over_mem or over_time:
        limits = []
        if over_mem:
            limits.append(f"{MEMORY_FRACTION:.0%} of the {_bytes(avail)} available")
        if over_time:
            limits.append(f"{MAX_BUILD_SECONDS:g} s")
        fits = _fitting_cutoff(structures, est, avail)
        raise ConfigError(f"{text}, beyond the limit ({' and '.join(limits)}); {fix.format(cutoff=f'{fits:.3g}')}")
    warnings.warn(text, DataWarning, stacklevel=2)
    return est
