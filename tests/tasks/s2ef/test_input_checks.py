"""What an S2EF run, a prediction and the planner refuse (or warn about) before any process starts: a cutoff whose
graph cannot be built, a loss that trains nothing, elements the model never saw, atomic numbers beyond its
embedding, and a planner given a profile of another setting or a --gp-size that does not divide the ranks."""

from __future__ import annotations

import json
import time
import warnings

import numpy as np
import pytest
import torch
from ase.build import bulk

from gnnpipe import api
from gnnpipe.calculator import Calculator
from gnnpipe.cli.main import main
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.data import DataWarning
from gnnpipe.errors import ConfigError, DataValidationError

from .toy import emt_clusters, write_extxyz

SMALL = dict(model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=12, batch_size=4, warmup_steps=2,
             model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0)


def _write(path, frames):
    import ase.io
    from ase.calculators.singlepoint import SinglePointCalculator

    for a in frames:
        a.calc = SinglePointCalculator(a, energy=-1.0, forces=np.zeros((len(a), 3)))
    ase.io.write(str(path), frames, format="extxyz")
    return str(path)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """A SchNet trained on Cu/Ni clusters (its file records the elements 28, 29)."""
    from gnnpipe.models import save

    r = api.train(data=emt_clusters(12, seed=4, dtype=torch.float64), epochs=1, dtype="float64", **SMALL)
    path = tmp_path_factory.mktemp("checks") / "model.pt"
    save(r.model, path)
    return path


@pytest.mark.timeout(120)
def test_a_150_angstrom_cutoff_is_refused_within_seconds(tmp_path, capsys):
    cells = []
    for k in range(10):   # 8-atom periodic copper cells of 7.2 x 3.6 x 3.6 Å: ~10 million pairs each at 150 Å
        a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
        a.rattle(0.05, seed=k)
        cells.append(a)
    path = _write(tmp_path / "cu.extxyz", cells)
    t0 = time.perf_counter()
    assert main(["train", "--dataset", path, "--model", "schnet", "--cutoff", "150", "--no-progress"]) == 2
    took = time.perf_counter() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gnnpipe: error: --cutoff 150 Å: the neighbour search"), err
    assert "atom pairs" in err[0] and "edges" in err[0] and "lower --cutoff to about" in err[0]
    assert took < 10.0, took


def test_zero_loss_coefficients_are_refused(capsys):
    with pytest.raises(ConfigError, match=r"--energy-coef 0 and --force-coef 0 without --stress-coef.*nothing would "
                                          r"be trained"):
        TrainConfig(energy_coef=0, force_coef=0.0)
    TrainConfig(energy_coef=0, force_coef=1.0)                      # forces only: trains
    TrainConfig(energy_coef=0, force_coef=0.0, stress_coef=1.0)     # stresses only: trains
    assert main(["train", "--model", "schnet", "--energy-coef", "0", "--force-coef", "0"]) == 2
    assert "--energy-coef 0 and --force-coef 0" in capsys.readouterr().err


def _iron():
    return bulk("Fe", "bcc", a=2.87, cubic=True)


def test_unseen_elements_are_warned_about_once_or_refused(model_file, tmp_path):
    calc = Calculator(model_file)
    atoms = _iron()
    atoms.calc = calc
    with pytest.warns(DataWarning, match=r"not trained on Fe \(Z = 26; 1 structure, first 0\).*trained on Ni, Cu"):
        atoms.get_potential_energy()
    cluster = emt_clusters(1, seed=9)[0]
    from gnnpipe.data.atoms import to_atoms

    seen = to_atoms(cluster)
    seen.calc = Calculator(model_file)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                               # trained elements: no warning
        seen.get_potential_energy()
    strict = _iron()
    strict.calc = Calculator(model_file, unseen_elements="error")
    with pytest.raises(DataValidationError, match="not trained on Fe"):
        strict.get_potential_energy()
    with pytest.raises(ConfigError, match="unseen_elements must be one of"):
        Calculator(model_file, unseen_elements="maybe")
    # gnnpipe predict: warned, or refused with --unseen-elements error
    fe = _write(tmp_path / "fe.extxyz", [_iron(), _iron()])
    with pytest.warns(DataWarning, match=r"Fe \(Z = 26; 2 structures, first 0\)"):
        assert main(["predict", str(model_file), "--dataset", fe]) == 0
    assert main(["predict", str(model_file), "--dataset", fe, "--unseen-elements", "error"]) == 2


