"""The epoch-time model's mechanisms as pure functions and on a small profile (no timing is asserted): the size
factor of the unit fits, the bound of ranks that share cores, the cost of a wait from the exchange probe's
rounds, the link fit, and that the runtime's measured costs (per message, graph parallelism's and a hybrid's
bookkeeping, the cost of a wait) enter a layout's predicted work and epoch by exactly the formulas."""

import math

import attrs
import numpy as np
import pytest

from gnnpipe import api
from gnnpipe.costmodel.hardware import Hardware, Link
from gnnpipe.costmodel.link import _fit_link
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.nodes.cost import Profile, profile
from gnnpipe.tasks.nodes.cost.epoch_bytes import predict_bytes
from gnnpipe.tasks.nodes.cost.epoch_time import predict_time
from gnnpipe.tasks.nodes.cost.host_costs import shared_cores_bound
from gnnpipe.tasks.nodes.cost.layouts import LayoutSpec, layout_config
from gnnpipe.tasks.nodes.cost.profile import (
    LINK_FIELDS,
    SWITCH_PROBE,
    UnitKind,
    link_fields,
    size_factor,
    switch_byte_cost,
    switch_costs,
)
from gnnpipe.tasks.nodes.runner import build_plan
from gnnpipe.tasks.nodes.trainer import make_model

from ..core.distutil import base_config


def test_size_factor_interpolates_in_log_rows_and_holds_at_the_ends():
    pts = [[100, 1.0], [1000, 2.0], [10000, 1.5]]
    assert size_factor([], 500) == 1.0
    assert size_factor(pts, 100) == pytest.approx(1.0) and size_factor(pts, 1000) == pytest.approx(2.0)
    assert size_factor(pts, math.sqrt(100 * 1000)) == pytest.approx(1.5)  # halfway in log(rows)
    assert size_factor(pts, 10) == pytest.approx(1.0) and size_factor(pts, 1e6) == pytest.approx(1.5)
    assert size_factor([[1000, 2.0], [100, 1.0]], 1000) == pytest.approx(2.0)  # order of the points does not matter


def test_unit_kind_time_applies_the_size_factor_and_the_plain_path():
    k = UnitKind(key="u", forward=[1.0, 0.01, 0.0, 0.0], backward=[0.0, 0.02, 0.0, 0.0], whole_forward_s=0.0,
                 whole_backward_s=0.0, saved_bytes_per_row=0.0, params=0, scale_forward=[[100, 2.0]],
                 scale_backward=[], unfused=1.25)
    f = np.array([1.0, 100.0, 5.0, 50.0])
    assert k.time(f, "F") == pytest.approx(2.0 * (1.0 + 1.0))
    assert k.time(f, "B") == pytest.approx(2.0)
    assert k.time(f, "F", fused=False) == pytest.approx(1.25 * 4.0)


def test_shared_cores_bound():
    # no more ranks than cores: every rank has its own core, the schedule decides
    assert shared_cores_bound([1.0, 2.0], [10, 10], [0, 0], 2, 0.5, 0.1) == 0.0
    # four ranks on two cores: (work + waits * switch + further peers * switch_peer) / cores
    got = shared_cores_bound([1.0, 2.0, 3.0, 4.0], [10, 20, 30, 40], [0, 1, 2, 3], 2, 0.01, 0.1)
    assert got == pytest.approx((10.0 + 100 * 0.01 + 6 * 0.1) / 2)
    assert shared_cores_bound([1.0, 1.0, 1.0], [0, 0, 0], [0, 0, 0], 2, 1.0, 1.0) == pytest.approx(1.5)
    # and the core time of the bytes each rank sends
    got = shared_cores_bound([1.0, 1.0, 1.0], [0, 0, 0], [0, 0, 0], 2, 1.0, 1.0, [1e6, 2e6, 3e6], 1e-9)
    assert got == pytest.approx((3.0 + 6e6 * 1e-9) / 2)
    # a wait's cost at each rank's compute per wait: interpolated in log(burst), held at the ends
    curve = [(0.008, 0.002), (0.002, 0.001)]
    got = shared_cores_bound([0.1, 0.8, 2.0], [100, 100, 100], [0, 0, 0], 2, 0.5, 0.0, switch_curve=curve)
    mid = 0.001 + 0.001 * math.log(0.004 / 0.002) / math.log(0.008 / 0.002)  # 0.8 s / 100 waits: halfway in log
    assert mid == pytest.approx(0.0015)
    assert got == pytest.approx((2.9 + 100 * (0.001 + 0.002 + 0.002)) / 2)  # 1 ms below, 8 ms and 20 ms above
    got = shared_cores_bound([0.4, 0.4, 0.4], [100, 100, 100], [0, 0, 0], 2, 0.5, 0.0, switch_curve=curve)
    assert got == pytest.approx((1.2 + 300 * mid) / 2)
    # one point is no curve: switch_s for every rank
    assert shared_cores_bound([1.0] * 3, [10] * 3, [0] * 3, 2, 0.5, 0.0, switch_curve=curve[:1]) == pytest.approx(
        (3.0 + 30 * 0.5) / 2)
    with pytest.raises(ConfigError, match="per rank"):
        shared_cores_bound([1.0, 1.0, 1.0], [0, 0], [0, 0, 0], 2, 0.0, 0.0)
    with pytest.raises(ConfigError, match="per rank"):
        shared_cores_bound([1.0, 1.0, 1.0], [0, 0, 0], [0, 0, 0], 2, 0.0, 0.0, [1.0], 1e-9)
    with pytest.raises(ConfigError, match="core"):
        shared_cores_bound([1.0], [0], [0], 0, 0.0, 0.0)


