"""Layer partitioners: equal greedy split, exact min–max DP, profiling, registry and errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from gnnpipe import partitioners as P
from gnnpipe.errors import ConfigError, UnknownComponentError
from gnnpipe.models import build_model
from gnnpipe.tasks.nodes.profile import profile_unit_costs, profiled_split


def brute_force_bottleneck(costs, s):
    u = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, u), s - 1):
        b = [0, *cuts, u]
        best = min(best, max(sum(costs[b[i] : b[i + 1]]) for i in range(s)))
    return best


def test_registry():
    assert P.available_layer_partitioners() == ["equal", "profiled"]
    assert P.get_layer_partitioner("equal") is P.EqualLayerPartitioner
    assert P.get_layer_partitioner("profiled") is P.ProfiledLayerPartitioner
    with pytest.raises(UnknownComponentError, match="equal, profiled"):
        P.get_layer_partitioner("nope")
    assert "metis" not in P.available_layer_partitioners()  # a separate registry


@pytest.mark.parametrize(
    "u,s,bounds",
    [(10, 4, [0, 3, 6, 8, 10]), (6, 3, [0, 2, 4, 6]), (7, 1, [0, 7]), (5, 5, [0, 1, 2, 3, 4, 5]),
     (34, 4, [0, 9, 18, 26, 34])],
)
def test_equal_greedy_rule(u, s, bounds):
    split = P.split_layers(u, s, "equal")
    assert split.bounds == bounds
    assert split.stage_costs == [float(b - a) for a, b in itertools.pairwise(bounds)]
    assert split.unit_costs == [1.0] * u
    assert [len(split.stage_units(i)) for i in range(s)] == [b - a for a, b in itertools.pairwise(bounds)]


def test_equal_on_model_and_costs():
    model = build_model("gcn", 8, 3, num_layers=4, hidden=16)  # 6 units
    split = P.EqualLayerPartitioner().split(model, 4)
    assert split.bounds == [0, 2, 4, 5, 6] and split.num_units == 6 and split.num_stages == 4
    assert P.EqualLayerPartitioner().split([5.0, 1, 1, 1], 2).bounds == [0, 2, 4]  # costs ignored
    assert split.stage_of(0) == 0 and split.stage_of(4) == 2 and split.stage_of(5) == 3


@pytest.mark.parametrize("method", ["equal", "profiled"])
def test_errors(method):
    with pytest.raises(ConfigError, match="at most 3 stages"):
        P.split_layers([1.0, 2.0, 3.0], 4, method)
    for bad in (0, -1, 1.5):
        with pytest.raises(ConfigError):
            P.split_layers([1.0, 2.0, 3.0], bad, method)
    with pytest.raises(ConfigError):
        P.split_layers([1.0, 2.0, 3.0], 1, method).stage_units(1)


def test_profiled_with_explicit_costs():
    split = P.split_layers([1, 2, 3, 4, 5], 2, "profiled")
    assert split.bounds == [0, 3, 5] and split.stage_costs == [6.0, 9.0] and split.bottleneck == 9.0
    split = P.split_layers([10, 1, 1, 1, 1, 1, 1, 10], 3, "profiled")
    assert split.bottleneck == 10.0 and split.bounds[1] == 1 and split.bounds[2] == 7
    with pytest.raises(ConfigError):
        P.split_layers([1, -2, 3], 2, "profiled")


def test_minmax_split_is_optimal():
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        u = int(torch.randint(1, 9, (1,), generator=g))
        s = int(torch.randint(1, u + 1, (1,), generator=g))
        costs = torch.randint(0, 20, (u,), generator=g).tolist()
        b = P.minmax_split(costs, s)
        assert b[0] == 0 and b[-1] == u and len(b) == s + 1
        assert all(x < y for x, y in itertools.pairwise(b))
        got = max(sum(costs[b[i] : b[i + 1]]) for i in range(s))
        assert got == brute_force_bottleneck(costs, s)


def test_from_bounds_validation():
    with pytest.raises(ConfigError):
        P.StageSplit.from_bounds([0, 2, 2, 4], [1] * 4)
    with pytest.raises(ConfigError):
        P.StageSplit.from_bounds([0, 3], [1] * 4)


def sample(n=60, f=8, seed=0):
    from .graphs import two_communities

    d = two_communities(n_per=n // 2, extra_isolated=0, seed=seed)
    d.x = torch.randn(d.num_nodes, f, generator=torch.Generator().manual_seed(seed))
    return d


@pytest.mark.parametrize("name", ["gcn", "gcnii"])
def test_profile_unit_costs(name):
    model = build_model(name, 8, 3, num_layers=3, hidden=16)
    model.eval()
    data = sample()
    costs = profile_unit_costs(model, data, repeats=2)
    assert len(costs) == model.num_units and all(c > 0 for c in costs)
    assert not model.training  # mode restored
    assert all(p.grad is None for p in model.parameters())  # grads restored


def test_profiled_split_on_model():
    model = build_model("gcn", 8, 3, num_layers=4, hidden=16)
    data = sample()
    split = profiled_split(model, 3, data=data, repeats=1, sample_nodes=40)
    assert split.num_stages == 3 and split.num_units == model.num_units
    assert split.bounds == P.minmax_split(split.unit_costs, 3)
    assert split.stage_costs == pytest.approx(
        [sum(split.unit_costs[a:b]) for a, b in zip(split.bounds, split.bounds[1:])]
    )
    with pytest.raises(ConfigError, match="takes measured unit costs"):  # partitioners never run a model
        P.ProfiledLayerPartitioner().split(model, 2)
    with pytest.raises(ConfigError, match="at most"):
        profiled_split(model, 7, data=data)


def test_profile_keeps_existing_grads():
    model = build_model("gcn", 8, 3, num_layers=2, hidden=8)
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    profile_unit_costs(model, sample(), repeats=1)
    assert all(torch.all(p.grad == 7.0) for p in model.parameters())


@pytest.mark.parametrize("name", ["gcn", "gcnii", "resgcn+"])
def test_chunked_profile_runs_every_chunk_and_restores_state(name):
    model = build_model(name, 8, 3, num_layers=3, hidden=16)
    model.eval()
    data = sample()
    n = int(data.num_nodes)
    costs = profile_unit_costs(model, data, repeats=1, chunk_ptr=torch.tensor([0, n // 3, n // 2, n]))
    assert len(costs) == model.num_units and all(c > 0 for c in costs)
    assert not model.training and all(p.grad is None for p in model.parameters())
    split = profiled_split(model, 2, data=data, repeats=1, chunk_ptr=torch.tensor([0, n // 2, n]))
    assert split.bounds == P.minmax_split(split.unit_costs, 2)


def test_chunked_profile_counts_the_chunk_work(monkeypatch):
    """With chunk_ptr every unit runs once per chunk, on the chunk's rows, through the chunk op."""
    from gnnpipe.tasks.nodes import history

    calls = []
    real = history.ChunkAggregate.apply

    def spy(x, hist, a_c, at_c, lo, hi, write):
        calls.append((x.size(0), lo, hi))
        return real(x, hist, a_c, at_c, lo, hi, write)

    monkeypatch.setattr(history.ChunkAggregate, "apply", spy)
    model = build_model("gcn", 8, 3, num_layers=2, hidden=8)
    data = sample()
    n = int(data.num_nodes)
    ptr = [0, 7, n // 2, n]
    profile_unit_costs(model, data, repeats=1, chunk_ptr=torch.tensor(ptr))
    per_pass = [(b - a, a, b) for a, b in zip(ptr, ptr[1:])] * 2  # 2 GCN layers aggregate, per chunk
    assert sorted(calls) == sorted(per_pass * 2)  # warm-up + 1 timed pass
    with pytest.raises(ConfigError, match="chunk_ptr"):
        profile_unit_costs(model, data, repeats=1, chunk_ptr=torch.tensor([0, 5, 3, n]))


def test_schedule_split_never_worse_than_its_start():
    """Two stages, 4 units, 4 chunks: unit 0 is forward-heavy, unit 3 backward-heavy. The refined split's
    reported makespan is the simulator's for it, never worse than the start, and the best of all splits."""
    from gnnpipe.schedulers import build_schedule, simulate

    C = 4
    f = [[3.0] * C, [1.0] * C, [1.0] * C, [0.5] * C]
    b = [[0.5] * C, [1.0] * C, [1.0] * C, [3.5] * C]
    ph = P.UnitPhases(forward=f, backward=b)
    start = P.minmax_split(ph.unit_costs(), 2)

    def sim(bounds):
        def cost(a):
            if a.kind.name == "STEP":
                return 0.0
            m = f if a.kind.name == "F" else b
            return sum(m[u][a.chunk] for u in range(bounds[a.stage], bounds[a.stage + 1]))
        return simulate(build_schedule("gpipe", 2, C), costs=cost).makespan

    bounds, span = P.schedule_split(ph, 2, "gpipe", start=start)
    assert span == pytest.approx(sim(bounds))
    assert span <= sim(start) + 1e-9
    assert span == pytest.approx(min(sim([0, k, 4]) for k in (1, 2, 3)))  # exhaustive: the best 2-stage split
    # equal units from a bad start ([0, 1, 4]: stage 1 holds 3 of 4) walk to the even split
    even = P.UnitPhases(forward=[[1.0] * C] * 4, backward=[[2.0] * C] * 4)
    bounds, span_even = P.schedule_split(even, 2, "gpipe", start=[0, 1, 4])
    assert bounds == [0, 2, 4] and span_even == pytest.approx(2 * 2 * (C + 1) * 1.5)
    with pytest.raises(ConfigError, match="at most"):
        P.schedule_split(ph, 5, "gpipe")


def test_profile_phases_shape_and_sum():
    model = build_model("gcnii", 8, 3, num_layers=2, hidden=8)
    data = sample()
    n = int(data.num_nodes)
    ph = profile_unit_costs(model, data, repeats=1, chunk_ptr=torch.tensor([0, n // 2, n]), phases=True)
    assert len(ph.forward) == len(ph.backward) == model.num_units
    assert all(len(r) == 2 for r in ph.forward + ph.backward)
    assert all(t >= 0 for r in ph.forward + ph.backward for t in r)
    split = profiled_split(model, 2, data=data, repeats=1, scheduler="gpipe", chunk_ptr=torch.tensor([0, n // 2, n]))
    assert split.num_stages == 2 and split.bounds[0] == 0 and split.bounds[-1] == model.num_units


def test_profiled_split_keeps_its_phases_per_stage_and_chunk():
    model = build_model("gcn", 8, 3, num_layers=2, hidden=8)
    data = sample()
    n = int(data.num_nodes)
    split = profiled_split(model, 2, data=data, repeats=1, chunk_ptr=torch.tensor([0, 9, n]))
    fwd, bwd = split.stage_phase_costs()
    assert len(fwd) == len(bwd) == 2 and all(len(r) == 2 for r in fwd + bwd)
    # per stage: forward + backward over its chunks = the stage cost used for the split
    for s in range(2):
        assert sum(fwd[s]) + sum(bwd[s]) == pytest.approx(split.stage_costs[s])
    assert P.split_layers(model, 2, "equal").stage_phase_costs() is None


@pytest.mark.parametrize("reduce,expected", [("min", 1.0), ("median", 3.0)])
def test_profile_reduce_min_or_median_over_passes(reduce, expected):
    """Every timed interval of pass r lasts durations[r] on a scripted clock (pass 0 is the untimed warm-up):
    the minimum takes the fastest pass per unit and phase, the median the typical one (the cost model's)."""
    model = build_model("gcn", 8, 3, num_layers=2, hidden=8)
    data = sample()
    per_pass = 4 * model.num_units  # two clock reads per unit and phase, one chunk
    durations = [100.0, 5.0, 1.0, 3.0]
    state = {"calls": 0, "t": 0.0}

    def clock():
        k = state["calls"]
        state["calls"] += 1
        if k % 2:  # the end of an interval
            state["t"] += durations[k // per_pass]
        return state["t"]

    ph = profile_unit_costs(model, data, repeats=3, phases=True, clock=clock, reduce=reduce)
    assert state["calls"] == per_pass * len(durations)
    assert ph.forward == [[expected]] * model.num_units
    assert ph.backward == [[expected]] * model.num_units
    with pytest.raises(ConfigError, match="reduce must be"):
        profile_unit_costs(model, data, repeats=1, reduce="mean")
