"""A pipelined step's compute: the run's schedule simulated from the scheduler registry
(:func:`gnnpipe.schedulers.simulate`) with each pass's share of a micro-batch's work (:data:`PASS_SHARES`),
and the gpipe bubble in closed form (:func:`bubble`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ....schedulers import make_scheduler, simulate
from .layouts import AtomLayout

#: relative durations of a micro-batch's passes on a stage, from autograd's usual proportions (a backward costs
#: about two forwards): ``F``, ``B`` with direct forces; ``F``, ``G`` (the forces' gradient with ``create_graph``),
#: ``D`` (its backward into the weights) and ``B`` with conservative forces
PASS_SHARES = {False: {"F": 1.0, "B": 2.0}, True: {"F": 1.0, "G": 2.0, "D": 2.0, "B": 2.0}}



def pipeline_compute(layout: AtomLayout, conservative: bool, work: Sequence[Sequence[float]]
                     ) -> tuple[list[float], float]:
    """``(makespan per graph-parallel rank, idle share)`` of a step's compute on the stages of ``layout``.

    ``work[g][s]``: the seconds stage ``s``'s rank ``g`` computes on the replica's share. With one stage the step is
    that work. With ``S`` stages the run's schedule — ``layout.scheduler`` from the scheduler registry, its
    second-order form with conservative forces — is simulated (:func:`gnnpipe.schedulers.simulate`) with each of
    the ``C`` micro-batches taking ``work[g][s] / C`` on stage ``s``, split over the passes by :data:`PASS_SHARES`:
    the bubbles of the schedule and of unequal stages (for ``S`` equal stages of gpipe or 1f1b the makespan is the
    textbook ``(C + S − 1) / C`` of the work; Huang et al. 2019). The idle share is that of rank 0's stages.
    """

    S, C = layout.stages, layout.chunks
    if S == 1:
        return [float(sum(w)) for w in work], 0.0
    shares = PASS_SHARES[bool(conservative)]
    total = sum(shares.values())
    sched = make_scheduler(layout.scheduler, **({"second_order": True} if conservative else {})).build(
        S, list(range(C)))
    out, idle = [], 0.0
    for g, w in enumerate(work):
        def cost(a, w=w) -> float:
            kind = getattr(a.kind, "name", str(a.kind))
            return 0.0 if kind == "STEP" else w[a.stage] / C * shares[kind] / total

        res = simulate(sched, costs=cost)
        out.append(float(res.makespan))
        if g == 0:
            idle = float(sum(res.bubble_fraction) / S)
    return out, idle



def bubble(stages: int, chunks: int) -> float:
    """The idle share of a flushing (gpipe) pipeline: ``(S − 1)/(C + S − 1)`` (Huang et al. 2019)."""
    return (stages - 1) / (chunks + stages - 1)
