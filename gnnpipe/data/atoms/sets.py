"""Structure sets read lazily from disk: one ``torch.utils.data.Dataset`` of structures by index, whatever the
format, with its length known without reading the structures.

========================= ============================================================================
format                    how a structure is found
========================= ============================================================================
extended XYZ ``.extxyz``  an index of frame byte offsets, built once by one scan of the file (int64 per
  / ``.xyz``              frame) and cached under ``$GNNPIPE_CACHE/atoms-index`` (never in the data folder);
                          rebuilt when the file is newer than its index or changed size
ASE database ``.db``      the row ids (int64 per row), rows read by id through ``ase.db``
ASE-LMDB ``.aselmdb``     ``ase.db`` with the ``aselmdb`` backend of ``ase-db-backends`` (fairchem v2:
                          OMat24, OMol25, OC20), rows read by index
fairchem LMDB ``.lmdb``   fairchem v1 (OC20 S2EF / IS2RE as distributed): pickled PyG ``Data`` under the
                          keys ``b"0"``, ``b"1"``, …, and a pickled ``length`` key
a folder                  several files of one of these formats (sorted by name), one set
========================= ============================================================================

fairchem's fields map to ours: ``atomic_numbers`` → ``z``, ``pos``, ``cell`` ``[1, 3, 3]``, ``y`` / ``energy`` →
``energy``, ``force`` / ``forces`` → ``forces``, ``stress`` ``[1, 3, 3]`` (eV/Å³; or ``virial``, eV: ``−virial /
V``) → ``stress``, ``tags``, ``fixed`` (0/1) → ``fixed`` (bool), ``natoms``; ``pbc`` when stored, else periodic in
every direction of a non-zero cell (fairchem's convention). Pickles of any PyG version are read without PyG's
classes (a ``Data`` whose ``__dict__`` holds ``_store``, or old-style attributes).

Stress labels (:mod:`gnnpipe.data.atoms.structures`: ``stress`` ``[1, 3, 3]``, eV/Å³ in ASE's convention, on a
structure that has one): extended XYZ ``stress=`` (9 or 6 values) or ``virial=`` in the comment line (``stress_key``
/ ``virial_key``), or the stress an ``ase.io`` calculator holds; a database row's stress column, or ``stress`` /
``virial`` in its ``data`` or key-value pairs; fairchem's ``stress`` / ``virial`` fields. :class:`PreparedSet` gives
every structure ``has_stress`` and a zero placeholder where unlabelled, so that any of them batch together.
:func:`write_structures` writes a stress only where there is one: extended XYZ ``stress=`` (9 values), the
database's stress column (6 Voigt values), fairchem's ``stress`` field (``[1, 3, 3]``, as fairchem writes it).

:func:`open_structures` opens a path; each set's ``__getitem__`` returns the raw structure (float64, unvalidated);
:class:`PreparedSet` casts and validates each structure when it is read (in the loader's workers). What a set holds
in memory is its index (8 bytes per structure at most) and open file handles, never the structures.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import re
import shutil
import warnings
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

import lmdb
import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import DataValidationError
from ..datasets import default_cache_dir
from ..validation import DataWarning
from .structures import (
    STRUCTURE_SUFFIXES,
    _cast,
    _row_atoms,
    from_atoms,
    stress_3x3,
    stress_label,
    to_atoms,
    virial_to_stress,
    with_label_slots,
    with_stress_slot,
)
from .validate import validate_structures

__all__ = [
    "FORMATS",
    "AseDbSet",
    "ExtxyzSet",
    "FairchemLmdbSet",
    "FolderSet",
    "PreparedSet",
    "StructureSet",
    "format_of",
    "index_cache_dir",
    "open_structures",
    "write_structures",
]

#: file suffix → format name (what :func:`open_structures` reads and :func:`write_structures` writes)
FORMATS = {".extxyz": "extxyz", ".xyz": "extxyz", ".db": "db", ".aselmdb": "aselmdb", ".lmdb": "lmdb"}


def format_of(path: str | os.PathLike) -> str | None:
    """The format of ``path`` by its suffix (:data:`FORMATS`), or ``None``."""
    return FORMATS.get(Path(path).suffix.lower())


def index_cache_dir() -> Path:
    """Where extended-XYZ frame indices are cached: ``$GNNPIPE_CACHE/atoms-index`` (default
    ``~/.cache/gnnpipe/datasets/atoms-index``)."""
    return default_cache_dir() / "atoms-index"


class StructureSet(torch.utils.data.Dataset):
    """A set of structures by index. Subclasses give ``__len__`` and :meth:`read` (``Data`` of float64 tensors, the
    fields of :mod:`gnnpipe.data.atoms.structures`); :meth:`where` names a structure in messages."""

    path: Path

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def read(self, i: int) -> Data:  # pragma: no cover - abstract
        raise NotImplementedError

    def where(self, i: int) -> str:
        """``"FILE: structure K"``: the file and the structure's index in it."""
        return f"{self.path.name}: structure {i}"

    def __getitem__(self, i: int) -> Data:
        n = len(self)
        if not -n <= int(i) < n:
            raise IndexError(f"structure {i} of a set of {n}")
        return self.read(int(i) % n)

    def __getstate__(self):  # file handles are reopened in each process (a loader worker, a rank)
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_h")}

    def release(self) -> None:
        """Closes this process's handles of the file (an LMDB environment's memory map with the pages its reads
        touched); the next read reopens it. The training process calls it once the energy reference's sample is
        read, leaving the reading to the loader workers."""
        fd = self.__dict__.get("_hfd")
        if isinstance(fd, int):
            os.close(fd)
        for k in [k for k in self.__dict__ if k.startswith("_h")]:
            del self.__dict__[k]
        _close(str(self.path.resolve()))


