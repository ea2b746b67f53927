"""Which cross-chunk neighbours a schedule lets each chunk read fresh, and which stale.

The forward of chunk ``c`` on stage ``s`` computes ``Â[R_c, :] @ H_in``, reading the rows
of its in-neighbours; a neighbour in another chunk ``d`` is *fresh* if ``F(s, d)`` ran before
``F(s, c)`` on that stage in the same epoch, else *stale* (history). The pull backward of ``c``
computes ``Âᵀ[R_c, :] @ G_out``, reading the output gradients of its out-neighbours; a neighbour in
chunk ``d`` is fresh if ``B(s, d)`` ran before ``B(s, c)`` on that stage in the same epoch. Only the
per-stage order matters, not the timing. Edges inside a chunk are always fresh and not counted.

Edges follow PyG: ``edge_index[0]`` = source, ``edge_index[1]`` = destination, messages flow
source → destination, so an edge ``u → v`` is an in-edge of ``v``'s chunk and an out-edge of ``u``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .base import build_schedule
from .ir import ActionKind, Schedule
from .order import order_policy


def chunk_edge_counts(chunk_ptr, edge_index, num_chunks: int | None = None) -> np.ndarray:
    """``M[c, d]`` = number of edges from a vertex of chunk ``d`` into a vertex of chunk ``c``.

    Args:
        chunk_ptr: ``C+1`` non-decreasing offsets, ``chunk_ptr[0] == 0``; chunk ``c`` is the vertex range
            ``[chunk_ptr[c], chunk_ptr[c+1])``.
        edge_index: ``[2, E]`` integer array or tensor (source row, destination row).

    Returns: a ``C × C`` int64 array (diagonal = intra-chunk edges).

    Raises:
        ConfigError: malformed ``chunk_ptr``, ``edge_index`` of the wrong shape, vertex ids outside
            ``[0, chunk_ptr[-1])``, or ``len(chunk_ptr) - 1 != num_chunks``.
    """
    ptr = np.asarray(_to_numpy(chunk_ptr), dtype=np.int64).ravel()
    if ptr.size < 2 or ptr[0] != 0 or np.any(np.diff(ptr) < 0):
        raise ConfigError("chunk_ptr must hold C+1 non-decreasing offsets starting at 0")
    C = ptr.size - 1
    if num_chunks is not None and C != num_chunks:
        raise ConfigError(f"chunk_ptr describes {C} chunks, but the schedule has {num_chunks}")
    ei = np.asarray(_to_numpy(edge_index))
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise ConfigError(f"edge_index must have shape [2, E], got {tuple(ei.shape)}")
    ei = ei.astype(np.int64)
    if ei.size and (ei.min() < 0 or ei.max() >= ptr[-1]):
        raise ConfigError(f"edge_index holds vertex ids outside [0, {int(ptr[-1])}) covered by chunk_ptr")
    src_c = np.searchsorted(ptr, ei[0], side="right") - 1
    dst_c = np.searchsorted(ptr, ei[1], side="right") - 1
    return np.bincount(dst_c * C + src_c, minlength=C * C).reshape(C, C).astype(np.int64)


def _to_numpy(x):
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return x


@dataclass
class StalenessReport:
    """Fresh/stale cross-chunk reads per epoch, stage and chunk.

    Attributes:
        num_stages, num_chunks, epochs: sizes.
        fwd_fresh: ``[epochs, S, C]`` cross-chunk in-edges of chunk ``c`` read fresh by ``F(s, c)``.
        bwd_fresh: ``[epochs, S, C]`` cross-chunk out-edges of chunk ``c`` read fresh by ``B(s, c)``.
        fwd_total: ``[C]`` cross-chunk in-edges of each chunk (the same every epoch and stage).
        bwd_total: ``[C]`` cross-chunk out-edges of each chunk.
        name: the schedule's name.
    """

    num_stages: int
    num_chunks: int
    epochs: int
    fwd_fresh: np.ndarray
    bwd_fresh: np.ndarray
    fwd_total: np.ndarray
    bwd_total: np.ndarray
    name: str = "custom"

    def _frac(self, fresh: np.ndarray, total: np.ndarray, epoch: int | None) -> np.ndarray:
        f = fresh.sum(axis=0) if epoch is None else fresh[epoch]
        n = total * (self.epochs if epoch is None else 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, f / np.maximum(n, 1), np.nan)

    def forward_fresh(self, epoch: int | None = None) -> np.ndarray:
        """``[S, C]`` fraction of cross-chunk in-edges read fresh in the forward (NaN for a chunk with
        none), for one ``epoch`` or pooled over all epochs (``None``)."""
        return self._frac(self.fwd_fresh, self.fwd_total, epoch)

    def backward_fresh(self, epoch: int | None = None) -> np.ndarray:
        """``[S, C]`` fraction of cross-chunk out-edges read fresh in the pull backward."""
        return self._frac(self.bwd_fresh, self.bwd_total, epoch)

    def forward_stale(self, epoch: int | None = None) -> np.ndarray:
        """``1 - forward_fresh``."""
        return 1.0 - self.forward_fresh(epoch)

    def backward_stale(self, epoch: int | None = None) -> np.ndarray:
        """``1 - backward_fresh``."""
        return 1.0 - self.backward_fresh(epoch)

    def summary(self, epoch: int | None = None) -> dict:
        """Edge-weighted fresh fractions: overall, per stage, and the min/max over chunks (pooled over
        all epochs when ``epoch`` is ``None``)."""
        E = 1 if epoch is not None else self.epochs
        ff = self.fwd_fresh[epoch] if epoch is not None else self.fwd_fresh.sum(axis=0)
        bf = self.bwd_fresh[epoch] if epoch is not None else self.bwd_fresh.sum(axis=0)
        ft, bt = self.fwd_total.sum() * E, self.bwd_total.sum() * E

        def ratio(a, n):
            return float(a / n) if n else float("nan")

        fc, bc = self.forward_fresh(epoch), self.backward_fresh(epoch)
        return {
            "epochs": E,
            "forward_fresh": ratio(ff.sum(), ft * self.num_stages),
            "backward_fresh": ratio(bf.sum(), bt * self.num_stages),
            "forward_fresh_per_stage": [ratio(ff[s].sum(), ft) for s in range(self.num_stages)],
            "backward_fresh_per_stage": [ratio(bf[s].sum(), bt) for s in range(self.num_stages)],
            "forward_fresh_chunk_range": _range(fc),
            "backward_fresh_chunk_range": _range(bc),
        }

    def to_text(self, epoch: int | None = None) -> str:
        """A table of per-(stage, chunk) fresh fractions (forward / backward) and the summary."""
        fc, bc = self.forward_fresh(epoch), self.backward_fresh(epoch)
        sm = self.summary(epoch)
        scope = f"epoch {epoch}" if epoch is not None else f"{self.epochs} epoch(s) pooled"
        lines = [f"staleness of {self.name} ({scope}): fraction of cross-chunk edges read fresh, forward/backward"]
        head = ["stage"] + [f"chunk {c}" for c in range(self.num_chunks)] + ["all"]
        rows = []
        for s in range(self.num_stages):
            cells = [_pct(fc[s, c]) + "/" + _pct(bc[s, c]) for c in range(self.num_chunks)]
            cells.append(_pct(sm["forward_fresh_per_stage"][s]) + "/" + _pct(sm["backward_fresh_per_stage"][s]))
            rows.append([str(s)] + cells)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths)))
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        lines.append(f"overall: forward {_pct(sm['forward_fresh'])} fresh, backward {_pct(sm['backward_fresh'])} fresh")
        return "\n".join(lines)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f}%"


def _range(a: np.ndarray) -> tuple[float, float]:
    v = a[~np.isnan(a)]
    return (float(v.min()), float(v.max())) if v.size else (float("nan"), float("nan"))


def staleness_report(schedule: Schedule | Sequence[Schedule], chunk_ptr, edge_index) -> StalenessReport:
    """Fresh vs stale cross-chunk reads of every ``(epoch, stage, chunk)`` of a schedule.

    Args:
        schedule: one schedule (all its epochs are reported) or a sequence of schedules with the same
            sizes, treated as consecutive epochs (e.g. one per shuffled epoch).
        chunk_ptr, edge_index: the chunked graph (see :func:`chunk_edge_counts`).

    Returns: a :class:`StalenessReport` (counts per epoch; fractions via its methods).

    Raises:
        ConfigError: sizes that do not match the graph or each other.
    """
    schedules = [schedule] if isinstance(schedule, Schedule) else list(schedule)
    if not schedules:
        raise ConfigError("staleness_report needs at least one schedule")
    S, C = schedules[0].num_stages, schedules[0].num_chunks
    if any(x.num_stages != S or x.num_chunks != C for x in schedules):
        raise ConfigError("all schedules of a staleness report need the same number of stages and chunks")
    M = chunk_edge_counts(chunk_ptr, edge_index, C)
    cross = M.copy()
    np.fill_diagonal(cross, 0)
    fwd_total = cross.sum(axis=1)  # in-edges of c from other chunks
    bwd_total = cross.sum(axis=0)  # out-edges of c into other chunks
    fwd, bwd = [], []
    for sch in schedules:
        for e in range(sch.epochs):
            f_e = np.zeros((S, C), dtype=np.int64)
            b_e = np.zeros((S, C), dtype=np.int64)
            for s in range(S):
                done_f = np.zeros(C, dtype=bool)
                done_b = np.zeros(C, dtype=bool)
                for a in sch.actions(s):
                    if a.epoch != e or a.chunk is None or a.chunk >= C:
                        continue
                    if a.kind is ActionKind.F:
                        f_e[s, a.chunk] = cross[a.chunk, done_f].sum()
                        done_f[a.chunk] = True
                    elif a.kind is ActionKind.B:
                        b_e[s, a.chunk] = cross[done_b, a.chunk].sum()
                        done_b[a.chunk] = True
            fwd.append(f_e)
            bwd.append(b_e)
    return StalenessReport(S, C, len(fwd), np.stack(fwd), np.stack(bwd), fwd_total, bwd_total, schedules[0].name)


def shuffled_staleness(scheduler, num_stages: int, chunk_ptr, edge_index, *, epochs: int = 20,
                       order=None, seed: int = 0, **options) -> StalenessReport:
    """:func:`staleness_report` over ``epochs`` epochs of a chunk-order policy (default: GNNPipe's T1
    shuffle, :class:`~gnnpipe.schedulers.ShuffledOrder` with ``seed``), one schedule per epoch.

    Args:
        scheduler: a registered name or a :class:`~gnnpipe.schedulers.ChunkScheduler`.
        order: a policy or ``"fixed"``/``"shuffle"`` (default ``"shuffle"``).
        **options: scheduler options.
    """
    C = len(np.asarray(_to_numpy(chunk_ptr)).ravel()) - 1
    order = "shuffle" if order is None else order

    policy = order_policy(order, seed)
    schedules = [build_schedule(scheduler, num_stages, C, order=policy, start_epoch=e, **options)
                 for e in range(epochs)]
    return staleness_report(schedules, chunk_ptr, edge_index)
