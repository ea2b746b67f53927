"""Starting ranks: local processes (the built-in launcher) or an existing ``torchrun`` environment.

Failure handling: every rank runs its function inside ``try``; an exception is reported to the
parent with the rank's traceback. The parent watches the ranks' result pipes *and* the processes' exit codes: as
soon as one rank fails or dies (e.g. killed by a signal), it terminates every other rank and raises
:class:`~gnnpipe.errors.DistributedError` naming the failing rank and its error. Ranks blocked in a
receive on a dead peer are ended by the parent; under ``torchrun`` (no parent of ours) the process
group's timeout (``timeout_s``) makes them fail instead of hanging.
"""

from __future__ import annotations

import datetime
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from multiprocessing import connection as mp_connection

from ..errors import DistributedError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    """``nccl`` when CUDA is available, else ``gloo``."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def under_torchrun() -> bool:
    """True when the process was started by ``torchrun`` (or another env:// launcher)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def init_env_process_group(backend: Optional[str], timeout_s: float) -> tuple[int, int]:
    """Join the env:// process group that torchrun prepared; returns ``(rank, world_size)``."""
    backend = backend or default_backend()
    if not dist.is_initialized():
        kw = {}
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", 0))
            torch.cuda.set_device(local)
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return dist.get_rank(), dist.get_world_size()


def _entry(rank: int, world_size: int, port: int, backend: str, timeout_s: float, threads: int,
           fn: Callable, args: tuple, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    # tqdm's default lock is a multiprocessing semaphore, which os._exit below would leak (and the resource
    # tracker then warns about); a rank only needs a thread lock
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    code = 0
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                init_method=f"tcp://127.0.0.1:{port}",
                                timeout=datetime.timedelta(seconds=timeout_s))
        out = fn(rank, world_size, *args)
        # plain pickle (bytes): tensors travel by value, not as shared-memory handles that die with this process
        results.send((rank, "ok", pickle.dumps(out)))
    except BaseException as exc:  # noqa: BLE001 - report everything to the parent
        results.send((rank, "error", (time.time(), f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")))
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


def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), *, backend: Optional[str] = None,
          timeout_s: float = 60.0, threads: int = 1, max_runtime_s: Optional[float] = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh local processes joined in one process group.

    Args:
        fn: a picklable (module-level) function; its return value must be picklable.
        backend: ``gloo`` (default on CPU) or ``nccl``.
        timeout_s: process-group timeout in seconds (a blocked collective or receive fails after it).
        threads: ``torch.set_num_threads`` in each rank.
        max_runtime_s: optional hard limit on the whole run (seconds).

    Returns:
        the per-rank return values, indexed by rank.

    Raises:
        DistributedError: a rank raised or died; every other rank has been terminated. The message
            names the first failing rank and its error.
    """
    backend = backend or default_backend()
    ctx = mp.get_context("spawn")
    # one pipe per rank (no semaphores to leak, unlike a multiprocessing.Queue)
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, backend, timeout_s, threads, fn, args, pipes[r][1]),
                         daemon=True, name=f"gnnpipe-rank{r}") for r in range(world_size)]
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
    first_failure: Optional[float] = None
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

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill`/`timeout`: stop the ranks too
    try:
        while len(out) < world_size:
            poll(0.2)
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
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
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
    if errors or deaths or timed_out:
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
        tail = f"\n(then ranks {others} failed too, having lost their peer)" if others else ""
        raise DistributedError(f"{who} failed; all {world_size} ranks were stopped.\n{msg.rstrip()}{tail}")
    return [out[r] for r in range(world_size)]


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
