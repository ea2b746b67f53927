"""The EMT-labelled generated data sets (gnnpipe.data.atoms.generate) and ``gnnpipe atoms generate``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.calculators.emt import EMT

from gnnpipe.cli.main import main
from gnnpipe.data.atoms import (
    BULK_LATTICES,
    EMT_METALS,
    build_graph,
    generate_bulk_like,
    generate_md17_like,
    generate_oc20_like,
    generated_file,
    generated_structures,
    read_structures,
    validate_structures,
)


def test_oc20_like_frames_are_slabs_with_adsorbates_fixed_bottom_and_emt_labels():
    frames = generate_oc20_like(12, seed=1, relax_steps=3)
    assert len(frames) == 12
    for a in frames:
        assert a.pbc.tolist() == [True, True, False] and len(a) in (13, 14)
        tags = a.get_tags()
        assert set(tags[:12]) == {0, 1} and set(tags[12:]) == {2}
        fixed = a.constraints[0].get_indices()
        assert len(fixed) == 4 and np.all(tags[fixed] == 0)    # the bottom layer (3 layers of 2x2)
        z = a.positions[:, 2]
        assert z[12:].min() > z[:12].max() and z.min() > 4.0 and a.cell[2, 2] - z.max() > 4.0
        assert a.info["adsorbate"] in ("O", "H", "N", "C", "CO", "OH") and a.info["site"] in (
            "ontop", "bridge", "fcc", "hcp")
    probe = frames[5].copy()
    probe.calc = EMT()
    assert np.isclose(probe.get_potential_energy(), frames[5].get_potential_energy())
    np.testing.assert_allclose(probe.get_forces(apply_constraint=False),
                               frames[5].calc.results["forces"], atol=1e-10)
    validate_structures(__import__("gnnpipe.data.atoms", fromlist=["from_atoms"]).from_atoms(frames),
                        cutoff=6.0, require_labels=True)


def test_oc20_like_is_seeded_and_holds_relaxation_trajectories():
    a = generate_oc20_like(10, seed=3, relax_share=1.0, relax_steps=4)
    b = generate_oc20_like(10, seed=3, relax_share=1.0, relax_steps=4)
    c = generate_oc20_like(10, seed=4, relax_share=1.0, relax_steps=4)
    assert all(np.array_equal(x.positions, y.positions) for x, y in zip(a, b))
    assert not all(np.array_equal(x.positions, y.positions) for x, y in zip(a, c))
    # the first five frames are one BFGS trajectory of one system: the energy goes down along it
    e = [f.get_potential_energy() for f in a[:5]]
    assert len({f.info["site"] + f.info["metal"] + f.info["adsorbate"] for f in a[:5]}) == 1
    assert e[-1] < e[0]
    with pytest.raises(ValueError, match="unknown metal 'Fe'"):
        generate_oc20_like(2, metals=("Fe",))
    with pytest.raises(ValueError, match="fixed_layers"):
        generate_oc20_like(2, fixed_layers=3)


def test_md17_like_molecules_are_labelled_and_stay_bonded():
    frames = generate_md17_like(8, seed=0, molecules=("CH3CH2OH", "C6H6"))
    assert [f.info["molecule"] for f in frames] == ["CH3CH2OH"] * 4 + ["C6H6"] * 4
    for f in frames:
        assert not f.pbc.any() and f.get_potential_energy() != 0
        d = f.get_all_distances()[np.triu_indices(len(f), 1)]
        assert d.min() > 0.7 and d.max() < 6.0
    with pytest.raises(ValueError, match="EMT cannot label"):
        generate_md17_like(2, molecules=("SiH4",))


def test_bulk_like_frames_are_strained_periodic_crystals_with_emt_stress():
    frames = generate_bulk_like(24, seed=5)
    assert len(frames) == 24
    assert {a.info["lattice"] for a in frames} == set(BULK_LATTICES)
    assert any("-" in a.info["metals"] for a in frames) and any("-" not in a.info["metals"] for a in frames)
    for a in frames:
        assert a.pbc.all() and 4 <= len(a) <= 32 and a.get_volume() > 0
        assert set(a.get_chemical_symbols()) <= set(EMT_METALS)
        assert set(a.get_chemical_symbols()) == set(a.info["metals"].split("-"))
        d = a.get_all_distances(mic=True)[np.triu_indices(len(a), 1)]
        assert d.min() > 1.8                                # rattled, not collapsed
        probe = a.copy()
        probe.calc = EMT()
        np.testing.assert_allclose(a.get_stress(), probe.get_stress(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.get_forces(), probe.get_forces(), rtol=0, atol=1e-12)
        assert np.isclose(a.get_potential_energy(), probe.get_potential_energy(), rtol=0, atol=1e-10)
        assert np.abs(a.get_stress()).max() > 1e-3         # the strain gives a stress (eV/Å³; 1e-3 = 0.16 GPa)
    stress = np.array([a.get_stress() for a in frames])
    assert stress[:, :3].min() < -1e-3 and stress[:, :3].max() > 1e-3    # compressed and stretched ones
    assert np.abs(stress[:, 3:]).max() > 1e-3                          # shear too
    with pytest.raises(ValueError, match="unknown lattice 'sc'"):
        generate_bulk_like(2, lattices=("sc",))
    with pytest.raises(ValueError, match="unknown metal 'Fe'"):
        generate_bulk_like(2, metals=("Fe",))


def test_bulk_like_is_seeded():
    a = generate_bulk_like(6, seed=3)
    b = generate_bulk_like(6, seed=3)
    c = generate_bulk_like(6, seed=4)
    for x, y in zip(a, b):
        assert np.array_equal(x.positions, y.positions) and np.array_equal(x.cell.array, y.cell.array)
        assert x.get_chemical_symbols() == y.get_chemical_symbols()
        assert np.array_equal(x.get_stress(), y.get_stress())
    assert not all(len(x) == len(y) and np.array_equal(x.cell.array, y.cell.array) for x, y in zip(a, c))


def test_cli_atoms_generate_bulk_and_the_bulk_like_training_set(tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace

    from gnnpipe.tasks.s2ef.data import GENERATED, is_structure_dataset, load_structures

    out = tmp_path / "bulk.extxyz"
    assert main(["atoms", "generate", "--kind", "bulk", "--frames", "5", "--seed", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    data = read_structures(out, require_labels=True, dtype=torch.float64)
    want = generate_bulk_like(5, seed=2)
    assert len(data) == 5
    for d, w in zip(data, want):
        assert d.pbc.all() and d.stress.shape == (1, 3, 3)
        assert np.array_equal(d.stress.reshape(3, 3).numpy(), w.get_stress(voigt=False))   # exactly as written
    validate_structures(data, torch.float64, cutoff=5.0, require_labels=True)
    db = tmp_path / "bulk.aselmdb"
    assert main(["atoms", "generate", "--kind", "bulk", "--frames", "2", "--seed", "2", "--out", str(db)]) == 0
    assert torch.equal(read_structures(db, dtype=torch.float64)[1].stress, data[1].stress)
    # --dataset bulk-like: generated once (cached), read with its stresses
    monkeypatch.setenv("GNNPIPE_CACHE", str(tmp_path / "cache"))
    assert "bulk-like" in GENERATED and is_structure_dataset("bulk-like")
    config = SimpleNamespace(dataset="bulk-like", frames=5, seed=2, torch_dtype=torch.float64, cutoff=5.0, root=None,
                             energy_key=None, forces_key=None)
    got = load_structures(config)
    assert len(got) == 5 and all(torch.equal(g.stress, d.stress) for g, d in zip(got, data))
    assert torch.equal(generated_structures("bulk", 5, seed=2, dtype=torch.float64)[0].stress, data[0].stress)


def test_generated_file_is_cached_by_its_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNPIPE_CACHE", str(tmp_path))
    p = generated_file("oc20", 6, seed=0, relax_steps=2)
    assert p.parent == tmp_path / "atoms" and p.suffix == ".extxyz"
    mtime = p.stat().st_mtime_ns
    assert generated_file("oc20", 6, seed=0, relax_steps=2) == p and p.stat().st_mtime_ns == mtime
    q = generated_file("oc20", 6, seed=1, relax_steps=2)
    r = generated_file("oc20", 6, seed=0, relax_steps=3)
    assert len({p, q, r}) == 3
    data = read_structures(p, require_labels=True)
    want = generate_oc20_like(6, seed=0, relax_steps=2)
    assert len(data) == 6
    for d, w in zip(data, want):
        np.testing.assert_allclose(d.forces.numpy(), w.calc.results["forces"], atol=1e-5)
        assert d.fixed.sum() == 4 and (d.tags == 2).any()
    got = generated_structures("oc20", 6, seed=0, relax_steps=2, dtype=torch.float64)
    assert got[0].pos.dtype == torch.float64 and p.stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="unknown generated data set"):
        generated_file("qm9", 2)


def test_cli_atoms_generate_writes_extxyz(tmp_path, capsys):
    out = tmp_path / "md.extxyz"
    assert main(["atoms", "generate", "--kind", "md17", "--frames", "4", "--seed", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    data = read_structures(out, require_labels=True)
    assert len(data) == 4
    graph = build_graph(data[0], 5.0)
    assert graph.num_edges == int(data[0].natoms) * (int(data[0].natoms) - 1)   # a small molecule: all pairs
    assert [f.name for f in tmp_path.iterdir()] == ["md.extxyz"]       # nothing else beside a chosen file
    assert main(["atoms", "generate", "--frames", "0"]) == 2
    # a suffix that names no format is refused, not written as extended XYZ under that name
    assert main(["atoms", "generate", "--kind", "md17", "--frames", "1", "--out", str(tmp_path / "p.txt")]) == 2
    assert "name the file .extxyz, .db" in capsys.readouterr().err and not (tmp_path / "p.txt").exists()


def test_cli_atoms_generate_into_a_database_keeps_what_exists_and_refuses_is2rs(tmp_path, capsys):
    db = tmp_path / "b.db"
    assert main(["atoms", "generate", "--kind", "md17", "--frames", "2", "--out", str(db)]) == 0
    assert main(["atoms", "generate", "--kind", "md17", "--frames", "3", "--out", str(db)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert len(read_structures(db)) == 2
    assert main(["atoms", "generate", "--kind", "oc20-is2rs", "--frames", "1", "--out", str(tmp_path / "i.db")]) == 2
    assert "give --out NAME.extxyz" in capsys.readouterr().err and not (tmp_path / "i.db").exists()


def test_cli_atoms_generate_draws_the_given_metals_and_adsorbates(tmp_path, capsys):
    """``--metals`` / ``--adsorbates`` narrow the draws (an out-of-domain split: adsorbates the training set lacks),
    into any format; a kind that does not draw them, an unknown name or an empty list is refused."""
    ood = tmp_path / "val_ood_ads.lmdb"
    assert main(["atoms", "generate", "--frames", "6", "--seed", "1", "--adsorbates", "CO, OH",
                 "--metals", "Cu,Pt", "--out", str(ood)]) == 0
    assert "adsorbates CO OH" in capsys.readouterr().err
    data = read_structures(ood)
    assert len(data) == 6
    for d in data:
        ads = sorted(d.z[d.tags == 2].tolist())
        assert ads in ([6, 8], [1, 8]) and set(d.z[d.tags != 2].tolist()) <= {29, 78}
    xyz = tmp_path / "cu.extxyz"
    assert main(["atoms", "generate", "--frames", "2", "--metals", "Cu", "--adsorbates", "O", "--out", str(xyz)]) == 0
    assert {a.info["metal"] + a.info["adsorbate"] for a in __import__("ase.io").io.read(xyz, ":")} == {"CuO"}
    capsys.readouterr()
    for argv, message in ((["--kind", "md17", "--adsorbates", "CO"], "--kind md17 draws no adsorbates"),
                          (["--kind", "bulk", "--adsorbates", "O"], "--kind bulk draws no adsorbates"),
                          (["--adsorbates", "CO,Fe"], "unknown Fe; choose from O, H, N, C, CO, OH"),
                          (["--metals", ","], "--metals names none")):
        assert main(["atoms", "generate", "--frames", "1", *argv, "--out", str(tmp_path / "x.extxyz")]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "x.extxyz").exists()


@pytest.mark.slow
def test_oc20_paths_are_whole_relaxations_of_is2rs_like_structures():
    """Every third BFGS step and the last: each system's frames go from its initial structure to EMT's minimum."""
    import numpy as np

    from gnnpipe.data.atoms.generate import generate_oc20_is2rs, generate_oc20_paths

    frames = generate_oc20_paths(30, seed=3, fmax=0.05)
    assert len(frames) == 30 and all(len(a) == len(frames[0]) for a in frames[:2])
    initial, _ = generate_oc20_is2rs(1, seed=3, fmax=0.05)
    np.testing.assert_allclose(frames[0].positions, initial[0].positions)  # the same first system, its first frame
    fmax = [float(np.linalg.norm(a.get_forces(), axis=1).max()) for a in frames]   # free atoms (FixAtoms)
    assert min(fmax) < 0.05 and max(fmax) > 0.5      # at a minimum (a relaxation's last frame) and far from it
    with pytest.raises(ValueError, match="stride"):
        generate_oc20_paths(2, stride=0)