def test_switch_costs_from_synthetic_rounds():
    """4 ranks on 2 cores, 10 iterations per round: a round's lost core time is ``cores·wall − Σ CPU``; the ring
    gives the cost of a wait, the exchange with every rank its growth per further peer; the median round counts."""
    R, cores, iters = 4, 2, 10

    def rounds(walls, cpu_per_rank):
        return [[(w, cpu_per_rank) for w in walls] for _ in range(R)]

    # ring: each round 2 * 0.5 - 4 * 0.2 = 0.2 s lost over 40 waits -> 5 ms; an outlier round is ignored
    ring = rounds([0.5, 0.5, 3.0], 0.2)
    # all: 2 * 0.6 - 0.8 = 0.4 s -> 10 ms per wait -> (10 - 5) / (R - 2) = 2.5 ms per further peer
    every = rounds([0.6, 0.6, 0.6], 0.2)
    s, p = switch_costs(ring, every, cores, 0.0, iters)
    assert s == pytest.approx(0.005) and p == pytest.approx(0.0025)
    # two ranks: no further peers; a negative loss (faster than the cores allow: noise) is clipped at 0
    s2, p2 = switch_costs(rounds([0.1], 0.2)[:2], rounds([0.1], 0.2)[:2], cores, 0.0, iters)
    assert s2 == 0.0 and p2 == 0.0
    # the ring with 1 MiB messages: 2 * 0.9 - 0.8 = 1.0 s -> 25 ms per wait, 20 ms more than with 64 KiB
    large = rounds([0.9, 0.9, 0.9], 0.2)
    assert switch_byte_cost(ring, large, cores, iters, 65536, 1 << 20) == pytest.approx(0.02 / ((1 << 20) - 65536))
    assert switch_byte_cost(large, ring, cores, iters, 65536, 1 << 20) == 0.0  # faster with more bytes: noise
    with pytest.raises(ValueError, match="must exceed"):
        switch_byte_cost(ring, large, cores, iters, 1 << 20, 65536)


def test_link_fit_is_robust_to_one_erratic_size():
    pts = [(4, 50e-6, 0.0), (65536, 60e-6, 0.0), (1 << 20, 3e-3, 0.0), (8 << 20, 2.5e-3 + 50e-6, 0.0)]
    link = _fit_link(pts)
    assert link.latency_s == pytest.approx(50e-6)  # the smallest message's time, not a fitted intercept
    assert 1e9 < link.bandwidth_Bps < 1e10


def test_link_fields_and_profile_round_trip():
    raw = {"floor": 123, "msg_cpu": (2e-5, 1e-10), "ranks": 4, "switch": (7e-4, 1e-4, 1e-9),
           "switch_curve": [(0.002, 7e-4), (0.008, 1.2e-3)], "exchange": Link(2e-3, 1.5e9)}
    f = link_fields(Link(1e-5, 1e9), Link(2e-5, 5e8), raw)
    assert set(f) == set(LINK_FIELDS) and f["host_exchange"] == Link(2e-3, 1.5e9)
    assert f["switch_curve"] == [(0.002, 7e-4), (0.008, 1.2e-3)]
    assert (f["switch_s"], f["switch_peer_s"], f["switch_byte_s"], f["switch_ranks"],
            f["runtime_floor_bytes"]) == (7e-4, 1e-4, 1e-9, 4, 123)
    assert link_fields(Link(1e-5, 1e9), Link(2e-5, 5e8), dict(raw, switch=(7e-4, 1e-4)))["switch_byte_s"] == 0.0
    assert link_fields(Link(1e-5, 1e9), Link(2e-5, 5e8), {"floor": 1})["switch_ranks"] == 0  # not measured