#: open LMDB environments and ASE-LMDB databases of this process by path (LMDB refuses a second open of a file in
#: one process; a forked loader worker opens its own: the key holds the process id)
_OPEN: dict = {}


def _opened(kind: str, path: Path, make):
    key = (kind, str(path.resolve()), os.getpid())
    h = _OPEN.get(key)
    if h is None:
        for old in [k for k in _OPEN if k[:2] == key[:2]]:  # inherited through fork: closed here, reopened
            h = _OPEN.pop(old)
            env = getattr(h, "_env", h)
            with contextlib.suppress(Exception):  # the parent's handle, unusable here anyway
                if env is not None:
                    env.close()
            if hasattr(h, "_env_pid"):  # an ASE-LMDB database: closed, not reopened by its own property
                h._env_pid = os.getpid()
        h = _OPEN[key] = make()
    return h


def _close(path: str) -> None:
    """Closes this process's open handles of ``path`` (see :func:`_opened`)."""
    for key in [k for k in _OPEN if k[1] == path and k[2] == os.getpid()]:
        h = _OPEN.pop(key)
        env = getattr(h, "_env", h)
        with contextlib.suppress(Exception):  # already closed
            if env is not None:
                env.close()


def _bad(where: str, problem: str, fix: str = "") -> DataValidationError:
    return DataValidationError(f"{where}: {problem}" + (f"; {fix}" if fix else ""))


# ---------------------------------------------------------------------------------------------------- extxyz
class ExtxyzSet(StructureSet):
    """Extended XYZ read frame by frame through an index of byte offsets (``ase.io`` parses one frame).

    Args:
        path: the file. energy_key, forces_key, stress_key, virial_key: the labels' names (see
            :func:`read_structures`).
        cache_dir: where the index is kept (default :func:`index_cache_dir`).

    Raises:
        DataValidationError: a frame whose first line is not an atom count (named by its line).
    """

    def __init__(self, path, energy_key: str = "energy", forces_key: str = "forces",
                 cache_dir: Path | None = None, *, stress_key: str = "stress", virial_key: str = "virial"):
        self.path = Path(path)
        self.energy_key, self.forces_key = energy_key, forces_key
        self.stress_key, self.virial_key = stress_key, virial_key
        self.offsets, self.rebuilt = self._index(Path(cache_dir) if cache_dir else index_cache_dir())

    def _index(self, cache: Path) -> tuple[np.ndarray, bool]:
        st = self.path.stat()
        key = hashlib.sha1(str(self.path.resolve()).encode()).hexdigest()[:16]
        f = cache / f"{self.path.name}.{key}.offsets.npy"
        if f.is_file() and f.stat().st_mtime_ns >= st.st_mtime_ns:
            try:
                off = np.load(f)
                if off.dtype == np.int64 and off.ndim == 1 and len(off) and off[-1] == st.st_size:
                    return off, False
            except (OSError, ValueError):
                pass
        off = self._scan()
        cache.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp.npy")
        np.save(tmp, off)
        os.replace(tmp, f)
        return off, True

    def _scan(self) -> np.ndarray:
        """Byte offsets of every frame, and the file's size last: one pass over the file in 16 MiB blocks (the
        newlines found with numpy; each frame's header line parsed for its atom count)."""
        starts = []
        line, nxt, last_nl = 0, 0, -1  # newlines before the block; the next header's line; the last newline's byte
        size = self.path.stat().st_size
        fd = os.open(self.path, os.O_RDONLY)
        try:
            pos = 0
            while pos < size:
                block = os.pread(fd, 1 << 24, pos)
                nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + pos
                h = nxt - line
                while h < len(nl):
                    begin = last_nl + 1 if h == 0 else int(nl[h - 1]) + 1
                    nxt += self._header(fd, begin, int(nl[h]) - begin, nxt, starts)
                    h = nxt - line
                line += len(nl)
                if len(nl):
                    last_nl = int(nl[-1])
                pos += len(block)
            tail = os.pread(fd, size - last_nl - 1, last_nl + 1) if size > last_nl + 1 else b""
            if nxt == line and tail.strip():  # a last header line without its newline
                nxt += self._header(fd, last_nl + 1, len(tail), nxt, starts)
            missing = nxt - line - (1 if tail.strip() else 0)
            if missing > 0 and starts:
                raise _bad(f"{self.path.name}: structure {len(starts) - 1}",
                           f"the file ends {missing} line(s) short of the frame's atoms",
                           "the file is truncated; rewrite it or drop the last frame")
        finally:
            os.close(fd)
        return np.asarray(starts + [size], dtype=np.int64)

    def _header(self, fd: int, begin: int, length: int, line: int, starts: list) -> int:
        """The lines to the next frame from the header line at byte ``begin`` (1 for a blank line)."""
        head = os.pread(fd, length, begin)
        if not head.strip():
            return 1
        try:
            natoms = int(head.split()[0])
        except ValueError:
            natoms = -1
        if natoms < 0:
            raise _bad(f"{self.path.name}: line {line + 1}", f"expected an atom count, got "
                       f"{head[:40].decode(errors='replace')!r}",
                       "check that the file is extended XYZ and not truncated")
        starts.append(begin)
        return natoms + 2

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def read(self, i: int) -> Data:
        fd = self.__dict__.get("_hfd")
        if fd is None:  # pread: no shared file position between a process and its forked workers
            fd = self.__dict__["_hfd"] = os.open(self.path, os.O_RDONLY)
        text = os.pread(fd, int(self.offsets[i + 1] - self.offsets[i]), int(self.offsets[i])).decode()
        try:
            atoms = _read_extxyz(text, 0)[0]
        except Exception as exc:  # ase raises many kinds on a malformed frame
            raise _bad(self.where(i), f"cannot parse the frame ({type(exc).__name__}: {exc})",
                       "check that the file is extended XYZ and not truncated") from exc
        return from_atoms([atoms], energy_key=self.energy_key, forces_key=self.forces_key,
                          stress_key=self.stress_key, virial_key=self.virial_key, dtype=torch.float64,
                          source=self.where(i).rsplit(" ", 1)[0], start=i)[0]


