"""GNNPipe against graph parallelism on links of a set bandwidth: epoch time per layout against bandwidth.

GNNPipe's claim (Chen et al., arXiv 2308.10087: per-epoch time up to 2.45×, on average 2.03×, lower than graph
parallelism) rests on the network: it moves far fewer bytes than graph parallelism, which pays a halo exchange
per layer. On one machine over the loopback a byte costs almost nothing; here every rank runs in a network
namespace of its own and every pair of ranks has a veth link shaped by ``tc … tbf`` to a set rate
(``benchmarks/netns_links.py``; needs root), so gloo pays for every byte as a cluster's network would.

For each job (GCNII of ``--layers`` on each ``--datasets``, hidden ``--hidden``), rank count ``--ranks`` and link
rate ``--mbit``, the script

1. makes the mesh and measures each link with the profile's ping-pong (set against measured rate);
2. trains each layout of the rank count (``gp``: graph parallelism W × 1, one METIS part per rank; ``gnnpipe``:
   1 × S with 4·S chunks, METIS over-partitioning 4, 1f1b, correctors t1,t2,t3; ``hybrid``: 2 × S/2, 4·S chunks)
   with ``python -m gnnpipe train`` started in the namespaces under torchrun's environment, ``--epochs`` epochs;
   the epoch time is the median of the epochs after the first;
3. predicts each layout with ``gnnpipe plan --hardware FILE`` (a TOML of the set rate: every link at the rate,
   ``per_pair`` as the mesh, and once more with the measured exchange rate as ``exchange_gbps``; one node of this
   machine's cores: ``netns_links.hardware_toml``), from one profile per job and rank count.

The paper-scaled rate: the paper's 10 Gbit/s inter-node Ethernet (1.25e9 B/s) divided by the speed factor of one
of its GPUs against one core here — ``--speed``, default 40, the ``paper-a5000`` hardware file's (assumed, not
measured) factor — keeps the paper's ratio of communication to compute: 1.25e9 / 40 = 31.25e6 B/s = 250 Mbit/s.

Outputs (``--out-dir``): ``network_regime.json`` (everything), ``.csv`` and ``.md`` (one row per job, ranks,
rate and layout: measured and predicted epoch, bytes, idle fraction, peak memory) and ``network_regime.png``
(epoch time against bandwidth per layout, measured and predicted).

Usage::

    python benchmarks/bench_network_regime.py --smoke                        # 1-3 minutes, leaves nothing behind
    python benchmarks/bench_network_regime.py --datasets Computers --layers 32 --ranks 2 4 --mbit 62.5 250 1000
    python benchmarks/bench_network_regime.py --datasets Physics --ranks 2 --mbit 250 inf   # inf: veths unshaped
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import netns_links

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
#: dataset name -> folder under ../shared/data holding it the way PyG expects
ROOTS = {"Computers": "amazon", "Photo": "amazon", "Physics": "coauthor", "CS": "coauthor", "Cora": "planetoid",
         "CiteSeer": "planetoid"}
PAPER_INTER_BPS = 10e9 / 8  # the paper's 10 Gbit/s Ethernet between nodes
PAPER_SPEED = 40.0  # gnnpipe/costmodel/machines/paper-a5000.toml [device] speed (assumed there)
LABEL = {"gp": "GP", "gnnpipe": "GNNPipe", "hybrid": "hybrid"}


def layouts(ranks: int, wanted: Sequence[str]) -> dict[str, tuple[int, int, int | None]]:
    """``{mode: (ways, stages, chunks)}`` of ``ranks`` ranks (``chunks`` ``None`` for GP: one part per rank;
    the hybrid is 2 × R/2 and needs an even R >= 4)."""
    out: dict[str, tuple[int, int, int | None]] = {}
    for m in wanted:
        if m == "gp":
            out[m] = (ranks, 1, None)
        elif m == "gnnpipe":
            out[m] = (1, ranks, 4 * ranks)
        elif m == "hybrid":
            if ranks >= 4 and ranks % 2 == 0:
                out[m] = (2, ranks // 2, 4 * ranks)
        else:
            raise ValueError(f"unknown layout {m!r}; use gp, gnnpipe, hybrid")
    return out


def job_args(dataset: str, layers: int, hidden: int, layer_split: str = "equal") -> list[str]:
    split = [] if layer_split == "equal" else ["--layer-split", layer_split]
    if dataset.startswith("synthetic:"):
        return ["--num-nodes", dataset.split(":", 1)[1], "--model", "gcnii", "--layers", str(layers),
                "--hidden", str(hidden), *split]
    return ["--dataset", dataset, "--root", str(DATA / ROOTS.get(dataset, dataset.lower())), "--model", "gcnii",
            "--layers", str(layers), "--hidden", str(hidden), *split]


def job_name(dataset: str, layers: int, hidden: int, layer_split: str = "equal") -> str:
    return f"{dataset} GCNII-{layers} h{hidden}" + ("" if layer_split == "equal" else f" {layer_split} split")


def train_argv(job: list[str], ways: int, stages: int, chunks: int | None, epochs: int, out: str) -> list[str]:
    argv = [sys.executable, "-m", "gnnpipe", "train", *job, "--ways", str(ways), "--stages", str(stages),
            "--epochs", str(epochs), "--eval-every", str(epochs), "--no-progress", "--timeout", "900", "--out", out]
    if chunks is not None:
        argv += ["--chunks", str(chunks), "--over-partition", "4", "--scheduler", "1f1b"]
    return argv


def measured_row(res: dict) -> dict:
    """Epoch time (median of the epochs after the first), bytes per epoch by kind, idle, peak memory of a result."""
    eps = res["epochs"]
    times = [e["time_s"] for e in eps[1:]] or [e["time_s"] for e in eps]
    last = eps[-1]
    idle = [statistics.median(e["idle_s"][r] / e["time_s"] for e in eps[1:] or eps) for r in range(len(last["idle_s"]))]
    return {"epoch_s": statistics.median(times), "epoch_s_all": [e["time_s"] for e in eps],
            "bytes_layer": int(last["bytes_layer"]), "bytes_graph": int(last["bytes_graph"]),
            "bytes_weight": int(last["bytes_weight"]),
            "bytes": int(last["bytes_layer"] + last["bytes_graph"] + last["bytes_weight"]),
            "idle_fraction_max": max(idle), "idle_fraction_mean": sum(idle) / len(idle),
            "peak_MiB_max": max(res["peak_mem_bytes"]) / 2 ** 20,
            "recompute": ((res.get("plan") or {}).get("recompute") or {}).get("on"),
            "cpu_s": [statistics.median(e["cpu_s"][r] for e in eps[1:] or eps) for r in range(len(last["idle_s"]))]
            if all("cpu_s" in e for e in eps) else None}


def pick_prediction(records: list[dict], ways: int, stages: int, chunks: int | None) -> dict | None:
    """The plan record of the trained layout (GP: the one GP record; else chunks, over-partitioning 4, 1f1b)."""
    for r in records:
        if r["ways"] != ways or r["stages"] != stages:
            continue
        if stages == 1 or (r["chunks"] == chunks and r["over_partition"] == 4 and r["scheduler"] == "1f1b"):
            return r
    return None


def crossover(points: dict[str, list[tuple[float, float]]], a: str = "gp", b: str = "gnnpipe") -> float | None:
    """The link rate (B/s) at which layouts ``a`` and ``b`` take equal time, from each one's fit of
    ``epoch = t0 + k / rate`` over its ``(rate, epoch_s)`` points; ``None`` when they do not cross at a positive
    rate (or fewer than 2 rates). Below the crossover the layout with the smaller ``k`` (fewer bytes) wins."""
    fits = {}
    for m in (a, b):
        pts = points.get(m, [])
        if len({p[0] for p in pts}) < 2:
            return None
        xs = [1.0 / p[0] for p in pts]
        ys = [p[1] for p in pts]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        k = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        fits[m] = (my - k * mx, k)
    (t_a, k_a), (t_b, k_b) = fits[a], fits[b]
    if k_a == k_b or t_a == t_b:
        return None
    inv = (t_b - t_a) / (k_a - k_b)
    return 1.0 / inv if inv > 0 else None


def run_plan(job: list[str], ranks: int, rate_Bps: float, cores: int, work: Path, profile: Path,
             contention: bool, exchange_Bps: float | None = None, latency_s: float = 0.0,
             epochs: int | None = None, cpu_s_per_byte: float = 0.0) -> list[dict]:
    """``gnnpipe plan`` of ``job`` on ``ranks`` ranks for a TOML of the set rate, the measured latency and host CPU
    per byte (and, given, the measured rate of an exchange both ways at once); the profile is taken once into
    ``profile`` and reused."""
    tag = f"{profile.stem}_{int(rate_Bps)}_{'x' if exchange_Bps else 'f'}"
    hw = work / f"hw_{tag}.toml"
    hw.write_text(netns_links.hardware_toml(f"mesh {ranks} ranks at {rate_Bps * 8 / 1e6:g} Mbit/s", ranks,
                                            rate_Bps, cores, latency_us=latency_s * 1e6, exchange_Bps=exchange_Bps,
                                            cpu_s_per_byte=cpu_s_per_byte))
    out = work / f"plan_{tag}.json"
    # the runs' epochs and evaluation: the memory model's recompute="auto" decision depends on them
    runs = ["--epochs", str(epochs), "--eval-every", str(epochs)] if epochs else []
    argv = [sys.executable, "-m", "gnnpipe", "plan", *job, *runs, "--ranks", str(ranks), "--hardware", str(hw),
            "--chunks-per-stage", "4", "--over-partitions", "4", "--schedulers", "1f1b", "--no-progress",
            "--out", str(out)]
    argv += ["--profile-in", str(profile)] if profile.exists() else ["--profile-out", str(profile)]
    if not contention:
        argv.append("--no-contention")
    r = subprocess.run(argv, cwd=str(ROOT), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"gnnpipe plan failed: {r.stderr[-2000:]}")
    return json.loads(out.read_text())


def _same_rate(a: float, b: float) -> bool:
    """Two link rates (Mbit/s) are the same setting (``inf``: unshaped)."""
    return a == b or abs(a - b) < 1e-6


def network_deltas(rows: list[dict]) -> list[dict]:
    """Per job, rank count and layout: each slower rate's epoch minus the fastest rate's, measured and predicted."""
    out = []
    for key in sorted({(r["job"], r["ranks"], r["layout"]) for r in rows}):
        sel = sorted((r for r in rows if (r["job"], r["ranks"], r["layout"]) == key), key=lambda r: -r["rate_Bps"])
        if len(sel) < 2:
            continue
        top = sel[0]
        for r in sel[1:]:
            def diff(k, r=r, top=top):
                return r[k] - top[k] if r.get(k) is not None and top.get(k) is not None else None
            out.append({"job": key[0], "ranks": key[1], "layout": key[2], "mbit": r["mbit"],
                        "measured_s": diff("epoch_s"), "predicted_s": diff("pred_epoch_s"),
                        "predicted_x_s": diff("pred_x_epoch_s")})
    return out


def write_outputs(rows: list[dict], links: list[dict], meta: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "network_regime.json").write_text(json.dumps({"meta": meta, "links": links, "rows": rows}, indent=1))
    cols = ["job", "ranks", "mbit", "layout", "epoch_s", "pred_epoch_s", "pred_over_meas", "pred_x_epoch_s",
            "pred_x_over_meas", "bytes", "pred_bytes", "idle_fraction_max", "peak_MiB_max"]
    with open(out_dir / "network_regime.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    md = ["| job | ranks | Mbit/s | layout | measured ms | predicted ms (full duplex) | pred/meas | predicted ms "
          "(measured exchange) | pred/meas | MiB/epoch | idle (max rank) | peak MiB |",
          "|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|"]

    def ms(r, k):
        return f"{r[k] * 1e3:,.0f}" if r.get(k) else "-"

    def ratio(r, k):
        return f"{r[k]:.2f}" if r.get(k) else "-"

    for r in rows:
        md.append(f"| {r['job']} | {r['ranks']} | {r['mbit']:g} | {r['layout']} | {r['epoch_s'] * 1e3:,.0f} "
                  f"| {ms(r, 'pred_epoch_s')} | {ratio(r, 'pred_over_meas')} | {ms(r, 'pred_x_epoch_s')} "
                  f"| {ratio(r, 'pred_x_over_meas')} | {r['bytes'] / 2 ** 20:,.1f} | {r['idle_fraction_max']:.2f} "
                  f"| {r['peak_MiB_max']:,.0f} |")
    md.append("")
    md.append("| ranks | Mbit/s | link measured / set (one way) | both ways at once, each / set |")
    md.append("|--:|--:|---|---|")
    for lk in links:
        md.append(f"| {lk['ranks']} | {lk['mbit']:g} | "
                  + ", ".join(f"{m['nodes'][0]}-{m['nodes'][1]}: {m['ratio']:.3f}" for m in lk["measured"]) + " | "
                  + ", ".join(f"{m.get('exchange_ratio', float('nan')):.3f}" for m in lk["measured"]) + " |")
    deltas = network_deltas(rows)
    if deltas:
        md += ["", "Time the slower links add (epoch at a rate − epoch at the fastest rate; on a loaded machine the "
                   "compute both include is inflated alike, the difference much less):", "",
               "| job | ranks | layout | Mbit/s | measured + s | predicted + s (full duplex) | (measured exchange) |",
               "|---|--:|---|--:|--:|--:|--:|"]
        for d in deltas:
            def f(v):
                return f"{v:,.2f}" if v is not None else "-"
            md.append(f"| {d['job']} | {d['ranks']} | {d['layout']} | {d['mbit']:g} | {f(d['measured_s'])} "
                      f"| {f(d['predicted_s'])} | {f(d['predicted_x_s'])} |")
    if meta.get("crossovers"):
        md += ["", "| job | ranks | GP = GNNPipe at: measured | predicted (full duplex) | predicted (measured "
                   "exchange) |", "|---|--:|--:|--:|--:|"]
        for c in meta["crossovers"]:
            def f(v):
                return f"{v * 8 / 1e6:,.0f} Mbit/s" if v else "none"
            md.append(f"| {c['job']} | {c['ranks']} | {f(c['measured_Bps'])} | {f(c['predicted_Bps'])} "
                      f"| {f(c.get('predicted_x_Bps'))} |")
    (out_dir / "network_regime.md").write_text("\n".join(md) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    groups = sorted({(r["job"], r["ranks"]) for r in rows})
    finite = [r["mbit"] for r in rows if math.isfinite(r["mbit"])]
    top = 4 * max(finite) if finite else 1e5  # where an unshaped link's points are drawn

    def at(mbit: float) -> float:
        return mbit if math.isfinite(mbit) else top

    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), squeeze=False)
    for ax, (job, R) in zip(axes[0], groups):
        for lay, color in zip(("GP", "GNNPipe", "hybrid"), ("C0", "C1", "C2")):
            pts = sorted((at(r["mbit"]), r["epoch_s"], r.get("pred_epoch_s")) for r in rows
                         if r["job"] == job and r["ranks"] == R and r["layout"].startswith(lay))
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=f"{lay} measured")
            xs = sorted((at(r["mbit"]), r.get("pred_x_epoch_s") or r.get("pred_epoch_s")) for r in rows
                        if r["job"] == job and r["ranks"] == R and r["layout"].startswith(lay))
            if all(p[1] for p in xs):
                ax.plot([p[0] for p in xs], [p[1] for p in xs], "x--", color=color, label=f"{lay} predicted")
        ax.axvline(meta["paper_scaled_mbit"], color="grey", lw=0.8, ls=":")
        if any(not math.isfinite(r["mbit"]) for r in rows if r["job"] == job and r["ranks"] == R):
            ax.annotate("unshaped", (top, 0), xycoords=("data", "axes fraction"), fontsize=7, ha="center",
                        va="bottom")
        ax.set_xscale("log")
        ax.set_xlabel("link rate (Mbit/s)")
        ax.set_ylabel("epoch time (s)")
        ax.set_title(f"{job}, {R} ranks", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "network_regime.png", dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("bench_network_regime: interrupted; the namespaces are removed", file=sys.stderr)
        return 130
    except netns_links.NetnsError as e:
        print(f"bench_network_regime: error: {e}", file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["Physics", "Computers"],
                   help="datasets under ../shared/data, or synthetic:N (default: Physics Computers)")
    p.add_argument("--layers", type=int, nargs="+", default=[32, 64], help="GCNII depths (default: 32 64)")
    p.add_argument("--hidden", type=int, default=100, help="hidden width (default: 100)")
    p.add_argument("--layer-split", default="equal",
                   help="the pipeline layouts' layer-to-stage split, as gnnpipe train's (equal | profiled; "
                        "default: equal)")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="rank counts (default: 2 4)")
    p.add_argument("--mbit", type=float, nargs="+", default=None,
                   help="link rates, Mbit/s; inf: the veths unshaped, predicted at their measured rate (default: "
                        "the paper-scaled rate ×1/4, ×1, ×4)")
    p.add_argument("--speed", type=float, default=PAPER_SPEED,
                   help="speed of one of the paper's GPUs / one core here (default: 40, paper-a5000's)")
    p.add_argument("--layouts", default="gp,gnnpipe,hybrid", help="comma-separated: gp, gnnpipe, hybrid")
    p.add_argument("--epochs", type=int, default=5, help="epochs per run; the first is not timed (default: 5)")
    p.add_argument("--measure", choices=["all", "first", "none"], default="all",
                   help="links measured per mesh: every pair, the first pair only, none (default: all)")
    p.add_argument("--no-predict", dest="predict", action="store_false", help="skip gnnpipe plan")
    p.add_argument("--no-contention", dest="contention", action="store_false",
                   help="profile without the contention measurement (ranks computing at once on the cores; "
                        "shorter, and the prediction of 2 or more ranks per node is lower)")
    p.add_argument("--out-dir", default="network_regime", help="where the table and plot go")
    p.add_argument("--profile-dir", help="keep the profiles here (and reuse those found)")
    p.add_argument("--repredict", metavar="JSON",
                   help="no runs: predict the rows of an earlier network_regime.json again (new profiles unless "
                        "--profile-dir has them) and rewrite the outputs in --out-dir")
    p.add_argument("--smoke", action="store_true",
                   help="1-3 minutes: Computers, GCNII-8 h64, 2 ranks, GP and GNNPipe, the paper-scaled rate, "
                        "2 epochs")
    args = p.parse_args(argv)
    scaled = netns_links.scaled_rate(PAPER_INTER_BPS, args.speed)
    if args.repredict:
        doc = json.loads(Path(args.repredict).read_text())
        for row in doc["rows"]:  # rows written before they carried the job's parts
            if "dataset" not in row:
                ds, model, h = row["job"].split()
                row.update(dataset=ds, layers=int(model.split("-")[1]), hidden=int(h[1:]))
                w, st = (int(v) for v in row["layout"].split()[1].split("x"))
                row.update(ways=w, stages=st, chunks=None if st == 1 else 4 * w * st)
        predict_rows(doc["rows"], doc["links"], os.cpu_count() or 1, args.contention,
                     Path(args.profile_dir).resolve() if args.profile_dir else None)
        finish(doc["rows"], doc["links"], doc["meta"], Path(args.out_dir))
        return 0
    if args.smoke:
        args.datasets, args.layers, args.hidden, args.ranks = ["Computers"], [8], 64, [2]
        args.mbit, args.layouts, args.epochs, args.measure = [scaled * 8 / 1e6], "gp,gnnpipe", 2, "all"
    rates = [m * 1e6 / 8 for m in (args.mbit or [scaled * 8 / 1e6 / 4, scaled * 8 / 1e6, scaled * 8 / 1e6 * 4])]
    wanted = [m.strip() for m in args.layouts.split(",") if m.strip()]
    try:
        netns_links.check_environment()
        for R in args.ranks:
            layouts(R, wanted)
    except (netns_links.NetnsError, ValueError) as e:
        print(f"bench_network_regime: error: {e}", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    print(f"paper-scaled link rate: {PAPER_INTER_BPS:.4g} B/s (10 Gbit/s) / speed {args.speed:g} = {scaled:.4g} B/s "
          f"= {scaled * 8 / 1e6:g} Mbit/s; rates {', '.join(f'{r * 8 / 1e6:g}' for r in rates)} Mbit/s",
          file=sys.stderr)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": cores, "argv": sys.argv[1:],
            "speed": args.speed, "paper_scaled_Bps": scaled, "paper_scaled_mbit": scaled * 8 / 1e6,
            "load_before": os.getloadavg()}
    rows: list[dict] = []
    links: list[dict] = []
    out_dir = Path(args.out_dir)
    env_extra = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                 "TORCH_CPP_LOG_LEVEL": "ERROR"}
    with tempfile.TemporaryDirectory(prefix="netregime") as tmp:
        work = Path(tmp)
        for R in args.ranks:
            for rate in rates:
                mbit = rate * 8 / 1e6
                with netns_links.Mesh(R, rate) as mesh:
                    if args.measure != "none":
                        pairs = mesh.links() if args.measure == "all" else mesh.links()[:1]
                        got = mesh.measure(pairs)
                        links.append({"job": "-", "ranks": R, "mbit": mbit, "measured": got})
                        print(f"{R} ranks, {mbit:g} Mbit/s: links measured/set "
                              + ", ".join(f"{g['ratio']:.3f}" for g in got) + "; host CPU per byte "
                              + ", ".join(f"{g['cpu_s_per_byte'] * 1e9:.2f} ns" for g in got), file=sys.stderr)
                    for ds in args.datasets:
                        for L in args.layers:
                            job = job_args(ds, L, args.hidden, args.layer_split)
                            name = job_name(ds, L, args.hidden, args.layer_split)
                            for mode, (w, s, c) in layouts(R, wanted).items():
                                out = work / f"run_{mode}.json"
                                t0 = time.time()
                                argv_r = train_argv(job, w, s, c, args.epochs, str(out))
                                mesh.run(lambda r, a=argv_r: a, timeout_s=3600, env_extra=env_extra)
                                row = {"job": name, "dataset": ds, "layers": L, "hidden": args.hidden,
                                       "layer_split": args.layer_split, "ranks": R,
                                       "mbit": mbit, "rate_Bps": rate, "layout": f"{LABEL[mode]} {w}x{s}",
                                       "mode": mode, "ways": w, "stages": s, "chunks": c,
                                       **measured_row(json.loads(out.read_text())), "run_s": time.time() - t0}
                                rows.append(row)
                                keep = out_dir / "runs"  # the run's results JSON (per-epoch times, idle, CPU)
                                keep.mkdir(parents=True, exist_ok=True)
                                (keep / f"{ds.replace(':', '_')}_{L}_{R}_{mbit:g}_{mode}.json").write_text(
                                    out.read_text())
                                print(f"{name}, {R} ranks, {mbit:g} Mbit/s, {row['layout']}: "
                                      f"{row['epoch_s'] * 1e3:,.0f} ms/epoch, {row['bytes'] / 2 ** 20:,.1f} MiB, "
                                      f"idle {row['idle_fraction_max']:.2f}, peak {row['peak_MiB_max']:,.0f} MiB",
                                      file=sys.stderr)
                                write_outputs(rows, links, meta, out_dir)
                left = netns_links.residue(mesh.prefix)
                if left:
                    print(f"bench_network_regime: error: left behind {left}", file=sys.stderr)
                    return 1
    meta["load_after"] = os.getloadavg()
    if args.predict:
        predict_rows(rows, links, cores, args.contention,
                     Path(args.profile_dir).resolve() if args.profile_dir else None)
    finish(rows, links, meta, out_dir)
    return 0


def predict_rows(rows: list[dict], links: list[dict], cores: int, contention: bool,
                 profile_dir: Path | None) -> None:
    """Add to each row the plan's epoch time for a TOML of the set rate (``pred_epoch_s``: full duplex) and for one
    that also gives the measured exchange rate (``pred_x_epoch_s``; the mean of the mesh's measured links)."""
    with tempfile.TemporaryDirectory(prefix="netregime") as tmp:
        work = Path(tmp)
        pdir = profile_dir or work
        pdir.mkdir(parents=True, exist_ok=True)
        for (ds, L, H, sp, R, rate) in sorted({(r["dataset"], r["layers"], r["hidden"], r.get("layer_split", "equal"),
                                                r["ranks"], r["rate_Bps"]) for r in rows}):
            job = job_args(ds, L, H, sp)
            prof = pdir / f"profile_{ds.replace(':', '_')}_{L}_{H}_{R}.json"
            here = [m for lk in links if lk["ranks"] == R and _same_rate(lk["mbit"], rate * 8 / 1e6)
                    for m in lk["measured"]]
            ex = [m["exchange_ratio"] for m in here if "exchange_ratio" in m]
            lat = statistics.median(m["latency_s"] for m in here) if here else 0.0
            if not ex:  # links measured before the exchange was: measure one now
                with netns_links.Mesh(R, rate) as mesh:
                    got = mesh.measure(mesh.links()[:1])
                links.append({"job": "-", "ranks": R, "mbit": rate * 8 / 1e6, "measured": got})
                here, ex = got, [m["exchange_ratio"] for m in got]
                lat = statistics.median(m["latency_s"] for m in got)
            # the host's CPU per byte carried (links measured before it was: 0, the profile's loopback figure holds)
            cpub = statistics.median([m.get("cpu_s_per_byte", 0.0) for m in here] or [0.0])
            # an unshaped link (rate inf) is predicted at its measured one-way rate
            eff = statistics.median(m["measured_Bps"] for m in here) if math.isinf(rate) and here else rate
            E = max((len(r.get("epoch_s_all") or []) for r in rows), default=0) or None
            full = run_plan(job, R, eff, cores, work, prof, contention, latency_s=lat, epochs=E, cpu_s_per_byte=cpub)
            # the exchange rate each way, at most the link's (a shaped link can measure a little above its set rate)
            xrec = (run_plan(job, R, eff, cores, work, prof, contention, eff * min(1.0, sum(ex) / len(ex)), lat,
                             epochs=E, cpu_s_per_byte=cpub) if ex else [])
            for row in rows:
                if (row["dataset"], row["layers"], row["hidden"], row.get("layer_split", "equal"), row["ranks"],
                        row["rate_Bps"]) != (ds, L, H, sp, R, rate):
                    continue
                pr = pick_prediction(full, row["ways"], row["stages"], row["chunks"])
                if pr:
                    row.update(pred_epoch_s=pr["predicted_epoch_s"], pred_bytes=pr["predicted_bytes"],
                               pred_recompute=pr.get("recompute"),
                               pred_over_meas=pr["predicted_epoch_s"] / row["epoch_s"])
                px = pick_prediction(xrec, row["ways"], row["stages"], row["chunks"])
                if px:
                    row.update(pred_x_epoch_s=px["predicted_epoch_s"],
                               pred_x_over_meas=px["predicted_epoch_s"] / row["epoch_s"])
                print(f"{row['job']}, {R} ranks, {row['mbit']:g} Mbit/s, {row['layout']}: measured "
                      f"{row['epoch_s'] * 1e3:,.0f} ms, "
                      f"predicted {row.get('pred_epoch_s', 0) * 1e3:,.0f} (full duplex), "
                      f"{row.get('pred_x_epoch_s', 0) * 1e3:,.0f} (measured exchange)", file=sys.stderr)


def finish(rows: list[dict], links: list[dict], meta: dict, out_dir: Path) -> None:
    """Crossovers, then the table and plot."""
    meta["crossovers"] = []
    for job, R in sorted({(r["job"], r["ranks"]) for r in rows}):
        sel = [r for r in rows if r["job"] == job and r["ranks"] == R]
        meas = {m: [(r["rate_Bps"], r["epoch_s"]) for r in sel if r["mode"] == m] for m in ("gp", "gnnpipe")}
        pred = {m: [(r["rate_Bps"], r["pred_epoch_s"]) for r in sel if r["mode"] == m and r.get("pred_epoch_s")]
                for m in ("gp", "gnnpipe")}
        predx = {m: [(r["rate_Bps"], r["pred_x_epoch_s"]) for r in sel
                     if r["mode"] == m and r.get("pred_x_epoch_s")] for m in ("gp", "gnnpipe")}
        meta["crossovers"].append({"job": job, "ranks": R, "measured_Bps": crossover(meas),
                                   "predicted_Bps": crossover(pred), "predicted_x_Bps": crossover(predx)})
    write_outputs(rows, links, meta, out_dir)
    print((out_dir / "network_regime.md").read_text())
    print(f"wrote {out_dir}/network_regime.{{json,csv,md,png}}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