@pytest.fixture(scope="module")
def tiny():
    cfg = base_config(model="gcnii", layers=4, hidden=8, num_nodes=400, avg_degree=6.0)
    data = api.load_data(cfg)
    return cfg, data, profile(cfg, data, repeats=1, link=False)


def test_profile_measures_the_runtime_costs(tiny):
    _, _, prof = tiny
    assert prof.action_overhead_s >= 0 and prof.gp_op_s >= 0 and prof.gp_op_s_per_elem >= 0
    assert prof.hybrid_op_s >= 0 and prof.hybrid_op_s_per_elem >= 0
    for k in prof.unit_kinds.values():  # one size factor per chunking and the whole graph
        assert len(k.scale_forward) == len(k.scale_backward) >= 2 and k.unfused > 0
    assert prof.switch_ranks == 0 and prof.msg_cpu_s == 0  # no link measured
    assert 0.5 <= prof.executor_scale <= 2.0 and prof.executor_scale != 1.0  # measured, within its clip
    d = prof.to_dict()
    for key in ("gp_op_s", "hybrid_op_s", "switch_s", "switch_byte_s", "msg_cpu_s", "host_exchange",
                "executor_scale"):  # older load
        d.pop(key)
    for k in d["unit_kinds"].values():
        k.pop("scale_forward"), k.pop("unfused")
    old = Profile.from_dict(d)
    assert old.switch_s == 0.0 and old.host_exchange is None and old.executor_scale == 1.0 \
        and all(k.unfused == 1.0 for k in old.unit_kinds.values())


def _predict(cfg, data, prof, spec, hw):
    c = layout_config(cfg, spec)
    plan = build_plan(c, data)
    model = make_model(c, plan.num_features, plan.num_classes)
    return c, plan, model, predict_time(c, plan, model, prof, hw)


def test_messages_and_bookkeeping_enter_the_work_exactly(tiny):
    cfg, data, base = tiny
    quiet = attrs.evolve(base, msg_cpu_s=0.0, msg_cpu_s_per_byte=0.0, gp_op_s=0.0, gp_op_s_per_elem=0.0,
                         hybrid_op_s=0.0, hybrid_op_s_per_elem=0.0, action_overhead_s=0.0, p2p=None, allreduce=None,
                         contention_ranks=0)  # contention scales the units with the demand: off, for exact sums
    hw = Hardware(name="8 cores", devices_per_node=8)
    # graph parallelism: each way pays gp_op_s per aggregation op and direction
    _, _, model, (_, _, _, w0) = _predict(cfg, data, quiet, LayoutSpec(2, 1, 2, 1, "gpipe"), hw)
    *_, (_, _, _, w1) = _predict(cfg, data, attrs.evolve(quiet, gp_op_s=1e-3), LayoutSpec(2, 1, 2, 1, "gpipe"), hw)
    back = {i for i, _, _ in model.backward_aggregation_dims()}
    dirs = sum(len(quiet.agg_dims[u]) * (2 if u in back else 1) for u in range(len(quiet.units)))
    assert dirs > 0 and np.allclose(np.array(w1) - np.array(w0), dirs * 1e-3)
    # a pipeline: every chunk action's messages (one received and one sent per boundary it has)
    spec = LayoutSpec(1, 2, 4, 1, "gpipe")
    *_, (_, _, _, p0) = _predict(cfg, data, quiet, spec, hw)
    *_, (_, _, _, p1) = _predict(cfg, data, attrs.evolve(quiet, msg_cpu_s=1e-3), spec, hw)
    assert np.allclose(np.array(p1) - np.array(p0), [2 * 4 * 1e-3, 2 * 4 * 1e-3])  # F sends, B receives: 8 each
    # a hybrid: its peer-op bookkeeping per op and direction of each of its chunk actions
    spec = LayoutSpec(2, 2, 8, 1, "gpipe")
    _, plan, model, (_, _, _, h0) = _predict(cfg, data, quiet, spec, hw)
    *_, (_, _, _, h1) = _predict(cfg, data, attrs.evolve(quiet, hybrid_op_s=1e-3), spec, hw)
    Cw = 4
    for r, (a, b) in enumerate(zip(h0, h1)):
        lo, hi = plan.bounds[r % 2], plan.bounds[r % 2 + 1]
        n = sum(len(quiet.agg_dims[u]) * (2 if u in back else 1) for u in range(lo, hi))
        assert b - a == pytest.approx(Cw * n * 1e-3)


