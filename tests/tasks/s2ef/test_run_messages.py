"""What an S2EF run says and leaves behind: a resumed run's summary and warnings in another layout, a refused
``--tensorboard`` that writes nothing, the export line naming the best epoch (or step), file names on stdout only
for scripts, and labels of databases written by SchNetPack."""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import pytest
import torch

from gnnpipe import api
from gnnpipe.cli.main import main
from gnnpipe.errors import ConfigError

from .toy import write_extxyz

SMALL = dict(model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=8, batch_size=4, warmup_steps=1,
             dtype="float64", model_args={"num_filters": 8, "num_gaussians": 8})


@pytest.fixture(scope="module")
def xyz(tmp_path_factory):
    return write_extxyz(tmp_path_factory.mktemp("msg") / "c.extxyz", 20, seed=5)


@pytest.mark.dist
def test_a_run_resumed_in_another_layout_says_so(xyz, tmp_path, capsys):
    ck = tmp_path / "ck"
    api.train(**SMALL, dataset=xyz, epochs=2, checkpoint_dir=str(ck), log_every=0, progress=False)
    with pytest.warns(UserWarning, match=r"the global batch is now 8 structures \(--batch-size 4 × --replicas 2; "
                                         r"it was 4\), so an epoch has fewer optimizer steps"):
        r = api.train(**SMALL, dataset=xyz, epochs=3, replicas=2, resume=str(ck), log_every=0, progress=False)
    assert r.extra["layout_from_epoch"] == 2
    assert r.mean_epoch_time_s == pytest.approx(r.epochs[2]["time_s"])  # this layout's epoch only
    assert "over 1 epoch in this layout (the 2 before the resume ran in another)" in r.summary()


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_a_refused_tensorboard_writes_no_csv(xyz, tmp_path):
    csv = tmp_path / "log.csv"
    with pytest.raises(ConfigError, match="--tensorboard needs the tensorboard package"):
        api.train(**SMALL, dataset=xyz, epochs=1, log_csv=str(csv), tensorboard=str(tmp_path / "tb"), progress=False)
    assert not csv.exists()


def test_export_names_the_best_epoch(xyz, tmp_path, capsys):
    ck = tmp_path / "ck"
    r = api.train(**SMALL, dataset=xyz, epochs=3, checkpoint_dir=str(ck), log_every=0, progress=False)
    capsys.readouterr()
    assert main(["export", str(ck), "--out", str(tmp_path / "m.pt")]) == 0
    err = capsys.readouterr().err
    assert f"the best validation epoch's weights (epoch {r.best_epoch + 1} of 3)" in err, err
    assert main(["export", str(ck), "--keep", "last", "--out", str(tmp_path / "l.pt")]) == 0
    assert "the weights after 3 epochs" in capsys.readouterr().err



def test_export_names_the_best_step_of_a_run_counted_in_steps(xyz, tmp_path, capsys):
    """Weights chosen at a step evaluation are named by their step (not an epoch past those done)."""
    ck = tmp_path / "ck"
    r = api.train(**SMALL, dataset=xyz, epochs=5, max_steps=7, eval_every_steps=2, checkpoint_dir=str(ck),
                  log_every=0, progress=False)
    capsys.readouterr()
    assert main(["export", str(ck), "--out", str(tmp_path / "m.pt")]) == 0
    err = capsys.readouterr().err
    assert r.best_metrics["step"] == 7 and r.best_epoch == 1  # in the second epoch (4 steps each), 1 done
    assert "the best validation weights (step 7 of 7)" in err, err
    assert main(["export", str(ck), "--keep", "last", "--out", str(tmp_path / "l.pt")]) == 0
    assert "the weights after 7 steps" in capsys.readouterr().err

def test_a_file_name_goes_to_stdout_only_for_a_script(tmp_path, capsys, monkeypatch):
    out = tmp_path / "g.extxyz"
    assert main(["atoms", "generate", "--kind", "oc20", "--frames", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)  # piped: the path alone, for $(...)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr("sys.stdout", term)
    assert main(["atoms", "generate", "--kind", "oc20", "--frames", "2", "--out", str(out), "--overwrite"]) == 0
    assert term.getvalue() == ""  # a terminal: only the stderr line, which names the file
    assert str(out) in capsys.readouterr().err


def test_an_ase_database_written_by_schnetpack_keeps_its_labels(tmp_path):
    """SchNetPack's ``ASEAtomsData`` keeps every property in ``row.data``, the energy as a one-element array."""
    import ase.db
    from ase.build import bulk

    from gnnpipe.data.atoms import read_structures

    path = tmp_path / "spk.db"
    with ase.db.connect(str(path)) as db:
        for k in range(3):
            a = bulk("Cu", "fcc", a=3.6, cubic=True)
            a.rattle(0.05, seed=k)
            db.write(a, data={"energy": np.array([-1.5 - k], dtype=np.float32),
                              "forces": np.full((len(a), 3), 0.1 * k, dtype=np.float32)})
    got = read_structures(path, dtype=torch.float64, require_labels=True)
    assert [float(d.energy) for d in got] == [-1.5, -2.5, -3.5]
    assert torch.allclose(got[2].forces, torch.full((4, 3), 0.2, dtype=torch.float64))


def test_a_run_without_validation_structures_says_so_in_its_summary(tmp_path):
    small = write_extxyz(tmp_path / "four.extxyz", 4, seed=2)
    r = api.train(**SMALL, dataset=str(small), epochs=1, log_every=0, progress=False)
    text = r.summary()
    assert "no validation structures" in text and "val acc" not in text
