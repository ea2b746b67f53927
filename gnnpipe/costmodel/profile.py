"""Profiles the cost model predicts from: per-unit chunk costs, the runtime's own costs, saved activations, the
optimizer step, the link.

**Chunk costs.** For each distinct kind of layer unit (units with the same class, widths and aggregation
kinds cost the same; GCNII's 32 layers are one kind) the forward and the backward seconds of one chunk
are fitted, by non-negative least squares, as ``t = a + b·rows + c·halo + e·nnz`` — ``rows`` the chunk's
vertices, ``halo`` the distinct vertices of other chunks its aggregation reads, ``nnz`` its in-edges —
on chunks of several sizes measured as the pipeline runs them (the history-backed chunk op and the fused
chunk step of :func:`gnnpipe.core.runtime.profile.profile_unit_costs`, in a gpipe stage's order, one METIS chunking of
``16`` chunks merged into ``4`` and ``2``) and on the whole graph in the order the single process trains it
(``halo = 0``). The cost per row is not constant (a chunk that stays in the caches is cheaper per row than a
part that streams from memory), so each chunking's measured / fitted ratio is kept as a size factor at its mean
chunk rows (:func:`size_factor`): the fit extrapolates to any chunk count and to a graph-parallel way's part
(its rows and halo), and is right where it was measured. Units that fuse their chunk step in a pipeline also
get the ratio of their plain path (:attr:`UnitKind.unfused`).

**The runtime's own costs**, measured on the subgraph of the first few thousand (relabelled) vertices, where
the units' cost that the difference removes is small: the pipeline's per chunk action (a one-stage executor
against its units, :func:`_action_overhead`), graph parallelism's per op and direction (:func:`_gp_overhead`:
both ways of a 2-way split run by the real executor without peers) and a hybrid's (:func:`_hybrid_overhead`).

Timing: every unit's forward and backward is timed by the CPU time of this thread (``time.thread_time``
through the profiler's ``clock``), which other processes on a busy machine do not inflate; the wall time of
the profile passes is measured beside it, and ``cpu_over_wall`` (their ratio; 1.0 on a quiet machine, 0.4
with two busy co-tenants per core) is reported. The predictions are thus of the work itself, and a machine
with fewer cores than ranks is modelled by the simulation (:mod:`.predict`), not by noise.

**Contention.** The first chunking is timed again while every other core of the machine runs the same passes
(:func:`measure_contention`, forked co-runners): per unit kind and phase the ratio of the two, which the
prediction applies to ranks of one CPU node that compute at the same time (they share its caches and memory
bandwidth; a whole-graph profile in one process cannot see it); and, asked about more ranks than cores, with
that many processes time-sliced on the cores (a rank switched back in finds its data evicted).

**Activations.** Bytes that autograd saves per row for each unit kind (``saved_tensors_hooks``, distinct
storages, parameters excluded), measured on a chunk.

**Link.** A ping-pong between two ranks over the actual backend (gloo on CPU): one-way time of point-to-point
messages of 4 B … 8 MiB and of all-reduces of the same sizes (the median of many round trips), each fitted as
``latency + bytes / bandwidth`` (wall), and the main thread's CPU per message fitted likewise. With more ranks
than cores, an exchange probe measures the core time a rank's blocking wait costs when ranks share the cores
(:func:`switch_costs`).
"""

from __future__ import annotations

import json
import math
import statistics
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
def size_factor(points: Sequence[Sequence[float]], rows: float) -> float:
    """The measured correction of a linear cost fit at a chunk of ``rows`` rows: ``points`` are ``[rows, factor]``
    pairs (one per profiled chunking: its mean chunk rows, measured / fitted seconds summed over its chunks),
    interpolated linearly in ``log(rows)`` and held constant beyond the first and last point; ``1.0`` without
    points.

    A unit's cost per row is not constant: while a chunk's tensors stay in the caches it is cheaper than on
    a part of a few thousand wide rows that streams from memory (Amazon Computers' 767-wide encoder: 38 ms
    forward summed over 16 chunks, 76 ms on the whole graph). A linear fit through chunks of every size is right
    on average and wrong at both ends; the factor puts each measured chunking back where it was measured.
    """
    if not points:
        return 1.0
    pts = sorted((float(r), float(f)) for r, f in points if r > 0)
    if not pts:
        return 1.0
    xs = [math.log(r) for r, _ in pts]
    return float(np.interp(math.log(max(float(rows), 1.0)), xs, [f for _, f in pts]))


