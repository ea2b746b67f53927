"""Per-rank peak memory and epoch time of single process, pipeline, graph parallelism and hybrid on a large
synthetic graph (issue #12), each layout a separate ``gnnpipe train`` run, side by side in one invocation.

    python benchmarks/bench_scale.py --num-nodes 169343 --avg-degree 16 --layers 16 --epochs 2 \\
        --layouts single,pipe8x32,gp8

Layouts: ``single``, ``pipeS`` / ``pipeSxC`` (S stages, C chunks), ``gpW`` (W ways), ``hybWxS`` / ``hybWxSxC``,
each optionally with ``+r`` (``--recompute``), ``+nr`` (``--no-recompute``; without either, recompute is the
memory model's choice), ``+bf16`` (``--history-dtype bfloat16``) and ``+1f1b`` (``--scheduler
1f1b``), e.g. ``pipe8x32+r+1f1b``.
Extra ``gnnpipe train`` flags follow ``--`` (e.g. ``-- --recompute --history-dtype bfloat16``).

Measured per rank: the peak resident set (``VmHWM``, what the run's JSON records as ``peak_mem_bytes``) and
the *runtime floor*: the same rank's peak in the same layout on a tiny graph (``--floor-nodes``, one epoch):
interpreter, libraries and the code pages their kernels touch, thread pools, the process group. ``peak − floor``
is what the role's data and compute cost.
History buffers (GNNPipe's own cost) are reported apart (``history_bytes``).

Safety: the machine's available memory is polled every 0.5 s; a run whose available memory drops under
``--min-free-gib`` is stopped (its whole process group) and reported as stopped, never left to the kernel's
out-of-memory killer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def layout_flags(name: str) -> list[str]:
    """``gnnpipe train`` flags of a layout name (module docstring); suffixes ``+r`` (``--recompute``) and
    ``+bf16`` (``--history-dtype bfloat16``) add options to one layout."""
    name, *opts = name.split("+")
    extra = []
    for o in opts:
        if o == "r":
            extra.append("--recompute")
        elif o == "nr":
            extra.append("--no-recompute")
        elif o in ("bf16", "fp16"):
            extra += ["--history-dtype", "bfloat16" if o == "bf16" else "float16"]
        elif o in ("1f1b", "gpipe"):
            extra += ["--scheduler", o]
        else:
            raise SystemExit(f"unknown layout option +{o}; use +r / +nr (recompute on / off), "
                             f"+bf16 / +fp16 (history dtype) or "
                             f"+1f1b / +gpipe (scheduler)")
    return _layout_flags(name) + extra


def _layout_flags(name: str) -> list[str]:
    if name == "single":
        return ["--stages", "1", "--ways", "1"]
    m = re.fullmatch(r"pipe(\d+)(?:x(\d+))?", name)
    if m:
        return ["--stages", m[1]] + (["--chunks", m[2]] if m[2] else [])
    m = re.fullmatch(r"gp(\d+)", name)
    if m:
        return ["--ways", m[1], "--correctors", "none"]
    m = re.fullmatch(r"hyb(\d+)x(\d+)(?:x(\d+))?", name)
    if m:
        return ["--ways", m[1], "--stages", m[2]] + (["--chunks", m[3]] if m[3] else [])
    raise SystemExit(f"unknown layout {name!r}; use single, pipeS[xC], gpW or hybWxS[xC]")


def _rank_floor(rank, world):
    import torch

    import gnnpipe.cli.main  # noqa: F401  (what a rank of `gnnpipe train` imports before it reads its data)
    import gnnpipe.tasks.nodes.runner  # noqa: F401
    from gnnpipe.core.runtime.memory import peak_memory_bytes

    return peak_memory_bytes(torch.device("cpu"))


def runtime_floors() -> dict:
    """Peak RSS (bytes) of a rank and of a single-process driver that load no data."""
    code = ("import torch, gnnpipe.cli.main, gnnpipe.api, gnnpipe.tasks.nodes.trainer, gnnpipe.data, torch_geometric; "
            "from gnnpipe.core.runtime.memory import peak_memory_bytes; print(peak_memory_bytes(torch.device('cpu')))")
    single = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    from gnnpipe.core.run import launch

    rank = max(launch.spawn(_rank_floor, 2, backend="gloo", timeout_s=60))
    return {"single": single, "rank": rank}


def run_layout(name: str, common: list[str], min_free: int, timeout_s: float) -> dict:
    out = os.path.join(tempfile.mkdtemp(prefix="bench-scale-"), "r.json")
    cmd = [sys.executable, "-m", "gnnpipe", "train", *common, *layout_flags(name), "--out", out, "--no-progress"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    stopped: list[str] = []
    low = [1 << 62]

    def guard():
        while proc.poll() is None:
            avail = _available_bytes()
            low[0] = min(low[0], avail)
            if avail < min_free:
                stopped.append(f"available memory fell to {avail / 2**30:.2f} GiB")
                os.killpg(proc.pid, signal.SIGTERM)
                return
            if time.perf_counter() - t0 > timeout_s:
                stopped.append(f"ran past {timeout_s:.0f} s")
                os.killpg(proc.pid, signal.SIGTERM)
                return
            time.sleep(0.5)

    g = threading.Thread(target=guard, daemon=True)
    g.start()
    log, _ = proc.communicate()
    g.join()
    rec = {"layout": name, "command": " ".join(["gnnpipe", "train", *common, *layout_flags(name)]),
           "wall_s": time.perf_counter() - t0, "min_available_gib": low[0] / 2**30}
    if stopped or proc.returncode != 0 or not os.path.exists(out):
        rec["failed"] = stopped[0] if stopped else f"exit code {proc.returncode}: {log[-2000:]}"
        return rec
    with open(out) as f:
        res = json.load(f)
    extra = res.get("extra", res)
    rec["peak_mem_bytes"] = extra.get("peak_mem_bytes")
    rec["history_bytes"] = extra.get("history_bytes", [0])
    rec["predicted_mem_bytes"] = extra.get("predicted_mem_bytes")
    ep = res.get("epochs", [])
    rec["epoch_time_s"] = [e.get("time_s") for e in ep]
    rec["loss"] = [e.get("loss") for e in ep]
    return rec


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-nodes", type=int, default=169343)
    p.add_argument("--avg-degree", type=float, default=16.0)
    p.add_argument("--num-features", type=int, default=128)
    p.add_argument("--num-classes", type=int, default=40)
    p.add_argument("--model", default="gcnii")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--layouts", default="single,pipe8x32,gp8")
    p.add_argument("--floor-nodes", type=int, default=2048,
                   help="vertices of the tiny graph whose run of the same layout gives each rank's runtime floor")
    p.add_argument("--min-free-gib", type=float, default=1.0, help="stop a run when available memory falls below")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--out", default=None, help="write every record as JSON")
    a = p.parse_args(argv)
    common = ["--num-nodes", str(a.num_nodes), "--avg-degree", str(a.avg_degree), "--num-features",
              str(a.num_features), "--num-classes", str(a.num_classes), "--model", a.model, "--layers",
              str(a.layers), "--hidden", str(a.hidden), "--epochs", str(a.epochs), "--patience", "0", *extra]
    floors = runtime_floors()
    print(f"import floor: single process {floors['single'] / 2**20:.0f} MiB, rank {floors['rank'] / 2**20:.0f} MiB")
    tiny = list(common)
    tiny[tiny.index("--num-nodes") + 1] = str(a.floor_nodes)
    tiny[tiny.index("--epochs") + 1] = "1"
    recs = []
    for name in a.layouts.split(","):
        floor_run = run_layout(name, tiny, int(a.min_free_gib * 2**30), a.timeout)
        rec = run_layout(name, common, int(a.min_free_gib * 2**30), a.timeout)
        rec["floor_run_peak_bytes"] = floor_run.get("peak_mem_bytes")
        recs.append(rec)
        if "failed" in rec:
            print(f"{name:12s} FAILED ({rec['failed'][:300]})")
            continue
        peaks = rec["peak_mem_bytes"]
        # the runtime floor of each rank: its peak in the same layout on a graph of --floor-nodes vertices
        # (interpreter, libraries, the code pages the kernels touch, thread pools, process group), else the import floor
        floor_peaks = (rec["floor_run_peak_bytes"]
                       or [floors["single"] if name == "single" else floors["rank"]] * len(peaks))
        hist = rec["history_bytes"] or [0] * len(peaks)
        over = [pk - fl for pk, fl in zip(peaks, floor_peaks)]
        rec["floor_bytes"] = floor_peaks
        rec["sum_over_floor_bytes"] = sum(over)
        t = [x for x in rec["epoch_time_s"] if x is not None]
        print(f"{name:12s} ranks {len(peaks):2d}  max peak {max(peaks) / 2**20:8.0f} MiB  "
              f"sum(peak-floor) {sum(over) / 2**20:8.0f} MiB  history {sum(hist) / 2**20:7.0f} MiB  "
              f"epoch {(sum(t) / len(t) if t else float('nan')):7.2f} s  loss {rec['loss']}")
        print(f"{'':12s} per-rank peak MiB {[round(x / 2**20) for x in peaks]}, "
              f"floor {[round(x / 2**20) for x in floor_peaks]}")
        pred = rec.get("predicted_mem_bytes")
        if pred:  # the memory model predicts bytes above the runtime floor
            print(f"{'':12s} peak - floor MiB {[round(x / 2**20) for x in over]}, predicted "
                  f"{[round(x / 2**20) for x in pred]} (predicted / measured "
                  f"{[round(p_ / o, 2) if o > 0 else None for p_, o in zip(pred, over)]})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"floors": floors, "runs": recs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
