"""Per-rank memory of a plan (:func:`predict_memory`): the memory model's kinds (:mod:`.memory`) with each rank
role's measured bytes per row (:mod:`.footprint`, cached in the profile)."""

from __future__ import annotations

import torch

from ....core.comm import MAX_PENDING_SENDS
from ....schedulers import build_schedule, simulate
from ..trainer import DTYPES
from .footprint import RoleFootprint, adjacency_build_per_nnz, role_footprint
from .geometry import plan_geometry, stage_units
from .memory import MemoryBreakdown, rank_memory, single_memory
from .profile import Profile


def predict_memory(config, plan, model, profile: Profile) -> list[MemoryBreakdown]:
    """Per-rank :class:`MemoryBreakdown` (live bytes above the runtime floor) for ``plan`` (:mod:`.memory`).

    The bytes per row of each role come from :func:`~gnnpipe.tasks.nodes.cost.footprint.role_footprint` on the plan's
    graph, measured once per role and kept in ``profile.footprints``."""
    b = torch.finfo(DTYPES[config.dtype]).bits // 8
    hb = torch.finfo(config.torch_history_dtype).bits // 8  # --history-dtype (default: --dtype)
    copies = _history_copies(config)
    W, S = config.ways, config.stages
    t2 = S > 1 and any(str(c).partition(":")[0] == "t2" or type(c).__name__ == "T2UnbiasedGradient"
                       for c in config.correctors)
    data = plan.data
    N, E, F = int(data.num_nodes), int(data.edge_index.size(1)), int(data.x.size(1))
    bx = int(data.x.element_size())
    U = len(profile.units)
    sh = profile.shared_dim
    P = sum(profile.kind(u).params for u in range(U))
    weight = getattr(data, "edge_weight", None)
    symmetric_graph = _symmetric(profile, data)
    symmetric = {k: symmetric_graph and weight is None and k in ("gcn", "sum")
                 for u in range(U) for k in profile.agg_kinds[u]}
    ew = 0 if weight is None else int(weight.numel() * weight.element_size())

    def nnz(kind: str) -> int:
        return E + (N if kind == "gcn" else 0)

    def footprint(role: str, s: int = 0):
        return _footprint(profile, config, data, role, plan.bounds, s, plan.num_classes)

    max_dim = max(d for _, d in profile.unit_dims)  # widest unit output (the input features are the graph kind)
    push_units = {i for i, u in enumerate(model.units) if getattr(u, "message_passing", False)}
    if W == 1 and S == 1:
        kinds = {k: nnz(k) for u in range(U) for k in profile.agg_kinds[u]}
        build = {k: _build_per_nnz(profile, config, data, k) for k in kinds}
        return [single_memory(N=N, F=F, E=E, b=b, bx=bx, kinds_nnz=kinds, symmetric=symmetric, params=P,
                              footprint=footprint("single"), build_per_nnz=max(build.values(), default=0.0))]
    g = plan_geometry(plan, config)
    out = []
    if S == 1:
        kinds = sorted({k for u in range(U) for k in profile.agg_kinds[u]})
        fp = footprint("gp")
        for w in range(W):
            f = g.way_feats[w]
            part = (int(f[1]), int(f[2]), int(f[3]) + (int(f[1]) if "gcn" in kinds else 0))
            out.append(rank_memory(rank=w, way=w, stage=0, N=N, F=F, E=E, b=b, bx=bx, kinds=kinds, chunks=[part],
                                   symmetric=symmetric, params_trained=P, allreduce=True, history=0, footprint=fp,
                                   inflight=1, first=True, last=True, recv_width=0, send_width=0, pending_sends=0,
                                   graph_parallel=True, way_part=part, max_dim=max_dim, edge_weight_bytes=ew))
        return out
    Cw = (len(g.chunk_ptr) - 1) // W
    sched = build_schedule(config.scheduler, S, Cw)
    inflight = simulate(sched).peak_inflight
    for w in range(W):
        chunks = range(g.way_ptr[w], g.way_ptr[w + 1])
        f = g.way_feats[w] if W > 1 else None
        for s in range(S):
            lo, hi = stage_units(g.bounds, s)
            kinds = sorted({k for u in range(lo, hi) for k in profile.agg_kinds[u]})
            parts = sorted(((int(g.chunk_feats[c][1]), int(g.chunk_feats[c][2]),
                             int(g.chunk_feats[c][3]) + (int(g.chunk_feats[c][1]) if "gcn" in kinds else 0))
                            for c in chunks), reverse=True)
            P_s = sum(profile.kind(u).params for u in range(lo, hi))
            hist = [d for u in range(lo, hi) for d in profile.agg_dims[u]]
            halo_rows = sum(int(g.chunk_feats[c][2]) for c in chunks)
            history = sum(2 * N * d * hb for d in hist) + copies * N * sum(hist) * hb
            history += sum(halo_rows * d * b for u in range(lo, hi) if u in push_units for d in profile.agg_dims[u])
            # T2 zeroes every G_out at an epoch's end, which under --recompute releases it until the next backward:
            # not held while the run evaluates (History.zero_grads, History.release_grads)
            released = sum(N * d * hb for u in range(lo, hi) if u not in push_units for d in profile.agg_dims[u]) \
                if t2 and config.recompute else 0
            d_in, d_out = profile.unit_dims[lo][0], profile.unit_dims[hi - 1][1]
            fwd_w, bwd_w = (d_in + sh) * b if s > 0 else 0, (d_out + sh) * b if s < S - 1 else 0
            if int(inflight[s]) >= Cw:
                # every chunk in flight (gpipe): the peak is the first backward, beside the receive posted for the
                # next backward's gradient and the last forward sends still outstanding (none on the last stage)
                recv, send = bwd_w, bwd_w
            else:  # forwards and backwards interleave: a receive of either kind posted ahead, sends of both
                recv, send = max(fwd_w, bwd_w), max(fwd_w, bwd_w)
            way_part = None
            if W > 1:
                way_part = (int(f[1]), int(f[2]), int(f[3]) + (int(f[1]) if "gcn" in kinds else 0))
            m = rank_memory(rank=w * S + s, way=w, stage=s, N=N, F=F, E=E, b=b, bx=bx, kinds=kinds, chunks=parts,
                            symmetric=symmetric, params_trained=P_s, allreduce=W > 1, history=history,
                            history_eval=history - released,
                            footprint=footprint("hybrid" if W > 1 else "pipeline", s), inflight=int(inflight[s]),
                            first=s == 0, last=s == S - 1, recv_width=recv, send_width=send,
                            pending_sends=MAX_PENDING_SENDS, hybrid=W > 1, way_part=way_part, max_dim=max_dim,
                            edge_weight_bytes=ew)
            if W > 1:  # the peer index lists of every chunk (forward and backward) and the way of every vertex
                lists = 8 * sum(g.peer_rows[c][0] + g.peer_rows_bwd[c][0] for c in range(len(g.chunk_ptr) - 1))
                m.adjacency += lists + N * 8
                for attr in ("steady", "train_peak", "eval_peak"):
                    setattr(m, attr, getattr(m, attr) + lists + N * 8)
            out.append(m)
    return out



