"""The validator rejects each kind of malformed schedule with a clear message and a marked grid."""

import pytest

from gnnpipe import schedulers as gs
from gnnpipe.errors import ScheduleError
from gnnpipe.schedulers import Schedule


def gpipe_rows():
    # gpipe, S=2, C=2 on the unit grid
    return [["0F0", "0F1", "", "", "0B1", "0B0", "0S"], ["", "1F0", "1F1", "1B1", "1B0", "1S"]]


def make(rows, **kw):
    return Schedule(len(rows), kw.pop("num_chunks", 2), [list(r) for r in rows], **kw)


def test_reference_is_valid():
    assert gs.validate(make(gpipe_rows())) is not None
    assert gs.find_violations(make(gpipe_rows())) == []


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "async-stale"])
@pytest.mark.parametrize("S, C, E", [(1, 1, 1), (1, 4, 2), (4, 1, 2), (4, 2, 1), (3, 7, 3), (5, 5, 1)])
def test_builtins_are_valid(name, S, C, E):
    gs.validate(gs.build_schedule(name, S, C, epochs=E, order="shuffle", seed=S * 10 + C, validate=False))


def reject(rows, match, marked=None, **kw):
    with pytest.raises(ScheduleError, match=match) as ei:
        gs.validate(make(rows, **kw))
    msg = str(ei.value)
    assert "\nslot  stage 0" in msg, msg  # the grid is printed
    if marked is not None:
        assert f"[{marked}]!" in msg, msg
    assert ei.value.violations
    return msg


def test_missing_forward():
    rows = gpipe_rows()
    rows[1][2] = ""
    reject(rows, r"stage 1: has no forward F of chunk 1 \(1F1\)")


def test_duplicate_backward():
    rows = gpipe_rows()
    rows[1].insert(5, "1B0")
    reject(rows, "1B0 is a duplicate of slot 4", marked="1B0")


def test_backward_before_forward_on_a_stage():
    rows = [["0F0", "0B0", "0F1", "", "0B1", "0S"], ["", "1B0", "1F1", "1B1", "1F0", "1S"]]
    msg = reject(rows, "1B0 runs before its forward 1F0", marked="1B0")
    assert "(1F0)" in msg  # the related action is marked too


def test_forward_not_after_previous_stage():
    rows = gpipe_rows()
    rows[1] = ["1F0", "", "1F1", "1B1", "1B0", "1S"]
    msg = reject(rows, r"1F0 runs at slot 0, not after 0F0 \(slot 0\); F\(s,c\) must come after F\(s-1,c\)",
                 marked="1F0")
    assert "<--" in msg


def test_backward_not_after_next_stage():
    rows = gpipe_rows()
    rows[0] = ["0F0", "0F1", "", "0B1", "", "0B0", "0S"]
    reject(rows, r"0B1 runs at slot 3, not after 1B1 \(slot 3\); B\(s,c\) must come after B\(s\+1,c\)", marked="0B1")


def test_step_before_last_backward():
    rows = gpipe_rows()
    rows[0] = ["0F0", "0F1", "", "", "0B1", "0S", "0B0"]
    reject(rows, "0S runs before 0B0", marked="0S")


def test_missing_and_duplicate_step():
    rows = gpipe_rows()
    rows[0][6] = ""
    reject(rows, r"stage 0: has no optimizer step \(0S\)")
    rows = gpipe_rows()
    rows[1].append("1S")
    reject(rows, "1S is a duplicate", marked="1S")


def test_action_in_wrong_row():
    rows = gpipe_rows()
    rows[0].append("1F0")
    reject(rows, "1F0 belongs to stage 1 but sits in the row of stage 0", marked="1F0")


def test_chunk_and_epoch_out_of_range():
    rows = gpipe_rows()
    rows[0].append("0F2")
    reject(rows, "names chunk 2, but the schedule has 2 chunk", marked="0F2")
    rows = gpipe_rows()
    rows[0].append("0F0@1")
    reject(rows, "is in epoch 1, but the schedule spans 1 epoch", marked="0F0@1")


def two_epoch_rows():
    sch = gs.build_schedule("gpipe", 2, 2, epochs=2)
    return [[str(a) if a else "" for a in row] for row in sch.stages]


def test_flush_schedule_may_not_run_ahead_on_stale_weights():
    rows = two_epoch_rows()
    # move stage 0's second step to the very end: epoch-1 forwards then run on version 0
    i = rows[0].index("0S")
    rows[0][i] = ""
    rows[0].append("0S")
    msg = reject(rows, r"0F0@1 runs on weight version 0, 1 step\(s\) behind its epoch 1, but the schedule declares "
                       r"weight_staleness=0 \(flush\)", epochs=2)
    assert "[0F0@1]!" in msg
    # the same order is fine when the schedule declares staleness 1 (apart from the step order rule)
    with pytest.raises(ScheduleError) as ei:
        gs.validate(make(rows, epochs=2, flush=False, weight_staleness=1))
    assert "weight_staleness" not in str(ei.value)


def test_epochs_run_in_order_on_a_stage():
    rows = two_epoch_rows()
    a, b = rows[1].index("1F0"), rows[1].index("1F0@1")
    rows[1][a], rows[1][b] = rows[1][b], rows[1][a]
    reject(rows, "runs after 1F0@1", epochs=2, flush=False, weight_staleness=5)


def test_backward_of_next_epoch_before_step():
    rows = [["0F0", "0F0@1", "0B0@1", "0B0", "0S", "0S@1"]]
    reject(rows, "its gradient would be applied by the previous epoch's step", num_chunks=1, epochs=2, flush=False,
           weight_staleness=1)


def test_message_lists_all_violations_and_windows_long_grids():
    sch = gs.build_schedule("1f1b", 4, 40)
    rows = [list(r) for r in sch.stages]
    t = next(i for i, a in enumerate(rows[2]) if a is not None and str(a) == "2F30")
    rows[2][t] = None
    bad = Schedule(4, 40, rows)
    with pytest.raises(ScheduleError) as ei:
        gs.validate(bad)
    msg = str(ei.value)
    assert "has no forward F of chunk 30" in msg and "2B30 runs at slot" not in msg
    assert "shown)" in msg  # long grid cut to a window
    assert len(msg.splitlines()) < 100


def test_validate_rejects_non_schedule():
    with pytest.raises(ScheduleError):
        gs.validate([["0F0"]])
