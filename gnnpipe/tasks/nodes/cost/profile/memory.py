"""The memory side of a profile.

Bytes that autograd saves per row for each unit kind (``saved_tensors_hooks``, distinct
storages, parameters excluded), measured on a chunk.
:func:`memory_profile` takes only this (seconds, not minutes): the profile the memory model needs.
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from ...aggregation import history_op
from ...graph import GraphOps
from ...runner import num_classes_of
from .record import Profile, UnitKind
from .units import _model_fields, _representatives


def saved_bytes(model, data, lo: int, hi: int) -> list[float]:
    """Bytes saved for backward by each unit of ``model`` on rows ``[lo, hi)`` with the chunk op
    (distinct storages, parameters excluded; a storage counts for the first unit that saved it)."""
    ops = GraphOps(data.edge_index, data.num_nodes, data.x.dtype)
    adj: dict = {}  # the ops' shared cache of chunk rows, as in a stage
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    out = []
    h, sh = data.x[lo:hi], None
    model.train()
    keep = []
    for i, unit in enumerate(model.units):
        got = [0]

        def pack(t, got=got):
            try:
                st = t.untyped_storage()
                ptr = st.data_ptr()
                if ptr not in params and ptr not in seen:
                    seen.add(ptr)
                    got[0] += st.nbytes()
            except (RuntimeError, NotImplementedError):  # sparse or otherwise storage-less tensors
                pass
            return t

        # the pipeline's op per aggregation (a message-passing unit's: the halo-gradient op, which takes the layer)
        unit_ops = [history_op(unit, kind, data.num_nodes, h.dtype, h.device, "", ops, adj)
                    for kind in unit.aggregations]
        counter = [0]

        def agg(t, kind, layer=None, unit_ops=unit_ops, counter=counter):
            j = counter[0]
            counter[0] += 1
            return unit_ops[j].train(t, 0, (lo, hi), True, layer)

        h_in = h.detach().requires_grad_(i > 0)
        s_in = None if sh is None else sh.detach().requires_grad_(True)
        seen.add(h_in.untyped_storage().data_ptr())  # the unit's input is the previous unit's output
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            o, s_o = unit(h_in, s_in, agg)
        keep.append((o, s_o))
        out.append(float(got[0]))
        h, sh = o.detach(), (None if s_o is None else s_o.detach())
        seen.add(h.untyped_storage().data_ptr())
    return out


def memory_profile(config, data, *, sample_nodes: int = 4096) -> Profile:
    """A :class:`Profile` for the memory model only: no timing, no link; seconds, not minutes, on any graph.

    The saved-activation bytes per row of every unit kind are measured on the subgraph induced by the first
    ``sample_nodes`` vertices (autograd saves per-row tensors, so the bytes per row do not depend on the graph's
    size); everything else the memory model needs (unit widths, aggregation kinds, parameter counts) comes from
    the model. The time fields are zero: use :func:`profile` for time predictions.

    Args:
        config: a resolved :class:`~gnnpipe.core.settings.config.TrainConfig`. data: the prepared graph.
        sample_nodes: vertices of the measured subgraph (at most ``N``).

    Returns:
        a :class:`Profile` with ``notes == "memory only"``.
    """
    N = int(data.num_nodes)
    F, Cls = int(data.x.size(1)), num_classes_of(data)
    full, model, rep = _representatives(config, F, Cls)
    n = max(1, min(N, int(sample_nodes)))
    ei, _ = subgraph(torch.arange(n), data.edge_index, num_nodes=N)
    dtype = next(model.parameters()).dtype
    sub = Data(x=data.x[:n].to(dtype), edge_index=ei, num_nodes=n)
    with torch.random.fork_rng():
        saved = saved_bytes(model, sub, 0, n)
    kinds = {key: UnitKind(key=key, forward=[0.0] * 4, backward=[0.0] * 4, whole_forward_s=0.0, whole_backward_s=0.0,
                           saved_bytes_per_row=saved[i] / n,
                           params=int(sum(p.numel() for p in model.units[i].parameters())))
             for key, i in rep.items()}
    return Profile(
        unit_kinds=kinds, **_model_fields(full, data, F, Cls), step_s_per_param=0.0,
        dtype_bytes=torch.finfo(dtype).bits // 8, threads=config.threads, notes="memory only")
