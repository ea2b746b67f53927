"""S2EF training through the shared runtime: ``gnnpipe train`` on a structure file, results, checkpoints and exact
resume, export, predict, Ctrl-C, and the refusals of what cannot train."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gnnpipe import api
from gnnpipe.cli.main import main
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.s2ef.defaults import MODEL_DEFAULTS

from .toy import emt_clusters, write_extxyz

SMALL = dict(model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=12, batch_size=4, warmup_steps=2,
             model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0)
FLAGS = ["--model", "schnet", "--layers", "1", "--hidden", "8", "--cutoff", "4", "--max-neighbors", "12",
         "--batch-size", "4", "--warmup-steps", "2", "--model-arg", "num_filters=8", "--model-arg", "num_gaussians=8",
         "--no-progress"]


@pytest.fixture(scope="module")
def xyz(tmp_path_factory):
    return write_extxyz(tmp_path_factory.mktemp("s2ef") / "clusters.extxyz", 24, seed=1)


def test_training_lowers_the_force_error_and_reports_s2ef_metrics():
    data = emt_clusters(24, seed=2, dtype=torch.float32)
    r = api.train(data=data, epochs=6, lr=3e-3, **SMALL)
    first, last = r.epochs[0], r.epochs[-1]
    assert last["train_force_mae"] < first["train_force_mae"]
    d = r.to_dict()
    assert "best_val_acc" not in d and d["config"]["task"] == "s2ef" \
        and d["config"]["force_coef"] == MODEL_DEFAULTS["schnet"]["force_coef"]
    for k in ("val_energy_mae", "val_energy_mae_per_atom", "val_force_mae", "val_force_cos", "val_efwt",
              "test_force_mae"):
        assert k in d["best_metrics"] and k in last
    assert r.best_metrics["val_force_mae"] == min(e["val_force_mae"] for e in r.epochs)
    assert "force MAE" in r.summary() and "eV/Å" in r.summary()


def test_a_node_classification_model_on_structures_is_refused(xyz):
    with pytest.raises(ConfigError, match="does not predict energies and forces"):
        api.train(dataset=xyz, model="gcn", epochs=1, log_every=0)
    with pytest.raises(ConfigError, match="not a structure set"):
        api.train(dataset="Cora", model="schnet", epochs=1, log_every=0)
    with pytest.raises(ConfigError, match="exceeds the 2 units"):
        api.train(dataset=xyz, stages=3, epochs=1, **SMALL)


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


GEMNET = dict(SMALL, model="gemnet-t", model_args={"emb_size_trip": 4, "emb_size_rbf": 3, "emb_size_cbf": 3,
                                                  "emb_size_bil_trip": 5, "num_spherical": 3, "num_radial": 6,
                                                  "num_atom": 1})


@pytest.mark.parametrize("small", [SMALL, pytest.param(GEMNET, marks=pytest.mark.slow, id="gemnet-t")])
def test_resume_continues_exactly(tmp_path, xyz, small):
    kw = dict(dataset=xyz, dtype="float64", ema_decay=0.9, keep="last", **small)
    full = api.train(epochs=4, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2, **kw)
    resumed = api.train(epochs=4, resume=str(tmp_path / "ck" / "ckpt-000002"), **kw)  # the cosine spans 4 epochs
    assert resumed.epochs[1] == full.epochs[1]  # the first two epochs are the checkpoint's records
    for k, v in _weights(full.model).items():
        assert torch.equal(resumed.model.state_dict()[k], v), k
    from gnnpipe.core.run.checkpoint import read_weights

    last = read_weights(tmp_path / "ck", "last")  # the moving average the run evaluates with (keep="last")
    assert set(last) == set(full.model.state_dict())
    assert all(torch.equal(last[k], v) for k, v in full.model.state_dict().items())
    strip = lambda recs: [{k: v for k, v in e.items() if k not in ("time_s", "cpu_s")} for e in recs]  # noqa: E731
    assert strip(resumed.epochs) == strip(full.epochs)


def test_cli_train_export_predict(tmp_path, xyz, capsys):
    out, ck, csv = tmp_path / "r.json", tmp_path / "ck", tmp_path / "log.csv"
    assert main(["train", "--dataset", xyz, *FLAGS, "--epochs", "2", "--out", str(out), "--checkpoint-dir", str(ck),
                 "--log-csv", str(csv)]) == 0
    rec = json.loads(out.read_text())
    assert rec["status"] == "completed" and len(rec["epochs"]) == 2 and rec["best_metrics"]["test_force_mae"] > 0
    assert "val_force_mae" in csv.read_text().splitlines()[0]
    model_file = tmp_path / "m.pt"
    assert main(["export", str(ck), "--out", str(model_file)]) == 0
    pred = tmp_path / "pred.extxyz"
    capsys.readouterr()
    assert main(["predict", str(model_file), "--dataset", xyz, "--out", str(pred)]) == 0
    assert "E-MAE" in capsys.readouterr().out
    import ase.io

    frames = ase.io.read(str(pred), index=":")
    assert len(frames) == 24
    from gnnpipe.calculator import Calculator

    calc = Calculator(str(model_file))
    a = frames[3].copy()
    a.calc = calc
    assert a.get_potential_energy() == pytest.approx(frames[3].get_potential_energy(), rel=1e-5)
    assert abs(a.get_forces() - frames[3].get_forces()).max() < 1e-4
    # the checkpoint folder itself, as gnnpipe relax takes it: the same model
    b = frames[3].copy()
    b.calc = Calculator(str(ck))
    assert b.get_potential_energy() == pytest.approx(a.get_potential_energy(), rel=1e-9)


def _block_sigterm():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def test_sigterm_writes_an_interrupted_result(tmp_path, xyz):
    """Also when the run inherits a signal mask that blocks SIGTERM (a parent that started it while blocking it)."""
    out, csv = tmp_path / "r.json", tmp_path / "log.csv"
    p = subprocess.Popen([sys.executable, "-m", "gnnpipe", "train", "--dataset", xyz, *FLAGS, "--epochs", "100000",
                          "--patience", "0", "--out", str(out), "--log-csv", str(csv)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True, env={**os.environ}, preexec_fn=_block_sigterm)
    t0 = time.monotonic()
    while not (csv.exists() and len(csv.read_text().splitlines()) > 2):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() - t0 < 180, "no progress"
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    try:
        p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        status = open(f"/proc/{p.pid}/status").read()
        p.kill()
        pytest.fail("the run did not stop on SIGTERM: " + " ".join(x for x in status.splitlines() if "Sig" in x))
    assert p.returncode == 130
    rec = json.loads(out.read_text())
    assert rec["status"] == "interrupted" and len(rec["epochs"]) >= 2 and "val_force_mae" in rec["epochs"][0]


@pytest.mark.slow  # spawns gloo ranks
def test_two_ranks_through_the_launcher_equal_one_process(xyz):
    kw = dict(dataset=xyz, dtype="float64", epochs=2, ema_decay=0.9, **{**SMALL, "batch_size": 2})
    dp = api.train(replicas=2, **kw)
    single = api.train(**{**kw, "batch_size": 4})
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(dp.model.state_dict()[k], v, rtol=1e-9, atol=1e-12)
    assert dp.extra["plan"]["global_batch"] == 4


@pytest.mark.slow  # torchrun starts two ranks
def test_torchrun_ranks_train_data_parallel(tmp_path, xyz):
    import shutil

    torchrun = shutil.which("torchrun") or pytest.skip("no torchrun")
    out = tmp_path / "r.json"
    p = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "gnnpipe", "train", "--dataset", xyz, *FLAGS,
                        "--replicas", "2", "--epochs", "2", "--out", str(out)], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["status"] == "completed" and rec["plan"]["data_parallel"] == 2 and len(rec["peak_mem_bytes"]) == 2


def test_errors_name_the_structure_file_and_the_flag(tmp_path):
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.errors import DataValidationError
    from gnnpipe.tasks.s2ef.data import load_structures

    path = tmp_path / "bad.extxyz"
    write_extxyz(path, 2, seed=0)
    lines = path.read_text().splitlines(True)
    atom = lines[2].split()
    atom[1] = "nan"                                 # structure 0, atom 0: x is NaN
    lines[2] = " ".join(atom) + "\n"
    path.write_text("".join(lines))
    small = {k: v for k, v in SMALL.items() if k != "log_every"}
    with pytest.raises(DataValidationError, match=r"^bad\.extxyz: structure 0: pos\[0, 0\] is nan"):
        load_structures(TrainConfig(dataset=str(path), **small))
    with pytest.raises(ConfigError, match=r"--gp-size\) must be >= 1, got 0"):
        TrainConfig(graph_parallel_group_size=0, **small)


def test_gp_size_with_a_node_classification_model_names_the_atomistic_models():
    with pytest.raises(ConfigError, match=r"--model gcnii cannot be graph-parallel.*--ways W.*"
                                          r"atomistic model \(--model dimenet\+\+ / (\S+ / )*gemnet-t / "
                                          r"(\S+ / )*schnet"):
        api.train(model="gcnii", graph_parallel_group_size=2, epochs=1, log_every=0, progress=False)
