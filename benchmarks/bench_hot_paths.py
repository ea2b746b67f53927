"""pytest-benchmark benchmarks of gnnpipe's hot paths (not part of the default test run: ``testpaths = tests``).

Run (one thread, as the runtime's ranks use)::

    .venv/bin/python -m pytest benchmarks/bench_hot_paths.py --benchmark-only --benchmark-group-by=group
    BENCH_NODES=50000 BENCH_DIM=128 .venv/bin/python -m pytest benchmarks/bench_hot_paths.py --benchmark-only

Groups put the numbers to compare side by side:

* ``csr-slice`` — the CSR row slices of ``Â`` every stage takes per chunk at start-up: a contiguous
  range (:func:`gnnpipe.tasks.nodes.graph.csr_row_slice`) vs arbitrary rows
  (:func:`~gnnpipe.tasks.nodes.graph.csr_rows`);
* ``aggregate`` — one aggregation op over a whole epoch, forward + backward: exact full-graph ``Â @ H``
  (:class:`~gnnpipe.tasks.nodes.graph.GraphOps`) vs the chunk op (:class:`~gnnpipe.tasks.nodes.history.ChunkAggregate`
  with :class:`~gnnpipe.tasks.nodes.history.History`) over all C chunks — the chunk op's overhead is the ratio;
* ``chunk-op`` — the chunk op for one chunk, forward + backward (the per-action cost);
* ``epoch`` — one training epoch of a model: exact single process
  (:meth:`~gnnpipe.tasks.nodes.trainer.SingleProcessTrainer.train_epoch`) vs a one-stage GNNPipe pipeline of C
  chunks (:meth:`~gnnpipe.core.runtime.execute.Executor.train_epoch` of a one-stage pipeline, gpipe, no process group
  needed).

Sizes: ``BENCH_NODES`` (default 20000) vertices of the synthetic power-law graph with mean degree
``BENCH_DEGREE`` (10), width ``BENCH_DIM`` (64), ``BENCH_CHUNKS`` (16) contiguous chunks,
``BENCH_LAYERS`` (8) GCNII layers for the epoch benchmarks.
"""

from __future__ import annotations

import os

import pytest
import torch

N = int(os.environ.get("BENCH_NODES", 20000))
DEG = float(os.environ.get("BENCH_DEGREE", 10))
DIM = int(os.environ.get("BENCH_DIM", 64))
C = int(os.environ.get("BENCH_CHUNKS", 16))
LAYERS = int(os.environ.get("BENCH_LAYERS", 8))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="module")
def data():
    from gnnpipe.data import prepare
    from gnnpipe.data.synthetic import synthetic_graph

    return prepare(synthetic_graph(num_nodes=N, avg_degree=DEG, num_features=DIM, seed=0))


@pytest.fixture(scope="module")
def adj(data):
    from gnnpipe.tasks.nodes.graph import GraphOps

    ops = GraphOps(data.edge_index, data.num_nodes)
    a, at = ops.adj("gcn")
    return ops, a, at


@pytest.fixture(scope="module")
def chunk_ptr(data):
    return torch.linspace(0, data.num_nodes, C + 1).round().long()


def _chunk_slices(a, at, ptr):
    from gnnpipe.tasks.nodes.graph import csr_row_slice

    return [(csr_row_slice(a, int(ptr[c]), int(ptr[c + 1])), csr_row_slice(at, int(ptr[c]), int(ptr[c + 1])))
            for c in range(len(ptr) - 1)]


# ----------------------------------------------------------------------------------- CSR slices
@pytest.mark.benchmark(group="csr-slice")
def test_csr_row_slice_all_chunks(benchmark, adj, chunk_ptr):
    _, a, at = adj
    out = benchmark(_chunk_slices, a, at, chunk_ptr)
    assert sum(s.size(0) for s, _ in out) == a.size(0)


@pytest.mark.benchmark(group="csr-slice")
def test_csr_rows_all_chunks(benchmark, adj, chunk_ptr):
    from gnnpipe.tasks.nodes.graph import csr_rows

    _, a, at = adj
    rows = [torch.arange(int(chunk_ptr[c]), int(chunk_ptr[c + 1])) for c in range(C)]

    def run():
        return [(csr_rows(a, r), csr_rows(at, r)) for r in rows]

    out = benchmark(run)
    assert sum(s.size(0) for s, _ in out) == a.size(0)


