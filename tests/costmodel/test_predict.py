"""Cost model predictions: bytes equal the measured bytes exactly; history bytes exact; layout enumeration;
the plan CLI's output and JSON keys; ``--layout auto`` trains the predicted best layout."""

import json

import attrs
import pytest

from gnnpipe import api
from gnnpipe.cli.main import main
from gnnpipe.core.run import launch
from gnnpipe.data import prepare, synthetic_graph
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.nodes.cost import Profile, enumerate_layouts, predict_bytes, profile
from gnnpipe.tasks.nodes.cost.layouts import LayoutSpec, layout_config
from gnnpipe.tasks.nodes.cost.plan_memory import predict_memory
from gnnpipe.tasks.nodes.cost.predict import plan_layouts
from gnnpipe.tasks.nodes.runner import build_plan, worker
from gnnpipe.tasks.nodes.trainer import make_model

from ..core.distutil import base_config, small_graph

KEYS = {"ways", "stages", "chunks", "over_partition", "scheduler", "predicted_epoch_s", "predicted_bytes",
        "predicted_peak_bytes_per_rank", "fits"}


def _jobs(rank, world, jobs):
    return [worker(rank, world, cfg, plan, False, {"grads_after": (), "no_eval": True}) for cfg, plan in jobs]


@pytest.fixture(scope="module")
def small_profile():
    cfg = base_config(model="gcnii", layers=4, hidden=8, num_nodes=400, avg_degree=6.0)
    data = api.load_data(cfg)  # the graph `gnnpipe plan --num-nodes 400 --avg-degree 6` loads
    return cfg, data, profile(cfg, data, repeats=1, link=False)


