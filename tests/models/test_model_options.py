"""A model's own options (GCNII's alpha, lamda): listed, settable from Python, the command line and study
files, recorded in the result, unknown ones rejected with the valid ones (issue #17, item 15)."""

from __future__ import annotations

import json
import math

import pytest
import tomllib

from gnnpipe import api, models
from gnnpipe.cli.main import main
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.errors import ConfigError
from gnnpipe.experiments.grid import parse_study
from gnnpipe.tasks.nodes.trainer import make_model, resolve_config

TINY = ["--num-nodes", "120", "--layers", "2", "--hidden", "8", "--epochs", "2", "--patience", "0",
        "--dropout", "0", "--no-progress"]


def test_options_are_read_from_the_constructor():
    opts = models.model_options("gcnii")
    assert {k: o.default for k, o in opts.items()} == {"alpha": 0.1, "lamda": 0.5}
    assert "GCNII eq. 5" in opts["alpha"].help
    for name in ("gcn", "graphsage", "resgcn+"):
        assert models.model_options(name) == {}


def test_parse_types_and_rejects_unknown_names_with_the_list():
    assert models.parse_model_args("gcnii", ["alpha=0.2", "lamda=1"]) == {"alpha": 0.2, "lamda": 1.0}
    assert models.parse_model_args("gcnii", "alpha=0.2,lamda=0.6") == {"alpha": 0.2, "lamda": 0.6}
    with pytest.raises(ConfigError, match=r"no option 'lam' \(did you mean 'lamda'\?\); its options: "
                                          r"alpha \(default 0.1\), lamda \(default 0.5\)"):
        models.parse_model_args("gcnii", ["lam=0.6"])
    with pytest.raises(ConfigError, match="must be a float"):
        models.parse_model_args("gcnii", ["alpha=big"])
    with pytest.raises(ConfigError, match="name=value"):
        models.parse_model_args("gcnii", ["alpha"])
    with pytest.raises(ConfigError, match="its options: none"):
        models.parse_model_args("gcn", ["alpha=0.1"])


def test_train_config_validates_model_args():
    assert TrainConfig(model="gcnii", model_args={"lamda": 0.6}).model_args == {"lamda": 0.6}
    with pytest.raises(ConfigError, match="no option 'lam'"):
        TrainConfig(model="gcnii", model_args={"lam": 0.6})
    with pytest.raises(ConfigError, match="model 'gcn' has no option 'alpha'"):
        TrainConfig(model="gcn", model_args={"alpha": 0.1})
    with pytest.raises(ConfigError, match="must be a float"):
        TrainConfig(model="gcnii", model_args={"alpha": "0.1"})
    with pytest.raises(ConfigError, match=r"alpha must be in \[0, 1\]"):
        make_model(resolve_config(TrainConfig(model="gcnii", model_args={"alpha": 1.5})), 4, 3)


def test_options_reach_the_model_and_defaults_are_recorded():
    cfg = resolve_config(TrainConfig(model="gcnii", layers=3, model_args={"lamda": 0.6, "alpha": 0.2}))
    m = make_model(cfg, 4, 3)
    assert [u.theta for u in m.units[1:-1]] == pytest.approx([math.log(0.6 / ell + 1) for ell in (1, 2, 3)])
    assert all(u.alpha == 0.2 for u in m.units[1:-1])
    assert resolve_config(TrainConfig(model="gcnii")).model_args == {"alpha": 0.1, "lamda": 0.5}
    assert resolve_config(TrainConfig(model="gcn")).model_args == {}


