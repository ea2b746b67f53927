"""``gnnpipe partition``: partition a dataset's vertices and print the partition metrics.

For every method given, prints vertices and edges per part (min / max / imbalance), the directed and
undirected edge cut, the cross-chunk edge fraction, the mirror count M and the predicted
bytes per epoch of graph parallelism (L aggregations of width d over these parts) and of a GNNPipe
pipeline of S stages, side by side. ``--out FILE`` writes the same as JSON.

examples:
  gnnpipe partition --dataset Cora --root ../shared/data --parts 16 --partitioner metis,random
  gnnpipe partition --dataset Physics --root ../shared/data --parts 64 --partitioner metis --over-partition 4 \\
      --out p.json
  gnnpipe partition --num-nodes 169343 --avg-degree 16 --parts 64 --partitioner metis,rcm,random

--partitioner and --over-partition are spelled as in `gnnpipe train`; the older --method and --over
still work.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
import warnings
from typing import Any

import torch

from .. import data as gdata
from .. import partitioners
from .. import partitioners as P
from ..errors import ConfigError
from .main import HelpFormatter
from .train import check_writable


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def method_options(method: str, **candidates: Any) -> dict:
    """The subset of ``candidates`` (``None`` values dropped) that the constructor of ``method`` accepts."""
    cls = partitioners.get(method)
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in candidates.items() if v is not None and (takes_any or k in params)}


def run_partition(
    data: Any,
    parts: int,
    methods: list[str],
    *,
    seed: int = 0,
    over: int | None = None,
    vertex_weight: str | None = None,
    balance: str | None = None,
    layers: int = 32,
    hidden: int = 64,
    stages: int | None = None,
    shared: bool = False,
    **options: Any,
) -> dict:
    """Partition ``data`` with each method and collect metrics, timings and communication-volume predictions.

    ``over``, ``vertex_weight``, ``balance`` and any other ``**options`` are passed to the constructor of
    each method that accepts them (:func:`method_options`); the others ignore them.

    Returns:
        ``{"num_nodes", "num_edges", "parts", "seed", "layers", "hidden", "stages", "shared",
        "results": {method: {"time_s", "options", "metrics": PartitionMetrics.to_dict(),
        "predicted_gp_bytes", "predicted_pipeline_bytes", "assignment": LongTensor[N]}}}``
        (``assignment`` in original vertex ids).

    Raises:
        UnknownComponentError: an unknown method. ConfigError: bad sizes or options.
    """
    stages = parts if stages is None else stages
    n = int(data.num_nodes)
    out: dict = {
        "num_nodes": n,
        "num_edges": int(data.edge_index.size(1)),
        "parts": parts,
        "seed": seed,
        "layers": layers,
        "hidden": hidden,
        "stages": stages,
        "shared": shared,
        "results": {},
    }
    graph = P.as_graph(data)
    for method in methods:
        opts = method_options(method, over=over, vertex_weight=vertex_weight, balance=balance, **options)
        part = P.get(method)(**opts)
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", P.PartitionWarning)
            assignment = part.partition(graph, parts, seed=seed)
        dt = time.perf_counter() - t0
        m = P.partition_metrics(graph.edge_index, n, assignment, parts)
        out["results"][method] = {
            "time_s": dt,
            "options": {k: (v if isinstance(v, (int, float, str, bool)) else repr(v)) for k, v in opts.items()},
            "warnings": [str(w.message) for w in caught],
            "metrics": m.to_dict(),
            "predicted_gp_bytes": P.predict_gp_bytes(m.mirror_count, [hidden] * layers),
            "predicted_pipeline_bytes": P.predict_pipeline_bytes(n, stages, hidden, shared=shared),
            "assignment": assignment,
        }
    return out


def format_table(report: dict) -> str:
    """The metrics of :func:`run_partition` as an aligned text table, one column per method."""
    res = report["results"]
    methods = list(res)
    L, d, S = report["layers"], report["hidden"], report["stages"]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, fn) -> None:
        rows.append((label, [fn(res[m]) for m in methods]))

    row("time (s)", lambda r: f"{r['time_s']:.3f}")
    row("vertices/part min", lambda r: f"{min(r['metrics']['vertices_per_part']):,}")
    row("vertices/part max", lambda r: f"{max(r['metrics']['vertices_per_part']):,}")
    row("vertex imbalance", lambda r: f"{r['metrics']['vertex_imbalance']:.3f}")
    row("edges/part min", lambda r: f"{min(r['metrics']['edges_per_part']):,}")
    row("edges/part max", lambda r: f"{max(r['metrics']['edges_per_part']):,}")
    row("edge imbalance", lambda r: f"{r['metrics']['edge_imbalance']:.3f}")
    row("edge cut (directed)", lambda r: f"{r['metrics']['edge_cut']:,}")
    row("edge cut (undirected)", lambda r: f"{r['metrics']['undirected_edge_cut']:,}")
    row("cross-chunk edge fraction", lambda r: f"{r['metrics']['cross_chunk_edge_fraction']:.4f}")
    row("boundary vertices", lambda r: f"{r['metrics']['boundary_vertices']:,}")
    row("mirror count M", lambda r: f"{r['metrics']['mirror_count']:,}")
    row(f"GP bytes/epoch (L={L}, d={d})", lambda r: _human_bytes(r["predicted_gp_bytes"]))
    row(f"pipeline bytes/epoch (S={S}, d={d})", lambda r: _human_bytes(r["predicted_pipeline_bytes"]))
    row("pipeline / GP bytes", lambda r: (f"{r['predicted_pipeline_bytes'] / r['predicted_gp_bytes']:.3f}"
                                           if r["predicted_gp_bytes"] else "-"))
    width0 = max(len(label) for label, _ in rows)
    widths = [max(len(m), *(len(v[i]) for _, v in rows)) for i, m in enumerate(methods)]
    head = (f"{report.get('dataset', '?')}: N={report['num_nodes']:,}, E={report['num_edges']:,} (directed), "
            f"P={report['parts']}, seed={report['seed']}")
    lines = [head, "  ".join(["metric".ljust(width0)] + [m.rjust(w) for m, w in zip(methods, widths)])]
    lines.append("-" * len(lines[-1]))
    for label, vals in rows:
        lines.append("  ".join([label.ljust(width0)] + [v.rjust(w) for v, w in zip(vals, widths)]))
    for m in methods:
        for w in res[m]["warnings"]:
            lines.append(f"warning ({m}): {w}")
    return "\n".join(lines)


def load_graph(args: argparse.Namespace) -> Any:
    """Load and preprocess (undirected, no self-loops, no duplicates) the dataset of ``args``."""
    kwargs: dict = {}
    if args.dataset is None or str(args.dataset).lower() == "synthetic":
        kwargs = {"num_nodes": args.num_nodes, "avg_degree": args.avg_degree}
    data = gdata.load_dataset(args.dataset, args.root, seed=args.seed, **kwargs)
    if not args.no_preprocess:
        data = gdata.preprocess(data)
    return data


def _run(args: argparse.Namespace) -> int:
    methods = [m.strip() for m in args.partitioner.split(",") if m.strip()]
    if not methods:
        raise ConfigError("--partitioner needs at least one partitioner name")

    for m in methods:  # unknown names, bad options and missing optional packages fail before loading
        P.get(m)(**method_options(m, over=args.over_partition, vertex_weight=args.vertex_weight, balance=args.balance))

    for path in (args.out, args.save_parts):
        if path:
            check_writable(path)
    data = load_graph(args)
    report = run_partition(
        data, args.parts, methods, seed=args.seed, over=args.over_partition, vertex_weight=args.vertex_weight,
        balance=args.balance, layers=args.layers, hidden=args.hidden, stages=args.stages, shared=args.shared,
    )
    report["dataset"] = getattr(data, "name", None) or (args.dataset or "synthetic")
    print(format_table(report))
    if args.save_parts:
        torch.save({m: r["assignment"] for m, r in report["results"].items()}, args.save_parts)
    if args.out:
        js = dict(report)
        js["results"] = {m: {k: v for k, v in r.items() if k != "assignment"} for m, r in report["results"].items()}
        with open(args.out, "w") as f:
            json.dump(js, f, indent=2)
    return 0


def register(sub) -> None:
    p = sub.add_parser("partition", help="partition a graph's vertices and print partition metrics",
                       description=__doc__, formatter_class=HelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=None, help="dataset name (Cora, Physics, …) or a .pt/.npz file "
                   "(default: the synthetic graph)")
    g.add_argument("--root", default=None, help="folder holding the dataset (e.g. ../shared/data)")
    g.add_argument("--num-nodes", type=int, default=2000, help="synthetic graph: vertices")
    g.add_argument("--avg-degree", type=float, default=10.0, help="synthetic graph: mean degree")
    g.add_argument("--no-preprocess", action="store_true",
                   help="use edge_index as loaded (default: undirected, no self-loops, no duplicates)")
    q = p.add_argument_group("partitioning")
    q.add_argument("--parts", type=int, required=True, help="number of parts P")
    q.add_argument("--partitioner", default="metis",
                   help="comma-separated vertex partitioners (gnnpipe.partitioners.available(): "
                   "bfs, contiguous, kahip, metis, random, rcm)")
    q.add_argument("--method", dest="partitioner", default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # old name
    q.add_argument("--over-partition", type=int, default=None,
                   help="over-partitioning factor k: k·P parts grouped randomly k per part (GNNPipe chunks: 4; "
                   "default: the method's, 1)")
    q.add_argument("--over", dest="over_partition", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    q.add_argument("--seed", type=int, default=0, help="random seed")
    q.add_argument("--vertex-weight", default=None,
                   help="metis/kahip vertex weight: 'A+degree', 'degree' or 'uniform' (default: '50+degree')")
    q.add_argument("--balance", default=None, choices=["vertices", "edges"],
                   help="contiguous/rcm: balance vertex counts or in-edge counts (default: vertices)")
    r = p.add_argument_group("communication prediction")
    r.add_argument("--layers", type=int, default=32, help="GNN depth L (aggregations per forward pass)")
    r.add_argument("--hidden", type=int, default=64, help="embedding width d of each aggregation and stage boundary")
    r.add_argument("--stages", type=int, default=None, help="pipeline stages S (default: P, the same device count)")
    r.add_argument("--shared", action="store_true", help="the model ships a shared tensor (GCNII's h0)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help="also write the report as JSON to this file")
    o.add_argument("--save-parts", default=None,
                   help="torch.save {method: LongTensor[N] part ids in original vertex ids} to this file")
    p.set_defaults(func=_run)
