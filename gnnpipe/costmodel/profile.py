"""Profiles the cost model predicts from: per-unit chunk costs, saved activations, the optimizer step, the link.

**Chunk costs.** For each distinct kind of layer unit (units with the same class, widths and aggregation
kinds cost the same; GCNII's 32 layers are one kind) the forward and the backward seconds of one chunk
are fitted, by non-negative least squares, as ``t = a + b·rows + c·halo + e·nnz`` — ``rows`` the chunk's
vertices, ``halo`` the distinct vertices of other chunks its aggregation reads, ``nnz`` its in-edges —
on chunks of several sizes measured as the pipeline runs them (the history-backed chunk op of
:func:`gnnpipe.core.profile.profile_unit_costs`, one METIS chunking of ``16`` chunks merged into
``4`` and ``2``) and on the whole graph (``halo = 0``). The fit extrapolates to any chunk count and to a
graph-parallel way's part (its rows and halo).

Timing: every unit's forward and backward is timed by the CPU time of this thread (``time.thread_time``
through the profiler's ``clock``), which other processes on a busy machine do not inflate; the wall time of
the profile passes is measured beside it, and ``cpu_over_wall`` (their ratio; 1.0 on a quiet machine, 0.4
with two busy co-tenants per core) is reported. The predictions are thus of the work itself, and a machine
with fewer cores than ranks is modelled by the simulation (:mod:`.predict`), not by noise.

**Activations.** Bytes that autograd saves per row for each unit kind (``saved_tensors_hooks``, distinct
storages, parameters excluded), measured on a chunk.

**Link.** A ping-pong between two ranks over the actual backend (gloo on CPU): one-way time of point-to-point
messages of 4 B … 8 MiB and of all-reduces of the same sizes, each fitted as ``latency + bytes / bandwidth``
(wall), with the thread CPU time of the sender beside it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import attrs
import numpy as np
import torch

from ..errors import ConfigError
from .hardware import Link

#: chunk feature names of the cost fits
FEATURES = ("one", "rows", "halo", "nnz")


# ---------------------------------------------------------------------------------------------- chunk features
def chunk_features(edge_index: torch.Tensor, ptr: Sequence[int]) -> np.ndarray:
    """``[C, 4]`` float array of ``(1, rows, halo, nnz)`` per contiguous chunk ``[ptr[c], ptr[c+1])``.

    ``halo``: distinct sources of edges into the chunk that lie outside it; ``nnz``: edges into the chunk.
    """
    ptr = np.asarray([int(v) for v in ptr], dtype=np.int64)
    src = edge_index[0].cpu().numpy().astype(np.int64)
    dst = edge_index[1].cpu().numpy().astype(np.int64)
    C = len(ptr) - 1
    dchunk = np.searchsorted(ptr, dst, side="right") - 1
    schunk = np.searchsorted(ptr, src, side="right") - 1
    nnz = np.bincount(dchunk, minlength=C).astype(float)
    cut = dchunk != schunk
    n = int(ptr[-1])
    keys = np.unique(dchunk[cut] * n + src[cut])
    halo = np.bincount(keys // n, minlength=C).astype(float) if keys.size else np.zeros(C)
    rows = np.diff(ptr).astype(float)
    return np.stack([np.ones(C), rows, halo, nnz], 1)


def part_features(rows: int, halo: int, nnz: int) -> np.ndarray:
    """The features of one part (a graph-parallel way's rows with its halo)."""
    return np.array([1.0, float(rows), float(halo), float(nnz)])


# ---------------------------------------------------------------------------------------------- records
@attrs.define
class UnitKind:
    """Cost of one kind of layer unit.

    Attributes:
        key: the kind's signature. forward, backward: fitted coefficients over :data:`FEATURES` (seconds).
        whole_forward_s, whole_backward_s: measured seconds on the whole graph (one process).
        saved_bytes_per_row: bytes autograd keeps per row of a chunk between the unit's forward and backward.
        params: parameter count of one unit of this kind.
    """

    key: str
    forward: list[float]
    backward: list[float]
    whole_forward_s: float
    whole_backward_s: float
    saved_bytes_per_row: float
    params: int

    def time(self, feats: np.ndarray, phase: str) -> float:
        """Fitted seconds of the forward (``phase="F"``) or backward (``"B"``) on a chunk with ``feats``."""
        coef = self.forward if phase == "F" else self.backward
        return float(np.dot(coef, feats))


@attrs.define
class Profile:
    """What :func:`profile` measured for one (graph, model) pair on this machine.

    Attributes:
        unit_kinds: ``{key: UnitKind}``. units: the key of every unit of the full model, in order.
        unit_dims: ``(in_dim, out_dim)`` of every unit. agg_dims: per unit, the widths of its aggregation ops.
        agg_kinds: per unit, its aggregation kinds. shared_dim: width of the shared tensor (GCNII's h0) or 0.
        num_nodes, num_edges, num_features, num_classes: the graph (after preprocessing).
        step_s_per_param: seconds of one Adam step per parameter. dtype_bytes: element size.
        p2p, allreduce: the measured links (``None`` if not measured). threads: torch threads per rank.
        cpu_over_wall: thread CPU / wall over the timed profile passes. fit_error: relative RMS error of the
        time fits over the measured chunks. notes: free text.
    """

    unit_kinds: dict
    units: list
    unit_dims: list
    agg_dims: list
    agg_kinds: list
    shared_dim: int
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    step_s_per_param: float
    dtype_bytes: int = 4
    p2p: Optional[Link] = None
    allreduce: Optional[Link] = None
    threads: int = 1
    cpu_over_wall: float = 1.0
    fit_error: float = 0.0
    profile_s: float = 0.0
    runtime_floor_bytes: int = 0
    action_overhead_s: float = 0.0
    notes: str = ""
    #: what the memory model measured of this (graph, model) pair, filled on first use: per role the bytes per row
    #: of :class:`~gnnpipe.costmodel.footprint.RoleFootprint`, and the graph's symmetry
    footprints: dict = attrs.field(factory=dict)

    def kind(self, unit: int) -> UnitKind:
        return self.unit_kinds[self.units[unit]]

    def stage_time(self, lo: int, hi: int, feats: np.ndarray, phase: str) -> float:
        """Fitted seconds of units ``[lo, hi)`` on a chunk with ``feats``."""
        return sum(self.kind(u).time(feats, phase) for u in range(lo, hi))

    def to_dict(self) -> dict:
        d = attrs.asdict(self, recurse=True)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        d = dict(d)
        d["unit_kinds"] = {k: UnitKind(**v) for k, v in d["unit_kinds"].items()}
        for key in ("p2p", "allreduce"):
            if d.get(key) is not None:
                d[key] = Link(**d[key])
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        return cls.from_dict(json.loads(Path(path).read_text()))


# ---------------------------------------------------------------------------------------------- helpers
def unit_key(unit: Any) -> str:
    """The signature of a unit: class, widths, aggregation kinds (units with equal keys cost the same)."""
    return f"{type(unit).__name__}({unit.in_dim}->{unit.out_dim};{','.join(unit.aggregations)})"


def _representatives(config, F: int, Cls: int):
    """``(model to time, {key: unit index in it})``: a 2-layer model when its unit kinds cover the full
    model's (they do for the zoo's models), else the full model."""
    import attrs as _attrs

    from ..core.trainer import make_model

    full = make_model(config, F, Cls)
    keys = [unit_key(u) for u in full.units]
    small = make_model(_attrs.evolve(config, layers=min(config.layers, 2)), F, Cls)
    small_keys = [unit_key(u) for u in small.units]
    if set(keys) <= set(small_keys):
        model = small
        rep = {}
        for i, k in enumerate(small_keys):
            rep.setdefault(k, i)
    else:
        model = full
        rep = {}
        for i, k in enumerate(keys):
            rep.setdefault(k, i)
    return full, model, rep


def _model_fields(full, data, F: int, Cls: int) -> dict:
    """The :class:`Profile` fields that describe the model and the graph (no measurement)."""
    sd = full.units[0].out_dim if full.shared_tensor else 0
    return dict(units=[unit_key(u) for u in full.units],
                unit_dims=[(int(u.in_dim), int(u.out_dim)) for u in full.units],
                agg_dims=[[int(getattr(u, "agg_dim", u.in_dim))] * len(u.aggregations) for u in full.units],
                agg_kinds=[list(u.aggregations) for u in full.units], shared_dim=int(sd),
                num_nodes=int(data.num_nodes), num_edges=int(data.edge_index.size(1)), num_features=F,
                num_classes=Cls)


def saved_bytes(model, data, lo: int, hi: int) -> list[float]:
    """Bytes saved for backward by each unit of ``model`` on rows ``[lo, hi)`` with the chunk op
    (distinct storages, parameters excluded; a storage counts for the first unit that saved it)."""
    from ..core.aggregation import history_op
    from ..core.graph import GraphOps

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


def _action_overhead(config, model, data, ptr: list[int], kinds: dict, repeats: int) -> tuple[float, int]:
    """Thread CPU seconds per chunk action of the real pipeline runtime beyond the fitted unit costs: one
    pipeline executor (:func:`~gnnpipe.core.pipeline.make_pipeline_stage`) holding every unit of ``model``, run
    as a single stage (no communication) over the chunks ``ptr`` with the configured correctors and gpipe."""
    import attrs as _attrs

    from .. import correctors as corr
    from ..core.comm import Comm
    from ..core.pipeline import make_pipeline_stage
    from ..core.runner import _order_policy  # no public equivalent: the chunk order the ranks would use
    from ..schedulers import get as get_scheduler

    cfg = _attrs.evolve(config, stages=1, ways=1, chunks=len(ptr) - 1, scheduler="gpipe", stash_weights=False)
    correctors = corr.build_correctors(cfg.correctors)
    U = model.num_units
    stage = make_pipeline_stage(cfg, model, data, torch.tensor(ptr), [0, U], 0, [0], get_scheduler("gpipe")(),
                                _order_policy(cfg, correctors), correctors, Comm())
    feats = chunk_features(data.edge_index, ptr)
    fitted = sum(kinds[unit_key(model.units[i])].time(f, ph) for i in range(U) for f in feats for ph in ("F", "B"))
    stage.train_epoch(0)  # warm-up: allocates history
    best = math.inf
    for e in range(1, 1 + max(1, repeats)):
        c0 = time.thread_time()
        stage.train_epoch(e)
        best = min(best, time.thread_time() - c0)
    params = sum(p.numel() for p in model.parameters())
    return max(0.0, (best - fitted) / (2 * (len(ptr) - 1))), params


def _time_step(model, config) -> float:
    """Seconds per parameter of one Adam step (the mean of 3 after a warm-up), thread CPU time."""
    from ..core.stage import make_optimizer_for

    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    if n == 0:
        return 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = make_optimizer_for(model, config, range(model.num_units))
    saved = [p.detach().clone() for p in params]
    opt.step()
    t0 = time.thread_time()
    for _ in range(3):
        opt.step()
    dt = (time.thread_time() - t0) / 3
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
            p.grad = None
    return dt / n


# ---------------------------------------------------------------------------------------------- link
def _pingpong(rank: int, world: int, sizes: list[int], reps: int) -> dict:
    import torch.distributed as dist
    import torch_geometric.data  # noqa: F401  (a rank unpickles a PyG Data: the floor includes PyG)

    from ..core import parallel, pipeline, runner  # noqa: F401  (what a training rank imports)

    from ..core.metrics import peak_memory_bytes

    out = {"p2p": [], "allreduce": [], "floor": peak_memory_bytes(torch.device("cpu"))}
    for n in sizes:
        t = torch.zeros(max(1, n // 4), dtype=torch.float32)
        for phase in ("warm", "timed"):
            k = 1 if phase == "warm" else reps
            dist.barrier()
            w0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(k):
                if rank == 0:
                    dist.send(t, 1)
                    dist.recv(t, 1)
                else:
                    dist.recv(t, 0)
                    dist.send(t, 0)
            w, c = (time.perf_counter() - w0) / (2 * k), (time.thread_time() - c0) / (2 * k)
        out["p2p"].append((t.numel() * 4, w, c))
        for phase in ("warm", "timed"):
            k = 1 if phase == "warm" else reps
            dist.barrier()
            w0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(k):
                dist.all_reduce(t)
            w, c = (time.perf_counter() - w0) / k, (time.thread_time() - c0) / k
        out["allreduce"].append((t.numel() * 4, w, c))
    return out


def _fit_link(points: list[tuple[int, float, float]]) -> Link:
    """Least-squares ``t = latency + bytes / bandwidth`` (both clipped to be physical)."""
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    A = np.stack([np.ones_like(b), b], 1)
    from scipy.optimize import nnls

    coef, _ = nnls(A, t)
    lat, inv_bw = float(coef[0]), float(coef[1])
    if inv_bw <= 0:
        inv_bw = float(t.max() / b.max())
    return Link(latency_s=lat, bandwidth_Bps=1.0 / inv_bw)


def profile_link(backend: str = "gloo", sizes: Sequence[int] = (4, 65536, 1 << 20, 8 << 20), reps: int = 5,
                 timeout_s: float = 60.0) -> tuple[Link, Link, dict]:
    """Measure the link between two local ranks over ``backend``: ``(p2p, allreduce, raw points)``.

    ``p2p``: one-way time of a message (half a round trip); ``allreduce``: the per-hop link of a ring
    all-reduce (for two ranks an all-reduce takes ``2·(latency + bytes/2/bandwidth)``, so the fitted
    ``t = a + bytes/bw`` gives ``Link(a/2, bw)``). ``raw``: ``{"p2p": [(bytes, wall_s, thread_cpu_s)…],
    "allreduce": […], "floor": peak resident bytes of a rank before any data}``.

    Raises:
        DistributedError: a rank failed.
    """
    from ..core.launch import spawn

    outs = spawn(_pingpong, 2, (list(sizes), int(reps)), backend=backend, timeout_s=timeout_s, threads=1)
    raw = outs[0]
    p2p = _fit_link(raw["p2p"])
    ar2 = _fit_link(raw["allreduce"])
    # ring all-reduce of G=2: 2(G-1)=2 steps of bytes/2 → t = 2·lat + bytes/bw: per-hop latency lat, bandwidth bw
    allreduce = Link(latency_s=ar2.latency_s / 2, bandwidth_Bps=ar2.bandwidth_Bps)
    return p2p, allreduce, raw


# ---------------------------------------------------------------------------------------------- profile
def profile(config, data, *, repeats: int = 2, chunk_counts: Sequence[int] = (16, 4, 2), link: bool = True,
            link_result: tuple | None = None, verbose: bool = False) -> Profile:
    """Profile ``config``'s model on ``data`` (a prepared PyG ``Data``) on this machine.

    Args:
        config: a resolved :class:`~gnnpipe.core.config.TrainConfig` (model, layers, hidden, dtype, threads).
        data: the prepared graph (``gnnpipe.api.load_data``).
        repeats: timed passes per measurement (the minimum is kept).
        chunk_counts: chunkings to time (the first is a METIS chunk plan; the others merge its chunks and must
            divide it).
        link: measure the link (and the runtime floor of a rank) with a 2-rank ping-pong (a few seconds);
            ``link_result`` = ``(p2p, allreduce[, floor_bytes])`` gives them instead.

    Returns:
        a :class:`Profile`.

    Raises:
        ConfigError: a chunk count that does not divide the first, or more chunks than vertices.
    """
    from scipy.optimize import nnls

    from ..core.runner import num_classes_of
    from ..partitioners import ChunkPlan
    from ..core.profile import profile_unit_costs

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
        plan = ChunkPlan.build(data, base, config.partitioner, over=config.over_partition, seed=config.seed)
        rdata = plan.data
        rdata.x = rdata.x.to(next(model.parameters()).dtype)
        ptr = [int(v) for v in plan.chunk_ptr.tolist()]
        rows_f: list[np.ndarray] = []
        times_f: dict[int, list[float]] = {i: [] for i in range(model.num_units)}
        times_b: dict[int, list[float]] = {i: [] for i in range(model.num_units)}
        wall_total, cpu_total = 0.0, 0.0
        for C in sorted({min(int(c), base) for c in chunk_counts}, reverse=True):
            if C < 1:
                continue
            step = base // C if base % C == 0 else 1
            cptr = ptr[::step] if ptr[::step][-1] == N else ptr[::step] + [N]
            w0, c0 = time.perf_counter(), time.thread_time()
            ph = profile_unit_costs(model, rdata, repeats=repeats, chunk_ptr=torch.tensor(cptr), phases=True,
                                    clock=time.thread_time)
            wall_total += time.perf_counter() - w0
            cpu_total += time.thread_time() - c0
            rows_f.append(chunk_features(rdata.edge_index, cptr))
            for i in range(model.num_units):
                times_f[i].extend(ph.forward[i])
                times_b[i].extend(ph.backward[i])
        # the whole graph in one process (the single-process trainer's op)
        w0, c0 = time.perf_counter(), time.thread_time()
        whole = profile_unit_costs(model, rdata, repeats=repeats, phases=True, clock=time.thread_time)
        wall_total += time.perf_counter() - w0
        cpu_total += time.thread_time() - c0
        # how much of the wall time this thread ran (a busy machine: < 1); reported, not applied
        ratio = min(1.0, cpu_total / wall_total) if wall_total > 0 else 1.0
        whole_feats = np.array([[1.0, N, 0.0, float(data.edge_index.size(1))]])
        X = np.concatenate(rows_f + [whole_feats])
        # weight rows so that big and small chunks count alike (relative error)
        kinds: dict[str, Any] = {}
        errs = []
        saved_per_unit = saved_bytes(model, rdata, ptr[0], ptr[1])
        rows0 = ptr[1] - ptr[0]
        for key, i in rep.items():
            fits = []
            for times, whole_t in ((times_f[i], whole.forward[i][0]), (times_b[i], whole.backward[i][0])):
                y = np.array(times + [whole_t])
                wts = 1.0 / np.maximum(y, 1e-6)
                coef, _ = nnls(X * wts[:, None], y * wts)
                pred = X @ coef
                errs.extend(((pred - y) / np.maximum(y, 1e-9)).tolist())
                fits.append([float(c) for c in coef])
            u = model.units[i]
            kinds[key] = UnitKind(key=key, forward=fits[0], backward=fits[1],
                                  whole_forward_s=float(whole.forward[i][0]),
                                  whole_backward_s=float(whole.backward[i][0]),
                                  saved_bytes_per_row=saved_per_unit[i] / max(rows0, 1),
                                  params=int(sum(p.numel() for p in u.parameters())))
        step = _time_step(full, config)
        optr = ptr[:: max(1, base // 8)] if base >= 8 else ptr
        optr = optr if optr[-1] == N else optr + [N]
        overhead, small_params = _action_overhead(config, model, rdata, optr, kinds, repeats)
        overhead = max(0.0, overhead - step * small_params / (2 * (len(optr) - 1)))
    finally:
        torch.set_num_threads(threads_before)
    p2p = allreduce = None
    floor = 0
    if link_result is not None:
        p2p, allreduce = link_result[:2]
        floor = int(link_result[2]) if len(link_result) > 2 else 0
    elif link:
        p2p, allreduce, raw = profile_link(timeout_s=config.timeout_s)
        floor = int(raw["floor"])
    dtype_bytes = torch.finfo(next(full.parameters()).dtype).bits // 8
    prof = Profile(
        unit_kinds=kinds, **_model_fields(full, data, F, Cls), step_s_per_param=step, dtype_bytes=dtype_bytes, p2p=p2p, allreduce=allreduce, threads=config.threads,
        cpu_over_wall=ratio, fit_error=float(math.sqrt(np.mean(np.square(errs)))) if errs else 0.0,
        profile_s=time.perf_counter() - t_start, runtime_floor_bytes=floor, action_overhead_s=overhead,
    )
    if verbose:
        print(f"profile: {len(kinds)} unit kind(s), fit RMS error {prof.fit_error:.1%}, runtime overhead "
              f"{1e3 * overhead:.2f} ms per chunk action, thread CPU / wall {ratio:.2f}, {prof.profile_s:.1f} s")
    return prof


def memory_profile(config, data, *, sample_nodes: int = 4096) -> Profile:
    """A :class:`Profile` for the memory model only: no timing, no link; seconds, not minutes, on any graph.

    The saved-activation bytes per row of every unit kind are measured on the subgraph induced by the first
    ``sample_nodes`` vertices (autograd saves per-row tensors, so the bytes per row do not depend on the graph's
    size); everything else the memory model needs (unit widths, aggregation kinds, parameter counts) comes from
    the model. The time fields are zero: use :func:`profile` for time predictions.

    Args:
        config: a resolved :class:`~gnnpipe.core.config.TrainConfig`. data: the prepared graph.
        sample_nodes: vertices of the measured subgraph (at most ``N``).

    Returns:
        a :class:`Profile` with ``notes == "memory only"``.
    """
    from torch_geometric.data import Data
    from torch_geometric.utils import subgraph

    from ..core.runner import num_classes_of

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
                           saved_bytes_per_row=saved[i] / n, params=int(sum(p.numel() for p in model.units[i].parameters())))
             for key, i in rep.items()}
    return Profile(
        unit_kinds=kinds, **_model_fields(full, data, F, Cls), step_s_per_param=0.0, dtype_bytes=torch.finfo(dtype).bits // 8, threads=config.threads, notes="memory only")
