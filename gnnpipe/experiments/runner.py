"""Run a study: every run is a ``gnnpipe train`` subprocess; results are appended as runs finish.

Resume: runs whose ``run_id`` is already in the results file are skipped, so rerunning the same
command after an interruption (Ctrl-C, a kill, a reboot) continues where the study stopped and never
repeats or loses a finished run. A failed run (non-zero exit, timeout, no result file) is recorded with
its error and the study goes on; it is not retried on resume unless ``retry_failed`` is set (its old line
is then removed before it runs again, so every run still appears exactly once).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .. import __version__
from ..progress import progress_bar
from .grid import Run, Study
from .results import ResultsWriter, read_records, results_stem


def code_version() -> dict:
    """The code a run used: ``{"gnnpipe": version, "git": commit or None, "dirty": bool or None}``.

    Runs are subprocesses of the installed package; with an editable install a study resumed (or left
    running) across code changes mixes versions, and this tells them apart. ``git`` is ``None`` unless the
    package runs from a git checkout of gnnpipe itself (an installed copy inside some other repository,
    e.g. a project's ``.venv``, is not mistaken for it), or without git.
    """
    out: dict = {"gnnpipe": __version__, "git": None, "dirty": None}
    root = Path(__file__).resolve().parents[2]
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
            return out
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode == 0:
            out["git"] = head.stdout.strip()
            st = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                 "gnnpipe"], capture_output=True, text=True, timeout=10)
            out["dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


#: characters of a failed run's output kept as its ``error``
ERROR_TAIL = 2000


@dataclass
class Outcome:
    """What executing one run produced: ``status`` ``"ok"``/``"failed"``, ``error``, the train JSON ``result``."""

    status: str
    error: str | None = None
    result: dict | None = None
    log: str | None = None


@dataclass
class StudyProgress:
    """Counts after :func:`run_study`: runs in the study, skipped (already done), ran now, failed now."""

    total: int
    skipped: int
    ran: int = 0
    failed: int = 0
    interrupted: bool = False
    records: list = field(default_factory=list)


def _set_pdeathsig() -> None:  # pragma: no cover (runs in the child)
    """Linux: have the kernel send SIGTERM to the run if the study process dies (e.g. is killed)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def train_command(run: Run, out_file: str | Path) -> list[str]:
    """``[python, -m, gnnpipe, train, …flags…, --out FILE, --no-progress]`` for ``run``."""
    return [sys.executable, "-m", "gnnpipe", "train", *run.argv, "--out", str(out_file), "--no-progress"]


def execute_subprocess(run: Run, *, timeout_s: float | None = None, log_dir: Path | None = None) -> Outcome:
    """Run ``gnnpipe train`` for ``run`` in a child process (its own process group) and read its ``--out`` JSON.

    The child's stdout and stderr go to ``log_dir/<run_id>.log`` (a temporary file when ``log_dir`` is
    ``None``); a failed run's ``error`` is the tail of that output, and its result the ``--out`` JSON it wrote
    (the epochs completed before it failed, ``status`` ``"failed"``), if any. On timeout or interrupt the child's
    whole process group (ranks included) is terminated.

    Raises:
        KeyboardInterrupt: re-raised after the child is stopped.
    """
    with tempfile.TemporaryDirectory(prefix="gnnpipe-ablate-") as tmp:
        out = Path(tmp) / "result.json"
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            log_path = log_dir / f"{run.run_id}.log"
        else:
            log_path = Path(tmp) / "run.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(log_path, "wb") as log:
            log.write(("$ gnnpipe train " + " ".join(run.argv) + "\n").encode())
            log.flush()
            kw = {"preexec_fn": _set_pdeathsig} if sys.platform.startswith("linux") else {}
            proc = subprocess.Popen(train_command(run, out), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True, **kw)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return Outcome("failed", f"timed out after {timeout_s:g} s (run_timeout_s)\n--- output tail ---\n"
                               + _tail(log_path), None, str(log_path) if log_dir else None)
            except BaseException:
                _kill_group(proc)
                raise
        logref = str(log_path) if log_dir else None
        if rc != 0:
            why = f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
            tail = _tail(log_path)
            last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
            partial = None  # a run that failed during training wrote its completed epochs (status "failed")
            if out.is_file():
                try:
                    partial = json.loads(out.read_text())
                except ValueError:
                    partial = None
            return Outcome("failed", f"gnnpipe train failed ({why}): {last.strip()}\n--- output tail ---\n{tail}",
                           partial, logref)
        if not out.is_file():
            return Outcome("failed", "gnnpipe train exited 0 but wrote no result file:\n" + _tail(log_path), None,
                           logref)
        try:
            result = json.loads(out.read_text())
        except ValueError as exc:
            return Outcome("failed", f"unreadable result file: {exc}", None, logref)
        return Outcome("ok", None, result, logref)


def _tail(path: Path, n: int = ERROR_TAIL) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    text = data[-n:].decode("utf-8", "replace").strip()
    return ("…" + text) if len(data) > n else text


def _brief(rec: dict) -> str:
    if rec["status"] != "ok":
        first = (rec.get("error") or "").splitlines()
        return "FAILED: " + (first[0] if first else "?")
    res = rec.get("result") or {}
    acc = res.get("test_acc_at_best_val")
    t = res.get("mean_epoch_time_s")
    parts = []
    bm = res.get("best_metrics")
    if isinstance(bm, dict):  # an S2EF run: its force and energy errors at the best epoch
        f, e = bm.get("test_force_mae"), bm.get("test_energy_mae")
        if isinstance(f, (int, float)):
            parts.append(f"test force MAE {f:.4f} eV/Å")
        if isinstance(e, (int, float)):
            parts.append(f"energy MAE {1000 * e:.1f} meV")
    elif isinstance(acc, (int, float)):
        parts.append(f"test@best-val {100 * acc:.2f}%")
    if isinstance(t, (int, float)):
        parts.append(f"{1000 * t:.1f} ms/epoch")
    return "ok" + (": " + ", ".join(parts) if parts else "")


def run_study(
    study: Study,
    results_path: str | Path,
    *,
    execute: Callable[[Run], Outcome] | None = None,
    retry_failed: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> StudyProgress:
    """Run every run of ``study`` not yet in ``results_path``, appending one record per finished run.

    Args:
        study: a parsed :class:`~gnnpipe.experiments.grid.Study`.
        results_path: the JSON Lines results file (created if missing).
        execute: runs one run (default ``execute_subprocess`` with the study's ``run_timeout_s`` and
            logs in ``<results stem>.logs/`` beside the results file). Tests pass a fake.
        retry_failed: run failed runs again (their old records are removed first).
        progress: a tqdm bar of runs done / left with an ETA, drawn when standard error is a terminal
            (``gnnpipe.progress.progress_bar``); one plain line per run is printed in any case.
        log: where per-run lines go (default: ``tqdm.write`` / ``print`` to stderr).

    Returns: a ``StudyProgress``. On Ctrl-C / SIGTERM the run in progress is stopped (not recorded),
    ``interrupted`` is set and the function returns; rerunning resumes.

    Raises:
        ConfigError: the results file is locked by another running study.
    """
    results_path = Path(results_path)
    if execute is None:
        log_dir = results_path.with_name(results_stem(results_path) + ".logs")

        def execute(run: Run) -> Outcome:
            return execute_subprocess(run, timeout_s=study.run_timeout_s, log_dir=log_dir)

    def emit(msg: str) -> None:
        if log is not None:
            log(msg)
        elif bar is not None:
            bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    bar = None
    old_term = None
    with ResultsWriter(results_path) as writer:
        records = read_records(results_path)
        if retry_failed and any(r.get("status") != "ok" for r in records):
            records = [r for r in records if r.get("status") == "ok"]
            writer.rewrite(records)
        done = {r["run_id"] for r in records}
        todo = [r for r in study.runs if r.run_id not in done]
        prog = StudyProgress(total=len(study.runs), skipped=len(study.runs) - len(todo))
        if prog.skipped and not todo:
            emit(f"{study.name}: nothing to do — all {prog.total} runs are in {results_path}")
        elif prog.skipped:
            emit(f"{study.name}: resuming — {prog.skipped} of {prog.total} runs already in {results_path}")
        if progress and todo:
            # drawn on a terminal only, as every command's bar; the per-run lines below are printed anyway
            bar = progress_bar(total=prog.total, initial=prog.skipped, unit="run", desc=study.name, smoothing=0.0)
            bar.set_postfix_str(f"left={len(todo)}")

        def on_term(signum, frame):
            raise KeyboardInterrupt

        try:
            if sys.platform != "win32":
                try:
                    old_term = signal.signal(signal.SIGTERM, on_term)
                except ValueError:  # not the main thread
                    old_term = None
            for i, run in enumerate(todo):
                if bar is not None:
                    bar.set_postfix_str(f"left={len(todo) - i}, now: {run.variant} seed={run.seed}")
                code = code_version()  # before the run: the code it starts with
                t0 = time.perf_counter()
                outcome = execute(run)
                wall = time.perf_counter() - t0
                rec = {
                    "run_id": run.run_id, "study": study.name, "variant": run.variant, "seed": run.seed,
                    "overrides": run.overrides, "settings": run.settings, "argv": run.argv,
                    "status": outcome.status, "error": outcome.error, "result": outcome.result,
                    "wall_s": wall, "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "log": outcome.log, "code": code,
                }
                writer.append(rec)
                prog.ran += 1
                prog.records.append(rec)
                if outcome.status != "ok":
                    prog.failed += 1
                emit(f"[{prog.skipped + prog.ran}/{prog.total}] {run.variant} seed={run.seed} "
                     f"({run.run_id}, {wall:.1f} s): {_brief(rec)}")
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"left={len(todo) - i - 1}"
                                        + (f", failed={prog.failed}" if prog.failed else ""))
        except KeyboardInterrupt:
            prog.interrupted = True
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            if bar is not None:
                bar.close()
    if prog.interrupted:
        emit(f"{study.name}: interrupted after {prog.skipped + prog.ran} of {prog.total} runs; "
             f"run the same command again to resume")
    return prog
