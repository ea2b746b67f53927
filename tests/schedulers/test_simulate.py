"""The discrete-event simulator: textbook numbers, costs, communication, memory and deadlocks."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnpipe import schedulers as gs
from gnnpipe.errors import ConfigError, ScheduleError
from gnnpipe.schedulers import Schedule

SIZES = [(1, 1), (1, 5), (2, 1), (2, 3), (3, 1), (4, 2), (4, 4), (4, 8), (5, 3), (8, 16)]


@pytest.mark.parametrize("S, C", SIZES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_flush_schedules_textbook_makespan_and_bubble(name, S, C):
    res = gs.simulate(gs.build_schedule(name, S, C))
    assert res.makespan == 2 * (C + S - 1)
    for b in res.bubble_fraction:
        assert b == pytest.approx((S - 1) / (C + S - 1))
    assert res.mean_bubble == pytest.approx((S - 1) / (C + S - 1))
    assert res.compute_time == [2 * C] * S


@pytest.mark.parametrize("S, C", SIZES)
def test_peak_inflight_chunks(S, C):
    assert gs.simulate(gs.build_schedule("gpipe", S, C)).peak_inflight == [C] * S
    one = gs.simulate(gs.build_schedule("1f1b", S, C)).peak_inflight
    assert one == [min(S - s, C) for s in range(S)]
    assert max(one) <= S


@pytest.mark.parametrize("S, C", [(4, 8), (4, 2), (3, 3), (2, 5), (5, 1)])
def test_async_stale_steady_state_bubble_is_zero(S, C):
    skip = math.ceil(S / C)  # epochs the first fill reaches into
    E = max(5, 2 * skip + 1)
    res = gs.simulate(gs.build_schedule("async-stale", S, C, epochs=E, order="shuffle", seed=1))
    assert max(res.steady_state_bubble()) == pytest.approx(0.0, abs=1e-12)
    assert max(res.steady_state_bubble(skip=skip)) == pytest.approx(0.0, abs=1e-12)
    # the same sizes with a flush keep the textbook bubble every epoch
    for name in ("gpipe", "1f1b"):
        flush = gs.simulate(gs.build_schedule(name, S, C, epochs=E, order="shuffle", seed=1))
        for b in flush.steady_state_bubble(skip=1):
            assert b == pytest.approx((S - 1) / (C + S - 1))
        for e in range(E):
            assert flush.epoch_bubble(e) == pytest.approx([(S - 1) / (C + S - 1)] * S)
        assert flush.makespan == E * 2 * (C + S - 1)
    # over the whole run async-stale only pays one fill and one drain
    assert res.makespan == E * 2 * C + 2 * (S - 1)


def test_steady_state_needs_enough_epochs():
    res = gs.simulate(gs.build_schedule("async-stale", 2, 2, epochs=2))
    with pytest.raises(ConfigError, match="at least 3 epochs"):
        res.steady_state_bubble()
    with pytest.raises(ConfigError, match="at least 5 epochs"):
        gs.simulate(gs.build_schedule("async-stale", 4, 2, epochs=4)).steady_state_bubble()
    # skip=1 is too early when C < S: stage 0 is still filling during epoch 1
    res = gs.simulate(gs.build_schedule("async-stale", 4, 2, epochs=5))
    assert res.steady_state_bubble(skip=1)[0] > 0 and res.steady_state_bubble() == pytest.approx([0.0] * 4)


def test_weight_versions_with_stashing():
    plain = gs.simulate(gs.build_schedule("async-stale", 4, 8, epochs=3))
    stash = gs.simulate(gs.build_schedule("async-stale", 4, 8, epochs=3, stash_weights=True))
    assert plain.peak_weight_versions == [1, 1, 1, 1]
    assert stash.peak_weight_versions == [2, 2, 2, 1]  # the last stage never runs ahead
    assert gs.simulate(gs.build_schedule("gpipe", 4, 8, epochs=3)).peak_weight_versions == [1] * 4


def test_costs_per_stage_and_chunk():
    costs = gs.CostModel(forward=1.0, backward=2.0, step=0.5, stage_scale=[2.0], chunk_scale=[1.0, 3.0])
    res = gs.simulate(gs.build_schedule("gpipe", 1, 2), costs)
    # F: 2·1 + 2·3, B: 4·1 + 4·3, STEP: 0.5·2
    assert res.makespan == pytest.approx(8 + 16 + 1)
    durations = {str(iv.action): iv.end - iv.start for iv in res.intervals[0]}
    assert durations == {"0F0": 2, "0F1": 6, "0B1": 12, "0B0": 4, "0S": 1}


def test_costs_from_graph_and_other_forms():
    ptr = [0, 2, 4]
    ei = [[1, 0, 2, 3, 0, 1], [0, 1, 3, 2, 2, 3]]  # chunk 0: 2 in-edges, chunk 1: 4
    cm = gs.CostModel.from_graph(ptr, ei, stage_units=[1, 3], forward=1.0, backward=2.0)
    assert cm.chunk_scale == pytest.approx([2 / 3, 4 / 3])
    assert cm(gs.F(1, 1)) == pytest.approx(3 * 4 / 3) and cm(gs.B(0, 0)) == pytest.approx(2 * 2 / 3)
    sch = gs.build_schedule("1f1b", 2, 2)
    assert gs.simulate(sch, 2.0).makespan == 2 * gs.simulate(sch).makespan
    assert gs.simulate(sch, {"F": 1, "B": 2}).makespan == gs.simulate(sch, gs.CostModel(1, 2)).makespan
    assert gs.simulate(sch, lambda a: 1.0).makespan == 6 + 1  # the callable makes the step cost 1 too
    with pytest.raises(ConfigError):
        gs.simulate(sch, "fast")
    with pytest.raises(ScheduleError, match="non-negative"):
        gs.simulate(sch, lambda a: -1.0)
    with pytest.raises(ConfigError, match="no cost"):
        gs.simulate(sch, gs.CostModel(stage_scale=[1.0]))


def test_communication_with_and_without_overlap():
    sch = gs.build_schedule("gpipe", 2, 2)
    comm = gs.CommModel(bytes_per_chunk=1.0, bandwidth=1.0)
    over = gs.simulate(sch, comm=comm)
    # 0F0[0,1] send[1,2]; 0F1[1,2] send[2,3]; 1F0[2,3]; 1F1[3,4]; 1B1[4,5] send[5,6]; 1B0[5,6] send[6,7];
    # 0B1[6,7]; 0B0[7,8]
    assert over.makespan == 8
    assert [(t.src, t.dst, str(t.action), t.start, t.end) for t in over.transfers] == [
        (0, 1, "0F0", 1, 2), (0, 1, "0F1", 2, 3), (1, 0, "1B1", 5, 6), (1, 0, "1B0", 6, 7)]
    no = gs.simulate(sch, comm=gs.CommModel(1.0, 1.0, overlap=False))
    # the sender waits for each send: 0F0[0,1]+send→2; 0F1[2,3]+send→4; 1F1[4,5]; 1B1[5,6]+send→7;
    # 1B0[7,8]+send→9; 0B1[7,8]; 0B0[9,10]
    assert no.makespan == 10
    assert no.comm_blocked == [2, 2]
    lat = gs.simulate(sch, comm=gs.CommModel(latency=0.5))
    assert lat.makespan == 2 * (2 + 2 - 1) + 2 * 0.5
    per_chunk = gs.simulate(sch, comm=gs.CommModel([2.0, 0.0], bandwidth=2.0))
    assert [t.end - t.start for t in per_chunk.transfers if t.action.chunk == 0] == [1.0, 1.0]
    with pytest.raises(ConfigError):
        gs.CommModel(bandwidth=0)


def test_comm_from_chunks_uses_fp32_boundary_bytes():
    comm = gs.CommModel.from_chunks([0, 10, 30], dim=8, bandwidth=1e3)
    assert comm.bytes_per_chunk == [10 * 8 * 4, 20 * 8 * 4]
    assert comm.time(0, 1, gs.F(0, 1)) == pytest.approx(0.64)


def test_deadlock_is_detected_and_named():
    sch = Schedule(2, 2, [["0F0", "0B0", "0F1", "0B1", "0S"], ["1F1", "1F0", "1B0", "1B1", "1S"]])
    with pytest.raises(ScheduleError) as ei:
        gs.simulate(sch)
    msg = str(ei.value)
    assert "deadlock" in msg
    assert "stage 0 is stuck at 0B0 (slot 1), waiting for 1B0 (stage 1 is stuck at 1F1 before it)" in msg
    assert "stage 1 is stuck at 1F1 (slot 0), waiting for 0F1 (stage 0 is stuck at 0B0 before it)" in msg
    assert "[0B0]!" in msg and "[1F1]!" in msg
    assert sorted(map(str, ei.value.stuck)) == ["0B0", "1F1"]


def test_deadlock_on_a_missing_action():
    sch = Schedule(2, 1, [["0F0", "0B0", "0S"], ["1F0", "1S"]])
    with pytest.raises(ScheduleError, match="waiting for 1B0, which is not in the schedule"):
        gs.simulate(sch)


def test_simulator_ignores_idle_slots_and_runs_custom_schedules():
    compact = Schedule(2, 2, [["0F0", "0F1", "0B1", "0B0", "0S"], ["1F0", "1F1", "1B1", "1B0", "1S"]])
    with pytest.raises(ScheduleError):
        gs.validate(compact)  # not a valid time grid...
    res = gs.simulate(compact)  # ...but it executes like gpipe
    assert res.makespan == gs.simulate(gs.build_schedule("gpipe", 2, 2)).makespan


def test_result_summary_and_text():
    res = gs.simulate(gs.build_schedule("async-stale", 3, 3, epochs=3))
    d = res.summary()
    assert d["makespan"] == res.makespan and len(d["bubble_fraction"]) == 3 and "steady_state_bubble" in d
    text = res.to_text()
    assert "makespan" in text and "peak in-flight" in text and "steady bubble" in text


@settings(max_examples=25, deadline=None)
@given(S=st.integers(1, 5), C=st.integers(1, 9), seed=st.integers(0, 10_000), E=st.integers(1, 3),
       name=st.sampled_from(["gpipe", "1f1b", "async-stale"]))
def test_builtins_always_valid_and_deadlock_free(S, C, seed, E, name):
    sch = gs.build_schedule(name, S, C, epochs=E, order="shuffle", seed=seed)
    res = gs.simulate(sch, gs.CostModel(1.0, 2.0, 0.1))
    assert sum(len(r) for r in res.intervals) == E * S * (2 * C + 1)
    if name != "async-stale":
        assert res.makespan == pytest.approx(E * (3 * (C + S - 1) + 0.1))
    assert all(0 <= b < 1 or math.isclose(b, 0) for b in res.bubble_fraction)
