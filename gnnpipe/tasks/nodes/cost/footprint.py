"""What one rank's role allocates per row, measured by running the runtime's own code on a sample of the graph.

The memory model (:mod:`.memory`) adds up what a rank holds: the graph it reads, its rows of ``Â``, parameters,
history, what its chunks in flight keep for their backward, and the largest short-lived working set. The last
two depend on the model's units, on the executor's code path and on the dtype in ways no formula written by hand
follows for long (a fused chunk step saves other tensors than the plain one; a stage keeps copies of its
received inputs; a backward pass holds gradients of the shared tensor across units …). So they are *measured*:
:func:`role_footprint` builds the rank's real :class:`~gnnpipe.tasks.nodes.stage.Stage` (pipeline, hybrid member or
graph-parallel way, over the real aggregation ops) or the single process's full-graph path on the subgraph
induced by the first ``sample_nodes`` vertices, runs one chunk forward and backward and one exact inference
under :class:`LiveBytes`, and reports bytes per row:

* ``held``     — what a chunk keeps from its forward to its backward (saved activations, copies of its received
  inputs, its outputs and loss);
* ``forward``  — the peak during a chunk's forward above the state before it, its received input included;
* ``backward`` — the peak during its backward above the state before its forward (``held`` and the received
  gradient included);
* ``eval``     — the peak of exact inference above the state before it, per row inferred (the received inputs
  included; the first stage's ``x``, which the rank holds anyway, not).

These scale with the rows of a chunk (or of a way, or of the graph): autograd saves and the units compute per
row. What depends on other sizes (the halo of a graph-parallel way, boundary buffers between ranks, the
history, the rows of ``Â``) is the model's formulas' business.

**Live bytes** are what glibc's ``malloc`` has handed out and not taken back (``mallinfo2``: bytes in use in
its arenas plus its memory-mapped blocks), sampled after every ATen operation inside :class:`LiveBytes` (a
``TorchDispatchMode``), so short-lived tensors count at their peak without the allocator's retention of freed
memory. Without glibc (``mallinfo2`` missing) the footprint falls back to autograd's saved tensors and fixed
working-set widths (:func:`fallback_footprint`).
"""

from __future__ import annotations

import attrs
import torch
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from ....core.comm import Comm
from ....costmodel.live import LiveBytes, live_bytes
from ....schedulers import get as get_scheduler
from ..aggregation import HaloExchange, HaloOp, PeerExchange, PeerHistoryOp, PeerPushOp, op_numbers
from ..graph import GraphOps
from ..history import PushHistory
from ..metrics import masked_loss
from ..pipeline import history_ops
from ..runner import num_classes_of
from ..stage import Stage
from ..trainer import make_model
from .profile import saved_bytes

#: the fallback's working set of a backward pass beyond the saved activations, in unit widths per row
BACKWARD_WIDTHS = 4
#: the fallback's working set of exact evaluation, in unit widths per row
EVAL_WIDTHS = 4


@attrs.define
class RoleFootprint:
    """Bytes per row of one role (module docstring). ``measured``: from :class:`LiveBytes` (else the fallback)."""

    held: float
    forward: float
    backward: float
    eval: float
    measured: bool = True

    def to_dict(self) -> dict:
        return attrs.asdict(self)


def sample_graph(data, n: int, dtype: torch.dtype):
    """The subgraph induced by the first ``n`` vertices of ``data`` as a PyG ``Data`` (``x`` in ``dtype``, labels and
    masks of those rows; every mask non-empty so that the loss has a graph)."""
    N = int(data.num_nodes)
    n = max(2, min(N, int(n)))
    ei, _ = subgraph(torch.arange(n), data.edge_index, num_nodes=N)
    masks = {k: getattr(data, k)[:n].clone() for k in ("train_mask", "val_mask", "test_mask")}
    for m in masks.values():
        if not bool(m.any()):
            m[0] = True
    return Data(x=data.x[:n].to(dtype), edge_index=ei, y=data.y[:n].clone(), num_nodes=n, **masks)


def _flush(config) -> bool:
    return bool(getattr(get_scheduler(config.scheduler), "flush", True))


