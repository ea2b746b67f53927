"""Per-rank memory model: predicted live bytes per rank by kind, for the code as it runs today.

``b`` is the element size of ``--dtype``, ``h`` of ``--history-dtype``; ``nnz`` counts the non-zeros of ``Â``
(``E`` plus, for ``gcn``, one self-loop per vertex). What a rank holds, by kind:

* ``graph``       — what the rank holds of the graph. The single process: the loaded graph (``x``, the edge
  list, labels, masks). A distributed rank reads the graph file the launcher wrote through a memory map
  (:class:`~gnnpipe.tasks.nodes.graphfile.GraphFile`), and the pages it reads are resident: the first stage of a way the
  ``x`` rows of the way (``rows·F·b``, a view, no copy), the last stage its labels and training mask (copies,
  ``9`` bytes a row) and what its evaluation reads of labels and masks (``11`` bytes a row: the whole graph for a
  pipeline, whose last stage computes the metrics, the way's rows otherwise). The edge list (``2E·8``) is
  resident only while the rank builds its rows of ``Â`` (:func:`~gnnpipe.tasks.nodes.graphfile.release_edge_pages`);
* ``adjacency``   — the single process: ``Â`` and ``Âᵀ`` per aggregation kind as CSR (``(N+1)·8 + nnz·(8+b)``
  each; one tensor for both when ``Â`` is symmetric, :meth:`GraphOps.adj <gnnpipe.tasks.nodes.graph.GraphOps.adj>`).
  A pipeline or hybrid rank: per chunk it runs the compacted rows of ``Â`` and ``Âᵀ`` with 32-bit indices
  (``(rows_c+1)·4 + nnz_c·(4+b)`` each; once when they are equal). A graph-parallel way: its rows with local
  columns and their transpose (64-bit: ``(rows+1)·8 + nnz_w·(8+b)`` and ``(rows+halo+1)·8 + nnz_w·(8+b)``),
  the global-to-local index (``N·8``) and its index lists; a hybrid member builds the same for its way at its
  first evaluation;
* ``parameters``  — the parameters the rank trains (``P_s``; the others are never allocated) with their
  gradients and Adam's two moments (``4·P_s·b``), plus the flattened all-reduce buffer (``P_s·b``) when the
  rank all-reduces;
* ``history``     — ``H_in`` and ``G_out`` per aggregation op of the stage (``2·N·d·h``), the correctors' full
  copies of every ``H_in`` (T3's snapshot, EMA's average: ``N·d·h`` each), and a message-passing unit's kept
  pushes (``Σ_c |halo(c)|·d·b``). With T2 every ``G_out`` is zeroed at an epoch's end, which under
  ``--recompute`` releases its buffer until the next backward: while such a run evaluates the rank holds ``H_in``
  only;
* ``activations`` — what the chunks in flight keep from their forward to their backward: the measured ``held``
  bytes per row (:mod:`.footprint`: saved activations, copies of received inputs, outputs, loss) times the rows
  of every chunk in flight (every chunk for gpipe, the simulated peak in flight for 1f1b — at most ``S − s`` —,
  the part for graph parallelism and the single process). With ``--recompute`` ``held`` is the copies of the
  received inputs only;
* ``boundary``    — stage-boundary buffers beside the chunk being computed: the receive posted one action ahead
  (one chunk's rows) and the sends still outstanding (:data:`gnnpipe.core.comm.MAX_PENDING_SENDS` chunks), of
  the boundary widths (``d + d_shared``);
* ``transient``   — the largest short-lived working set: a chunk's measured forward or backward peak per row
  beyond its ``held`` bytes, times the largest chunk (graph parallelism: plus its halo rows, received and
  concatenated), exact evaluation
  (the measured ``eval`` bytes per row times the rows inferred at once: ``N`` for a pipeline stage, the way's
  rows otherwise, plus a way's halo rows), or building the rows of ``Â`` (the normalised edge list and its
  working set, :func:`normalise_peak`; the single process: the measured build bytes per non-zero).

The live peak is ``max(build phase, training phase, evaluation phase)``, each the sum of the kinds alive then:

* build: ``graph`` (with the edge list) + ``adjacency`` + building's transient;
* training: ``graph`` + ``adjacency`` + ``parameters`` + ``history`` + ``activations`` + ``boundary`` + the
  chunk's forward/backward peak;
* evaluation: ``graph`` + ``adjacency`` + ``parameters`` + ``history`` (without released ``G_out``) + the
  evaluation's working set.

Measured against: the peak resident memory of a rank whose allocator returns freed blocks at once
(``MALLOC_MMAP_THRESHOLD_=131072``) minus the runtime floor (the same rank's peak in the same layout on a tiny
graph: interpreter, libraries, the code pages the kernels touch, thread pools, the process group). With glibc's
default allocator the resident peak is higher by what it keeps of freed short-lived memory; ``RETENTION``
approximates it (``resident_peak``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .footprint import RoleFootprint

KINDS = ("graph", "adjacency", "parameters", "history", "activations", "boundary", "transient")

#: glibc's malloc keeps freed memory of the short-lived working set (its mmap threshold rises after the first
#: large free, and later allocations come from a heap that fragments): resident peak ≈ steady + (live peak −
#: steady)·(1 + RETENTION). Measured 0.2–0.9 on synthetic 40k GCNII-8 (gpipe lowest) before ranks that recompute
#: (``--recompute``) returned the heap's free memory at phase boundaries (``core.runtime.metrics.return_free_memory``);
#: on the 169k graph of docs/RESULTS.md §15f since then: a pipeline rank's resident peak within 0–10 % of its live
#: peak, a GP way's 25–50 % above it (its peak is inside one training step). 0.6 is kept for the resident prediction
#: and the fits check (an upper side); the live prediction is reported beside it.
RETENTION = 0.6
#: bytes a row of the evaluation reads of labels and the three masks (``y`` int64, three bool masks)
LABEL_READ_BYTES = 11
#: bytes a row of the last stage copies of labels and the training mask (``y`` int64, one bool mask)
LABEL_COPY_BYTES = 9


@attrs.define
class MemoryBreakdown:
    """Predicted bytes of one rank by kind (module docstring); ``peak`` is the predicted peak above the
    runtime floor: ``max(build, train, eval)`` phases.

    Attributes:
        rank, way, stage: who. graph … transient: bytes per kind. build_peak, train_peak, eval_peak: the phases.
        steady: what stays allocated through training (graph, adjacency, parameters).
    """

    rank: int
    way: int
    stage: int
    graph: int = 0
    adjacency: int = 0
    parameters: int = 0
    history: int = 0
    activations: int = 0
    boundary: int = 0
    transient: int = 0
    build_peak: int = 0
    train_peak: int = 0
    eval_peak: int = 0

    steady: int = 0

    @property
    def peak(self) -> int:
        """Predicted peak of live bytes (what the runtime allocates), above the runtime floor."""
        return max(self.build_peak, self.train_peak, self.eval_peak)

    @property
    def resident_peak(self) -> int:
        """Predicted peak resident bytes above the runtime floor, with glibc's retention (``RETENTION``)."""
        return int(self.steady + (self.peak - self.steady) * (1.0 + RETENTION))

    def to_dict(self) -> dict:
        d = attrs.asdict(self)
        d["peak"] = self.peak
        d["resident_peak"] = self.resident_peak
        return d


