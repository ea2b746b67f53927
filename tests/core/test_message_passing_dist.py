"""PyG message-passing models (gat, gatv2, gin) in every layout against the single process, the push
(halo-gradient) op against the pull op for a linear aggregation, and GP bytes with halo gradients
(docs/HALO_GRADIENT.md). Multi-process gloo on CPU."""

import pytest
import torch
from torch import nn
from torch_geometric.nn import SimpleConv

from gnnpipe import models
from gnnpipe.models import GNNModel, MessagePassingUnit
from gnnpipe.models.zoo import Encoder, Head
from gnnpipe.partitioners import partition_metrics, predict_gp_bytes

from .distutil import _run_jobs, base_config, run_reference, small_graph
from .distutil import run_many as _run_many
from .test_parallel_dist import assert_equal_to_reference, way_of

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

MP_MODELS = ["gat", "gatv2", "gin"]
GRADS_AFTER = (1, 3)


class LinearAfterSum(nn.Module):
    """``Linear(Σ_j w_ji x_src[j])`` as a PyG message-passing conv on bipartite input: with the edges and
    weights of ``Â_gcn`` it is the GCN layer's ``Linear(Â h)`` (PyG ``GCNConv(normalize=False)`` takes no
    bipartite input, ``SimpleConv`` does)."""

    def __init__(self, dim):
        super().__init__()
        self.agg = SimpleConv(aggr="sum")
        self.lin = nn.Linear(dim, dim, bias=False)

    def forward(self, x, edge_index, edge_weight):
        return self.lin(self.agg(x, edge_index, edge_weight))


@models.register("test-gcn-push")
class PushGCN(GNNModel):
    """The built-in ``gcn`` with every layer through the adapter (halo-gradient op); parameters are created
    in the same order, so the same seed gives the same weights (names: ``conv.lin`` instead of ``lin``)."""

    def __init__(self, in_channels, out_channels, *, num_layers=2, hidden=8, dropout=0.0, bias=False,
                 activation="relu"):
        units = [Encoder(in_channels, hidden, dropout, activation)]
        units += [MessagePassingUnit(LinearAfterSum(hidden), hidden, hidden, kind="gcn", act=activation,
                                     edge_weight="edge_weight") for _ in range(num_layers)]
        super().__init__(units + [Head(hidden, out_channels)])


def _jobs(rank, world, jobs):
    """The ranks import this module (and register its test models) to unpickle this function."""
    return _run_jobs(rank, world, jobs)


def run_many(configs, data, no_eval=False):
    """``distutil.run_many`` with this module's epochs of gradient capture and models."""
    return _run_many(configs, data, grads_after=GRADS_AFTER, no_eval=no_eval, max_runtime_s=500, jobs_fn=_jobs)


def _config(model, **kw):
    d = {"model": model, "layers": 2, "hidden": 4, "dtype": "float64"}
    d.update(kw)
    return base_config(**d)


_CACHE: dict = {}


def layout_runs(ways, stages):
    """All MP_MODELS in one layout, one spawn per layout and test session."""
    key = (ways, stages)
    if key not in _CACHE:
        configs = [_config(m, ways=ways, stages=stages, chunks=ways) for m in MP_MODELS]
        _CACHE[key] = dict(zip(MP_MODELS, zip(configs, run_many(configs, small_graph()))))
    return _CACHE[key]


@pytest.mark.parametrize("ways,stages", [(1, 2), pytest.param(1, 3, marks=pytest.mark.slow), (2, 1),
                                         pytest.param(4, 1, marks=pytest.mark.slow), (2, 2)])
@pytest.mark.parametrize("model", MP_MODELS)
def test_one_chunk_per_way_equals_single_process(model, ways, stages):
    """C = 1 pipeline (S ∈ {2, 3}), GP (W ∈ {2, 4}) and hybrid 2 × 2 (one chunk per way) equal the single
    process: losses, every parameter gradient after epochs 1 and 3 (float64, 1e-5) and the evaluation."""
    cfg, (plan, outs, grads) = layout_runs(ways, stages)[model]
    assert_equal_to_reference(cfg, plan, outs, grads)