#: a ``stress`` / ``virial`` of 6 values in an extended-XYZ comment line (``ase.io`` reads these keys as 9 only)
_VOIGT_KEY = re.compile(r"""(?<![\w-])(stress|virial)=(["'])([^"'\n]*)\2""")


def _nine(match: re.Match) -> str:
    """A 6-value (Voigt ``xx yy zz yz xz xy``) stress or virial rewritten as its 9 values (symmetric: the order of
    the 3 × 3's values is either), each number's text kept; any other value as it is."""
    v = match.group(3).split()
    if len(v) != 6:
        return match.group(0)
    xx, yy, zz, yz, xz, xy = v
    quote = match.group(2)
    return f"{match.group(1)}={quote}{xx} {xy} {xz} {xy} {yy} {yz} {xz} {yz} {zz}{quote}"


def _read_extxyz(src: str | Path, index) -> list:
    """``ase.io.read`` of extended XYZ (``src``: the text of frames, or a file's path) as a list; a ``stress`` or
    ``virial`` of 6 values, which ``ase.io`` refuses, is read as the symmetric 3 × 3 it stands for."""
    import ase.io

    def read(source):
        got = ase.io.read(source, index=index, format="extxyz")
        return got if isinstance(got, list) else [got]

    try:
        return read(str(src) if isinstance(src, Path) else io.StringIO(src))
    except ValueError as exc:
        if "special 3x3" not in str(exc):
            raise
    text = src.read_text() if isinstance(src, Path) else src
    return read(io.StringIO(_VOIGT_KEY.sub(_nine, text)))


