"""A half-duplex link in the schedule simulation: both directions of a pair of stages share one channel."""

from gnnpipe.schedulers import build_schedule, simulate
from gnnpipe.schedulers.simulate import CommModel


def test_half_duplex_link_serialises_both_directions():
    sched = build_schedule("1f1b", 2, 8)
    full = simulate(sched, costs=1.0, comm=CommModel(bytes_per_chunk=3.0, bandwidth=1.0))
    half = simulate(sched, costs=1.0, comm=CommModel(bytes_per_chunk=3.0, bandwidth=1.0, duplex=False))
    assert half.makespan > full.makespan
    for res in (full, half):
        assert len(res.transfers) == 16  # 8 activations forward, 8 gradients back
    # on the shared channel no two transfers overlap, either way
    tr = sorted(half.transfers, key=lambda t: t.start)
    assert all(a.end <= b.start + 1e-12 for a, b in zip(tr, tr[1:]))
    # one direction alone (gpipe's forwards then backwards, transfers cheap) is nearly unaffected
    g = build_schedule("gpipe", 2, 8)
    cheap = dict(bytes_per_chunk=0.1, bandwidth=1.0)
    assert simulate(g, costs=1.0, comm=CommModel(**cheap, duplex=False)).makespan == \
        simulate(g, costs=1.0, comm=CommModel(**cheap)).makespan
