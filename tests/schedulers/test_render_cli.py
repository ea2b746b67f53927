"""Pictures (ASCII grid, chrome trace, PNG) and the `gnnpipe schedule` / `gnnpipe simulate` commands."""

import csv
import json
import sys

import pytest

from gnnpipe import schedulers as gs
from gnnpipe.cli.main import main
from gnnpipe.errors import ConfigError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_ascii_grid_slots_by_stages():
    text = gs.to_ascii(gs.build_schedule("gpipe", 2, 2))
    assert text.splitlines() == [
        "slot  stage 0  stage 1",
        "   0  0F0      .",
        "   1  0F1      1F0",
        "   2  .        1F1",
        "   3  .        1B1",
        "   4  0B1      1B0",
        "   5  0B0      1S",
        "   6  0S       .",
    ]
    assert str(gs.build_schedule("gpipe", 2, 2)) == text


def test_ascii_grid_by_stage_marks_and_window():
    sch = gs.build_schedule("gpipe", 2, 2)
    assert gs.to_ascii(sch, by_stage=True).splitlines() == [
        "slot     0    1    2    3    4    5    6",
        "stage 0  0F0  0F1  .    .    0B1  0B0  0S",
        "stage 1  .    1F0  1F1  1B1  1B0  1S   .",
    ]
    marked = gs.to_ascii(sch, marks={(1, 1): "!", (0, 0): "~"})
    assert "(0F0)" in marked and "[1F0]!" in marked and marked.splitlines()[2].endswith("<--")
    window = gs.to_ascii(sch, slots=range(2, 4))
    assert len(window.splitlines()) == 4 and "slots 2..3 of 0..6 shown" in window


def test_chrome_trace(tmp_path):
    res = gs.simulate(gs.build_schedule("1f1b", 3, 4), comm=gs.CommModel(1.0, 4.0))
    path = tmp_path / "t.json"
    trace = gs.to_chrome_trace(res, path)
    assert json.loads(path.read_text()) == trace
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    compute = [e for e in xs if e["pid"] == 0]
    assert len(compute) == 3 * (2 * 4 + 1)
    assert {e["name"] for e in compute} >= {"0F0", "2B3", "1S"}
    assert len([e for e in xs if e["pid"] == 1]) == len(res.transfers)
    first = next(e for e in compute if e["name"] == "1F0")
    assert first["tid"] == 1 and first["ts"] == pytest.approx(1.25 * 1000) and first["dur"] == pytest.approx(1000)
    # a plain schedule is simulated with unit costs
    assert gs.to_chrome_trace(gs.build_schedule("gpipe", 2, 2))["otherData"]["makespan"] == 6


def test_plot_timeline_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "t.png"
    fig = gs.plot_timeline(gs.simulate(gs.build_schedule("async-stale", 3, 3, epochs=2)), path)
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000
    assert fig.axes and "async-stale" in fig.axes[0].get_title()


def test_plot_timeline_without_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r"gnnpipe\[plot\]"):
        gs.plot_timeline(gs.build_schedule("gpipe", 2, 2))


def test_render_rejects_other_objects():
    with pytest.raises(ConfigError):
        gs.to_chrome_trace([1, 2])


# -- CLI --------------------------------------------------------------------------------------------
def test_cli_schedule_show_1f1b(capsys):
    assert main(["schedule", "show", "1f1b", "--stages", "4", "--chunks", "8"]) == 0
    out = capsys.readouterr().out
    assert "slot  stage 0  stage 1  stage 2  stage 3" in out
    assert "   7  0B0      1F3      2B1      3F2" in out
    assert "  22  0S       .        .        ." in out
    assert "makespan 22" in out and "[4, 3, 2, 1]" in out