def test_enumerate_layouts():
    specs = enumerate_layouts(4, num_units=6, num_nodes=1000)
    got = {(s.ways, s.stages, s.chunks, s.over_partition, s.scheduler) for s in specs}
    assert (4, 1, 4, 1, "gpipe") in got  # GP: one part per way, no over-partitioning
    for over in (1, 4):
        for sch in ("gpipe", "1f1b"):
            assert (1, 4, 16, over, sch) in got and (2, 2, 16, over, sch) in got
    assert all(s.ways * s.stages == 4 for s in specs) and len(specs) == 9
    assert enumerate_layouts(1, 6, 10) == [LayoutSpec(1, 1, 1, 1, "gpipe")]
    assert all(s.stages <= 3 for s in enumerate_layouts(4, num_units=3, num_nodes=1000))  # S <= units
    with pytest.raises(ConfigError, match="ranks"):
        enumerate_layouts(0, 6, 10)


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_predicted_bytes_equal_measured_bytes_exactly():
    """Bytes per epoch by kind (DESIGN §6) for a pipeline (GCNII: h0 travels), GP (GraphSAGE), a hybrid (GCN), a
    hybrid on a directed graph (forward and backward mirror counts differ) and a hybrid with bfloat16 history (its
    peer rows travel in bfloat16) — all 4 ranks, one spawn."""
    undirected = small_graph(n=120)
    raw = synthetic_graph(num_nodes=120, avg_degree=6.0, num_classes=3, num_features=8, train_per_class=10,
                          val_per_class=5, seed=1)
    src, dst = raw.edge_index
    raw.edge_index = raw.edge_index[:, (src < dst) | ((src + dst) % 3 == 0)]  # drop most reverse edges
    directed = prepare(raw, undirected=False)
    runs = [(base_config(model="gcnii", stages=4, chunks=8, layers=4, epochs=2), undirected),
            (base_config(model="graphsage", ways=4, stages=1, correctors=[], layers=3, epochs=2), undirected),
            (base_config(model="gcn", ways=2, stages=2, chunks=8, layers=4, epochs=2), undirected),
            (base_config(model="resgcn+", ways=2, stages=2, chunks=4, layers=3, epochs=2, undirected=False), directed),
            # peers exchange history rows: in --history-dtype (2 bytes) while the boundary stays in --dtype
            (base_config(model="gcn", ways=2, stages=2, chunks=8, layers=4, epochs=2, history_dtype="bfloat16"),
             undirected)]
    jobs = [(cfg, build_plan(cfg, data)) for cfg, data in runs]
    outs = launch.spawn(_jobs, 4, (jobs,), timeout_s=60, threads=1, max_runtime_s=240)
    for k, (cfg, plan) in enumerate(jobs):
        model = make_model(cfg, plan.num_features, plan.num_classes)
        pred = predict_bytes(cfg, plan, model)
        for rec in outs[0][k]["result"].epochs:
            got = {"layer": rec["bytes_layer"], "graph": rec["bytes_graph"], "weight": rec["bytes_weight"]}
            assert got == pred, (cfg.model, cfg.ways, cfg.stages)
            assert len(rec["cpu_s"]) == 4 and all(c > 0 for c in rec["cpu_s"])  # each rank's thread CPU time
        assert sum(pred.values()) > 0
    # the directed hybrid really exercises M_fwd != M_bwd
    from gnnpipe.tasks.nodes.cost.geometry import plan_geometry

    g = plan_geometry(jobs[3][1], jobs[3][0])
    assert g.mirror_fwd != g.mirror_bwd
    # the bfloat16 hybrid moves fewer graph bytes than the same hybrid with history in --dtype
    assert 0 < predict_bytes(*jobs[4],
                             make_model(jobs[4][0], jobs[4][1].num_features, jobs[4][1].num_classes))["graph"] \
        < predict_bytes(*jobs[2], make_model(jobs[2][0], jobs[2][1].num_features, jobs[2][1].num_classes))["graph"]


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_predicted_bytes_of_message_passing_models():
    """GAT (message-passing units, halo-gradient op) in GP over 2 ways: predicted bytes equal measured exactly,
    and its first layer (reading the raw features) sends no gradient back (``predict_gp_bytes`` with
    ``backward_aggregation_dims``). GIN hybrid 2 × 2, C = 4: graph bytes are the forward mirror rows plus the
    pushed halo rows of other ways per chunk, counted from the edges (the formula
    ``tests/core/test_message_passing_dist.py::test_hybrid_bytes_with_pushes`` pins to the measurement)."""
    from gnnpipe.tasks.nodes.cost.geometry import plan_geometry

    data = small_graph(n=120)
    cfg = base_config(model="gat", ways=2, stages=1, correctors=[], layers=2, hidden=4, epochs=2)
    plan = build_plan(cfg, data)
    model = make_model(cfg, plan.num_features, plan.num_classes)
    pred = predict_bytes(cfg, plan, model)
    outs = launch.spawn(_jobs, 2, ([(cfg, plan)],), timeout_s=60, threads=1, max_runtime_s=150)
    for rec in outs[0][0]["result"].epochs:
        assert {"layer": rec["bytes_layer"], "graph": rec["bytes_graph"], "weight": rec["bytes_weight"]} == pred
    dims = [d for _, _, d in model.aggregation_dims()]
    m = plan_geometry(plan, cfg).mirror_fwd
    b = 8 if cfg.dtype == "float64" else 4
    assert 0 < pred["graph"] < 2 * b * m * sum(dims)  # less than if the first layer's gradient went back

    hcfg = base_config(model="gin", ways=2, stages=2, chunks=4, layers=2, epochs=2)
    hplan = build_plan(hcfg, small_graph(n=100))
    hmodel = make_model(hcfg, hplan.num_features, hplan.num_classes)
    g = plan_geometry(hplan, hcfg)
    chunk = [c for c in range(len(g.chunk_ptr) - 1) for _ in range(g.chunk_ptr[c], g.chunk_ptr[c + 1])]
    way = [w for w in range(hcfg.ways) for _ in range(g.chunk_ptr[g.way_ptr[w]], g.chunk_ptr[g.way_ptr[w + 1]])]
    fwd, push = set(), set()
    for j, i in zip(*hplan.data.edge_index.tolist()):
        if way[j] != way[i]:
            fwd.add((j, way[i]))
            push.add((j, chunk[i]))
    d = sum(d for _, _, d in hmodel.aggregation_dims())
    assert len(push) > len(fwd) == g.mirror_fwd and g.mirror_push == len(push)
    hb = 8 if hcfg.dtype == "float64" else 4
    assert predict_bytes(hcfg, hplan, hmodel)["graph"] == hb * (len(fwd) + len(push)) * d


