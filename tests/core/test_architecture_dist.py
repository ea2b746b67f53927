"""The runtime's composition points, tried as a user would: a custom scheduler that builds an invalid schedule,
a registered model whose encoder has no ``lin`` (trained in float64), and a registered aggregation kind with
edge weights — through single-process training, the pipeline, graph parallelism and the hybrid.

Models, kinds and schedulers are registered here at import; the ranks run the module-level ``_worker`` so that
each spawned process imports this module (and thus registers them) too.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from gnnpipe import api, models
from gnnpipe import schedulers as gs
from gnnpipe.core.run import launch
from gnnpipe.errors import ScheduleError
from gnnpipe.models.base import GNNModel, LayerUnit
from gnnpipe.models.zoo import Head
from gnnpipe.tasks.nodes import kinds
from gnnpipe.tasks.nodes.runner import build_plan, make_executor, worker

from .distutil import base_config, run_reference, small_graph

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


# ------------------------------------------------------------------------------------------------ components
@gs.register("test-invalid")
class InvalidScheduler(gs.ChunkScheduler):
    """Builds a schedule with 4 problems: stage 0 back-propagates chunk 1 before stage 1 did, never
    back-propagates chunk 0 and never steps; stage 1 never forwards chunk 1."""

    def build(self, num_stages, chunk_order):
        rows = [[gs.F(0, 0), gs.F(0, 1), gs.B(0, 1)], [None, gs.F(1, 0), gs.B(1, 1), gs.B(1, 0), gs.STEP(1)]]
        return gs.Schedule(2, 2, rows)


@kinds.register("test-symw")
class WeightedSymmetric(kinds.AggregationKind):
    """``D^{-1/2} W D^{-1/2}`` without self-loops, ``D`` the weighted in-degree (every edge's weight used)."""

    def values(self, src, dst, weight, num_nodes):
        deg = torch.zeros(num_nodes, dtype=weight.dtype).index_add_(0, dst, weight)
        dinv = deg.pow(-0.5)
        dinv[torch.isinf(dinv)] = 0
        return src, dst, weight * dinv[src] * dinv[dst]


class Projection(LayerUnit):
    """An encoder whose linear layer is called ``proj`` (not ``lin``)."""

    def __init__(self, in_dim, out_dim):
        super().__init__(in_dim, out_dim)
        self.proj = nn.Linear(in_dim, out_dim)

    def forward(self, h, shared, agg):
        return torch.relu(self.proj(h)), shared


class WeightedLayer(LayerUnit):
    """``relu(W · Â_kind h)`` with a configurable aggregation kind."""

    param_group = "conv"

    def __init__(self, dim, kind):
        super().__init__(dim, dim)
        self.aggregations = (kind,)
        self.weight = nn.Linear(dim, dim, bias=False)

    def forward(self, h, shared, agg):
        return torch.relu(self.weight(agg(h, self.aggregations[0]))), shared


class _Net(GNNModel):
    kind = "gcn"

    def __init__(self, in_channels, out_channels, *, num_layers=2, hidden=8, dropout=0.0, bias=False,
                 activation="relu"):
        units = [Projection(in_channels, hidden)] + [WeightedLayer(hidden, self.kind) for _ in range(num_layers)]
        super().__init__(units + [Head(hidden, out_channels)])


@models.register("test-nolin")
class NoLinNet(_Net):
    """Encoder without ``lin``; GCN aggregation."""


@models.register("test-weighted")
class WeightedNet(_Net):
    """Encoder without ``lin``; every layer aggregates with the registered ``test-symw`` kind."""

    kind = "test-symw"


def _worker(rank, world, config, plan, collect):
    return worker(rank, world, config, plan, False, collect)


def _run(cfg, data, grads_after=(1, 2)):
    plan = build_plan(cfg, data)
    outs = launch.spawn(_worker, cfg.world_size, (cfg, plan, {"grads_after": grads_after, "no_eval": True}),
                        timeout_s=cfg.timeout_s, threads=1, max_runtime_s=240)
    grads = {e: {} for e in grads_after}
    for o in outs:
        for e, g in o["grads"].items():
            grads[e].update(g)
    return outs, grads


def _assert_exact(cfg, data, outs, grads, tol):
    _, losses, ref = run_reference(cfg, data, grads_after=tuple(grads))
    got = outs[0]["losses"]
    assert got == pytest.approx(losses, abs=tol, rel=0)
    for e, g in grads.items():
        assert set(g) == set(ref[e])
        for name, t in g.items():
            assert t.dtype == ref[e][name].dtype
            assert torch.allclose(t, ref[e][name], atol=tol, rtol=0), (e, name)


# ------------------------------------------------------------------------------------------------ schedules
def test_invalid_custom_schedule_raises_schedule_error_before_any_rank_starts():
    """api.train validates the schedule in the launcher: ScheduleError with the problems and the picture,
    in well under 10 s (before: a deadlock until the process-group timeout, then "rank 0 failed")."""
    t0 = time.monotonic()
    with pytest.raises(ScheduleError) as info:
        api.train(data=small_graph(n=40), model="gcn", layers=2, hidden=8, stages=2, chunks=2, epochs=1,
                  scheduler="test-invalid", correctors=[], progress=False, timeout_s=120)
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert "4 problem(s)" in msg and "has no optimizer step (0S)" in msg and "has no forward F of chunk 1" in msg
    assert "slot  stage 0  stage 1" in msg  # the ASCII picture


def _train_invalid(rank, world, config, plan):
    """Worker: build this rank's executor and run an epoch; report how it ended and what was sent."""
    ex = make_executor(config, plan, rank, world)
    try:
        ex.train_epoch(0)
    except ScheduleError as exc:
        c = ex.comm.counters()
        return ("ScheduleError", str(exc), c["bytes_layer"] + c["bytes_graph"])
    return ("ran", "", 0)


def test_every_rank_validates_before_it_waits_on_a_peer():
    """Without the launcher's check (torchrun: every rank builds its own schedule), each rank's interpreter
    validates the schedule before its first send or receive: every rank raises ScheduleError at once, having
    sent nothing, instead of blocking until the timeout."""
    cfg = base_config(layers=2, stages=2, chunks=2, epochs=1, scheduler="test-invalid", correctors=[], timeout_s=120)
    plan = build_plan(cfg, small_graph(n=40))
    t0 = time.monotonic()
    outs = launch.spawn(_train_invalid, 2, (cfg, plan), timeout_s=120, threads=1, max_runtime_s=60)
    assert time.monotonic() - t0 < 60
    for kind, msg, sent in outs:
        assert kind == "ScheduleError" and "has no optimizer step (0S)" in msg and sent == 0


# ------------------------------------------------------------------------------------------------ dtype
@pytest.mark.parametrize("ways,stages,chunks", [(1, 2, 1), (2, 1, 2)])
def test_float64_model_whose_encoder_has_no_lin(ways, stages, chunks):
    """The stage's dtype comes from the config, not from ``units[0].lin``: a registered model whose encoder
    calls its linear layer ``proj`` trains in float64 in a 2-stage pipeline (C = 1) and in 2-way GP, exactly
    as single-process float64 training."""
    data = small_graph(n=60)
    cfg = base_config(model="test-nolin", layers=2, ways=ways, stages=stages, chunks=chunks, epochs=2,
                      dtype="float64", correctors=[])
    outs, grads = _run(cfg, data)
    assert all(t.dtype == torch.float64 for g in grads.values() for t in g.values())
    _assert_exact(cfg, data, outs, grads, tol=1e-10)


# ------------------------------------------------------------------------------------------------ aggregation kinds
def _weighted_graph():
    data = small_graph(n=60)
    g = torch.Generator().manual_seed(3)
    data.edge_weight = torch.rand(data.edge_index.size(1), generator=g) + 0.1
    return data


def test_registered_kind_uses_edge_weights_in_single_process():
    """The registered kind is built from data.edge_weight: different weights give a different loss, and
    the adjacency equals the kind's formula on a dense reference."""
    from gnnpipe.tasks.nodes.graph import build_adjacency

    data = _weighted_graph()
    a = build_adjacency(data.edge_index, data.num_nodes, "test-symw", torch.float64, data.edge_weight).to_dense()
    dense = torch.zeros(data.num_nodes, data.num_nodes, dtype=torch.float64)
    dense[data.edge_index[1], data.edge_index[0]] = data.edge_weight.double()
    dinv = dense.sum(1).pow(-0.5)
    dinv[torch.isinf(dinv)] = 0
    assert torch.allclose(a, dinv[:, None] * dense * dinv[None, :])
    cfg = dict(data=data, model="test-weighted", layers=2, hidden=8, epochs=2, patience=0, progress=False,
               correctors=[], dropout=0.0)
    weighted = api.train(**cfg).epochs[-1]["loss"]
    data2 = _weighted_graph()
    data2.edge_weight = torch.ones_like(data2.edge_weight)
    assert api.train(**dict(cfg, data=data2)).epochs[-1]["loss"] != pytest.approx(weighted, abs=1e-6)


@pytest.mark.parametrize("ways,stages,chunks", [(1, 2, 1), (2, 1, 2), (2, 2, 2)])
def test_registered_kind_with_edge_weights_is_exact_in_every_executor(ways, stages, chunks):
    """A registered aggregation kind with edge weights in the pipeline (C = 1), GP (2 ways) and the hybrid
    (2 × 2, one chunk per way): losses and every gradient equal single-process training's."""
    data = _weighted_graph()
    cfg = base_config(model="test-weighted", layers=2, ways=ways, stages=stages, chunks=chunks, epochs=2,
                      correctors=[])
    outs, grads = _run(cfg, data)
    _assert_exact(cfg, data, outs, grads, tol=1e-5)


def test_unknown_kind_names_the_registered_ones():
    from gnnpipe.errors import UnknownComponentError
    from gnnpipe.tasks.nodes.graph import build_adjacency

    with pytest.raises(UnknownComponentError, match="gcn"):
        build_adjacency(torch.tensor([[0], [1]]), 2, "no-such-kind")


def test_the_executors_share_one_interface():
    """Pipeline, graph-parallel and hybrid executors are one class around one Stage class, built by factories: the
    only subclass of the interpreter is node classification's ``NodeExecutor`` (its correctors' hooks), and no
    class subclasses (and so overrides) node classification's Stage."""
    import importlib
    import pkgutil

    import gnnpipe.core
    import gnnpipe.tasks.nodes
    from gnnpipe.core.runtime import execute
    from gnnpipe.tasks.nodes import executor, parallel, pipeline, stage

    assert not hasattr(parallel, "HybridMember") and not hasattr(pipeline, "PipelineStage")
    found = set()
    for pkg in (gnnpipe.core, gnnpipe.tasks.nodes):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            mod = importlib.import_module(info.name)
            found |= {c for c in vars(mod).values() if isinstance(c, type)
                      and issubclass(c, (stage.Stage, execute.Executor)) and c not in (stage.Stage, execute.Executor)}
    assert found == {executor.NodeExecutor}
