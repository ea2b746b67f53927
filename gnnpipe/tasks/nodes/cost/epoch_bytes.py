"""A layout's bytes per epoch by kind, summed over ranks (:func:`predict_bytes`), exact for the plan — the same
chunking and way partition the run will build:

* ``layer``  = ``Σ_ways Σ_{stage boundaries} 2·b·N_way·(d_boundary + d_h0)`` (forward embeddings and their
  gradients; ``d_h0`` is GCNII's shared tensor, which travels with the boundary);
* ``graph``  = GP: ``b·M·(Σd + Σ_back d)`` (:func:`gnnpipe.partitioners.predict_gp_bytes`, ``b/4`` times its fp32
  bytes): forward every op's mirror rows, backward their gradients for the ops whose input needs one
  (``GNNModel.backward_aggregation_dims``: not a first layer reading the raw features, e.g. GAT's); hybrid:
  ``h·(M_fwd·Σd + M_bwd·Σ_back,pull d) + b·M_C·Σ_back,push d`` — forward the mirror rows ``j → i`` across
  ways; backward, for the pull op the reverse pairs (``M_bwd``, equal to ``M_fwd`` for undirected graphs), for a
  message-passing unit's halo-gradient op the pushed halo rows of other ways, ``M_C = Σ_c |{v ∈ halo(c) :
  way(v) ≠ way(c)}|`` (docs/HALO_GRADIENT.md). Peers send rows of their history buffers, so ``h`` is the element
  size of ``--history-dtype`` (``b`` by default); pushes are in ``--dtype``;
* ``weight`` = ``2·(W−1)·b·P`` (ring all-reduce of every trained parameter within each stage's peer group).
"""

from __future__ import annotations

import torch

from ....partitioners.metrics import FP32_BYTES, predict_gp_bytes
from ..trainer import DTYPES
from .geometry import plan_geometry


def predict_bytes(config, plan, model) -> dict:
    """Bytes per epoch by kind, summed over ranks (module docstring), exact for ``plan``.

    Args:
        config: the layout's configuration. plan: its ``RunPlan`` (``gnnpipe.tasks.nodes.runner``).
        model: the model.

    Returns:
        ``{"layer": int, "graph": int, "weight": int}``.
    """
    b = torch.finfo(DTYPES[config.dtype]).bits // 8
    hb = torch.finfo(config.torch_history_dtype).bits // 8  # --history-dtype (default: --dtype)
    W, S = config.ways, config.stages
    N = int(plan.data.num_nodes)
    sh = model.units[0].out_dim if model.shared_tensor else 0
    bounds = list(plan.bounds)
    layer = sum(2 * b * N * (model.units[bounds[s + 1] - 1].out_dim + sh) for s in range(S - 1))
    graph = weight = 0
    if W > 1:
        dims = [d for _, _, d in model.aggregation_dims()]
        back = model.backward_aggregation_dims()
        g = plan_geometry(plan, config) if "mirror_count" not in plan.info or S > 1 else None
        if S == 1:
            m = int(plan.info["mirror_count"]) if g is None else g.mirror_fwd
            graph = predict_gp_bytes(m, dims, [d for _, _, d in back]) * b // FP32_BYTES  # counts fp32 elements
        else:
            push = [d for i, _, d in back if getattr(model.units[i], "message_passing", False)]
            pull = [d for i, _, d in back if not getattr(model.units[i], "message_passing", False)]
            # peers exchange rows of the history buffers (H_in forward, G_out backward), stored in
            # --history-dtype; a halo-gradient op's pushes stay in --dtype (docs/HALO_GRADIENT.md)
            hist_rows = predict_gp_bytes(g.mirror_fwd, dims, []) + predict_gp_bytes(g.mirror_bwd, [], pull)
            graph = (hist_rows * hb + predict_gp_bytes(g.mirror_push, [], push) * b) // FP32_BYTES
        P = sum(p.numel() for p in model.parameters() if p.requires_grad)
        weight = 2 * (W - 1) * b * P
    if W == 1 and S == 1:
        layer = 0
    return {"layer": int(layer), "graph": int(graph), "weight": int(weight)}
