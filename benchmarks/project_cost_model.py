"""Cost model projections for machines we do not have (issue #14 items 5 and 6): predictions only.

    python benchmarks/project_cost_model.py sixteen --out proj16.json   # issue #14's 16-core table
    python benchmarks/project_cost_model.py paper --out paper.json      # the paper's 8x RTX A5000 cluster

``sixteen``: profiles Amazon Computers GCNII-32 (hidden 100) and a synthetic graph of 169,343 vertices (average
degree 16, GCNII-16, hidden 64) here, predicts the layouts of issue #14's table for ``cpu-16core`` (16 cores,
1 thread per rank, the loopback link measured here) and prints them next to the measured numbers quoted in the
issue. Two predictions per layout: with the shipped speed factor 1.0, and with the speed factor that makes the
single-process prediction equal the issue's measured single-process time (one-point calibration of the core).

``paper``: profiles GCNII-32 (hidden 64) on graphs the size of the paper's smaller datasets here (Coauthor-Physics
itself; synthetic stand-ins with the N, E, F and classes of Flickr and ogbn-arxiv), predicts GP 8x1, GNNPipe 1x8
(32 chunks, gpipe) and hybrid 2x4 on ``paper-a5000`` and prints GP / GNNPipe epoch-time ratios (the paper:
GNNPipe 0.52-0.79x of GP's speed on Physics, up to 2.45x faster on large graphs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"

#: issue #14's measurements on a 16-core machine (ms per epoch, mean of 5 epochs)
ISSUE16 = {
    "Computers GCNII-32 h100": {
        "flags": ["--dataset", "Computers", "--root", str(DATA / "amazon"), "--model", "gcnii", "--layers", "32",
                  "--hidden", "100"],
        "runs": [("single", (1, 1, 1, 1), 1524), ("pipeline S=2", (1, 2, 8, 4), 1272),
                 ("pipeline S=4", (1, 4, 16, 4), 706), ("pipeline S=8", (1, 8, 32, 4), 613),
                 ("pipeline S=8 over 1", (1, 8, 32, 1), 511), ("GP 8", (8, 1, 8, 1), 437),
                 ("hybrid 2x4", (2, 4, 32, 4), 672)],
    },
    "synthetic 169k d16 GCNII-16 h64": {
        "flags": ["--num-nodes", "169343", "--avg-degree", "16", "--model", "gcnii", "--layers", "16",
                  "--hidden", "64"],
        "runs": [("single", (1, 1, 1, 1), 7908), ("pipeline S=8", (1, 8, 32, 4), 1996), ("GP 8", (8, 1, 8, 1), 1951)],
    },
}

#: graphs of the paper's dataset sizes (N, undirected E as directed pairs, F, classes); Physics is the real one
PAPER = {
    "Physics": ["--dataset", "Physics", "--root", str(DATA / "coauthor")],
    "Flickr-size": ["--num-nodes", "89250", "--avg-degree", "10.1", "--num-features", "500", "--num-classes", "7"],
    "arXiv-size": ["--num-nodes", "169343", "--avg-degree", "13.8", "--num-features", "128", "--num-classes", "40"],
}


def _config(flags):
    from gnnpipe.cli.train import add_train_arguments, config_from_args
    from gnnpipe.tasks.nodes.trainer import resolve_config

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    known, rest = p.parse_known_args(flags)
    cfg = resolve_config(config_from_args(known))
    extra = {}
    for k in range(0, len(rest), 2):  # --num-features / --num-classes before the CLI has them
        extra[rest[k].lstrip("-").replace("-", "_")] = type(getattr(cfg, rest[k].lstrip("-").replace("-", "_")))(
            float(rest[k + 1]))
    import attrs

    return attrs.evolve(cfg, **extra)


def sixteen(out):
    from gnnpipe import api
    from gnnpipe.costmodel import load_hardware
    from gnnpipe.tasks.nodes.cost import profile
    from gnnpipe.tasks.nodes.cost.layouts import LayoutSpec
    from gnnpipe.tasks.nodes.cost.predict import predict_layout

    hw = load_hardware("cpu-16core")
    rows = []
    link = None
    for job, spec in ISSUE16.items():
        cfg = _config(spec["flags"])
        data = api.load_data(cfg)
        t0 = time.perf_counter()
        prof = profile(cfg, data, link_result=link)
        link = prof.link_result()
        print(f"{job}: profiled in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        preds = {}
        for name, (w, s, c, over), measured in spec["runs"]:
            p = predict_layout(cfg, data, LayoutSpec(w, s, c, over, "gpipe"), prof, hw, prof.runtime_floor_bytes)
            preds[name] = (p, measured)
        single_pred = preds["single"][0].epoch_s
        speed = single_pred / (preds["single"][1] / 1000)
        hw_cal = load_hardware("cpu-16core")
        import attrs

        hw_cal = attrs.evolve(hw_cal, speed=speed)
        for name, (w, s, c, over), measured in spec["runs"]:
            p = preds[name][0]
            pc = predict_layout(cfg, data, LayoutSpec(w, s, c, over, "gpipe"), prof, hw_cal, prof.runtime_floor_bytes)
            rows.append({"job": job, "layout": name, "measured_ms": measured, "predicted_ms": 1000 * p.epoch_s,
                         "predicted_calibrated_ms": 1000 * pc.epoch_s, "speed_calibrated": speed,
                         "predicted_compute_s": p.compute_s})
    print("| job | layout | measured ms (issue) | predicted ms (speed 1.0) | pred/meas | predicted ms (calibrated) "
          "| pred/meas |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['job']} | {r['layout']} | {r['measured_ms']:,} | {r['predicted_ms']:,.0f} | "
              f"{r['predicted_ms'] / r['measured_ms']:.2f} | {r['predicted_calibrated_ms']:,.0f} | "
              f"{r['predicted_calibrated_ms'] / r['measured_ms']:.2f} |")
    if out:
        Path(out).write_text(json.dumps(rows, indent=1))


def paper(out):
    from gnnpipe import api
    from gnnpipe.costmodel import load_hardware
    from gnnpipe.tasks.nodes.cost import profile
    from gnnpipe.tasks.nodes.cost.layouts import LayoutSpec
    from gnnpipe.tasks.nodes.cost.predict import predict_layout

    hw = load_hardware("paper-a5000")
    rows = []
    link = None
    for name, flags in PAPER.items():
        cfg = _config(flags + ["--model", "gcnii", "--layers", "32", "--hidden", "64"])
        data = api.load_data(cfg)
        prof = profile(cfg, data, link_result=link)
        link = prof.link_result()
        res = {}
        for label, spec in (("GP 8x1", LayoutSpec(8, 1, 8, 1, "gpipe")),
                            ("GNNPipe 1x8", LayoutSpec(1, 8, 32, 4, "gpipe")),
                            ("hybrid 2x4", LayoutSpec(2, 4, 32, 4, "gpipe"))):
            p = predict_layout(cfg, data, spec, prof, hw, 0)
            res[label] = p
            print(f"{name} {label}: {1000 * p.epoch_s:.1f} ms, {p.total_bytes / 2**20:.1f} MiB", file=sys.stderr)
        rows.append({"graph": name, "N": int(data.num_nodes), "E": int(data.edge_index.size(1)),
                     **{f"{k} ms": 1000 * v.epoch_s for k, v in res.items()},
                     **{f"{k} MiB": v.total_bytes / 2**20 for k, v in res.items()},
                     "GP / GNNPipe time": res["GP 8x1"].epoch_s / res["GNNPipe 1x8"].epoch_s})
    print("| graph | N | E | GP 8x1 ms | GNNPipe 1x8 ms | hybrid 2x4 ms | GP MiB | GNNPipe MiB "
          "| GNNPipe speed-up over GP |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['graph']} | {r['N']:,} | {r['E']:,} | {r['GP 8x1 ms']:,.1f} | {r['GNNPipe 1x8 ms']:,.1f} | "
              f"{r['hybrid 2x4 ms']:,.1f} | {r['GP 8x1 MiB']:,.0f} | {r['GNNPipe 1x8 MiB']:,.0f} | "
              f"{r['GP / GNNPipe time']:.2f}x |")
    if out:
        Path(out).write_text(json.dumps(rows, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["sixteen", "paper"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    (sixteen if args.what == "sixteen" else paper)(args.out)


if __name__ == "__main__":
    main()