def _stage_of(config, role: str, sub, bounds, stage: int, num_features: int, num_classes: int):
    """The role's :class:`~gnnpipe.tasks.nodes.stage.Stage` on the sample (one chunk: all of its rows)."""
    n = int(sub.num_nodes)
    dtype, cpu = config.torch_dtype, torch.device("cpu")
    rows = lambda c: (0, n)  # noqa: E731
    if role == "gp":
        model = make_model(config, num_features, num_classes)

        gops = GraphOps(sub.edge_index, n, dtype, cpu)
        halo = HaloExchange(gops, 0, 1, 0, n, {}, [0], Comm())
        numbers = op_numbers(model)
        ops = {(i, j): HaloOp(halo, kind, numbers[(i, j)])
               for i, u in enumerate(model.units) for j, kind in enumerate(u.aggregations)}
        return Stage(config, model, sub, [0, model.num_units], 0, rows, ops, recompute=False, device=cpu,
                     row_range=(0, n))
    units = range(int(bounds[stage]), int(bounds[stage + 1]))
    model = make_model(config, num_features, num_classes, units=units)
    make = None
    if role == "hybrid":
        comm = Comm()
        peers = PeerExchange(0, 1, [0], {}, {}, [0], comm)
        numbers = op_numbers(model)
        cache: dict = {}

        def halo_of(gops):
            def get():
                if "halo" not in cache:
                    cache["halo"] = HaloExchange(gops, 0, 1, 0, n, {}, [0], comm)
                return cache["halo"]
            return get

        way_of = torch.zeros(n, dtype=torch.long)

        def make(hist, kind, gops, adj, i, j):
            if getattr(model.units[i], "message_passing", False):
                push = PushHistory(hist.num_nodes, hist.dtype, hist.name, hist.device, grad_dtype=dtype)
                return PeerPushOp(push, kind, gops, adj, peers, numbers[(i, j)], halo_of(gops), way_of, rows)
            return PeerHistoryOp(hist, kind, gops, adj, peers, numbers[(i, j)], halo_of(gops))
    ops = history_ops(model, sub, units, [0], rows, dtype, cpu, make=make, hist_dtype=config.torch_history_dtype)
    return Stage(config, model, sub, bounds, stage, rows, ops, flush=_flush(config), device=cpu, row_range=(0, n))


def role_footprint(config, data, role: str, bounds=None, stage: int = 0, *, num_classes: int | None = None,
                   sample_nodes: int = 4096) -> RoleFootprint:
    """Measure one role's :class:`RoleFootprint` on the first ``sample_nodes`` vertices of ``data``.

    Args:
        config: the resolved configuration of the run (model, dtype, ``recompute``, scheduler, history dtype).
        data: the graph the role trains on (the plan's relabelled graph; the prepared graph for ``"single"``).
        role: ``"single"`` (the single-process trainer's full-graph path), ``"gp"`` (a graph-parallel way),
            ``"pipeline"`` (stage ``stage`` of a pipeline with unit ``bounds``) or ``"hybrid"`` (a hybrid member).
        num_classes: the model's output width (default: from the labels).

    Returns:
        bytes per row; the fallback (:func:`fallback_footprint`) when live bytes cannot be read here.
    """
    if live_bytes() is None:
        return fallback_footprint(config, data, role, bounds, stage, num_classes=num_classes, sample_nodes=sample_nodes)
    dtype = config.torch_dtype
    F = int(data.x.size(1))
    Cls = int(num_classes) if num_classes is not None else num_classes_of(data)
    sub = sample_graph(data, sample_nodes, dtype)
    n = int(sub.num_nodes)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng():
            if role == "single":
                return _single_footprint(config, sub, F, Cls, make_model, masked_loss)
            st = _stage_of(config, role, sub, bounds, stage, F, Cls)

            def fwd(e):
                buf = None if st.is_first else torch.randn(n, st.input_width(), dtype=dtype)
                out = st.forward_chunk(0, buf, e)  # the boundary tensor to send: outstanding sends are the model's
                del buf, out

            def bwd(e):
                g = None if st.is_last else torch.randn(n, st.output_width(), dtype=dtype)
                gin = st.backward_chunk(0, g, e)
                del g, gin

            fwd(0)
            bwd(0)  # warm-up: history buffers and parameter gradients are allocated on first use
            with LiveBytes() as live:
                fwd(1)
                held = live.now() - live.base
                fpeak = live.peak - live.base
                live.reset()
                bwd(1)
                bpeak = live.peak - live.base
            with LiveBytes() as live:
                inputs = [st.x, None] if st.is_first else [
                    torch.randn(n, st.in_dim, dtype=dtype),
                    torch.randn(n, st.shared_dim, dtype=dtype) if st.shared_dim else None]
                out = st.infer_units(inputs)
                del out, inputs
                epeak = live.peak - live.base
    finally:
        torch.set_num_threads(threads)
    return RoleFootprint(held=held / n, forward=fpeak / n, backward=bpeak / n, eval=epeak / n)