@attrs.define
class UnitKind:
    """Cost of one kind of layer unit.

    Attributes:
        key: the kind's signature. forward, backward: fitted coefficients over :data:`FEATURES` (seconds).
        whole_forward_s, whole_backward_s: measured seconds on the whole graph (one process, the graph in the
            order the single process trains it).
        saved_bytes_per_row: bytes autograd keeps per row of a chunk between the unit's forward and backward.
        params: parameter count of one unit of this kind.
        scale_forward, scale_backward: ``[rows, factor]`` per profiled chunking (:func:`size_factor`).
        unfused: seconds of the plain path over the fused chunk step (``agg.push_pull``) for a unit that fuses
            it in a pipeline (1.0 otherwise); a hybrid's peer op and graph parallelism run the plain path.
        contended_forward, contended_backward: thread CPU seconds of the unit's chunks while every core of the node
            runs the same chunk passes, over the seconds alone (:func:`measure_contention`; 1.0: not measured).
            Ranks of one node share its caches and memory bandwidth; a memory-bound unit slows when they compute
            at once, a compute-bound one does not.
        oversubscribed_forward, oversubscribed_backward: the same with more processes than cores
            (:attr:`Profile.oversubscribed_ranks`), time-sliced: a rank switched back in finds its data evicted.
    """

    key: str
    forward: list[float]
    backward: list[float]
    whole_forward_s: float
    whole_backward_s: float
    saved_bytes_per_row: float
    params: int
    scale_forward: list = attrs.field(factory=list)
    scale_backward: list = attrs.field(factory=list)
    unfused: float = 1.0
    contended_forward: float = 1.0
    contended_backward: float = 1.0
    oversubscribed_forward: float = 1.0
    oversubscribed_backward: float = 1.0

    def contention(self, phase: str, level: float) -> float:
        """The slowdown at contention ``level``: 1 at 0; ``1 + level · (κ − 1)`` up to 1, with ``κ`` the measured
        :attr:`contended_forward` (``phase="F"``) or :attr:`contended_backward`; above 1 (more ranks than cores),
        ``κ + (level − 1) · (κ_over − κ)`` up to 2, with ``κ_over`` the measured ``oversubscribed_*``."""
        level = min(2.0, max(0.0, float(level)))
        kappa = self.contended_forward if phase == "F" else self.contended_backward
        if level <= 1.0:
            return 1.0 + level * (kappa - 1.0)
        over = self.oversubscribed_forward if phase == "F" else self.oversubscribed_backward
        return kappa + (level - 1.0) * (max(over, kappa) - kappa)

    def time(self, feats: np.ndarray, phase: str, fused: bool = True, contended: float = 0.0) -> float:
        """Seconds of the forward (``phase="F"``) or backward (``"B"``) on a chunk with ``feats``: the linear fit
        times the measured size factor at the chunk's rows (and :attr:`unfused` for the plain path), times
        :meth:`contention` at level ``contended`` (0: alone on the node)."""
        coef, pts = (self.forward, self.scale_forward) if phase == "F" else (self.backward, self.scale_backward)
        t = float(np.dot(coef, feats)) * size_factor(pts, float(feats[1]))
        if contended > 0.0:
            t *= self.contention(phase, contended)
        return t if fused else t * self.unfused


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
        time fits over the measured chunks (before the size factors). profile_s: seconds the profile took.
        runtime_floor_bytes: resident bytes of a rank before it holds data.
        action_overhead_s: thread CPU seconds of the runtime per pipeline chunk action beyond its units.
        gp_op_s, gp_op_s_per_elem: graph parallelism's bookkeeping per aggregation op and direction beyond the
            units' plain cost on the way's rows (gathers of mirror rows, concatenation with the halo, the halo
            rows' gradient and its ``index_add_``): ``gp_op_s + gp_op_s_per_elem · (rows + halo) · d``.
        hybrid_op_s, hybrid_op_s_per_elem: a hybrid's bookkeeping per aggregation op and direction of a chunk
            action beyond ``action_overhead_s`` (the peer op's gathers of the rows it sends, its writes of the
            peers' rows into history, the correctors' hooks for their chunks):
            ``hybrid_op_s + hybrid_op_s_per_elem · (rows sent + rows received) · d``.
        msg_cpu_s, msg_cpu_s_per_byte: thread CPU of the rank's main thread per point-to-point message (a send or
            a receive) over the backend: ``msg_cpu_s + bytes · msg_cpu_s_per_byte``.
        contention_ranks: processes that ran the chunk passes at once when the units' ``contended_*`` ratios were
            measured (this machine's cores; 0: not measured, the ratios are 1). oversubscribed_ranks: likewise for
            the ``oversubscribed_*`` ratios (the ranks asked about, when more than the cores; 0: not measured).
        switch_s, switch_peer_s, switch_ranks: on a node with more ranks than cores, core seconds lost per
            blocking wait of a rank (its exchange with one peer), and per further peer of the wait, measured with
            ``switch_ranks`` ranks on this machine's cores (0: not measured); see :func:`measure_link`.
        notes: free text.
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
    gp_op_s: float = 0.0
    gp_op_s_per_elem: float = 0.0
    hybrid_op_s: float = 0.0
    hybrid_op_s_per_elem: float = 0.0
    msg_cpu_s: float = 0.0
    msg_cpu_s_per_byte: float = 0.0
    switch_s: float = 0.0
    switch_peer_s: float = 0.0
    switch_ranks: int = 0
    contention_ranks: int = 0
    oversubscribed_ranks: int = 0
    notes: str = ""
    #: what the memory model measured of this (graph, model) pair, filled on first use: per role the bytes per row
    #: of :class:`~gnnpipe.costmodel.footprint.RoleFootprint`, and the graph's symmetry
    footprints: dict = attrs.field(factory=dict)

    def kind(self, unit: int) -> UnitKind:
        return self.unit_kinds[self.units[unit]]

    def stage_time(self, lo: int, hi: int, feats: np.ndarray, phase: str, fused: bool = True,
                   contended: float = 0.0) -> float:
        """Fitted seconds of units ``[lo, hi)`` on a chunk with ``feats`` (``fused=False``: the plain path;
        ``contended``: as :meth:`UnitKind.time`)."""
        return sum(self.kind(u).time(feats, phase, fused, contended) for u in range(lo, hi))

    def link_result(self) -> dict:
        """This profile's :data:`LINK_FIELDS` (``profile(..., link_result=…)`` reuses them for another job)."""
        return {k: getattr(self, k) for k in LINK_FIELDS}

    def msg_cpu(self, nbytes: float) -> float:
        """Main-thread CPU seconds of one message of ``nbytes`` (a send or a receive)."""
        return self.msg_cpu_s + nbytes * self.msg_cpu_s_per_byte if nbytes > 0 else 0.0

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
        """Read a profile that :meth:`save` wrote.

        Raises:
            ConfigError: the file is missing, unreadable, not JSON, or not a saved profile (e.g. a plan's
                ``--out`` file).
        """
        p = Path(path).expanduser()
        try:
            d = json.loads(p.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read the profile {str(path)!r}: {exc.strerror}; give a file that "
                              f"--profile-out (Profile.save) wrote") from None
        except ValueError as exc:
            raise ConfigError(f"the profile {str(path)!r} is not JSON ({exc}); give a file that --profile-out "
                              f"(Profile.save) wrote") from None
        try:
            return cls.from_dict(d)
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{str(path)!r} is not a saved profile ({type(exc).__name__}: {exc}); give a file "
                              f"that --profile-out (Profile.save) wrote") from None

    def check_matches(self, config, data) -> None:
        """Check that this profile was taken for ``config``'s model on ``data``'s graph (the unit kinds and widths,
        the vertices, edges, features and classes); a profile of another job would predict another job's times.

        Raises:
            ConfigError: naming the first difference and the fix (profile again: drop ``--profile-in``).
        """
        from ..core.training.runner import num_classes_of
        from ..core.training.trainer import make_model

        F, Cls = int(data.x.size(1)), num_classes_of(data)
        model = make_model(config, F, Cls, units=range(0))  # shapes only: no unit is materialised
        mine = {"units": self.units, "vertices": self.num_nodes, "edges": self.num_edges,
                "features": self.num_features, "classes": self.num_classes}
        job = {"units": [unit_key(u) for u in model.units], "vertices": int(data.num_nodes),
               "edges": int(data.edge_index.size(1)), "features": F, "classes": Cls}
        for key in mine:
            if mine[key] != job[key]:
                a, b = mine[key], job[key]
                if key == "units":
                    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    a = f"{len(a)}" + (f", unit {i} {a[i]}" if i < len(a) else "")
                    b = f"{len(b)}" + (f", unit {i} {b[i]}" if i < len(b) else "")
                raise ConfigError(f"the profile was taken for another job: its {key} are {a}, this job's {b}; "
                                  f"profile this job (drop --profile-in) or give its own profile")


# ---------------------------------------------------------------------------------------------- helpers
def unit_key(unit: Any) -> str:
    """The signature of a unit: class, widths, aggregation kinds (units with equal keys cost the same)."""
    return f"{type(unit).__name__}({unit.in_dim}->{unit.out_dim};{','.join(unit.aggregations)})"


def _representatives(config, F: int, Cls: int):
    """``(model to time, {key: unit index in it})``: a 2-layer model when its unit kinds cover the full
    model's (they do for the zoo's models), else the full model."""
    import attrs as _attrs

    from ..core.training.trainer import make_model

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
    from ..core.ops.aggregation import history_op
    from ..core.ops.graph import GraphOps

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


def _subgraph(data, n: int):
    """The subgraph induced by the (relabelled) vertices ``[0, n)`` with features, labels and masks, as a rank's
    executor needs them (at least one training vertex, so that the loss is defined)."""
    from torch_geometric.data import Data

    ei = data.edge_index
    keep = (ei < n).all(0)
    sub = Data(x=data.x[:n], edge_index=ei[:, keep], y=data.y[:n], num_nodes=n)
    for m in ("train_mask", "val_mask", "test_mask"):
        if getattr(data, m, None) is not None:
            sub[m] = getattr(data, m)[:n].clone()
    if getattr(data, "edge_weight", None) is not None:
        sub.edge_weight = data.edge_weight[keep]
    if getattr(sub, "train_mask", None) is None:
        sub.train_mask = torch.zeros(n, dtype=torch.bool)
    if not bool(sub.train_mask.any()):
        sub.train_mask[0] = True
    return sub


def _units_cpu(model, data, ptr: list[int], repeats: int, fused: bool = True):
    """Measured thread CPU seconds of every unit of ``model`` on the chunks ``ptr`` of ``data`` (the chunk op):
    :class:`~gnnpipe.partitioners.UnitPhases` (forward and backward per unit and chunk)."""
    from ..core.runtime.profile import profile_unit_costs

    return profile_unit_costs(model, data, repeats=repeats, chunk_ptr=torch.tensor(ptr), phases=True,
                              clock=time.thread_time, fused=fused, reduce=REDUCE)


#: how the timed passes of a measurement are reduced: the median (a typical pass, which is what an epoch costs);
#: the minimum of every unit, chunk and phase separately sums to less than any real pass (measured on a quiet
#: machine: predictions 0.6-0.9x of the measured epochs with the minimum, docs/RESULTS.md §14f)
REDUCE = "median"