def test_executor_scale_multiplies_a_pipelines_units_only(tiny):
    """``Profile.executor_scale`` (the pipeline executor over the fitted units) scales a pipeline's unit time
    exactly, and neither graph parallelism's nor a hybrid's (they run the plain path it was not measured on)."""
    cfg, data, base = tiny
    quiet = attrs.evolve(base, msg_cpu_s=0.0, msg_cpu_s_per_byte=0.0, gp_op_s=0.0, gp_op_s_per_elem=0.0,
                         hybrid_op_s=0.0, hybrid_op_s_per_elem=0.0, action_overhead_s=0.0, p2p=None, allreduce=None,
                         contention_ranks=0, executor_scale=1.0)
    hw = Hardware(name="8 cores", devices_per_node=8)
    pipe = LayoutSpec(1, 2, 4, 1, "gpipe")
    _, plan, model, (_, _, _, p0) = _predict(cfg, data, quiet, pipe, hw)
    *_, (_, _, _, p1) = _predict(cfg, data, attrs.evolve(quiet, executor_scale=0.8), pipe, hw)
    steps = [quiet.step_s_per_param * sum(quiet.kind(u).params for u in range(lo, hi))
             for lo, hi in zip(plan.bounds[:-1], plan.bounds[1:])]
    assert np.allclose(np.array(p1) - steps, 0.8 * (np.array(p0) - steps))
    for spec in (LayoutSpec(2, 1, 2, 1, "gpipe"), LayoutSpec(2, 2, 8, 1, "gpipe")):
        *_, (_, _, _, a) = _predict(cfg, data, quiet, spec, hw)
        *_, (_, _, _, b) = _predict(cfg, data, attrs.evolve(quiet, executor_scale=0.8), spec, hw)
        assert a == b


def test_an_exchange_takes_at_least_the_host_transport(tiny):
    """Graph parallelism's exchanges and a hybrid's peer exchanges take at least ``Profile.host_exchange`` on a CPU
    node (the wall time, not the ranks' CPU work); a link slower than it decides alone; a GPU node ignores it."""
    cfg, data, base = tiny
    quiet = attrs.evolve(base, contention_ranks=0, p2p=Link(0.0, 1e12), allreduce=Link(0.0, 1e12))
    hw = Hardware(name="8 cores", devices_per_node=8)
    gp = LayoutSpec(2, 1, 2, 1, "gpipe")
    _, _, model, (t0, _, _, w0) = _predict(cfg, data, quiet, gp, hw)
    floor = Link(0.01, 1e12)
    *_, (t1, _, _, w1) = _predict(cfg, data, attrs.evolve(quiet, host_exchange=floor), gp, hw)
    back = {i for i, _, _ in model.backward_aggregation_dims()}
    n_ex = sum(len(quiet.agg_dims[u]) * (2 if u in back else 1) for u in range(len(quiet.units)))
    assert n_ex > 0 and t1 - t0 == pytest.approx(n_ex * 0.01, rel=1e-6) and w1 == w0
    assert Profile.from_dict(attrs.evolve(quiet, host_exchange=floor).to_dict()).host_exchange == floor
    # a floor below the link's time changes nothing: the larger of the two, not their sum
    *_, (t2, _, _, _) = _predict(cfg, data, attrs.evolve(quiet, host_exchange=Link(1e-12, 1e15)), gp, hw)
    assert t2 == pytest.approx(t0, rel=1e-9)
    gpu = Hardware(name="8 GPUs", devices_per_node=8, kind="gpu")
    *_, (g0, _, _, _) = _predict(cfg, data, quiet, gp, gpu)
    *_, (g1, _, _, _) = _predict(cfg, data, attrs.evolve(quiet, host_exchange=floor), gp, gpu)
    assert g1 == pytest.approx(g0, rel=1e-9)
    # a hybrid's peer exchanges: the epoch grows, its ranks' CPU work does not
    hyb = LayoutSpec(2, 2, 8, 1, "gpipe")
    *_, (h0, _, _, hw0) = _predict(cfg, data, quiet, hyb, hw)
    *_, (h1, _, _, hw1) = _predict(cfg, data, attrs.evolve(quiet, host_exchange=floor), hyb, hw)
    assert h1 > h0 + 0.01 and np.allclose(hw1, hw0)


