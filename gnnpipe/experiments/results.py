"""The results file of a study: JSON Lines, one line per finished run, appended as each run finishes.

Each line is one JSON object:

* ``run_id`` — the run's stable id (:func:`gnnpipe.experiments.grid.run_id_of`);
* ``study`` — the study's name; ``variant`` — the variant's display name; ``seed``;
* ``overrides`` — the settings that differ from the study's ``[fixed]``; ``settings`` — all of them
  (as written, seed included); ``argv`` — the ``gnnpipe train`` arguments that ran;
* ``status`` — ``"ok"`` or ``"failed"``; ``error`` — why it failed (``null`` when ok);
* ``result`` — the ``gnnpipe train --out`` JSON (see :class:`gnnpipe.core.run.results.TrainResult`), ``null``
  when failed;
* ``wall_s`` — seconds the run took, process start included; ``finished_at`` — UTC ISO time;
  ``log`` — path of the run's captured output;
* ``code`` — the code that ran: ``{"gnnpipe": version, "git": commit or null, "dirty": bool or null}``
  (whether the package's tracked files differed from the commit); lines written before this field
  existed lack it.

Every line is written with a single ``write`` of the whole line, flushed and ``fsync``-ed before the
next run starts, so a study killed at any point loses at most the run in progress. A torn last line
(killed mid-write) is ignored on reading and the run is simply run again.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

from ..core.run.results import json_safe
from ..errors import ConfigError


def default_results_path(study_path: str | Path) -> Path:
    """``<study folder>/<study stem>.results.jsonl``."""
    p = Path(study_path)
    return p.with_name(p.stem + ".results.jsonl")


def results_stem(results_path: str | Path) -> str:
    """The results file's name without ``.jsonl`` and ``.results`` (``abl.results.jsonl`` → ``abl``)."""
    name = Path(results_path).name
    for suf in (".jsonl", ".json", ".results"):
        if name.endswith(suf):
            name = name[: -len(suf)]
    return name or "results"


def read_records(path: str | Path, *, warn: bool = True) -> list[dict]:
    """All well-formed records of a results file, in file order; the latest record wins when a
    ``run_id`` occurs more than once (it then keeps the place of its first occurrence).

    A missing file reads as empty. Lines that are not a JSON object with a ``run_id`` (e.g. a line torn
    by a kill mid-write) are skipped with a warning.
    """
    p = Path(path)
    if not p.exists():
        return []
    out: dict[str, dict] = {}
    bad = 0
    with open(p, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if not isinstance(rec, dict) or "run_id" not in rec:
                bad += 1
                continue
            out[rec["run_id"]] = rec
    if bad and warn:
        warnings.warn(f"{p}: skipped {bad} unreadable line(s) (a run interrupted while its line was written "
                      f"is run again on resume)", stacklevel=2)
    return list(out.values())


class ResultsWriter:
    """Appends records to a results file, holding an exclusive lock on it while open.

    Use as a context manager. Opening repairs a torn last line (adds the missing newline so the next
    record starts on its own line).

    Raises:
        ConfigError: another process holds the lock (another ``gnnpipe ablate`` on the same file).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fh = None

    def __enter__(self) -> ResultsWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+b")
        try:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover (not POSIX)
            pass
        except OSError:
            fh.close()
            raise ConfigError(f"{self.path} is locked by another running `gnnpipe ablate`; wait for it to finish "
                              f"or give this study another --results file") from None
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.seek(0, os.SEEK_END)
                fh.write(b"\n")
                fh.flush()
        self._fh = fh
        return self

    def append(self, record: dict) -> None:
        """Write ``record`` as one line (NaN/inf as ``null``), flush and fsync."""
        if self._fh is None:
            raise RuntimeError("ResultsWriter is not open; use it as a context manager")
        data = (json.dumps(json_safe(record), separators=(",", ":")) + "\n").encode("utf-8")
        self._fh.seek(0, os.SEEK_END)
        self._fh.write(data)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def rewrite(self, records: Iterable[dict]) -> None:
        """Replace the file's content with ``records`` (atomically: a temporary file then rename), keeping the lock."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as out:
            for r in records:
                out.write((json.dumps(json_safe(r), separators=(",", ":")) + "\n").encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        # the lock was on the old inode: lock the new file
        old = self._fh
        self.__enter__()
        if old is not None:
            old.close()

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def summary_value(record: dict, key: str) -> float | None:
    """A top-level number of a record's ``result`` (``None`` when failed or absent)."""
    if record.get("status", "ok") != "ok":  # a failed run's result holds only its epochs before the failure
        return None
    res = record.get("result") or {}
    v = res.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
