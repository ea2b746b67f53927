"""Predict a layout's epoch time, bytes per epoch and per-rank memory, and rank every feasible layout.

The model, one idea per module beside this one:

* :mod:`.layouts` — the candidate layouts (:class:`~.layouts.LayoutSpec`), their predictions
  (:class:`~.layouts.LayoutPrediction`), their enumeration, configuration and plans;
* :mod:`.geometry` — the sizes of a plan the predictions read (rows, halo rows, in-edges, peer rows);
* :mod:`.epoch_bytes` — bytes per epoch by kind (exact for the plan);
* :mod:`.epoch_time` — epoch time: a discrete-event simulation of the actual schedule
  (:func:`gnnpipe.schedulers.simulate`) with the profile's costs, and :mod:`.host_costs`, what the host costs
  the ranks (messages, exchanges, ranks sharing a node's cores);
* :mod:`.plan_memory` — per-rank memory (:mod:`.memory`, :mod:`.footprint`);
* :mod:`.memory_check` — the recompute decision and the memory checks before a run.

This module predicts one layout (:func:`predict_layout`) and ranks every feasible layout of a number of ranks
(:func:`plan_layouts`), with the profile's spread (:func:`ranking_may_change`) and the ranking as text
(:func:`format_ranking`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from ....costmodel.hardware import Hardware, local_hardware
from ....errors import ConfigError
from ..trainer import make_model
from .epoch_bytes import predict_bytes
from .epoch_time import predict_time
from .layouts import SCHEDULERS, LayoutPrediction, LayoutSpec, build_layout_plan, enumerate_layouts, layout_config
from .memory_check import choose_recompute
from .plan_memory import predict_memory
from .profile import SPREAD_GROUPS, Profile, memory_profile


def predict_layout(config, data, spec: LayoutSpec, profile: Profile, hardware: Hardware, floor_bytes: int = 0,
                   plan=None, memory_profiles: dict | None = None) -> LayoutPrediction:
    """Build the layout's plan (the same chunking the run will use) and predict it; a pipeline's or hybrid's
    ``recompute="auto"`` (``None``) is decided first, as the run decides it (:func:`choose_recompute`: with
    recompute every backward repeats its forward). ``memory_profiles``: a cache of those memory profiles by graph,
    shared by the layouts of one ranking."""
    cfg = layout_config(config, spec)
    if plan is None:
        plan = build_layout_plan(config, data, spec)
    model = make_model(cfg, profile.num_features, profile.num_classes)
    if cfg.stages > 1 and cfg.recompute is None:
        # the run's own decision: its memory profile of the plan's graph (``gnnpipe.tasks.nodes``), not this
        # profile's activation sizes, which are measured on other rows and can tip the choice the other way

        cache = {} if memory_profiles is None else memory_profiles
        if id(plan.data) not in cache:
            cache[id(plan.data)] = (plan.data, memory_profile(cfg, plan.data))  # the graph kept alive with its id
        choice = choose_recompute(cfg, plan, model, cache[id(plan.data)][1])
        cfg = attrs.evolve(cfg, recompute=choice.on)
    nbytes = predict_bytes(cfg, plan, model)
    t, comp, k, work = predict_time(cfg, plan, model, profile, hardware, nbytes)
    mem = predict_memory(cfg, plan, model, profile)
    fits = hardware.fits([floor_bytes + m.resident_peak for m in mem])
    return LayoutPrediction(spec=spec, epoch_s=t, bytes=nbytes, memory=mem, floor_bytes=int(floor_bytes), fits=fits,
                            compute_s=comp, share=k, work_s=work, plan_info=dict(plan.info),
                            recompute=bool(cfg.recompute))



def plan_layouts(config, data, ranks: int, profile: Profile, hardware: Hardware | None = None, *,
                 chunks_per_stage: Sequence[int] = (4,), over_partitions: Sequence[int] = (1, 4),
                 schedulers: Sequence[str] = SCHEDULERS, floor_bytes: int | None = None,
                 progress: bool = False) -> list[LayoutPrediction]:
    """Predict every feasible layout of ``ranks`` ranks; sorted: layouts that fit first, then by predicted time.

    Raises:
        ConfigError: no feasible layout.
    """
    hardware = hardware or local_hardware()
    floor = profile_floor(profile) if floor_bytes is None else int(floor_bytes)
    specs = enumerate_layouts(ranks, len(profile.units), profile.num_nodes, chunks_per_stage=chunks_per_stage,
                              over_partitions=over_partitions, schedulers=schedulers)
    if not specs:
        raise ConfigError(f"no feasible layout of {ranks} rank(s) for a model of {len(profile.units)} units")
    preds = []
    plans: dict[tuple, Any] = {}
    memory_profiles: dict = {}
    for spec in specs:
        key = (spec.ways, spec.stages, spec.chunks, spec.over_partition)
        if progress:
            print(f"gnnpipe plan: predicting {spec.label()} C={spec.chunks} over={spec.over_partition} "
                  f"{spec.scheduler}", file=sys.stderr)
        if key not in plans:
            plans[key] = build_layout_plan(config, data, spec)
        preds.append(predict_layout(config, data, spec, profile, hardware, floor, plan=plans[key],
                                    memory_profiles=memory_profiles))
    preds.sort(key=lambda p: (not p.fits, p.epoch_s))
    _predict_spread(config, preds, profile, hardware, plans)
    return preds


#: the layouts :func:`plan_layouts` predicts again at the profile's spread: the best that fits and this many rivals,
#: the fastest after it that could overtake it
SPREAD_RIVALS = 3


def _predict_spread(config, preds: list[LayoutPrediction], profile: Profile, hardware: Hardware,
                    plans: dict) -> None:
    """Fill :attr:`LayoutPrediction.spread_s` of the best layout that fits and of up to :data:`SPREAD_RIVALS`
    layouts that fit and could overtake it within the profile's spread: predicted again from
    :meth:`Profile.raised` of each timed quantity with a spread (each is measured on its own, so each may be high
    on its own in a profile taken again). All of them together raise a prediction by at most the product of their
    ``1 + spread``: a layout slower than the best by more cannot overtake it and is not predicted again."""
    spreads = profile.spreads()
    quantities = [q for g in SPREAD_GROUPS for q in SPREAD_GROUPS[g] if spreads.get(q, 0.0) > 0]
    fitting = [p for p in preds if p.fits]
    if not quantities or not fitting:
        return
    limit = fitting[0].epoch_s * float(np.prod([1.0 + spreads[q] for q in quantities]))
    raised = {q: profile.raised(q) for q in quantities}
    for p in [fitting[0]] + [p for p in fitting[1:] if p.epoch_s <= limit][:SPREAD_RIVALS]:
        spec = p.spec
        cfg = layout_config(config, spec)
        if cfg.stages > 1 and cfg.recompute is None:
            cfg = attrs.evolve(cfg, recompute=p.recompute)  # as predict_layout decided it
        plan = plans[(spec.ways, spec.stages, spec.chunks, spec.over_partition)]
        model = make_model(cfg, profile.num_features, profile.num_classes)
        p.spread_s = {q: max(0.0, predict_time(cfg, plan, model, raised[q], hardware, p.bytes)[0] - p.epoch_s)
                      for q in quantities}


#: a layout is said to possibly overtake the best only if the profile's spread could put it ahead by more than
#: this share of the best's predicted time (layouts that differ less, e.g. by their over-partitioning alone, tie)
OVERTAKE_MARGIN = 0.01


def ranking_may_change(preds: list[LayoutPrediction]) -> list[tuple[LayoutPrediction, dict]]:
    """The layouts that fit and could overtake the best that fits within the profile's spread, each with
    ``{quantity: seconds}``, the timed quantities whose spread moves the best more than it: ``b`` could be faster
    than the best ``a`` when ``Σ_q max(0, Δa_q − Δb_q) > (b − a) + OVERTAKE_MARGIN · a``, with ``Δ_q`` a
    prediction's growth with the quantity ``q`` at its spread (:attr:`LayoutPrediction.spread_s`: each quantity
    may or may not be high in a profile taken again, and the worst case for ``a`` raises those that raise it more).
    Empty without spreads."""
    fitting = [p for p in preds if p.fits]
    if not fitting or not fitting[0].spread_s:
        return []
    best, out = fitting[0], []
    for p in fitting[1:]:
        if not p.spread_s:
            continue
        lead = {q: best.spread_s[q] - p.spread_s.get(q, 0.0) for q in best.spread_s}
        lead = {q: v for q, v in lead.items() if v > 0}
        if sum(lead.values()) > (p.epoch_s - best.epoch_s) + OVERTAKE_MARGIN * best.epoch_s:
            out.append((p, lead))
    return out


def _layout_name(p: LayoutPrediction) -> str:
    s = p.spec
    return (f"{s.label()} (C {s.chunks}, over {s.over_partition}" + (f", {s.scheduler}" if s.stages > 1 else "")
            + f", {1e3 * p.epoch_s:,.1f} ms)")


def format_spread(preds: list[LayoutPrediction], profile: Profile | None = None) -> list[str]:
    """The lines printed under the ranking: the profile's spread per group of timed quantities (with ``profile``),
    and a warning naming the layouts whose order with the best the spread could change (:func:`ranking_may_change`)
    and the quantities that move the best most against them."""
    lines = []
    if profile is not None and profile.spreads():
        parts = ", ".join(f"{g} {100 * profile.group_spread(g):.0f} %" for g in SPREAD_GROUPS)
        lines.append(f"profile spread (a typical repeat above the figure used): {parts}")
    risky = ranking_may_change(preds)
    if risky:
        best = next(p for p in preds if p.fits)
        moved: dict = {}
        for _, lead in risky:
            for q, v in lead.items():
                moved[q] = max(moved.get(q, 0.0), v)
        top = sorted(moved, key=lambda q: -moved[q])
        names = ", ".join(top[:3]) + (", …" if len(top) > 3 else "")
        lines.append(f"warning: the ranking may change within the profile's spread ({names}): "
                     + "; ".join(_layout_name(p) for p, _ in risky)
                     + f" could be faster than the best, {_layout_name(best)}. Treat them as a tie, or profile "
                       "again on a quieter machine (--profile-out keeps a good profile)")
    return lines


def profile_floor(profile: Profile) -> int:
    """The runtime floor of a rank the profile measured (0 when unknown)."""
    return int(profile.runtime_floor_bytes or 0)


def format_ranking(preds: list[LayoutPrediction], hardware: Hardware | None = None,
                   profile: Profile | None = None) -> str:
    """The ranking as a text table (time in ms, bytes and memory in MiB); ``*`` marks the best that fits. Under it
    :func:`format_spread`: the profile's spread (with ``profile``) and a warning when it could change which layout
    is best."""
    head = ["", "layout", "C", "over", "scheduler", "recompute", "ms/epoch", "layer MiB", "graph MiB", "weight MiB",
            "peak MiB/rank", "fits"]
    best = next((i for i, p in enumerate(preds) if p.fits), None)
    rows = []
    for i, p in enumerate(preds):
        s = p.spec
        rows.append(["*" if i == best else "", s.label(), str(s.chunks), str(s.over_partition),
                     s.scheduler if s.stages > 1 else "-", ("on" if p.recompute else "off") if s.stages > 1 else "-",
                     f"{1000 * p.epoch_s:,.1f}",
                     f"{p.bytes['layer'] / 2**20:,.2f}", f"{p.bytes['graph'] / 2**20:,.2f}",
                     f"{p.bytes['weight'] / 2**20:,.2f}", f"{max(p.peak_bytes_per_rank) / 2**20:,.0f}",
                     "yes" if p.fits else "NO"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = []
    if hardware is not None:
        lines.append(f"hardware: {hardware.name}")
    lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines += format_spread(preds, profile)
    return "\n".join(lines)
