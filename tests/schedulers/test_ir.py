"""The schedule IR: action text codec, Schedule construction and CSV round trips."""

import pytest

from gnnpipe import schedulers as gs
from gnnpipe.errors import ConfigError, ScheduleError
from gnnpipe.schedulers import Action, ActionKind, Schedule


@pytest.mark.parametrize(
    "text, action",
    [
        ("2F0", Action(2, ActionKind.F, 0)),
        ("1B3", Action(1, ActionKind.B, 3)),
        ("0S", Action(0, ActionKind.STEP)),
        ("12F105", Action(12, ActionKind.F, 105)),
        ("0F3@1", Action(0, ActionKind.F, 3, epoch=1)),
        ("3S@7", Action(3, ActionKind.STEP, None, 7)),
    ],
)
def test_action_text_round_trip(text, action):
    assert Action.parse(text) == action
    assert str(action) == text
    assert Action.parse(str(action)) == action


def test_action_kind_accepts_codes_and_names():
    assert Action(0, "F", 1).kind is ActionKind.F
    assert Action(0, "STEP").kind is ActionKind.STEP
    assert Action(0, "S").kind is ActionKind.STEP
    assert ActionKind.STEP.name == "STEP" and ActionKind.STEP.value == "S"


@pytest.mark.parametrize("text", ["", "F0", "0X1", "0F", "0B", "0S1", "-1F0", "0F0@", "0F0 1B1", "0FOO"])
def test_action_parse_errors(text):
    with pytest.raises(ScheduleError):
        Action.parse(text)


def test_action_parse_error_message_shows_format():
    with pytest.raises(ScheduleError, match=r"e\.g\. '2F0'"):
        Action.parse("zz")


@pytest.mark.parametrize(
    "kwargs",
    [{"stage": 0, "kind": "F"}, {"stage": 0, "kind": "B", "chunk": -1}, {"stage": 0, "kind": "S", "chunk": 0},
     {"stage": -1, "kind": "F", "chunk": 0}, {"stage": 0, "kind": "F", "chunk": 0, "epoch": -1},
     {"stage": 0, "kind": "Q", "chunk": 0}, {"stage": 0, "kind": "F", "chunk": True}],
)
def test_action_rejects_bad_fields(kwargs):
    with pytest.raises(ScheduleError):
        Action(**kwargs)


def test_actions_are_hashable_and_keyed():
    a, b = Action(1, "F", 2), Action.parse("1F2")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.key == (ActionKind.F, 1, 2, 0)
    assert a.with_epoch(3) == Action.parse("1F2@3")


def test_schedule_accepts_strings_and_checks_rows():
    sch = Schedule(2, 1, [["0F0", "", "", "0B0", "0S"], ["", "1F0", "1B0", "1S"]])
    assert sch.stages[0][1] is None and sch.stages[1][1] == Action(1, "F", 0)
    assert sch.num_slots == 5
    assert sch.actions(1) == [Action(1, "F", 0), Action(1, "B", 0), Action(1, "S")]
    with pytest.raises(ScheduleError, match="needs 3 rows"):
        Schedule(3, 1, [["0F0"]])
    with pytest.raises(ScheduleError, match="must be an Action"):
        Schedule(1, 1, [[42]])


def test_from_orders_places_on_unit_grid():
    orders = [["0F0", "0F1", "0B1", "0B0", "0S"], ["1F0", "1F1", "1B1", "1B0", "1S"]]
    sch = Schedule.from_orders(2, 2, orders)
    assert gs.to_csv(sch).splitlines() == ["0F0,0F1,,,0B1,0B0,0S", ",1F0,1F1,1B1,1B0,1S"]


def test_from_orders_deadlock_names_stuck_actions():
    orders = [["0F0", "0B0", "0F1", "0B1", "0S"], ["1F1", "1F0", "1B0", "1B1", "1S"]]
    with pytest.raises(ScheduleError, match="deadlock") as ei:
        Schedule.from_orders(2, 2, orders)
    msg = str(ei.value)
    assert "stuck at 0B0" in msg and "stuck at 1F1" in msg
    assert set(map(str, ei.value.stuck)) == {"0B0", "1F1"}


