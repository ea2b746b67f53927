"""Starting ranks: local processes (the built-in launcher) or an existing ``torchrun`` environment.

Failure handling: every rank runs its function inside ``try``; an exception is reported to the
parent with the rank's traceback. The parent watches the ranks' result pipes *and* the processes' exit codes: as
soon as one rank fails or dies (e.g. killed by a signal), it terminates every other rank and raises
:class:`~gnnpipe.errors.DistributedError` naming the failing rank and its error.

Dead or slow: death is detected by liveness, not by waiting. Here the parent sees a rank's process end (within
seconds, however long the others would wait); under ``torchrun`` its agent does the same (it watches its worker
processes and stops the others when one fails), and a gloo peer of a process that ended loses its connection at
once. The process group's timeout (the *wait limit*, :func:`wait_limit`) is only what ends a run whose ranks are
all alive but one waits forever (a hang, a deadlock, a lost machine): so it is long by default — torch's own (30
min for gloo, 10 for nccl), or more when the cost model predicts slower epochs — and a rank that is merely slow (a
large chunk, an evaluation, a checkpoint, a loaded machine) is never taken for a dead one. ``--timeout``
(``timeout_s``) sets it explicitly. When every failure is such a timeout, the message names the ranks that
reported nothing as the likely stalled ones and points at ``--timeout``.

Rendezvous: the parent opens the ``TCPStore`` itself on a port the OS picks (port 0) and holds it for the
whole run; ranks join it as clients. No port is chosen, released and bound again later, so two launches
starting at the same moment cannot race for one port. Ranks wait for each other on the store (with a
generous limit, as starting a process that imports torch can take seconds) before the process group
starts, so a short ``timeout_s`` bounds communication, not process start-up.

Ranks and their children: local ranks are ordinary (non-daemonic) processes, so a rank may start children of its
own (a ``DataLoader``'s workers: Python refuses children to a daemonic process). A rank ends with its launcher: it
asks the kernel for ``SIGKILL`` when the launcher dies (``PR_SET_PDEATHSIG`` on Linux) and a watchdog thread checks
its parent every second where that is not available; its loader workers end with it (they watch their parent). So
a crash of the launcher, a ``kill -9`` of it or a Ctrl-C leaves no orphaned rank or worker behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import math
import os
import pickle
import pickletools
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import connection as mp_connection
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import constants
from tqdm import tqdm

from ...errors import ConfigError, DistributedError, GnnpipeError
from ...registry import registered_from
from . import stopping

#: seconds ranks may take to start and meet on the store (independent of the communication timeout)
RENDEZVOUS_S = 300.0
#: a derived wait limit is at least this many times the cost model's predicted epoch (which bounds every action in
#: it: a chunk's pass, an evaluation's forward, the optimizer step), when that exceeds torch's default
WAIT_FACTOR = 10.0
#: the most a derived wait limit may be (7 days): a predicted epoch beyond it is not a reason to wait longer
MAX_WAIT_S = 7 * 24 * 3600.0


def torch_default_wait_s(backend: str) -> float:
    """torch's own process-group timeout for ``backend`` in seconds (``torch.distributed.constants``): 1800 (30
    min) for gloo, 600 (10 min) for nccl."""
    if backend == "nccl":
        return (getattr(constants, "default_pg_nccl_timeout", None) or datetime.timedelta(minutes=10)).total_seconds()
    return constants.default_pg_timeout.total_seconds()


def wait_limit(timeout_s: float | None, backend: str, predicted_epoch_s: float | None = None) -> tuple[float, str]:
    """How long a rank may wait on a peer (the process group's timeout) before the run is ended as hung, and why.

    A rank that dies ends the run at once whatever this is (module docstring): the limit only bounds a wait on a
    live rank, so it is generous. Explicit ``timeout_s`` (``--timeout``) wins; else the larger of torch's default
    (:func:`torch_default_wait_s`) and :data:`WAIT_FACTOR` × the cost model's predicted epoch (``--layout auto``).

    Args:
        timeout_s: seconds given by the user, or ``None`` (derive it).
        backend: ``gloo`` or ``nccl``.
        predicted_epoch_s: the cost model's predicted seconds per epoch of the layout, if any.

    Returns:
        ``(seconds, why)``, e.g. ``(1800.0, "torch's default for gloo")``.
    """
    if timeout_s is not None:
        return float(timeout_s), "--timeout"
    base = torch_default_wait_s(backend)
    if predicted_epoch_s is not None and math.isfinite(predicted_epoch_s) and WAIT_FACTOR * predicted_epoch_s > base:
        limit = min(WAIT_FACTOR * predicted_epoch_s, MAX_WAIT_S)
        return limit, f"{WAIT_FACTOR:g} × the predicted epoch of {predicted_epoch_s:,.0f} s" + (
            "" if limit < MAX_WAIT_S else f", at most {MAX_WAIT_S:,.0f} s")
    return base, f"torch's default for {backend}"


def format_wait_limit(seconds: float, why: str) -> str:
    """The plan's line about the wait limit (:func:`wait_limit`)."""
    if why == "--timeout":
        return (f"wait limit {seconds:g} s (--timeout): a rank waiting longer on a peer ends the run; a rank that "
                "dies ends it at once")
    return (f"wait limit {seconds:,.0f} s ({why}; --timeout sets it): only a rank waiting that long on a live peer "
            "ends the run (a hang); a rank that dies ends it at once, a slow one does not")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (and may be taken by the time it is used;
    :func:`spawn` does not use it: its store binds port 0 and keeps it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_world_size(world_size: int) -> int:
    """Ranks that share this machine: ``LOCAL_WORLD_SIZE`` under ``torchrun``, else every rank (local spawn)."""
    if under_torchrun():
        return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", world_size)))
    return world_size


def choose_backend(requested: str | None, local_ranks: int, device: str | None = None) -> tuple[str, str]:
    """The torch.distributed backend for ``local_ranks`` ranks on this machine, and why.

    NCCL needs one GPU per rank (two ranks on one GPU fail with "Duplicate GPU detected"), so the default is
    ``nccl`` only when CUDA is available with at least ``local_ranks`` GPUs; otherwise ``gloo``: on the CPU, or,
    for ranks that compute on CUDA (``device="cuda"``), with their CUDA tensors staged through pinned
    CPU buffers (gloo refuses CUDA tensors; :class:`~gnnpipe.core.comm.Comm`).

    Args:
        requested: ``None`` (choose), ``"gloo"`` or ``"nccl"``.
        local_ranks: ranks that run on this machine (>= 1).
        device: where the ranks compute, ``"cpu"`` or ``"cuda"`` (``TrainConfig.device_type``); ``None``: not
            decided by the caller (the ranks follow the backend: a GPU each under nccl, else the CPU).

    Returns:
        ``(backend, reason)``, e.g. ``("gloo", "2 ranks but 1 GPU(s): gloo on the CPU")``.

    Raises:
        ConfigError: unknown backend, or ``nccl`` requested without one GPU per local rank or with
            ``device="cpu"``.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl_ok = gpus >= local_ranks and dist.is_available() and dist.is_nccl_available()
    staged = device == "cuda" and gpus > 0  # CUDA ranks over gloo: through pinned CPU buffers
    if requested not in (None, "gloo", "nccl"):
        raise ConfigError(f"unknown backend {requested!r}; use gloo (CPU) or nccl (one GPU per rank)")
    if device == "cpu" and gpus > 0:
        if requested == "nccl":
            raise ConfigError("backend nccl sends CUDA tensors only, and --device cpu computes on the CPU; use "
                              "--backend gloo (or --device cuda)")
        return "gloo", ("requested" if requested else "--device cpu") + ": gloo on the CPU"
    if requested is None:
        if nccl_ok:
            return "nccl", f"{local_ranks} rank(s), {gpus} GPU(s): nccl, one GPU per rank"
        why = "no CUDA GPU" if gpus == 0 else f"{local_ranks} ranks but {gpus} GPU(s)"
        if staged:
            return "gloo", f"{why}: gloo, the ranks share the GPU(s) through pinned CPU buffers"
        return "gloo", f"{why}: gloo on the CPU"
    if requested == "gloo":
        if staged:
            return "gloo", "requested: gloo, CUDA tensors through pinned CPU buffers"
        return "gloo", "requested: gloo on the CPU"
    if not nccl_ok:
        raise ConfigError(f"backend nccl needs one CUDA GPU per rank, but {local_ranks} rank(s) would share "
                          f"{gpus} GPU(s) here; use --backend gloo (CPU) or fewer ranks per machine")
    return "nccl", f"requested: nccl, {local_ranks} rank(s) on {gpus} GPU(s)"


def plan_backend(config) -> tuple[str, str]:
    """``(backend, reason)`` of a run of any task: the requested ``--backend`` checked against the layout's local
    ranks (``config.world_size`` here, ``LOCAL_WORLD_SIZE`` under torchrun) and ``--device``, or the default that
    fits them — nccl only with one GPU per local rank, else gloo (on the CPU, or with ``--device cuda`` several
    ranks sharing a GPU through pinned CPU buffers; :func:`choose_backend`).

    Args:
        config: a :class:`~gnnpipe.core.settings.config.TrainConfig` (``backend``, ``device``, ``world_size``).

    Raises:
        ConfigError: unknown backend or device, nccl without one GPU per local rank or with ``--device cpu``,
            ``--device cuda`` without a GPU.
    """
    return choose_backend(config.backend, local_world_size(config.world_size), device=config.device_type)


def rank_device(config=None) -> torch.device:
    """This rank's device: the CPU, or (``config.device_type == "cuda"``, or the nccl backend) GPU
    ``LOCAL_RANK mod (number of GPUs)`` (made the current device), so ranks share GPUs round robin; a single
    process (no ``LOCAL_RANK``, no process group) takes GPU 0.

    Args:
        config: a :class:`~gnnpipe.core.settings.config.TrainConfig`, or ``None`` (the backend decides).

    Raises:
        ConfigError: ``--device cuda`` without a GPU (``config.device_type``).
    """
    nccl = dist.is_initialized() and dist.get_backend() == "nccl"
    if not nccl and (config is None or config.device_type != "cuda"):
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank() if dist.is_initialized() else 0))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def default_backend(local_ranks: int = 1) -> str:
    """``nccl`` when CUDA is available with one GPU per local rank, else ``gloo`` (see :func:`choose_backend`)."""
    return choose_backend(None, local_ranks)[0]


def under_torchrun() -> bool:
    """True when the process was started by ``torchrun`` (or another env:// launcher)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def record_torchrun_error(message: str) -> None:
    """Write ``message`` where ``torchrun`` reads a failed rank's error (``TORCHELASTIC_ERROR_FILE``), so
    that torchrun's failure summary shows it instead of "To enable traceback see …". No-op elsewhere."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as fh:
            # the layout of torch's ErrorHandler.record_exception; the summary prints "py_callstack"
            json.dump({"message": {"message": message, "extraInfo": {"py_callstack": message,
                                                                     "timestamp": str(int(time.time()))}}}, fh)
    except OSError:
        pass


def check_torchrun_world(world_size: int, what: str) -> None:
    """Under ``torchrun``, check that it started ``world_size`` ranks, before any process group starts.

    Args:
        world_size: the ranks the configuration needs (``ways × stages``).
        what: how the configuration spells that product, for the message (e.g. ``"--ways 1 × --stages 4"``).

    Raises:
        ConfigError: ``WORLD_SIZE`` differs; the one-line message is also recorded for torchrun's summary
            (:func:`record_torchrun_error`), so every rank fails with it and nothing waits on a peer.
    """
    if not under_torchrun():
        return
    got = int(os.environ["WORLD_SIZE"])
    if got == world_size:
        return
    msg = (f"rank {os.environ.get('RANK', '?')}: torchrun started {got} rank(s) but {what} needs {world_size}; "
           f"run torchrun --nproc-per-node {world_size} (on one machine), or change the configuration")
    record_torchrun_error(f"gnnpipe: error: {msg}")
    raise ConfigError(msg)


def init_env_process_group(backend: str | None, timeout_s: float | None) -> tuple[int, int]:
    """Join the env:// process group that torchrun prepared; returns ``(rank, world_size)``. ``timeout_s``: the
    wait limit in seconds, ``None``: derived (:func:`wait_limit`). A rank that dies is seen by torchrun's agent,
    which stops the other ranks (and their gloo peers lose their connections at once)."""
    backend = backend or default_backend(local_world_size(int(os.environ.get("WORLD_SIZE", 1))))
    timeout_s = wait_limit(timeout_s, backend)[0]
    if not dist.is_initialized():
        kw = {}
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", 0))
            torch.cuda.set_device(local)
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return dist.get_rank(), dist.get_world_size()


@contextlib.contextmanager
def _interruptible_children():
    """Start child processes able to receive SIGINT. An ignored signal stays ignored through fork and exec, and a
    launcher started as a background job (``cmd &`` in a script) ignores SIGINT: its ranks would then drop the
    SIGINT it forwards on a stop until they install their own handler, and a stop during their start-up would be
    lost. A handled signal is reset to its default in the child, where Python raises ``KeyboardInterrupt``."""
    main = threading.current_thread() is threading.main_thread()
    ignored = main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


#: seconds between a rank's checks that its launcher is still alive (where ``PR_SET_PDEATHSIG`` is not available)
PARENT_CHECK_S = 1.0


def _end_with_parent(parent: int) -> None:
    """Make this process end when its launcher ``parent`` does: ``PR_SET_PDEATHSIG`` (Linux; the kernel sends
    ``SIGKILL``), and a daemon thread that polls ``os.getppid()`` (every platform; also covers a launcher that died
    before the request was made)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(PARENT_CHECK_S)

    threading.Thread(target=watch, name="gnnpipe-parent-watch", daemon=True).start()


def _entry(rank: int, world_size: int, port: int, backend: str, timeout_s: float, threads: int,
           fn: Callable, args: tuple, results, parent: int = 0) -> None:
    if parent:
        _end_with_parent(parent)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    # tqdm's default lock is a multiprocessing semaphore, which os._exit below would leak (and the resource
    # tracker then warns about); a rank only needs a thread lock

    tqdm.set_lock(threading.RLock())
    code = 0
    try:
        if backend == "nccl":  # one GPU per rank (choose_backend checked there are enough)
            torch.cuda.set_device(rank)
        # the parent holds the store's port; meet every rank there (start-up can be slow), then start the group
        store = dist.TCPStore("127.0.0.1", port, world_size, False,
                              timeout=datetime.timedelta(seconds=max(timeout_s, RENDEZVOUS_S)))
        store.set(f"gnnpipe/ready/{rank}", "1")
        store.wait([f"gnnpipe/ready/{r}" for r in range(world_size)])
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        out = fn(rank, world_size, *args)
        # plain pickle (bytes): tensors travel by value, not as shared-memory handles that die with this process
        results.send((rank, "ok", pickle.dumps(out)))
    except BaseException as exc:  # noqa: BLE001 - report everything to the parent
        # gnnpipe's own errors name the problem and the fix: their stack is no help to the user
        where = "" if isinstance(exc, GnnpipeError) else f"\n{traceback.format_exc()}"
        results.send((rank, "error", (time.time(), f"{type(exc).__name__}: {exc}{where}")))
        code = 1
    finally:
        if dist.is_initialized():
            try:
                if code == 0:
                    dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
    try:
        results.close()  # send() above wrote the whole report synchronously
    except Exception:  # noqa: BLE001
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (gloo threads can hang it after a failure)


def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), *, backend: str | None = None,
          timeout_s: float | None = None, threads: int = 1, max_runtime_s: float | None = None,
          graceful: bool = False) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh local processes joined in one process group.

    Args:
        fn: a picklable (module-level) function; its return value must be picklable.
        backend: ``gloo`` or ``nccl``; default :func:`default_backend` for ``world_size`` local ranks
            (nccl only with one GPU per rank).
        timeout_s: the wait limit: process-group timeout in seconds (a collective or receive blocked that long on
            a live peer fails); ``None``: derived (:func:`wait_limit`, torch's default). A rank that dies ends
            the run within seconds whatever it is: the launcher watches the processes.
        threads: ``torch.set_num_threads`` in each rank.
        max_runtime_s: optional hard limit on the whole run (seconds).
        graceful: the ranks stop cleanly on a signal (:mod:`gnnpipe.core.run.stopping`): the first SIGINT/SIGTERM
            is forwarded to them as SIGINT and the launcher waits (up to ``timeout_s`` + 60 s) for them to end;
            a second one stops them at once. Without it, SIGTERM/SIGINT stop the ranks at once.

    Returns:
        the per-rank return values, indexed by rank.

    Raises:
        DistributedError: a rank raised or died; every other rank has been terminated. The message
            names the first failing rank and its error.
    """
    backend = backend or default_backend(world_size)
    timeout_s = wait_limit(timeout_s, backend)[0]
    ctx = mp.get_context("spawn")
    unreadable_main = _unreadable_main()
    if unreadable_main:
        _check_no_main_objects((fn, args), unreadable_main)
    # the store binds a port the OS picks and holds it until the run ends (no free-then-bind race)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=max(timeout_s, RENDEZVOUS_S)),
                          wait_for_workers=False)
    port = store.port
    # one pipe per rank (no semaphores to leak, unlike a multiprocessing.Queue)
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, backend, timeout_s, threads, fn, args, pipes[r][1],
                                                 os.getpid()),
                         daemon=False, name=f"gnnpipe-rank{r}") for r in range(world_size)]
    with _main_not_reimported(unreadable_main), _interruptible_children():
        for p in procs:
            p.start()
    for _, w in pipes:
        w.close()  # the parent only reads; a rank's end closing = EOF
    open_conns = {pipes[r][0]: r for r in range(world_size)}
    out: dict[int, Any] = {}
    errors: dict[int, tuple[float, str]] = {}  # rank -> (time, message)
    deaths: dict[int, str] = {}  # rank -> how it died without a report
    start = time.monotonic()
    exited: dict[int, float] = {}
    first_failure: float | None = None
    timed_out = False

    def poll(timeout: float) -> None:
        for conn in mp_connection.wait(list(open_conns), timeout=timeout):
            try:
                rank, status, payload = conn.recv()
            except (EOFError, OSError):
                open_conns.pop(conn, None)
                continue
            if status == "ok":
                out[rank] = pickle.loads(payload)
            else:
                errors[rank] = payload

    previous: dict = {}
    stop_at: list[float] = []
    stop_name: list[str] = []

    def on_signal(signum, frame):
        now = time.monotonic()
        if stop_at and now - stop_at[0] < stopping.DEBOUNCE_S:
            return  # the same Ctrl-C, seen by the ranks directly (the ranks debounce likewise)
        if stop_at:
            raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")
        stop_at.append(now)
        stop_name.append(signal.Signals(signum).name)
        for p in procs:  # a `kill` of the launcher alone reaches no rank: forward it (the same signal)
            if p.is_alive() and p.pid is not None:
                try:
                    os.kill(p.pid, signum)
                except OSError:
                    pass

    if threading.current_thread() is threading.main_thread():
        if graceful:
            for s in (signal.SIGINT, signal.SIGTERM):
                previous[s] = signal.signal(s, on_signal)
        else:
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _interrupt)  # `kill`/`timeout`: stop the ranks too
    try:
        while len(out) < world_size:
            poll(0.2)
            if stop_at:
                settled = all(r in out or r in errors or r in deaths or procs[r].exitcode is not None
                              for r in range(world_size))
                if settled or time.monotonic() - stop_at[0] > timeout_s + 60.0:
                    if len(out) < world_size:
                        poll(0.2)
                        if not [m for _, m in errors.values() if not m.startswith("KeyboardInterrupt")] and not deaths:
                            raise KeyboardInterrupt(f"stopped by signal {stop_name[0]}")
                        break
                continue
            for r, p in enumerate(procs):
                if p.exitcode is None or r in out or r in errors or r in deaths:
                    continue
                # exit code 0/1: the rank reported (result/error) before exiting and the report is on its
                # way through its pipe; give it a moment, then count the rank as dead
                exited.setdefault(r, time.monotonic())
                if p.exitcode in (0, 1) and time.monotonic() - exited[r] < 3.0:
                    continue
                poll(0.5)
                if r not in out and r not in errors:
                    code = p.exitcode
                    if code < 0:
                        deaths[r] = f"was killed by signal {signal.Signals(-code).name} without reporting a result"
                    elif code == 1:
                        deaths[r] = ("exited with code 1 before it could start its work. Local ranks are started "
                                     "with the 'spawn' method, which re-imports the main script: when calling "
                                     "gnnpipe.api.train from a script, guard it with `if __name__ == \"__main__\":`")
                    else:
                        deaths[r] = f"exited with code {code} without reporting a result"
            if (errors or deaths) and first_failure is None:
                first_failure = time.monotonic()
            # after the first failure, wait briefly so that the root cause (not its echoes) is known
            if first_failure is not None and time.monotonic() - first_failure > 2.0:
                break
            if max_runtime_s is not None and time.monotonic() - start > max_runtime_s:
                timed_out = True
                break
    finally:
        rest = stop_at[0] + stopping.DEBOUNCE_S - time.monotonic() if stop_at else 0.0
        if rest > 0:  # a repeat within the debounce window is the same stop: it must not interrupt the caller
            time.sleep(rest)  # writing the partial results once the previous handlers are back
        for s, h in previous.items():
            signal.signal(s, h)
        # who had reported nothing when the run was stopped: what a rank says after the termination below
        # (a graceful stop's report, a lost connection) is an echo of it, not a sign of life
        silent = [r for r in range(world_size) if r not in out and r not in errors and r not in deaths]
        if errors or deaths or timed_out or len(out) < world_size:
            _terminate(procs)
        else:
            for p in procs:
                p.join(timeout=10)
            _terminate(procs)
    for _ in range(4 * world_size):  # reports still in the pipes
        poll(0.05)
    for conn in pipes:
        conn[0].close()
    del store  # the port is free again only now
    if errors or deaths or timed_out:
        # every failure a timeout (or a lost connection after one): say so, and who went quiet
        if (errors and not deaths and not timed_out and any(_is_timeout(m) for _, m in errors.values())
                and all(_is_timeout(m) or _is_echo(m) for _, m in errors.values())):
            raise DistributedError(_timeout_message(errors, silent, world_size, timeout_s))
        if deaths:  # a rank that died without a word is the root cause; the others only lost it
            rank = min(deaths)
            msg = f"rank {rank} {deaths[rank]}"
        elif errors:
            rank = min(errors, key=lambda r: (_is_echo(errors[r][1]), errors[r][0]))
            msg = errors[rank][1]
        else:
            rank, msg = -1, f"the run exceeded its limit of {max_runtime_s:.0f} s"
        others = sorted((set(errors) | set(deaths)) - {rank})
        who = f"rank {rank}" if rank >= 0 else "the run"
        alike = sorted(r for r in others if r in errors and errors[r][1] == msg)  # the same error, not an echo
        if alike and len(alike) == len(others):
            who = f"ranks {[rank, *alike]}" if len(alike) + 1 < world_size else "every rank"
            others = []
        tail = f"\n(then ranks {others} failed too, having lost their peer)" if others else ""
        raise DistributedError(f"{who} failed; all {world_size} ranks were stopped.\n{msg.rstrip()}{tail}")
    return [out[r] for r in range(world_size)]


def _first_line(msg: str) -> str:
    return msg.strip().split("\n", 1)[0]


def _is_timeout(msg: str) -> bool:
    """Whether a rank's error is a communication timeout (gloo: "Timed out waiting 2000ms for send …")."""
    head = _first_line(msg).lower()
    return "timed out" in head or "timeout" in head


def _timeout_message(errors: dict[int, tuple[float, str]], silent: list[int], world_size: int,
                     timeout_s: float) -> str:
    """The error of a run whose failures are communication timeouts (and connections lost after them).

    Names the ranks that timed out, those that reported neither a result nor an error (the likely stalled
    ones: a rank stuck in a slow step or a hang does not get to report before the launcher stops it), the
    ``--timeout`` value and a larger one to try.
    """
    timed = sorted(r for r in errors if _is_timeout(errors[r][1]))
    lost = sorted(r for r in errors if r not in timed)
    first = min(timed, key=lambda r: errors[r][0])
    bigger = int(max(4 * timeout_s, 60))
    lines = [f"the run hit its communication timeout (--timeout / timeout_s = {timeout_s:g} s); all {world_size} "
             f"ranks were stopped."]
    what = f"rank(s) {timed} timed out waiting for a peer"
    if lost:
        what += f"; rank(s) {lost} then lost their connection"
    if silent:
        who = f"rank {silent[0]}" if len(silent) == 1 else f"ranks {silent}"
        what += (f"; {who} reported neither a result nor an error, so {who} probably stalled (a slow step or "
                 f"hook, or a hang)")
    else:
        what += ("; every rank reported, so none can be singled out: a step on some rank took longer than the "
                 "timeout, or the ranks waited on each other (a deadlock)")
    lines.append(what + ".")
    lines.append(f"If the work is only slow, rerun with a larger --timeout (e.g. --timeout {bigger}; "
                 f"timeout_s={bigger} in Python).")
    lines.append(f"first timeout (rank {first}): {_first_line(errors[first][1])}")
    return "\n".join(lines)


def _unreadable_main() -> str | None:
    """The main script's path when the spawn start method could not re-import it (``python - <<EOF``
    gives ``<stdin>``), else ``None``. Mains without a file (``python -c``, a REPL, Jupyter) and
    ``python -m`` modules are fine."""
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    if path is None or os.path.isfile(path):
        return None
    return path


def _check_no_main_objects(payload: Any, main_path: str) -> None:
    """Raise :class:`ConfigError` when ``payload`` pickles objects defined in ``__main__``, or a component
    registry holds one (ranks look those up by name): ranks cannot import them when the main script is
    ``main_path``, not a readable file."""
    try:
        data = pickle.dumps(payload)
    except Exception:  # noqa: BLE001 - let the process start report unpicklable arguments as before
        data = pickle.dumps(None)
    names = set()
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2 and strings[-2] == "__main__":
            names.add(strings[-1])
        elif op.name == "GLOBAL" and str(arg).startswith("__main__ "):
            names.add(str(arg).split(" ", 1)[1])

    found = sorted(names) + registered_from("__main__")  # registered by name: ranks look them up
    if found:
        raise ConfigError(
            f"the main script is {main_path!r} (read from standard input, e.g. `python - <<EOF`), so the "
            f"local ranks cannot import what it defines ({', '.join(found)}); save the script to a "
            "file and run `python script.py` (with the `if __name__ == \"__main__\":` guard), or move those "
            "definitions into an importable module"
        )


@contextlib.contextmanager
def _main_not_reimported(main_path: str | None):
    """Start processes without asking them to re-run an unreadable main script (``<stdin>``): the spawn
    method re-imports ``__main__.__file__`` in every child, which fails with ``FileNotFoundError``.
    Hidden for the duration of ``Process.start()``, the child starts like one of ``python -c``."""
    main = sys.modules.get("__main__")
    if not main_path or main is None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = main_path


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


_ECHOES = ("Connection closed by peer", "Connection reset", "remote worker crashing", "Broken pipe",
           "Socket Timeout", "Timed out waiting", "Connection refused")


def _is_echo(msg: str) -> bool:
    """Whether an error looks like a consequence of another rank's failure (a lost connection)."""
    return any(e in msg for e in _ECHOES)


def _terminate(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
