"""Contention between ranks of one CPU node (``measure_contention``): what the profile measures with forked
co-runners, and how the prediction applies it — by exactly ``1 + share · (κ − 1)`` on the units, never to one rank
or on GPUs. No timing is asserted beyond "a ratio was measured"."""

import attrs
import numpy as np
import pytest
import torch

from gnnpipe import api
from gnnpipe.costmodel.hardware import Hardware
from gnnpipe.partitioners import ChunkPlan
from gnnpipe.tasks.nodes.cost import Profile, profile
from gnnpipe.tasks.nodes.cost.epoch_time import predict_time
from gnnpipe.tasks.nodes.cost.layouts import LayoutSpec, layout_config
from gnnpipe.tasks.nodes.cost.profile import UnitKind, cores_here, measure_contention
from gnnpipe.tasks.nodes.runner import build_plan
from gnnpipe.tasks.nodes.trainer import make_model

from ..core.distutil import base_config


@pytest.fixture(scope="module")
def tiny():
    cfg = base_config(model="gcnii", layers=4, hidden=8, num_nodes=400, avg_degree=6.0)
    data = api.load_data(cfg)
    return cfg, data, profile(cfg, data, repeats=1, link=False)


def test_unit_time_applies_the_measured_contention_by_its_share():
    k = UnitKind(key="u", forward=[0.0, 0.01, 0.0, 0.0], backward=[0.0, 0.02, 0.0, 0.0], whole_forward_s=0.0,
                 whole_backward_s=0.0, saved_bytes_per_row=0.0, params=0, contended_forward=1.5,
                 contended_backward=1.2)
    f = np.array([1.0, 100.0, 0.0, 0.0])
    assert k.time(f, "F") == pytest.approx(1.0) and k.time(f, "B") == pytest.approx(2.0)
    assert k.time(f, "F", contended=1.0) == pytest.approx(1.5)
    assert k.time(f, "F", contended=0.5) == pytest.approx(1.25)
    assert k.time(f, "B", contended=1.0) == pytest.approx(2.4)
    # above 1: more ranks than cores, towards the time-sliced ratio (not measured: no further slowdown)
    assert k.time(f, "F", contended=2.0) == pytest.approx(1.5)
    k = attrs.evolve(k, oversubscribed_forward=2.5)
    assert k.time(f, "F", contended=1.5) == pytest.approx(2.0) and k.time(f, "F", contended=2.0) == pytest.approx(2.5)
    assert k.time(f, "F", contended=3.0) == pytest.approx(2.5)  # a level above 2 is 2
    assert k.contention("F", 0.0) == 1.0 and k.contention("B", 2.0) == pytest.approx(1.2)


@pytest.mark.timeout(180)
@pytest.mark.skipif(cores_here() < 2, reason="contention needs two cores")
def test_measure_contention_forks_co_runners_and_restores_the_model():
    cfg = base_config(model="gcnii", layers=2, hidden=8, num_nodes=300, avg_degree=5.0)
    data = api.load_data(cfg)
    plan = ChunkPlan.build(data, 4, "metis", seed=0)
    model = make_model(cfg, int(data.x.size(1)), int(data.y.max()) + 1)
    model.eval()
    grads = [None for _ in model.parameters()]
    rng = torch.get_rng_state()
    ratios, procs = measure_contention(model, plan.data, plan.chunk_ptr.tolist(), 2)
    assert procs == cores_here() and ratios is not None and len(ratios) == model.num_units
    assert all(f > 0 and b > 0 for f, b in ratios)
    assert not model.training and [p.grad for p in model.parameters()] == grads
    assert torch.equal(torch.get_rng_state(), rng)
    assert measure_contention(model, plan.data, plan.chunk_ptr.tolist(), 1, processes=1) == (None, 0)


def _predict(cfg, data, prof, spec, hw):
    c = layout_config(cfg, spec)
    plan = build_plan(c, data)
    model = make_model(c, plan.num_features, plan.num_classes)
    return predict_time(c, plan, model, prof, hw)


def _with_kappa(prof, kappa: float, ranks: int = 2):
    kinds = {k: attrs.evolve(u, contended_forward=kappa, contended_backward=kappa) for k, u in prof.unit_kinds.items()}
    return attrs.evolve(prof, unit_kinds=kinds, contention_ranks=ranks)


