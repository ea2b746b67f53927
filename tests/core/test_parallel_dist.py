"""Multi-process (gloo, CPU) tests of the graph-parallel and hybrid executors against exact single-process
training, and of their measured bytes against DESIGN §6."""

import pytest
import torch

from gnnpipe.core.run import launch
from gnnpipe.errors import ConfigError
from gnnpipe.partitioners import partition_metrics, predict_gp_bytes
from gnnpipe.tasks.nodes.graph import build_adjacency
from gnnpipe.tasks.nodes.parallel import send_lists
from gnnpipe.tasks.nodes.runner import build_plan
from gnnpipe.tasks.nodes.trainer import make_model

from .distutil import base_config, run_distributed, run_reference, small_graph
from .distutil import run_many as _run_many

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

MODELS = ["gcn", "graphsage", "gcnii", "resgcn+"]
GRADS_AFTER = (1, 3)


def run_many(configs, data):
    """``distutil.run_many`` with this module's epochs of gradient capture."""
    return _run_many(configs, data, grads_after=GRADS_AFTER)


_CACHE: dict = {}


def cached_runs(key, make_configs, data_fn):
    """Run all configs of ``key`` once per test session (one spawn), return ``{model: (cfg, plan, outs, grads)}``."""
    if key not in _CACHE:
        configs = make_configs()
        data = data_fn()
        _CACHE[key] = {cfg.model: (cfg, *r) for cfg, r in zip(configs, run_many(configs, data))}
    return _CACHE[key]


def way_of(plan):
    w = torch.empty(plan.data.num_nodes, dtype=torch.long)
    ptr, cp = plan.way_ptr.tolist(), plan.chunk_ptr.tolist()
    for k in range(len(ptr) - 1):
        w[cp[ptr[k]]:cp[ptr[k + 1]]] = k
    return w


def model_sizes(cfg, plan):
    model = make_model(cfg, plan.num_features, plan.num_classes)
    sum_d = sum(d for _, _, d in model.aggregation_dims())
    params = sum(p.numel() for p in model.parameters())
    return model, sum_d, params


def assert_equal_to_reference(cfg, plan, outs, grads, evaluated=True):
    trainer, ref_losses, ref_grads = run_reference(cfg, plan.data)
    for a, b in zip(outs[0]["losses"], ref_losses):
        assert abs(a - b) < 1e-5, (outs[0]["losses"], ref_losses)
    for e in (1, 3):
        assert set(grads[e]) == set(ref_grads[e])
        for name, g in ref_grads[e].items():
            torch.testing.assert_close(grads[e][name], g, rtol=0, atol=1e-5, msg=f"{name} after epoch {e}")
    if evaluated:
        ref = trainer.evaluate()
        last = outs[0]["result"].epochs[-1]
        for k in ("train_acc", "val_acc", "test_acc"):
            assert last[k] == pytest.approx(ref[k], abs=1e-6), k
        assert last["val_loss"] == pytest.approx(ref["val_loss"], abs=1e-5)


# ------------------------------------------------------------------------------------------------ GP
@pytest.mark.parametrize("ways", [2, 3, 4])
@pytest.mark.parametrize("model", MODELS)
def test_graph_parallel_equals_single_process_and_bytes(model, ways):
    """GP with W ways is exact (loss, every gradient, evaluation), and its bytes are DESIGN §6's:
    graph = 2·4·M·Σd with M the mirror count of the way partition, weight = 2·(W−1)·4·P (ring all-reduce)."""
    runs = cached_runs(("gp", ways), lambda: [base_config(model=m, ways=ways, stages=1, layers=3) for m in MODELS],
                       small_graph)
    cfg, plan, outs, grads = runs[model]
    assert_equal_to_reference(cfg, plan, outs, grads)
    _, sum_d, params = model_sizes(cfg, plan)
    m = partition_metrics(plan.data.edge_index, plan.data.num_nodes, way_of(plan)).mirror_count
    assert m == plan.info["mirror_count"] and m > 0
    for rec in outs[0]["result"].epochs:
        assert rec["bytes_graph"] == 2 * 4 * m * sum_d == predict_gp_bytes(m, [sum_d])
        assert rec["bytes_weight"] == 2 * (ways - 1) * 4 * params
        assert rec["bytes_layer"] == 0
    assert outs[0]["result"].extra["history_bytes"] == [0] * ways