def test_cli_schedule_show_writes_files(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png, trace, csv = tmp_path / "s.png", tmp_path / "s.json", tmp_path / "s.csv"
    rc = main(["schedule", "show", "gpipe", "-S", "3", "-C", "5", "--order", "shuffle", "--seed", "2",
               "--png", str(png), "--trace", str(trace), "--csv", str(csv)])
    assert rc == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert json.loads(trace.read_text())["otherData"]["schedule"] == "gpipe"
    built = gs.build_schedule("gpipe", 3, 5, order="shuffle", seed=2)
    assert csv.read_bytes().decode() == gs.to_csv(built, steps=False)  # torch's format by default (issue #17 item 16)
    loaded = gs.from_csv(csv, add_steps=True)
    assert [[a for a in r if a] for r in loaded.stages] == [[a for a in r if a] for r in built.stages]
    assert main(["schedule", "show", "--from-csv", str(csv), "--by-stage"]) == 0
    assert "stage 2  .    .    2F" in capsys.readouterr().out


def test_cli_schedule_show_async_epochs(capsys):
    assert main(["schedule", "show", "async-stale", "-S", "3", "-C", "3", "-E", "3", "--stash-weights"]) == 0
    out = capsys.readouterr().out
    assert "flush=False, weight staleness bound=1, weight stashing" in out
    assert "steady-state bubble per stage" in out and "0F0@1" in out


def test_cli_schedule_list_and_validate(tmp_path, capsys):
    assert main(["schedule", "list"]) == 0
    out = capsys.readouterr().out
    assert "gpipe" in out and "1f1b" in out and "async-stale" in out
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0F1,,0B0,0B1,0S\r\n,1F0,1F1,1B1,1B0,1S\r\n")
    assert main(["schedule", "validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "gnnpipe: error: invalid schedule" in err and "[0B0]!" in err
    good = tmp_path / "good.csv"
    gs.to_csv(gs.build_schedule("1f1b", 2, 3), good)
    assert main(["schedule", "validate", str(good)]) == 0
    assert "valid" in capsys.readouterr().out


def test_cli_errors(capsys):
    assert main(["schedule", "show", "nope"]) == 2
    assert "available: 1f1b, async-stale, gpipe" in capsys.readouterr().err
    assert main(["schedule", "show", "gpipe", "--stash-weights"]) == 2
    assert "nothing to stash" in capsys.readouterr().err
    assert main(["schedule", "show"]) == 2
    assert main(["schedule"]) == 2


def test_cli_simulate(tmp_path, capsys):
    assert main(["simulate", "gpipe", "--stages", "4", "--chunks", "8"]) == 0
    out = capsys.readouterr().out
    assert "makespan 22" in out and "mean bubble 27.3%" in out and "bubble (S-1)/(C+S-1) = 27.3%" in out
    js = tmp_path / "r.json"
    assert main(["simulate", "async-stale", "-S", "4", "-C", "8", "-E", "4", "--json", str(js)]) == 0
    capsys.readouterr()
    summary = json.loads(js.read_text())
    assert summary["steady_state_bubble"] == [0.0] * 4 and summary["peak_inflight"] == [4, 3, 2, 1]
    rc = main(["simulate", "1f1b", "-S", "2", "-C", "2", "--backward", "2", "--stage-scale", "1,2",
               "--chunk-scale", "1,1", "--bytes-per-chunk", "1", "--bandwidth", "1", "--no-overlap", "--grid"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "send-blocked" in out and "sends: 4" in out and "slot  stage 0" in out
    assert main(["simulate", "1f1b", "-S", "2", "-C", "2", "--stage-scale", "1"]) == 2
    assert "--stage-scale needs 2 numbers" in capsys.readouterr().err
    # a link's values are checked whether or not bytes are given
    assert main(["simulate", "1f1b", "-S", "2", "-C", "2", "--bandwidth", "-1"]) == 2
    assert "--bandwidth must be > 0" in capsys.readouterr().err
    assert main(["simulate", "1f1b", "-S", "2", "-C", "2", "--latency", "-1"]) == 2
    assert "--latency must be a finite number >= 0" in capsys.readouterr().err


# -- the CLI's CSV is what torch.distributed.pipelining reads (issue #17 item 16) ----------------------
def _torch_schedules():
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    if not (hasattr(schedules, "_Action") and hasattr(schedules._Action, "from_str")
            and hasattr(schedules, "_validate_schedule")):
        pytest.skip("this torch has no _Action.from_str / _validate_schedule")
    return schedules


@pytest.mark.parametrize("name, order",
                         [("gpipe", "fixed"), ("gpipe", "shuffle"), ("1f1b", "fixed"), ("1f1b", "shuffle")])
def test_cli_csv_is_read_and_validated_by_torch(tmp_path, capsys, name, order):
    ts = _torch_schedules()
    S, C = 4, 8
    path = tmp_path / "f.csv"
    assert main(["schedule", "show", name, "--stages", str(S), "--chunks", str(C), "--order", order, "--seed", "1",
                 "--csv", str(path)]) == 0
    text = path.read_bytes().decode()
    assert text == gs.to_csv(gs.build_schedule(name, S, C, order=order, seed=1), steps=False)
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    actions = {rank: [ts._Action.from_str(cell) for cell in row] for rank, row in enumerate(rows)}
    assert len(actions) == S and all(a is None or a.stage_index == r for r, row in actions.items() for a in row)
    ts._validate_schedule(actions, S, S, C)  # raises on a bad schedule
    if hasattr(ts, "_add_send_recv") and hasattr(ts, "_simulate_comms_compute"):  # and it runs without deadlock
        comms = ts._add_send_recv({r: [a for a in row if a is not None] for r, row in actions.items()},
                                  stage_to_rank=lambda s: s, num_stages=S)
        ts._simulate_comms_compute(comms, stage_to_rank=lambda s: s, num_stages=S)


def test_cli_csv_gnnpipe_format_keeps_steps_and_epochs(tmp_path, capsys):
    path = tmp_path / "g.csv"
    assert main(["schedule", "show", "async-stale", "-S", "3", "-C", "3", "-E", "2", "--csv", str(path),
                 "--csv-format", "gnnpipe"]) == 0
    text = path.read_text()
    assert "0S" in text and "@1" in text
    assert main(["schedule", "show", "async-stale", "-S", "3", "-C", "3", "-E", "2", "--csv", str(path)]) == 2
    assert "torch's CSV format holds one epoch" in capsys.readouterr().err


def test_validate_reads_the_torch_format_file(tmp_path, capsys):
    path = tmp_path / "t.csv"
    assert main(["schedule", "show", "1f1b", "-S", "3", "-C", "4", "--csv", str(path)]) == 0
    assert "S" not in path.read_text()
    assert main(["schedule", "validate", str(path)]) == 0
    assert "valid" in capsys.readouterr().out
