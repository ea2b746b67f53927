"""Lean ranks (issue #12): each rank materialises only what its role uses.

Built in this process (no process group: the executors' constructors send nothing), checked on what they hold:
``x`` only on the first stage of each way and only its rows, labels and masks only on the last stage, parameters
and optimizer state only of the rank's own units (the others on the ``meta`` device, never allocated), rows of
``Â``/``Âᵀ`` only for the chunks the rank runs (the whole matrix never built), history in ``--history-dtype``.
"""

import pickle

import pytest
import torch

from gnnpipe.tasks.nodes.graph import CompactRows, GraphOps, build_adjacency, csr_row_slice, csr_transpose
from gnnpipe.tasks.nodes.graphfile import GraphFile
from gnnpipe.tasks.nodes.history import ChunkAggregate, History
from gnnpipe.tasks.nodes.runner import build_plan, file_backed, format_plan, make_executor
from gnnpipe.tasks.nodes.trainer import make_model, materialised_units

from .distutil import base_config, small_graph


def _ops_of(executor):
    return list(executor.stage.ops.values())


def _assert_no_full_adjacency(executor):
    for op in _ops_of(executor):
        graph_ops = getattr(op, "ops", None) or getattr(getattr(op, "halo", None), "ops", None)
        assert graph_ops is not None
        assert graph_ops._adj == {}, "a rank built the whole Â"


@pytest.mark.parametrize("model", ["gcn", "gcnii"])
def test_unit_seeded_model_equals_whole_model_and_allocates_only_own_units(model):
    cfg = base_config(model=model, layers=4)
    whole = make_model(cfg, 8, 3)
    part = make_model(cfg, 8, 3, units=range(2, 4))
    assert materialised_units(whole) == list(range(whole.num_units))
    assert materialised_units(part) == [2, 3]
    for i, (u, v) in enumerate(zip(whole.units, part.units)):
        for p, q in zip(u.parameters(), v.parameters()):
            if 2 <= i < 4:
                assert torch.equal(p, q)
            else:
                assert q.device.type == "meta"


def test_pipeline_ranks_hold_only_their_role(tmp_path):
    data = small_graph(n=120)
    cfg = base_config(model="gcnii", stages=3, chunks=6, layers=4, history_dtype="bfloat16")
    plan = file_backed(build_plan(cfg, data), str(tmp_path))
    shipped = pickle.dumps(plan.data)
    assert len(shipped) < 1000  # the launcher ships the path of the graph file, not the graph
    N = data.num_nodes
    for rank in range(3):
        ex = make_executor(cfg, pickle.loads(pickle.dumps(plan)), rank, 3)
        st = ex.stage
        if rank == 0:
            assert st.x is not None and st.x.shape == (N, data.x.size(1))
        else:
            assert st.x is None
        if rank == 2:
            assert st.y is not None and st.y.numel() == N and st.train_mask.numel() == N
        else:
            assert st.y is None and st.train_mask is None
        own = list(st.units)
        assert materialised_units(st.model) == own
        n_opt = sum(p.numel() for g in st.optimizer.param_groups for p in g["params"])
        assert n_opt == sum(p.numel() for i in own for p in st.model.units[i].parameters())
        _assert_no_full_adjacency(ex)
        for op in _ops_of(ex):
            assert op.history.dtype == torch.bfloat16
            assert sorted(op.chunk_ranges) == list(range(6))
    assert "rank 1 (way 0, stage 1): no x, no labels" in format_plan(plan.info)


def test_graph_parallel_way_holds_its_rows_only():
    data = small_graph(n=120)
    cfg = base_config(model="gcn", ways=2, layers=2, correctors=[])
    plan = build_plan(cfg, data)
    for way in range(2):
        ex = make_executor(cfg, plan, way, 2)
        lo, hi = ex.inference_rows
        st = ex.stage
        assert st.x.size(0) == hi - lo < data.num_nodes
        assert st.y.numel() == hi - lo
        _assert_no_full_adjacency(ex)
        halo = _ops_of(ex)[0].halo
        a, _ = halo.adj("gcn")
        assert a.size(0) == hi - lo and a.size(1) == hi - lo + halo.n_halo


def test_rows_from_edge_list_equal_rows_of_whole_matrix():
    data = small_graph(n=90)
    ops = GraphOps(data.edge_index, data.num_nodes)
    ranges = [(0, 17), (17, 17), (17, 60), (60, 90)]
    for kind in ("gcn", "mean", "sum"):
        a = build_adjacency(data.edge_index, data.num_nodes, kind)
        at = csr_transpose(a)
        for got, want in zip(ops.rows(kind, ranges) + ops.rows(kind, ranges, transpose=True),
                             [csr_row_slice(a, *r) for r in ranges] + [csr_row_slice(at, *r) for r in ranges]):
            assert torch.equal(got.crow_indices(), want.crow_indices())
            assert torch.equal(got.col_indices(), want.col_indices())
            assert torch.equal(got.values(), want.values())
    assert ops._adj == {}


def test_graph_file_round_trip_is_memory_mapped(tmp_path):
    data = small_graph(n=50)
    gf = GraphFile.write(data, str(tmp_path / "g.pt"))
    back = pickle.loads(pickle.dumps(gf))
    assert back.num_nodes == 50 and back.edge_weight is None
    for k in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(back, k), getattr(data, k))
    (tmp_path / "g.pt").unlink()
    with pytest.raises(FileNotFoundError, match="graph file"):
        _ = GraphFile(str(tmp_path / "g.pt"), 50).x


