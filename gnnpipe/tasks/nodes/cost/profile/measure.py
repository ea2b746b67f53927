""":func:`profile`: every measurement of a profile in turn (unit chunk costs on several chunkings, the runtime's own
costs, contention, activations, the optimizer step, the link) and the fits that turn them into a :class:`Profile`.

Every timed quantity is repeated and reduced to a low quantile of its repeats (:mod:`.robust`: noise on a shared
machine only adds time), the repeats of the chunkings and of the executor interleaved, and the spread of each
quantity's repeats is recorded (``Profile.spread``, ``Profile.link_spread``).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch

from .....costmodel.link import link_fields, profile_link
from .....costmodel.robust import MAX_SPREAD, pooled_spread, spread
from .....errors import ConfigError
from .....partitioners import ChunkPlan
from ...runner import num_classes_of
from ...trainer import make_model
from .contention import measure_contention
from .memory import saved_bytes
from .overhead import (
    _action_overhead,
    _executor_scale,
    _executor_stage,
    _gp_overhead,
    _hybrid_overhead,
    _pipeline_overhead,
    _pipeline_rank,
)
from .record import LINK_FIELDS, SPREAD_GROUPS, Profile, UnitKind, chunk_features
from .units import (
    _epoch_run,
    _graph_ops,
    _interleaved,
    _model_fields,
    _passes_of,
    _phases,
    _representatives,
    _subgraph,
    _time_step,
    _unit_pass,
    _units_cpu,
)

#: what a node-classification training rank imports: the link probe's ranks import them before the floor is read
TRAINING_RANK_MODULES = ("gnnpipe.tasks.nodes.parallel", "gnnpipe.tasks.nodes.pipeline", "gnnpipe.tasks.nodes.runner")

#: rounds of :func:`_unfused_ratios` (one fused and one plain pass each). With one pass of each (3 repeats, taken
#: minutes apart) the ratio of one GCNII layer came out 0.78, 1.04 and 1.31 in three profiles of one machine, and
#: graph parallelism's predicted compute moved with it (0.75-0.81 of the measured epoch where the link is fast)
UNFUSED_ROUNDS = 9


#: repeats of the runtime's own costs (per action, graph parallelism's and a hybrid's per op) over the profile's
#: ``repeats``: each is the difference of an executor's epoch and its units on a subgraph of a few thousand
#: vertices, a few percent of either, so the noise of either moves it most (a 2-layer GCNII on the synthetic graph's
#: 2000 vertices: 0.24-0.30 ms per action over 5 repeats, which moved the pipelines' predictions by 13 %); the
#: epochs are short
RUNTIME_REPEATS = 3


def _unfused_ratios(model, data, ptr: list[int], units: dict, rounds: int, spreads: dict | None = None) -> dict:
    """``{unit kind: plain / fused}``: per fusable unit, the median over ``rounds`` rounds of its plain path's thread
    CPU time over its fused chunk step's on the chunks ``ptr`` of ``data``, each round one pass of each back to back
    (so that a slower stretch of the machine slows both alike; :attr:`UnitKind.unfused`). A ratio's noise is
    two-sided (a burst during either pass), so the median is kept, not a low quantile. ``spreads``: receives per
    unit kind the spread of the rounds' ratios above it (:func:`.robust.spread`)."""
    got: dict = {k: [] for k in units}
    for _ in range(max(1, int(rounds))):
        f = _units_cpu(model, data, ptr, 1, fused=True)
        p = _units_cpu(model, data, ptr, 1, fused=False)
        for key, i in units.items():
            f_s = sum(f.forward[i]) + sum(f.backward[i])
            if f_s > 0:
                got[key].append((sum(p.forward[i]) + sum(p.backward[i])) / f_s)
    out = {k: float(statistics.median(v)) if v else 1.0 for k, v in got.items()}
    if spreads is not None:
        spreads.update({k: spread(v, out[k]) for k, v in got.items() if v})
    return out


