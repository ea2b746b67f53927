"""The neighbour graph estimated before it is built (gnnpipe.data.atoms.estimate): within 2x of the built graph's
edges (and triplets) on periodic, partly periodic and non-periodic structures; a cutoff whose graph cannot be built
here refused in seconds with the estimate in the message, a large one warned about."""

from __future__ import annotations

import time
import warnings

import pytest
from ase import Atoms
from ase.build import add_adsorbate, bulk, fcc111, molecule, nanotube

from gnnpipe.data import DataWarning
from gnnpipe.data.atoms import build_graph, from_atoms
from gnnpipe.data.atoms.estimate import check_graph_size, estimate_graph
from gnnpipe.errors import ConfigError


def _cu_cell():
    """The 8-atom copper cell of 7.2 x 3.6 x 3.6 Å (periodic)."""
    a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
    a.rattle(0.05, seed=1)
    return a


def _structures():
    slab = fcc111("Pt", (3, 3, 4), vacuum=8.0)                          # periodic in-plane only
    add_adsorbate(slab, "O", 1.5, "fcc")
    tube = nanotube(4, 4, length=3)
    tube.pbc = (False, False, True)                                      # periodic along its axis only
    return [("Cu cell, 6 Å", _cu_cell(), 6.0), ("Cu cell, 15 Å", _cu_cell(), 15.0), ("Pt(111) slab + O", slab, 6.0),
            ("benzene", molecule("C6H6"), 3.0), ("nanotube", tube, 5.0)]


@pytest.mark.parametrize("name,atoms,cutoff", _structures(), ids=[s[0] for s in _structures()])
def test_estimate_is_within_2x_of_the_built_graph(name, atoms, cutoff):
    s = from_atoms([atoms])
    for cap, tri in ((None, False), (12, True)):
        est = estimate_graph(s, cutoff, cap, with_triplets=tri)
        g = build_graph(s[0], cutoff, cap, with_triplets=tri)
        assert g.num_edges > 0
        assert 0.5 <= est.edges.sum() / g.num_edges <= 2.0, (name, cap, est.edges.sum(), g.num_edges)
        if cap is None:  # the pairs the search enumerates are the uncapped edges
            assert 0.5 <= est.pairs.sum() / g.num_edges <= 2.0
        if tri:
            assert 0.5 <= est.triplets.sum() / g.num_triplets <= 2.0, (name, est.triplets.sum(), g.num_triplets)


def test_a_non_periodic_structure_is_counted_exactly():
    s = from_atoms([molecule("CH3CH2OH")])
    for cutoff in (1.2, 2.0, 50.0):
        assert estimate_graph(s, cutoff).pairs.sum() == build_graph(s[0], cutoff, with_triplets=False).num_edges
    n = int(s[0].z.numel())
    assert estimate_graph(s, 50.0).pairs.sum() == n * (n - 1)     # bounded by n (n - 1)


def test_a_150_angstrom_cutoff_on_a_small_periodic_cell_is_refused_in_seconds():
    cells = from_atoms([_cu_cell() for _ in range(10)])
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^--cutoff 150 Å: the neighbour search of a batch of 8 structures "
                                          r"enumerates ~7\.\de\+07 atom pairs \(~1\.2e\+06 neighbours per atom.*keeps "
                                          r"~3,200 edges \(at most 50 per atom\).*GiB.*beyond the limit.*"
                                          r"lower --cutoff to about \d+(\.\d)? Å"):
        check_graph_size(cells, 150.0, 50, batch_size=8, available=64 * 2**30)
    assert time.perf_counter() - t0 < 2.0
    with pytest.raises(ConfigError, match=r"50% of the 1\.0 GiB available"):   # memory, too
        check_graph_size(cells[:1], 150.0, 50, available=2**30)


def test_a_large_graph_that_fits_is_warned_about_and_a_usual_one_is_not():
    cells = from_atoms([_cu_cell()])
    with pytest.warns(DataWarning, match=r"^--cutoff 40 Å: .*~18\d,\d{3} atom pairs .*~400 edges.*~\d+ MiB"):
        check_graph_size(cells, 40.0, 50, available=400 * 2**20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = check_graph_size(cells, 6.0, 50, available=2**30)
    assert est.batch_edges == pytest.approx(8 * 50)                   # ~78 neighbours per atom, 50 kept


def test_lone_atoms_and_empty_sets():
    assert estimate_graph([], 6.0).estimated == 0
    lone = from_atoms([Atoms("H", positions=[[0, 0, 0]])])
    assert estimate_graph(lone, 6.0).pairs.sum() == 0
