"""Cost model validation: predicted vs measured epoch time, bytes per epoch and peak memory per rank.

    python benchmarks/bench_cost_model.py --out cost_model.json            # the full set (16 runs)
    python benchmarks/bench_cost_model.py --quick --out cost_model.json    # 12 small runs (~10 min on 2 cores)
    python benchmarks/bench_cost_model.py --quick --rounds 3 --out cost_model.json  # each run 3 times, interleaved

For each job (dataset × model) the model is profiled (``gnnpipe.tasks.nodes.cost.profile``, in a fresh process, as
``gnnpipe plan`` profiles; the link is measured once for all jobs), every listed layout is predicted for this
machine (``local_hardware``), and then
trained for ``--epochs`` epochs by ``python -m gnnpipe train`` in a fresh process (so that each run's peak
memory is its own). Measured: the median epoch time over the epochs after the first, the last epoch's bytes by
kind, the peak resident memory of every rank (``VmHWM``). With ``--rounds R`` the job is profiled ``R`` times
and every layout trained ``R`` times, round-robin (a profile, layout 1, 2, …; a profile, layout 1, 2, … again):
the measured epoch time is the median over the rounds, and so is the predicted one (the round whose prediction
is the median: a profile is a measurement too). On this VM the same run's speed drifts by more than the 25 %
tolerance within an hour (docs/RESULTS.md §14f), so one profile and one run measure the machine's moment as
much as the layout; the table also counts, per round, that round's prediction against that round's run. Memory is
compared above the runtime floor: a spawned rank's floor is the profile's probe (torch, PyG and gloo imported and
joined, no data), the single process's floor a fresh interpreter that imported gnnpipe's CLI; both absolute and
above-floor figures are printed.

The machine's load is measured around each run: ``cpu share`` = thread CPU time / wall time of a 0.3 s busy
loop (1.0 on an idle core). The predictions are of CPU work on this machine's cores (ranks beyond the cores
share them); on a machine shared with other jobs the measured wall time exceeds them by about 1 / share.
Prints a markdown table; ``--out`` writes every record as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"

# job name -> (train flags, [(ways, stages, chunks, over, scheduler)])
JOBS = {
    "Cora GCNII-16 h64": (["--dataset", "Cora", "--root", str(DATA / "planetoid"), "--normalize-features",
                           "--model", "gcnii", "--layers", "16", "--hidden", "64"],
                          [(1, 1, 1, 1, "gpipe"), (1, 2, 8, 4, "gpipe"), (1, 4, 16, 4, "1f1b"), (4, 1, 4, 1, "gpipe")]),
    "Computers GCNII-32 h100": (["--dataset", "Computers", "--root", str(DATA / "amazon"), "--model", "gcnii",
                                 "--layers", "32", "--hidden", "100"],
                                [(1, 1, 1, 1, "gpipe"), (1, 2, 8, 4, "gpipe"), (1, 4, 16, 4, "gpipe"),
                                 (2, 1, 2, 1, "gpipe"), (2, 2, 16, 4, "1f1b")]),
    "Physics GCNII-8 h64": (["--dataset", "Physics", "--root", str(DATA / "coauthor"), "--model", "gcnii",
                             "--layers", "8", "--hidden", "64"],
                            [(1, 1, 1, 1, "gpipe"), (1, 3, 12, 4, "gpipe"), (2, 1, 2, 1, "gpipe")]),
    "synthetic 40k d10 GCNII-8 h64": (["--num-nodes", "40000", "--avg-degree", "10", "--model", "gcnii",
                                       "--layers", "8", "--hidden", "64"],
                                      [(1, 1, 1, 1, "gpipe"), (1, 2, 8, 1, "1f1b"), (1, 4, 16, 4, "gpipe"),
                                       (2, 2, 16, 4, "gpipe")]),
}

QUICK = {
    "Cora GCNII-16 h64": JOBS["Cora GCNII-16 h64"],
    "Computers GCNII-8 h64": (["--dataset", "Computers", "--root", str(DATA / "amazon"), "--model", "gcnii",
                               "--layers", "8", "--hidden", "64"],
                              [(1, 1, 1, 1, "gpipe"), (1, 2, 8, 4, "gpipe"), (2, 1, 2, 1, "gpipe")]),
    "Physics GCNII-4 h64": (["--dataset", "Physics", "--root", str(DATA / "coauthor"), "--model", "gcnii",
                             "--layers", "4", "--hidden", "64"],
                            [(1, 1, 1, 1, "gpipe"), (1, 3, 12, 4, "gpipe")]),
    "synthetic 20k d10 GCNII-8 h64": (["--num-nodes", "20000", "--avg-degree", "10", "--model", "gcnii",
                                       "--layers", "8", "--hidden", "64"],
                                      [(1, 1, 1, 1, "gpipe"), (1, 2, 8, 1, "1f1b"), (2, 2, 16, 4, "gpipe")]),
}


#: glibc: a fixed mmap threshold returns every freed block >= 128 KiB at once, so the resident peak is the
#: peak of live memory (2-3x slower; used only to measure memory)
LIVE_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def cpu_share(seconds: float = 0.3) -> float:
    """Thread CPU time / wall time of a busy loop (1.0 on an idle core)."""
    w0, c0 = time.perf_counter(), time.thread_time()
    x = 0
    while time.perf_counter() - w0 < seconds:
        x += 1
    return (time.thread_time() - c0) / (time.perf_counter() - w0)


def single_floor() -> int:
    """Peak resident bytes of a fresh interpreter that imported gnnpipe's CLI (no data)."""
    code = ("import torch, torch_geometric.data, gnnpipe.api, gnnpipe.cli.main\n"
            "from gnnpipe.core.runtime.memory import peak_memory_bytes\nprint(peak_memory_bytes(torch.device('cpu')))")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.split()[-1])