def _epoch_cpu(executor, repeats: int) -> float:
    """The median thread CPU seconds of ``executor.train_epoch`` over ``repeats`` epochs after one warm-up."""
    executor.train_epoch(0)  # warm-up: allocates history and the autograd buffers
    cpus = []
    for e in range(1, 1 + max(1, repeats)):
        c0 = time.thread_time()
        executor.train_epoch(e)
        cpus.append(time.thread_time() - c0)
    return float(statistics.median(cpus))


def _action_overhead(config, model, sub, ptr: list[int], repeats: int, step_pp: float) -> tuple[float, Any]:
    """Thread CPU seconds per chunk action of the real pipeline runtime beyond its units: one pipeline executor
    (:func:`~gnnpipe.core.runtime.pipeline.make_pipeline_stage`) holding every unit of ``model``, run as a single stage
    (no communication) over the chunks ``ptr`` of the subgraph ``sub`` with the configured correctors and gpipe,
    against the same units measured on the same chunks (:func:`_units_cpu`) and the optimizer step. Measured
    on a subgraph of a few thousand vertices: the units' own cost, which the difference removes, stays small
    there, so the difference is not the noise of a large one (a wide encoder's). Returns ``(seconds per action,
    the units' measured phases)``."""
    import attrs as _attrs

    from .. import correctors as corr
    from ..core.ops.comm import Comm
    from ..core.runtime.pipeline import make_pipeline_stage
    from ..core.training.runner import _order_policy  # no public equivalent: the chunk order the ranks would use
    from ..schedulers import get as get_scheduler

    C = len(ptr) - 1
    cfg = _attrs.evolve(config, stages=1, ways=1, chunks=C, scheduler="gpipe", stash_weights=False)
    correctors = corr.build_correctors(cfg.correctors)
    U = model.num_units
    units = _units_cpu(model, sub, ptr, repeats)
    units_s = sum(sum(f) + sum(b) for f, b in zip(units.forward, units.backward))
    stage = make_pipeline_stage(cfg, model, sub, torch.tensor(ptr), [0, U], 0, [0], get_scheduler("gpipe")(),
                                _order_policy(cfg, correctors), correctors, Comm())
    epoch = _epoch_cpu(stage, repeats)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return max(0.0, (epoch - units_s - step_pp * params) / (2 * C)), units


class _LocalComm:
    """A graph-parallel way's communication without peers (profiling): an exchange fills the receive buffers
    with zeros, an all-reduce returns its input; bytes are not counted."""

    def exchange(self, sends, recvs, tag, kind) -> None:
        for b, _ in recvs:
            b.zero_()

    def all_reduce(self, tensor, group=None, kind: str = "weight"):
        return tensor

    def wait_sends(self) -> None:
        pass