def test_ranks_sharing_cores_wait_at_a_cost(tiny):
    """Four ranks on a 2-core node: the epoch is at least (work + waits · switch) / cores, and grows with the
    measured cost of a wait; with a core per rank the cost of a wait does not apply."""
    cfg, data, base = tiny
    spec = LayoutSpec(1, 4, 8, 1, "1f1b")
    two = Hardware(name="2 cores", devices_per_node=2)
    four = Hardware(name="4 cores", devices_per_node=4)
    *_, (t0, _, _, work) = _predict(cfg, data, attrs.evolve(base, switch_s=0.0), spec, two)
    *_, (t1, _, _, _) = _predict(cfg, data, attrs.evolve(base, switch_s=0.01), spec, two)
    waits = 8 * (0 + 1) + 8 * 2 + 8 * 2 + 8 * (1 + 0)  # each stage's boundary receives per epoch
    assert t1 >= (sum(work) + waits * 0.01) / 2 - 1e-12 and t1 > t0
    # and the bytes the ranks send: the epoch's bytes at the measured core time per byte
    _, plan, model, (t4, _, _, _) = _predict(cfg, data, attrs.evolve(base, switch_s=0.01, switch_byte_s=1e-6),
                                             spec, two)
    sent = sum(predict_bytes(layout_config(cfg, spec), plan, model).values())
    assert sent > 0 and t4 >= (sum(work) + waits * 0.01 + sent * 1e-6) / 2 - 1e-12 and t4 > t1
    *_, (t2, _, _, _) = _predict(cfg, data, attrs.evolve(base, switch_s=0.01), spec, four)
    *_, (t3, _, _, _) = _predict(cfg, data, attrs.evolve(base, switch_s=0.0), spec, four)
    assert t2 == pytest.approx(t3)


def test_a_link_that_costs_the_host_cpu_per_byte_charges_its_messages(tiny):
    """A link's ``cpu_s_per_byte`` (a shaped link's kernel work, both ends together): each message's two ends pay
    half of it per byte where that is more than the profile's own per byte, in the ranks' work and so on the
    schedule's actions; four ranks on a 2-core node pay, per byte sent, the larger of the profile's per-byte core
    time and the link's in all (the work's share counted once)."""
    cfg, data, base = tiny
    spec = LayoutSpec(1, 4, 8, 1, "1f1b")
    prof = attrs.evolve(base, switch_s=0.01, switch_curve=[], switch_byte_s=1e-7, msg_cpu_s_per_byte=1e-10)

    def machine(cpu: float, cores: int = 2) -> Hardware:
        lk = Link(0.0, 1e12, cpu_s_per_byte=cpu)
        return Hardware(name=f"{cores} cores", devices_per_node=cores, intra=lk, inter=lk)

    _, plan, model, (t_none, _, _, work) = _predict(cfg, data, prof, spec, machine(0.0))
    sent = sum(predict_bytes(layout_config(cfg, spec), plan, model).values())
    *_, (t_low, _, _, work_low) = _predict(cfg, data, prof, spec, machine(1e-8))
    assert sum(work_low) - sum(work) == pytest.approx(sent * (1e-8 - 2e-10), rel=1e-6)  # both ends, above 1e-10
    assert t_low == pytest.approx(t_none, rel=1e-12)  # below the profile's core time per byte: that one holds
    *_, (t_high, _, _, work_high) = _predict(cfg, data, prof, spec, machine(1e-5))
    assert sum(work_high) - sum(work) == pytest.approx(sent * (1e-5 - 2e-10), rel=1e-6)
    waits = 8 * (0 + 1) + 8 * 2 + 8 * 2 + 8 * (1 + 0)  # each stage's boundary receives per epoch
    assert sent > 0 and t_high == pytest.approx((sum(work) + waits * 0.01 + sent * 1e-5) / 2, rel=1e-9)
    # a core per rank: no sharing bound, but the messages' CPU lengthens the schedule
    *_, (f0, _, _, _) = _predict(cfg, data, prof, spec, machine(0.0, cores=4))
    *_, (f1, _, _, _) = _predict(cfg, data, prof, spec, machine(1e-5, cores=4))
    assert f1 > f0
    # below the profile's own per byte, a link adds nothing
    *_, (f2, _, _, w2) = _predict(cfg, data, prof, spec, machine(1e-10, cores=4))
    assert f2 == pytest.approx(f0, rel=1e-12) and w2 == work