def test_send_lists_sum_to_mirror_count():
    """The GP exchange lists are exactly the mirrors: Σ_p Σ_q |list(p→q)| = M (partition metrics), on a
    directed graph too; backward lists count (i, way of an in-neighbour) pairs."""
    g = torch.Generator().manual_seed(0)
    n = 60
    ei = torch.randint(0, n, (2, 400), generator=g)
    ways = torch.sort(torch.randint(0, 3, (n,), generator=g)).values
    fwd = send_lists(ei, ways, ways, 3)
    assert sum(t.numel() for t in fwd.values()) == partition_metrics(ei, n, ways).mirror_count
    for (p, q), t in fwd.items():
        assert p != q and bool((ways[t] == p).all())
        assert torch.equal(t, torch.unique(t))
    bwd = send_lists(ei, ways, ways, 3, backward=True)
    assert sum(t.numel() for t in bwd.values()) == partition_metrics(ei.flip(0), n, ways).mirror_count


# ------------------------------------------------------------------------------------------------ hybrid
@pytest.mark.parametrize("model", MODELS)
def test_hybrid_one_chunk_per_way_equals_single_process(model):
    """2 ways × 2 stages, C = 2 (one chunk per way): every row is fresh, so the hybrid is exact."""
    runs = cached_runs("hybrid", lambda: [base_config(model=m, ways=2, stages=2, chunks=2, layers=4) for m in MODELS],
                       small_graph)
    cfg, plan, outs, grads = runs[model]
    assert plan.info["layout"] == "rank = way * stages + stage"
    assert_equal_to_reference(cfg, plan, outs, grads)


def _expected_peer_rows(plan, W):
    """Rows the peers exchange per aggregation op and epoch, computed from the edges independently."""
    ei = plan.data.edge_index.tolist()
    wo = way_of(plan).tolist()
    cp = plan.chunk_ptr.tolist()
    chunk = [0] * plan.data.num_nodes
    for c in range(len(cp) - 1):
        for v in range(cp[c], cp[c + 1]):
            chunk[v] = c
    fwd, bwd = set(), set()
    for j, i in zip(*ei):
        if wo[j] != wo[i]:
            fwd.add((j, wo[i]))  # j's chunk sends H_in[j] to i's way
            bwd.add((i, wo[j]))  # i's chunk sends G_out[i] to j's way
    return len(fwd) + len(bwd)


@pytest.mark.parametrize("model,chunks", [("gcn", 4), ("gcnii", 6)])
def test_hybrid_bytes_equal_design_formula(model, chunks):
    """Hybrid 2×2: layer bytes = the pipeline term 2·4·(S−1)·N·d (×2 for GCNII), graph bytes = the peer rows
    (from the edge lists, independently) · 4 · Σd = the GP term 2·4·M·Σd, weight = Σ_stages 2·(W−1)·4·P_s."""
    W, S = 2, 2
    data = small_graph(n=100)
    cfg = base_config(model=model, ways=W, stages=S, chunks=chunks, layers=4, epochs=2)
    plan, outs, _ = run_distributed(cfg, data, grads_after=())
    _, sum_d, params = model_sizes(cfg, plan)
    rows = _expected_peer_rows(plan, W)
    m = plan.info["mirror_count"]
    factor = 2 if model == "gcnii" else 1
    for rec in outs[0]["result"].epochs:
        assert rec["bytes_layer"] == 2 * 4 * (S - 1) * data.num_nodes * cfg.hidden * factor
        assert rec["bytes_graph"] == 4 * rows * sum_d == 2 * 4 * m * sum_d
        assert rec["bytes_weight"] == 2 * (W - 1) * 4 * params


def test_hybrid_first_epoch_forward_matches_hand_built_reference():
    """2×2, C = 4 (two chunks per way), correctors none, gpipe: in slot t every way processes its t-th chunk;
    an aggregation reads fresh rows of every chunk processed in slots ≤ t (own way and — exchanged — the
    peers'), zeros for the rest. Checked on the loss of epoch 0."""
    data = small_graph(n=80)
    cfg = base_config(model="gcn", ways=2, stages=2, chunks=4, correctors=[], layers=2, epochs=1)
    plan, outs, _ = run_distributed(cfg, data, grads_after=())
    d = plan.data
    model = make_model(cfg, d.x.size(1), plan.num_classes).double().eval().requires_grad_(False)
    A = build_adjacency(d.edge_index, d.num_nodes, "gcn", torch.float64).to_dense()
    ptr, wp = plan.chunk_ptr.tolist(), plan.way_ptr.tolist()
    n_train = int(d.train_mask.sum())
    H = {i: torch.zeros(d.num_nodes, cfg.hidden, dtype=torch.float64) for i in range(model.num_units)}
    total = 0.0
    for t in range(wp[1] - wp[0]):
        slot = [wp[w] + t for w in range(2)]
        hs = {c: d.x[ptr[c]:ptr[c + 1]].double() for c in slot}
        for i in range(model.num_units):
            for c in slot:  # all peers write before anyone reads (GCN: the op's input is the unit's input)
                if model.units[i].aggregations:
                    H[i][ptr[c]:ptr[c + 1]] = hs[c]
            for c in slot:
                lo, hi = ptr[c], ptr[c + 1]
                hs[c] = model.units[i](hs[c], None, lambda h, kind, lo=lo, hi=hi, i=i: A[lo:hi] @ H[i])[0]
        for c in slot:
            m = d.train_mask[ptr[c]:ptr[c + 1]]
            if m.any():
                total += float(torch.nn.functional.cross_entropy(hs[c][m], d.y[ptr[c]:ptr[c + 1]][m],
                                                                 reduction="sum")) / n_train
    assert abs(outs[0]["losses"][0] - total) < 1e-5