def test_history_and_parameter_memory_are_exact(small_profile):
    """The memory model's history bytes equal the buffers a stage allocates (2·N·d·b per op of the stage)."""
    cfg, data, prof = small_profile
    spec = LayoutSpec(1, 3, 6, 1, "gpipe")
    c = layout_config(cfg, spec)
    plan = build_plan(c, data)
    model = make_model(c, plan.num_features, plan.num_classes)
    mem = predict_memory(c, plan, model, prof)
    from gnnpipe.core.comm import Comm
    from gnnpipe.schedulers import FixedOrder, make_scheduler
    from gnnpipe.tasks.nodes.pipeline import make_pipeline_stage

    N = data.num_nodes
    for s, m in enumerate(mem):
        lo, hi = plan.bounds[s], plan.bounds[s + 1]
        ops = sum(len(model.units[u].aggregations) for u in range(lo, hi))
        # the runtime's stage holds one history-backed op (one History) per aggregation of its units
        lean = make_model(c, plan.num_features, plan.num_classes, units=range(lo, hi))  # as runner.make_executor
        ex = make_pipeline_stage(c, lean, plan.data, plan.chunk_ptr, plan.bounds, s, list(range(len(mem))),
                                 make_scheduler("gpipe"), FixedOrder(), [], Comm())
        assert len(ex.stage.ops) == ops
        assert m.history == 2 * N * cfg.hidden * 4 * ops
        P_s = sum(p.numel() for u in range(lo, hi) for p in model.units[u].parameters())
        # a lean rank allocates only its own units' parameters (the others stay on the meta device)
        held = sum(p.numel() for p in ex.stage.model.parameters() if p.device.type != "meta")
        assert held == P_s
        assert m.parameters == 4 * 4 * P_s  # parameters, gradients, Adam's two moments
        assert m.peak == max(m.build_peak, m.train_peak, m.eval_peak) > 0
    # gpipe keeps every chunk's activations, 1f1b at most S - s chunks on stage s
    c1 = layout_config(cfg, LayoutSpec(1, 3, 6, 1, "1f1b"))
    mem1 = predict_memory(c1, plan, model, prof)
    assert mem1[0].activations < mem[0].activations and mem1[-1].activations < mem[-1].activations


