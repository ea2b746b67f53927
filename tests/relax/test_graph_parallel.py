"""Graph-parallel relaxation: each step's forces computed with the batch's edges and triplets sharded over G = 2
ranks (the launcher, gloo) give the single process's positions (float64)."""

from __future__ import annotations

import pytest
import torch

from gnnpipe.errors import ConfigError, UnknownComponentError
from gnnpipe.relax import relax


@pytest.mark.timeout(120)
def test_gp2_relaxation_equals_the_single_process(schnet_file):
    from gnnpipe.data.atoms import generate_oc20_like
    from gnnpipe.models import load
    from gnnpipe.relax import relax

    atoms = generate_oc20_like(3, seed=5, relax_share=0.0, rattle=0.1)
    atoms += generate_oc20_like(1, seed=6, relax_share=0.0, rattle=0.1, size=(3, 2, 3))
    for a in atoms:
        a.calc = None
    model = load(schnet_file)
    kw = dict(optimizer="fire", fmax=1e-6, steps=4)            # nobody converges: 4 steps each
    one = relax(model, atoms, **kw)
    two = relax(model, atoms, gp_size=2, threads=1, **kw)
    assert two.forward_calls == one.forward_calls == 5 and not two.interrupted
    assert torch.equal(two.steps, one.steps)
    moved = 0.0
    for a, b, s in zip(one.structures, two.structures, atoms):
        assert a.pos.dtype == b.pos.dtype == torch.float64
        assert (a.pos - b.pos).abs().max().item() < 1e-9
        moved = max(moved, (a.pos - torch.as_tensor(s.positions)).abs().max().item())
    assert moved > 1e-3                                         # the structures did move
    torch.testing.assert_close(two.energies, one.energies, rtol=0, atol=1e-9)


def test_graph_parallel_arguments_are_checked(schnet_file, morse):
    from gnnpipe.models import load
    from gnnpipe.relax import relax

    model = load(schnet_file)
    with pytest.raises(ConfigError, match="gp_size"):
        relax(model, [], gp_size=0)
    with pytest.raises(ConfigError, match="graph-parallel mode"):
        relax(model, [], gp_size=2, gp_mode="ring")
    with pytest.raises(UnknownComponentError):
        relax(model, [], gp_size=2, gp_partitioner="nope")
    with pytest.raises(ConfigError, match="no graph-parallel hooks"):
        relax(morse, [], gp_size=2)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("direct", [True, False], ids=["gemnet-dt", "gemnet-t"])
def test_gemnet_relaxes_graph_parallel_as_in_one_process(tmp_path, direct):
    """GemNet reads each edge's reverse: the relaxer's graph carries it (G = 2 refused it before)."""
    from gnnpipe import api
    from gnnpipe.data.atoms import from_atoms, generate_oc20_like
    from gnnpipe.models import load, save

    data = from_atoms(generate_oc20_like(8, seed=1), dtype=torch.float64)
    r = api.train(data=data, model="gemnet-t", layers=1, hidden=8, cutoff=4.0, max_neighbors=8, batch_size=4,
                  epochs=1, dtype="float64", direct_forces=direct, log_every=0)
    save(r.model, tmp_path / "gem.pt")
    model = load(tmp_path / "gem.pt")
    atoms = generate_oc20_like(2, seed=5, relax_share=0.0, rattle=0.1)
    for a in atoms:
        a.calc = None
    kw = dict(optimizer="fire", fmax=1e-6, steps=2)
    one = relax(model, atoms, **kw)
    two = relax(model, atoms, gp_size=2, threads=1, **kw)
    for a, b in zip(one.structures, two.structures):
        assert (a.pos - b.pos).abs().max().item() < 1e-9
    torch.testing.assert_close(two.energies, one.energies, rtol=0, atol=1e-9)


@pytest.mark.timeout(180)
def test_gp2_cell_relaxation_equals_the_single_process(schnet_file):
    """Cells and positions together (--relax-cell): the stress of each step reduced over the G = 2 ranks."""
    from ase.build import bulk

    from gnnpipe.models import load

    atoms = [bulk("Cu", "fcc", a=3.7, cubic=True), bulk("Cu", "fcc", a=3.5).repeat((2, 2, 1))]
    for k, a in enumerate(atoms):
        a.rattle(0.05, seed=k)
    model = load(schnet_file)
    kw = dict(optimizer="fire", fmax=1e-6, steps=4, relax_cell=True)
    one = relax(model, atoms, **kw)
    two = relax(model, atoms, gp_size=2, threads=1, **kw)
    assert torch.equal(two.steps, one.steps) and int(one.steps.max()) == 4
    for a, b, s in zip(one.structures, two.structures, atoms):
        assert (a.cell - torch.as_tensor(s.cell.array)).abs().max().item() > 1e-4  # the cell moved
        torch.testing.assert_close(b.cell, a.cell, rtol=0, atol=1e-9)
        torch.testing.assert_close(b.pos, a.pos, rtol=0, atol=1e-9)
        torch.testing.assert_close(b.stress, a.stress, rtol=0, atol=1e-9)