def test_hybrid_needs_equal_chunks_per_way():
    """Hybrid slots pair the t-th chunks of all ways, so C must be a multiple of W; rejected before any process
    starts."""
    data = small_graph(n=60)
    with pytest.raises(ConfigError, match="multiple of 2"):
        build_plan(base_config(ways=2, stages=2, chunks=3, layers=2, epochs=1), data)
    build_plan(base_config(ways=2, stages=1, chunks=3, layers=2, epochs=1), data)  # GP ignores chunks


# ------------------------------------------------------------------------------------------------ compare
def test_compare_layouts_and_table():
    """``gnnpipe compare``: layouts per P, and one real P = 2 comparison (GP 2×1 vs GNNPipe 1×2; 2 is prime,
    so no hybrid) whose rows carry DESIGN §6's bytes and whose table prints the GP / GNNPipe ratios."""
    from gnnpipe.cli.compare import compare, default_hybrid, format_table, layouts

    assert default_hybrid(4) == (2, 2) and default_hybrid(8) == (2, 4) and default_hybrid(6) == (2, 3)
    assert default_hybrid(5) is None
    assert layouts(4, None, ("gp", "gnnpipe", "hybrid")) == {"gp": (4, 1), "gnnpipe": (1, 4), "hybrid": (2, 2)}
    with pytest.raises(ConfigError):
        layouts(4, (3, 2), ("hybrid",))
    data = small_graph(n=80)
    cfg = base_config(model="gcn", layers=2, epochs=1, chunks=4)
    out = compare(cfg, 2, progress=False, data=data)
    rows = out["rows"]
    assert set(rows) == {"gp", "gnnpipe"}
    sum_d = 2 * cfg.hidden
    assert rows["gp"]["bytes_graph"] == 2 * 4 * rows["gp"]["mirror_count"] * sum_d
    assert rows["gp"]["chunks"] == 2 and rows["gnnpipe"]["chunks"] == 4
    assert rows["gnnpipe"]["bytes_layer"] == 2 * 4 * data.num_nodes * cfg.hidden
    assert rows["gnnpipe"]["bytes_graph"] == 0 and rows["gp"]["bytes_layer"] == 0
    text = format_table(rows, out["ratios"])
    assert "GP / GNNPipe" in text and "gnnpipe" in text
    assert out["ratios"]["bytes_total"] == pytest.approx(rows["gp"]["bytes_total"] / rows["gnnpipe"]["bytes_total"])


def _hybrid_async_epochs(rank, world, config, plan):
    """Worker: three async-stale epochs of a hybrid member; per epoch, its weight version and whether every
    parameter gradient is zero right after the epoch's step."""
    from gnnpipe.tasks.nodes.runner import make_executor

    stage = make_executor(config, plan, rank, world)
    out = []
    for e in range(3):
        stage.train_epoch(e)
        out.append((stage.version, all(float(p.grad.abs().sum()) == 0 for p in stage.params if p.grad is not None)))
    return out


def test_hybrid_async_stale_steps_advance_the_version_and_restart_gradients():
    """A hybrid member's step is the stage's step after the peers' all-reduce: with a non-flush scheduler
    (async-stale) each step makes a new weight version and the next epoch's gradients start from zero."""
    cfg = base_config(model="gcn", ways=2, stages=2, chunks=4, scheduler="async-stale", epochs=3, correctors=[])
    plan = build_plan(cfg, small_graph())
    outs = launch.spawn(_hybrid_async_epochs, 4, (cfg, plan), timeout_s=60, threads=1, max_runtime_s=120)
    for rank, per_epoch in enumerate(outs):
        assert [v for v, _ in per_epoch] == [1, 2, 3], f"rank {rank}: {per_epoch}"
        assert all(zero for _, zero in per_epoch), f"rank {rank}: gradients carried over a step: {per_epoch}"