def normalise_peak(kind: str, E: int, N: int, b: int) -> int:
    """Peak bytes of :func:`gnnpipe.tasks.nodes.graph.normalised_edges` for one kind on ``E`` edges (the coordinates and
    values of ``Â``, the kind's temporaries): ``gcn`` copies the coordinates with the self-loops added
    (``E' = E + N`` entries, ``16 + b`` bytes each) and computes ``w·d_j^{-1/2}·d_i^{-1/2}`` through three
    ``E'``-sized temporaries, beside the unit weights and the loop masks (``(2 + b)·E``); ``mean`` computes
    ``w·d_i^{-1}`` (``3·b·E``); ``sum`` holds the weights (``b·E``). Other kinds are counted as ``gcn``."""
    if kind == "mean":
        return 3 * b * E + N * b
    if kind == "sum":
        return b * E
    Ep = E + N
    return (2 + b) * E + (16 + 4 * b) * Ep + 3 * N * 8


def normalised_bytes(kind: str, E: int, N: int, b: int) -> int:
    """Bytes :func:`~gnnpipe.tasks.nodes.graph.normalised_edges` returns (kept while a rank builds its rows): ``gcn``
    new coordinates and values (``(16 + b)·(E + N)``), the others values only (coordinates are the edge list's)."""
    if kind in ("mean", "sum"):
        return b * E
    return (16 + b) * (E + N)


def compact_rows_bytes(rows: int, nnz: int, b: int, shared: bool) -> int:
    """One chunk's :class:`~gnnpipe.tasks.nodes.graph.CompactRows` of ``Â`` and ``Âᵀ`` (32-bit indices); once if
    shared."""
    one = (rows + 1) * 4 + nnz * (4 + b)
    return one if shared else 2 * one