def test_cli_model_arg_is_used_recorded_and_checked(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["train", *TINY, "--model-arg", "lamda=0.6", "--model-arg", "alpha=0.2", "--out", str(a)]) == 0
    assert main(["train", *TINY, "--out", str(b)]) == 0
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert ra["config"]["model_args"] == {"alpha": 0.2, "lamda": 0.6}
    assert rb["config"]["model_args"] == {"alpha": 0.1, "lamda": 0.5}
    assert [e["loss"] for e in ra["epochs"]][1] != [e["loss"] for e in rb["epochs"]][1]  # it changed the model
    capsys.readouterr()
    assert main(["train", *TINY, "--model-arg", "lam=0.6"]) == 2
    err = capsys.readouterr().err
    assert "no option 'lam'" in err and "alpha (default 0.1), lamda (default 0.5)" in err


def test_models_command_and_help_list_the_options(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "gcnii:" in out and "alpha=0.1 (float)" in out and "lamda=0.5 (float)" in out and "gcn:" in out
    assert main(["models", "gcnii"]) == 0 and "graphsage" not in capsys.readouterr().out
    assert main(["models", "gemnet-t"]) == 0  # the S2EF recipe, not only the constructor's cutoff 6 / 50 neighbours
    assert "S2EF defaults" in (out := capsys.readouterr().out) and "cutoff=4.0" in out and "max_neighbors=12" in out
    err = capsys.readouterr().err if main(["models", "nope"]) == 2 else ""
    assert "available: " in err and "gcn, gcnii" in err
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "gcnii: alpha=0.1, lamda=0.5" in " ".join(capsys.readouterr().out.split())


def test_study_files_set_model_args():
    text = """
[fixed]
model = "gcnii"
layers = 2
model_args = { lamda = 0.6 }
[grid]
hidden = [8, 16]
"""
    s = parse_study(tomllib.loads(text))
    assert s.runs[0].argv[s.runs[0].argv.index("--model-arg") + 1] == "lamda=0.6"
    grid = parse_study(tomllib.loads('[fixed]\nmodel = "gcnii"\n'
                                     '[grid]\nmodel_args = [{lamda = 0.4}, {lamda = 0.6, alpha = 0.2}]\n'))
    assert [r.settings["model_args"] for r in grid.runs] == ["lamda=0.4", "alpha=0.2,lamda=0.6"]
    assert grid.runs[1].argv.count("--model-arg") == 2
    with pytest.raises(ConfigError, match="no option 'lam'"):
        parse_study(tomllib.loads('[fixed]\nmodel = "gcnii"\nmodel_args = { lam = 0.6 }\n'))


def test_api_train_records_model_args():
    r = api.train(model="gcnii", layers=2, hidden=8, epochs=1, num_nodes=80, model_args={"lamda": 0.4}, progress=False)
    assert r.config["model_args"] == {"alpha": 0.1, "lamda": 0.4}


def test_user_model_options_work_through_the_same_door():
    @models.register("test-opt-model")
    class OptModel(models.GCN):
        option_help = {"scale": "a factor"}

        def __init__(self, in_channels, out_channels, *, num_layers=2, hidden=8, dropout=0.0, bias=False,
                     activation="relu", scale=2, tag="x"):
            super().__init__(in_channels, out_channels, num_layers=num_layers, hidden=hidden, dropout=dropout,
                             bias=bias, activation=activation)
            self.scale, self.tag = scale, tag

    assert models.parse_model_args("test-opt-model", ["scale=3", "tag=y"]) == {"scale": 3, "tag": "y"}
    with pytest.raises(ConfigError, match="must be an int"):
        models.parse_model_args("test-opt-model", ["scale=1.5"])
    m = models.build_model("test-opt-model", 4, 3, scale=5)
    assert m.scale == 5


def test_switching_model_on_a_resolved_config_drops_the_old_defaults_only():
    from gnnpipe.api import _as_config

    resolved = resolve_config(TrainConfig(model="gcnii"))
    assert _as_config(resolved, {"model": "gcn"}).model_args == {}
    chosen = TrainConfig(model="gcnii", model_args={"lamda": 0.6})
    with pytest.raises(ConfigError, match="model 'gcn' has no option 'lamda'"):
        _as_config(chosen, {"model": "gcn"})
