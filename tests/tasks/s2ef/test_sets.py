"""Lazy structure sets on disk (gnnpipe.data.atoms.sets), the loader's workers (gnnpipe.tasks.s2ef.data), and
``gnnpipe atoms convert / check``: every format round-trips, trains to the in-memory path's losses, and bad input
stops with one line (or is skipped and counted)."""

from __future__ import annotations

import os
import pickle
import sys
import types

import pytest
import torch

from gnnpipe import api
from gnnpipe.data.atoms.sets import ExtxyzSet, PreparedSet, open_structures, write_structures
from gnnpipe.errors import DataValidationError

from .toy import emt_clusters

FORMATS = (".extxyz", ".db", ".aselmdb", ".lmdb")
FIELDS = ("z", "pos", "cell", "pbc", "energy", "forces", "fixed", "tags", "natoms")
TRAIN = dict(model="schnet", layers=1, hidden=8, cutoff=3.0, max_neighbors=8, batch_size=3, epochs=2, log_every=0,
             progress=False, dtype="float64", seed=1, warmup_steps=0)


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """14 EMT-labelled clusters as extended XYZ holds them (its 8 decimals), so every format holds them exactly."""
    from gnnpipe.data.atoms import read_structures

    path = tmp_path_factory.mktemp("xyz") / "c.extxyz"
    write_structures(path, emt_clusters(14, seed=3))
    return read_structures(path, dtype=torch.float64)


@pytest.fixture(scope="module")
def files(clusters, tmp_path_factory):
    d = tmp_path_factory.mktemp("sets")
    return {suf: str(d / f"c{suf}") for suf in FORMATS if write_structures(d / f"c{suf}", clusters) == 14}


def test_every_format_round_trips_every_field(clusters, files):
    assert set(files) == set(FORMATS)
    for suf, path in files.items():
        s = open_structures(path)
        assert len(s) == len(clusters), suf
        for k, (a, b) in enumerate(zip(clusters, (s[i] for i in range(len(s))))):
            for f in FIELDS:
                assert torch.equal(getattr(a, f), getattr(b, f).to(getattr(a, f).dtype)), (suf, k, f)
        assert torch.equal(s[-1].pos, clusters[-1].pos.double())


def _step_losses(monkeypatch, **kw) -> list:
    """The loss of every optimizer step of a run (recorded where the trainer sums them)."""
    from gnnpipe.tasks.s2ef.trainer import S2EFTrainer

    seen = []
    step = S2EFTrainer.optimizer_step

    def recording(self, loss=None):
        out = step(self, loss)
        seen.append(out)
        return out

    monkeypatch.setattr(S2EFTrainer, "optimizer_step", recording)
    r = api.train(**TRAIN, **kw)
    return seen + [r.epochs[-1]["val_loss"], r.epochs[-1]["test_loss"]]


def test_every_format_trains_to_the_in_memory_losses(monkeypatch, clusters, files):
    ref = _step_losses(monkeypatch, data=clusters, num_workers=0)
    assert len(ref) == 2 * 4 + 2
    for suf, path in files.items():
        got = _step_losses(monkeypatch, dataset=path, num_workers=1 if suf == ".lmdb" else 0)
        assert len(got) == len(ref)
        assert max(abs(a - b) for a, b in zip(got, ref)) <= 1e-12, suf


def test_a_folder_is_one_set_and_mixed_formats_are_refused(clusters, tmp_path):
    d = tmp_path / "parts"
    write_structures(d / "a.lmdb", clusters[:5])
    write_structures(d / "b.lmdb", clusters[5:])
    s = open_structures(d)
    assert len(s) == 14 and torch.equal(s[7].pos, clusters[7].pos) and s.where(7) == "parts/b.lmdb: structure 2"
    write_structures(d / "c.aselmdb", clusters[:2])
    with pytest.raises(DataValidationError, match=r"mixes formats \(aselmdb: c.aselmdb, lmdb: a.lmdb\)"):
        open_structures(d)


def test_a_stale_extxyz_index_is_rebuilt(clusters, tmp_path):
    path = tmp_path / "x.extxyz"
    write_structures(path, clusters[:4])
    cache = tmp_path / "cache"
    assert ExtxyzSet(path, cache_dir=cache).rebuilt
    again = ExtxyzSet(path, cache_dir=cache)
    assert not again.rebuilt and len(again) == 4
    write_structures(path, clusters, overwrite=True)
    for f in cache.iterdir():  # the index is now older than its file
        os.utime(f, ns=(1, 1))
    fresh = ExtxyzSet(path, cache_dir=cache)
    assert fresh.rebuilt and len(fresh) == 14 and torch.equal(fresh[13].pos, clusters[13].pos)
    assert not any(p.suffix == ".npy" for p in tmp_path.iterdir())  # never beside the data


class _OldData:  # a PyG 1.x Data as pickled: attributes straight in __dict__
    pass


