"""What the models declare, as the cost model reads it: per unit the values autograd keeps per edge, triplet and
atom (:func:`activation_widths`; a pipeline stage's, :func:`stage_widths`, with the parameter-free geometry),
the multiply-adds per edge, triplet and atom (:func:`work_weights`), the parameters per unit and the widths that
cross a stage boundary. A model that does not describe itself raises
:class:`~gnnpipe.errors.ModelDescriptionError`; no model is costed as another.
"""

from __future__ import annotations

from typing import Any

from ....models.atomistic.cost import UnitWidths


def activation_widths(model: Any) -> list[UnitWidths]:
    """Per unit, the values its forward keeps for the backward, per owned edge, triplet and atom (the readout's
    atoms added to the last unit), as the model counts them
    (:meth:`~gnnpipe.models.atomistic.AtomisticModel.activation_widths`; κ of the module docstring scales them). A
    pipeline stage's widths: :func:`stage_widths`.

    Raises:
        ModelDescriptionError: a model that does not describe them.
    """
    return model.activation_widths()



def conservative_forces(model: Any) -> bool:
    return not bool(getattr(model, "direct_forces", False))



def geometry_widths(model: Any, conservative: bool | None = None) -> UnitWidths:
    """The kept values of the parameter-free geometry a stage running an interaction block holds, in the force mode
    ``conservative`` (default: the model's), as the model counts them
    (:meth:`~gnnpipe.models.atomistic.AtomisticModel.geometry_widths`)."""
    return model.geometry_widths(conservative_forces(model) if conservative is None else bool(conservative))



def stage_widths(model: Any, lo: int, hi: int, conservative: bool | None = None) -> tuple[UnitWidths, UnitWidths]:
    """``(kept, boundary)`` of a stage running units ``[lo, hi)`` (the single process: ``0, len(model.units)``).

    ``kept``: the values autograd keeps (scaled by ``κ`` in :func:`rank_memory`): the units' widths
    (:func:`activation_widths`) with the geometry counted once, in its force mode (:func:`geometry_widths`), where
    the stage runs an interaction block (a later stage recomputes it); a stage holding the embedding alone keeps
    only what the model says it keeps of the geometry there
    (:meth:`~gnnpipe.models.atomistic.AtomisticModel.embedding_stage_widths`). ``boundary``: the
    stage's received boundary tensor (kept whole: its views are the block's inputs) and its sent one (kept until
    its gradient arrives), each :func:`boundary_widths` per micro-batch; with conservative forces a stage that
    sends forward also keeps the received ``G`` seed (the boundary's gradient and 3 position-gradient values per
    atom) until ``B``; zero for a single stage.
    """
    units = activation_widths(model)
    n = len(units)
    cons = conservative_forces(model) if conservative is None else bool(conservative)
    kept = UnitWidths()
    for u in range(lo, hi):
        w = units[u]
        if u == 0:  # unit 0's widths hold the conservative geometry: the embedding proper is the rest
            w = w - geometry_widths(model, True)
        kept = kept + w
    if hi > max(lo, 1):
        kept = kept + geometry_widths(model, cons)
    elif lo == 0:  # the embedding alone: what it keeps of the geometry (a radial basis derived from the edges)
        kept = kept + model.embedding_stage_widths(cons)
    bw = boundary_widths(model)
    sides = (lo > 0) + (hi < n)
    seed = (hi < n) and cons
    return kept, UnitWidths((sides + seed) * bw.edge, 0, (sides + seed) * bw.atom + 3 * seed)



def work_weights(model: Any) -> list[UnitWidths]:
    """Per unit, the forward's multiply-adds per owned edge, triplet and atom: the linear maps' (``in·out``, as the
    model counts them, :meth:`~gnnpipe.models.atomistic.AtomisticModel.work_widths`) and one per kept value
    (element-wise work, :func:`activation_widths`). A training step with conservative forces costs a
    model-independent multiple of it (the profile measures the seconds per unit of work)."""
    return [m + a for m, a in zip(model.work_widths(), activation_widths(model))]



def num_parameters(model: Any) -> int:
    """Trained parameters of ``model``."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))



def unit_parameters(model: Any) -> list[int]:
    """Trained parameters per unit (the readout's head added to the last unit)."""
    per = [sum(p.numel() for p in u.parameters() if p.requires_grad) for u in model.units]
    per[-1] += sum(p.numel() for p in model.head.parameters() if p.requires_grad)
    return [int(v) for v in per]



def boundary_widths(model: Any) -> UnitWidths:
    """Values per owned edge and atom crossing a stage boundary (forward; its gradient goes back), as the model counts
    them (:meth:`~gnnpipe.models.atomistic.AtomisticModel.boundary_widths`); the geometry and the parameter-free
    bases are recomputed by each stage."""
    return model.boundary_widths()
