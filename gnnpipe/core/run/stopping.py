"""Stopping a run cleanly on SIGINT/SIGTERM: at the next epoch boundary, with a final checkpoint.

The first signal only sets a flag (:func:`requested`); the epoch loop looks at it after each epoch (every
rank of a distributed run agrees on it with one tiny all-reduce, so all stop after the same epoch), writes
the final checkpoint and raises ``KeyboardInterrupt``, whose ``.result`` carries the completed epochs. A
second signal raises ``KeyboardInterrupt`` at once (the run stops mid-epoch, without a final checkpoint).
Two signals within :data:`DEBOUNCE_S` count as one: a terminal's Ctrl-C reaches every rank directly *and*
through the launcher, which forwards it for ranks a ``kill`` of the launcher alone would not reach.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

DEBOUNCE_S = 2.0

_state = {"at": None, "signame": "", "announce": True, "unit": "epoch"}


def requested() -> bool:
    """Whether a stop was requested in this process."""
    return _state["at"] is not None


def reason() -> str:
    return f"stopped by signal {_state['signame']}" if _state["signame"] else "stopped"


def reset() -> None:
    _state["at"], _state["signame"] = None, ""


def _handler(signum, frame):
    now = time.monotonic()
    name = signal.Signals(signum).name
    if _state["at"] is None:
        _state["at"], _state["signame"] = now, name
        if _state["announce"]:  # one line per run, not one per rank a terminal's Ctrl-C reaches
            print(f"gnnpipe: {name}: stopping after this {_state['unit']} (again, {DEBOUNCE_S:g} s or more later, "
                  "to stop at once)", file=sys.stderr, flush=True)
        return
    if now - _state["at"] < DEBOUNCE_S:
        return
    raise KeyboardInterrupt(f"stopped by signal {name}")


def unblock_stop_signals() -> None:
    """Unblock SIGINT and SIGTERM in the calling thread. A blocked signal mask is inherited through fork and exec
    (a parent that started this process while it blocked them, as some process managers and test harnesses do):
    a handler alone would never run, and the run would ignore ``kill`` until it ends."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


class installed:
    """Context manager: the stop handler on SIGINT and SIGTERM (main thread only; elsewhere a no-op).

    Args:
        announce: print the "stopping after this epoch" line on the first signal (``False`` on every rank of a
            distributed run but rank 0: the signal reaches each of them).
        unit: what the run finishes before it stops: ``"epoch"``, or ``"step"`` (a run that watches the flag after
            every optimizer step, S2EF's training by steps)."""

    def __init__(self, announce: bool = True, unit: str = "epoch"):
        self.announce = announce
        self.unit = unit

    def __enter__(self):
        self.previous: dict = {}
        if threading.current_thread() is threading.main_thread():
            reset()
            _state["announce"], _state["unit"] = self.announce, self.unit
            for s in (signal.SIGINT, signal.SIGTERM):
                self.previous[s] = signal.signal(s, _handler)
            unblock_stop_signals()
        return self

    def __exit__(self, *exc) -> bool | None:
        for s, h in self.previous.items():
            signal.signal(s, h)
        return None
