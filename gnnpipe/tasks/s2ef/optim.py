"""S2EF optimisation helpers: the learning-rate schedule (linear warm-up, then cosine / on-plateau / constant) and
the exponential moving average of the weights used for evaluation (fairchem's defaults)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class LRSchedule:
    """The learning rate of each optimisation step: ``lr · w(step) · d(step)``.

    ``w`` rises linearly from ``warmup_factor`` to 1 over ``warmup_steps`` steps; ``d`` is 1 (``constant``),
    ``min_factor + (1 − min_factor) · (1 + cos(π t)) / 2`` with ``t`` the share of the post-warm-up steps done
    (``cosine``, over ``total_steps``: the last step, ``total_steps − 1``, runs at the floor ``min_factor``), or
    multiplied by ``plateau_factor`` whenever the monitored validation
    metric (:meth:`observe`) did not improve for ``plateau_patience`` evaluations (``plateau``;
    ``torch.optim.lr_scheduler.ReduceLROnPlateau``'s rule, mode ``min``).

    Call :meth:`apply` before each step (it sets the optimiser's learning rate for that step).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr: float, kind: str, total_steps: int,
                 warmup_steps: int = 0, warmup_factor: float = 1.0, min_factor: float = 0.01,
                 plateau_factor: float = 0.8, plateau_patience: int = 3):
        self.optimizer, self.lr, self.kind = optimizer, float(lr), kind
        self.total, self.warmup, self.warmup_factor = int(total_steps), int(warmup_steps), float(warmup_factor)
        self.min_factor, self.plateau_factor, self.plateau_patience = min_factor, plateau_factor, plateau_patience
        self.step = 0
        self.scale = 1.0
        self.best = math.inf
        self.bad = 0

    def factor(self, step: int) -> float:
        w = 1.0
        if step < self.warmup:
            w = self.warmup_factor + (1.0 - self.warmup_factor) * step / self.warmup
        if self.kind == "cosine":  # the last of the total steps (step total − 1) runs at the floor
            span = max(self.total - 1 - self.warmup, 1)
            t = min(max(step - self.warmup, 0) / span, 1.0)
            return w * (self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * t)))
        return w * self.scale

    def apply(self) -> float:
        """Set the learning rate of the next step and count it; returns it."""
        lr = self.lr * self.factor(self.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.step += 1
        return lr

    def observe(self, metric: float) -> None:
        """An evaluation's monitored metric (lower is better); ``plateau`` only."""
        if self.kind != "plateau" or not math.isfinite(metric):
            return
        if metric < self.best * (1 - 1e-4):
            self.best, self.bad = metric, 0
        else:
            self.bad += 1
            if self.bad > self.plateau_patience:
                self.scale *= self.plateau_factor
                self.bad = 0

    def state_dict(self) -> dict:
        return {"step": self.step, "scale": self.scale, "best": self.best, "bad": self.bad}

    def load_state_dict(self, d: dict) -> None:
        self.step, self.scale, self.best, self.bad = d["step"], d["scale"], d["best"], d["bad"]


class ExponentialMovingAverage:
    """``θ̄ ← δ θ̄ + (1 − δ) θ`` after each step with ``δ = min(decay, (1 + n) / (10 + n))`` (``n`` updates so
    far: a short memory early on), as fairchem's and torch_ema's; buffers are copied, not averaged.

    ``decay = 0`` keeps no average (:meth:`averaged` then yields the model as it is).
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = float(decay)
        self.updates = 0
        self.shadow = {k: p.detach().clone() for k, p in model.named_parameters()} if self.decay > 0 else {}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        if not self.shadow:
            return
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for k, p in model.named_parameters():
            self.shadow[k].mul_(d).add_(p.detach(), alpha=1 - d)

    @contextmanager
    def averaged(self, model: nn.Module) -> Iterator[nn.Module]:
        """``model`` holding the averaged weights inside the block (its own restored after)."""
        if not self.shadow:
            yield model
            return
        params = dict(model.named_parameters())
        saved = {k: p.detach().clone() for k, p in params.items()}
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(self.shadow[k])
        try:
            yield model
        finally:
            with torch.no_grad():
                for k, p in params.items():
                    p.copy_(saved[k])

    def state_dict(self) -> dict:
        """``{"updates", "shadow"}`` with CPU copies of the averages (a checkpoint written on a GPU loads on any
        device)."""
        return {"updates": self.updates,
                "shadow": {k: v.detach().to("cpu", copy=True) for k, v in self.shadow.items()}}

    def load_state_dict(self, d: dict) -> None:
        """The averages of :meth:`state_dict` copied into this average's tensors (on their device)."""
        self.updates = d["updates"]
        for k, v in d["shadow"].items():
            self.shadow[k].copy_(v)


def clip_and_norm(params: list[Tensor], max_norm) -> float:
    """Clip the gradient norm at ``max_norm`` (``None``/0: no clipping); returns the norm before clipping."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm:
        return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in grads])))
