"""Per-rank memory model (issue #12 item 2): predicted bytes per rank by kind, for the code as it runs today.

What a rank holds, by kind (``b`` = element size of ``--dtype``; sizes from the plan):

* ``graph``       — what the rank holds of the graph (lean ranks, issue #12): ``x`` rows of its way on the first
  stage only (``rows·F·b``), labels and three masks of its way on the last stage only (``rows·11``), and the
  edge list it builds its rows of ``Â`` from (``2E·8``; a rank reads it from the memory-mapped graph file, and
  those pages count as resident). The single process holds the whole graph;
* ``adjacency``   — the single process: per aggregation kind ``Â`` and ``Âᵀ`` as CSR
  (``2·((N+1)·8 + nnz·(8+b))``, ``nnz = E (+N for gcn)``). A distributed rank never builds the whole matrix:
  per chunk it runs (or per way) the compacted rows of ``Â`` and ``Âᵀ`` with 32-bit indices (``nnz_c·(4+b)``,
  ``(rows_c + halo_c)·4`` referenced columns, ``(rows_c+1)·4`` row pointers);
* ``parameters``  — the parameters the rank trains (``P_s``; the others are never allocated) with their
  gradients and Adam's two moments (``4·P_s·b``), plus the flattened all-reduce buffer (``P_s·b``) when the
  rank all-reduces;
* ``history``     — ``H_in`` and ``G_out`` per aggregation op of the stage: ``2·N·d·h`` each, ``h`` the element
  size of ``--history-dtype`` (GP: none); a
  message-passing unit's halo-gradient op (``PushHistory``: ``H_in``, ``G_in``) also keeps every chunk's last
  push, ``Σ_c |halo(c)|·d·b``;
* ``activations`` — what autograd saves per row, measured per unit kind (:mod:`.profile`), times the rows in
  flight under the schedule: every chunk for gpipe, at most the simulated peak in flight for 1f1b
  (``min(S−s, C)``), only the stage inputs with ``--recompute`` plus one chunk's activations while it is
  recomputed; the whole part for GP and single process;
* ``boundary``    — stage-boundary tensors: per chunk in flight the received inputs (``rows·(d_in+d_h0)·b``)
  and kept outputs (``rows·(d_out+d_h0)·b``); plus every boundary tensor sent this epoch, which the
  communication wrapper keeps until its end-of-epoch ``wait_sends`` (``N_way·(d+d_h0)·b`` per direction);
* ``transient``   — the largest short-lived working set on top of the steady state: building ``Â``/``Âᵀ``
  (single process: COO indices, coalescing and conversion, ``≈ 3·nnz·(16+b)`` per kind; a rank: the
  normalised edge list, ``nnz·(16+b)``, plus one chunk's rows being sorted), or exact evaluation (inputs and
  outputs of the rank's rows plus one unit's intermediates on the block evaluated at once — a chunk in a
  pipeline, which infers chunk by chunk: ``≈ (d_in + d_h0 + d_out + d_h0)·rows·b + 6·d·block·b``),
  or a backward pass's gradients beyond the saved activations (``≈ 4·d·rows·b`` for the largest block).

The live peak is ``max(build phase, training phase, evaluation phase)``, each the sum of the kinds alive then.
The resident peak adds what glibc's allocator keeps of freed short-lived memory (:data:`RETENTION`).
Measured against: peak resident memory minus the process's resident memory before it loaded data (the
runtime floor: torch, PyG and the process group, measured by :func:`gnnpipe.costmodel.profile.profile` in a
spawned rank). glibc's allocator does not return every freed page, so the measured peak can exceed the
model by fragmentation.
"""

from __future__ import annotations

import attrs

KINDS = ("graph", "adjacency", "parameters", "history", "activations", "boundary", "transient")

#: unit-width tensors per row alive at once in a backward pass beyond the saved activations (the incoming
#: gradient, the gradient being formed, the shared tensor's and a temporary); measured on synthetic 40k
#: GCNII-8 (docs/RESULTS.md, cost model section)
BACKWARD_WIDTHS = 4
#: unit-width tensors per row alive at once in exact (no-grad) evaluation of a unit on the whole part
EVAL_WIDTHS = 6
#: glibc's malloc keeps freed memory of the short-lived working set (its mmap threshold rises after the first
#: large free, and later allocations come from a heap that fragments): resident peak ≈ steady + (live peak −
#: steady)·(1 + RETENTION). Measured 0.2–0.9 on synthetic 40k GCNII-8 (gpipe lowest); 0.6 is used for the
#: resident prediction and the fits check, the live prediction is reported beside it.
RETENTION = 0.6


@attrs.define
class MemoryBreakdown:
    """Predicted bytes of one rank by kind (module docstring); ``peak`` is the predicted peak above the
    runtime floor: ``max(build, train, eval)`` phases.

    Attributes:
        rank, way, stage: who. graph … transient: bytes per kind. build_peak, train_peak, eval_peak: the phases.
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
        """Predicted peak resident bytes above the runtime floor, with glibc's retention (:data:`RETENTION`)."""
        return int(self.steady + (self.peak - self.steady) * (1.0 + RETENTION))

    def to_dict(self) -> dict:
        d = attrs.asdict(self)
        d["peak"] = self.peak
        d["resident_peak"] = self.resident_peak
        return d


def _adj_full(N: int, nnz: int, b: int) -> int:
    """``Â`` and ``Âᵀ`` of one kind as CSR."""
    return 2 * ((N + 1) * 8 + nnz * (8 + b))