def _gp_overhead(config, make, sub_sizes: Sequence[int], data, repeats: int, step_pp: float,
                 agg_dims: list, back_units: set) -> tuple[float, float, list]:
    """Graph parallelism's bookkeeping beyond its units (:attr:`Profile.gp_op_s`, :attr:`Profile.gp_op_s_per_elem`):
    for each subgraph ``[0, n)`` of the relabelled ``data``, ``n`` in ``sub_sizes``, both ways of a 2-way split at
    ``n/2`` run as the runtime runs them (:func:`~gnnpipe.core.runtime.parallel.make_graph_parallel_way`, the halo op, the
    weight all-reduce and one Adam step) with :class:`_LocalComm`; each way's median epoch CPU time minus the plain
    units measured on the same rows (:func:`_units_cpu` with ``fused=False``) and the step is fitted, by
    non-negative least squares, as ``a · (op directions) + b · Σ (rows + halo) · d`` over the way's aggregation
    ops and directions (forward; backward where the op's input takes a gradient). Returns ``(a, b, points)``."""
    import types

    import attrs as _attrs

    from ..core.runtime.parallel import make_graph_parallel_way

    cfg = _attrs.evolve(config, ways=2, stages=1, chunks=None, correctors=[], scheduler="gpipe", stash_weights=False)
    rows_A, rows_y, points = [], [], []
    for n in sorted({int(v) for v in sub_sizes if v >= 16}, reverse=True):
        sub = _subgraph(data, n)
        ptr = [0, n // 2, n]
        model = make()
        units = _units_cpu(model, sub, ptr, repeats, fused=False)
        feats = chunk_features(sub.edge_index, ptr)
        plan = types.SimpleNamespace(data=sub, chunk_ptr=torch.tensor(ptr), way_ptr=torch.tensor([0, 1, 2]))
        for w in range(2):
            ex = make_graph_parallel_way(cfg, make(), plan, w, _LocalComm(), ranks=[0, 1])
            epoch = _epoch_cpu(ex, repeats)
            own = sum(f[w] + b[w] for f, b in zip(units.forward, units.backward))
            params = sum(p.numel() for p in ex.params)
            dirs = elems = 0.0
            width = float(feats[w][1] + feats[w][2])
            for u, dims in enumerate(agg_dims):
                for d in dims:
                    k = 2 if u in back_units else 1
                    dirs += k
                    elems += k * width * d
            resid = epoch - own - step_pp * params
            rows_A.append([dirs, elems])
            rows_y.append(resid)
            points.append({"rows": n, "way": w, "epoch_s": epoch, "units_s": own, "residual_s": resid})
    return _fit_per_op(rows_A, rows_y, points)


def _peer_rows(edge_index, ptr: list[int], way_ptr: list[int]) -> dict:
    """``{(chunk, backward): rows}`` a hybrid way exchanges for ``chunk`` per op: the rows it sends to the peers
    plus the rows it receives from the peers' chunks of the same slot (:func:`~gnnpipe.core.runtime.parallel.send_lists`)."""
    from ..core.runtime.parallel import send_lists

    W = len(way_ptr) - 1
    rows = [ptr[w] for w in way_ptr]
    way_of = torch.repeat_interleave(torch.arange(W), torch.tensor(np.diff(rows)))
    chunk_of = torch.repeat_interleave(torch.arange(len(ptr) - 1), torch.tensor(np.diff(ptr)))
    out: dict = {}
    for backward in (False, True):
        for (c, q), idx in send_lists(edge_index, chunk_of, way_of, W, backward=backward).items():
            w = int(np.searchsorted(way_ptr, c, side="right") - 1)
            peer = way_ptr[q] + (c - way_ptr[w])  # way q's chunk of the same slot receives them
            out[(c, backward)] = out.get((c, backward), 0) + int(idx.numel())
            out[(peer, backward)] = out.get((peer, backward), 0) + int(idx.numel())
    return out


def _hybrid_overhead(config, make, data, sub_sizes: Sequence[int], repeats: int, step_pp: float, action_s: float,
                     agg_dims: list, back_units: set) -> tuple[float, float, list]:
    """A hybrid's bookkeeping per aggregation op and direction of a chunk action beyond the pipeline's per-action
    cost (:attr:`Profile.hybrid_op_s`, :attr:`Profile.hybrid_op_s_per_elem`): for each subgraph ``[0, n)`` of the
    relabelled ``data``, ``n`` in ``sub_sizes``, both ways of a 2-way, one-stage hybrid over 8 chunks run as the
    runtime runs them (:func:`~gnnpipe.core.runtime.parallel.make_hybrid_member`: the peer op, which gathers the rows it
    sends and writes the peers' rows into history, and the correctors' hooks for the peers' chunks) with
    :class:`_LocalComm`; each way's median epoch CPU time minus its plain units on its chunks (:func:`_units_cpu`
    with ``fused=False``), the step and ``action_s`` per action is fitted, by non-negative least squares, as
    ``a · (op directions) + b · Σ (rows exchanged) · d``. Returns ``(a, b, points)``."""
    import types

    import attrs as _attrs

    from .. import correctors as corr
    from ..core.runtime.parallel import make_hybrid_member
    from ..core.training.runner import _order_policy  # no public equivalent: the chunk order the ranks would use
    from ..schedulers import get as get_scheduler

    rows_A, rows_y, points = [], [], []
    for n in sorted({int(v) for v in sub_sizes if v >= 64}, reverse=True):
        sub = _subgraph(data, n)
        C = 8
        ptr = [round(k * n / C) for k in range(C + 1)]
        way_ptr = [0, C // 2, C]
        cfg = _attrs.evolve(config, ways=2, stages=1, chunks=C, scheduler="gpipe", stash_weights=False)
        units = _units_cpu(make(), sub, ptr, repeats, fused=False)
        peer = _peer_rows(sub.edge_index, ptr, way_ptr)
        for w in range(2):
            model = make()
            plan = types.SimpleNamespace(data=sub, chunk_ptr=torch.tensor(ptr), way_ptr=torch.tensor(way_ptr),
                                         bounds=[0, model.num_units])
            correctors = corr.build_correctors(cfg.correctors)
            ex = make_hybrid_member(cfg, model, plan, w, 0, get_scheduler("gpipe")(), _order_policy(cfg, correctors),
                                    correctors, _LocalComm(), None, None)
            epoch = _epoch_cpu(ex, repeats)
            own = range(way_ptr[w], way_ptr[w + 1])
            units_s = sum(f[c] + b[c] for f, b in zip(units.forward, units.backward) for c in own)
            params = sum(p.numel() for p in ex.params)
            dirs = elems = 0.0
            for c in own:
                for u, dims in enumerate(agg_dims):
                    for d in dims:
                        dirs += 1
                        elems += peer.get((c, False), 0) * d
                        if u in back_units:
                            dirs += 1
                            elems += peer.get((c, True), 0) * d
            resid = epoch - units_s - step_pp * params - 2 * len(own) * action_s
            rows_A.append([dirs, elems])
            rows_y.append(resid)
            points.append({"rows": n, "way": w, "epoch_s": epoch, "units_s": units_s, "residual_s": resid})
    return _fit_per_op(rows_A, rows_y, points)


def _fit_per_op(rows_A: list, rows_y: list, points: list) -> tuple[float, float, list]:
    """``(seconds per op and direction, seconds per exchanged element, points)``: the non-negative least-squares
    fit of the residual seconds ``rows_y`` on ``rows_A = [[directions, elements], …]``, relative (the small
    subgraph counts as much as the large one); ``(0, 0, points)`` when no op was timed."""
    from scipy.optimize import nnls

    if not rows_A or not any(r[0] for r in rows_A):
        return 0.0, 0.0, points
    A, y = np.array(rows_A), np.array(rows_y)
    scale = np.maximum(np.abs(y), 1e-5)
    coef, _ = nnls(A / scale[:, None], y / scale)
    return float(coef[0]), float(coef[1]), points


def _pipeline_rank(rank: int, world: int, config, small_cfg, F: int, Cls: int, sub, ptr: list[int],
                   repeats: int) -> dict:
    """One rank of :func:`_pipeline_overhead`: stage ``rank`` of a 2-stage gpipe pipeline of ``small_cfg``'s
    model over the chunks ``ptr`` of ``sub``, with the configured correctors and real communication; its median
    epoch thread CPU time after one warm-up, and its units."""
    import attrs as _attrs

    from .. import correctors as corr
    from ..core.ops.comm import Comm
    from ..core.runtime.pipeline import make_pipeline_stage
    from ..core.training.runner import _order_policy  # no public equivalent: the chunk order the ranks would use
    from ..core.training.trainer import make_model
    from ..schedulers import get as get_scheduler

    torch.set_num_threads(config.threads)
    model = make_model(small_cfg, F, Cls)
    U = model.num_units
    bounds = [0, U // 2, U]
    cfg = _attrs.evolve(config, stages=2, ways=1, chunks=len(ptr) - 1, scheduler="gpipe", stash_weights=False)
    correctors = corr.build_correctors(cfg.correctors)
    ex = make_pipeline_stage(cfg, model, sub, torch.tensor(ptr), bounds, rank, [0, 1], get_scheduler("gpipe")(),
                             _order_policy(cfg, correctors), correctors, Comm())
    return {"cpu_s": _epoch_cpu(ex, repeats), "units": (bounds[rank], bounds[rank + 1]),
            "params": sum(p.numel() for p in ex.params), "width": ex.stage.output_width() if rank == 0 else 0}


def _pipeline_overhead(config, small_cfg, F: int, Cls: int, sub, ptr: list[int], units, repeats: int,
                       step_pp: float, outs: Optional[list] = None) -> tuple[float, list]:
    """Thread CPU seconds per chunk action of the runtime in a real 2-rank pipeline beyond its units: both stages
    of a 2-stage pipeline over the chunks ``ptr`` of the subgraph ``sub`` run as the runtime runs them
    (:func:`_pipeline_rank`: pre-posted receives, the boundary tensors and their gradients, the sends), each
    rank's median epoch CPU time minus its units measured in this process on the same chunks (``units``) and the
    step, per action; the mean over the ranks (at least 0). Messages are not subtracted here (the caller does,
    with the measured CPU per message). ``outs``: the ranks' results when they already ran (in the link probe's
    ranks, :func:`profile_link`); otherwise 2 ranks are started. Returns ``(seconds per action, per-rank points)``."""
    from ..core.run.launch import spawn

    if outs is None:
        outs = spawn(_pipeline_rank, 2, (config, small_cfg, F, Cls, sub, list(ptr), int(repeats)),
                     timeout_s=config.timeout_s, threads=config.threads)
    C = len(ptr) - 1
    vals = []
    for o in outs:
        lo, hi = o["units"]
        units_s = sum(sum(units.forward[i]) + sum(units.backward[i]) for i in range(lo, hi))
        vals.append((o["cpu_s"] - units_s - step_pp * o["params"]) / (2 * C))
        o["units_s"] = units_s
    outs[0]["rows"] = [b - a for a, b in zip(ptr, ptr[1:])]
    return max(0.0, float(np.mean(vals))), outs


def _time_step(model, config) -> float:
    """Seconds per parameter of one Adam step (the mean of 3 after a warm-up), thread CPU time."""
    from ..core.runtime.stage import make_optimizer_for

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
def _busy(seconds: float) -> None:
    """Spin for ``seconds`` of this thread's CPU time (time the thread is descheduled does not count)."""
    c0 = time.thread_time()
    while time.thread_time() - c0 < seconds:
        pass


#: message sizes (bytes) of the one-way stream of :func:`_probe` (the main thread's CPU per message)
STREAM_SIZES = (65536, 1 << 20, 4 << 20)


def _ping_pong(rank: int, t: torch.Tensor, k: int, pair) -> tuple[list[float], list[float]]:
    """``k`` round trips of ``t`` between ranks 0 and 1 (after a barrier of ``pair`` and one untimed round trip
    that warms the pair up): the one-way wall and main-thread CPU seconds of each (half a round trip)."""
    import torch.distributed as dist

    walls, cpus = [], []
    dist.barrier(group=pair)
    for i in range(k + 1):
        w0, c0 = time.perf_counter(), time.thread_time()
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)
        if i:
            walls.append((time.perf_counter() - w0) / 2)
            cpus.append((time.thread_time() - c0) / 2)
    return walls, cpus


def _probe(rank: int, world: int, sizes: list[int], reps: int, rounds: int, work_s: float, iters: int,
           nbytes: int, stream_sizes: Sequence[int] = STREAM_SIZES, pipe: Optional[tuple] = None) -> dict:
    """One rank of :func:`profile_link`: ranks 0 and 1 ping-pong, then rank 0 streams messages of each of
    ``stream_sizes`` to rank 1 (pre-posted receives; the main thread's CPU per send and per receive, the median of
    3 rounds of :data:`STREAM_MESSAGES`) while the others wait; then, with ``rounds``, every
    rank runs ``rounds + 1`` rounds (the first a warm-up) of each exchange pattern: ``iters`` times ``work_s``
    of busy CPU, then one batched exchange of ``nbytes`` with its ring neighbours (``ring``) or with every other
    rank (``all``). With ``pipe`` (the arguments of :func:`_pipeline_rank` after ``rank, world``), ranks 0 and
    1 then run that 2-stage pipeline (:func:`_pipeline_overhead`). Returns the medians of the ping-pong and each
    round's wall and main-thread CPU seconds (and ``"pipeline"``: the pipeline rank's result)."""

    import torch.distributed as dist
    import torch_geometric.data  # noqa: F401  (a rank unpickles a PyG Data: the floor includes PyG)

    from ..core.runtime import parallel, pipeline  # noqa: F401  (what a training rank imports)

    from ..core.training import runner

    from ..core.runtime.metrics import peak_memory_bytes

    out: dict = {"p2p": [], "allreduce": [], "floor": peak_memory_bytes(torch.device("cpu")), "ring": [], "all": [],
                 "stream": []}
    pair = dist.new_group([0, 1]) if world > 2 else None  # every rank takes part in making the group
    if rank < 2:
        for n in sizes:
            t = torch.zeros(max(1, n // 4), dtype=torch.float32)
            k = max(3, 3 * reps if n <= (1 << 16) else reps if n <= (1 << 20) else reps // 4)
            walls, cpus = _ping_pong(rank, t, k, pair)
            out["p2p"].append((t.numel() * 4, statistics.median(walls), statistics.median(cpus)))
            walls, cpus = [], []
            dist.barrier(group=pair)
            for i in range(k + 1):
                w0, c0 = time.perf_counter(), time.thread_time()
                dist.all_reduce(t, group=pair)
                if i:
                    walls.append(time.perf_counter() - w0)
                    cpus.append(time.thread_time() - c0)
            out["allreduce"].append((t.numel() * 4, statistics.median(walls), statistics.median(cpus)))
    if rank < 2:  # a one-way stream, as a pipeline sends: the main thread's CPU per send and per receive
        for n in stream_sizes:
            t = torch.zeros(max(1, n // 4), dtype=torch.float32)
            bufs = [torch.empty_like(t) for _ in range(STREAM_MESSAGES)]
            per = []
            for r in range(3):
                dist.barrier(group=pair)
                cpu = 0.0
                if rank == 0:
                    works = []
                    for k in range(STREAM_MESSAGES):
                        _busy(0.001)
                        c0 = time.thread_time()
                        works.append(dist.isend(t, 1, tag=k))
                        cpu += time.thread_time() - c0
                    c0 = time.thread_time()
                    for work in works:
                        work.wait()
                    cpu += time.thread_time() - c0
                else:
                    works = [dist.irecv(bufs[k], 0, tag=k) for k in range(STREAM_MESSAGES)]
                    for work in works:
                        c0 = time.thread_time()
                        work.wait()
                        cpu += time.thread_time() - c0
                per.append(cpu / STREAM_MESSAGES)
            out["stream"].append((t.numel() * 4, statistics.median(per)))
    if rank < 2 and sizes:  # the smallest message once more: a transient (a rank still starting) is not the latency
        t = torch.zeros(max(1, sizes[0] // 4), dtype=torch.float32)
        walls, _ = _ping_pong(rank, t, 3 * reps, pair)
        b0, w_0, c_0 = out["p2p"][0]
        out["p2p"][0] = (b0, min(w_0, statistics.median(walls)), c_0)
    dist.barrier()
    if rounds > 0:
        send = torch.zeros(max(1, nbytes // 4))
        bufs = [torch.empty_like(send) for _ in range(world)]
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        for pattern in ("ring", "all"):
            peers = [q for q in range(world) if q != rank] if pattern == "all" else [nxt]
            sources = [q for q in range(world) if q != rank] if pattern == "all" else [prv]
            for r in range(rounds + 1):
                dist.barrier()
                w0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(iters):
                    _busy(work_s)
                    ops = ([dist.P2POp(dist.isend, send, q) for q in peers]
                           + [dist.P2POp(dist.irecv, bufs[q], q) for q in sources])
                    for work in dist.batch_isend_irecv(ops):
                        work.wait()
                if r:
                    out[pattern].append((time.perf_counter() - w0, time.thread_time() - c0))
    dist.barrier()
    if pipe is not None and rank < 2:
        out["pipeline"] = _pipeline_rank(rank, 2, *pipe)
    dist.barrier()
    return out


class _Paused(Exception):
    """Raised by a co-runner's clock when it is told to pause (ends its pass at the next unit)."""


def _co_runner(one_pass, threads: int, run, stop, ready) -> None:
    """A forked co-runner of :func:`measure_contention`: ``one_pass(clock)`` while ``run`` is set, abandoned at
    the next unit when it is cleared, until ``stop`` is set."""
    torch.set_num_threads(threads)

    def clock() -> float:
        if stop.is_set() or not run.is_set():
            raise _Paused
        return time.thread_time()

    ready.set()
    while not stop.is_set():
        if not run.wait(0.05):
            continue
        try:
            one_pass(clock)
        except _Paused:
            pass


def measure_contention(model, data, ptr: list[int], repeats: int = 3, *, processes: Optional[int] = None,
                       threads: int = 1, timeout_s: float = 120.0) -> tuple[Optional[list], int]:
    """How much slower ``model``'s units run on the chunks ``ptr`` of ``data`` while the node's other cores run the
    same passes: ``(ratios, processes)`` — ``ratios[i] = (forward, backward)`` of unit ``i``, loaded over alone —
    or ``(None, 0)`` where it cannot be measured.

    ``processes − 1`` co-runners (default: this machine's cores, so that every core computes) are forked — they
    share the graph and the model with this process, nothing is copied — and run the passes of
    :func:`gnnpipe.core.runtime.profile.profile_unit_costs` (a gpipe stage's order, the history-backed chunk op with
    full-graph history buffers) on the chunks of ``ptr`` whenever they are told to. This process then times,
    ``repeats`` times, one pass alone and one pass with the co-runners running, back to back (thread CPU of every
    unit on every chunk), so that the machine's drift, which on a shared VM is larger
    than the effect within minutes, cancels in each pair; a ratio is the median over the pairs of the unit's
    summed chunk seconds. What it measures is what ranks of one node do to each other when they compute at once:
    they share the last level cache and the memory bandwidth (on this 2-core VM 1.0–1.15×, with the host's load;
    a dense unit's matrix products barely slow, a sparse product and the element-wise ops do). With ``processes``
    above the cores they are also time-sliced, and a process switched back in finds its data evicted (4 on the 2
    cores here: 1.06–1.31× forward, 1.16–1.59× backward); the core time a blocking wait costs is modelled apart
    (:func:`~gnnpipe.costmodel.predict.shared_cores_bound`). Source: docs/RESULTS.md §14i.

    Not measured (``(None, 0)``): fewer than 2 cores, no ``fork`` start method (not Linux), a co-runner that did
    not start within ``timeout_s``.
    """
    import multiprocessing as mp
    import sys

    from ..core.ops.graph import GraphOps
    from ..core.runtime.profile import _chunk_aggregators, _chunk_major_pass

    procs_n = int(processes or cores_here())
    if procs_n < 2 or not sys.platform.startswith("linux") or "fork" not in mp.get_all_start_methods():
        return None, 0
    n = int(data.x.size(0))
    ranges = list(zip(ptr, ptr[1:]))
    ops = GraphOps(data.edge_index, n, dtype=data.x.dtype, edge_weight=getattr(data, "edge_weight", None))
    aggregator = _chunk_aggregators(ops, ranges, n, True)  # full-graph history buffers, as in a stage
    units = list(model.units)
    U = len(units)
    params = list(model.parameters())
    saved_grads = [q.grad for q in params]
    was_training = model.training

    def one_pass(clock) -> tuple[list[float], list[float]]:
        fw = [[0.0] * len(ranges) for _ in units]
        bw = [[0.0] * len(ranges) for _ in units]
        try:
            _chunk_major_pass(units, data.x, ranges, aggregator, clock, fw, bw)
        finally:
            for q in params:
                q.grad = None
        return [sum(f) for f in fw], [sum(b) for b in bw]

    ctx = mp.get_context("fork")
    run, stop = ctx.Event(), ctx.Event()
    readies = [ctx.Event() for _ in range(procs_n - 1)]
    pairs: list[tuple] = []
    procs: list = []
    try:
        for q in params:
            q.grad = None
        model.train()
        # forked with the model in training mode and no .grad: the co-runners' passes are this process's
        procs += [ctx.Process(target=_co_runner, args=(one_pass, int(threads), run, stop, r), daemon=True)
                  for r in readies]
        for pr in procs:
            pr.start()
        deadline = time.monotonic() + float(timeout_s)
        for r, pr in zip(readies, procs):
            while not r.wait(0.2):
                if not pr.is_alive() or time.monotonic() > deadline:
                    return None, 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            one_pass(time.thread_time)  # warm-up (allocates the scratch history)
            for _ in range(max(1, int(repeats))):
                alone = one_pass(time.thread_time)
                run.set()
                time.sleep(0.01)  # the co-runners start a pass
                loaded = one_pass(time.thread_time)
                run.clear()
                pairs.append((alone, loaded))
    finally:
        stop.set()
        run.clear()
        for pr in procs:
            pr.join(timeout=60)
            if pr.is_alive():  # pragma: no cover - a co-runner stuck in a unit
                pr.kill()
                pr.join(timeout=10)
        for q, g in zip(params, saved_grads):
            q.grad = g
        model.train(was_training)

    def ratio(i: int, ph: int) -> float:
        rs = [lo[ph][i] / al[ph][i] for al, lo in pairs if al[ph][i] > 0]
        return float(statistics.median(rs)) if rs else 1.0

    return [(ratio(i, 0), ratio(i, 1)) for i in range(U)], procs_n


def _fit_link(points: list[tuple[int, float, float]], col: int = 1) -> Link:
    """``t = latency + bytes / bandwidth`` of column ``col``: the latency is the time of the smallest message,
    the bandwidth the least-squares slope of the others' excess over it (robust to one erratic size, which a
    free fit of both turns into a latency of milliseconds); both clipped to be physical."""
    pts = sorted((float(p[0]), float(p[col])) for p in points)
    lat = max(0.0, pts[0][1])
    b = np.array([q[0] for q in pts[1:]])
    t = np.array([q[1] - lat for q in pts[1:]])
    inv_bw = float((b @ t) / (b @ b)) if b.size and float(b @ b) > 0 else 0.0
    if inv_bw <= 0:
        inv_bw = max(pts[-1][1], 1e-12) / max(pts[-1][0], 1.0)
    return Link(latency_s=lat, bandwidth_Bps=1.0 / inv_bw)


def cores_here() -> int:
    """CPU cores this process may run on (``sched_getaffinity``, else ``os.cpu_count()``)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def switch_costs(ring: Sequence[Sequence[Sequence[float]]], every: Sequence[Sequence[Sequence[float]]], cores: int,
                 work_s: float, iters: int) -> tuple[float, float]:
    """``(switch_s, switch_peer_s)`` from the exchange rounds of :func:`_probe` (per rank, per round, ``(wall,
    main-thread CPU)``; ``ring``: one peer per exchange, ``every``: all ``R − 1``).

    A round on ``R`` ranks over ``cores`` cores (``R > cores``) gives the core time it did not spend on the ranks'
    main threads, ``cores · wall − Σ main-thread CPU``, lost to the exchanges: the transport's threads, the
    switches between ranks, and cores left idle while the ranks that could run wait for a message. Per wait of a
    rank that is ``(cores · wall − Σ CPU) / (R · iters)``; the median over rounds is kept. ``switch_peer_s`` is
    the extra per further peer: ``(δ_all − δ_ring) / (R − 2)`` (0 for ``R = 2``). Both are clipped at 0.
    """

    R = len(ring)

    def per_wait(rounds_by_rank) -> float:
        n = min(len(r) for r in rounds_by_rank)
        vals = []
        for k in range(n):
            wall = max(r[k][0] for r in rounds_by_rank)
            cpu = sum(r[k][1] for r in rounds_by_rank)
            vals.append((cores * wall - cpu) / (R * iters))
        return max(0.0, statistics.median(vals)) if vals else 0.0

    d_ring = per_wait(ring)
    d_all = per_wait(every) if R > 2 else d_ring
    return d_ring, (max(0.0, (d_all - d_ring) / (R - 2)) if R > 2 else 0.0)


#: messages per round of the one-way stream of :func:`_probe`
STREAM_MESSAGES = 12

#: the exchange probe: busy CPU per iteration, iterations per round, rounds per pattern, bytes per message
SWITCH_PROBE = {"work_s": 0.002, "iters": 25, "rounds": 3, "nbytes": 65536}


def profile_link(backend: str = "gloo", sizes: Sequence[int] = (4, 65536, 1 << 20, 8 << 20), reps: int = 10,
                 timeout_s: float = 60.0, ranks: int = 2, pipeline: Optional[tuple] = None) -> tuple[Link, Link, dict]:
    """Measure the link between two local ranks over ``backend``: ``(p2p, allreduce, raw points)``.

    ``p2p``: one-way time of a message (half a round trip; the median of ``reps`` round trips per size);
    ``allreduce``: the per-hop link of a ring all-reduce (for two ranks an all-reduce takes
    ``2·(latency + bytes/2/bandwidth)``, so the fitted ``t = a + bytes/bw`` gives ``Link(a/2, bw)``).
    ``raw``: ``{"p2p": [(bytes, wall_s, thread_cpu_s)…], "allreduce": […], "floor": peak resident bytes of a rank
    before any data, "msg_cpu": (s, s per byte) — the main thread's CPU per message op,
    "stream": {"send": [(bytes, s)…], "recv": […]} the one-way stream's CPU per message, "cores", "ranks",
    "switch": (switch_s, switch_peer_s) or None}``. ``msg_cpu`` is fitted on the stream (the mean of a send and a
    receive: a rank does both alike).

    With ``ranks`` greater than this machine's cores, that many ranks are started and, after the ping-pong of
    ranks 0 and 1, all of them run the exchange probe (:data:`SWITCH_PROBE`, :func:`switch_costs`): the core time
    a rank's blocking wait costs when ranks share cores.

    Raises:
        DistributedError: a rank failed.
    """
    from ..core.run.launch import spawn

    cores = cores_here()
    world = max(2, int(ranks))
    rounds = SWITCH_PROBE["rounds"] if world > cores else 0
    outs = spawn(_probe, world, (list(sizes), int(reps), rounds, SWITCH_PROBE["work_s"], SWITCH_PROBE["iters"],
                                 SWITCH_PROBE["nbytes"], STREAM_SIZES, pipeline), backend=backend,
                 timeout_s=timeout_s, threads=1)
    raw = dict(outs[0])
    p2p = _fit_link(raw["p2p"])
    ar2 = _fit_link(raw["allreduce"])
    # ring all-reduce of G=2: 2(G-1)=2 steps of bytes/2 → t = 2·lat + bytes/bw: per-hop latency lat, bandwidth bw
    allreduce = Link(latency_s=ar2.latency_s / 2, bandwidth_Bps=ar2.bandwidth_Bps)
    # a message costs its sender's main thread (the copy into the transport, on loopback also its delivery) and
    # its receiver's (the wait); a rank sends and receives alike, so a message op (send or receive) costs the mean
    sends = [(b, c) for b, c in outs[0]["stream"]]
    recvs = [(b, c) for b, c in outs[1]["stream"]]
    both = [(b, 0.0, (cs + cr) / 2) for (b, cs), (_, cr) in zip(sends, recvs)]
    cpu = _fit_link(both, col=2) if both else _fit_link(raw["p2p"], col=2)
    raw["msg_cpu"] = (cpu.latency_s, 1.0 / cpu.bandwidth_Bps)
    raw["stream"] = {"send": sends, "recv": recvs}
    raw["cores"], raw["ranks"] = cores, world
    raw["switch"] = (switch_costs([o["ring"] for o in outs], [o["all"] for o in outs], cores,
                                  SWITCH_PROBE["work_s"], SWITCH_PROBE["iters"]) if rounds else None)
    raw.pop("ring", None)
    raw.pop("all", None)
    if pipeline is not None:
        raw["pipeline"] = [o["pipeline"] for o in outs[:2]]
    return p2p, allreduce, raw


#: the :class:`Profile` fields the link probe sets (:func:`link_fields`)
LINK_FIELDS = ("p2p", "allreduce", "runtime_floor_bytes", "msg_cpu_s", "msg_cpu_s_per_byte", "switch_s",
               "switch_peer_s", "switch_ranks")


def link_fields(p2p: Link, allreduce: Link, raw: dict) -> dict:
    """The :data:`LINK_FIELDS` of a :class:`Profile` from :func:`profile_link`'s result (pass it to :func:`profile`
    as ``link_result`` to profile several jobs with one probe)."""
    sw = raw.get("switch")
    a, b = raw.get("msg_cpu", (0.0, 0.0))
    return {"p2p": p2p, "allreduce": allreduce, "runtime_floor_bytes": int(raw.get("floor", 0)),
            "msg_cpu_s": float(a), "msg_cpu_s_per_byte": float(b), "switch_s": float(sw[0]) if sw else 0.0,
            "switch_peer_s": float(sw[1]) if sw else 0.0, "switch_ranks": int(raw.get("ranks", 0)) if sw else 0}


# ---------------------------------------------------------------------------------------------- profile
def profile(config, data, *, repeats: int = 3, chunk_counts: Sequence[int] = (16, 4, 2), link: bool = True,
            link_result: Any = None, ranks: Optional[int] = None, sample_nodes: int = 4096,
            distributed: Optional[bool] = None, contention: bool = True, verbose: bool = False) -> Profile:
    """Profile ``config``'s model on ``data`` (a prepared PyG ``Data``) on this machine.

    Args:
        config: a resolved :class:`~gnnpipe.core.settings.config.TrainConfig` (model, layers, hidden, dtype, threads).
        data: the prepared graph (``gnnpipe.api.load_data``).
        repeats: timed passes per measurement (the median is kept, :data:`REDUCE`).
        chunk_counts: chunkings to time (the first is a METIS chunk plan; the others merge its chunks and must
            divide it).
        link: measure the link (and the runtime floor of a rank) with a ping-pong of 2 ranks (a few seconds);
            with ``ranks`` above this machine's cores, that many ranks also measure what a wait costs when they
            share the cores (:func:`profile_link`). ``link_result``: a dict of :data:`LINK_FIELDS`
            (:func:`link_fields`, or another profile's :meth:`Profile.link_result`), or the older tuple
            ``(p2p, allreduce[, floor_bytes])``, gives them instead.
        sample_nodes: vertices of the subgraph the runtime's per-action and graph-parallel bookkeeping are
            measured on.
        distributed: measure the pipeline's cost per chunk action in a real 2-rank pipeline on that subgraph
            (:func:`_pipeline_overhead`, a few seconds to start the ranks); default: when the link is measured or
            given. Otherwise it is measured in this process (:func:`_action_overhead`), without communication.
        contention: time the first chunking again while the machine's other cores run the same passes
            (:func:`measure_contention`; the units' ``contended_*`` ratios), which the prediction applies to ranks
            that compute at the same time on one CPU node; with ``ranks`` above the cores, also with ``ranks``
            processes at once (``oversubscribed_*``).

    Returns:
        a :class:`Profile`.

    Raises:
        ConfigError: a chunk count that does not divide the first, or more chunks than vertices.
    """
    from scipy.optimize import nnls

    from ..core.training.runner import num_classes_of
    from ..partitioners import ChunkPlan
    from ..core.runtime.profile import profile_unit_costs

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
        dtype = next(model.parameters()).dtype
        # the whole graph in one process, in the order the single process trains it (data as given), first: the
        # chunked passes below leave this process's allocator in a state in which training is slower than in the
        # fresh process a single-process run is (Cora, GCNII-16: 60-67 ms per epoch before, 75-90 ms after)
        wall_total, cpu_total = 0.0, 0.0
        whole_data = data.clone() if hasattr(data, "clone") else data
        whole_data.x = data.x.to(dtype)
        w0, c0 = time.perf_counter(), time.thread_time()
        # a small graph's pass is cheap: more repeats, since a process's first passes are slower than its later ones
        small = N * (F + config.hidden * len(full.units)) < 5e7
        whole = profile_unit_costs(model, whole_data, repeats=repeats + (2 if small else 0), phases=True,
                                   clock=time.thread_time, reduce=REDUCE)
        wall_total += time.perf_counter() - w0
        cpu_total += time.thread_time() - c0
        del whole_data
        plan = ChunkPlan.build(data, base, config.partitioner, over=config.over_partition, seed=config.seed)
        rdata = plan.data
        rdata.x = rdata.x.to(dtype)
        ptr = [int(v) for v in plan.chunk_ptr.tolist()]
        levels: list[tuple[np.ndarray, Any, int]] = []  # (features [C, 4], UnitPhases, C)
        for C in sorted({min(int(c), base) for c in chunk_counts}, reverse=True):
            if C < 1:
                continue
            step = base // C if base % C == 0 else 1
            cptr = ptr[::step] if ptr[::step][-1] == N else ptr[::step] + [N]
            w0, c0 = time.perf_counter(), time.thread_time()
            ph = profile_unit_costs(model, rdata, repeats=repeats, chunk_ptr=torch.tensor(cptr), phases=True,
                                    clock=time.thread_time, reduce=REDUCE)
            wall_total += time.perf_counter() - w0
            cpu_total += time.thread_time() - c0
            levels.append((chunk_features(rdata.edge_index, cptr), ph, len(cptr) - 1))
        # how much of the wall time this thread ran (a busy machine: < 1); reported, not applied
        ratio = min(1.0, cpu_total / wall_total) if wall_total > 0 else 1.0
        whole_feats = np.array([[1.0, N, 0.0, float(data.edge_index.size(1))]])
        X = np.concatenate([f for f, _, _ in levels] + [whole_feats])
        kinds: dict[str, Any] = {}
        errs = []
        saved_per_unit = saved_bytes(model, rdata, ptr[0], ptr[1])
        rows0 = ptr[1] - ptr[0]
        for key, i in rep.items():
            fits, scales = [], []
            for attr in ("forward", "backward"):
                per_level = [getattr(ph, attr)[i] for _, ph, _ in levels]
                whole_t = getattr(whole, attr)[i][0]
                y = np.array([t for ts in per_level for t in ts] + [whole_t])
                # weight rows so that big and small chunks count alike (relative error)
                wts = 1.0 / np.maximum(y, 1e-6)
                coef, _ = nnls(X * wts[:, None], y * wts)
                pred = X @ coef
                errs.extend(((pred - y) / np.maximum(y, 1e-9)).tolist())
                # the size factor of each chunking: measured / fitted, at its mean chunk rows
                pts = []
                for (feats, _, C), ts in zip(levels, per_level):
                    fit = float((feats @ coef).sum())
                    if fit > 0:
                        pts.append([N / C, float(sum(ts)) / fit])
                fit_w = float(whole_feats[0] @ coef)
                if fit_w > 0:
                    pts.append([float(N), whole_t / fit_w])
                fits.append([float(c) for c in coef])
                scales.append(pts)
            u = model.units[i]
            kinds[key] = UnitKind(key=key, forward=fits[0], backward=fits[1],
                                  whole_forward_s=float(whole.forward[i][0]),
                                  whole_backward_s=float(whole.backward[i][0]),
                                  saved_bytes_per_row=saved_per_unit[i] / max(rows0, 1),
                                  params=int(sum(p.numel() for p in u.parameters())),
                                  scale_forward=scales[0], scale_backward=scales[1])
        contention_ranks = over_ranks = 0
        if contention:  # the base chunking, alone and with every other core running the same passes
            ratios, contention_ranks = measure_contention(model, rdata, ptr, repeats, threads=config.threads,
                                                          timeout_s=config.timeout_s)
            over = None
            if contention_ranks and ranks is not None and int(ranks) > contention_ranks:
                # more ranks than cores: the same with as many processes as ranks, time-sliced
                over, over_ranks = measure_contention(model, rdata, ptr, repeats, processes=int(ranks),
                                                      threads=config.threads, timeout_s=config.timeout_s)
            for key, i in rep.items():
                # clipped at 1 (sharing cannot speed a unit up: a lower ratio is noise), and time-slicing at the
                # ratio of the cores alone
                if ratios is not None:
                    kinds[key].contended_forward = max(1.0, ratios[i][0])
                    kinds[key].contended_backward = max(1.0, ratios[i][1])
                if over is not None:
                    kinds[key].oversubscribed_forward = max(kinds[key].contended_forward, over[i][0])
                    kinds[key].oversubscribed_backward = max(kinds[key].contended_backward, over[i][1])
        step = _time_step(full, config)
        # the runtime's own costs, measured on a subgraph of the relabelled graph (its first chunks)
        n_sub = min(N, int(sample_nodes))
        sub = _subgraph(rdata, n_sub)
        C_sub = max(1, min(8, n_sub // 8))
        sptr = [round(k * n_sub / C_sub) for k in range(C_sub + 1)]
        overhead, fused_ph = _action_overhead(config, model, sub, sptr, repeats, step)
        # the plain path of units that fuse their chunk step (a hybrid's peer op, graph parallelism runs it), against
        # the fused step, on the subgraph's chunks
        if any(getattr(model.units[i], "fusable", False) for i in rep.values()):
            plain_ph = _units_cpu(model, sub, sptr, repeats, fused=False)
            for key, i in rep.items():
                if getattr(model.units[i], "fusable", False):
                    f_s = sum(fused_ph.forward[i]) + sum(fused_ph.backward[i])
                    p_s = sum(plain_ph.forward[i]) + sum(plain_ph.backward[i])
                    kinds[key].unfused = float(p_s / f_s) if f_s > 0 else 1.0
        from ..core.training.trainer import make_model

        small_cfg = attrs.evolve(config, layers=min(config.layers, 2)) if model is not full else config  # as _representatives
        back = {u for u, _, _ in model.backward_aggregation_dims()}
        agg_dims = [[int(getattr(u, "agg_dim", u.in_dim))] * len(u.aggregations) for u in model.units]
        if distributed is None:
            distributed = bool(link or link_result is not None)
        distributed = distributed and model.num_units >= 2
        pipe_args = (config, small_cfg, F, Cls, sub, list(sptr), int(repeats)) if distributed else None
        gp_a, gp_b, _ = _gp_overhead(config, lambda: make_model(small_cfg, F, Cls), (n_sub, n_sub // 4), rdata,
                                     repeats, step, agg_dims, back)
        hyb, hyb_b, _ = _hybrid_overhead(config, lambda: make_model(small_cfg, F, Cls), rdata, (n_sub, n_sub // 4),
                                         repeats, step, overhead, agg_dims, back)
    finally:
        torch.set_num_threads(threads_before)
    fields: dict = {}
    if isinstance(link_result, dict):
        fields = {k: link_result[k] for k in LINK_FIELDS if k in link_result}
    elif link_result is not None:
        fields = {"p2p": link_result[0], "allreduce": link_result[1],
                  "runtime_floor_bytes": int(link_result[2]) if len(link_result) > 2 else 0}
    dist_outs = None
    if link_result is None and link:
        # one start of ranks: the link probe's ranks 0 and 1 also run the 2-stage pipeline
        p2p, ar, raw = profile_link(timeout_s=config.timeout_s, ranks=int(ranks or 2), pipeline=pipe_args)
        fields = link_fields(p2p, ar, raw)
        dist_outs = raw.get("pipeline")
    dist_points = None
    if pipe_args is not None:
        # the runtime's cost per action as a 2-rank pipeline runs it (with communication), on the same chunks
        overhead, dist_points = _pipeline_overhead(*pipe_args[:6], fused_ph, repeats, step, outs=dist_outs)
    if dist_points is not None and fields.get("msg_cpu_s") is not None:
        # a rank of the probe sent or received one boundary tensor (or its gradient) per action: modelled apart
        rows = float(np.mean(dist_points[0]["rows"]))
        nbytes = rows * dist_points[0]["width"] * torch.finfo(next(full.parameters()).dtype).bits // 8
        overhead = max(0.0, overhead - (fields.get("msg_cpu_s", 0.0) + nbytes * fields.get("msg_cpu_s_per_byte", 0.0)))
    dtype_bytes = torch.finfo(next(full.parameters()).dtype).bits // 8
    prof = Profile(
        unit_kinds=kinds, **_model_fields(full, data, F, Cls), step_s_per_param=step, dtype_bytes=dtype_bytes,
        threads=config.threads, cpu_over_wall=ratio,
        fit_error=float(math.sqrt(np.mean(np.square(errs)))) if errs else 0.0,
        action_overhead_s=overhead, gp_op_s=gp_a, gp_op_s_per_elem=gp_b, hybrid_op_s=hyb, hybrid_op_s_per_elem=hyb_b,
        contention_ranks=contention_ranks, oversubscribed_ranks=over_ranks, **fields,
    )
    prof.profile_s = time.perf_counter() - t_start
    if verbose:
        sw = (f", a wait with ranks sharing cores {1e3 * prof.switch_s:.2f} ms (+{1e3 * prof.switch_peer_s:.2f} ms "
              f"per further peer)" if prof.switch_ranks else "")
        ct = (", with " + str(prof.contention_ranks) + " cores computing at once the units take " + ", ".join(
              f"{k.contended_forward:.2f}/{k.contended_backward:.2f}x" for k in kinds.values()) + " (F/B)"
              if prof.contention_ranks else "")
        if prof.oversubscribed_ranks:
            ct += (f", with {prof.oversubscribed_ranks} processes on them " + ", ".join(
                f"{k.oversubscribed_forward:.2f}/{k.oversubscribed_backward:.2f}x" for k in kinds.values()))
        print(f"profile: {len(kinds)} unit kind(s), fit RMS error {prof.fit_error:.1%}, runtime overhead "
              f"{1e3 * overhead:.2f} ms per chunk action, graph-parallel bookkeeping {1e6 * gp_a:.0f} us per op + "
              f"{1e9 * gp_b:.2f} ns per element, hybrid {1e6 * hyb:.0f} us per op + {1e9 * hyb_b:.2f} ns per element{sw}{ct}, thread CPU / wall {ratio:.2f}, {prof.profile_s:.1f} s")
    return prof


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
    from torch_geometric.data import Data
    from torch_geometric.utils import subgraph

    from ..core.training.runner import num_classes_of

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