# ---------------------------------------------------------------------------------------------------- ASE db
class AseDbSet(StructureSet):
    """An ASE database (``.db``: SQLite) or ASE-LMDB (``.aselmdb``: ``ase-db-backends``), rows by index.

    Raises:
        DataValidationError: the database cannot be opened.
    """

    def __init__(self, path, energy_key: str = "energy", forces_key: str = "forces", *, stress_key: str = "stress",
                 virial_key: str = "virial"):
        self.path = Path(path)
        self.energy_key, self.forces_key = energy_key, forces_key
        self.stress_key, self.virial_key = stress_key, virial_key
        self.lmdb = self.path.suffix.lower() == ".aselmdb"
        db = self._db()
        try:
            if self.lmdb:
                self.ids = None if not db.deleted_ids else np.asarray(db.ids, dtype=np.int64)
                self.n = db.count()
            else:
                with db.managed_connection() as con:
                    self.ids = np.fromiter((r[0] for r in con.execute("SELECT id FROM systems ORDER BY id")),
                                           dtype=np.int64)
                self.n = len(self.ids)
        except Exception as exc:
            raise _bad(str(self.path), f"cannot read it as an ASE database ({type(exc).__name__}: {exc})",
                       "check that it is an ASE .db / .aselmdb file") from exc

    def _db(self):
        db = self.__dict__.get("_hdb")
        if db is not None and self.__dict__.get("_hpid") == os.getpid():
            return db
        import ase.db

        try:
            if self.lmdb:
                from ase_db_backends.aselmdb import LMDBDatabase

                db = _opened("aselmdb", self.path, lambda: LMDBDatabase(self.path, readonly=True, readahead=False,
                                                                       use_lock_file=False))
            else:
                db = ase.db.connect(str(self.path), type="db", use_lock_file=False)
        except Exception as exc:
            raise _bad(str(self.path), f"cannot open it as an ASE database ({type(exc).__name__}: {exc})",
                       "check that it is an ASE .db / .aselmdb file") from exc
        self.__dict__["_hdb"], self.__dict__["_hpid"] = db, os.getpid()
        return db

    def __len__(self) -> int:
        return self.n

    def read(self, i: int) -> Data:
        db = self._db()
        row_id = int(self.ids[i]) if self.ids is not None else i + 1
        try:
            row = db._get_row(row_id) if self.lmdb else db.get(id=row_id)
        except Exception as exc:
            raise _bad(self.where(i), f"cannot read row {row_id} ({type(exc).__name__}: {exc})",
                       "the database is damaged; rewrite it or drop the row") from exc
        atoms = _row_atoms(row, self.energy_key, self.forces_key, self.stress_key, self.virial_key)
        return from_atoms([atoms], energy_key=self.energy_key, forces_key=self.forces_key,
                          stress_key=self.stress_key, virial_key=self.virial_key, dtype=torch.float64,
                          source=self.where(i).rsplit(" ", 1)[0], start=i)[0]


# ---------------------------------------------------------------------------------------------------- fairchem
class _Record:
    """Stands in for any PyG class in a pickle: keeps the pickled state, whatever the PyG version."""

    def __init__(self, *args, **kwargs):
        self.__dict__.update(kwargs)

    def __setstate__(self, state):
        if isinstance(state, tuple):  # (dict, slots)
            for part in state:
                if isinstance(part, dict):
                    self.__dict__.update(part)
        elif isinstance(state, dict):
            self.__dict__.update(state)

    def __setitem__(self, key, value):  # a MutableMapping storage rebuilt item by item
        self.__dict__.setdefault("_mapping", {})[key] = value

    def fields(self) -> dict:
        d = self.__dict__
        store = d.get("_store")
        if isinstance(store, _Record):
            return dict(store.__dict__.get("_mapping", {k: v for k, v in store.__dict__.items()
                                                        if not k.startswith("_")}))
        if "_mapping" in d:
            return dict(d["_mapping"])
        return {k: v for k, v in d.items() if not k.startswith("__") and not k.startswith("_")}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("torch_geometric"):
            return _Record
        return super().find_class(module, name)


def _tensor(v, dtype=None):
    if v is None:
        return None
    t = v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
    return t.to(dtype) if dtype is not None else t


def fairchem_to_data(fields: dict, where: str) -> Data:
    """fairchem ``Data`` fields → a structure (float64; the module docstring's mapping).

    Raises:
        DataValidationError: ``pos``, ``atomic_numbers`` or the labels missing.
    """
    z = fields.get("atomic_numbers", fields.get("z"))
    pos = fields.get("pos")
    energy = next((fields[k] for k in ("y", "energy") if fields.get(k) is not None), None)
    forces = next((fields[k] for k in ("force", "forces") if fields.get(k) is not None), None)
    missing = [n for n, v in (("pos", pos), ("atomic_numbers", z), ("y/energy", energy), ("force/forces", forces))
               if v is None]
    if missing:
        raise _bad(where, f"the record has no {', '.join(missing)} (fields: {', '.join(sorted(fields)) or 'none'})",
                   "write records with fairchem's field names (pos, atomic_numbers, cell, y, force), or skip "
                   "them with --skip-invalid")
    z = _tensor(z).reshape(-1).round().long()
    n = int(z.numel())
    cell = _tensor(fields.get("cell"), torch.float64)
    cell = torch.zeros(1, 3, 3, dtype=torch.float64) if cell is None else cell.reshape(1, 3, 3)
    pbc = fields.get("pbc")
    pbc = (_tensor(pbc).reshape(1, 3).bool() if pbc is not None
           else (cell.reshape(3, 3).abs().sum(1) > 0).reshape(1, 3))
    fixed = fields.get("fixed")
    tags = fields.get("tags")
    stress = _fairchem_stress(fields, cell, where)
    return Data(z=z, pos=_tensor(pos, torch.float64).reshape(n, -1), cell=cell, pbc=pbc,
                fixed=torch.zeros(n, dtype=torch.bool) if fixed is None else _tensor(fixed).reshape(-1) != 0,
                tags=torch.zeros(n, dtype=torch.long) if tags is None else _tensor(tags).reshape(-1).long(),
                natoms=torch.tensor([n], dtype=torch.long),
                energy=_tensor(energy, torch.float64).reshape(-1),
                forces=_forces(_tensor(forces, torch.float64)),
                **({} if stress is None else {"stress": torch.from_numpy(stress).reshape(1, 3, 3)}))