def layout_flags(w: int, s: int, c: int, over: int, sch: str) -> list[str]:
    if w == 1 and s == 1:
        return []
    if s == 1:
        return ["--ways", str(w), "--correctors", "none", "--over-partition", "1"]
    return ["--ways", str(w), "--stages", str(s), "--chunks", str(c), "--over-partition", str(over), "--scheduler", sch]


def measure(flags: list[str], epochs: int, timeout: int, env: dict | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "gnnpipe", "train", *flags, "--epochs", str(epochs), "--eval-every",
               str(epochs), "--no-progress", "--out", str(out)]
        share0 = cpu_share()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
        share1 = cpu_share()
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
        r = json.loads(out.read_text())
    ep = r["epochs"]
    later = ep[1:] if len(ep) > 1 else ep
    last = ep[-1]
    return {
        "epoch_s": statistics.median(e["time_s"] for e in later),
        "epoch_s_all": [e["time_s"] for e in ep],
        "bytes": {k: int(last.get(f"bytes_{k}", 0)) for k in ("layer", "graph", "weight")},
        "peak_mem_bytes": r["peak_mem_bytes"], "cpu_share": (share0 + share1) / 2,
        "chunk_sizes": r.get("plan", {}).get("chunk_sizes"),
        "compute_s": [sum(e["compute_s"][k] for e in later) / len(later) for k in range(len(r["peak_mem_bytes"]))]
        if "compute_s" in last else None,
        # thread CPU seconds per rank per epoch (every run records a list: one per rank, one for a single process)
        "cpu_s": [sum(e["cpu_s"][k] for e in later) / len(later) for k in range(len(last["cpu_s"]))]
        if "cpu_s" in last else None,
    }


def _config(flags: list[str]):
    from gnnpipe.cli.train import add_train_arguments, config_from_args
    from gnnpipe.tasks.nodes.trainer import resolve_config

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return resolve_config(config_from_args(parser.parse_args(flags)))