def test_check_chunk_order():
    assert gs.check_chunk_order(2, (2, 0, 1)) == [2, 0, 1]
    for bad in ([], [0, 0], [1, 2], [0, "1"]):
        with pytest.raises(ConfigError):
            gs.check_chunk_order(2, bad)
    with pytest.raises(ConfigError):
        gs.check_chunk_order(0, [0])


# -- CSV --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "async-stale"])
@pytest.mark.parametrize("S, C, E", [(4, 8, 1), (3, 2, 1), (1, 3, 1), (3, 1, 1), (3, 4, 3)])
def test_csv_round_trip(tmp_path, name, S, C, E):
    sch = gs.build_schedule(name, S, C, epochs=E, order="shuffle", seed=3)
    path = tmp_path / "s.csv"
    text = gs.to_csv(sch, path)
    back = gs.from_csv(path, flush=sch.flush, weight_staleness=sch.weight_staleness)
    assert back.stages == sch.stages
    assert (back.num_stages, back.num_chunks, back.epochs) == (S, C, E)
    assert back == sch
    assert gs.from_csv(text=text, flush=sch.flush, weight_staleness=sch.weight_staleness) == sch
    gs.validate(back)


def test_csv_is_one_row_per_stage_with_empty_idle_cells():
    sch = gs.build_schedule("gpipe", 2, 2)
    rows = gs.to_csv(sch).splitlines()
    assert rows == ["0F0,0F1,,,0B1,0B0,0S", ",1F0,1F1,1B1,1B0,1S"]
    assert gs.to_csv(sch, steps=False).splitlines() == ["0F0,0F1,,,0B1,0B0,", ",1F0,1F1,1B1,1B0,"]


def test_csv_compatible_with_torch_pipelining_actions():
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    parse = getattr(schedules._Action, "from_str", None)
    if parse is None:
        pytest.skip("this torch has no _Action.from_str")
    sch = gs.build_schedule("1f1b", 4, 8)
    for row_i, line in enumerate(gs.to_csv(sch, steps=False).splitlines()):
        for cell in line.split(","):
            a = parse(cell)
            if cell == "":
                assert a is None
                continue
            ours = Action.parse(cell)
            assert (a.stage_index, a.computation_type.value, a.microbatch_index) == (
                ours.stage, ours.kind.value, ours.chunk)
            assert a.stage_index == row_i


def test_from_csv_reads_a_torch_style_file_and_adds_steps():
    # what torch's _dump_csv writes for a 2-rank 1F1B with 2 microbatches: no optimizer step
    text = "0F0,0F1,,,0B0,,0B1\r\n,1F0,1B0,1F1,1B1\r\n"
    sch = gs.from_csv(text=text, add_steps=True)
    assert sch.actions(0)[-1] == Action(0, "S") and sch.actions(1)[-1] == Action(1, "S")
    gs.validate(sch)
    with pytest.raises(ScheduleError, match="has no optimizer step"):
        gs.validate(gs.from_csv(text=text))


def test_from_csv_errors(tmp_path):
    with pytest.raises(ScheduleError, match=r"row 1 .*column 2"):
        gs.from_csv(text="0F0\r\n,1F0,oops\r\n")
    with pytest.raises(ConfigError):
        gs.from_csv()
    with pytest.raises(ConfigError):
        gs.from_csv(text="")
    with pytest.raises(ConfigError):
        gs.from_csv(text="0F0@1\r\n", add_steps=True)


def test_weight_versions_and_staleness():
    sch = gs.build_schedule("async-stale", 3, 2, epochs=3)
    versions = sch.weight_versions()
    assert versions[Action.parse("0F0@1").key] == 0  # runs before stage 0's first step
    assert versions[Action.parse("2F0@1").key] == 1  # the last stage never runs ahead
    assert sch.max_weight_staleness() == 1
    assert gs.build_schedule("gpipe", 3, 2, epochs=3).max_weight_staleness() == 0
