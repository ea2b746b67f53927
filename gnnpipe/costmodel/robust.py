"""The statistic a profile keeps of repeated timings, and their spread.

A shared machine's noise is one-sided: a burst of other work (a co-tenant, another process's cache traffic, a
rank descheduled during a ping-pong) makes a timed pass, epoch, round trip or exchange slower, never faster. The
profile therefore keeps a **low quantile** of its repeats, not their mean or median: :func:`low` is the 25th
percentile (:data:`LOW_Q`), which ignores noise on up to three repeats in four (the median only one in two, the
mean none). Not the minimum: the minimum of many repeats keeps the luckiest one, and it falls as repeats are
added; the minimum of every unit, chunk and phase taken separately even sums to less than any real pass costs
(predictions 0.6-0.9 of the measured epochs, docs/RESULTS.md §14f). Per-element figures (a unit's seconds on
each chunk) are therefore reduced pass by pass (:func:`clean_passes`): the slower passes are dropped whole and
each element is the median of the rest, so that the elements still add up to a real pass.

The **spread** of a figure is :func:`spread`: its repeats' 75th percentile (:data:`HIGH_Q`) over the statistic
kept, less 1 — how much slower a single repeat typically is than the figure used. A profile records it per
quantity (``Profile.spread``, ``Profile.link_spread``); the ranking uses it to tell which layouts' order the
noise could change (``gnnpipe.tasks.nodes.cost.predict.plan_layouts``). Figures with two-sided noise (a ratio of two
timings) keep their median and record the spread of their repeats above it; floors of single operations (the
link's latency, the host's exchange after compute: ``gnnpipe.costmodel.link``) their minimum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: the quantile of repeats a profile keeps (:func:`low`)
LOW_Q = 0.25

#: the quantile of repeats a spread compares with the kept figure (:func:`spread`)
HIGH_Q = 0.75

#: a spread is recorded up to this (a derived figure, e.g. the runtime's cost per action as the difference of an
#: epoch and its units, can otherwise have an unbounded relative spread when it is close to 0)
MAX_SPREAD = 1.0


def low(values: Sequence[float]) -> float:
    """The :data:`LOW_Q` quantile of ``values`` (linear interpolation; one value: itself); 0.0 for none."""
    v = [float(x) for x in values]
    return float(np.quantile(v, LOW_Q)) if v else 0.0


def high(values: Sequence[float]) -> float:
    """The :data:`HIGH_Q` quantile of ``values`` (linear interpolation); 0.0 for none."""
    v = [float(x) for x in values]
    return float(np.quantile(v, HIGH_Q)) if v else 0.0


def spread(values: Sequence[float], kept: float | None = None, scale: float | None = None) -> float:
    """``(high(values) − kept) / scale``, in ``[0, MAX_SPREAD]``: how much a typical slow repeat exceeds the figure
    kept (default :func:`low` of ``values``), relative to ``scale`` (default ``kept``: a relative spread; give the
    derived figure when ``values`` are the timings it was derived from). 0 without values or with a scale of 0."""
    v = [float(x) for x in values]
    if not v:
        return 0.0
    k = low(v) if kept is None else float(kept)
    s = k if scale is None else float(scale)
    if not (s > 0) or not math.isfinite(s):
        return 0.0
    return float(min(MAX_SPREAD, max(0.0, (high(v) - k) / s)))


def pooled_spread(groups: Sequence[Sequence[float]]) -> float:
    """The spread of several figures together: ``Σ high / Σ low − 1`` over the groups of repeats (the figure that
    costs most weighs most), in ``[0, MAX_SPREAD]``."""
    lo = sum(low(g) for g in groups if len(g))
    hi = sum(high(g) for g in groups if len(g))
    return float(min(MAX_SPREAD, max(0.0, hi / lo - 1.0))) if lo > 0 else 0.0


def clean_passes(passes: Sequence[tuple[list, list]]) -> tuple[list, list, list[float]]:
    """Reduce timed passes of per-element seconds to one: ``passes`` is a list of ``(forward, backward)``, each
    ``[unit][chunk]`` seconds of one pass. The passes are ranked by their total; the slower half is dropped (a pass
    a burst of load hit is slower in total), and every element is the median of the remaining passes (the faster
    ``ceil(n / 2)``). Returns ``(forward, backward, totals)`` with ``totals`` every pass's total seconds, in order.
    """
    totals = [float(sum(map(sum, f)) + sum(map(sum, b))) for f, b in passes]
    if not passes:
        return [], [], []
    keep = sorted(range(len(passes)), key=lambda k: totals[k])[: max(1, (len(passes) + 1) // 2)]

    def reduce(which: int) -> list:
        first = passes[0][which]
        return [[float(np.median([passes[k][which][i][c] for k in keep])) for c in range(len(first[i]))]
                for i in range(len(first))]

    return reduce(0), reduce(1), totals