def _fairchem_stress(fields: dict, cell: torch.Tensor, where: str) -> np.ndarray | None:
    """A record's stress (3 × 3, eV/Å³): its ``stress`` field, else ``−virial / V`` of its ``virial`` field."""
    stress, virial = fields.get("stress"), fields.get("virial")
    if stress is not None:
        return stress_3x3(_tensor(stress, torch.float64).numpy(), where, "stress")
    if virial is not None:
        return virial_to_stress(_tensor(virial, torch.float64).numpy(), cell.numpy(), where, "virial")
    return None


def _forces(f: torch.Tensor) -> torch.Tensor:
    return f.reshape(-1, 3) if f.numel() % 3 == 0 else f


class FairchemLmdbSet(StructureSet):
    """A fairchem v1 LMDB file (``subdir=False``): pickled PyG ``Data`` keyed ``b"0"`` … and ``b"length"``.

    Raises:
        DataValidationError: not an LMDB file, or no ``length`` key and keys that are not the indices.
    """

    def __init__(self, path):
        self.path = Path(path)
        env = self._env()
        with env.begin() as txn:
            raw = txn.get(b"length")
            if raw is not None:
                try:
                    self.n = int(pickle.loads(raw))
                except Exception as exc:
                    raise _bad(str(self.path), f"its length key is not a pickled integer ({exc})",
                               "rewrite it with gnnpipe atoms convert") from exc
            else:
                self.n = int(env.stat()["entries"])

    def _env(self):
        env = self.__dict__.get("_henv")
        if env is None or self.__dict__.get("_hpid") != os.getpid():
            try:
                env = _opened("lmdb", self.path, lambda: lmdb.open(str(self.path), subdir=False, readonly=True,
                                                                    lock=False, readahead=False, meminit=False,
                                                                    max_readers=256))
            except lmdb.Error as exc:
                raise _bad(str(self.path), f"cannot open it as an LMDB file ({type(exc).__name__}: {exc})",
                           "check that it is a fairchem .lmdb file (one file, not a folder) and not truncated") from exc
            self.__dict__["_henv"], self.__dict__["_hpid"] = env, os.getpid()
        return env

    def __len__(self) -> int:
        return self.n

    def read(self, i: int) -> Data:
        try:
            with self._env().begin() as txn:
                raw = txn.get(f"{i}".encode("ascii"))
        except lmdb.Error as exc:
            raise _bad(self.where(i), f"cannot read it ({type(exc).__name__}: {exc})",
                       "the LMDB file is damaged; rewrite it") from exc
        if raw is None:
            raise _bad(self.where(i), f"no key {i!r} in the LMDB file",
                       "keys must be the indices 0 .. length-1 as ASCII; rewrite it with gnnpipe atoms convert")
        try:
            obj = _Unpickler(io.BytesIO(raw)).load()
        except Exception as exc:
            raise _bad(self.where(i), f"cannot unpickle the record ({type(exc).__name__}: {exc})",
                       "the record is damaged; rewrite it") from exc
        fields = obj.fields() if isinstance(obj, _Record) else obj if isinstance(obj, dict) else None
        if fields is None:
            raise _bad(self.where(i), f"the record is a {type(obj).__name__}, not a PyG Data or a dict",
                       "write records as fairchem does (pickled torch_geometric Data)")
        return fairchem_to_data(fields, self.where(i))


# ---------------------------------------------------------------------------------------------------- folders
class FolderSet(StructureSet):
    """Several files of one format (sorted by name) as one set; structure ``i`` of the set is found by bisecting
    the files' cumulative lengths."""

    def __init__(self, parts: list, path):
        self.path, self.parts = Path(path), parts
        self.bounds = np.cumsum([0] + [len(p) for p in parts]).tolist()

    def __len__(self) -> int:
        return self.bounds[-1]

    def locate(self, i: int) -> tuple[int, int]:
        f = bisect_right(self.bounds, i) - 1
        return f, i - self.bounds[f]

    def where(self, i: int) -> str:
        f, k = self.locate(i)
        return f"{self.path.name}/{self.parts[f].where(k)}"

    def read(self, i: int) -> Data:
        f, k = self.locate(i)
        return self.parts[f].read(k)

    def release(self) -> None:
        for p in self.parts:
            p.release()


def _open_file(p: Path, fmt: str, energy_key: str, forces_key: str, cache_dir, stress_key: str = "stress",
               virial_key: str = "virial") -> StructureSet:
    if fmt == "extxyz":
        return ExtxyzSet(p, energy_key, forces_key, cache_dir, stress_key=stress_key, virial_key=virial_key)
    if fmt in ("db", "aselmdb"):
        return AseDbSet(p, energy_key, forces_key, stress_key=stress_key, virial_key=virial_key)
    return FairchemLmdbSet(p)