def test_a_model_file_without_the_record_still_loads_and_predicts(model_file, tmp_path):
    obj = torch.load(model_file, weights_only=True)
    del obj["meta"]["task_meta"]["normalizer"]["elements"]           # a file written before it was recorded
    old = tmp_path / "old.pt"
    torch.save(obj, old)
    atoms = _iron()
    atoms.calc = Calculator(old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                               # nothing can be said: no warning
        assert np.isfinite(atoms.get_potential_energy())


def test_atomic_numbers_beyond_max_z_are_refused_naming_the_file_structure_and_element(tmp_path, model_file):
    frames = [f.copy() for f in _clusters_as_atoms(4)]
    frames[2].numbers[1] = 118                                      # oganesson, beyond SchNet's max_z 99
    path = _write(tmp_path / "og.extxyz", frames)
    small = {k: v for k, v in SMALL.items() if k != "log_every"}
    t0 = time.perf_counter()
    with pytest.raises(DataValidationError, match=r"^og\.extxyz: structure 2 has Og \(Z = 118\), beyond the atomic "
                                                  r"numbers 1 … 99 schnet embeds \(max_z\).*--model-arg max_z=118"):
        api.train(dataset=path, epochs=1, progress=False, **small)
    assert time.perf_counter() - t0 < 30
    og = _clusters_as_atoms(1)[0]
    og.numbers[0] = 118
    og.calc = Calculator(model_file)
    with pytest.raises(DataValidationError, match=r"structure 0 has Og \(Z = 118\), beyond .* 1 … 99"):
        og.get_potential_energy()


def _clusters_as_atoms(n):
    from gnnpipe.data.atoms import to_atoms

    return [to_atoms(d) for d in emt_clusters(n, seed=3)]


# ------------------------------------------------------------------------------------------------ the planner


@pytest.fixture(scope="module")
def xyz(tmp_path_factory):
    return write_extxyz(tmp_path_factory.mktemp("plan") / "clusters.extxyz", 12, seed=1)


def _profile(tmp_path, **changes):
    from gnnpipe.tasks.s2ef.cost import AtomProfile

    prof = AtomProfile(model="schnet", step_s=0.01, work=1e6, kappa=2.0, peak_bytes=1 << 20, grad_bytes=1 << 10,
                       kept_bytes=1e5, edges=100, triplets=0, atoms=20, structures=4, element_size=4, threads=1,
                       direct_forces=False)
    d = {**prof.to_dict(), **changes}
    d = {k: v for k, v in d.items() if v is not None}
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(d))
    return str(path)


PLAN = ["plan", "--task", "s2ef", "--model", "schnet", "--layers", "1", "--hidden", "8", "--cutoff", "4",
        "--max-neighbors", "12", "--batch-size", "4", "--model-arg", "num_filters=8", "--model-arg", "num_gaussians=8",
        "--no-progress", "--no-pipeline"]


def test_plan_refuses_a_profile_of_other_threads_dtype_or_force_mode(tmp_path, xyz, capsys):
    prof = _profile(tmp_path)
    for flags, named in ((["--threads", "2"], "--threads 1 (this plan: --threads 2)"),
                         (["--dtype", "float64"], "float32 values (this plan: --dtype float64)"),
                         (["--direct-forces"], "conservative forces (this plan: --direct-forces)")):
        assert main([*PLAN, "--dataset", xyz, "--ranks", "1", "--profile-in", prof, *flags]) == 2
        err = capsys.readouterr().err
        assert named in err and "profile again" in err, err
    old = _profile(tmp_path, direct_forces=None)      # written before the force mode was recorded: not checked
    assert main([*PLAN, "--dataset", xyz, "--ranks", "1", "--profile-in", old, "--direct-forces"]) == 0