def _adj_build_transient(nnz: int, b: int) -> int:
    """Working set while one kind's ``Â``/``Âᵀ`` is built (COO indices, coalesce, CSR conversion)."""
    return 3 * nnz * (16 + b)


def rank_memory(*, rank: int, way: int, stage: int, N: int, F: int, E: int, b: int, kinds_nnz: dict,
                params_total: int, params_trained: int, allreduce: bool, history_dims: list[int],
                own_parts: list[tuple[int, int, int]], inflight_rows: int, act_bytes_per_row: float,
                recompute_rows: int, d_in: int, d_out: int, d_shared: int, first: bool, last: bool,
                way_rows: int, max_dim: int, local_csr: bool, active_rows: int, push_bytes: int = 0,
                hist_b: int | None = None, whole: bool = False, eval_block: int | None = None) -> MemoryBreakdown:
    """The breakdown of one rank.

    Args:
        N, F, E, b: graph sizes and element size. kinds_nnz: ``{kind: nnz of Â}`` for the kinds the rank uses.
        params_total: ``P`` (whole model; held only by the single process). params_trained: ``P_s``.
        allreduce: the rank all-reduces its gradients (GP, hybrid). history_dims: width of each op's history.
        own_parts: ``(rows, halo, nnz)`` of every chunk (or the one part) whose CSR rows the rank holds.
        inflight_rows: rows whose activations can be alive at once (schedule).
        act_bytes_per_row: saved bytes per row summed over the rank's units.
        recompute_rows: with ``--recompute``, rows of the largest chunk (its activations alive while
            recomputed); else 0.
        d_in, d_out, d_shared: boundary widths (``d_in = 0`` for the first stage, ``d_out = 0`` for the last).
        way_rows: rows of the rank's way (its ``x`` rows on the first stage, labels on the last, boundary sends
            per epoch, evaluation). max_dim: widest unit output (not the input features: ``x`` is the graph kind).
        local_csr: the rank builds a local CSR of its part (GP, hybrid evaluation).
        active_rows: rows of the largest block one backward pass works on (a chunk, a part, the graph).
        push_bytes: the halo-gradient ops' kept pushes (``Σ_ops Σ_c |halo(c)|·d·b``; 0 without
            message-passing units).
        hist_b: element size of the history buffers (``--history-dtype``; default ``b``).
        whole: the single process (holds the whole graph, model and ``Â``).
        eval_block: rows evaluated at once (a pipeline infers chunk by chunk: its largest chunk; default
            ``way_rows``).
    """
    hist_b = b if hist_b is None else int(hist_b)
    m = MemoryBreakdown(rank=rank, way=way, stage=stage)
    k = max(1, len(kinds_nnz))
    if whole:
        m.graph = N * F * b + 2 * E * 8 + N * 8 + 3 * N
        m.adjacency = sum(_adj_full(N, nnz, b) for nnz in kinds_nnz.values())
        m.parameters = 4 * params_total * b
        build = max(_adj_build_transient(nnz, b) for nnz in kinds_nnz.values()) if kinds_nnz else 0
    else:
        m.graph = (way_rows * F * b if first else 0) + (way_rows * 11 if last else 0) + (2 * E * 8 if kinds_nnz else 0)
        rows_part = 0
        for rows, halo, nnz in own_parts:
            rows_part += 2 * (nnz * (4 + b) + (rows + halo) * 4 + (rows + 1) * 4)
        rows_part *= k if kinds_nnz else 0
        if local_csr:  # GP / hybrid evaluation: Â_local (new columns) and its transpose (a full copy)
            r, z = sum(p[0] for p in own_parts), sum(p[2] for p in own_parts)
            rows_part += k * (z * 8 + (r + 1) * 8 + z * (16 + b))
        m.adjacency = rows_part
        m.parameters = 4 * params_trained * b + (params_trained * b if allreduce else 0)
        # the normalised edge list of one kind, and one chunk's rows with 64-bit indices while they are sorted
        big = max((p[2] for p in own_parts), default=0)
        build = (max(kinds_nnz.values()) * (16 + b) + 3 * big * (16 + b)) if kinds_nnz else 0
    m.history = sum(2 * N * d * hist_b for d in history_dims) + int(push_bytes)
    chunk_act = int(act_bytes_per_row * (recompute_rows if recompute_rows else inflight_rows))
    m.activations = chunk_act
    boundary_kept = inflight_rows * ((d_in + d_shared if not first else 0) + (d_out + d_shared if not last else 0)) * b
    boundary_sent = way_rows * ((d_out + d_shared if not last else 0) + (d_in + d_shared if not first else 0)) * b
    m.boundary = boundary_kept + boundary_sent
    rows_eval = way_rows if local_csr or way_rows < N else N
    block = rows_eval if eval_block is None else min(int(eval_block), rows_eval)
    eval_t = ((d_in + d_shared if not first else 0) + (d_out + d_shared if not last else 0)) * rows_eval * b \
        + EVAL_WIDTHS * max_dim * block * b
    backward_t = BACKWARD_WIDTHS * max_dim * b * active_rows
    m.transient = max(build, eval_t, backward_t)
    steady = m.graph + m.adjacency + m.parameters
    m.build_peak = m.graph + (m.adjacency if whole else 0) + build
    m.train_peak = steady + m.history + m.activations + m.boundary + backward_t
    m.eval_peak = steady + m.history + eval_t
    m.steady = steady
    return m
