"""What the epoch loop tells the user: early stopping in the result and its summary; resuming a run that has
already completed its epochs warns instead of silently training nothing; CLI warnings are one line."""

import subprocess
import sys

import pytest

from gnnpipe import api


def test_early_stop_is_recorded_and_summarised():
    r = api.train(num_nodes=300, layers=2, hidden=8, epochs=60, patience=2, lr=0.0, progress=False)
    assert len(r.epochs) < 60  # lr 0: nothing improves after the first evaluations
    es = r.extra["early_stop"]
    assert es["epoch"] == len(r.epochs) - 1 and es["patience"] == 2
    assert f"stopped early         after epoch {len(r.epochs)}:" in r.summary()  # counted from 1, as the epoch lines


@pytest.mark.parametrize("stages", [1, 2])
def test_a_saved_result_model_keeps_its_run_config_and_data_paths(tmp_path, stages):
    from gnnpipe import models

    r = api.train(num_nodes=300, layers=2, hidden=8, epochs=2, progress=False, stages=stages, chunks=stages)
    assert r.model.meta["config"]["num_nodes"] == 300 and r.model.meta["epochs"] == 2
    models.save(r.model, tmp_path / "m.pt")  # no meta given: the model's own
    back = models.load(tmp_path / "m.pt")
    assert back.meta["config"] == r.model.meta["config"] and "data_paths" in back.meta
    models.save(r.model, tmp_path / "n.pt", meta={"note": 1})  # a meta given replaces it
    assert models.load(tmp_path / "n.pt").meta == {"note": 1}


def test_resuming_a_finished_run_warns(tmp_path):
    ck = tmp_path / "ck"
    api.train(num_nodes=300, layers=2, hidden=8, epochs=2, progress=False, checkpoint_dir=str(ck))
    with pytest.warns(UserWarning, match="nothing to train"):
        r = api.train(num_nodes=300, layers=2, hidden=8, epochs=2, progress=False, resume=str(ck))
    assert len(r.epochs) == 2


def test_cli_warnings_are_one_line_without_source_paths():
    out = subprocess.run([sys.executable, "-m", "gnnpipe", "train", "--num-nodes", "300", "--layers", "2",
                          "--epochs", "1", "--ranks", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "gnnpipe: warning: ignored: --ranks (" in out.stderr
    assert ".py:" not in out.stderr


def test_a_run_whose_stdout_reader_leaves_goes_on_and_writes_its_results(tmp_path):
    """`gnnpipe train ... | head -1`: the epoch lines stop when the pipe closes; the run finishes, writes --out and
    its checkpoint, and prints no BrokenPipeError traceback."""
    out, ck = tmp_path / "r.json", tmp_path / "ck"
    p = subprocess.Popen([sys.executable, "-m", "gnnpipe", "train", "--num-nodes", "300", "--layers", "2", "--epochs",
                          "30", "--log-every", "1", "--no-progress", "--checkpoint-dir", str(ck), "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("epoch  1/30")
    p.stdout.close()  # the reader leaves
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    import json

    assert json.loads(out.read_text())["status"] == "completed" and (ck / "ckpt-000030").is_dir()


def test_the_summary_counts_one_epoch_in_the_singular():
    one = api.train(num_nodes=300, layers=2, hidden=8, epochs=1, progress=False).summary()
    two = api.train(num_nodes=300, layers=2, hidden=8, epochs=2, progress=False).summary()
    assert "over 1 epoch\n" in one + "\n" and "over 1 epochs" not in one
    assert "over 2 epochs" in two