def test_plan_ranks_layouts_and_marks_what_does_not_fit(small_profile):
    from gnnpipe.costmodel.hardware import Hardware

    cfg, data, prof = small_profile
    roomy = Hardware(name="roomy", devices_per_node=4, node_memory_bytes=2**40)
    preds = plan_layouts(cfg, data, 4, prof, roomy, floor_bytes=0)
    assert all(p.fits for p in preds)
    times = [p.epoch_s for p in preds]
    assert times == sorted(times) and all(t > 0 for t in times)
    # a device memory between the smallest and the largest predicted peak: some do not fit, and sort last
    peaks = sorted(max(p.peak_bytes_per_rank) for p in preds)
    tight = Hardware(name="tight", nodes=4, devices_per_node=1, kind="gpu", device_memory_bytes=peaks[len(peaks) // 2])
    preds2 = plan_layouts(cfg, data, 4, prof, tight, floor_bytes=0)
    fits = [p.fits for p in preds2]
    assert any(fits) and not all(fits) and fits == sorted(fits, reverse=True)


def test_plan_cli_table_and_json(small_profile, tmp_path, capsys):
    _, _, prof = small_profile
    pin = tmp_path / "profile.json"
    prof.save(pin)
    assert Profile.load(pin).units == prof.units
    out = tmp_path / "plan.json"
    rc = main(["plan", "--ranks", "2", "--num-nodes", "400", "--avg-degree", "6",
               "--model", "gcnii", "--layers", "4", "--hidden", "8", "--profile-in", str(pin), "--out", str(out),
               "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "GP 2x1" in text and "GNNPipe 1x2" in text and "ms/epoch" in text
    recs = json.loads(out.read_text())
    assert len(recs) == 5  # GP + pipeline x {over 1, 4} x {gpipe, 1f1b}
    for r in recs:
        assert KEYS <= set(r)
        assert r["ways"] * r["stages"] == 2 and len(r["predicted_peak_bytes_per_rank"]) == 2
    assert {r["over_partition"] for r in recs if r["stages"] == 2} == {1, 4}


@pytest.mark.parametrize("flag", [[], ["--no-contention"]])
def test_plan_cli_measures_contention_unless_told_not_to(small_profile, monkeypatch, capsys, flag):
    """``--no-contention`` reaches the profile (a shorter profile that assumes ranks do not slow each other)."""
    import gnnpipe.tasks.nodes.cost as cost

    _, _, prof = small_profile
    seen = []

    def fake_profile(config, data, **kw):
        seen.append(kw.get("contention"))
        return prof

    monkeypatch.setattr(cost, "profile", fake_profile)
    rc = main(["plan", "--ranks", "2", "--num-nodes", "400", "--avg-degree", "6", "--model", "gcnii", "--layers",
               "4", "--hidden", "8", "--no-progress", *flag])
    assert rc == 0 and "GNNPipe 1x2" in capsys.readouterr().out
    assert seen == [not flag]


def test_plan_cli_needs_ranks(capsys):
    assert main(["plan", "--num-nodes", "100"]) == 2
    assert "--ranks" in capsys.readouterr().err


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_layout_auto_trains_the_predicted_best(small_profile, tmp_path):
    cfg, data, prof = small_profile
    pin = tmp_path / "profile.json"
    prof.save(pin)
    res = api.train(cfg, data=data, layout="auto", ranks=2, progress=False, epochs=2,
                    plan_options={"profile_in": str(pin), "over_partitions": (1,), "schedulers": ("gpipe", "1f1b")})
    auto = res.extra["layout_auto"]
    best = next(r for r in auto["ranking"] if r["fits"])
    assert auto["chosen"] == best
    times = [r["predicted_epoch_s"] for r in auto["ranking"]]
    assert best["predicted_epoch_s"] == min(times)
    plan = res.extra["plan"]
    assert (plan["ways"], plan["stages"], plan["chunks"]) == (best["ways"], best["stages"], best["chunks"])
    assert res.config["scheduler"] == (best["scheduler"] if best["stages"] > 1 else "gpipe")
    with pytest.raises(ConfigError, match="layout"):
        api.train(cfg, data=data, layout="fastest", ranks=2)


def test_plan_rejects_bad_profile_and_hardware_paths(small_profile, tmp_path):
    """--profile-in that is missing, not JSON, another file's JSON, or another job's profile; a --profile-out that
    cannot be written (before any profiling); a --hardware that is a directory: each a ConfigError naming the fix."""
    cfg, data, prof = small_profile
    pin = tmp_path / "profile.json"
    prof.save(pin)
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "plan.json").write_text(json.dumps([{"ways": 1}]))
    cases = [(tmp_path / "missing.json", "cannot read the profile"), (tmp_path / "text.json", "is not JSON"),
             (tmp_path / "plan.json", "is not a saved profile")]
    for path, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            api.plan(cfg, data=data, ranks=2, profile_in=str(path), progress=False)
    with pytest.raises(ConfigError, match="another job: its units are 6, unit 4 .*this job's 5"):
        api.plan(attrs.evolve(cfg, layers=3), data=data, ranks=2, profile_in=str(pin), progress=False)
    with pytest.raises(ConfigError, match="its vertices are 400, this job's 300"):
        api.plan(cfg, ranks=2, profile_in=str(pin), progress=False, num_nodes=300)
    with pytest.raises(ConfigError, match="--profile-out .* cannot be written"):
        api.plan(cfg, data=data, ranks=2, profile_out=str(tmp_path / "no" / "such" / "p.json"), progress=False)
    with pytest.raises(ConfigError, match="is a directory"):
        api.plan(cfg, data=data, ranks=2, hardware=str(tmp_path), profile_in=str(pin), progress=False)


def test_exchange_rate_slows_graph_parallel_exchanges_only(small_profile):
    """A link whose exchange (both ends sending at once) gets half the rate: GP's and the hybrid's exchanges take
    longer by their bytes over the lost rate; GNNPipe's boundary transfers share one channel per pair of stages
    (activations one way, gradients the other), which slows them only where both directions are busy at once."""
    from gnnpipe.costmodel.hardware import Hardware, Link

    cfg, data, prof = small_profile
    full = Link(0.0, 1e6)
    half = Link(0.0, 1e6, exchange_Bps=5e5)
    hw = {k: Hardware(name=k, devices_per_node=4, node_memory_bytes=2**40, intra=lk, inter=lk)
          for k, lk in (("full", full), ("half", half))}
    t = {k: {(p.spec.ways, p.spec.stages, p.spec.scheduler): p.epoch_s
             for p in plan_layouts(cfg, data, 4, prof, h, floor_bytes=0, over_partitions=(4,))} for k, h in hw.items()}
    assert t["full"][(1, 4, "gpipe")] <= t["half"][(1, 4, "gpipe")] < 1.2 * t["full"][(1, 4, "gpipe")]
    assert t["full"][(1, 4, "1f1b")] <= t["half"][(1, 4, "1f1b")]
    t = {k: {(w, s): v for (w, s, sch), v in tk.items() if sch == "1f1b" or s == 1} for k, tk in t.items()}
    assert t["half"][(4, 1)] > 1.2 * t["full"][(4, 1)]
    assert t["half"][(2, 2)] > t["full"][(2, 2)]


def test_per_pair_links_carry_graph_parallel_halos_pair_by_pair(small_profile):
    """Links ``per_pair`` (a link of its own for every pair of ranks, as the emulated mesh): graph parallelism's
    exchange takes the largest pair's rows, not a rank's whole halo, so 4 ways on slow links are faster than over
    one link per rank by about the halo's share of peers; 2 ways (one pair) and the pipeline do not change."""
    from gnnpipe.costmodel.hardware import Hardware, Link

    cfg, data, prof = small_profile
    hw = {k: Hardware(name=k, devices_per_node=4, node_memory_bytes=2**40, intra=lk, inter=lk)
          for k, lk in (("rank", Link(0.0, 1e5)), ("pair", Link(0.0, 1e5, per_pair=True)))}

    def times(R):
        return {k: {(p.spec.ways, p.spec.stages): p.epoch_s
                    for p in plan_layouts(cfg, data, R, prof, h, floor_bytes=0, over_partitions=(4,),
                                          schedulers=("1f1b",))} for k, h in hw.items()}

    t4, t2 = times(4), times(2)
    assert t4["pair"][(4, 1)] < 0.8 * t4["rank"][(4, 1)]
    assert t4["pair"][(1, 4)] == pytest.approx(t4["rank"][(1, 4)])
    assert t2["pair"][(2, 1)] == pytest.approx(t2["rank"][(2, 1)])


def test_a_pipeline_is_predicted_with_the_recompute_its_run_would_choose(small_profile):
    """``recompute="auto"`` is decided for the prediction as the run decides it (choose_recompute): a layout whose
    run recomputes is predicted with the extra forward in every backward."""
    from gnnpipe.costmodel.hardware import local_hardware
    from gnnpipe.tasks.nodes.cost.memory_check import choose_recompute
    from gnnpipe.tasks.nodes.cost.predict import predict_layout
    from gnnpipe.tasks.nodes.cost.profile import memory_profile

    cfg, data, prof = small_profile
    hw = local_hardware()
    spec = LayoutSpec(1, 2, 16, 1, "gpipe")  # every chunk in flight: the memory model recomputes
    auto = predict_layout(attrs.evolve(cfg, recompute=None), data, spec, prof, hw)
    lcfg = layout_config(attrs.evolve(cfg, recompute=None), spec)
    plan = build_plan(lcfg, data)
    on = choose_recompute(lcfg, plan, make_model(lcfg, prof.num_features, prof.num_classes),
                          memory_profile(lcfg, plan.data)).on  # what the run decides
    assert on and auto.recompute and auto.to_record()["recompute"]  # (this layout recomputes)
    fixed = {r: predict_layout(attrs.evolve(cfg, recompute=r), data, spec, prof, hw) for r in (False, True)}
    assert fixed[True].recompute and not fixed[False].recompute
    assert sum(fixed[True].work_s) > sum(fixed[False].work_s)  # the backward repeats its forward
    assert auto.epoch_s == pytest.approx(fixed[on].epoch_s)