def format_spread(prof: Profile) -> str:
    """``"spread of repeats: units 2.1 %, runtime 14 %, …"``: per group of :data:`SPREAD_GROUPS` its largest
    recorded spread (how much slower a typical repeat was than the figure kept, :mod:`.robust`); ``"spread of
    repeats: not recorded"`` for a profile without any."""
    if not prof.spreads():
        return "spread of repeats: not recorded"
    return "spread of repeats: " + ", ".join(f"{g} {_pct(prof.group_spread(g))}" for g in SPREAD_GROUPS)


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %" if v < 0.1 else f"{100 * v:.0f} %"


def profile(config, data, *, repeats: int = 5, chunk_counts: Sequence[int] = (16, 4, 2), link: bool = True,
            link_result: Any = None, ranks: int | None = None, sample_nodes: int = 4096,
            distributed: bool | None = None, contention: bool = True, verbose: bool = False) -> Profile:
    """Profile ``config``'s model on ``data`` (a prepared PyG ``Data``) on this machine.

    Args:
        config: a resolved :class:`~gnnpipe.core.settings.config.TrainConfig` (model, layers, hidden, dtype, threads).
        data: the prepared graph (``gnnpipe.api.load_data``).
        repeats: timed repeats per measurement (passes, epochs, contention pairs; a low quantile is kept and the
            spread recorded, :mod:`.robust`).
        chunk_counts: chunkings to time (the first is a METIS chunk plan; the others merge its chunks and must
            divide it).
        link: measure the link (and the runtime floor of a rank) with a ping-pong of 2 ranks (a few seconds);
            with ``ranks`` above this machine's cores, that many ranks also measure what a wait costs when they
            share the cores (``profile_link``). ``link_result``: a dict of ``LINK_FIELDS``
            (``link_fields``, or another profile's :meth:`Profile.link_result`), or the older tuple
            ``(p2p, allreduce[, floor_bytes])``, gives them instead.
        sample_nodes: vertices of the subgraph the runtime's per-action and graph-parallel bookkeeping are
            measured on.
        distributed: measure the pipeline's cost per chunk action in a real 2-rank pipeline on that subgraph
            (``_pipeline_overhead``, a few seconds to start the ranks); default: when the link is measured or
            given. Otherwise it is measured in this process (``_action_overhead``), without communication.
        contention: time the first chunking again while the machine's other cores run the same passes
            (``measure_contention``; the units' ``contended_*`` ratios), which the prediction applies to ranks
            that compute at the same time on one CPU node; with ``ranks`` above the cores, also with ``ranks``
            processes at once (``oversubscribed_*``).

    Returns:
        a :class:`Profile`.

    Raises:
        ConfigError: a chunk count that does not divide the first, or more chunks than vertices.
    """
    from scipy.optimize import nnls

    t_start = time.perf_counter()
    F, Cls = int(data.x.size(1)), num_classes_of(data)
    N = int(data.num_nodes)
    base = int(chunk_counts[0])
    if any(base % int(c) for c in chunk_counts):
        raise ConfigError(f"chunk counts {list(chunk_counts)} must divide the first ({base})")
    base = min(base, max(1, N // 8))
    threads_before = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        full, model, rep = _representatives(config, F, Cls)
        dtype = next(model.parameters()).dtype
        # the whole graph in one process, in the order the single process trains it (data as given), first: the
        # chunked passes below leave this process's allocator in a state in which training is slower than in the
        # fresh process a single-process run is (Cora, GCNII-16: 60-67 ms per epoch before, 75-90 ms after)
        wall_total, cpu_total = 0.0, 0.0
        whole_data = data.clone() if hasattr(data, "clone") else data
        whole_data.x = data.x.to(dtype)
        w0, c0 = time.perf_counter(), time.thread_time()
        # a small graph's pass is cheap: more repeats, since a process's first passes are slower than its later ones
        small = N * (F + config.hidden * len(full.units)) < 5e7
        with _passes_of(model):
            whole_passes, = _interleaved([_unit_pass(model, whole_data)], repeats + (2 if small else 0))
        whole, whole_totals = _phases(whole_passes)
        wall_total += time.perf_counter() - w0
        cpu_total += time.thread_time() - c0
        del whole_data
        plan = ChunkPlan.build(data, base, config.partitioner, over=config.over_partition, seed=config.seed)
        rdata = plan.data
        rdata.x = rdata.x.to(dtype)
        ptr = [int(v) for v in plan.chunk_ptr.tolist()]
        cptrs = []
        for C in sorted({min(int(c), base) for c in chunk_counts}, reverse=True):
            if C < 1:
                continue
            step = base // C if base % C == 0 else 1
            cptrs.append(ptr[::step] if ptr[::step][-1] == N else ptr[::step] + [N])
        # the chunkings' passes and the full model's executor (one stage over the base chunking) in turn, round after
        # round: a burst of load hits one repeat of each, not every repeat of one
        executor = _executor_stage(config, full if full is not model else copy.deepcopy(full), rdata, ptr)
        ops = _graph_ops(rdata)
        w0, c0 = time.perf_counter(), time.thread_time()
        with _passes_of(model):
            *level_passes, executor_epochs = _interleaved(
                [_unit_pass(model, rdata, cptr, graph_ops=ops) for cptr in cptrs] + [_epoch_run(executor)], repeats)
        wall_total += time.perf_counter() - w0
        cpu_total += time.thread_time() - c0
        del executor, ops
        levels: list[tuple[np.ndarray, Any, int]] = []  # (features [C, 4], UnitPhases, C)
        level_totals = []
        for cptr, passes in zip(cptrs, level_passes):
            ph, totals = _phases(passes)
            levels.append((chunk_features(rdata.edge_index, cptr), ph, len(cptr) - 1))
            level_totals.append(totals)
        spreads = {"units": pooled_spread([whole_totals, *level_totals])}
        # how much of the wall time this thread ran (a busy machine: < 1); reported, not applied
        ratio = min(1.0, cpu_total / wall_total) if wall_total > 0 else 1.0
        whole_feats = np.array([[1.0, N, 0.0, float(data.edge_index.size(1))]])
        X = np.concatenate([f for f, _, _ in levels] + [whole_feats])
        kinds: dict[str, Any] = {}
        errs = []
        saved_per_unit = saved_bytes(model, rdata, ptr[0], ptr[1])
        rows0 = ptr[1] - ptr[0]
        for key, i in rep.items():
            fits, scales = [], []
            for attr in ("forward", "backward"):
                per_level = [getattr(ph, attr)[i] for _, ph, _ in levels]
                whole_t = getattr(whole, attr)[i][0]
                y = np.array([t for ts in per_level for t in ts] + [whole_t])
                # weight rows so that big and small chunks count alike (relative error)
                wts = 1.0 / np.maximum(y, 1e-6)
                coef, _ = nnls(X * wts[:, None], y * wts)
                pred = X @ coef
                errs.extend(((pred - y) / np.maximum(y, 1e-9)).tolist())
                # the size factor of each chunking: measured / fitted, at its mean chunk rows
                pts = []
                for (feats, _, C), ts in zip(levels, per_level):
                    fit = float((feats @ coef).sum())
                    if fit > 0:
                        pts.append([N / C, float(sum(ts)) / fit])
                fit_w = float(whole_feats[0] @ coef)
                if fit_w > 0:
                    pts.append([float(N), whole_t / fit_w])
                fits.append([float(c) for c in coef])
                scales.append(pts)
            u = model.units[i]
            kinds[key] = UnitKind(key=key, forward=fits[0], backward=fits[1],
                                  whole_forward_s=float(whole.forward[i][0]),
                                  whole_backward_s=float(whole.backward[i][0]),
                                  saved_bytes_per_row=saved_per_unit[i] / max(rows0, 1),
                                  params=int(sum(p.numel() for p in u.parameters())),
                                  scale_forward=scales[0], scale_backward=scales[1])
        contention_ranks = over_ranks = 0
        if contention:  # the base chunking, alone and with every other core running the same passes
            cont_spreads: list = []
            ratios, contention_ranks = measure_contention(model, rdata, ptr, repeats, threads=config.threads,
                                                          timeout_s=config.timeout_s, spreads=cont_spreads)
            over = None
            if contention_ranks and ranks is not None and int(ranks) > contention_ranks:
                # more ranks than cores: the same with as many processes as ranks, time-sliced
                over, over_ranks = measure_contention(model, rdata, ptr, repeats, processes=int(ranks),
                                                      threads=config.threads, timeout_s=config.timeout_s,
                                                      spreads=cont_spreads)
            spreads["contention"] = max(cont_spreads + [0.0])
            for key, i in rep.items():
                # clipped at 1 (sharing cannot speed a unit up: a lower ratio is noise), and time-slicing at the
                # ratio of the cores alone
                if ratios is not None:
                    kinds[key].contended_forward = max(1.0, ratios[i][0])
                    kinds[key].contended_backward = max(1.0, ratios[i][1])
                if over is not None:
                    kinds[key].oversubscribed_forward = max(kinds[key].contended_forward, over[i][0])
                    kinds[key].oversubscribed_backward = max(kinds[key].contended_backward, over[i][1])
        steps: list = []
        step = _time_step(full, config, repeats, out=steps)
        spreads["step"] = spread(steps)
        # the runtime's own costs, measured on a subgraph of the relabelled graph (its first chunks)
        n_sub = min(N, int(sample_nodes))
        sub = _subgraph(rdata, n_sub)
        C_sub = max(1, min(8, n_sub // 8))
        sptr = [round(k * n_sub / C_sub) for k in range(C_sub + 1)]
        sub_repeats = RUNTIME_REPEATS * int(repeats)
        overhead, fused_ph, spreads["action"] = _action_overhead(config, model, sub, sptr, sub_repeats, step)
        # the pipeline executor against the fit: the full model on the base chunking of the whole graph
        base_feats = levels[0][0]
        keys = _model_fields(full, data, F, Cls)["units"]
        fitted = sum(kinds[keys[u]].time(f, ph) for u in range(len(keys)) for f in base_feats for ph in "FB")
        full_params = sum(p.numel() for p in full.parameters() if p.requires_grad)
        executor_scale, spreads["executor"] = _executor_scale(executor_epochs, fitted, overhead, step, full_params,
                                                              len(ptr) - 1)
        # the plain path of units that fuse their chunk step (a hybrid's peer op, graph parallelism runs it), against
        # the fused step, on the subgraph's chunks
        fusable = {key: i for key, i in rep.items() if getattr(model.units[i], "fusable", False)}
        spreads["unfused"] = 0.0
        if fusable:
            unfused_spreads: dict = {}
            for key, r in _unfused_ratios(model, sub, sptr, fusable, UNFUSED_ROUNDS, unfused_spreads).items():
                kinds[key].unfused = r
            spreads["unfused"] = max(list(unfused_spreads.values()) + [0.0])

        # as _representatives
        small_cfg = attrs.evolve(config, layers=min(config.layers, 2)) if model is not full else config
        back = {u for u, _, _ in model.backward_aggregation_dims()}
        agg_dims = [[int(getattr(u, "agg_dim", u.in_dim))] * len(u.aggregations) for u in model.units]
        if distributed is None:
            distributed = bool(link or link_result is not None)
        distributed = distributed and model.num_units >= 2
        pipe_args = (config, small_cfg, F, Cls, sub, list(sptr), sub_repeats) if distributed else None
        gp_a, gp_b, _, spreads["gp"] = _gp_overhead(config, lambda: make_model(small_cfg, F, Cls), (n_sub, n_sub // 4),
                                                    rdata, sub_repeats, step, agg_dims, back)
        hyb, hyb_b, _, spreads["hybrid"] = _hybrid_overhead(config, lambda: make_model(small_cfg, F, Cls), rdata,
                                                            (n_sub, n_sub // 4), sub_repeats, step, overhead, agg_dims,
                                                            back)
    finally:
        torch.set_num_threads(threads_before)
    fields: dict = {}
    if isinstance(link_result, dict):
        fields = {k: link_result[k] for k in LINK_FIELDS if k in link_result}
    elif link_result is not None:
        fields = {"p2p": link_result[0], "allreduce": link_result[1],
                  "runtime_floor_bytes": int(link_result[2]) if len(link_result) > 2 else 0}
    dist_outs = None
    if link_result is None and link:
        # one start of ranks: the link probe's ranks 0 and 1 also run the 2-stage pipeline
        p2p, ar, raw = profile_link(timeout_s=config.timeout_s, ranks=int(ranks or 2),
                                    pipeline=None if pipe_args is None else (_pipeline_rank, pipe_args),
                                    preload=TRAINING_RANK_MODULES)
        fields = link_fields(p2p, ar, raw)
        dist_outs = raw.get("pipeline")
    dist_points = None
    if pipe_args is not None:
        # the runtime's cost per action as a 2-rank pipeline runs it (with communication), on the same chunks
        overhead, dist_points, spreads["action"] = _pipeline_overhead(*pipe_args[:6], fused_ph, pipe_args[6], step,
                                                                      outs=dist_outs)
    if dist_points is not None and fields.get("msg_cpu_s") is not None:
        # a rank of the probe sent or received one boundary tensor (or its gradient) per action: modelled apart
        rows = float(np.mean(dist_points[0]["rows"]))
        nbytes = rows * dist_points[0]["width"] * torch.finfo(next(full.parameters()).dtype).bits // 8
        extra = spreads["action"] * overhead  # the spread in seconds, relative again to what is left
        overhead = max(0.0, overhead - (fields.get("msg_cpu_s", 0.0) + nbytes * fields.get("msg_cpu_s_per_byte", 0.0)))
        spreads["action"] = float(min(MAX_SPREAD, extra / overhead)) if overhead > 0 else 0.0
    dtype_bytes = torch.finfo(next(full.parameters()).dtype).bits // 8
    prof = Profile(
        unit_kinds=kinds, **_model_fields(full, data, F, Cls), step_s_per_param=step, dtype_bytes=dtype_bytes,
        threads=config.threads, cpu_over_wall=ratio,
        fit_error=float(math.sqrt(np.mean(np.square(errs)))) if errs else 0.0,
        action_overhead_s=overhead, executor_scale=executor_scale, gp_op_s=gp_a, gp_op_s_per_elem=gp_b, hybrid_op_s=hyb,
        hybrid_op_s_per_elem=hyb_b,
        contention_ranks=contention_ranks, oversubscribed_ranks=over_ranks,
        spread={k: float(v) for k, v in spreads.items()}, **fields,
    )
    prof.profile_s = time.perf_counter() - t_start
    if verbose:
        curve = (", ".join(f"{1e3 * c:.2f} ms after {1e3 * w:g} ms of compute" for w, c in prof.switch_curve)
                 or f"{1e3 * prof.switch_s:.2f} ms")
        sw = (f", a wait with ranks sharing cores {curve} (+{1e3 * prof.switch_peer_s:.2f} "
              f"ms per further peer, +{1e3 * prof.switch_byte_s * 2 ** 20:.2f} ms per MiB sent)"
              if prof.switch_ranks else "")
        if prof.host_exchange is not None:
            sw += (f", an exchange after compute {1e3 * prof.host_exchange.latency_s:.2f} ms + "
                   f"{1e3 * 2 ** 20 / prof.host_exchange.bandwidth_Bps:.2f} ms per MiB")
        ct = (", with " + str(prof.contention_ranks) + " cores computing at once the units take " + ", ".join(
              f"{k.contended_forward:.2f}/{k.contended_backward:.2f}x" for k in kinds.values()) + " (F/B)"
              if prof.contention_ranks else "")
        if prof.oversubscribed_ranks:
            ct += (f", with {prof.oversubscribed_ranks} processes on them " + ", ".join(
                f"{k.oversubscribed_forward:.2f}/{k.oversubscribed_backward:.2f}x" for k in kinds.values()))
        print(f"profile: {len(kinds)} unit kind(s), fit RMS error {prof.fit_error:.1%}, runtime overhead "
              f"{1e3 * overhead:.2f} ms per chunk action, executor / fitted units {executor_scale:.2f}, "
              f"graph-parallel bookkeeping {1e6 * gp_a:.0f} us per op + "
              f"{1e9 * gp_b:.2f} ns per element, hybrid {1e6 * hyb:.0f} us per op + {1e9 * hyb_b:.2f} ns per "
              f"element{sw}{ct}, thread CPU / wall {ratio:.2f}, {format_spread(prof)}, {prof.profile_s:.1f} s")
    return prof
