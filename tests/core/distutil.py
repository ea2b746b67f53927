"""Helpers for multi-process tests: run the real worker on a small synthetic graph, and the reference."""

from __future__ import annotations

import attrs

from gnnpipe.core.run import launch
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.data import prepare, synthetic_graph
from gnnpipe.tasks.nodes.runner import build_plan, worker
from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer, resolve_config


def small_graph(n=96, seed=0, features=8, classes=3):
    return prepare(synthetic_graph(num_nodes=n, avg_degree=6.0, num_classes=classes, num_features=features,
                                   train_per_class=10, val_per_class=5, seed=seed))


def base_config(**kw) -> TrainConfig:
    d = dict(model="gcn", layers=4, hidden=8, dropout=0.0, lr=0.01, weight_decay=0.0, weight_decay_conv=0.0,
             epochs=3, patience=0, timeout_s=60.0)
    d.update(kw)
    return resolve_config(TrainConfig(**d))


def run_distributed(config: TrainConfig, data, grads_after=(1, 3), no_eval=True):
    plan = build_plan(config, data)
    outs = launch.spawn(worker, config.world_size,
                        (config, plan, False, {"grads_after": tuple(grads_after), "no_eval": no_eval}),
                        backend=plan.info["backend"], timeout_s=config.timeout_s, threads=1, max_runtime_s=240)
    grads = {e: {} for e in grads_after}
    for o in outs:
        for e, g in o["grads"].items():
            grads[e].update(g)
    return plan, outs, grads


def _run_jobs(rank, world, jobs):
    """Several runs in one set of processes (spawning 4 processes costs seconds; the runs are sequential)."""
    return [worker(rank, world, cfg, plan, False, collect) for cfg, plan, collect in jobs]


def run_many(configs, data, grads_after=(1, 3), no_eval=False, max_runtime_s=240, jobs_fn=None):
    """``run_distributed`` for several configs of the same world size in one spawn; ``[(plan, outs, grads)]``.
    ``jobs_fn``: a module-level function of the calling test module that calls :func:`_run_jobs` (the ranks then
    import that module, e.g. for the models it registers)."""
    plans = [build_plan(cfg, data) for cfg in configs]
    collect = {"grads_after": tuple(grads_after), "no_eval": no_eval}
    outs = launch.spawn(jobs_fn or _run_jobs, configs[0].world_size,
                        ([(c, p, collect) for c, p in zip(configs, plans)],),
                        timeout_s=configs[0].timeout_s, threads=1, max_runtime_s=max_runtime_s)
    results = []
    for k, plan in enumerate(plans):
        per_rank = [o[k] for o in outs]
        grads = {e: {} for e in grads_after}
        for o in per_rank:
            for e, g in o["grads"].items():
                grads[e].update(g)
        results.append((plan, per_rank, grads))
    return results


def run_reference(config: TrainConfig, data, grads_after=(1, 3)):
    """Single-process exact training on the same (relabelled) graph; losses and grads after given epochs."""
    t = SingleProcessTrainer(data, attrs.evolve(config, ways=1, stages=1, chunks=1), prepared=True)
    losses, grads = [], {}
    for e in range(config.epochs):
        t.optimizer.zero_grad(set_to_none=False)
        losses.append(t.loss_and_backward())
        t.optimizer.step()
        if e + 1 in grads_after:
            grads[e + 1] = {n: p.grad.detach().clone() for n, p in t.model.named_parameters()}
    return t, losses, grads
