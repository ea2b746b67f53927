"""gnnpipe relax and gnnpipe evaluate --task is2rs end to end on a tiny generated IS2RS set; bad input gets one
line and exit 2; gnnpipe report draws the curves."""

from __future__ import annotations

import json

import pytest

from gnnpipe.cli.main import main


@pytest.fixture(scope="module")
def is2rs_files(tmp_path_factory):
    from gnnpipe.data.atoms import generated_file
    from gnnpipe.data.atoms.generate import reference_path

    folder = tmp_path_factory.mktemp("is2rs")
    path = generated_file("oc20-is2rs", 3, seed=2, out=folder / "is2rs.extxyz")
    assert reference_path(path).is_file()
    return path, reference_path(path)


def test_relax_says_what_it_does_without_a_progress_bar(schnet_file, is2rs_files, tmp_path, capsys):
    initial, _ = is2rs_files
    assert main(["relax", str(schnet_file), "--dataset", str(initial), "--out", str(tmp_path / "r.extxyz"),
                 "--steps", "4", "--batch-size", "2", "--fmax", "1e-6", "--log-every-steps", "2",
                 "--no-progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"relax: loaded {schnet_file} (SchNet, ") and f"reading {initial}" in err[0]
    assert "relax: batch 1/2: 2 structures" in err and "relax: batch 2/2: 1 structure" in err
    steps = [ln for ln in err if ln.startswith("relax: batch 1/2 step ")]
    assert [ln.split(":")[1].split()[-1] for ln in steps] == ["2", "4"], steps
    assert "largest force" in steps[0] and err[-1] == f"wrote {tmp_path / 'r.extxyz'}"
    assert main(["relax", str(schnet_file), "--dataset", str(initial), "--out", str(tmp_path / "q.extxyz"),
                 "--steps", "4", "--log-every-steps", "0", "--no-progress"]) == 0
    assert not [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("relax:")]


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("gnnpipe: error: "), err
    return err[0]


def test_relax_and_evaluate(schnet_file, is2rs_files, tmp_path, capsys):
    import ase.io

    initial, reference = is2rs_files
    out = tmp_path / "relaxed.extxyz"
    assert main(["relax", str(schnet_file), "--dataset", str(initial), "--out", str(out), "--steps", "5",
                 "--trajectory", str(tmp_path / "traj"), "--no-progress"]) == 0
    relaxed = ase.io.read(out, ":")
    assert len(relaxed) == 3 and all(a.info["relax_steps"] <= 5 for a in relaxed)
    assert len(ase.io.read(tmp_path / "traj" / "0.extxyz", ":")) == relaxed[0].info["relax_steps"] + 1
    assert main(["evaluate", "--task", "is2rs", str(schnet_file), "--dataset", str(initial), "--reference",
                 str(reference), "--relaxed", str(out), "--out", str(tmp_path / "m.json")]) == 0
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["task"] == "is2rs" and m["structures"] == 3
    assert 0 <= m["adwt"] <= 1 and 0 <= m["afbt"] <= 1 and m["energy_mae"] >= 0
    assert len(m["curves"]["adwt"]["fraction"]) == 490 and len(m["curves"]["fbt"]["fraction"]) == 390
    assert "ADwT" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    assert main(["report", str(tmp_path / "m.json"), "--out-dir", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "is2rs_curves.png").is_file()
    # results of two oracles side by side: each row names its own
    lj = dict(m, oracle="lj")
    (tmp_path / "lj.json").write_text(json.dumps(lj))
    assert main(["report", str(tmp_path / "m.json"), str(tmp_path / "lj.json"), "--out-dir", str(tmp_path / "r2"),
                 "--no-plots"]) == 0
    rows = [r for r in (tmp_path / "r2" / "report.md").read_text().splitlines() if r.startswith("| m |")
            or r.startswith("| lj |")]
    assert [r.split("|")[3].strip() for r in rows] == [m["oracle"], "lj"]


@pytest.fixture(scope="module")
def gcn_file(tmp_path_factory):
    from gnnpipe import api
    from gnnpipe.models import save

    r = api.train(model="gcn", layers=2, hidden=8, num_nodes=100, epochs=1, log_every=0)
    path = tmp_path_factory.mktemp("gcn") / "gcn.pt"
    save(r.model, path)
    return path


def test_bad_input_gets_one_line_and_exit_2(schnet_file, gcn_file, is2rs_files, tmp_path, capsys):
    import ase.io

    initial, reference = is2rs_files
    swapped = tmp_path / "swapped.extxyz"
    ase.io.write(swapped, ase.io.read(reference, ":")[::-1])
    fewer = tmp_path / "fewer.extxyz"
    ase.io.write(fewer, ase.io.read(reference, ":")[:-1])
    base = ["evaluate", "--task", "is2rs", str(schnet_file), "--dataset", str(initial)]
    cases = [
        (base + ["--reference", str(swapped)], "structure 0"),
        (base + ["--reference", str(fewer)], "reference structures"),
        (["evaluate", "--task", "is2rs", str(gcn_file), "--dataset", str(initial), "--reference", str(reference)],
         "not trained on energies and forces"),
        (["relax", str(gcn_file), "--dataset", str(initial), "--out", str(tmp_path / "x.extxyz")],
         "not trained on energies and forces"),
        (base + ["--reference", str(reference), "--oracle", "dft"], "unknown oracle"),
        (["relax", str(schnet_file), "--dataset", str(initial), "--out", str(tmp_path / "x.extxyz"), "--fmax", "0"],
         "--fmax must be > 0"),
        (base + ["--reference", str(reference), "--fmax", "-1"], "--fmax must be > 0"),
        (["relax", str(schnet_file), "--dataset", str(initial), "--out", str(tmp_path / "x.extxyz"), "--gp-size", "0"],
         "--gp-size must be >= 1"),
        (["relax", str(schnet_file), "--dataset", str(initial), "--out", str(tmp_path / "x.extxyz"), "--gp-size", "2",
          "--gp-partitioner", "nope"], "nope"),
        # relaxed structures are extended XYZ: a .db name is refused before anything runs
        (["relax", str(schnet_file), "--dataset", str(initial), "--out", str(tmp_path / "x.db")],
         "name the file .extxyz"),
        (base + ["--reference", str(reference), "--save-relaxed", str(tmp_path / "r.lmdb")], "--save-relaxed"),
    ]
    for argv, match in cases:
        assert main(argv) == 2, argv
        assert match in _one_error_line(capsys)
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "r.lmdb").exists()


def test_ctrl_c_writes_the_structures_relaxed_so_far(schnet_file, is2rs_files, tmp_path, monkeypatch, capsys):
    import ase.io

    from gnnpipe.tasks.s2ef import predict

    initial, _ = is2rs_files
    real, calls = predict.energies_forces, {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(predict, "energies_forces", flaky)
    out = tmp_path / "partial.extxyz"
    assert main(["relax", str(schnet_file), "--dataset", str(initial), "--out", str(out), "--batch-size", "2",
                 "--fmax", "1e-6"]) == 130
    written = ase.io.read(out, ":")
    assert len(written) == 3 and not all(a.info["relax_done"] for a in written)
    assert "interrupted" in capsys.readouterr().err
