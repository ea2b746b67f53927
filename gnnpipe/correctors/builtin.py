"""Built-in correctors: the GNNPipe paper's techniques T1–T3 (arXiv 2308.10087 §4.3) and extras."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..schedulers import ShuffledOrder
from .base import Corrector
from .registry import register


@register("none")
class NoCorrector(Corrector):
    """No correction: history is read as it is (the ablation's "none")."""

    is_noop = True


@register("t1")
class T1RandomChunkOrder(Corrector):
    """T1, random chunk order: each epoch a seeded shuffle of the chunk order, identical on all stages of
    a pipeline (the backward order follows from the scheduler, e.g. reversed for gpipe). It only selects
    the order policy; the shuffle itself lives in :class:`gnnpipe.schedulers.ShuffledOrder`."""

    def order_policy(self, seed: int):
        return ShuffledOrder(seed)


T1RandomOrder = T1RandomChunkOrder


@register("t2")
class T2UnbiasedGradient(Corrector):
    """T2, unbiased cross-chunk gradient: at epoch end zero every ``G_out``; after chunk c's backward on a
    stage multiply ``G_out[k][R_c]`` by 2 for all its ops. With T1's uniformly random order, each
    out-neighbour chunk has been back-propagated before c with probability ½, so the doubled fresh
    gradients (and zeros for the rest) are an unbiased estimate of the full pull. Only when S > 1
    (GNNPipe paper §4.3). On a halo-gradient (push) op the same rule acts on the pushes: ``G_in`` and the
    stored pushes are cleared at epoch end and a chunk's fresh push counts twice (docs/HALO_GRADIENT.md).

    The doubling of an op's rows happens in the chunk op's pull, right after its product (the op's last read of
    them in the chunk's backward: ``gnnpipe.tasks.nodes.history.History.scale_after_pull``), while they are in
    the cache; :meth:`Corrector.after_backward` doubles the rows of every op whose pull did not (a hybrid peer
    exchange, a push op, an op the chunk did not reach). The values are the same bit for bit."""

    def setup(self, ctx) -> None:
        super().setup(ctx)
        if ctx.num_stages > 1:
            for h in ctx.histories:
                if hasattr(h, "scale_after_pull"):
                    h.scale_after_pull = 2.0

    def on_epoch_end(self, epoch: int) -> None:
        if self.ctx.num_stages <= 1:
            return
        for h in self.ctx.histories:
            h.zero_grads()

    def after_backward(self, epoch: int, chunk: int) -> None:
        if self.ctx.num_stages <= 1:
            return
        lo, hi = self.ctx.rows(chunk)
        for h in self.ctx.histories:
            if not h.take_scaled(lo):
                h.scale_grad_rows(lo, hi, 2.0)


@register("t3")
class T3PeriodicSnapshot(Corrector):
    """T3, periodic history snapshot with period P (paper: 23): restore every ``H_in`` from the snapshot
    at the start of each epoch e with ``e mod P ≠ 0``; take the snapshot at the end of each epoch with
    ``(e+1) mod P = 0``; the first snapshot is zeros. Stale reads thus see embeddings of one fixed
    weight version for P epochs instead of a mix of versions.

    Args:
        period: P ≥ 1.
    """

    def __init__(self, period: float = 23):
        if period < 1 or int(period) != period:
            raise ConfigError(f"t3 period must be a positive integer, got {period}")
        self.period = int(period)
        self.snapshots: list = []

    def on_epoch_start(self, epoch: int) -> None:
        if epoch % self.period == 0:
            return
        for i, h in enumerate(self.ctx.histories):
            if not h.allocated:
                continue
            snap = self.snapshots[i] if i < len(self.snapshots) else None
            if snap is None:
                h.zero_inputs()  # rows known zero: not written, and read from the zero row (History.zero_inputs)
            else:
                h.H_in.copy_(snap)

    def on_epoch_end(self, epoch: int) -> None:
        if (epoch + 1) % self.period != 0:
            return
        self.snapshots = [None if h.H_in is None else h.H_in.clone() for h in self.ctx.histories]

    def __repr__(self) -> str:
        return f"T3PeriodicSnapshot(period={self.period})"


@register("ema")
class EMASmoothing(Corrector):
    """Exponential moving average of history rows read stale (PipeGCN, Wan et al., ICLR 2022, §3.4):
    after chunk c's forward, ``avg[R_c] ← m·avg[R_c] + (1 − m)·H_in[R_c]`` (the first write takes the value
    as is); at each epoch start ``H_in ← avg``, so rows of chunks not yet processed in the epoch are read
    smoothed while processed rows are fresh. Features only; gradients are left as they are.

    Args:
        momentum: m in [0, 1), default 0.95.
    """

    def __init__(self, momentum: float = 0.95):
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"ema momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        self.avg: dict = {}
        self.seen: dict = {}

    def on_epoch_start(self, epoch: int) -> None:
        for i, h in enumerate(self.ctx.histories):
            if h.H_in is not None and i in self.avg:
                seen = self.seen[i]
                h.H_in[seen] = self.avg[i][seen]

    def after_forward(self, epoch: int, chunk: int) -> None:
        lo, hi = self.ctx.rows(chunk)
        m = self.momentum
        for i, h in enumerate(self.ctx.histories):
            if h.H_in is None:
                continue
            if i not in self.avg:
                self.avg[i] = torch.zeros_like(h.H_in)
                self.seen[i] = torch.zeros(h.H_in.size(0), dtype=torch.bool, device=h.H_in.device)
            fresh = h.H_in[lo:hi]
            first = ~self.seen[i][lo:hi]
            wide = torch.promote_types(fresh.dtype, torch.float32)  # narrow (--history-dtype) rows: average in float32
            new = m * self.avg[i][lo:hi].to(wide) + (1.0 - m) * fresh.to(wide)
            new[first] = fresh[first].to(wide)
            self.avg[i][lo:hi] = new  # stored back in the history's dtype
            self.seen[i][lo:hi] = True

    def __repr__(self) -> str:
        return f"EMASmoothing(momentum={self.momentum})"


@register("refresh")
class PeriodicRefresh(Corrector):
    """Periodic full refresh: every ``period`` epochs (at the start of epochs with ``e mod period = 0``, e > 0)
    the runtime recomputes every ``H_in`` exactly from the current weights before training the epoch,
    so no stale value is older than ``period`` epochs. The runtime checks :meth:`wants_refresh`.

    Args:
        period: ≥ 1, default 10.
    """

    def __init__(self, period: float = 10):
        if period < 1 or int(period) != period:
            raise ConfigError(f"refresh period must be a positive integer, got {period}")
        self.period = int(period)

    def wants_refresh(self, epoch: int) -> bool:
        return epoch > 0 and epoch % self.period == 0

    def __repr__(self) -> str:
        return f"PeriodicRefresh(period={self.period})"