def open_structures(path, *, energy_key: str | None = None, forces_key: str | None = None,
                    cache_dir=None, stress_key: str | None = None, virial_key: str | None = None) -> StructureSet:
    """The lazy set of ``path``: a file of a format of :data:`FORMATS`, or a folder of such files of one format.
    The label keys (default ``energy``, ``forces``, ``stress``, ``virial``) name extended XYZ's and ASE databases'
    labels (:func:`read_structures`); fairchem LMDB records have fixed field names (the module docstring).

    Raises:
        FileNotFoundError: no such path. DataValidationError: an unknown suffix, a folder with no structure file or
            files of several formats (named), a file that cannot be opened.
    """
    p = Path(path).expanduser()
    ek, fk = energy_key or "energy", forces_key or "forces"
    keys = {"stress_key": stress_key or "stress", "virial_key": virial_key or "virial"}
    if not p.exists():
        raise FileNotFoundError(2, "no such structure file or folder", str(p))
    if p.is_dir():
        files = sorted(q for q in p.iterdir() if q.is_file() and format_of(q) and not q.name.endswith("-lock"))
        kinds = sorted({format_of(q) for q in files})
        if not files:
            raise _bad(str(p), f"no structure file in the folder (suffixes {', '.join(sorted(FORMATS))})",
                       "give a file or a folder of files of one format")
        if len(kinds) > 1:
            by = {k: next(q.name for q in files if format_of(q) == k) for k in kinds}
            raise _bad(str(p), "the folder mixes formats (" + ", ".join(f"{k}: {v}" for k, v in by.items()) + ")",
                       "keep one format per folder (gnnpipe atoms convert moves a file to another format)")
        return FolderSet([_open_file(q, kinds[0], ek, fk, cache_dir, **keys) for q in files], p)
    fmt = format_of(p)
    if fmt is None:
        raise _bad(str(p), f"unknown structure file suffix {p.suffix!r}",
                   f"use one of {', '.join(sorted(FORMATS))}, or a folder of such files")
    return _open_file(p, fmt, ek, fk, cache_dir, **keys)


class PreparedSet(torch.utils.data.Dataset):
    """A set's structures as training reads them: floats in ``dtype``, a ``fixed`` mask, labels required, validated
    (:func:`~gnnpipe.data.atoms.validate_structures`, with the model's ``cutoff``) when read.

    Args:
        base: a :class:`StructureSet` (or any sequence of raw ``Data``). dtype: the training dtype.
        cutoff: Å, for the no-neighbour warning. skip_invalid: a malformed structure reads as ``None`` (the loader
            skips and counts it) instead of raising.

    Raises (``__getitem__``): DataValidationError naming the file, the structure's index in it and the problem.
    """

    def __init__(self, base, dtype: torch.dtype = torch.float32, cutoff: float | None = None,
                 skip_invalid: bool = False):
        self.base, self.dtype, self.cutoff, self.skip_invalid = base, dtype, cutoff, skip_invalid
        self.max_z: int | None = None  #: the largest atomic number the model embeds (``None``: 118)

    def __len__(self) -> int:
        return len(self.base)

    def release(self) -> None:
        """The base set's :meth:`StructureSet.release` (nothing for a list)."""
        if hasattr(self.base, "release"):
            self.base.release()

    def where(self, i: int) -> str:
        return self.base.where(i) if hasattr(self.base, "where") else f"structure {i}"

    def __getitem__(self, i: int) -> Data | None:
        try:
            d = self.base[i]
            src, k = self.where(i).rsplit(" ", 1)
            d = prepare_one(d, self.dtype, src, int(k))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)  # a structure without edges trains (per-atom terms)
                validate_one(d, self.dtype, None, src, int(k), max_z=self.max_z)  # the graph finds neighbours
        except DataValidationError:
            if self.skip_invalid:
                return None
            raise
        return d


def prepare_one(d: Data, dtype: torch.dtype, source: str, k: int) -> Data:
    """One structure with floats in ``dtype``, a ``fixed`` mask and label slots (``stress`` ``[1, 3, 3]`` and
    ``has_stress``; ``has_energy``, ``has_forces``: zero placeholders where unlabelled, so that any structures batch
    together, :func:`~gnnpipe.data.atoms.structures.with_label_slots`); refuses one with neither energy nor forces."""
    d = d.clone()
    for name in ("pos", "cell", "energy", "forces", "stress"):
        if getattr(d, name, None) is not None:
            setattr(d, name, getattr(d, name).to(dtype))
    if getattr(d, "fixed", None) is None:
        d.fixed = torch.zeros(d.z.numel(), dtype=torch.bool)
    with_stress_slot(d, dtype)
    if d.stress.numel() == 9:
        d.stress = d.stress.reshape(1, 3, 3)
    return with_label_slots(d, source, k)


