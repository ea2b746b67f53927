"""Stress labels of structures (gnnpipe.data.atoms): read from every format (``stress`` as 9 or 6 values, or a
``virial``), written back exactly, absent where unlabelled, batched with unlabelled structures, and refused when
malformed."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from ase.build import bulk, fcc111
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from torch_geometric.data import Batch, Data

from gnnpipe.data.atoms import (
    from_atoms,
    open_structures,
    read_structures,
    stress_label,
    to_atoms,
    validate_structures,
    with_stress_slot,
    write_structures,
)
from gnnpipe.data.atoms.sets import PreparedSet, prepare_one
from gnnpipe.errors import DataValidationError

FORMATS = (".extxyz", ".db", ".aselmdb", ".lmdb")

#: a symmetric stress, eV/Å³, with digits float64 holds (extended XYZ writes them as Python's repr)
S = np.array([[0.0123456789012345, -0.0011223344556677, 0.0004455667788991],
              [-0.0011223344556677, -0.0234567890123456, 0.0021098765432109],
              [0.0004455667788991, 0.0021098765432109, 0.0056789012345678]])
VOIGT = np.array([S[0, 0], S[1, 1], S[2, 2], S[1, 2], S[0, 2], S[0, 1]])


def _crystal(seed: int = 0):
    """A strained, rattled Cu crystal labelled by EMT (energy, forces, stress) in a SinglePointCalculator."""
    a = bulk("Cu", cubic=True).repeat((1, 1, 2))
    a.set_cell(a.cell.array @ np.array([[1.02, 0.01, 0], [0.01, 0.99, 0], [0, 0, 1.01]]), scale_atoms=True)
    a.rattle(0.05, seed=seed)
    a.calc = EMT()
    res = {"energy": a.get_potential_energy(), "forces": a.get_forces(), "stress": a.get_stress()}
    out = a.copy()
    out.calc = SinglePointCalculator(out, **res)
    return out


def _frame(stress_field: str, comment_extra: str = "") -> str:
    """One extended-XYZ frame of 4 Cu atoms in a cubic 3.6 Å cell with ``stress_field`` in its comment line."""
    pos = bulk("Cu", "fcc", a=3.6, cubic=True).positions
    lines = [f"Cu {x:.10f} {y:.10f} {z:.10f} 0.0 0.0 0.0" for x, y, z in pos]
    comment = ('Lattice="3.6 0.0 0.0 0.0 3.6 0.0 0.0 0.0 3.6" Properties=species:S:1:pos:R:3:forces:R:3 '
               f'energy=-1.25 {stress_field}{comment_extra} pbc="T T T"')
    return "\n".join(["4", comment, *lines]) + "\n"


def _values(a) -> str:
    return " ".join(repr(float(x)) for x in np.asarray(a).reshape(-1))


def _stress(d) -> np.ndarray:
    return d.stress.reshape(3, 3).numpy()


def test_extxyz_stress_of_9_and_6_values_and_virials_read_exactly(tmp_path):
    volume = 3.6 ** 3
    virial = -S * volume
    virial_voigt = virial[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]]
    path = tmp_path / "s.extxyz"
    path.write_text(_frame(f'stress="{_values(S)}"') + _frame(f'stress="{_values(VOIGT)}"')
                    + _frame(f'virial="{_values(virial)}"') + _frame(f'virial="{_values(virial_voigt)}"')
                    + _frame(""))
    for data in (read_structures(path, dtype=torch.float64),
                 [open_structures(path)[i] for i in range(5)]):
        assert all(d.stress.dtype == torch.float64 and d.stress.shape == (1, 3, 3) for d in data[:4])
        assert np.array_equal(_stress(data[0]), S) and np.array_equal(_stress(data[1]), S)   # as written
        for d in data[2:4]:                       # stress = -virial / V
            np.testing.assert_allclose(_stress(d), S, rtol=1e-14, atol=1e-17)
        assert not hasattr(data[4], "stress") and not hasattr(data[4], "has_stress")    # unlabelled stays so
        assert float(data[0].energy) == -1.25
    # Voigt order xx yy zz yz xz xy
    d = read_structures(path, index=1, dtype=torch.float64)[0]
    assert d.stress[0, 1, 2] == VOIGT[3] and d.stress[0, 0, 2] == VOIGT[4] and d.stress[0, 0, 1] == VOIGT[5]


def test_extxyz_stress_under_another_key_and_in_float32(tmp_path):
    path = tmp_path / "k.extxyz"
    path.write_text(_frame(f'REF_stress="{_values(S)}"', f' REF_virial="{_values(-2 * S * 3.6 ** 3)}"'))
    assert not hasattr(read_structures(path)[0], "stress")        # not under the default keys
    d = read_structures(path, stress_key="REF_stress", dtype=torch.float64)[0]
    assert np.array_equal(_stress(d), S)
    d = open_structures(path, stress_key="nothing", virial_key="REF_virial")[0]   # the virial when no stress
    np.testing.assert_allclose(_stress(d), 2 * S, rtol=1e-14)
    d32 = read_structures(path, stress_key="REF_stress")[0]
    assert d32.stress.dtype == torch.float32 and torch.equal(d32.stress, torch.tensor(S).float().reshape(1, 3, 3))


def test_emt_stress_keeps_ase_sign_through_every_format(tmp_path):
    """A compressed crystal: negative stress (ASE: positive is tensile), equal to EMT's get_stress(voigt=False)."""
    a = bulk("Cu", cubic=True)
    a.set_cell(a.cell * 0.97, scale_atoms=True)
    a.calc = EMT()
    want = a.get_stress(voigt=False)
    assert np.all(np.diag(want) < 0)
    for suf in FORMATS:
        write_structures(tmp_path / f"e{suf}", [a])
        got = open_structures(tmp_path / f"e{suf}")[0]
        np.testing.assert_allclose(_stress(got), want, rtol=0, atol=1e-15)
        np.testing.assert_allclose(to_atoms(got).get_stress(voigt=False), want, rtol=0, atol=1e-15)


