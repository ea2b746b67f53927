"""Fabricated results records for report tests (shaped like ``gnnpipe train --out`` JSON)."""

from __future__ import annotations

import math
import random


def fake_result(seed: int, *, epochs: int = 20, acc: float = 0.6, ms: float = 10.0, layer_bytes: int = 0,
                graph_bytes: int = 0, weight_bytes: int = 0, ranks: int = 0) -> dict:
    rng = random.Random(seed * 7919 + int(acc * 1000))
    recs = []
    best, best_ep, test_at = -1.0, -1, math.nan
    for e in range(epochs):
        val = acc * (1 - math.exp(-(e + 1) / 5)) + rng.uniform(-0.02, 0.02)
        test = val - 0.01
        rec = {"epoch": e, "loss": 1.0 / (e + 1), "time_s": ms / 1000 * rng.uniform(0.9, 1.1),
               "train_acc": val + 0.1, "val_acc": val, "test_acc": test, "val_loss": 1.0}
        if ranks:
            rec.update(bytes_layer=layer_bytes, bytes_graph=graph_bytes, bytes_weight=weight_bytes,
                       compute_s=[0.001] * ranks, comm_s=[0.001] * ranks, idle_s=[0.001] * ranks)
        recs.append(rec)
        if val > best:
            best, best_ep, test_at = val, e, test
    out = {"config": {"seed": seed}, "epochs": recs, "best_val_acc": best, "test_acc_at_best_val": test_at,
           "best_epoch": best_ep, "mean_epoch_time_s": sum(r["time_s"] for r in recs) / epochs}
    if ranks:
        out["peak_mem_bytes"] = [400 * 2**20 + 2**20 * i for i in range(ranks)]
        out["idle_fraction"] = [0.25] * ranks
        out["plan"] = {"ways": 1, "stages": ranks}
    return out


def fake_record(run_id: str, variant: str, seed: int, overrides: dict, fixed: dict, *, failed: bool = False,
                study: str = "fake", **kw) -> dict:
    settings = {**fixed, **overrides, "seed": seed}
    return {"run_id": run_id, "study": study, "variant": variant, "seed": seed, "overrides": overrides,
            "settings": settings, "argv": [], "status": "failed" if failed else "ok",
            "error": "gnnpipe train failed (exit status 2): boom\n--- output tail ---\nboom" if failed else None,
            "result": None if failed else fake_result(seed, **kw), "wall_s": 1.0}


def ablation_records(seeds=(0, 1, 2)) -> list[dict]:
    """A technique-ablation-like set: 6 variants, distributed (bytes, memory), one failed run."""
    fixed = {"model": "gcnii", "layers": 32, "stages": 4, "chunks": 16, "correctors": "t1,t2,t3"}
    variants = [
        ("T1+T2+T3", {}, dict(acc=0.40, ms=120.0, layer_bytes=6_000_000, ranks=4)),
        ("no T1", {"correctors": "t2,t3"}, dict(acc=0.37, ms=118.0, layer_bytes=6_000_000, ranks=4)),
        ("no T2", {"correctors": "t1,t3"}, dict(acc=0.36, ms=117.0, layer_bytes=6_000_000, ranks=4)),
        ("no T3", {"correctors": "t1,t2"}, dict(acc=0.35, ms=119.0, layer_bytes=6_000_000, ranks=4)),
        ("none", {"correctors": "none"}, dict(acc=0.33, ms=115.0, layer_bytes=6_000_000, ranks=4)),
        ("GP (exact)", {"ways": 4, "stages": 1, "chunks": 4, "correctors": "none"},
         dict(acc=0.41, ms=160.0, graph_bytes=40_000_000, weight_bytes=3_000_000, ranks=4)),
    ]
    out = []
    for seed in seeds:
        for name, ov, kw in variants:
            failed = name == "no T2" and seed == seeds[-1]
            out.append(fake_record(f"{name}-{seed}", name, seed, ov, fixed, failed=failed, study="ablation",
                                   epochs=60, **kw))
    return out


def fake_s2ef_result(seed: int, *, epochs: int = 6, force_mae: float = 0.3, params: int = 10_000, ranks: int = 1,
                     train: int = 16, batch: int = 4, ms: float = 400.0, gp_bytes: int = 0) -> dict:
    """A ``gnnpipe train --out`` JSON of an S2EF run: validation force MAE falling to about ``force_mae``."""
    rng = random.Random(seed * 104729 + params)
    recs, best, best_ep = [], math.inf, -1
    for e in range(epochs):
        f = force_mae * (1 + math.exp(-e)) + rng.uniform(-0.005, 0.005)
        rec = {"epoch": e, "loss": 1.0 / (e + 1), "time_s": ms / 1000, "val_force_mae": f, "val_energy_mae": 0.1,
               "val_force_cos": 0.5, "val_efwt": 0.0, "test_force_mae": f + 0.01, "test_energy_mae": 0.2,
               "test_force_cos": 0.4, "test_efwt": 0.0}
        if gp_bytes:
            rec["bytes_gp"] = gp_bytes
        recs.append(rec)
        if f < best:
            best, best_ep = f, e
    bm = {k: recs[best_ep][k] for k in recs[best_ep] if k.startswith(("val_", "test_"))}
    return {"config": {"seed": seed}, "epochs": recs, "best_epoch": best_ep, "mean_epoch_time_s": ms / 1000,
            "best_metrics": bm, "status": "completed", "num_params": params,
            "plan": {"task": "s2ef", "global_batch": batch, "structures": {"train": train, "val": 2, "test": 2}},
            "peak_mem_bytes": [300 * 2**20 + 10 * 2**20 * i for i in range(ranks)]}