def validate_one(d: Data, dtype: torch.dtype, cutoff: float | None, source: str, k: int,
                 max_z: int | None = None) -> None:
    """:func:`~gnnpipe.data.atoms.validate_structures` of one structure, named ``"{source} {k}"``."""
    validate_structures([d], dtype, cutoff=cutoff, source=source, start=k, max_z=max_z)


# ---------------------------------------------------------------------------------------------------- writing
def _atoms_of(item):
    return item if hasattr(item, "get_positions") else to_atoms(item)


def _data_of(item) -> Data:
    if hasattr(item, "get_positions"):
        return from_atoms([item], dtype=torch.float64)[0]
    return item


def fairchem_record(d: Data, index: int) -> Data:
    """A structure as fairchem v1 stores it (PyG ``Data`` with ``pos``, ``atomic_numbers``, ``cell``, ``y``,
    ``force``, ``tags``, ``fixed``, ``natoms``, ``pbc``, ``sid``, ``fid``; ``stress`` ``[1, 3, 3]`` when labelled)."""
    n = int(d.z.numel())
    fixed = getattr(d, "fixed", None)
    tags = getattr(d, "tags", None)
    rec = Data(pos=d.pos.double(), atomic_numbers=d.z.double(), cell=d.cell.double().reshape(1, 3, 3),
               natoms=n, tags=tags.long() if tags is not None else torch.zeros(n, dtype=torch.long),
               fixed=(fixed.double() if fixed is not None else torch.zeros(n, dtype=torch.float64)),
               pbc=d.pbc.reshape(1, 3).bool(), sid=index, fid=0)
    if getattr(d, "energy", None) is not None:
        rec.y = float(d.energy.reshape(-1)[0])
    if getattr(d, "forces", None) is not None:
        rec.force = d.forces.double()
    stress = stress_label(d)
    if stress is not None:
        rec.stress = stress.double().reshape(1, 3, 3)
    return rec


def write_structures(out, items: Iterable, *, overwrite: bool = False, progress=None) -> int:
    """Write structures (``ase.Atoms`` or ``Data``) to ``out`` in the format of its suffix (:data:`FORMATS`); returns
    how many. The file is written beside its target and moved in place at the end.

    Raises:
        DataValidationError: an unknown suffix. FileExistsError: ``out`` exists and not ``overwrite``.
    """
    p = Path(out).expanduser()
    fmt = format_of(p)
    if fmt is None:
        raise _bad(str(p), f"unknown structure file suffix {p.suffix!r}", f"use one of {', '.join(sorted(FORMATS))}")
    if p.exists() and not overwrite:
        raise FileExistsError(17, "the output exists; remove it or pass --overwrite", str(p))
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.stem}.{os.getpid()}.tmp{p.suffix}")
    for q in (tmp, Path(str(tmp) + "-lock")):
        if q.exists():
            q.unlink()
    n = 0
    tick = progress.update if progress is not None else (lambda k: None)
    if fmt == "extxyz":
        import ase.io

        with open(tmp, "w") as fh:
            for item in items:
                ase.io.write(fh, _atoms_of(item), format="extxyz")
                n += 1
                tick(1)
    elif fmt in ("db", "aselmdb"):
        import ase.db

        db = ase.db.connect(str(tmp), type=fmt, use_lock_file=False, append=True)
        with db:
            for item in items:
                db.write(_atoms_of(item))
                n += 1
                tick(1)
        if fmt == "aselmdb":
            db.close()
    else:
        env = lmdb.open(str(tmp), subdir=False, map_size=1 << 40, meminit=False, map_async=True)
        txn = env.begin(write=True)
        for item in items:
            txn.put(f"{n}".encode("ascii"), pickle.dumps(fairchem_record(_data_of(item), n), protocol=4))
            n += 1
            tick(1)
            if n % 5000 == 0:
                txn.commit()
                txn = env.begin(write=True)
        txn.put(b"length", pickle.dumps(n, protocol=4))
        txn.commit()
        env.sync()
        env.close()
    if p.exists():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    os.replace(tmp, p)
    lock = Path(str(tmp) + "-lock")
    if lock.exists():
        lock.unlink()
    return n


# ---------------------------------------------------------------------------------------------------- in memory
def _db_atoms(path: Path, index, energy_key: str, forces_key: str, stress_key: str = "stress",
              virial_key: str = "virial") -> list:
    """Rows of an ASE database as ``ase.Atoms``, their labels put where :func:`from_atoms` looks."""
    import ase.db

    rows = list(ase.db.connect(str(path)).select())
    rows = _index(rows, index, path)
    return [_row_atoms(row, energy_key, forces_key, stress_key, virial_key) for row in rows]