def chunk_build_bytes(rows: int, nnz: int, N: int, E: int, b: int) -> int:
    """Working set of :func:`~gnnpipe.tasks.nodes.graph.csr_blocks` for one chunk: the selection mask over the edge list
    (``E + N`` bools), the chunk's keys, permutation and inverse (64-bit), its values, the ``N + 1`` row pointers
    and the bin counts, the block's copies."""
    return (E + N) + nnz * (7 * 8 + 3 * b) + 2 * (N + 1) * 8 + N


def local_csr_bytes(rows: int, halo: int, nnz: int, b: int) -> int:
    """A graph-parallel way's rows of ``Â`` with local columns and their transpose (64-bit CSR, :class:`HaloExchange
    <gnnpipe.tasks.nodes.aggregation.HaloExchange>`)."""
    return (rows + 1) * 8 + nnz * (8 + b) + (rows + halo + 1) * 8 + nnz * (8 + b)


def single_memory(*, N: int, F: int, E: int, b: int, bx: int, kinds_nnz: dict, symmetric: dict, params: int,
                  footprint: RoleFootprint, build_per_nnz: float) -> MemoryBreakdown:
    """The single-process trainer (:class:`~gnnpipe.tasks.nodes.trainer.SingleProcessTrainer`): the loaded graph,
    ``Â`` and ``Âᵀ`` of every kind, the model with its optimizer, one full-graph forward and backward, exact evaluation.

    Args:
        N, F, E: graph sizes. b: element size of ``--dtype``. bx: element size of the loaded ``x``.
        kinds_nnz: ``{kind: nnz}`` of the kinds the model aggregates with. symmetric: ``{kind: Â equals Âᵀ}``.
        params: ``P``. footprint: the measured ``"single"`` role. build_per_nnz: peak bytes per non-zero while one
            kind's ``Â``/``Âᵀ`` are built (measured).
    """
    m = MemoryBreakdown(rank=0, way=0, stage=0)
    m.graph = N * F * bx + 2 * E * 8 + N * 8 + 3 * N + (N * F * b if bx != b else 0)
    m.adjacency = sum((N + 1) * 8 + nnz * (8 + b) if symmetric.get(k) else 2 * ((N + 1) * 8 + nnz * (8 + b))
                      for k, nnz in kinds_nnz.items())
    m.parameters = 4 * params * b
    build = int(max((build_per_nnz * nnz for nnz in kinds_nnz.values()), default=0))
    m.activations = int(footprint.held * N)
    work = int(max(footprint.forward, footprint.backward) * N)
    ev = int(footprint.eval * N)
    m.transient = max(build, work - m.activations, ev)
    m.steady = m.graph + m.adjacency + m.parameters
    m.build_peak = m.graph + m.adjacency + max(0, build - m.adjacency // max(1, len(kinds_nnz)))
    m.train_peak = m.steady + work
    m.eval_peak = m.steady + ev
    return m


def rank_memory(*, rank: int, way: int, stage: int, N: int, F: int, E: int, b: int, bx: int, kinds: Sequence[str],
                chunks: Sequence[tuple[int, int, int]], symmetric: dict, params_trained: int, allreduce: bool,
                history: int, footprint: RoleFootprint, history_eval: int | None = None, inflight: int, first: bool,
                last: bool,
                recv_width: int, send_width: int, pending_sends: int, graph_parallel: bool = False,
                hybrid: bool = False, way_part: tuple[int, int, int] | None = None, max_dim: int = 0,
                edge_weight_bytes: int = 0) -> MemoryBreakdown:
    """The breakdown of one distributed rank (pipeline stage, hybrid member or graph-parallel way).

    Args:
        N, F, E, b: graph sizes and element size; bx: element size of ``x`` in the graph file.
        kinds: the aggregation kinds of the rank's units. chunks: ``(rows, halo, nnz)`` of every chunk the rank runs
            (``nnz`` of ``Â``'s rows, self-loops included), largest first; a graph-parallel way: its one part.
        symmetric: ``{kind: Â equals Âᵀ}`` (the rank shares their rows).
        params_trained: ``P_s``. allreduce: the rank all-reduces its gradients (GP, hybrid).
        history: bytes of its history buffers, the correctors' copies and kept pushes.
        history_eval: what of them is held while the run evaluates (default ``history``; T2 releases the zeroed
            ``G_out`` buffers at every epoch's end).
        footprint: the role's measured bytes per row (:func:`~gnnpipe.tasks.nodes.cost.footprint.role_footprint`).
        inflight: chunks forwarded and not yet back-propagated at the rank's peak (schedule).
        first, last: the rank's stage is the first / last of its way.
        recv_width, send_width: the largest boundary tensor the rank receives / sends, bytes per row (0: none).
        pending_sends: sends a rank keeps outstanding (:data:`gnnpipe.core.comm.MAX_PENDING_SENDS`).
        graph_parallel: a graph-parallel way (its part with halo, local CSR, halo exchanges per op).
        hybrid: a hybrid member (builds its way's halo and local rows at its first evaluation).
        way_part: ``(rows, halo, nnz)`` of the rank's way (GP, hybrid). max_dim: widest unit output.
        edge_weight_bytes: bytes of the edge weights in the graph file (resident while the rows are built).
    """
    m = MemoryBreakdown(rank=rank, way=way, stage=stage)
    way_rows = way_part[0] if way_part is not None else sum(c[0] for c in chunks)
    largest = max((c[0] for c in chunks), default=0)
    # graph: x pages of the way (first stage), label copies (last stage) and the label pages its evaluation reads
    x_bytes = way_rows * F * bx + (way_rows * F * b if bx != b else 0) if first else 0
    labels = way_rows * LABEL_COPY_BYTES if last else 0  # copied when the stage is built
    label_reads = (way_rows if (graph_parallel or hybrid) else N) * LABEL_READ_BYTES if last else 0
    m.graph = x_bytes + labels + label_reads
    edge_pages = 2 * E * 8 + edge_weight_bytes
    # adjacency and building it
    adj, build = 0, 0
    if graph_parallel:
        rows, halo, nnz = way_part
        for _ in kinds:
            adj += local_csr_bytes(rows, halo, nnz, b)
        adj += (N + halo) * 8 + halo * 8 if kinds else 0  # global-to-local index, halo ids, send lists
        # the send lists, then the way's rows from the normalised edge list (the larger), beside the index
        build = max((normalise_peak(k, E, N, b) for k in kinds), default=0) + (N * 8 if kinds else 0)
    else:
        built = 0
        for k in kinds:
            kept = normalised_bytes(k, E, N, b)
            per_chunk = max((chunk_build_bytes(r, z, N, E, b) for r, _, z in chunks), default=0)
            rows_k = sum(compact_rows_bytes(r, z, b, symmetric.get(k, False)) for r, _, z in chunks)
            build = max(build, built + normalise_peak(k, E, N, b), built + kept + rows_k + per_chunk)
            built += rows_k
        adj = built
    m.adjacency = adj
    m.parameters = 4 * params_trained * b + (params_trained * b if allreduce else 0)
    m.history = int(history)
    m.steady = m.graph + m.adjacency + m.parameters
    m.build_peak = labels + (edge_pages + build if kinds else 0)  # x is read in training, not while building
    # training: the chunks in flight but the one computed keep their held bytes; that one is at its peak
    sizes = sorted((c[0] for c in chunks), reverse=True)
    k = max(1, min(int(inflight), len(sizes)))
    m.activations = int(footprint.held * sum(sizes[:k]))  # the computed chunk's held bytes included
    work = int(max(footprint.forward, footprint.backward) * largest - footprint.held * largest)  # beyond held
    if graph_parallel and way_part is not None:
        work += way_part[1] * max_dim * b  # an op's halo rows beside its own (received and concatenated, or back)
    m.boundary = int(largest * (recv_width + pending_sends * send_width)) if not graph_parallel else 0
    m.train_peak = m.steady + m.history + m.activations + m.boundary + work
    # evaluation: a pipeline stage infers every row at once; a way its rows and their halo
    eval_rows = way_rows if (graph_parallel or hybrid) else N
    ev = int(footprint.eval * eval_rows)
    if (graph_parallel or hybrid) and way_part is not None:
        ev += 2 * way_part[1] * max_dim * b
    eval_work = ev
    if hybrid and way_part is not None and kinds:
        # the first evaluation builds the way's halo and local rows (reading the edge list again), then keeps them
        rows, halo, nnz = way_part
        lasting = len(kinds) * local_csr_bytes(rows, halo, nnz, b) + (N + 2 * halo) * 8
        inputs = way_rows * recv_width
        eval_work = max(lasting + ev, inputs + edge_pages + max(normalise_peak(kd, E, N, b) for kd in kinds) + N * 8)
    m.eval_peak = m.steady + (m.history if history_eval is None else int(history_eval)) + eval_work
    m.transient = max(work, eval_work, build)
    return m


__all__ = ["KINDS", "LABEL_COPY_BYTES", "LABEL_READ_BYTES", "MemoryBreakdown", "RETENTION", "chunk_build_bytes",
           "compact_rows_bytes", "local_csr_bytes", "normalise_peak", "normalised_bytes", "rank_memory",
           "single_memory"]
