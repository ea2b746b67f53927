"""Atomistic data at scale: time to the first training step, resident memory and the step's wait for data, for
structure sets on disk read lazily by loader workers (:mod:`gnnpipe.data.atoms.sets`,
:class:`gnnpipe.tasks.s2ef.data.StructureLoader`), against the in-memory path that reads and validates every
structure before the first step.

The sets are cheap on purpose: ``--base`` oc20-like structures are generated and labelled by EMT once, then
``--variants`` copies of them have their positions rattled (Gaussian, ``--rattle`` Å) and keep their labels (not
physical: the measurement is of reading, validating and graph building, not of chemistry); structure ``k`` of a set
is variant ``k mod variants``, each record pickled once and its bytes stored again under every index that holds it
(every read still unpickles and validates a whole record). They are written as fairchem LMDB files (``.lmdb``, the
format OC20 S2EF ships in) under ``--dir``.

Each measurement runs in a fresh process (``--child``), DimeNet++ at its S2EF defaults (2 blocks, hidden 64,
4 Å, 12 neighbours, batch 16), float32, ``--steps`` training steps:

* time to the first step: from the start of loading (the set opened, split, the energy reference fitted on its
  bounded sample) to the end of the first optimizer step, less the model's construction (the same on every path);
* resident memory (VmRSS, split into the process's own RssAnon and the RssFile pages of the mapped LMDB file)
  before the steps (the set opened, the reference fitted, the model built) and after
  them, for ``--small`` and ``--large`` structures (the steps' batches, hence their activations, differ);
* data wait: per step, the time the training loop waited for the loader's next batch (1 worker), against the
  step's compute (forward, backward, optimizer), steps after the first;
* the in-memory path (``load_structures`` of an extended-XYZ file of ``--old`` structures: every structure read
  and validated before training), with its per-structure rate extrapolated to ``--large``.

* the whole ``gnnpipe train --max-steps 3`` command on both sets (wall time of a fresh process).

Usage::

    python benchmarks/bench_atomistic_data.py                # 10,000 and 200,000 structures, old path on 5,000
    python benchmarks/bench_atomistic_data.py --large 50000  # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rss_mib(kind: str = "VmRSS") -> float:
    """MiB resident: ``VmRSS`` (all), ``RssAnon`` (the process's own memory) or ``RssFile`` (pages of mapped files:
    the LMDB file's pages the reads touched, shared with the page cache and dropped by the kernel under pressure)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(kind + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_set(path: Path, n: int, base: int, variants: int, rattle: float) -> float:
    """``n`` structures in ``path`` (fairchem LMDB, or extended XYZ): ``variants`` rattled copies of ``base`` generated
    structures, cycled (an LMDB record is pickled once per variant and its bytes stored ``n / variants`` times)."""
    import pickle

    import numpy as np
    import torch

    from gnnpipe.data.atoms import generated_structures
    from gnnpipe.data.atoms.sets import fairchem_record, write_structures

    if path.exists():
        return 0.0
    t0 = time.perf_counter()
    src = generated_structures("oc20", base, 0, dtype=torch.float64)
    rng = np.random.default_rng(0)
    copies = []
    for k in range(min(n, variants)):
        d = src[k % base].clone()
        d.pos = d.pos + torch.from_numpy(rng.normal(0.0, rattle, tuple(d.pos.shape)))
        copies.append(d)
    if path.suffix == ".extxyz":
        write_structures(path, (copies[k % len(copies)] for k in range(n)))
        return time.perf_counter() - t0
    import lmdb

    blobs = [pickle.dumps(fairchem_record(d, k), protocol=4) for k, d in enumerate(copies)]
    tmp = path.with_name(f".{path.name}.tmp")
    env = lmdb.open(str(tmp), subdir=False, map_size=1 << 40, meminit=False, map_async=True)
    for lo in range(0, n, 50_000):
        with env.begin(write=True) as txn:
            for k in range(lo, min(n, lo + 50_000)):
                txn.put(f"{k}".encode("ascii"), blobs[k % len(blobs)])
    with env.begin(write=True) as txn:
        txn.put(b"length", pickle.dumps(n, protocol=4))
    env.sync()
    env.close()
    os.replace(tmp, path)
    Path(f"{tmp}-lock").unlink(missing_ok=True)
    return time.perf_counter() - t0


def child(args) -> dict:
    """One measurement in this process (see the module docstring)."""
    import torch

    t0 = time.perf_counter()
    from gnnpipe.core.settings.config import TrainConfig
    from gnnpipe.tasks.s2ef import S2EF
    from gnnpipe.tasks.s2ef.data import epoch_batches, load_structures
    from gnnpipe.tasks.s2ef.loss import s2ef_loss
    from gnnpipe.tasks.s2ef.trainer import S2EFTrainer

    torch.set_num_threads(args.threads)
    rss0 = rss_mib()
    t_import = time.perf_counter() - t0
    start = time.perf_counter()
    task = S2EF()
    config = task.resolve(TrainConfig(model="dimenet++", dataset=args.child, num_workers=args.workers,
                                      threads=args.threads, epochs=1))
    if args.child.endswith(".extxyz"):  # the in-memory path: every structure read and validated first
        from gnnpipe.tasks.s2ef.data import split
        from gnnpipe.tasks.s2ef.normalizer import EnergyNormalizer

        structures = load_structures(config)
        splits = split(config, len(structures))
        norm = EnergyNormalizer.fit([structures[i] for i in splits["train"].tolist()])
    else:
        data = task.load(config)
        structures, splits, norm = data.structures, data.splits, data.normalizer
    t_loaded = time.perf_counter() - start
    tb = time.perf_counter()
    tr = S2EFTrainer(config, structures, splits, norm)
    t_model = time.perf_counter() - tb  # the model's construction: the same on every data path, left out below
    rss_loaded = {k: rss_mib(k) for k in ("VmRSS", "RssAnon", "RssFile")}  # before any step
    train = splits["train"]
    batches = epoch_batches(len(train), config.batch_size, config.seed, 0)[:args.steps]
    it = tr.loader.iterate([train[gb] for gb in batches])
    waits, computes, first = [], [], None
    tr.model.train()
    for k in range(len(batches)):
        t = time.perf_counter()
        step = next(it)
        w = time.perf_counter() - t
        if k == 0:
            first_batch = time.perf_counter() - start - t_model
        t = time.perf_counter()
        tr.optimizer.zero_grad(set_to_none=True)
        e_hat, f_hat, batch = tr.forward_step(step)
        e_t, f_t, _ = tr._targets(batch)
        loss = s2ef_loss(e_hat, e_t, f_hat, f_t, ~batch.fixed, num_structures=len(step.structures),
                         num_free=step.num_free, energy_coef=config.energy_coef, force_coef=config.force_coef,
                         loss_fn=config.loss_fn)
        loss.backward()
        tr.optimizer.step()
        c = time.perf_counter() - t
        if first is None:
            first = time.perf_counter() - start - t_model
        waits.append(w)
        computes.append(c)
    return {"path": args.child, "structures": len(structures), "workers": tr.loader.num_workers,
            "import_s": t_import, "load_s": t_loaded, "model_s": t_model, "first_step_s": first,
            "first_batch_s": first_batch, "rss0_mib": rss0, "rss_loaded": rss_loaded,
            "rss_loaded_mib": rss_loaded["VmRSS"],
            "rss_anon_mib": rss_mib("RssAnon"), "rss_file_mib": rss_mib("RssFile"),
            "rss_mib": rss_mib(), "wait_s": waits[1:], "compute_s": computes[1:], "batch_size": config.batch_size}


def run_child(path: Path, args, workers: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, __file__, "--child", str(path), "--workers", str(workers), "--steps", str(args.steps),
           "--threads", str(args.threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode:
        sys.exit(f"child failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def cli_wall(path: Path, args) -> float:
    """Seconds of a whole ``gnnpipe train --max-steps`` command on ``path`` (a fresh process: imports, opening the
    set, the reference's sample, the model, the steps, the results written)."""
    import tempfile

    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "gnnpipe", "train", "--dataset", str(path), "--model", "dimenet++",
               "--max-steps", str(args.cli_steps), "--threads", str(args.threads), "--num-workers", str(args.workers),
               "--no-progress", "--out", str(Path(tmp) / "r.json")]
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600, cwd=tmp)
        wall = time.perf_counter() - t
    if p.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=10_000, help="structures of the smaller set (default %(default)s)")
    ap.add_argument("--large", type=int, default=200_000, help="structures of the larger set (default %(default)s)")
    ap.add_argument("--old", type=int, default=5_000,
                    help="structures of the extended-XYZ set read by the in-memory path (default %(default)s)")
    ap.add_argument("--base", type=int, default=40,
                    help="EMT-labelled structures the sets rattle (default %(default)s)")
    ap.add_argument("--variants", type=int, default=400,
                    help="distinct rattled structures the sets cycle through (default %(default)s)")
    ap.add_argument("--rattle", type=float, default=0.02, help="Å, the positions' rattle (default %(default)s)")
    ap.add_argument("--steps", type=int, default=8, help="training steps measured (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the training process (default %(default)s)")
    ap.add_argument("--workers", type=int, default=1, help="loader workers (default %(default)s)")
    ap.add_argument("--cli-steps", type=int, default=3,
                    help="the whole `gnnpipe train --max-steps N` command timed on both sets "
                         "(0: skip; default %(default)s)")
    ap.add_argument("--dir", default=None, help="where the sets are written (default: $GNNPIPE_CACHE/bench-data)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    from gnnpipe.data.datasets import default_cache_dir

    d = Path(args.dir) if args.dir else default_cache_dir() / "bench-data"
    d.mkdir(parents=True, exist_ok=True)
    sets = {n: d / f"rattled-{n}-b{args.base}-v{args.variants}.lmdb" for n in (args.small, args.large)}
    for n, p in sets.items():
        w = write_set(p, n, args.base, args.variants, args.rattle)
        if w:
            print(f"wrote {n:,} structures to {p} in {w:.1f} s ({p.stat().st_size / 2**20:.0f} MiB)")
    old = d / f"rattled-{args.old}-b{args.base}-v{args.variants}.extxyz"
    w = write_set(old, args.old, args.base, args.variants, args.rattle)
    if w:
        print(f"wrote {args.old:,} structures to {old} in {w:.1f} s")
    out = {}
    for n, p in sets.items():
        out[n] = r = run_child(p, args, args.workers)
        wait = sum(r["wait_s"]) / max(len(r["wait_s"]), 1)
        comp = sum(r["compute_s"]) / max(len(r["compute_s"]), 1)
        print(f"lazy {n:>9,}: first step {r['first_step_s']:.2f} s after loading began (loading {r['load_s']:.2f} s, "
              f"first batch {r['first_batch_s']:.2f} s; "
              f"imports {r['import_s']:.1f} s before), RSS {r['rss_loaded_mib']:.0f} MiB before the steps, "
              f"{r['rss_mib']:.0f} MiB after, data wait {wait * 1e3:.1f} ms "
              f"of a {comp:.2f} s step ({100 * wait / comp:.1f} %, {r['workers']} worker)")
    a, b = out[args.small], out[args.large]
    g = {k: b["rss_loaded"][k] - a["rss_loaded"][k] for k in a["rss_loaded"]}
    print(f"RSS growth {args.small:,} -> {args.large:,} structures before the steps: {g['VmRSS']:+.0f} MiB "
          f"(own memory RssAnon {g['RssAnon']:+.0f}, mapped file pages RssFile {g['RssFile']:+.0f}); after the steps "
          f"{b['rss_mib'] - a['rss_mib']:+.0f} MiB (RssAnon {b['rss_anon_mib'] - a['rss_anon_mib']:+.0f}, RssFile "
          f"{b['rss_file_mib'] - a['rss_file_mib']:+.0f}; the steps' batches differ between the sets)")
    if args.cli_steps:
        walls = {n: cli_wall(p, args) for n, p in sets.items()}
        print(f"gnnpipe train --max-steps {args.cli_steps}, whole command: {walls[args.small]:.1f} s on "
              f"{args.small:,}, {walls[args.large]:.1f} s on {args.large:,} "
              f"({walls[args.large] / walls[args.small]:.2f}x)")
    r = run_child(old, args, 0)
    rate = r["load_s"] / r["structures"]
    print(f"in-memory {args.old:>6,}: first step {r['first_step_s']:.2f} s "
          f"(reading and validating {r['load_s']:.2f} s, "
          f"{rate * 1e3:.2f} ms per structure: {rate * args.large / 60:.1f} min for {args.large:,}), RSS "
          f"{r['rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
