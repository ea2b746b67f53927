"""Bytes of one training step's graph-parallel collectives, per rank (kind ``"gp"``, exact).

**Bytes per interaction block** (kind ``"gp"``, exact). Each unit of a model calls the graph-parallel hooks
(:mod:`gnnpipe.models.atomistic.comm`) a fixed number of times on rows of known widths (:func:`hook_calls`). A
hook's forward sends :func:`~gnnpipe.tasks.s2ef.graph_parallel.plan_hook_bytes` ``(forward)`` and its backward
``(backward)``. In a step with conservative forces (``F = −∂E/∂pos`` with ``create_graph``, then the loss's
backward) a call whose input depends on the positions runs four times: its forward, its backward inside
``∂E/∂pos``, and in the loss's backward both the backward of the forward node and the backward of that backward
node (a forward-type collective): ``2·(fwd + bwd)``. A call whose input depends only on the parameters (the
embedding of ``z``, SchNet's first gather) is not on a path to ``pos``: ``fwd + bwd``. The energies' ``sum``
(``B`` values) and the forces' ``replicated_grad`` (``3N`` values) are all-reduces whose backward is the identity:
``fwd`` once. Direct forces: every call whose input needs a gradient ``fwd + bwd``, the positions' own gathers
``fwd``, and the direct head's gathers. Tested equal to the measured counters (tests/costmodel/test_atomistic.py).
"""

from __future__ import annotations

from typing import Any

import torch

from ....models.atomistic.cost import HookCall
from ..graph_parallel import plan_hook_bytes, reduces_locally


def hook_calls(model: Any, num_atoms: int, num_structures: int) -> list[HookCall]:
    """The hook calls of one forward of ``model`` on a batch of ``num_atoms`` atoms and ``num_structures`` structures,
    in call order: what the model says of itself (:meth:`~gnnpipe.models.atomistic.AtomisticModel.hook_calls`).

    Raises:
        ModelDescriptionError: a model that does not describe them.
    """
    return model.hook_calls(num_atoms, num_structures)



def _step(model: Any, plan: Any, num_structures: int, mode: str, element_size: int, backend: str, atoms_reduce: str,
          training: bool) -> list[tuple[dict[int, float], int]]:
    local = reduces_locally(plan, atoms_reduce)
    direct = bool(getattr(model, "direct_forces", False))
    calls = hook_calls(model, plan.num_nodes, num_structures)
    out = []
    for r in range(plan.num_ranks):
        per: dict[int, float] = {}
        n_coll = 0
        for call in calls:
            def b(backward: bool, call=call, r=r) -> float:
                return plan_hook_bytes(plan, r, call.hook, call.width, element_size, mode=mode, backend=backend,
                                       backward=backward, local_atoms_reduce=local)

            fwd = b(False)
            bwd = 0.0 if call.hook in ("sum", "replicated_grad") else b(True)
            if call.forward_only:
                k_f, k_b = 1, 0
            elif call.pos and not direct:
                k_f, k_b = (2, 2) if training else (1, 1)
            else:
                k_f, k_b = 1, (1 if call.grad and training and bwd else 0)
            per[call.unit] = per.get(call.unit, 0.0) + k_f * fwd + k_b * bwd
            n_coll += k_f * (fwd > 0) + k_b * (bwd > 0)
        out.append((per, n_coll))
    return out



def step_bytes(model: Any, plan: Any, *, num_structures: int, mode: str = "allgather", element_size: int = 4,
               backend: str = "gloo", atoms_reduce: str = "auto", training: bool = True) -> list[dict[int, float]]:
    """Bytes each rank of ``plan`` sends (kind ``"gp"``) in one training step of ``model``, per unit.

    Args:
        model: a ``schnet`` or ``dimenet++`` zoo model (its sizes and force kind are read).
        plan: the :class:`~gnnpipe.partitioners.GraphParallelPlan` of the batch.
        num_structures: ``B``, the batch's structures. mode: ``allgather`` or ``halo``.
        element_size: ``b``, bytes per value (4: float32, 8: float64). backend: ``gloo`` or ``nccl`` (the
            reduce-scatter differs). atoms_reduce: as :class:`~gnnpipe.tasks.s2ef.graph_parallel.GraphParallelComm`.
        training: a training step (the multiplicities of the module docstring); ``False``: one forward with
            conservative forces and no second backward (evaluation: ``fwd + bwd`` for position-dependent calls).

    Returns:
        per rank, ``{unit: bytes}`` (unit ``-1``: the readout's energy and force reductions; with direct forces
        also the trainer's gather of the owned forces, :func:`gnnpipe.tasks.s2ef.layout.replicate_owned`).
    """
    return [per for per, _ in _step(model, plan, num_structures, mode, element_size, backend, atoms_reduce,
                                    training)]



def step_collectives(model: Any, plan: Any, *, num_structures: int, mode: str = "allgather", element_size: int = 4,
                     backend: str = "gloo", atoms_reduce: str = "auto") -> list[int]:
    """Per rank, the collectives of one training step that move bytes (for the latency term of the time model)."""
    return [n for _, n in _step(model, plan, num_structures, mode, element_size, backend, atoms_reduce, True)]


def padded_slots(plan: Any) -> list[int]:
    """Per rank of ``plan``, ``E_r · K_r``: the owned edges times the most triplets one of them updates (the
    per-edge padding of GemNet's bilinear layer)."""

    out = []
    for e, ji in zip(plan.edge_counts, plan.local_idx_ji):
        k = int(torch.bincount(ji, minlength=e).max()) if e and ji.numel() else 0
        out.append(int(e) * k)
    return out