def profile_fresh(flags: list[str], link: dict, timeout: int, ranks: int | None = None):
    """The job's :class:`~gnnpipe.tasks.nodes.cost.profile.Profile`, taken in a fresh interpreter (as ``gnnpipe plan``
    takes it): a process that already profiled or trained another job runs its whole-graph passes slower
    (its allocator's state), which would put every later job's single-process prediction high."""
    import attrs

    from gnnpipe.costmodel import Link
    from gnnpipe.tasks.nodes.cost import Profile

    spec = {"flags": flags, "link": {k: attrs.asdict(v) if isinstance(v, Link) else v for k, v in link.items()},
            "ranks": ranks}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.json"
        p = subprocess.run([sys.executable, __file__, "--_profile", json.dumps(spec), str(out)], check=False,
                           timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"profiling {' '.join(flags)} failed:\n{p.stderr[-2000:]}")
        return Profile.load(out)


def _profile_child(spec_json: str, out: str) -> None:
    from gnnpipe import api
    from gnnpipe.costmodel import Link
    from gnnpipe.tasks.nodes.cost import profile

    spec = json.loads(spec_json)
    link = {k: Link(**v) if isinstance(v, dict) else v for k, v in spec["link"].items()}
    cfg = _config(spec["flags"])
    profile(cfg, api.load_data(cfg), link_result=link, ranks=spec.get("ranks")).save(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the 12 smaller runs")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1,
                    help="profile the job and train every layout this many times, round-robin; predicted and "
                         "measured epoch times are the medians over the rounds")
    ap.add_argument("--jobs", default=None, help="comma-separated job names (substring match)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    ap.add_argument("--no-live-memory", dest="live_memory", action="store_false",
                    help="skip the extra 1-epoch run per layout that measures live memory")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-json", default=None, help="only print the tables of a previous --out file")
    ap.add_argument("--_profile", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._profile:
        return _profile_child(*args._profile)
    if args.from_json:
        records = json.loads(Path(args.from_json).read_text())
        print(table(records))
        print()
        print(ranking(records))
        return

    from gnnpipe import api
    from gnnpipe.costmodel.hardware import local_hardware
    from gnnpipe.tasks.nodes.cost.layouts import LayoutSpec
    from gnnpipe.tasks.nodes.cost.predict import predict_layout
    from gnnpipe.tasks.nodes.cost.profile import link_fields, profile_link

    jobs = QUICK if args.quick else JOBS
    if args.jobs:
        keys = [k.strip() for k in args.jobs.split(",")]
        jobs = {n: j for n, j in jobs.items() if any(k in n for k in keys)}
    hw = local_hardware()
    # the most ranks of any run: a run with more ranks than cores is predicted with the measured cost of a wait
    most = max(w * s for _, layouts in jobs.values() for w, s, *_ in layouts)
    p2p, ar, raw = profile_link(ranks=most)
    link = link_fields(p2p, ar, raw)
    floor_rank = int(raw["floor"])
    floor_single = single_floor()
    print(f"link: p2p {p2p}, allreduce {ar}; main-thread CPU per message {1e6 * link['msg_cpu_s']:.1f} us + "
          f"{1e12 * link['msg_cpu_s_per_byte']:.2f} ps/B; a wait with {link['switch_ranks']} ranks on {raw['cores']} "
          f"cores {1e3 * link['switch_s']:.2f} ms (+{1e3 * link['switch_peer_s']:.2f} ms per further peer); "
          f"runtime floor: rank {floor_rank / 2**20:.0f} MiB, single process {floor_single / 2**20:.0f} MiB; "
          f"hardware: {hw.name}", file=sys.stderr)
    records = []
    for name, (flags, layouts) in jobs.items():
        cfg = _config(flags)
        data = api.load_data(cfg)
        runs: list[list[dict]] = [[] for _ in layouts]
        preds_r: list[list] = [[] for _ in layouts]
        for rnd in range(args.rounds):
            # round-robin: a profile, then every layout once; the rounds sample the machine at several moments
            t0 = time.perf_counter()
            # as `gnnpipe plan --ranks R` profiles: R the job's most ranks (time-slicing is measured above the cores)
            prof = profile_fresh(flags, link, args.timeout, ranks=max(w * s for w, s, *_ in layouts))
            print(f"{name}, round {rnd}: profiled in {time.perf_counter() - t0:.1f} s (fit RMS error "
                  f"{prof.fit_error:.1%}, cpu/wall {prof.cpu_over_wall:.2f})", file=sys.stderr)
            for i, (w, s, c, over, sch) in enumerate(layouts):
                spec = LayoutSpec(w, s, c, over, sch)
                floor = floor_single if (w, s) == (1, 1) else floor_rank
                pred = predict_layout(cfg, data, spec, prof, hw, floor)
                preds_r[i].append((spec, floor, pred, prof))
                meas = measure(flags + layout_flags(w, s, c, over, sch), args.epochs, args.timeout)
                runs[i].append(meas)
                print(f"  round {rnd}: {spec.label()} C={c} over={over} {sch}: predicted {1000 * pred.epoch_s:.1f}, "
                      f"measured {1000 * meas['epoch_s']:.1f} ms (cpu share {meas['cpu_share']:.2f}), bytes "
                      f"{'equal' if meas['bytes'] == pred.bytes else 'DIFFER'}", file=sys.stderr)
        # per layout the round whose prediction is the median (the lower one of an even count)
        preds = []
        for i in range(len(layouts)):
            ranked = sorted(preds_r[i], key=lambda t: t[2].epoch_s)
            preds.append(ranked[(len(ranked) - 1) // 2])
        for i, (w, s, c, over, sch) in enumerate(layouts):
            spec, floor, pred, prof = preds[i]
            meas = dict(runs[i][0])
            meas["epoch_s_rounds"] = [m["epoch_s"] for m in runs[i]]
            meas["epoch_s"] = statistics.median(meas["epoch_s_rounds"])
            meas["bytes_all_equal"] = all(m["bytes"] == meas["bytes"] for m in runs[i])
            meas["predicted_epoch_s_rounds"] = [t[2].epoch_s for t in preds_r[i]]
            meas["bytes_predicted_all_equal"] = all(t[2].bytes == pred.bytes for t in preds_r[i])
            if meas["cpu_s"] is not None:
                meas["cpu_s"] = [statistics.median(m["cpu_s"][k] for m in runs[i]) for k in range(len(meas["cpu_s"]))]
            if args.live_memory:  # one more epoch with a fixed mmap threshold: resident memory = live memory
                live = measure(flags + layout_flags(w, s, c, over, sch), 1, args.timeout, LIVE_ENV)
                meas["live_peak_mem_bytes"] = live["peak_mem_bytes"]
            rec = {"job": name, "layout": spec.label(), "ways": w, "stages": s, "chunks": c, "over_partition": over,
                   "scheduler": sch, "predicted": pred.to_record(), "measured": meas, "floor_bytes": floor,
                   "profile": {"fit_error": prof.fit_error, "cpu_over_wall": prof.cpu_over_wall,
                               "profile_s": prof.profile_s, "action_overhead_s": prof.action_overhead_s,
                               "gp_op_s": prof.gp_op_s, "gp_op_s_per_elem": prof.gp_op_s_per_elem,
                               "msg_cpu_s": prof.msg_cpu_s, "msg_cpu_s_per_byte": prof.msg_cpu_s_per_byte,
                               "switch_s": prof.switch_s, "switch_peer_s": prof.switch_peer_s,
                               "switch_ranks": prof.switch_ranks},
                   "same_plan": meas["chunk_sizes"] in (None, pred.plan_info.get("chunk_sizes"))}
            records.append(rec)
            print(f"  {spec.label()} C={c}: measured {1000 * meas['epoch_s']:.1f} ms (median of "
                  f"{[round(1000 * t, 1) for t in meas['epoch_s_rounds']]}), predicted {1000 * pred.epoch_s:.1f} "
                  f"(median of {[round(1000 * t, 1) for t in meas['predicted_epoch_s_rounds']]})", file=sys.stderr)
    print(table(records))
    print()
    print(ranking(records))
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
        print(f"wrote {args.out}", file=sys.stderr)


def table(records: list[dict]) -> str:
    """Markdown: time, bytes, and memory above the runtime floor (max over ranks): predicted live vs measured
    live (fixed mmap threshold), predicted resident vs measured resident (default allocator)."""
    lines = ["| job | layout | C | over | sched | predicted ms | measured ms | pred/meas | cpu share | "
             "work ms/rank pred (max) | CPU ms/rank meas (max) | pred/meas | bytes equal | "
             "live MiB pred | live MiB meas | pred/meas | resident MiB pred | resident MiB meas | pred/meas |",
             "|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|"]

    def ratio(a, b):
        return f"{a / b:.2f}" if b > 0 else "n/a"

    for r in records:
        p, m = r["predicted"], r["measured"]
        fl = r["floor_bytes"]
        live_p = max(p["predicted_mem_bytes"]) / 2**20
        res_p = max(p["predicted_resident_above_floor_bytes"]) / 2**20
        res_m = (max(m["peak_mem_bytes"]) - fl) / 2**20
        live_m = (max(m["live_peak_mem_bytes"]) - fl) / 2**20 if "live_peak_mem_bytes" in m else float("nan")
        work_p = 1000 * max(p.get("predicted_work_s") or [float("nan")])
        cpu_m = 1000 * max(m.get("cpu_s") or [float("nan")])
        lines.append(
            f"| {r['job']} | {r['layout']} | {r['chunks']} | {r['over_partition']} | "
            f"{r['scheduler'] if r['stages'] > 1 else '-'} | {1000 * p['predicted_epoch_s']:,.1f} | "
            f"{1000 * m['epoch_s']:,.1f} | {ratio(p['predicted_epoch_s'], m['epoch_s'])} | {m['cpu_share']:.2f} | "
            f"{work_p:,.1f} | {cpu_m:,.1f} | {ratio(work_p, cpu_m)} | "
            f"{'yes' if m['bytes'] == p['predicted_bytes_by_kind'] else 'NO'} | {live_p:,.0f} | {live_m:,.0f} | "
            f"{ratio(live_p, live_m)} | {res_p:,.0f} | {res_m:,.0f} | {ratio(res_p, res_m)} |")
    return "\n".join(lines)


def ranking(records: list[dict], margin: float = 0.2) -> str:
    """Per job, every pair of layouts whose measured epoch times differ by more than ``margin``: does the
    prediction order them the same way? Also the error counts of the acceptance criteria."""
    lines = ["| job | pairs differing > 20 % | predicted order agrees |", "|---|--:|--:|"]
    by_job: dict[str, list] = {}
    for r in records:
        by_job.setdefault(r["job"], []).append(r)
    for job, rs in by_job.items():
        n = ok = 0
        for i in range(len(rs)):
            for j in range(i + 1, len(rs)):
                a, b = rs[i], rs[j]
                ma, mb = a["measured"]["epoch_s"], b["measured"]["epoch_s"]
                if max(ma, mb) / min(ma, mb) - 1 <= margin:
                    continue
                n += 1
                pa, pb = a["predicted"]["predicted_epoch_s"], b["predicted"]["predicted_epoch_s"]
                ok += (pa < pb) == (ma < mb)
        lines.append(f"| {job} | {n} | {ok} |")
    within = sum(abs(r["predicted"]["predicted_epoch_s"] / r["measured"]["epoch_s"] - 1) <= 0.25 for r in records)
    exact = sum(r["measured"]["bytes"] == r["predicted"]["predicted_bytes_by_kind"]
                and r["measured"].get("bytes_all_equal", True) and r["measured"].get("bytes_predicted_all_equal", True)
                for r in records)
    lines.append("")
    lines.append(f"epoch time within 25 %: {within} of {len(records)} runs; bytes equal: {exact} of {len(records)}")
    rounds = min((len(r["measured"].get("epoch_s_rounds", [])) for r in records), default=0)
    if rounds > 1 and all("predicted_epoch_s_rounds" in r["measured"] for r in records):
        per = [int(sum(abs(r["measured"]["predicted_epoch_s_rounds"][k] / r["measured"]["epoch_s_rounds"][k] - 1)
                       <= 0.25 for r in records)) for k in range(rounds)]
        lines.append(f"within 25 % in each round alone (that round's profile against that round's run): {per}")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
