"""Run files: ``gnnpipe train --config run.toml`` trains as the same flags do, flags given after it override it, and
the resolved configuration every run writes repeats the run exactly."""

from __future__ import annotations

import json

import pytest

from gnnpipe.cli.main import main

from ..tasks.s2ef.toy import write_extxyz

FLAGS = ["--model", "schnet", "--layers", "1", "--hidden", "8", "--cutoff", "4", "--max-neighbors", "8",
         "--batch-size", "4", "--epochs", "2", "--max-steps", "5", "--eval-every-steps", "2", "--dtype", "float64",
         "--model-arg", "num_filters=8", "--model-arg", "num_gaussians=8", "--no-progress"]


def _steps(path) -> list[float]:
    return [s["loss"] for s in json.loads(path.read_text())["steps"]]


def test_a_run_file_trains_as_its_flags_and_the_written_one_repeats_the_run(tmp_path, capsys):
    xyz = write_extxyz(tmp_path / "c.extxyz", 24, seed=4)
    assert main(["train", "--dataset", xyz, *FLAGS, "--out", str(tmp_path / "flags.json")]) == 0
    (tmp_path / "run.toml").write_text(f'''dataset = "{xyz}"
model = "schnet"
layers = 1
hidden = 8
cutoff = 4.0
max-neighbors = 8
batch_size = 4
epochs = 2
max-steps = 5
eval-every-steps = 2
dtype = "float64"
progress = false
out = "{tmp_path / 'file.json'}"

[model_args]
num_filters = 8
num_gaussians = 8
''')
    assert main(["train", "--config", str(tmp_path / "run.toml")]) == 0
    assert _steps(tmp_path / "file.json") == _steps(tmp_path / "flags.json")
    # the resolved configuration written beside the result repeats the run exactly
    written = tmp_path / "flags.config.toml"
    assert written.is_file() and "energy_reference" in written.read_text()
    assert main(["train", "--config", str(written), "--out", str(tmp_path / "again.json"), "--no-progress"]) == 0
    assert _steps(tmp_path / "again.json") == _steps(tmp_path / "flags.json")
    # a flag given after the file overrides it
    assert main(["train", "--config", str(written), "--max-steps", "3", "--out", str(tmp_path / "short.json"),
                 "--no-progress"]) == 0
    assert _steps(tmp_path / "short.json") == _steps(tmp_path / "flags.json")[:3]


@pytest.mark.parametrize("text, message", [
    ("modle = 'schnet'\n", "unknown setting 'modle'; did you mean 'model'"),
    ("epochs = [1, 2]\n", "epochs takes one value"),
    ("nan-ok = 3\n", "nan-ok takes true or false"),
    ("epochs = \n", "not a TOML file"),
])
def test_a_bad_run_file_is_refused_with_one_line(tmp_path, capsys, text, message):
    (tmp_path / "bad.toml").write_text(text)
    assert main(["train", "--config", str(tmp_path / "bad.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