def test_plan_prints_the_planned_batch_and_refuses_a_gp_size_that_does_not_divide_the_ranks(tmp_path, xyz, capsys):
    assert main([*PLAN, "--dataset", xyz, "--ranks", "2", "--gp-size", "3"]) == 2
    assert "--gp-size 3 does not divide --ranks 2" in capsys.readouterr().err
    assert main([*PLAN, "--dataset", xyz, "--ranks", "2", "--gp-size", "2", "--profile-in", _profile(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("model:"))
    # the planned batch: the first 4 structures of the training split (not the profile's 20 atoms, 100 edges)
    assert "replica batch: 4 structures (" in line and "taken on 20 atoms, 100 edges, 0 triplets" in line, line
    rows = [x for x in out.splitlines() if x.startswith("S1x")]
    assert rows and all(r.startswith("S1xG2xD1") for r in rows)      # only the layouts of --gp-size 2


def test_a_pipeline_refused_for_its_stages_prints_no_header(xyz, capsys):
    small = {k: v for k, v in SMALL.items() if k != "log_every"}
    with pytest.raises(ConfigError, match="--stages 9 exceeds"):
        api.train(dataset=xyz, stages=9, epochs=1, progress=True, **small)
    assert "training schnet" not in capsys.readouterr().err


def test_the_cutoff_said_to_fit_a_refused_slab_fits():
    """Pairs grow as the square of the cutoff in a slab (periodic in x, y), not its cube: the cutoff the message
    names must pass the same check (a cube-root rule named 572 Å here, itself refused)."""
    import re

    from ase.build import fcc111

    from gnnpipe.data.atoms import from_atoms
    from gnnpipe.data.atoms.estimate import MAX_BUILD_SECONDS, check_graph_size, estimate_graph

    slabs = from_atoms([fcc111("Cu", size=(2, 2, 3), vacuum=10.0) for _ in range(4)])
    with pytest.raises(ConfigError, match=r"--cutoff 1000 Å.*beyond the limit") as info:
        check_graph_size(slabs, 1000.0, 12, batch_size=4)
    fit = float(re.search(r"lower --cutoff to about ([0-9.e+]+) Å or less", str(info.value)).group(1))
    assert 300 < fit < 1000
    assert estimate_graph(slabs, fit, 12, batch_size=4).batch_seconds <= MAX_BUILD_SECONDS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        check_graph_size(slabs, fit, 12, batch_size=4)  # not refused


def test_a_device_the_run_does_not_use_is_refused_with_one_line(xyz, capsys):
    """``--device cuda`` is never silently ignored: without a GPU it is refused as node classification refuses it."""
    assert main(["train", "--dataset", xyz, "--model", "schnet", "--layers", "1", "--hidden", "8", "--epochs", "1",
                 "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and err[0].startswith("gnnpipe: error:")


def test_a_singular_periodic_cell_is_named_before_the_graph_is_estimated(tmp_path, capsys):
    good = bulk("Cu", "fcc", a=3.6, cubic=True)
    bad = good.copy()
    bad.set_cell([[3.6, 0, 0], [7.2, 0, 0], [0, 0, 3.6]])
    path = _write(tmp_path / "s.extxyz", [good.copy(), good.copy(), bad, good.copy()])
    assert main(["train", "--dataset", path, "--model", "schnet", "--layers", "1", "--hidden", "8", "--epochs", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "s.extxyz: structure 2: the cell is singular" in err and "enumerates" not in err


def test_a_set_with_no_neighbours_anywhere_is_refused_and_some_isolated_ones_are_warned_of(tmp_path, capsys):
    from ase import Atoms

    far = [Atoms("Cu2", positions=[[0, 0, 0], [15, 0, 0]]) for _ in range(10)]
    path = _write(tmp_path / "far.extxyz", far)
    with pytest.raises(ConfigError, match="no structure of the far.extxyz structures has a pair of atoms within "
                                          "--cutoff 4.0 Å"):
        api.train(TrainConfig(dataset=path, epochs=1, **{k: v for k, v in SMALL.items() if k != "log_every"}),
                  log_every=0)
    near = [Atoms("Cu2", positions=[[0, 0, 0], [2.5, 0, 0]]) for _ in range(8)]
    path = _write(tmp_path / "some.extxyz", far[:2] + near)
    with pytest.warns(DataWarning, match="2 of the 10 structures .* have no pair of atoms within --cutoff 4.0 Å"):
        api.train(TrainConfig(dataset=path, epochs=1, **{k: v for k, v in SMALL.items() if k != "log_every"}),
                  log_every=0)


def test_the_header_is_printed_without_progress_and_names_data_model_layout_and_schedule(xyz, capsys):
    main(["train", "--dataset", xyz, "--model", "schnet", "--layers", "1", "--hidden", "8", "--epochs", "1",
          "--replicas", "1", "--warmup-steps", "2", "--no-progress"])
    err = capsys.readouterr().err
    for part in ("data: ", "structures", "train/val/test", "elements ", "model: schnet", "parameters",
                 "layout: S 1 × G 1 × D 1 = 1 rank", "loader worker", "loss: ", "training: 1 epoch",
                 "warm-up over 2 steps", "EMA", "(1 interaction block, "):
        assert part in err, part
    main(["train", "--dataset", xyz, "--model", "schnet", "--layers", "1", "--hidden", "8", "--epochs", "1",
          "--warmup-steps", "1000", "--no-progress"])
    assert "warm-up over 1,000 steps from 0.2× (the run takes" in capsys.readouterr().err