def test_every_format_round_trips_stress_exactly_and_keeps_unlabelled_ones_unlabelled(tmp_path):
    labelled = [_crystal(seed) for seed in range(3)]
    plain = labelled[1].copy()
    plain.calc = SinglePointCalculator(plain, energy=labelled[1].get_potential_energy(),
                                       forces=labelled[1].get_forces())
    src = tmp_path / "src.extxyz"
    write_structures(src, [labelled[0], plain, labelled[2]])
    first = read_structures(src, dtype=torch.float64)
    assert [hasattr(d, "stress") for d in first] == [True, False, True]
    for d, a in zip(first[::2], labelled[::2]):
        assert np.array_equal(_stress(d), a.get_stress(voigt=False))
    prev = src
    for suf in (".db", ".aselmdb", ".lmdb", ".extxyz"):         # a chain of conversions, Data in, Data out
        out = tmp_path / f"c{suf}"
        s = open_structures(prev)
        assert write_structures(out, (s[i] for i in range(len(s)))) == 3
        got = [open_structures(out)[i] for i in range(3)]
        assert [hasattr(d, "stress") for d in got] == [True, False, True], suf
        assert not any(hasattr(d, "has_stress") for d in got)
        for d, e in zip(got[::2], first[::2]):
            assert d.stress.dtype == torch.float64 and torch.equal(d.stress, e.stress), suf
            assert torch.equal(d.energy, e.energy) and torch.equal(d.forces, e.forces), suf
        assert read_structures(out, dtype=torch.float64)[1].keys() == first[1].keys()
        prev = out


def test_databases_read_stress_from_data_and_virials(tmp_path):
    import ase.db

    a = bulk("Cu", "fcc", a=3.6, cubic=True)
    volume = a.get_volume()
    for suf in (".db", ".aselmdb"):
        path = tmp_path / f"d{suf}"
        with ase.db.connect(str(path), use_lock_file=False) as db:
            db.write(a, data={"stress": S.reshape(1, 3, 3)})                # SchNetPack-style: in data
            db.write(a, data={"virial": -S * volume})
            db.write(a, data={"my_stress": VOIGT})
            b = a.copy()
            b.calc = SinglePointCalculator(b, energy=1.0, stress=VOIGT)       # the row's stress column
            db.write(b)
            db.write(a)
        got = [open_structures(path)[i] for i in range(5)]
        assert np.array_equal(_stress(got[0]), S) and np.array_equal(_stress(got[3]), S), suf
        np.testing.assert_allclose(_stress(got[1]), S, rtol=1e-14)
        assert not hasattr(got[2], "stress") and not hasattr(got[4], "stress")
        assert np.array_equal(_stress(open_structures(path, stress_key="my_stress")[2]), S)
        if suf == ".db":
            mem = read_structures(path, dtype=torch.float64)
            assert [hasattr(d, "stress") for d in mem] == [True, True, False, True, False]
            assert np.array_equal(_stress(mem[0]), S)


