"""The GNNPipe executor: pipelined layer-level model parallelism (GNNPipe paper §3–4).

Rank layout (one way): the rank of stage ``s`` is ``ranks[s]``. Each rank holds its stage's units
(:class:`~gnnpipe.tasks.nodes.stage.Stage`), the CSR row slices of ``Â`` and ``Âᵀ`` of every chunk, and one
:class:`~gnnpipe.tasks.nodes.history.History` per aggregation op it owns, read and written by the history-backed
chunk op (:class:`~gnnpipe.tasks.nodes.aggregation.HistoryOp`). The schedule interpreter
(:class:`~gnnpipe.tasks.nodes.executor.NodeExecutor`) runs the rank's row of the validated schedule every epoch:

* ``F`` of chunk c: take ``x[R_c]`` (stage 0) or receive the boundary rows (``|R_c| × d``, with the
  shared tensor concatenated on the right, e.g. GCNII's ``h0``) from stage s−1; run the stage's units
  with the chunk aggregation op; on the last stage compute the chunk's loss (train cross-entropy /
  global number of training vertices), else send the output rows to stage s+1;
* ``B`` of chunk c: on the last stage back-propagate the loss, else receive the output gradient from
  s+1 and back-propagate it (the aggregation op's backward is the pull); send the input gradient
  (and the shared tensor's, which thus sums over stages) to s−1;
* ``STEP``: one optimizer step on the stage's parameters (gradients accumulated over chunks).

Evaluation is exact full-graph inference through the stages with ``Â`` itself (no history, no dropout)
and does not touch history.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ...core.comm import Comm
from ...core.runtime.execute import TAG_STRIDE
from ...core.settings.config import TrainConfig
from ...correctors import Corrector
from ...models import GNNModel
from .aggregation import history_op
from .executor import NodeExecutor
from .graph import GraphOps
from .history import History
from .stage import Stage, make_optimizer_for


def chunk_rows(chunk_ptr: Tensor):
    """``c → (lo, hi)``: the global rows of chunk ``c`` (chunks are contiguous id ranges after relabelling)."""
    ptr = [int(v) for v in chunk_ptr.tolist()]
    return lambda c: (ptr[c], ptr[c + 1])


def history_ops(model: GNNModel, data, units: range, chunks: Sequence[int], rows, dtype: torch.dtype,
                device: torch.device, make=None, hist_dtype: torch.dtype | None = None) -> dict:
    """``{(unit, op index): op}`` of a pipeline stage: one :class:`History` per aggregation of its units and
    the row slices of ``Â``/``Âᵀ`` (message-passing units: the in-edges in bipartite form) of each of ``chunks``,
    built now from the edge list (only those rows). ``make(hist, kind, ops, adj, i, j)`` builds
    another op over the same history (the hybrid's); default :func:`~gnnpipe.tasks.nodes.aggregation.history_op`
    (the halo-gradient op for message-passing units, else :class:`HistoryOp`). ``hist_dtype``: the buffers'
    storage dtype (default ``dtype``; ``--history-dtype``)."""
    ops = GraphOps(data.edge_index, data.num_nodes, dtype, device, edge_weight=getattr(data, "edge_weight", None))
    adj: dict = {}
    chunks = list(chunks)
    ranges = [rows(c) for c in chunks]
    passing = {i: bool(getattr(model.units[i], "message_passing", False)) for i in units}
    # the rows of this rank's chunks only, from the edge list (never the whole matrix)
    for kind in sorted({k for i in units if not passing[i] for k in model.units[i].aggregations}):
        for c, pair in zip(chunks, ops.chunk_rows_many(kind, ranges)):
            adj[(kind, c)] = pair
    for kind in sorted({k for i in units if passing[i] for k in model.units[i].aggregations}):
        for c, part in zip(chunks, ops.bipartite_rows_many(kind, ranges)):  # the halo-gradient op's in-edges
            adj[("push", kind, c)] = part
    out = {}
    for i in units:
        for j, kind in enumerate(model.units[i].aggregations):
            name = f"unit{i}.op{j}"
            if make:
                out[(i, j)] = make(History(data.num_nodes, hist_dtype or dtype, name, device), kind, ops, adj, i, j)
            else:
                out[(i, j)] = history_op(model.units[i], kind, data.num_nodes, dtype, device, name, ops, adj,
                                         hist_dtype=hist_dtype)
            for c in chunks:
                out[(i, j)].adj(c, rows(c))
    return out


def make_pipeline_stage(config: TrainConfig, model: GNNModel, data, chunk_ptr: Tensor, bounds: Sequence[int],
                        stage: int, ranks: Sequence[int], scheduler, order_policy, correctors: list[Corrector],
                        comm: Comm, eval_group=None, device: torch.device | str = "cpu") -> NodeExecutor:
    """This rank's executor of a one-way pipeline: stage ``stage`` of ``len(ranks)``.

    Args:
        config: the resolved run configuration. model: the full model (same seed on every rank).
        data: the relabelled graph (chunks are contiguous id ranges). chunk_ptr: ``LongTensor[C+1]``.
        bounds: unit boundaries of the stages (``S+1`` ints). ranks: global rank of each stage.
        scheduler: a :class:`gnnpipe.schedulers.ChunkScheduler` instance. order_policy: chunk order policy.
        correctors: corrector instances (fresh objects per rank). comm: the byte-counting facade.
        eval_group: process group of this pipeline's ranks (for broadcasting evaluation results).
    """
    device = torch.device(device)
    C = len(chunk_ptr) - 1
    rows = chunk_rows(chunk_ptr)
    units = range(int(bounds[stage]), int(bounds[stage + 1]))
    ops = history_ops(model, data, units, range(C), rows, config.torch_dtype, device,
                      hist_dtype=config.torch_history_dtype)
    st = Stage(config, model, data, bounds, stage, rows, ops, flush=bool(getattr(scheduler, "flush", True)),
               stash=bool(getattr(scheduler, "stash_weights", False)), device=device)
    return NodeExecutor(st, config=config, num_stages=len(ranks), ranks=ranks, chunks=range(C), scheduler=scheduler,
                    order_policy=order_policy, correctors=correctors, comm=comm, data=data, chunk_ptr=chunk_ptr,
                    eval_group=eval_group, eval_tag=TAG_STRIDE * C + 1)


__all__ = ["chunk_rows", "history_ops", "make_optimizer_for", "make_pipeline_stage"]