# ----------------------------------------------------------------------------------- aggregation
@pytest.mark.benchmark(group="aggregate")
def test_full_graph_aggregate_fwd_bwd(benchmark, adj):
    ops, a, _ = adj
    h = torch.randn(a.size(0), DIM, requires_grad=True)
    g = torch.randn(a.size(0), DIM)

    def run():
        h.grad = None
        ops.aggregate(h, "gcn").backward(g)
        return h.grad

    assert benchmark(run).shape == h.shape


@pytest.mark.benchmark(group="aggregate")
def test_chunk_aggregate_epoch_fwd_bwd(benchmark, adj, chunk_ptr):
    """All C chunks forward in order, then backward in reverse (gpipe's order on one stage)."""
    from gnnpipe.tasks.nodes.history import ChunkAggregate, History

    _, a, at = adj
    slices = _chunk_slices(a, at, chunk_ptr)
    hist = History(a.size(0))
    x = torch.randn(a.size(0), DIM)
    g = torch.randn(a.size(0), DIM)
    bounds = [(int(chunk_ptr[c]), int(chunk_ptr[c + 1])) for c in range(C)]

    def run():
        outs = []
        for c, (lo, hi) in enumerate(bounds):
            xc = x[lo:hi].clone().requires_grad_()
            outs.append((xc, ChunkAggregate.apply(xc, hist, slices[c][0], slices[c][1], lo, hi, True)))
        for c in reversed(range(C)):
            lo, hi = bounds[c]
            outs[c][1].backward(g[lo:hi])
        return outs[0][0].grad

    assert benchmark(run) is not None


@pytest.mark.benchmark(group="chunk-op")
def test_chunk_aggregate_one_chunk_fwd_bwd(benchmark, adj, chunk_ptr):
    from gnnpipe.tasks.nodes.history import ChunkAggregate, History

    _, a, at = adj
    lo, hi = int(chunk_ptr[0]), int(chunk_ptr[1])
    a_c, at_c = _chunk_slices(a, at, chunk_ptr[:2])[0]
    hist = History(a.size(0))
    x = torch.randn(hi - lo, DIM)
    g = torch.randn(hi - lo, DIM)

    def run():
        xc = x.clone().requires_grad_()
        ChunkAggregate.apply(xc, hist, a_c, at_c, lo, hi, True).backward(g)
        return xc.grad

    assert benchmark(run).shape == x.shape


# ----------------------------------------------------------------------------------- one epoch
def _config(**kw):
    from gnnpipe.core.settings.config import TrainConfig

    return TrainConfig(model="gcnii", layers=LAYERS, hidden=DIM, epochs=1, **kw)


@pytest.mark.benchmark(group="epoch")
def test_single_process_train_step(benchmark, data):
    from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer

    trainer = SingleProcessTrainer(data, _config(), prepared=True)
    out = benchmark(trainer.train_epoch, 0)
    assert out["loss"] > 0


@pytest.mark.benchmark(group="epoch")
def test_pipeline_epoch_one_stage(benchmark, data, chunk_ptr):
    """A GNNPipe stage holding every layer unit (S = 1) over C chunks: the chunk op, history and the
    schedule loop without communication."""
    from gnnpipe import correctors, schedulers
    from gnnpipe.core.comm import Comm
    from gnnpipe.tasks.nodes.pipeline import make_pipeline_stage
    from gnnpipe.tasks.nodes.runner import num_classes_of
    from gnnpipe.tasks.nodes.trainer import make_model, resolve_config

    config = resolve_config(_config(chunks=C, correctors=["t1", "t3"]))
    model = make_model(config, data.x.size(1), num_classes_of(data))
    corr = correctors.build_correctors(config.correctors)
    order = next((p for p in (k.order_policy(config.seed) for k in corr) if p is not None), schedulers.FixedOrder())
    stage = make_pipeline_stage(config, model, data, chunk_ptr, [0, len(model.units)], 0, [0],
                                schedulers.get("gpipe")(), order, corr, Comm())
    epoch = iter(range(10**9))
    out = benchmark(lambda: stage.train_epoch(next(epoch)))
    assert out["loss"] > 0