def test_fairchem_records_read_stress_and_virial(tmp_path):
    import lmdb

    d = from_atoms([bulk("Cu", "fcc", a=3.6, cubic=True)], dtype=torch.float64)[0]
    base = {"pos": d.pos, "atomic_numbers": d.z.double(), "cell": d.cell, "natoms": 4, "y": -1.0,
            "force": torch.zeros(4, 3), "pbc": torch.ones(1, 3, dtype=torch.bool)}
    path = tmp_path / "f.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"0", pickle.dumps(Data(**base, stress=torch.tensor(S, dtype=torch.float32).reshape(1, 3, 3))))
        txn.put(b"1", pickle.dumps(Data(**base, virial=torch.tensor(-S * 3.6 ** 3).reshape(1, 3, 3))))
        txn.put(b"2", pickle.dumps(Data(**base)))
        txn.put(b"length", pickle.dumps(3))
    env.close()
    s = open_structures(path)
    assert torch.equal(s[0].stress, torch.tensor(S, dtype=torch.float32).double().reshape(1, 3, 3))
    np.testing.assert_allclose(_stress(s[1]), S, rtol=1e-14)
    assert not hasattr(s[2], "stress")
    # gnnpipe's own records: fairchem's field, [1, 3, 3]
    write_structures(tmp_path / "g.lmdb", [s[1], s[2]])
    env = lmdb.open(str(tmp_path / "g.lmdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        rec = pickle.loads(txn.get(b"0"))
        assert rec.stress.shape == (1, 3, 3) and torch.equal(rec.stress, s[1].stress)
        assert "stress" not in pickle.loads(txn.get(b"1"))
    env.close()


def test_labelled_and_unlabelled_structures_batch_together(tmp_path):
    a = _crystal()
    slab = fcc111("Cu", (2, 2, 3), vacuum=5.0)
    slab.info.pop("adsorbate_info", None)
    slab.calc = SinglePointCalculator(slab, energy=-3.0, forces=np.zeros((12, 3)))
    path = tmp_path / "m.extxyz"
    write_structures(path, [a, slab])
    for dtype in (torch.float64, torch.float32):
        prepared = PreparedSet(open_structures(path), dtype)
        items = [prepared[0], prepared[1]]
        assert [d.has_stress.tolist() for d in items] == [[True], [False]]
        batch = Batch.from_data_list(items)
        assert batch.stress.shape == (2, 3, 3) and batch.stress.dtype == dtype
        assert batch.has_stress.tolist() == [True, False] and not batch.stress[1].any()
        assert torch.equal(batch.stress[batch.has_stress][0], torch.tensor(a.get_stress(voigt=False)).to(dtype))
    raw = read_structures(path, dtype=torch.float64)         # read: the label only where there is one
    assert hasattr(raw[0], "stress") and not hasattr(raw[1], "stress")
    with pytest.raises(Exception):  # noqa: B017 - PyG's own error: the keys differ
        Batch.from_data_list(raw)
    batch = Batch.from_data_list([with_stress_slot(d) for d in raw])
    assert batch.has_stress.tolist() == [True, False]
    assert stress_label(batch[0]) is not None and stress_label(batch[1]) is None
    # an unlabelled prepared structure is written unlabelled
    write_structures(tmp_path / "back.extxyz", items)
    back = read_structures(tmp_path / "back.extxyz")
    assert hasattr(back[0], "stress") and not hasattr(back[1], "stress")
    # prepare_one gives a hand-built structure (no stress keys) the placeholder too
    hand = Data(z=torch.tensor([29]), pos=torch.zeros(1, 3), cell=torch.zeros(1, 3, 3),
                pbc=torch.zeros(1, 3, dtype=torch.bool), energy=torch.zeros(1), forces=torch.zeros(1, 3))
    p = prepare_one(hand, torch.float64, "x", 0)
    assert p.has_stress.tolist() == [False] and p.stress.shape == (1, 3, 3) and p.stress.dtype == torch.float64


def _labelled_data(**kw) -> Data:
    d = from_atoms([_crystal()], dtype=torch.float64)[0]
    for k, v in kw.items():
        setattr(d, k, v)
    return d


def test_bad_stress_is_refused_naming_the_structure(tmp_path):
    good = _labelled_data()
    validate_structures([good], torch.float64)
    cases = [
        (_labelled_data(stress=torch.zeros(1, 6, dtype=torch.float64)), r"structure 1: stress must be \[1, 3, 3\]"),
        (_labelled_data(stress=torch.full((1, 3, 3), float("nan"), dtype=torch.float64)),
         r"structure 1: stress\[0, 0\] is nan \(not finite"),
        (_labelled_data(pbc=torch.tensor([[True, True, False]])),
         r"structure 1: has a stress label but its cell is not periodic in 3D"),
        (_labelled_data(stress=torch.full((1, 3, 3), 1e300, dtype=torch.float64)),
         r"structure 1: stress\[0, 0\] = 1e\+300 eV/Å³ is finite"),
        (_labelled_data(has_stress=torch.tensor([True]), stress=None), r"structure 1: has_stress is True but"),
        (_labelled_data(has_stress=torch.tensor([1.0])), r"structure 1: has_stress must be one boolean"),
    ]
    for bad, msg in cases:
        dtype = torch.float32 if "1e" in msg else torch.float64
        with pytest.raises(DataValidationError, match=msg):
            validate_structures([good, bad], dtype)
    unlabelled = _labelled_data(has_stress=torch.tensor([False]), pbc=torch.tensor([[True, True, False]]))
    validate_structures([unlabelled], torch.float64)          # no label: no need of a 3D cell
    # in a file: named by the file and the structure's index in it, at reading or at validation
    path = tmp_path / "bad.extxyz"
    flat = _frame(f'virial="{_values(S)}"').replace('pbc="T T T"', 'pbc="T T F"').replace(
        'Lattice="3.6 0.0 0.0 0.0 3.6 0.0 0.0 0.0 3.6"', 'Lattice="3.6 0.0 0.0 0.0 3.6 0.0 0.0 0.0 0.0"')
    path.write_text(_frame(f'stress="{_values(S)}"') + _frame('stress="1.0 2.0 3.0 4.0 5.0"')
                    + _frame('REF_stress="1.0 2.0 3.0 4.0 5.0"') + flat)
    s = open_structures(path)
    with pytest.raises(DataValidationError, match=r"^bad\.extxyz: structure 1: cannot parse the frame .*stress"):
        s[1]                                                   # ase.io refuses it
    with pytest.raises(DataValidationError, match=r"^bad\.extxyz: structure 2: REF_stress has 5 value\(s\)"):
        open_structures(path, stress_key="REF_stress")[2]
    with pytest.raises(DataValidationError, match=r"^bad\.extxyz: structure 3: a virial label gives a stress only "
                                                  r"with a cell of non-zero volume"):
        s[3]
    (tmp_path / "bad2.extxyz").write_text(_frame('REF_stress="1 2 3 4 5 6 7 8 9"') + _frame('REF_stress="1 2"'))
    with pytest.raises(DataValidationError, match=r"bad2\.extxyz: structure 1: REF_stress has 2"):
        read_structures(tmp_path / "bad2.extxyz", stress_key="REF_stress")
    assert PreparedSet(s, torch.float64, skip_invalid=True)[1] is None
    assert PreparedSet(s, torch.float64, skip_invalid=True)[3] is None
    slab = tmp_path / "slab.db"
    a = _crystal()
    results = dict(a.calc.results)
    a.pbc = [True, True, False]
    a.calc = SinglePointCalculator(a, **results)
    write_structures(slab, [_crystal(), a])
    with pytest.raises(DataValidationError, match=r"^slab\.db: structure 1: has a stress label but its cell is not "
                                                  r"periodic in 3D \(pbc=\[True, True, False\]\)"):
        PreparedSet(open_structures(slab), torch.float64)[1]
    huge = _crystal()
    huge.calc = None
    huge.info["stress"] = np.full(6, 1e300)
    with pytest.raises(DataValidationError, match=r"^structure 0: stress\[0, 0\] = 1e\+300 eV/Å³ .*float32"):
        from_atoms([huge])                                     # overflows in the training dtype: refused at once