@pytest.mark.parametrize("hist_dtype", [torch.bfloat16, torch.float16])
def test_narrow_history_stores_narrow_and_computes_wide(hist_dtype):
    """--history-dtype: H_in/G_out are stored narrow; forward and pull read them up-cast to the compute dtype."""
    torch.manual_seed(0)
    data = small_graph(n=40)
    a = build_adjacency(data.edge_index, 40, "gcn")
    at = csr_transpose(a)
    lo, hi = 10, 25
    hist = History(40, hist_dtype)
    x = torch.randn(hi - lo, 5, requires_grad=True)
    out = ChunkAggregate.apply(x, hist, CompactRows(csr_row_slice(a, lo, hi)), CompactRows(csr_row_slice(at, lo, hi)),
                               lo, hi, True)
    assert hist.H_in.dtype == hist_dtype and out.dtype == torch.float32
    stored = torch.zeros(40, 5)
    stored[lo:hi] = x.detach().to(hist_dtype).float()
    torch.testing.assert_close(out, (a.to_dense() @ stored)[lo:hi], rtol=1e-6, atol=1e-6)
    g = torch.randn(hi - lo, 5)
    out.backward(g)
    assert hist.G_out.dtype == hist_dtype and x.grad.dtype == torch.float32
    gs = torch.zeros(40, 5)
    gs[lo:hi] = g.to(hist_dtype).float()
    torch.testing.assert_close(x.grad, (at.to_dense() @ gs)[lo:hi], rtol=1e-6, atol=1e-6)


def test_history_dtype_flag_and_errors():
    from gnnpipe.cli.main import build_parser
    from gnnpipe.core.settings.arguments import config_from_args
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.errors import ConfigError

    args = build_parser().parse_args(["train", "--history-dtype", "bfloat16", "--num-features", "7",
                                      "--num-classes", "4", "--device", "cpu"])
    cfg = config_from_args(args)
    assert cfg.torch_history_dtype == torch.bfloat16 and cfg.torch_dtype == torch.float32
    assert (cfg.num_features, cfg.num_classes, cfg.device_type) == (7, 4, "cpu")
    assert TrainConfig().torch_history_dtype == torch.float32  # default: the compute dtype
    with pytest.raises(ConfigError, match="unknown history dtype"):
        _ = TrainConfig(history_dtype="int8").torch_history_dtype


@pytest.mark.parametrize("model", ["gat", "gin"])
def test_halo_gradient_ops_are_lean_and_infer_on_the_same_edges(tmp_path, model):
    """A pipeline rank of a message-passing model (#16's halo-gradient op) builds the in-edges of its chunks
    from the edge list (never the whole Â), stores H_in in --history-dtype and keeps G_in in the compute dtype;
    its exact inference runs the layer on edges put together from the chunks, equal to the whole graph's."""
    from gnnpipe.tasks.nodes.aggregation import PushHistoryOp

    data = small_graph(n=120)
    cfg = base_config(model=model, stages=2, chunks=4, layers=3, history_dtype="bfloat16")
    plan = file_backed(build_plan(cfg, data), str(tmp_path))
    seen = 0
    for rank in range(2):
        ex = make_executor(cfg, plan, rank, 2)
        _assert_no_full_adjacency(ex)
        for op in _ops_of(ex):
            if not isinstance(op, PushHistoryOp):
                continue
            seen += 1
            assert sorted(op.chunk_ranges) == list(range(4))
            assert not any(k[0] != "push" for k in op.chunk_edges)  # no CompactRows built for a push op's kind
            op.history.ensure(5)
            assert op.history.H_in.dtype == torch.bfloat16 and op.history.G_in.dtype == torch.float32
            whole = GraphOps(plan.data.edge_index, plan.data.num_nodes).edges(op.kind)  # the relabelled graph
            got = op.edges()
            assert torch.equal(got[0], whole[0]) and torch.equal(got[1], whole[1])
        _assert_no_full_adjacency(ex)
    assert seen > 0


def test_push_history_narrow_storage_keeps_gradient_sums_wide():
    """PushHistory with a bfloat16 H_in: the gather up-casts halo rows to the compute dtype; pushes and G_in stay
    float32, so replacing a push (G_in += new − old) leaves G_in exactly the latest push (no drift)."""
    from gnnpipe.tasks.nodes.aggregation import PushGather
    from gnnpipe.tasks.nodes.history import PushHistory

    torch.manual_seed(0)
    hist = PushHistory(10, torch.bfloat16, "p", grad_dtype=torch.float32)
    halo = torch.tensor([0, 7, 9])
    h = torch.randn(3, 4, requires_grad=True)
    x_src = PushGather.apply(h, hist, halo, 1, 3, 6, True)
    assert x_src.dtype == torch.float32 and hist.H_in.dtype == torch.bfloat16
    assert torch.equal(x_src[:3], h.detach())
    last = None
    for _ in range(50):  # the same chunk pushes again and again: G_in must hold exactly its latest push
        last = torch.randn(3, 4) * 1e-3
        hist.push(1, halo, last, 3)
    assert hist.G_in.dtype == torch.float32
    want = torch.zeros(10, 4)
    want[halo] = last
    torch.testing.assert_close(hist.G_in, want, rtol=0, atol=1e-9)
    state = hist.state_tensors()
    back = PushHistory(10, torch.bfloat16, "p", grad_dtype=torch.float32)
    back.load_state_tensors(state)
    assert torch.equal(back.H_in, hist.H_in) and torch.equal(back.G_in, hist.G_in)
    assert back.H_in.dtype == torch.bfloat16 and back.pushes[1][1].dtype == torch.float32
