"""Golden action orders and grids of the built-in schedulers (gpipe, 1f1b, async-stale).

The expected values were derived by hand from the rules in the docstrings (GPipe: Huang et al. 2019
with GNNPipe's reverse backward; 1F1B/PipeDream-Flush: Narayanan et al. 2021), not copied from the code.
"""

import pytest

from gnnpipe import schedulers as gs
from gnnpipe.errors import ConfigError


def orders(sch):
    return [" ".join(map(str, sch.actions(s))) for s in range(sch.num_stages)]


def grid(sch):
    return gs.to_csv(sch).splitlines()


# -- gpipe ------------------------------------------------------------------------------------------
def test_gpipe_S2_C3():
    sch = gs.get("gpipe")().build(2, [0, 1, 2])
    assert orders(sch) == ["0F0 0F1 0F2 0B2 0B1 0B0 0S", "1F0 1F1 1F2 1B2 1B1 1B0 1S"]
    assert grid(sch) == ["0F0,0F1,0F2,,,0B2,0B1,0B0,0S", ",1F0,1F1,1F2,1B2,1B1,1B0,1S"]


def test_gpipe_backward_is_reverse_of_shuffled_forward_order():
    sch = gs.get("gpipe")().build(3, [2, 0, 3, 1])
    for s in range(3):
        assert orders(sch)[s] == f"{s}F2 {s}F0 {s}F3 {s}F1 {s}B1 {s}B3 {s}B0 {s}B2 {s}S"


def test_gpipe_C1_S3():
    sch = gs.get("gpipe")().build(3, [0])
    assert grid(sch) == ["0F0,,,,,0B0,0S", ",1F0,,,1B0,1S", ",,2F0,2B0,2S"]


def test_gpipe_S1_C3():
    sch = gs.get("gpipe")().build(1, [0, 1, 2])
    assert grid(sch) == ["0F0,0F1,0F2,0B2,0B1,0B0,0S"]


def test_gpipe_C_less_than_S():
    sch = gs.get("gpipe")().build(4, [1, 0])
    assert orders(sch) == [f"{s}F1 {s}F0 {s}B0 {s}B1 {s}S" for s in range(4)]
    assert grid(sch)[0] == "0F1,0F0," + ","*6 + "0B0,0B1,0S"  # idle slots 2..7
    assert grid(sch)[3] == ",,,3F1,3F0,3B0,3B1,3S"


# -- 1f1b -------------------------------------------------------------------------------------------
def test_1f1b_S4_C8_orders():
    sch = gs.get("1f1b")().build(4, range(8))
    assert orders(sch) == [
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7 0S",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7 1S",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7 2S",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7 3S",
    ]


def test_1f1b_S4_C8_grid():
    sch = gs.get("1f1b")().build(4, range(8))
    assert grid(sch) == [
        "0F0,0F1,0F2,0F3,,,,0B0,0F4,0B1,0F5,0B2,0F6,0B3,0F7,0B4,,0B5,,0B6,,0B7,0S",
        ",1F0,1F1,1F2,,,1B0,1F3,1B1,1F4,1B2,1F5,1B3,1F6,1B4,1F7,1B5,,1B6,,1B7,1S",
        ",,2F0,2F1,,2B0,2F2,2B1,2F3,2B2,2F4,2B3,2F5,2B4,2F6,2B5,2F7,2B6,,2B7,2S",
        ",,,3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3,3F4,3B4,3F5,3B5,3F6,3B6,3F7,3B7,3S",
    ]


def test_1f1b_fewer_chunks_than_stages():
    sch = gs.get("1f1b")().build(4, [0, 1])
    assert orders(sch) == [
        "0F0 0F1 0B0 0B1 0S",
        "1F0 1F1 1B0 1B1 1S",
        "2F0 2F1 2B0 2B1 2S",
        "3F0 3B0 3F1 3B1 3S",
    ]
    gs.validate(sch)


def test_1f1b_one_chunk_and_one_stage():
    assert orders(gs.get("1f1b")().build(3, [0])) == ["0F0 0B0 0S", "1F0 1B0 1S", "2F0 2B0 2S"]
    assert grid(gs.get("1f1b")().build(1, [2, 0, 1])) == ["0F2,0B2,0F0,0B0,0F1,0B1,0S"]


def test_1f1b_backward_follows_forward_order():
    sch = gs.get("1f1b")().build(2, [3, 1, 0, 2])
    assert orders(sch) == ["0F3 0F1 0B3 0F0 0B1 0F2 0B0 0B2 0S", "1F3 1B3 1F1 1B1 1F0 1B0 1F2 1B2 1S"]


# -- async-stale ------------------------------------------------------------------------------------
def test_async_single_epoch_is_1f1b_order_without_flush():
    a = gs.get("async-stale")().build(4, range(8))
    b = gs.get("1f1b")().build(4, range(8))
    assert a.stages == b.stages
    assert a.flush is False and b.flush is True
    assert a.weight_staleness == 1 and b.weight_staleness == 0


