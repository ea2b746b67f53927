"""METIS options that METIS refuses or ignores are checked before METIS runs (issue #17 item 7)."""

import numpy as np
import pytest
import torch
from scipy.sparse.csgraph import connected_components

from gnnpipe import partitioners as P
from gnnpipe.errors import ConfigError


def _ring_plus_isolated(n_conn: int = 140, n_iso: int = 60, seed: int = 0, chords: int = 200):
    """A connected graph on ``n_conn`` vertices (ring + random chords) and ``n_iso`` isolated vertices."""
    g = torch.Generator().manual_seed(seed)
    ring = torch.stack([torch.arange(n_conn), (torch.arange(n_conn) + 1) % n_conn])
    chords = torch.randint(0, n_conn, (2, chords), generator=g)
    ei = torch.cat([ring, chords], 1)
    ei = torch.cat([ei, ei.flip(0)], 1)
    return ei, n_conn + n_iso


def _disconnected_parts(graph, parts, num_parts):
    csr = P.as_graph(graph).csr
    bad = 0
    for q in range(num_parts):
        m = (parts == q).numpy()
        k, _ = connected_components(csr[m][:, m], directed=False)
        bad += k > 1
    return bad


@pytest.mark.parametrize("num_parts", [4, 16])  # 4: pymetis would pick recursive bisection; 16: k-way
def test_contiguous_on_disconnected_graph_is_a_config_error(num_parts):
    graph = _ring_plus_isolated()
    with pytest.raises(ConfigError,
                       match=r"contiguous=True needs a connected graph.*61 connected components.*60 isolated"):
        P.partition_graph(graph, num_parts, "metis", contiguous=True)


@pytest.mark.parametrize("num_parts", [3, 4, 8])
def test_contiguous_is_honoured_for_few_parts(num_parts):
    # pymetis's default rule uses recursive bisection for <= 8 parts, which ignores contig (on this
    # connected graph it leaves one part disconnected for each of these counts): we ask for k-way
    ei, n = _ring_plus_isolated(n_iso=0, seed=10, chords=40)
    parts = P.partition_graph((ei, n), num_parts, "metis", contiguous=True, seed=10)
    assert _disconnected_parts((ei, n), parts, num_parts) == 0


def test_contiguous_with_explicit_recursive_bisection_is_rejected():
    with pytest.raises(ConfigError, match="recursive bisection"):
        P.get("metis")(contiguous=True, recursive=True)


def test_a_metis_failure_quotes_metis_not_unknown_exception(monkeypatch):
    # bypass our up-front check to make METIS itself fail: its message must reach the user
    from gnnpipe.partitioners import methods

    monkeypatch.setattr(methods, "_require_connected", lambda graph, num_parts: None)
    ei, n = _ring_plus_isolated()
    with pytest.raises(ConfigError) as info:
        P.partition_graph((ei, n), 16, "metis", contiguous=True)
    msg = str(info.value)
    assert "METIS could not cut" in msg and "unknown exception" not in msg
    assert "contiguous partition is requested for a non-contiguous input graph" in msg


def test_plain_metis_on_the_same_graph_still_works():
    ei, n = _ring_plus_isolated()
    parts = P.partition_graph((ei, n), 16, "metis")
    assert sorted(np.unique(parts.numpy()).tolist()) == list(range(16))
