"""The neighbour graph of a batch of structures: edges within a cutoff (periodic images included) and triplets.

An edge ``j → i`` (PyG's flow: row 0 = source ``j``, row 1 = target ``i``) joins atom ``i`` to an image of atom
``j`` closer than the cutoff; its ``cell_offsets`` row says which image (integer multiples of the cell vectors of
the structure). The edge vector is recomputed from ``pos`` (and ``cell``) in torch by
:meth:`AtomGraph.edge_vectors`, so gradients of anything computed from it reach the positions (conservative forces)
and the cell (stress).

Triplets ``k → j → i`` pair each edge ``j → i`` with every in-edge ``k → j`` of its source, except the back-track
(``k`` is ``i`` itself in the same image: the two offsets sum to zero). The contract is PyG DimeNet's
(``idx_kj``, ``idx_ji``; Gasteiger et al., *Directional Message Passing for Molecular Graphs*, ICLR 2020), built in
plain torch (no torch-sparse, torch-cluster or pyg-lib) and extended with periodic image offsets.

::

    pairs:      per structure, in float64: distances to every periodic image in range (torch, small structures)
                or ase.neighborlist.primitive_neighbor_list (cell lists, large structures); method="device": the
                torch search in blocks of targets where the positions are (a GPU for a GPU batch)
    order:      by target i, then distance, then source j, then offset (deterministic)
    cap:        the first max_neighbors in-edges of every target (the nearest; OC20's max_neighbors), or with
                keep_ties also those tied with the last one kept
    triplets:   in-edges of each atom as a CSR range; idx_ji = repeat_interleave(edges, in-degree of source)
    reverse:    (with_reverse) id_swap[e] = the edge i → j of the same pair in the opposite image (offset −o), or
                −1 when the neighbour cap dropped it (GemNet's swap of each edge's message onto its reverse)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from ase.geometry import complete_cell
from torch import Tensor

__all__ = ["AtomGraph", "EdgeGeometry", "batch_neighbor_pairs", "build_graph", "concat_graphs", "device_neighbor_pairs",
           "neighbor_pairs", "reverse_edges", "split_graph", "triplets"]


class EdgeGeometry:
    """Edge vectors and lengths of a graph with ``edge_index`` (``j → i``), integer ``cell_offsets`` and ``batch``:
    shared by :class:`AtomGraph` and a rank's view of it under graph parallelism
    (:class:`~gnnpipe.tasks.s2ef.graph_parallel.LocalGraph`)."""

    @property
    def num_edges(self) -> int:
        """``E``: the number of edges."""
        return int(self.edge_index.size(1))

    def edge_vectors(self, pos: Tensor, cell: Tensor | None = None) -> Tensor:
        """``[E, 3]``: ``pos[j] + cell_offsets[e] @ cell[batch[j]] − pos[i]``, from target ``i`` to the image of ``j``.

        Args:
            pos: ``[N, 3]`` Å, floating point; gradients flow back to it.
            cell: ``[B, 3, 3]`` Å (rows are the cell vectors), or ``None`` when no structure is periodic (every
                offset must then be zero); gradients flow back to it.

        Returns:
            ``[E, 3]`` in ``pos``'s dtype.

        Raises:
            ValueError: ``cell`` is ``None`` but some edge crosses a periodic boundary.
        """
        j, i = self.edge_index[0], self.edge_index[1]
        vec = pos[j] - pos[i]
        if cell is None:
            if self.num_edges and bool(self.cell_offsets.any()):
                raise ValueError("edges cross periodic boundaries: pass the batch's cell [B, 3, 3] to edge_vectors")
            return vec
        shift = torch.einsum("ek,ekl->el", self.cell_offsets.to(pos.dtype), cell.to(pos.dtype)[self.batch[j]])
        return vec + shift

    def distances(self, pos: Tensor, cell: Tensor | None = None) -> Tensor:
        """``[E]`` Å: the norms of :meth:`edge_vectors`."""
        return self.edge_vectors(pos, cell).norm(dim=-1)


@dataclass
class AtomGraph(EdgeGeometry):
    """The neighbour graph of a batch of ``B`` structures with ``N`` atoms, ``E`` edges and ``T`` triplets.

    Attributes:
        edge_index: int64 ``[2, E]``; row 0 = source ``j``, row 1 = target ``i``; sorted by target, then distance,
            then source, then offset.
        cell_offsets: int64 ``[E, 3]``; the image of ``j`` in units of its structure's cell vectors.
        batch: int64 ``[N]``; the structure of each atom.
        num_nodes: ``N``.
        idx_kj: int64 ``[T]`` or ``None`` (built without triplets); the edge ``k → j`` of each triplet.
        idx_ji: int64 ``[T]`` or ``None``; the edge ``j → i`` of each triplet (non-decreasing).
        cutoff: Å, the radius the edges were built with.
        max_neighbors: the per-target cap, or ``None``.
        num_structures: ``B``.
        id_swap: int64 ``[E]`` or ``None`` (built without ``with_reverse``): the reverse edge of each edge
            (:func:`reverse_edges`; −1 where it is not in the graph).
    """

    edge_index: Tensor
    cell_offsets: Tensor
    batch: Tensor
    num_nodes: int
    idx_kj: Tensor | None = None
    idx_ji: Tensor | None = None
    cutoff: float = 0.0
    max_neighbors: int | None = None
    num_structures: int = 1
    id_swap: Tensor | None = None

    @property
    def num_triplets(self) -> int:
        return int(self._triplets()[0].numel())

    @property
    def triplets_per_edge(self) -> Tensor:
        """int64 ``[E]``: how many triplets each edge ``j → i`` updates (the GP edge-cost weight ``t_e``)."""
        return torch.bincount(self._triplets()[1], minlength=self.num_edges)

    def _triplets(self) -> tuple[Tensor, Tensor]:
        if self.idx_kj is None or self.idx_ji is None:
            raise ValueError("this AtomGraph was built without triplets; call build_graph(..., with_triplets=True)")
        return self.idx_kj, self.idx_ji

    def to(self, device: torch.device | str, non_blocking: bool = False) -> AtomGraph:
        """A copy with every tensor on ``device`` (``non_blocking``: an asynchronous copy from pinned memory)."""
        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return self._map(move)

    def pin_memory(self) -> AtomGraph:
        """A copy with every tensor in pinned (page-locked) host memory, for an asynchronous copy to a GPU."""
        return self._map(lambda t: None if t is None or t.is_pinned() else t.pin_memory())

    def _map(self, fn) -> AtomGraph:
        def keep(t, new):
            return t if new is None else new

        ts = [self.edge_index, self.cell_offsets, self.batch, self.idx_kj, self.idx_ji, self.id_swap]
        e, o, b, kj, ji, rev = (keep(t, fn(t)) for t in ts)
        return AtomGraph(e, o, b, self.num_nodes, kj, ji, self.cutoff, self.max_neighbors, self.num_structures, rev)


# --------------------------------------------------------------------------------------------- pairs


#: the torch path's budget: atom pairs times periodic images it may hold at once (float64 distances)
TORCH_PAIR_BUDGET = 4_000_000


def _image_range(pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> np.ndarray:
    """Per direction, the largest image index ``|n|`` a pair within ``cutoff`` can need (0 where not periodic).

    With fractional coordinates spread over ``s_c`` along direction ``c`` and planes ``d_c = 1 / |b_c|`` apart
    (``b`` the reciprocal vectors), a pair closer than the cutoff has ``|n_c| ≤ ceil(cutoff / d_c + s_c)``;
    positions need not be wrapped into the cell.
    """
    full = complete_cell(cell)
    recip = np.linalg.inv(full).T
    frac = pos @ np.linalg.inv(full)
    spread = frac.max(axis=0) - frac.min(axis=0) if len(pos) else np.zeros(3)
    n = np.ceil(cutoff * np.linalg.norm(recip, axis=1) + spread).astype(np.int64)
    return np.where(pbc, n, 0)


def neighbor_pairs(pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float,
                   method: str = "auto") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of one structure closer than ``cutoff`` (strictly), periodic images included, self excluded.

    Args:
        pos: float ``[n, 3]`` Å.
        cell: float ``[3, 3]`` Å (rows = cell vectors; a non-periodic direction's row may be zero).
        pbc: bool ``[3]``.
        cutoff: Å, > 0.
        method: ``"ase"`` (``ase.neighborlist.primitive_neighbor_list``, cell lists: linear in ``n``),
            ``"torch"`` (distances from every atom to every image of every atom, in float64: O(n² · images),
            fast for small structures), ``"auto"``: torch while ``n² · images`` ≤ :data:`TORCH_PAIR_BUDGET`,
            else ase.

    Returns:
        ``(i, j, offsets, dist)``: targets int64 ``[P]``, sources int64 ``[P]``, offsets int64 ``[P, 3]`` and
        distances float64 ``[P]``, where ``dist = |pos[j] + offsets @ cell − pos[i]|``; unordered.

    Raises:
        ValueError: an unknown method.
    """
    pos = np.asarray(pos, dtype=np.float64).reshape(-1, 3)
    cell = np.asarray(cell, dtype=np.float64).reshape(3, 3)
    pbc = np.asarray(pbc, dtype=bool).reshape(3)
    n = len(pos)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros((0, 3), dtype=np.int64), np.zeros(0)
    if method not in ("auto", "ase", "torch"):
        raise ValueError(f"unknown neighbour method {method!r}; use 'auto', 'ase' or 'torch'")
    reach = _image_range(pos, cell, pbc, cutoff) if pbc.any() else np.zeros(3, dtype=np.int64)
    images = int(np.prod(2 * reach + 1))
    if method == "ase" or (method == "auto" and n * n * images > TORCH_PAIR_BUDGET):
        from ase.neighborlist import primitive_neighbor_list

        i, j, shifts, dist = primitive_neighbor_list("ijSd", pbc, cell, pos, float(cutoff), self_interaction=False)
        return i.astype(np.int64), j.astype(np.int64), shifts.astype(np.int64), dist.astype(np.float64)
    axes = [torch.arange(-r, r + 1, dtype=torch.float64) for r in reach.tolist()]
    shifts = torch.cartesian_prod(*axes).reshape(-1, 3)                    # [S, 3], the zero shift in the middle
    p = torch.from_numpy(pos)
    images_pos = (p.unsqueeze(0) + (shifts @ torch.from_numpy(cell)).unsqueeze(1)).reshape(-1, 3)  # [S·n, 3]
    d = (images_pos.unsqueeze(0) - p.unsqueeze(1)).square().sum(-1).sqrt()   # [n, S·n]
    zero = images // 2
    d[:, zero * n:(zero + 1) * n].fill_diagonal_(float("inf"))
    i, col = torch.nonzero(d < cutoff, as_tuple=True)
    return (i.numpy(), (col % n).numpy(), shifts[col // n].to(torch.long).numpy(), d[i, col].numpy())


def batch_neighbor_pairs(pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray, counts: np.ndarray, cutoff: float,
                         budget: int = TORCH_PAIR_BUDGET) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every pair closer than ``cutoff`` of all structures of a batch at once (padded torch, float64): what
    :func:`neighbor_pairs` (``method="torch"``) finds per structure, without a Python loop over structures — the
    graph of a batch relaxation is rebuilt every step.

    Args:
        pos: float ``[N, 3]`` Å, the structures' atoms in order. cell: ``[B, 3, 3]`` Å. pbc: bool ``[B, 3]``.
        counts: int ``[B]``, atoms per structure. cutoff: Å.
        budget: the most padded ``B · n_max² · images`` distances; above it ``None`` is returned (use the loop).

    Returns:
        ``(i, j, offsets)`` with global atom indices (targets, sources) and int64 image offsets ``[P, 3]``,
        unordered; or ``None`` when over the budget.
    """
    B = len(counts)
    n_max = int(counts.max()) if B else 0
    if B == 0 or n_max == 0:
        return None
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    full = np.stack([complete_cell(c) for c in cell]) if np.any(np.abs(np.linalg.det(cell)) < 1e-12) else cell
    inv = np.linalg.inv(full)
    reach = np.zeros((B, 3), dtype=np.int64)
    slot = np.arange(n_max)
    valid = slot[None, :] < counts[:, None]                                  # [B, n]
    idx = np.where(valid, starts[:, None] + slot[None, :], 0)
    pad = np.where(valid[..., None], pos[idx], 0.0)                         # [B, n, 3]
    if pbc.any():
        frac = np.einsum("bnk,bkl->bnl", pad, inv)
        big = np.where(valid[..., None], frac, -np.inf).max(1)
        small = np.where(valid[..., None], frac, np.inf).min(1)
        recip = np.linalg.norm(np.transpose(inv, (0, 2, 1)), axis=2)        # |b_c| per structure
        reach = np.where(pbc, np.ceil(cutoff * recip + (big - small)).astype(np.int64), 0)
    r = reach.max(0)
    axes = [torch.arange(-int(x), int(x) + 1, dtype=torch.float64) for x in r.tolist()]
    shifts = torch.cartesian_prod(*axes).reshape(-1, 3)                     # [S, 3]
    S = shifts.size(0)
    if B * n_max * n_max * S > budget:
        return None
    ok_shift = (shifts.abs().unsqueeze(0) <= torch.from_numpy(reach).to(torch.float64).unsqueeze(1)).all(-1)  # [B, S]
    p = torch.from_numpy(pad)
    images = p.unsqueeze(1) + torch.einsum("sk,bkl->bsl", shifts, torch.from_numpy(full)).unsqueeze(2)  # [B,S,n,3]
    d = (images.unsqueeze(1) - p.unsqueeze(2).unsqueeze(3)).square().sum(-1).sqrt()    # [B, n_i, S, n_j]
    v = torch.from_numpy(valid)
    keep = (d < cutoff) & v[:, :, None, None] & v[:, None, None, :] & ok_shift[:, None, :, None]
    zero = S // 2
    keep[:, :, zero, :] &= ~torch.eye(n_max, dtype=torch.bool).unsqueeze(0)
    b, i, s, j = torch.nonzero(keep, as_tuple=True)
    st = torch.from_numpy(starts)
    return ((st[b] + i).numpy(), (st[b] + j).numpy(), shifts[s].to(torch.long).numpy())


#: the device path's budget: distances (float64) of one block of targets to every image atom of their structure
DEVICE_PAIR_BUDGET = 1 << 22


def device_neighbor_pairs(pos: Tensor, cell: Tensor, pbc: Tensor, counts: list[int], cutoff: float,
                          budget: int = DEVICE_PAIR_BUDGET) -> tuple[Tensor, Tensor, Tensor]:
    """Every pair closer than ``cutoff`` (strictly) of each structure of a batch, periodic images included, self
    excluded, found where ``pos`` lives (a GPU for a GPU batch): the distances from blocks of targets to every
    image of every atom of their structure in float64 — :func:`neighbor_pairs`' ``"torch"`` search, in blocks of at
    most ``budget`` distances, so a structure of any size fits.

    Args:
        pos: ``[N, 3]`` Å, the structures' atoms in order (any device). cell: ``[B, 3, 3]`` Å. pbc: bool ``[B, 3]``.
        counts: atoms per structure (``B`` ints). cutoff: Å. budget: the most distances one block holds.

    Returns:
        ``(i, j, offsets)`` on ``pos``'s device: global targets and sources int64 ``[P]``, image offsets int64
        ``[P, 3]``; grouped by structure, in order (unordered inside a structure).
    """
    dev = pos.device
    p64 = pos.detach().to(torch.float64)
    c64 = cell.detach().to(torch.float64).reshape(-1, 3, 3)
    # the image range from a CPU copy (3 numbers per structure: :func:`_image_range`, as the CPU build)
    pos_np, cell_np, pbc_np = p64.cpu().numpy(), c64.cpu().numpy(), pbc.detach().cpu().numpy().reshape(-1, 3)
    out_i, out_j, out_o = [], [], []
    lo = 0
    for b, n in enumerate(int(c) for c in counts):
        hi = lo + n
        if n == 0:
            continue
        pb = np.asarray(pbc_np[b], dtype=bool)
        reach = _image_range(pos_np[lo:hi], cell_np[b], pb, cutoff) if pb.any() else np.zeros(3, dtype=np.int64)
        axes = [torch.arange(-r, r + 1, dtype=torch.float64, device=dev) for r in reach.tolist()]
        shifts = torch.cartesian_prod(*axes).reshape(-1, 3)                  # [S, 3], the zero shift in the middle
        p = p64[lo:hi]
        images = (p.unsqueeze(0) + (shifts @ c64[b]).unsqueeze(1)).reshape(-1, 3)   # [S·n, 3]
        zero = shifts.size(0) // 2
        rows = max(1, int(budget) // max(images.size(0), 1))
        for a in range(0, n, rows):
            blk = p[a:a + rows]
            d = (images.unsqueeze(0) - blk.unsqueeze(1)).square().sum(-1).sqrt()   # [r, S·n]
            k = torch.arange(blk.size(0), device=dev)
            d[k, zero * n + a + k] = float("inf")                          # an atom is not its own neighbour
            i, col = torch.nonzero(d < cutoff, as_tuple=True)
            out_i.append(i + (lo + a))
            out_j.append(col % n + lo)
            out_o.append(shifts[col // n].to(torch.long))
        lo = hi
    if not out_i:
        empty = torch.zeros(0, dtype=torch.long, device=dev)
        return empty, empty, torch.zeros(0, 3, dtype=torch.long, device=dev)
    return torch.cat(out_i), torch.cat(out_j), torch.cat(out_o)


#: Å: with ``keep_ties``, in-edges this close to the cap's last distance count as tied with it
TIE_TOLERANCE = 1e-2


def _sorted_capped(i, j, offsets, dist, max_neighbors, keep_ties=False):
    """The pairs in the graph's order (target, distance, source, offset), each target's first ``max_neighbors``
    (with ``keep_ties``, also those within :data:`TIE_TOLERANCE` of the last one kept)."""
    order = np.lexsort((offsets[:, 2], offsets[:, 1], offsets[:, 0], j, dist, i))
    i, j, offsets, dist = i[order], j[order], offsets[order], dist[order]
    if max_neighbors is not None and len(i):
        start = np.searchsorted(i, i, side="left")
        rank = np.arange(len(i)) - start
        keep = rank < max_neighbors
        if keep_ties:
            count = np.searchsorted(i, i, side="right") - start
            last = dist[start + np.minimum(count, max_neighbors) - 1]    # the cap's last distance, per target
            keep |= dist <= last + TIE_TOLERANCE
        i, j, offsets = i[keep], j[keep], offsets[keep]
    return i, j, offsets


def _sorted_capped_torch(i: Tensor, j: Tensor, offsets: Tensor, dist: Tensor, max_neighbors, keep_ties=False):
    """:func:`_sorted_capped` in torch, on the pairs' device: the same order (stable sorts from the last key to the
    first are ``numpy.lexsort``'s order; pairs never tie on every key) and the same cap."""
    perm = torch.arange(i.numel(), device=i.device)
    for key in (offsets[:, 2], offsets[:, 1], offsets[:, 0], j, dist, i):
        perm = perm[torch.sort(key[perm], stable=True).indices]
    i, j, offsets, dist = i[perm], j[perm], offsets[perm], dist[perm]
    if max_neighbors is not None and i.numel():
        start = torch.searchsorted(i, i, right=False)
        rank = torch.arange(i.numel(), device=i.device) - start
        keep = rank < max_neighbors
        if keep_ties:
            count = torch.searchsorted(i, i, right=True) - start
            last = dist[start + torch.clamp(count, max=max_neighbors) - 1]  # the cap's last distance, per target
            keep |= dist <= last + TIE_TOLERANCE
        i, j, offsets = i[keep], j[keep], offsets[keep]
    return i, j, offsets


def _device_edges(pos: Tensor, cell: Tensor, pbc: Tensor, counts: np.ndarray, cutoff: float, max_neighbors,
                  keep_ties: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(sources, targets, offsets)`` of ``build_graph(method="device")``: the pairs found on ``pos``'s device
    (:func:`device_neighbor_pairs`), their ordering distances by the CPU build's own float64 formula (``numpy``, per
    structure: equal distances stay equal, so ties break as there), then ordered and capped on the device."""
    dev = pos.device
    i, j, o = device_neighbor_pairs(pos, cell, pbc, counts.tolist(), cutoff)
    pos_np = pos.detach().to("cpu", torch.float64).numpy()
    cell_np = cell.detach().to("cpu", torch.float64).numpy().reshape(-1, 3, 3)
    i_np, j_np, o_np = i.cpu().numpy(), j.cpu().numpy(), o.cpu().numpy()
    d = np.empty(len(i_np))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    of = np.searchsorted(np.cumsum(counts), i_np, side="right")       # the structure of each pair (grouped)
    bounds = np.searchsorted(of, np.arange(len(counts) + 1))
    for b in range(len(counts)):
        s0, s1 = int(bounds[b]), int(bounds[b + 1])
        if s0 == s1:
            continue
        lo, hi = int(starts[b]), int(starts[b] + counts[b])
        il, jl = i_np[s0:s1] - lo, j_np[s0:s1] - lo
        d[s0:s1] = np.linalg.norm(pos_np[lo:hi][jl] - pos_np[lo:hi][il] + o_np[s0:s1] @ cell_np[b], axis=1)
    i, j, o = _sorted_capped_torch(i, j, o, torch.from_numpy(d).to(dev), max_neighbors, keep_ties)
    return j, i, o


def _structures(data) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """``pos [N, 3]``, ``cell [B, 3, 3]``, ``pbc [B, 3]``, ``batch [N]`` and ``B`` of a Data or a Batch."""
    pos = data.pos
    n = pos.size(0)
    batch = getattr(data, "batch", None)
    cell = getattr(data, "cell", None)
    pbc = getattr(data, "pbc", None)
    ptr = getattr(data, "ptr", None)
    if batch is None:
        batch = torch.zeros(n, dtype=torch.long, device=pos.device)
    elif n and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("batch must be non-decreasing (each structure's atoms contiguous, as "
                         "Batch.from_data_list makes them)")
    if ptr is not None:
        num = ptr.numel() - 1
    elif cell is not None:
        num = cell.reshape(-1, 3, 3).size(0)
    else:
        num = int(batch.max()) + 1 if n else 1
    if cell is None:
        cell = torch.zeros(num, 3, 3, dtype=pos.dtype, device=pos.device)
    if pbc is None:
        pbc = torch.zeros(num, 3, dtype=torch.bool, device=pos.device)
    cell = cell.reshape(-1, 3, 3)
    pbc = pbc.reshape(-1, 3).bool()
    if cell.size(0) != num or pbc.size(0) != num:
        raise ValueError(f"the batch holds {num} structures but cell has {cell.size(0)} rows of [3, 3] and pbc "
                         f"{pbc.size(0)} rows of [3]; give each structure cell [1, 3, 3] and pbc [1, 3]")
    return pos, cell, pbc, batch, int(num)


def build_graph(data, cutoff: float, max_neighbors: int | None = None, *, with_triplets: bool = True,
                method: str = "auto", keep_ties: bool = False, with_reverse: bool = False) -> AtomGraph:
    """The neighbour graph (and triplets) of a structure or a batch of structures.

    Args:
        data: a ``torch_geometric.data.Data`` (one structure) or ``Batch`` with ``pos [N, 3]`` Å and optionally
            ``cell [B, 3, 3]`` Å, ``pbc [B, 3]`` bool and ``batch [N]`` (absent: one non-periodic structure).
        cutoff: Å; pairs strictly closer are edges.
        max_neighbors: keep the nearest ``max_neighbors`` in-edges of each target (ties: lower source index, then
            lower offset); ``None`` keeps all (fairchem's SchNet and DimeNet++ default to 50).
        keep_ties: also keep the in-edges tied (within :data:`TIE_TOLERANCE`) with the last one the cap keeps, so
            that symmetric neighbours are kept or dropped together (fairchem's non-strict ``max_neighbors``); a
            target may then have more than ``max_neighbors`` in-edges.
        with_triplets: also build ``idx_kj``, ``idx_ji`` (see :func:`triplets`).
        with_reverse: also build ``id_swap``, each edge's reverse (see :func:`reverse_edges`).
        method: how :func:`neighbor_pairs` finds the pairs of each structure (``"auto"``, ``"ase"``, ``"torch"``),
            or ``"batch"``: all structures at once (:func:`batch_neighbor_pairs`; the ``"auto"`` loop when over its
            budget), or ``"device"``: where ``pos`` lives, a GPU for a GPU batch (:func:`device_neighbor_pairs`;
            the pairs ordered and capped there, their ordering distances by the CPU build's formula); the result is
            the same (up to pairs within float rounding of the cutoff). The others build on the CPU and move the
            graph to ``pos``'s device.

    Returns:
        An :class:`AtomGraph` on ``pos``'s device; atom indices are global (offset per structure).

    Raises:
        ValueError: a cutoff ≤ 0, max_neighbors < 1, an unknown method, an unsorted ``batch``, or cell / pbc
            rows not matching the number of structures.
    """
    if not cutoff > 0:
        raise ValueError(f"cutoff must be > 0 Å, got {cutoff}")
    if max_neighbors is not None and max_neighbors < 1:
        raise ValueError(f"max_neighbors must be >= 1 or None, got {max_neighbors}")
    if method not in ("auto", "ase", "torch", "batch", "device"):
        raise ValueError(f"unknown neighbour method {method!r}; use 'auto', 'ase', 'torch', 'batch' or 'device'")
    pos, cell, pbc, batch, num = _structures(data)
    device = pos.device
    if method == "device":
        counts = torch.bincount(batch, minlength=num).cpu().numpy()
        src, dst, off = _device_edges(pos, cell, pbc, counts, cutoff, max_neighbors, keep_ties)
        return _finish(torch.stack([src, dst]), off, batch, pos, cutoff, max_neighbors, num, with_triplets,
                       with_reverse)
    pos_np = pos.detach().to("cpu", torch.float64).numpy()
    cell_np = cell.detach().to("cpu", torch.float64).numpy()
    pbc_np = pbc.detach().cpu().numpy()
    counts = torch.bincount(batch.cpu(), minlength=num).numpy()
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    srcs, dsts, offs = [], [], []
    found = batch_neighbor_pairs(pos_np, cell_np, pbc_np, counts, cutoff) if method == "batch" else None
    if found is not None:   # all structures at once; ordered and capped together (targets are global indices)
        i, j, o = found
        b = batch.cpu().numpy()[i]
        d = np.linalg.norm(pos_np[j] - pos_np[i] + np.einsum("pk,pkl->pl", o, cell_np[b]), axis=1)
        i, j, o = _sorted_capped(i, j, o, d, max_neighbors, keep_ties)
        srcs, dsts, offs, num_loop = [j], [i], [o], 0
    else:
        num_loop = num
    for b in range(num_loop):
        lo, hi = int(starts[b]), int(starts[b] + counts[b])
        i, j, o, _ = neighbor_pairs(pos_np[lo:hi], cell_np[b], pbc_np[b], cutoff,
                                    "auto" if method == "batch" else method)
        # one formula for the distances that order the edges, whichever method found them (equal ties stay equal)
        d = np.linalg.norm(pos_np[lo:hi][j] - pos_np[lo:hi][i] + o @ cell_np[b], axis=1)
        i, j, o = _sorted_capped(i, j, o, d, max_neighbors, keep_ties)
        srcs.append(j + lo)
        dsts.append(i + lo)
        offs.append(o)
    src = torch.from_numpy(np.concatenate(srcs) if srcs else np.zeros(0, dtype=np.int64))
    dst = torch.from_numpy(np.concatenate(dsts) if dsts else np.zeros(0, dtype=np.int64))
    off = torch.from_numpy(np.concatenate(offs) if offs else np.zeros((0, 3), dtype=np.int64))
    return _finish(torch.stack([src, dst]).to(device), off.to(device), batch, pos, cutoff, max_neighbors, num,
                   with_triplets, with_reverse)


def _finish(edge_index: Tensor, off: Tensor, batch: Tensor, pos: Tensor, cutoff: float, max_neighbors, num: int,
            with_triplets: bool, with_reverse: bool) -> AtomGraph:
    """The :class:`AtomGraph` of ordered, capped edges (on ``pos``'s device), with triplets and reverse edges as
    asked (built on that device)."""
    graph = AtomGraph(edge_index, off, batch, int(pos.size(0)), cutoff=float(cutoff), max_neighbors=max_neighbors,
                      num_structures=num)
    if with_triplets:
        graph.idx_kj, graph.idx_ji = triplets(edge_index, off, graph.num_nodes)
    if with_reverse:
        graph.id_swap = reverse_edges(edge_index, off)
    return graph


def concat_graphs(graphs: list[AtomGraph]) -> AtomGraph:
    """The graph of a batch put together from the graphs of its structures, in order (equal to
    :func:`build_graph` on the batch, so a data loader may build each structure's graph once and reuse it).

    Args:
        graphs: one :class:`AtomGraph` per structure (or per sub-batch), all with or all without triplets, the
            same cutoff and cap.

    Returns:
        An :class:`AtomGraph`: atom indices offset by the atoms before, edge indices of the triplets by the
        edges before, ``batch`` by the structures before.

    Raises:
        ValueError: no graphs, or graphs built with different cutoffs, caps or triplet settings.
    """
    if not graphs:
        raise ValueError("concat_graphs needs at least one graph")
    first = graphs[0]
    has_triplets = first.idx_kj is not None
    has_reverse = first.id_swap is not None
    for g in graphs:
        if ((g.cutoff, g.max_neighbors, g.idx_kj is not None, g.id_swap is not None)
                != (first.cutoff, first.max_neighbors, has_triplets, has_reverse)):
            raise ValueError("concat_graphs: graphs built with different cutoff, max_neighbors or triplet settings; "
                             "build every structure's graph with the same arguments")
    atoms = edges = structures = 0
    ei, off, batch, kj, ji, rev = [], [], [], [], [], []
    for g in graphs:
        ei.append(g.edge_index + atoms)
        off.append(g.cell_offsets)
        batch.append(g.batch + structures)
        if has_triplets:
            kj.append(g.idx_kj + edges)
            ji.append(g.idx_ji + edges)
        if has_reverse:
            rev.append(torch.where(g.id_swap >= 0, g.id_swap + edges, g.id_swap))
        atoms += g.num_nodes
        edges += g.num_edges
        structures += g.num_structures
    return AtomGraph(torch.cat(ei, 1), torch.cat(off), torch.cat(batch), atoms,
                     torch.cat(kj) if has_triplets else None, torch.cat(ji) if has_triplets else None,
                     first.cutoff, first.max_neighbors, structures, torch.cat(rev) if has_reverse else None)


def split_graph(graph: AtomGraph, sizes: list[int]) -> list[AtomGraph]:
    """The graphs of consecutive groups of a batch's structures: the inverse of :func:`concat_graphs` (so a
    pipeline builds one graph per step and hands each micro-batch its part).

    Args:
        graph: an :class:`AtomGraph` whose edges are sorted by target (as :func:`build_graph` returns them) and
            whose triplets, if any, are sorted by ``idx_ji``.
        sizes: structures per part, in order, each ≥ 0, summing to ``graph.num_structures``.

    Returns:
        One :class:`AtomGraph` per part, indices renumbered from 0 (atoms, edges, structures);
        ``concat_graphs`` of the non-empty parts equals ``graph``.

    Raises:
        ValueError: ``sizes`` does not sum to the structures, or the edges or triplets are not in the order above.
    """
    if any(n < 0 for n in sizes) or sum(sizes) != graph.num_structures:
        raise ValueError(f"split_graph: sizes {list(sizes)} must be >= 0 and sum to the graph's "
                         f"{graph.num_structures} structures")
    B = graph.num_structures
    dst = graph.edge_index[1]
    if dst.numel() and bool((dst[1:] < dst[:-1]).any()):
        raise ValueError("split_graph needs edges sorted by target (as build_graph returns them)")
    has_triplets = graph.idx_kj is not None
    if has_triplets and graph.idx_ji.numel() and bool((graph.idx_ji[1:] < graph.idx_ji[:-1]).any()):
        raise ValueError("split_graph needs triplets sorted by idx_ji (as build_graph returns them)")
    zero = torch.zeros(1, dtype=torch.long, device=dst.device)
    atom_ptr = torch.cat([zero, torch.bincount(graph.batch, minlength=B).cumsum(0)]).tolist()
    edge_ptr = torch.cat([zero, torch.bincount(graph.batch[dst], minlength=B).cumsum(0)]).tolist()
    if has_triplets:
        tri_ptr = torch.searchsorted(graph.idx_ji, torch.tensor(edge_ptr, device=dst.device)).tolist()
    parts, s0 = [], 0
    for n in sizes:
        s1 = s0 + n
        a0, a1, e0, e1 = atom_ptr[s0], atom_ptr[s1], edge_ptr[s0], edge_ptr[s1]
        kj = ji = rev = None
        if has_triplets:
            t0, t1 = tri_ptr[s0], tri_ptr[s1]
            kj, ji = graph.idx_kj[t0:t1] - e0, graph.idx_ji[t0:t1] - e0
        if graph.id_swap is not None:  # an edge's reverse joins the same structure's atoms
            r = graph.id_swap[e0:e1]
            rev = torch.where(r >= 0, r - e0, r)
        parts.append(AtomGraph(graph.edge_index[:, e0:e1] - a0, graph.cell_offsets[e0:e1], graph.batch[a0:a1] - s0,
                               a1 - a0, kj, ji, graph.cutoff, graph.max_neighbors, n, rev))
        s0 = s1
    return parts


# --------------------------------------------------------------------------------------------- triplets


def triplets(edge_index: Tensor, cell_offsets: Tensor | None, num_nodes: int) -> tuple[Tensor, Tensor]:
    """Triplets ``k → j → i`` of a graph whose edges are sorted by target (PyG DimeNet's ``idx_kj``, ``idx_ji``).

    For each edge ``j → i`` (index ``idx_ji``) every in-edge ``k → j`` of its source (index ``idx_kj``), except the
    back-track: ``k = i`` with ``cell_offsets[kj] + cell_offsets[ji] = 0`` (``k``'s image is ``i`` itself). With
    periodic images an edge may pair with itself (an atom bonded to its own image ``o``: ``i``, ``j`` at ``o``,
    ``k`` at ``2o``) and ``k = i`` in another image is kept.

    Args:
        edge_index: int64 ``[2, E]``, row 1 (targets) non-decreasing.
        cell_offsets: int64 ``[E, 3]`` or ``None`` (no periodic images).
        num_nodes: ``N``.

    Returns:
        ``(idx_kj, idx_ji)``, int64 ``[T]`` each, sorted by ``idx_ji`` then ``idx_kj``.

    Raises:
        ValueError: the edges are not sorted by target.
    """
    src, dst = edge_index[0], edge_index[1]
    device = edge_index.device
    num_edges = src.numel()
    if num_edges and bool((dst[1:] < dst[:-1]).any()):
        raise ValueError("triplets() needs edges sorted by target (edge_index[1] non-decreasing); build the graph "
                         "with build_graph or sort the edges with a stable argsort of edge_index[1]")
    deg = torch.bincount(dst, minlength=num_nodes)
    ptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=device)
    ptr[1:] = torch.cumsum(deg, 0)
    per_edge = deg[src]                                      # in-edges k→j of each edge's source j
    idx_ji = torch.repeat_interleave(torch.arange(num_edges, device=device), per_edge)
    first = torch.cumsum(per_edge, 0) - per_edge             # position of each edge's first triplet
    rank = torch.arange(idx_ji.numel(), device=device) - first[idx_ji]
    idx_kj = ptr[src[idx_ji]] + rank
    back = src[idx_kj] == dst[idx_ji]                        # k is i: the back-track unless in another image
    if cell_offsets is not None and cell_offsets.numel() and bool(cell_offsets.any()):
        cand = torch.nonzero(back).flatten()
        back[cand] = (cell_offsets[idx_kj[cand]] + cell_offsets[idx_ji[cand]] == 0).all(dim=1)
    keep = ~back
    return idx_kj[keep], idx_ji[keep]


def reverse_edges(edge_index: Tensor, cell_offsets: Tensor | None = None) -> Tensor:
    """The reverse of every edge: for ``j → i`` with offset ``o``, the edge ``i → j`` with offset ``−o`` (the same
    pair of atoms seen from the other end), as used by GemNet's message swap (Gasteiger et al., NeurIPS 2021).

    Args:
        edge_index: int64 ``[2, E]``. cell_offsets: int64 ``[E, 3]`` or ``None`` (no images).

    Returns:
        int64 ``[E]``: the reverse edge's id, or −1 where the graph lacks it (a neighbour cap kept ``j → i`` but
        dropped ``i → j``). With several copies of an edge the reverse is the first.
    """
    e = int(edge_index.size(1))
    device = edge_index.device
    if e == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    off = (torch.zeros(e, 3, dtype=torch.long, device=device) if cell_offsets is None
           else cell_offsets.to(torch.long))
    fwd = torch.cat([edge_index.t(), off], dim=1)                     # (j, i, o)
    bwd = torch.cat([edge_index.flip(0).t(), -off], dim=1)            # the key the reverse edge has
    keys, inv = torch.unique(torch.cat([fwd, bwd]), dim=0, return_inverse=True)
    first = torch.full((keys.size(0),), -1, dtype=torch.long, device=device)
    ids = torch.arange(e, device=device)
    first.scatter_reduce_(0, inv[:e], ids, reduce="amin", include_self=False)
    return first[inv[e:]]