def test_async_two_epochs_interleave():
    sch = gs.get("async-stale")().build_epochs(3, [[0, 1], [1, 0]])
    assert orders(sch) == [
        "0F0 0F1 0F1@1 0B0 0F0@1 0B1 0S 0B1@1 0B0@1 0S@1",
        "1F0 1F1 1B0 1F1@1 1B1 1S 1F0@1 1B1@1 1B0@1 1S@1",
        "2F0 2B0 2F1 2B1 2S 2F1@1 2B1@1 2F0@1 2B0@1 2S@1",
    ]
    assert sch.epochs == 2 and not sch.flush
    gs.validate(sch)


@pytest.mark.parametrize("S, C, bound", [(4, 8, 1), (4, 3, 1), (4, 2, 2), (4, 1, 3), (3, 2, 1), (1, 4, 0), (2, 1, 1)])
def test_async_staleness_bound_is_declared_and_tight(S, C, bound):
    sch = gs.get("async-stale")()
    assert sch.staleness_bound(S, C) == bound
    built = sch.build_epochs(S, [list(range(C))] * 5)
    assert built.weight_staleness == bound
    assert built.max_weight_staleness() == bound
    gs.validate(built)


def test_async_stash_weights_option():
    sch = gs.build_schedule("async-stale", 4, 4, epochs=3, stash_weights=True)
    assert sch.stash_weights is True
    assert gs.make_scheduler("async-stale", stash_weights=True).stash_weights
    with pytest.raises(ConfigError, match="nothing to stash"):
        gs.make_scheduler("gpipe", stash_weights=True)


# -- flush multi-epoch and orders -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_flush_multi_epoch_starts_after_every_step(name):
    sch = gs.build_schedule(name, 3, 4, epochs=3, order="shuffle", seed=7)
    slots = sch.slot_index()
    for e in range(1, 3):
        last_step = max(slots[gs.STEP(s, e - 1).key][1] for s in range(3))
        first = min(t for s, t, a in sch.iter_slots() if a.epoch == e)
        assert first > last_step
        order = gs.ShuffledOrder(7).order(e, 4)
        assert [a.chunk for a in sch.actions(0) if a.epoch == e and a.kind is gs.ActionKind.F] == order


def test_step_once_per_stage_per_epoch_at_the_end():
    for name in ("gpipe", "1f1b", "async-stale"):
        sch = gs.build_schedule(name, 3, 5, epochs=2)
        for s in range(3):
            acts = sch.actions(s)
            steps = [i for i, a in enumerate(acts) if a.kind is gs.ActionKind.STEP]
            assert [acts[i].epoch for i in steps] == [0, 1]
            assert steps[-1] == len(acts) - 1


def test_orders_are_identical_per_epoch_and_seeded():
    pol = gs.ShuffledOrder(seed=5)
    assert pol.order(3, 10) == gs.ShuffledOrder(seed=5).order(3, 10)
    assert sorted(pol.order(3, 10)) == list(range(10))
    assert len({tuple(pol.order(e, 10)) for e in range(20)}) > 15
    assert gs.ShuffledOrder(6).order(3, 10) != pol.order(3, 10)
    assert gs.FixedOrder().order(4, 3) == [0, 1, 2]
    assert gs.FixedOrder([2, 0, 1]).order(9, 3) == [2, 0, 1]
    with pytest.raises(ConfigError):
        gs.FixedOrder([0, 2])
    with pytest.raises(ConfigError):
        gs.FixedOrder([1, 0]).order(0, 3)
    with pytest.raises(ConfigError):
        gs.order_policy("zigzag")


def test_shuffled_order_is_the_same_in_another_process():
    import os
    import subprocess
    import sys

    code = "from gnnpipe.schedulers.order import ShuffledOrder; print(ShuffledOrder(11).order(4, 12))"
    env = dict(os.environ, PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == str(gs.ShuffledOrder(11).order(4, 12))


# -- registry ---------------------------------------------------------------------------------------
def test_registry_holds_builtins():
    assert {"gpipe", "1f1b", "async-stale"} <= set(gs.available())
    assert gs.get("gpipe") is gs.GPipe and gs.get("1f1b") is gs.OneFOneB and gs.get("async-stale") is gs.AsyncStale
    assert gs.GPipe().name == "gpipe" and gs.build_schedule("1f1b", 2, 2).name == "1f1b"


def test_registry_errors():
    from gnnpipe.errors import UnknownComponentError

    with pytest.raises(UnknownComponentError, match="available: .*1f1b"):
        gs.get("pipedream-2bw")
    with pytest.raises(ConfigError, match="subclass ChunkScheduler"):
        gs.register("not-a-scheduler")(dict)
    with pytest.raises(ConfigError, match="already registered"):
        gs.register("gpipe")(type("Other", (gs.GPipe,), {}))
    with pytest.raises(ConfigError, match="does not take options"):
        gs.make_scheduler("gpipe", warmup=3)
    with pytest.raises(TypeError):
        gs.ChunkScheduler()  # abstract


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "async-stale"])
def test_bad_inputs(name):
    with pytest.raises(ConfigError):
        gs.get(name)().build(0, [0])
    with pytest.raises(ConfigError):
        gs.get(name)().build(2, [0, 2])
    with pytest.raises(ConfigError):
        gs.get(name)().build_epochs(2, [[0, 1], [0]])