def _single_footprint(config, sub, F, Cls, make_model, masked_loss) -> RoleFootprint:
    n = int(sub.num_nodes)
    model = make_model(config, F, Cls)
    ops = GraphOps(sub.edge_index, n, config.torch_dtype, torch.device("cpu"))
    for u in model.units:
        for kind in u.aggregations:
            ops.adj(kind)
    num_train = max(1, int(sub.train_mask.sum()))
    model.train()

    def step():
        logits = model(sub.x, ops.aggregate)
        return masked_loss(logits, sub.y, sub.train_mask, num_train)

    step().backward()  # warm-up: parameter gradients
    with LiveBytes() as live:
        loss = step()
        held = live.now() - live.base
        fpeak = live.peak - live.base
        live.reset()
        loss.backward()
        del loss
        bpeak = live.peak - live.base
    model.eval()
    with torch.no_grad(), LiveBytes() as live:
        out = model(sub.x, ops.aggregate)
        del out
        epeak = live.peak - live.base
    return RoleFootprint(held=held / n, forward=fpeak / n, backward=bpeak / n, eval=epeak / n)


def adjacency_build_per_nnz(config, data, kind: str, *, sample_nodes: int = 4096) -> float:
    """Peak live bytes per non-zero of ``Â`` while the single process builds ``Â`` and ``Âᵀ`` of ``kind``
    (:meth:`GraphOps.adj <gnnpipe.tasks.nodes.graph.GraphOps.adj>`: the normalised coordinates, COO, coalescing,
    conversion to CSR, the transpose; the result included), measured on the sample (``64 + 2·b`` without
    live-byte counts)."""
    b = torch.finfo(config.torch_dtype).bits // 8
    sub = sample_graph(data, sample_nodes, config.torch_dtype)
    nnz = int(sub.edge_index.size(1)) + (int(sub.num_nodes) if kind == "gcn" else 0)
    if live_bytes() is None or nnz == 0:
        return float(64 + 2 * b)
    ops = GraphOps(sub.edge_index, int(sub.num_nodes), config.torch_dtype, torch.device("cpu"))
    with LiveBytes() as live:
        ops.adj(kind)
        peak = live.peak - live.base
    return peak / nnz


def fallback_footprint(config, data, role: str, bounds=None, stage: int = 0, *, num_classes: int | None = None,
                       sample_nodes: int = 4096) -> RoleFootprint:
    """Without live-byte counts: autograd's saved tensors per row
    (:func:`gnnpipe.tasks.nodes.cost.profile.saved_bytes`), copies of the received inputs, and
    :data:`BACKWARD_WIDTHS` / :data:`EVAL_WIDTHS` unit widths of working set."""
    dtype = config.torch_dtype
    b = torch.finfo(dtype).bits // 8
    F = int(data.x.size(1))
    Cls = int(num_classes) if num_classes is not None else num_classes_of(data)
    sub = sample_graph(data, sample_nodes, dtype)
    n = int(sub.num_nodes)
    model = make_model(config, F, Cls)
    U = model.num_units
    lo, hi = (0, U) if role in ("single", "gp") else (int(bounds[stage]), int(bounds[stage + 1]))
    with torch.random.fork_rng():
        saved = saved_bytes(model, sub, 0, n)
    width = max(model.units[i].out_dim for i in range(lo, hi)) * b
    sh = model.units[0].out_dim * b if model.shared_tensor else 0
    inputs = (model.units[lo].in_dim * b + sh) if lo > 0 else 0
    recompute = role in ("pipeline", "hybrid") and (config.recompute or not _flush(config))
    act = sum(saved[lo:hi]) / n
    # a recomputing stage under a flush schedule keeps each aggregation op's forward product (History.recall)
    kept = (sum(int(d) for i, _, d in model.aggregation_dims() if lo <= i < hi) * b
            if recompute and _flush(config) else 0)
    held = inputs + (kept if recompute else act)
    backward = inputs + act + BACKWARD_WIDTHS * width
    return RoleFootprint(held=held, forward=inputs + act + 2 * width, backward=backward,
                         eval=inputs + EVAL_WIDTHS * width, measured=False)


__all__ = ["BACKWARD_WIDTHS", "EVAL_WIDTHS", "LiveBytes", "RoleFootprint", "adjacency_build_per_nnz",
           "fallback_footprint", "live_bytes", "role_footprint", "sample_graph"]