def test_gp_bytes_of_gat_equal_the_extended_formula():
    """GP with a message-passing layer: the halo rows forward and their gradient back to the owners,
    ``4·M·(Σ d + Σ_backward d)``; GAT's first layer reads the raw features and sends no gradient back."""
    _, (plan, outs, _) = layout_runs(2, 1)["gat"]
    model = models.build_model("gat", plan.num_features, plan.num_classes, num_layers=2, hidden=4)
    dims = [d for _, _, d in model.aggregation_dims()]
    back = [d for _, _, d in model.backward_aggregation_dims()]
    assert dims == [plan.num_features, 32] and back == [32]
    m = partition_metrics(plan.data.edge_index, plan.data.num_nodes, way_of(plan)).mirror_count
    assert m > 0
    for rec in outs[0]["result"].epochs:  # the run is float64: 8 bytes per element, twice the fp32 formula
        assert rec["bytes_graph"] == 8 * m * (sum(dims) + sum(back)) == 2 * predict_gp_bytes(m, dims, back)


@pytest.mark.parametrize("correctors,scheduler,recompute", [
    ([], "gpipe", False), (["t2"], "gpipe", False), (["t1", "t2"], "1f1b", True),
    pytest.param(["t2", "t3"], "async-stale", True, marks=pytest.mark.slow)],
    ids=["none", "t2", "t1t2-1f1b-recompute", "t2t3-async"])
def test_push_equals_pull_for_a_linear_aggregation(correctors, scheduler, recompute):
    """GCN through the adapter (the halo-gradient op: forward gathers history, backward pushes) equals the
    built-in pull op, C = 4 chunks, S = 2, 3 epochs, losses and gradients within 1e-5 — also under 1f1b with
    recomputation and async-stale (recomputation and weight stashing)."""
    data = small_graph(n=80)
    kw = {"stages": 2, "chunks": 4, "correctors": correctors, "epochs": 3, "scheduler": scheduler,
          "recompute": recompute}
    (pull_plan, pull, pull_g), (_, push, push_g) = run_many([_config("gcn", **kw), _config("test-gcn-push", **kw)],
                                                            data, no_eval=True)
    assert push[0]["losses"] == pytest.approx(pull[0]["losses"], abs=1e-5, rel=0)
    for e in GRADS_AFTER:
        renamed = {k.replace(".conv.lin.", ".lin."): v for k, v in push_g[e].items()}
        assert set(renamed) == set(pull_g[e])
        for name, g in pull_g[e].items():
            torch.testing.assert_close(renamed[name], g, rtol=0, atol=1e-5, msg=f"{name} after epoch {e}")
    # C > 1 with history: not trivially equal to exact training (the chunks read stale rows)
    _, exact, _ = run_reference(_config("gcn", **{**kw, "scheduler": "gpipe", "recompute": False}), pull_plan.data)
    assert abs(pull[0]["losses"][1] - exact[1]) > 1e-6


def test_one_chunk_pipeline_with_1f1b_and_recompute_equals_single_process():
    """The halo-gradient op under 1f1b with activations recomputed in the backward (``write=False``):
    C = 1, S = 2 still equals the single process for gat and gin."""
    configs = [_config(m, stages=2, chunks=1, scheduler="1f1b", recompute=True) for m in ("gat", "gin")]
    for cfg, (plan, outs, grads) in zip(configs, run_many(configs, small_graph())):
        assert_equal_to_reference(cfg, plan, outs, grads)


def test_hybrid_bytes_with_pushes():
    """Hybrid 2 × 2, C = 4, gin: graph bytes = the forward peer rows (``M`` per op, as the pull op) plus, per op,
    the pushed halo rows of other ways, ``Σ_c |{v ∈ halo(c) : way(v) ≠ way(c)}|``, counted from the edges."""
    data = small_graph(n=100)
    cfg = base_config(model="gin", ways=2, stages=2, chunks=4, layers=2, epochs=2)
    (plan, outs, _), = run_many([cfg], data, no_eval=True)
    wo = way_of(plan).tolist()
    chunk = torch.repeat_interleave(torch.arange(len(plan.chunk_ptr) - 1), plan.chunk_ptr.diff()).tolist()
    fwd, push = set(), set()
    for j, i in zip(*plan.data.edge_index.tolist()):
        if wo[j] != wo[i]:
            fwd.add((j, wo[i]))
            push.add((j, chunk[i]))
    model = models.build_model("gin", plan.num_features, plan.num_classes, num_layers=2, hidden=cfg.hidden)
    dims = sum(d for _, _, d in model.aggregation_dims())
    back = sum(d for _, _, d in model.backward_aggregation_dims())
    assert dims == back == 2 * cfg.hidden and len(push) > len(fwd) == plan.info["mirror_count"]
    for rec in outs[0]["result"].epochs:
        assert rec["bytes_graph"] == 4 * (len(fwd) * dims + len(push) * back)
