"""Measured bytes per epoch of a study's runs against the DESIGN §6 formulas.

    python benchmarks/bytes_vs_formula.py experiments/comm_vs_depth.results.jsonl

Layer-level: ``2·4·(S−1)·N·d`` per way-pipeline, summed (×2 for GCNII, which ships h0); graph-level:
``2·4·M·Σd`` with M the mirror count of the way partition (from the run's plan) and Σd the widths of all
aggregation ops (L·hidden for the zoo's models). Prints a markdown table and the GP / GNNPipe ratio of
total bytes per depth.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("| L | variant | M | layer bytes measured | layer predicted | graph bytes measured | graph predicted "
          "| weight bytes |")
    print("|--:|---|--:|--:|--:|--:|--:|--:|")
    totals = defaultdict(dict)
    for r in rows:
        if r.get("status") != "ok":
            continue
        res = r["result"]
        cfg, plan, e = res["config"], res["plan"], res["epochs"][-1]
        L, W, S, d, N = cfg["layers"], cfg["ways"], cfg["stages"], cfg["hidden"], plan["num_nodes"]
        shared = 2 if cfg["model"] == "gcnii" else 1
        M = plan.get("mirror_count", 0)
        layer = 2 * 4 * (S - 1) * N * d * shared
        graph = 2 * 4 * M * L * d
        mode = "GP" if S == 1 else ("GNNPipe" if W == 1 else "hybrid")
        totals[L][mode] = e["bytes_layer"] + e["bytes_graph"] + e["bytes_weight"]
        print(f"| {L} | {mode} ({W}x{S}) | {M:,} | {e['bytes_layer']:,} | {layer:,} | {e['bytes_graph']:,} | {graph:,} "
              f"| {e['bytes_weight']:,} |")
    print()
    for L in sorted(totals):
        t = totals[L]
        if "GP" in t and "GNNPipe" in t:
            print(f"L={L}: GP / GNNPipe total bytes = {t['GP'] / t['GNNPipe']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
