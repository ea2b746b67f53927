"""The cost model of atomistic (S2EF) jobs: bytes, memory and step time of ``S × G × D`` layouts (issues #29, #30).

Graph parallelism (Sriram et al., ICLR 2022, arXiv 2203.09697) shards one batch's edges and triplets over the
``G`` ranks of a group; ``D`` data-parallel replicas split the batch's structures; ``S`` pipeline stages split the
interaction blocks (and so the parameters and their optimizer state). This module predicts, from a
:class:`~gnnpipe.partitioners.GraphParallelPlan` and the model's sizes, what one training step costs each rank.

**Bytes per interaction block** (kind ``"gp"``, exact). Each unit of a model calls the graph-parallel hooks
(:mod:`gnnpipe.models.atomistic.comm`) a fixed number of times on rows of known widths (:func:`hook_calls`). A
hook's forward sends :func:`~gnnpipe.core.ops.graph_parallel.plan_hook_bytes` ``(forward)`` and its backward
``(backward)``. In a step with conservative forces (``F = −∂E/∂pos`` with ``create_graph``, then the loss's
backward) a call whose input depends on the positions runs four times: its forward, its backward inside
``∂E/∂pos``, and in the loss's backward both the backward of the forward node and the backward of that backward
node (a forward-type collective): ``2·(fwd + bwd)``. A call whose input depends only on the parameters (the
embedding of ``z``, SchNet's first gather) is not on a path to ``pos``: ``fwd + bwd``. The energies' ``sum``
(``B`` values) and the forces' ``replicated_grad`` (``3N`` values) are all-reduces whose backward is the identity:
``fwd`` once. Direct forces: every call whose input needs a gradient ``fwd + bwd``, the positions' own gathers
``fwd``, and the direct head's gathers. Tested equal to the measured counters (tests/costmodel/test_atomistic.py).

**Memory of a rank** (bytes above the runtime floor; :func:`rank_memory`): ``parameters`` ``P_s·b`` (``P_s = P/S``
for stage ``s``), ``gradients`` ``P_s·b``, ``optimizer`` ``2·P_s·b`` (Adam's moments; the trainer keeps them in the
training dtype), the flattened gradient all-reduce buffer ``P_s·b`` when ``D·G > 1``, and ``activations``: what a
step keeps alive at its peak, ``κ·b·(w_E·E_r + w_T·T_r + w_N·N + w_A·N_r)`` with the rank's edges ``E_r``, triplets
``T_r``, the batch's atoms ``N`` (gathered atom rows are replicated) and its owned atoms ``N_r``; the widths
``w_*`` count the values autograd saves per edge, triplet and atom in the forward (:func:`activation_widths`,
written from the models' code) and ``κ`` is the double-backward factor: the step's peak of live bytes over the
forward's saved bytes (measured by :func:`profile_step` on a sample of the job; :data:`DEFAULT_KAPPA` without a
profile). Gathered edge rows (``allgather``: all ``E`` rows of the gathered width; ``halo``: the halo rows) add
``κ·b·Σ width·rows`` to the rank's edges' share.

**Step time** (:func:`predict_step`): the profiled single-process seconds of a step on this machine (a short
profile: :func:`profile_step`) split by work: a rank computes ``t₁ · work(E_r, T_r, N_r) / work(E, T, N)`` with the
analytic multiply-add counts per edge, triplet and atom (:func:`work_weights`), slowed by ``ranks / cores`` when
more ranks than cores share a CPU node and divided by the hardware's speed; plus the collectives' bytes over the
group's link (latency per message) and the gradient all-reduce (``2(R−1)/R·P_s·b`` over the ``D·G`` ranks of a
stage). Pipelining: the stage's share ``1/S`` of the blocks, the gpipe bubble ``(S−1)/(C+S−1)``
(``step = (C+S−1)·t_stage/C``), and the boundary tensors (per micro-batch and boundary the edge messages
``E·H``, the running per-atom output ``N`` and the forces' ``3N``, forward and back, twice with conservative
forces) over the link.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..core.ops.graph_parallel import plan_hook_bytes, reduces_locally

__all__ = ["HookCall", "hook_calls", "step_bytes"]


@attrs.frozen
class HookCall:
    """One call of a graph-parallel hook in a model's forward.

    Attributes:
        unit: the unit that calls it (0: the embedding, ``l``: interaction block ``l``; ``-1``: the readout).
        hook: ``atoms_gather``, ``atoms_reduce``, ``edges_gather``, ``sum`` or ``replicated_grad``.
        width: values per row (``sum``/``replicated_grad``: the whole tensor's values).
        pos: its input depends on the positions (its backward runs inside ``∂E/∂pos``).
        grad: its input needs a gradient in the loss's backward (parameters or positions requiring one).
        forward_only: the call runs without autograd (``replicate_owned``'s gather of direct forces).
    """

    unit: int
    hook: str
    width: int
    pos: bool = True
    grad: bool = True
    forward_only: bool = False


def _opt(model, *names):
    return [getattr(model, n) for n in names]


def hook_calls(model: Any, num_atoms: int, num_structures: int) -> list[HookCall]:
    """The hook calls of one forward of ``model`` (``schnet`` or ``dimenet++``, conservative or direct forces)
    on a batch of ``num_atoms`` atoms and ``num_structures`` structures, in call order (the models' code:
    :mod:`gnnpipe.models.atomistic.schnet`, :mod:`gnnpipe.models.atomistic.dimenet`).

    Raises:
        ConfigError: a model whose hook calls are not described here.
    """
    from ..errors import ConfigError
    from ..models.atomistic.dimenet import DimeNetPlusPlus
    from ..models.atomistic.schnet import SchNet

    direct = bool(getattr(model, "direct_forces", False))
    calls: list[HookCall] = []
    L = len(model.units) - 1
    if isinstance(model, SchNet):
        F = model.units[1].interaction.conv.lin1.out_features if L else 0
        H = model.head.lin1.in_features
        for b in range(1, L + 1):
            # block 1 gathers lin1(embedding(z)): parameters only; later blocks read h, which depends on pos
            calls.append(HookCall(b, "atoms_gather", F, pos=(b > 1) and not direct))
            calls.append(HookCall(b, "atoms_reduce", F, pos=not direct))
        calls.append(HookCall(-1, "sum", num_structures, pos=False))
        if direct:
            calls.append(HookCall(-1, "atoms_gather", H, pos=False))
            calls.append(HookCall(-1, "atoms_reduce", 3, pos=False))
            calls.append(HookCall(-1, "atoms_gather", 3, pos=False, grad=False, forward_only=True))
        else:
            calls.append(HookCall(-1, "replicated_grad", 3 * num_atoms, pos=False, grad=False))
        return calls
    if isinstance(model, DimeNetPlusPlus):
        emb = model.units[0]
        H = emb.emb.lin.out_features
        I = model.units[1].interaction.lin_down.out_features if L else 0
        c = not direct
        calls += [HookCall(0, "edges_gather", 3, pos=c, grad=c),  # the edge vectors k→j (geometry)
                  HookCall(0, "atoms_gather", H, pos=False),  # the embedding of z
                  HookCall(0, "atoms_reduce", H, pos=c)]  # output block 0
        for b in range(1, L + 1):
            calls += [HookCall(b, "edges_gather", I, pos=c), HookCall(b, "atoms_reduce", H, pos=c)]
        calls.append(HookCall(-1, "sum", num_structures, pos=False))
        if direct:
            calls.append(HookCall(-1, "atoms_reduce", 3, pos=False))
            calls.append(HookCall(-1, "atoms_gather", 3, pos=False, grad=False, forward_only=True))
        else:
            calls.append(HookCall(-1, "replicated_grad", 3 * num_atoms, pos=False, grad=False))
        return calls
    raise ConfigError(f"the atomistic cost model describes schnet and dimenet++; {type(model).__name__} has no "
                      "description of its hook calls (add one to gnnpipe.costmodel.atomistic.hook_calls)")


def step_bytes(model: Any, plan: Any, *, num_structures: int, mode: str = "allgather", element_size: int = 4,
               backend: str = "gloo", atoms_reduce: str = "auto", training: bool = True) -> list[dict[int, float]]:
    """Bytes each rank of ``plan`` sends (kind ``"gp"``) in one training step of ``model``, per unit.

    Args:
        model: a ``schnet`` or ``dimenet++`` zoo model (its sizes and force kind are read).
        plan: the :class:`~gnnpipe.partitioners.GraphParallelPlan` of the batch.
        num_structures: ``B``, the batch's structures. mode: ``allgather`` or ``halo``.
        element_size: ``b``, bytes per value (4: float32, 8: float64). backend: ``gloo`` or ``nccl`` (the
            reduce-scatter differs). atoms_reduce: as :class:`~gnnpipe.core.ops.graph_parallel.GraphParallelComm`.
        training: a training step (the multiplicities of the module docstring); ``False``: one forward with
            conservative forces and no second backward (evaluation: ``fwd + bwd`` for position-dependent calls).

    Returns:
        per rank, ``{unit: bytes}`` (unit ``-1``: the readout's energy and force reductions).
    """
    local = reduces_locally(plan, atoms_reduce)
    direct = bool(getattr(model, "direct_forces", False))
    out: list[dict[int, float]] = []
    for r in range(plan.num_ranks):
        per: dict[int, float] = {}
        for call in hook_calls(model, plan.num_nodes, num_structures):
            def b(backward: bool, call=call, r=r) -> float:
                return plan_hook_bytes(plan, r, call.hook, call.width, element_size, mode=mode, backend=backend,
                                       backward=backward, local_atoms_reduce=local)

            fwd = b(False)
            if call.forward_only:
                n = fwd
            elif direct:
                n = fwd + (b(True) if call.grad and training else 0.0)
            elif call.pos:
                n = 2 * (fwd + b(True)) if training else fwd + b(True)
            else:
                n = fwd + (b(True) if call.grad and training else 0.0)
            per[call.unit] = per.get(call.unit, 0.0) + n
        out.append(per)
    return out
