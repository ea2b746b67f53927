"""Learning-rate schedule and the moving average of the weights (gnnpipe.tasks.s2ef.optim)."""

from __future__ import annotations

import math

import pytest
import torch

from gnnpipe.tasks.s2ef.optim import ExponentialMovingAverage, LRSchedule


def _opt():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def test_warmup_then_cosine():
    s = LRSchedule(_opt(), 1.0, "cosine", total_steps=12, warmup_steps=2, warmup_factor=0.2, min_factor=0.0)
    lrs = [s.apply() for _ in range(12)]
    assert lrs[0] == pytest.approx(0.2) and lrs[1] == pytest.approx(0.6)
    assert lrs[2] == pytest.approx(1.0)  # end of warm-up: the cosine starts at 1
    assert lrs[7] == pytest.approx(0.5 * (1 + math.cos(math.pi * 5 / 9)))
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)  # the last step runs at the floor
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))


def test_plateau_lowers_after_patience():
    s = LRSchedule(_opt(), 1.0, "plateau", total_steps=10, plateau_patience=2, plateau_factor=0.5)
    for m in (1.0, 0.9, 0.95, 0.95):
        s.observe(m)
    assert s.apply() == pytest.approx(1.0)
    s.observe(0.95)  # the third evaluation without improvement
    assert s.apply() == pytest.approx(0.5)
    t = LRSchedule(_opt(), 1.0, "plateau", total_steps=10)
    t.load_state_dict(s.state_dict())
    assert t.apply() == pytest.approx(s.apply())


def test_ema_formula_and_swap():
    m = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(0.0)
    ema = ExponentialMovingAverage(m, decay=0.5)
    with torch.no_grad():
        m.weight.fill_(1.0)
    ema.update(m)  # effective decay min(0.5, 2/11)
    d = 2 / 11
    with ema.averaged(m):
        assert float(m.weight.detach()) == pytest.approx(1 - d)
    assert float(m.weight.detach()) == 1.0  # restored
    off = ExponentialMovingAverage(m, 0.0)
    off.update(m)
    with off.averaged(m):
        assert float(m.weight.detach()) == 1.0