def _index(items: list, index, path) -> list:
    if isinstance(index, int):
        return [items[index]]
    if isinstance(index, slice):
        return items[index]
    if isinstance(index, str):
        from ase.io.formats import string2index

        sel = string2index(index)
        return [items[sel]] if isinstance(sel, int) else items[sel]
    raise DataValidationError(f"{path}: index must be an int, a slice or a string like ':' or '0:10', got {index!r}")


def read_structures(path: str | os.PathLike, *, energy_key: str = "energy", forces_key: str = "forces",
                    index: str | int | slice = ":", dtype: torch.dtype = torch.float32,
                    require_labels: bool = False, stress_key: str = "stress",
                    virial_key: str = "virial") -> list[Data]:
    """Read every structure of a file or folder into memory: extended XYZ ``.xyz``/``.extxyz``, ASE trajectory
    ``.traj`` and ASE database ``.db`` through ``ase.io`` / ``ase.db``; ASE-LMDB ``.aselmdb``, fairchem LMDB
    ``.lmdb`` and folders of such files through their lazy sets (:func:`gnnpipe.data.atoms.open_structures`). The
    one reader of ``train`` (small sets), ``predict``, ``relax``, ``evaluate`` and the calculator's users.

    Args:
        path: the file (the suffix picks the format: :data:`STRUCTURE_SUFFIXES`,
            :data:`gnnpipe.data.atoms.FORMATS`) or a folder of files of one format.
        energy_key: the energy's key (eV): an ``info`` key of extended XYZ (``energy=… `` in the comment line), a
            key-value pair or column of a database row; the default also finds what ``ase.io`` attached.
        forces_key: the forces' key (eV/Å): a per-atom column of extended XYZ, a database row's ``forces`` or
            ``data[forces_key]``.
        stress_key: the stress's key (eV/Å³, ASE's sign; 9 values or 6 in Voigt order): an ``info`` key of extended
            XYZ (``stress="…"``), a database row's stress column or ``data[stress_key]``. Every structure gets
            ``stress`` and ``has_stress`` (zeros and False when unlabelled: :mod:`gnnpipe.data.atoms.structures`).
        virial_key: a virial's key (eV), read where there is no stress: the stress is ``−virial / V``.
        index: which structures: ``":"`` (all), ``"0:100"``, ``-1``, a slice (ASE's convention).
        dtype: floating dtype of the tensors.
        require_labels: raise if a structure lacks energy or forces (training needs both).

    Returns:
        list of ``Data`` (see :func:`from_atoms`).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataValidationError: an unknown suffix, an unreadable file, a value that overflows in ``dtype``, or a
            structure without labels when required.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(2, "no such structure file or folder (.extxyz/.xyz, .traj, .db, .aselmdb, .lmdb)",
                                str(p))
    if p.is_dir() or p.suffix.lower() in (".aselmdb", ".lmdb"):
        lazy = open_structures(p, energy_key=energy_key, forces_key=forces_key, stress_key=stress_key,
                               virial_key=virial_key)
        out = [_in_dtype(lazy[i], dtype, lazy.where(i)) for i in _index(list(range(len(lazy))), index, p)]
        if require_labels:
            for i, d in enumerate(out):
                if getattr(d, "energy", None) is None or getattr(d, "forces", None) is None:
                    raise DataValidationError(f"{lazy.where(i)} has no energy or forces label; training needs both")
        return out
    fmt = STRUCTURE_SUFFIXES.get(p.suffix.lower())
    if fmt is None:
        known = sorted(set(STRUCTURE_SUFFIXES) | set(FORMATS))
        raise DataValidationError(f"{p}: unknown structure file suffix {p.suffix!r}; use one of {', '.join(known)} "
                                  f"or a folder of such files (other formats: convert them with ase.io)")
    try:
        if fmt == "db":
            atoms = _db_atoms(p, index, energy_key, forces_key, stress_key, virial_key)
        elif fmt == "extxyz":
            atoms = _read_extxyz(p, index)
        else:
            import ase.io

            got = ase.io.read(str(p), index=index, format=fmt)
            atoms = got if isinstance(got, list) else [got]
    except DataValidationError:
        raise
    except Exception as exc:  # ase raises many kinds on a malformed file
        raise DataValidationError(f"{p}: cannot read it as {fmt} ({type(exc).__name__}: {exc}); check that the "
                                  f"file is {fmt} and not truncated") from exc
    return from_atoms(atoms, energy_key=energy_key, forces_key=forces_key, stress_key=stress_key,
                      virial_key=virial_key, dtype=dtype, require_labels=require_labels, source=f"{p.name}: structure")


def _in_dtype(d: Data, dtype: torch.dtype, where: str) -> Data:
    """A structure of a lazy set (float64) with its floats in ``dtype`` (overflow refused, naming it)."""
    src, k = where.rsplit(" ", 1)
    for name in ("pos", "cell", "energy", "forces", "stress"):
        v = getattr(d, name, None)
        if v is not None:
            setattr(d, name, _cast(v.double().numpy(), dtype, int(k), src, name))
    return d