def test_prediction_slows_ranks_that_compute_at_once_and_nothing_else(tiny):
    cfg, data, base = tiny
    if base.contention_ranks:  # the profile measured it (Linux, >= 2 cores): every ratio is at least 1
        assert all(u.contended_forward >= 1.0 and u.contended_backward >= 1.0 for u in base.unit_kinds.values())
    none, slow = _with_kappa(base, 1.0), _with_kappa(base, 1.5)
    cpu2 = Hardware(name="2 cores", devices_per_node=2)
    for spec in (LayoutSpec(1, 2, 4, 1, "gpipe"), LayoutSpec(2, 1, 2, 1, "gpipe"), LayoutSpec(2, 2, 8, 1, "gpipe")):
        t0, _, _, w0 = _predict(cfg, data, none, spec, cpu2)
        t1, _, _, w1 = _predict(cfg, data, slow, spec, cpu2)
        assert t1 > t0 and all(b > a for a, b in zip(w0, w1)), spec
        # κ measured with 2 processes: at most κ on the units, so the work grows by less than 1.5x
        assert all(b < 1.5 * a + 1e-12 for a, b in zip(w0, w1)), spec
    # one rank: nothing shares the node; a profile that did not measure it (contention_ranks 0): no effect
    one = LayoutSpec(1, 1, 1, 1, "gpipe")
    assert _predict(cfg, data, slow, one, cpu2)[0] == pytest.approx(_predict(cfg, data, none, one, cpu2)[0])
    spec = LayoutSpec(1, 2, 4, 1, "gpipe")
    unmeasured = attrs.evolve(slow, contention_ranks=0)
    assert _predict(cfg, data, unmeasured, spec, cpu2)[0] == pytest.approx(_predict(cfg, data, none, spec, cpu2)[0])
    # four ranks on two cores: the time-sliced ratio where it was measured, the cores' ratio where it was not
    four = LayoutSpec(1, 4, 8, 1, "gpipe")
    over = attrs.evolve(slow, unit_kinds={k: attrs.evolve(u, oversubscribed_forward=2.0, oversubscribed_backward=2.0)
                                          for k, u in slow.unit_kinds.items()})
    w_none = _predict(cfg, data, none, four, cpu2)[3]
    w_slow = _predict(cfg, data, over, four, cpu2)[3]  # oversubscribed_ranks 0: κ = 1.5 at most
    w_over = _predict(cfg, data, attrs.evolve(over, oversubscribed_ranks=4), four, cpu2)[3]
    assert all(a < b < 1.5 * a + 1e-12 for a, b in zip(w_none, w_slow))
    # measured for 4 ranks: beyond κ (the units' time-sliced ratio 2 replaces 1.5), below 2x (a rank's work is not all
    # units: how much is depends on this machine's profile, so no fixed factor between them is asserted)
    assert all(s < o < 2.0 * a + 1e-12 for a, s, o in zip(w_none, w_slow, w_over))
    # GPUs do not share a CPU node's caches
    gpu = Hardware(name="gpus", kind="gpu", devices_per_node=2)
    assert _predict(cfg, data, slow, spec, gpu)[0] == pytest.approx(_predict(cfg, data, none, spec, gpu)[0])


def test_a_profile_saved_before_the_contention_fields_loads(tiny):
    d = tiny[2].to_dict()
    d.pop("contention_ranks"), d.pop("oversubscribed_ranks")
    for k in d["unit_kinds"].values():
        for f in ("contended_forward", "contended_backward", "oversubscribed_forward", "oversubscribed_backward"):
            k.pop(f)
    old = Profile.from_dict(d)
    assert old.contention_ranks == old.oversubscribed_ranks == 0
    assert all(k.contended_forward == k.contended_backward == k.oversubscribed_forward == 1.0
               for k in old.unit_kinds.values())


@pytest.mark.timeout(300)
@pytest.mark.skipif(cores_here() < 2, reason="contention needs two cores")
def test_profile_for_more_ranks_than_cores_measures_time_slicing():
    cfg = base_config(model="gcnii", layers=2, hidden=8, num_nodes=300, avg_degree=5.0)
    data = api.load_data(cfg)
    ranks = cores_here() + 1
    prof = profile(cfg, data, repeats=1, link=False, ranks=ranks)
    assert prof.contention_ranks == cores_here() and prof.oversubscribed_ranks == ranks
    for u in prof.unit_kinds.values():
        assert u.oversubscribed_forward >= u.contended_forward >= 1.0
        assert u.oversubscribed_backward >= u.contended_backward >= 1.0
    assert profile(cfg, data, repeats=1, link=False, contention=False).contention_ranks == 0