@pytest.mark.timeout(120)
def test_link_probe_measures_every_size_and_a_positive_link():
    """The two-rank ping-pong (``profile_link``) over gloo: one point per message size (one-way wall and CPU
    seconds), the smallest size timed once more after the stream (the lesser median is kept), a fitted link with
    a positive latency and bandwidth, the main thread's CPU per streamed message, and the host's exchange."""
    from gnnpipe.tasks.nodes.cost.profile import profile_link

    sizes = (4, 65536, 1 << 20)
    p2p, allreduce, raw = profile_link(sizes=sizes, reps=3, timeout_s=60)
    assert [b for b, _, _ in raw["p2p"]] == [4, 65536, 1 << 20]
    assert all(w > 0 and c >= 0 for _, w, c in raw["p2p"])
    assert len(raw["allreduce"]) == len(sizes)
    assert [b for b, _ in raw["stream"]["send"]] == [65536, 1 << 20, 4 << 20] and len(raw["stream"]["recv"]) == 3
    assert p2p.latency_s > 0 and p2p.bandwidth_Bps > 0
    assert allreduce.latency_s > 0 and allreduce.bandwidth_Bps > 0
    # the host's batched exchange after a burst of compute, carried into the profile's fields
    assert raw["exchange"].latency_s > 0 and raw["exchange"].bandwidth_Bps > 0
    assert link_fields(p2p, allreduce, raw)["host_exchange"] == raw["exchange"]


@pytest.mark.timeout(180)
def test_link_probe_with_more_ranks_than_cores_measures_what_sharing_costs():
    """With more ranks than cores the probe also runs the exchange rounds: the core time lost per wait (after a
    short and a long burst of compute), per further peer and per byte sent, all >= 0 and carried into the profile's
    fields."""
    from gnnpipe.tasks.nodes.cost.profile import profile_link
    from gnnpipe.tasks.nodes.cost.profile.contention import cores_here

    cores = cores_here()
    if cores > 3:
        pytest.skip("more than 3 cores: the probe would start a rank per core and one more")
    p2p, allreduce, raw = profile_link(sizes=(4, 65536), reps=2, timeout_s=90, ranks=cores + 1)
    assert len(raw["switch"]) == 3 and all(v >= 0 for v in raw["switch"])
    f = link_fields(p2p, allreduce, raw)
    assert f["switch_ranks"] == cores + 1 and (f["switch_s"], f["switch_peer_s"], f["switch_byte_s"]) == raw["switch"]
    # the ring after a short and a long burst of compute: switch_s is the short one's
    assert [w for w, _ in f["switch_curve"]] == [SWITCH_PROBE["work_s"], SWITCH_PROBE["work_long_s"]]
    assert f["switch_curve"][0][1] == f["switch_s"] and f["switch_curve"][1][1] >= 0


def test_unfused_ratio_is_the_median_of_back_to_back_rounds(monkeypatch):
    """A slow stretch of the machine during one pass moves one round's ratio, not the profile's: the ratio is the
    median over rounds of a plain pass over the fused pass run just before it."""
    import types

    from gnnpipe.tasks.nodes.cost.profile import measure

    plain = iter([2.0, 40.0, 1.5, 2.2, 0.1])  # unit 1's plain pass of each round; its fused pass takes 1 s
    calls = []

    def fake(model, data, ptr, repeats, fused=True):
        calls.append(fused)
        t = 1.0 if fused else next(plain)
        return types.SimpleNamespace(forward=[[9.0], [t / 2]], backward=[[9.0], [t / 2]])

    monkeypatch.setattr(measure, "_units_cpu", fake)
    got = measure._unfused_ratios(None, None, [0, 1], {"GCNIILayer": 1}, 5)
    assert got == {"GCNIILayer": pytest.approx(2.0)}
    assert calls == [True, False] * 5  # interleaved: each plain pass right after a fused one
