"""The profile the cost model predicts from (:class:`Profile`: one :class:`UnitKind` per kind of layer unit, the
runtime's own costs, the link), saved and loaded as JSON, and the chunk features its cost fits use.

A unit kind's forward and backward seconds of one chunk are ``t = a + b·rows + c·halo + e·nnz``
(:data:`FEATURES`, :func:`chunk_features`, :func:`part_features`), scaled by the measured size factor at the
chunk's rows (:func:`size_factor`). What is measured, and how: :mod:`gnnpipe.tasks.nodes.cost.profile`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from .....costmodel.hardware import Link
from .....errors import ConfigError
from ...runner import num_classes_of
from ...trainer import make_model

#: chunk feature names of the cost fits
FEATURES = ("one", "rows", "halo", "nnz")


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
            runs the same chunk passes, over the seconds alone (``measure_contention``; 1.0: not measured).
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
        cpu_over_wall: thread CPU / wall over the timed profile passes.
        fit_error: relative RMS error of the time fits over the measured chunks (before the size factors).
        profile_s: seconds the profile took.
        runtime_floor_bytes: resident bytes of a rank before it holds data.
        action_overhead_s: thread CPU seconds of the runtime per pipeline chunk action beyond its units.
        executor_scale: the pipeline executor's unit time over the fitted (``UnitKind.time``), measured on the
            whole graph's base chunking with the full model as one stage (``_executor_scale``); a pipeline's
            fused unit times are multiplied by it (1.0: not measured, older profiles).
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
            ``switch_ranks`` ranks on this machine's cores (0: not measured); see ``measure_link``.
        switch_byte_s: likewise, core seconds lost per byte a rank sends (the transport's threads and the kernel
            moving it; ``gnnpipe.tasks.nodes.cost.profile.switch_byte_cost``; 0: not measured).
        switch_curve: ``[(busy seconds, switch_s)…]``: the lost core time per wait measured after bursts of compute
            of each length (``[]``: only ``switch_s``); ``gnnpipe.tasks.nodes.cost.host_costs.shared_cores_bound``
            uses the point of each rank's own compute per wait.
        host_exchange: the wall time of one batched exchange both ways between two ranks of this machine after a
            burst of compute, as graph parallelism's and a hybrid's peer ops run it (``latency + bytes each way /
            bandwidth``; ``None``: not measured). On a CPU node no exchange is faster than this, whatever the
            link (``gnnpipe.tasks.nodes.cost.epoch_time.predict_time``).
        spread, link_spread: per timed quantity, how much slower a typical repeat was than the figure kept (the
            75th percentile of its repeats over the statistic used, less 1; :mod:`.robust`): ``spread`` for what
            :func:`profile` measures in this process (``units``, ``step``, ``executor``, ``unfused``, ``action``,
            ``gp``, ``hybrid``, ``contention``), ``link_spread`` for the link probe's (``p2p``, ``allreduce``,
            ``msg_cpu``, ``exchange``, ``switch``). :data:`SPREAD_GROUPS` gathers them; :meth:`raised` is the
            profile with a quantity, or a group, at its spread. Empty: not recorded (a profile saved before they were).
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
    p2p: Link | None = None
    allreduce: Link | None = None
    threads: int = 1
    cpu_over_wall: float = 1.0
    fit_error: float = 0.0
    profile_s: float = 0.0
    runtime_floor_bytes: int = 0
    action_overhead_s: float = 0.0
    executor_scale: float = 1.0
    gp_op_s: float = 0.0
    gp_op_s_per_elem: float = 0.0
    hybrid_op_s: float = 0.0
    hybrid_op_s_per_elem: float = 0.0
    msg_cpu_s: float = 0.0
    msg_cpu_s_per_byte: float = 0.0
    switch_s: float = 0.0
    switch_peer_s: float = 0.0
    switch_byte_s: float = 0.0
    switch_ranks: int = 0
    switch_curve: list = attrs.field(factory=list)
    host_exchange: Link | None = None
    contention_ranks: int = 0
    oversubscribed_ranks: int = 0
    spread: dict = attrs.field(factory=dict)
    link_spread: dict = attrs.field(factory=dict)
    notes: str = ""
    #: What the memory model measured of this (graph, model) pair, filled on first use; per role the bytes per
    #: row of ``gnnpipe.tasks.nodes.cost.footprint.RoleFootprint``, and the graph's symmetry.
    footprints: dict = attrs.field(factory=dict)

    def kind(self, unit: int) -> UnitKind:
        return self.unit_kinds[self.units[unit]]

    def stage_time(self, lo: int, hi: int, feats: np.ndarray, phase: str, fused: bool = True,
                   contended: float = 0.0) -> float:
        """Fitted seconds of units ``[lo, hi)`` on a chunk with ``feats`` (``fused=False``: the plain path;
        ``contended``: as ``UnitKind.time``)."""
        return sum(self.kind(u).time(feats, phase, fused, contended) for u in range(lo, hi))

    def link_result(self) -> dict:
        """This profile's ``LINK_FIELDS`` (``profile(..., link_result=…)`` reuses them for another job)."""
        return {k: getattr(self, k) for k in LINK_FIELDS}

    def spreads(self) -> dict:
        """Every recorded spread, ``{quantity: spread}`` (:attr:`spread` and :attr:`link_spread`)."""
        return {**{k: float(v) for k, v in self.spread.items()}, **{k: float(v) for k, v in self.link_spread.items()}}

    def group_spread(self, group: str) -> float:
        """The largest spread of the quantities of ``group`` (:data:`SPREAD_GROUPS`; 0 when none is recorded)."""
        got = self.spreads()
        return max([got.get(q, 0.0) for q in SPREAD_GROUPS[group]] + [0.0])

    def raised(self, name: str) -> Profile:
        """A copy of this profile with a timed quantity (a key of :meth:`spreads`), or every quantity of a group of
        :data:`SPREAD_GROUPS`, at the high end of its spread: seconds times ``1 + spread`` (a link's latency, and
        its time per byte), the contention ratios likewise. Predicting from it tells how far the noise of those
        measurements moves a prediction."""
        f = {q: 1.0 + max(0.0, float(v)) for q, v in self.spreads().items()}
        known = {q for qs in SPREAD_GROUPS.values() for q in qs}
        if name not in SPREAD_GROUPS and name not in known:
            raise ValueError(f"unknown spread quantity or group {name!r}; one of {', '.join(SPREAD_GROUPS)}, "
                             f"{', '.join(sorted(known))}")
        qs = set(SPREAD_GROUPS.get(name, (name,)))

        def k(q: str) -> float:
            return f.get(q, 1.0) if q in qs else 1.0

        def link(v: Link | None, q: str) -> Link | None:
            if v is None:
                return None
            return attrs.evolve(v, latency_s=v.latency_s * k(q), bandwidth_Bps=v.bandwidth_Bps / k(q),
                                exchange_Bps=None if v.exchange_Bps is None else v.exchange_Bps / k(q))

        kinds = {key: attrs.evolve(
            u, forward=[c * k("units") for c in u.forward], backward=[c * k("units") for c in u.backward],
            whole_forward_s=u.whole_forward_s * k("units"), whole_backward_s=u.whole_backward_s * k("units"),
            unfused=u.unfused * k("unfused"),
            contended_forward=u.contended_forward * k("contention"),
            contended_backward=u.contended_backward * k("contention"),
            oversubscribed_forward=u.oversubscribed_forward * k("contention"),
            oversubscribed_backward=u.oversubscribed_backward * k("contention"))
            for key, u in self.unit_kinds.items()}
        return attrs.evolve(
            self, unit_kinds=kinds, step_s_per_param=self.step_s_per_param * k("step"),
            executor_scale=self.executor_scale * k("executor"),
            action_overhead_s=self.action_overhead_s * k("action"),
            gp_op_s=self.gp_op_s * k("gp"), gp_op_s_per_elem=self.gp_op_s_per_elem * k("gp"),
            hybrid_op_s=self.hybrid_op_s * k("hybrid"), hybrid_op_s_per_elem=self.hybrid_op_s_per_elem * k("hybrid"),
            msg_cpu_s=self.msg_cpu_s * k("msg_cpu"), msg_cpu_s_per_byte=self.msg_cpu_s_per_byte * k("msg_cpu"),
            p2p=link(self.p2p, "p2p"), allreduce=link(self.allreduce, "allreduce"),
            host_exchange=link(self.host_exchange, "exchange"),
            switch_s=self.switch_s * k("switch"), switch_peer_s=self.switch_peer_s * k("switch"),
            switch_byte_s=self.switch_byte_s * k("switch"),
            switch_curve=[(w, c * k("switch")) for w, c in self.switch_curve], footprints=self.footprints)

    def msg_cpu(self, nbytes: float) -> float:
        """Main-thread CPU seconds of one message of ``nbytes`` (a send or a receive)."""
        return self.msg_cpu_s + nbytes * self.msg_cpu_s_per_byte if nbytes > 0 else 0.0

    def to_dict(self) -> dict:
        d = attrs.asdict(self, recurse=True)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        d = dict(d)
        d["unit_kinds"] = {k: UnitKind(**v) for k, v in d["unit_kinds"].items()}
        for key in ("p2p", "allreduce", "host_exchange"):
            if d.get(key) is not None:
                d[key] = Link(**d[key])
        return cls(**d)

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON (read back by :meth:`load`)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Profile:
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
        F, Cls = int(data.x.size(1)), num_classes_of(data)
        model = make_model(config, F, Cls, units=range(0))  # shapes only: no unit is materialised
        mine = {"units": self.units, "vertices": self.num_nodes, "edges": self.num_edges,
                "features": self.num_features, "classes": self.num_classes}
        job = {"units": [unit_key(u) for u in model.units], "vertices": int(data.num_nodes),
               "edges": int(data.edge_index.size(1)), "features": F, "classes": Cls}
        for key, a in mine.items():
            b = job[key]
            if a != b:
                if key == "units":
                    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    a = f"{len(a)}" + (f", unit {i} {a[i]}" if i < len(a) else "")
                    b = f"{len(b)}" + (f", unit {i} {b[i]}" if i < len(b) else "")
                raise ConfigError(f"the profile was taken for another job: its {key} are {a}, this job's {b}; "
                                  f"profile this job (drop --profile-in) or give its own profile")


def unit_key(unit: Any) -> str:
    """The signature of a unit: class, widths, aggregation kinds (units with equal keys cost the same)."""
    return f"{type(unit).__name__}({unit.in_dim}->{unit.out_dim};{','.join(unit.aggregations)})"


#: the :class:`Profile` fields the link probe sets (``link_fields``)
LINK_FIELDS = ("p2p", "allreduce", "runtime_floor_bytes", "msg_cpu_s", "msg_cpu_s_per_byte", "switch_s",
               "switch_peer_s", "switch_byte_s", "switch_ranks", "switch_curve", "host_exchange", "link_spread")


#: the timed quantities of a profile by what they describe (``Profile.spread`` and ``Profile.link_spread`` name
#: them; ``Profile.raised`` raises a group): the units' compute, the runtime's own costs, the link, and how ranks
#: computing at once slow each other
SPREAD_GROUPS = {
    "units": ("units", "step", "executor", "unfused"),
    "runtime": ("action", "gp", "hybrid", "msg_cpu"),
    "link": ("p2p", "allreduce", "exchange", "switch"),
    "contention": ("contention",),
}
