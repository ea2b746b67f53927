"""The communication wrapper's time split: a wait for a peer counts as idle, not as communication.

A pipeline rank whose receiver is busy waits for its sends (gloo completes a send once the peer posts the
receive; :data:`~gnnpipe.core.comm.MAX_PENDING_SENDS` bounds the outstanding ones). That wait is the peer's
bubble seen from the sender, and the atomistic pipeline's bubble measurement (``1 − busy / makespan``) relies on
it being counted as idle."""

from __future__ import annotations

import time
import types

import pytest
import torch

from gnnpipe.core.comm import MAX_PENDING_SENDS, Comm
from gnnpipe.core.run import launch

pytestmark = pytest.mark.timeout(180)

SLEEP_S = 0.6


def _rank(rank, world):
    comm = Comm("cpu", stage=False)
    n = MAX_PENDING_SENDS + 2
    if rank == 0:
        for i in range(n):
            comm.isend(torch.full((1 << 18,), float(i)), 1, tag=i)  # 1 MiB each
        comm.wait_sends()
        return comm.counters()
    time.sleep(SLEEP_S)  # busy elsewhere: the sender's later sends wait for these receives
    got = [comm.recv((1 << 18,), torch.float32, 0, tag=i) for i in range(n)]
    assert [float(t[0]) for t in got] == [float(i) for i in range(n)]
    return comm.counters()


def test_a_send_waiting_for_a_busy_receiver_counts_as_idle():
    c0, _ = launch.spawn(_rank, 2, (), backend="gloo", timeout_s=60, threads=1, max_runtime_s=150)
    assert c0["bytes_layer"] == (MAX_PENDING_SENDS + 2) * (1 << 20)
    assert c0["idle_s"] > 0.5 * SLEEP_S, c0  # waited for the receiver
    assert c0["comm_s"] < 0.5 * SLEEP_S, c0  # not counted as time inside the sends


def test_exchange_posts_its_receives_before_its_sends(monkeypatch):
    """gloo's TCP transport reads a pair's bytes only into a posted receive; a rank whose sends come first waits
    for the peer to finish its own sends, and the two directions of a link take turns (half the rate each on a
    shaped link; the root-only link test measures the rate)."""
    import torch.distributed as dist

    seen = []

    def fake_batch(ops):
        seen.extend(op.op for op in ops)
        return []

    monkeypatch.setattr(dist, "batch_isend_irecv", fake_batch)
    monkeypatch.setattr(dist, "P2POp", lambda op, tensor, peer, tag=0: types.SimpleNamespace(op=op))
    comm = Comm("cpu", stage=False)
    comm.exchange([(torch.zeros(4), 1), (torch.zeros(2), 2)], [(torch.empty(3), 1), (torch.empty(3), 2)], tag=5,
                  kind="graph")
    assert seen == [dist.irecv, dist.irecv, dist.isend, dist.isend]
    assert comm.bytes["graph"] == 6 * 4
