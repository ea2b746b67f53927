"""`gnnpipe train` with no flag that chooses the job trains the demo (a pipeline), also with flags that only say how
the run is reported or saved; a flag that chooses the job leaves it: the flags' defaults apply."""

from __future__ import annotations

import pytest

from gnnpipe.cli import main as cli_main


class _Stop(Exception):
    pass


@pytest.fixture
def captured(monkeypatch):
    seen = {}

    def fake_train(config, **kw):
        seen["config"] = config
        raise _Stop

    monkeypatch.setattr("gnnpipe.api.train", fake_train)
    return seen


def test_no_flags_trains_a_two_stage_pipeline(captured, capsys):
    with pytest.raises(_Stop):
        cli_main.main(["train"])
    c = captured["config"]
    assert (c.ways, c.stages, c.epochs) == (1, 2, 100)
    assert "2-stage GNNPipe pipeline" in capsys.readouterr().err


def test_any_flag_keeps_the_single_process_default(captured):
    with pytest.raises(_Stop):
        cli_main.main(["train", "--epochs", "3"])
    c = captured["config"]
    assert (c.ways, c.stages, c.epochs) == (1, 1, 3)


@pytest.mark.parametrize("flags", [["--no-progress"], ["--out", "r.json"], ["--out=r.json", "--log-csv", "log.csv"],
                                   ["--no-prog"], ["--timeout", "120", "--keep", "last"]])
def test_flags_that_only_report_keep_the_demo(captured, capsys, flags, tmp_path, monkeypatch):
    """Flags that say how the run is reported, saved or waited on do not change what is trained."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(_Stop):
        cli_main.main(["train", *flags])
    c = captured["config"]
    assert (c.ways, c.stages, c.epochs) == (1, 2, 100)
    err = capsys.readouterr().err
    assert "training the demo, a 2-stage GNNPipe pipeline" in err
    assert "no flag choosing the job given (--" in err and ("--out" in err or "--no-progress" in err
                                                          or "--timeout" in err)


@pytest.mark.parametrize("flags", [["--out", "r.json", "--seed", "1"], ["--no-progress", "--stages", "1"],
                                   ["--model-arg", "alpha=0.2"], ["--threads", "2", "--no-progress"]])
def test_a_flag_that_chooses_the_job_leaves_the_demo(captured, capsys, flags, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(_Stop):
        cli_main.main(["train", *flags])
    c = captured["config"]
    assert (c.ways, c.stages, c.epochs) == (1, 1, 200)
    assert "demo" not in capsys.readouterr().err