def _footprint(profile: Profile, config, data, role: str, bounds, s: int, num_classes: int):
    """The role's measured ``gnnpipe.tasks.nodes.cost.footprint.RoleFootprint``, cached in ``profile.footprints``."""
    lo, hi = (0, len(profile.units)) if role in ("single", "gp") else (int(bounds[s]), int(bounds[s + 1]))
    pipe = role in ("pipeline", "hybrid")
    key = "|".join(str(v) for v in (
        role, lo, hi, lo == 0, hi == len(profile.units), config.model, config.layers, config.hidden, config.dropout,
        config.activation, config.bias, sorted(config.model_args.items()), config.dtype,
        config.history_dtype or config.dtype, pipe and bool(config.recompute), pipe and config.scheduler))
    if key not in profile.footprints:
        fp = role_footprint(config, data, role, bounds, s, num_classes=num_classes)
        profile.footprints[key] = fp.to_dict()
    return RoleFootprint(**profile.footprints[key])


def _build_per_nnz(profile: Profile, config, data, kind: str) -> float:
    """Peak bytes per non-zero while the single process builds ``Â`` and ``Âᵀ`` of ``kind`` (measured, cached)."""
    key = f"build:{kind}:{config.dtype}"
    if key not in profile.footprints:
        profile.footprints[key] = {"per_nnz": adjacency_build_per_nnz(config, data, kind)}
    return float(profile.footprints[key]["per_nnz"])


def _symmetric(profile: Profile, data) -> bool:
    """Whether the graph's edge list is symmetric (every edge ``j → i`` has its ``i → j``, as often): then
    ``Â`` of ``gcn`` and ``sum`` without edge weights equals ``Âᵀ`` bit for bit and the runtime keeps one copy
    (cached in ``profile.footprints``; invariant under the plan's relabelling)."""
    key = "symmetric"
    if key not in profile.footprints:
        src, dst = data.edge_index[0].long(), data.edge_index[1].long()
        N = int(data.num_nodes)
        profile.footprints[key] = bool(torch.equal(torch.sort(src * N + dst).values, torch.sort(dst * N + src).values))
    return bool(profile.footprints[key])


def _history_copies(config) -> int:
    """Full copies of every ``H_in`` the configured correctors keep: EMA's average always; T3's snapshot once the
    run reaches the end of its first period (``epochs ≥ P``; before that it restores zeros and holds nothing)."""
    n = 0
    for spec in config.correctors:
        name, _, opt = str(spec).partition(":") if isinstance(spec, str) else (type(spec).__name__.lower(), "", "")
        if name == "ema":
            n += 1
        elif name == "t3" and config.epochs >= int(float(opt or 23)):
            n += 1
    return n