def test_fairchem_records_of_any_pyg_version_and_bad_ones(clusters, tmp_path):
    import lmdb

    mod = types.ModuleType("torch_geometric.data.old_data")
    _OldData.__module__, _OldData.__qualname__ = mod.__name__, "Data"
    mod.Data = _OldData
    sys.modules[mod.__name__] = mod
    try:
        old = _OldData()
        d = clusters[0]
        old.__dict__.update(pos=d.pos, atomic_numbers=d.z.float(), cell=torch.zeros(1, 3, 3), y=float(d.energy),
                            force=d.forces, fixed=d.fixed.float(), natoms=int(d.z.numel()), __num_nodes__=4)
        old_bytes = pickle.dumps(old)
    finally:
        del sys.modules[mod.__name__]
    path = tmp_path / "f.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"0", old_bytes)
        txn.put(b"1", pickle.dumps({"pos": d.pos, "atomic_numbers": d.z}))  # no labels
        txn.put(b"length", pickle.dumps(2))
    env.close()
    s = open_structures(path)
    got = s[0]
    assert torch.equal(got.pos, d.pos) and torch.equal(got.z, d.z) and torch.equal(got.fixed, d.fixed)
    assert float(got.energy) == float(d.energy) and not bool(got.pbc.any())
    with pytest.raises(DataValidationError, match=r"^f\.lmdb: structure 1: the record has no y/energy, force/forces"):
        s[1]
    assert PreparedSet(s, torch.float64, skip_invalid=True)[1] is None
    bad = tmp_path / "bad.lmdb"
    bad.write_bytes(b"not an lmdb file" * 100)
    with pytest.raises(DataValidationError, match=r"bad\.lmdb: cannot open it as an LMDB file"):
        open_structures(bad)


def test_a_malformed_structure_stops_training_or_is_skipped_and_counted(clusters, tmp_path):
    from gnnpipe.data.atoms import split_structures

    k = int(split_structures(14, seed=TRAIN["seed"])[0][0])  # a structure of the training split
    bad = [c.clone() for c in clusters]
    bad[k].pos[1] = bad[k].pos[0]  # two atoms on one spot
    path = tmp_path / "b.aselmdb"
    write_structures(path, bad)
    with pytest.raises(DataValidationError, match=rf"^b\.aselmdb: structure {k}: atoms 0 and 1 are 0 Å apart"):
        api.train(dataset=str(path), num_workers=1, **TRAIN)
    r = api.train(dataset=str(path), skip_invalid=True, num_workers=0, **TRAIN)
    assert r.status == "completed"
    assert [e["skipped_structures"] for e in r.epochs] == [1, 1]  # once per epoch


def test_cli_convert_and_check(files, tmp_path, capsys):
    from gnnpipe.cli.main import main

    out = tmp_path / "c.lmdb"
    assert main(["atoms", "convert", files[".aselmdb"], str(out), "--no-progress"]) == 0
    assert "14 structures" in capsys.readouterr().out and len(open_structures(out)) == 14
    assert main(["atoms", "check", str(out), "--cutoff", "3", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "14 valid structures" in text and "elements: Ni Cu" in text and "neighbours within 3 Å" in text
    (tmp_path / "junk.lmdb").write_bytes(b"x" * 100)
    assert main(["atoms", "check", str(tmp_path / "junk.lmdb")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gnnpipe: error: ") and "junk.lmdb" in err


def test_a_step_crosses_from_a_worker_as_one_buffer_with_equal_tensors(clusters):
    from torch_geometric.data import Batch

    from gnnpipe.data.atoms.graph import build_graph
    from gnnpipe.tasks.s2ef.data import StepData, pack_step

    batch = Batch.from_data_list(clusters[:3])
    step = StepData(list(clusters[:3]), batch=batch, graph=build_graph(batch, 3.0, 8, with_triplets=True), num_free=5)
    blob = pack_step(step)
    assert isinstance(blob, bytes)
    back = pickle.loads(blob)
    assert back.num_free == 5 and len(back.structures) == 3
    for a, b in zip(step.structures, back.structures):
        for k in FIELDS:
            assert torch.equal(getattr(a, k), getattr(b, k)) and getattr(a, k).dtype == getattr(b, k).dtype, k
    for k in ("edge_index", "cell_offsets", "idx_kj", "idx_ji"):
        assert torch.equal(getattr(step.graph, k), getattr(back.graph, k)), k
    assert torch.equal(back.batch.pos, batch.pos) and torch.equal(back.batch.batch, batch.batch)


@pytest.mark.parametrize("suf", [".lmdb", ".aselmdb", ".extxyz"])
def test_release_closes_this_process_handles_and_the_next_read_reopens(files, suf):
    from gnnpipe.data.atoms import sets

    s = open_structures(files[suf])
    first = s[2]
    s.release()
    assert not any(k[1] == str(s.path.resolve()) and k[2] == os.getpid() for k in sets._OPEN)
    assert not any(k.startswith("_h") for k in s.__dict__)
    assert torch.equal(s[2].pos, first.pos)


def test_every_command_reads_every_format(clusters, files, tmp_path, capsys):
    """One reader: ``read_structures`` (in memory), ``gnnpipe predict --dataset`` and ``gnnpipe relax --dataset``
    take every format ``train`` takes."""
    from gnnpipe.cli.main import main
    from gnnpipe.data.atoms import read_structures
    from gnnpipe.models import save

    for suf, path in files.items():
        got = read_structures(path, dtype=torch.float64)
        assert len(got) == len(clusters), suf
        for a, b in zip(clusters, got):
            for f in ("z", "pos", "cell", "energy", "forces"):
                assert torch.equal(getattr(a, f), getattr(b, f).to(getattr(a, f).dtype)), (suf, f)
    assert read_structures(files[".lmdb"], index="2:4", dtype=torch.float32)[0].pos.dtype == torch.float32
    r = api.train(**{**TRAIN, "epochs": 1}, dataset=files[".extxyz"])
    model = tmp_path / "m.pt"
    save(r.model, model)
    capsys.readouterr()
    assert main(["predict", str(model), "--dataset", files[".lmdb"], "--out", str(tmp_path / "p.pt")]) == 0
    assert len(torch.load(tmp_path / "p.pt")["energy"]) == len(clusters)
    assert main(["relax", str(model), "--dataset", files[".aselmdb"], "--out", str(tmp_path / "r.extxyz"),
                 "--steps", "2", "--no-progress"]) == 0
    assert len(read_structures(tmp_path / "r.extxyz")) == len(clusters)
