"""`gnnpipe train` with no flag at all trains the main job (a pipeline); any flag keeps the flags' defaults."""

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
