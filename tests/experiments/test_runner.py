"""Study runner logic with a fake executor (no subprocesses): append-as-you-go, resume, failures, torn lines."""

from __future__ import annotations

import json

import pytest
import tomllib

from gnnpipe.errors import ConfigError
from gnnpipe.experiments import Outcome, parse_study, read_records, run_study
from gnnpipe.experiments.results import ResultsWriter, default_results_path, results_stem

TEXT = """
name = "fake"
seeds = [0, 1]
[fixed]
layers = 2
[grid]
hidden = [4, 8, 16]
"""


def make():
    return parse_study(tomllib.loads(TEXT), None)


class FakeExec:
    """Succeeds, except for hidden=8 (fails); raises KeyboardInterrupt at call ``stop_at``."""

    def __init__(self, stop_at=None):
        self.calls = []
        self.stop_at = stop_at

    def __call__(self, run):
        if self.stop_at is not None and len(self.calls) == self.stop_at:
            raise KeyboardInterrupt
        self.calls.append(run.run_id)
        if run.settings["hidden"] == 8:
            return Outcome("failed", "boom: hidden=8 is cursed")
        return Outcome("ok", None, {"best_val_acc": 0.5, "test_acc_at_best_val": 0.4, "mean_epoch_time_s": 0.01,
                                    "epochs": [{"epoch": 0, "loss": 1.0, "time_s": 0.01, "val_acc": 0.5}]})


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_interrupt_resume_exactly_once(tmp_path):
    st = make()
    res = tmp_path / "r.jsonl"
    first = FakeExec(stop_at=3)
    p1 = run_study(st, res, execute=first, progress=False, log=lambda m: None)
    assert p1.interrupted and p1.ran == 3 and p1.failed == 1
    assert [r["run_id"] for r in lines(res)] == first.calls
    second = FakeExec()
    p2 = run_study(st, res, execute=second, progress=False, log=lambda m: None)
    assert not p2.interrupted and p2.skipped == 3 and p2.ran == 3
    assert not set(first.calls) & set(second.calls)  # nothing repeated
    recs = lines(res)
    assert sorted(r["run_id"] for r in recs) == sorted(r.run_id for r in st.runs)  # each exactly once
    bad = [r for r in recs if r["status"] == "failed"]
    assert len(bad) == 2 and all("cursed" in r["error"] and r["result"] is None for r in bad)
    ok = [r for r in recs if r["status"] == "ok"]
    assert all(r["result"]["best_val_acc"] == 0.5 and r["wall_s"] >= 0 for r in ok)
    assert {r["variant"] for r in recs} == {"hidden=4", "hidden=8", "hidden=16"}
    # a third call does nothing
    third = FakeExec()
    p3 = run_study(st, res, execute=third, progress=False, log=lambda m: None)
    assert third.calls == [] and p3.skipped == 6


def test_retry_failed_keeps_each_run_once(tmp_path):
    st = make()
    res = tmp_path / "r.jsonl"
    run_study(st, res, execute=FakeExec(), progress=False, log=lambda m: None)
    again = FakeExec()
    run_study(st, res, execute=again, retry_failed=True, progress=False, log=lambda m: None)
    assert len(again.calls) == 2
    ids = [r["run_id"] for r in lines(res)]
    assert len(ids) == len(set(ids)) == 6


def test_torn_last_line_is_rerun(tmp_path):
    st = make()
    res = tmp_path / "r.jsonl"
    run_study(st, res, execute=FakeExec(stop_at=2), progress=False, log=lambda m: None)
    text = res.read_text().splitlines()
    res.write_text(text[0] + "\n" + text[1][: len(text[1]) // 2])  # killed while writing line 2
    with pytest.warns(UserWarning, match="unreadable"):
        assert len(read_records(res)) == 1
    ex = FakeExec()
    with pytest.warns(UserWarning):
        run_study(st, res, execute=ex, progress=False, log=lambda m: None)
    assert len(ex.calls) == 5
    with pytest.warns(UserWarning):
        ids = [r["run_id"] for r in read_records(res)]
    assert sorted(ids) == sorted(r.run_id for r in st.runs)


def test_progress_bar_path(tmp_path, capsys):
    st = make()
    run_study(st, tmp_path / "r.jsonl", execute=FakeExec(), progress=True)
    err = capsys.readouterr().err
    assert "6/6" in err and "hidden=8 seed=0" in err


def test_lock_and_paths(tmp_path):
    res = tmp_path / "x.results.jsonl"
    with ResultsWriter(res), pytest.raises(ConfigError, match="locked"), ResultsWriter(res):
        pass
    assert default_results_path(tmp_path / "a" / "study.toml") == tmp_path / "a" / "study.results.jsonl"
    assert results_stem(res) == "x"


def test_nan_written_as_null(tmp_path):
    res = tmp_path / "r.jsonl"
    with ResultsWriter(res) as w:
        w.append({"run_id": "a", "result": {"v": float("nan")}})
    assert json.loads(res.read_text())["result"]["v"] is None


def test_each_record_names_the_code_that_ran(tmp_path, monkeypatch):
    import gnnpipe
    from gnnpipe.experiments import runner

    res = tmp_path / "r.jsonl"
    run_study(make(), res, execute=FakeExec(), progress=False, log=lambda m: None)
    codes = [r["code"] for r in lines(res)]
    assert all(c["gnnpipe"] == gnnpipe.__version__ for c in codes)
    # in this checkout: a 40-hex commit; outside one (or without git): None, and the study still runs
    assert all(c["git"] is None or (len(c["git"]) == 40 and isinstance(c["dirty"], bool)) for c in codes)
    monkeypatch.setattr(runner.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(OSError("no git")))
    assert runner.code_version() == {"gnnpipe": gnnpipe.__version__, "git": None, "dirty": None}


def test_code_version_ignores_an_enclosing_foreign_repository(tmp_path, monkeypatch):
    """An installed copy inside another project's git tree (e.g. its .venv) must not report that project's HEAD."""
    import subprocess

    from gnnpipe.experiments import runner

    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if "--show-toplevel" in cmd:
            return subprocess.CompletedProcess(cmd, 0, stdout=str(tmp_path) + "\n", stderr="")
        return subprocess.CompletedProcess(cmd, 0, stdout="f" * 40 + "\n", stderr="")

    monkeypatch.setattr(runner.subprocess, "run", fake_run)
    assert runner.code_version()["git"] is None
    assert not any("HEAD" in c for c in calls)
