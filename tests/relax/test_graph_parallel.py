"""Graph-parallel relaxation: each step's forces computed with the batch's edges and triplets sharded over G = 2
ranks (the launcher, gloo) give the single process's positions (float64)."""

from __future__ import annotations

import pytest
import torch

from gnnpipe.errors import ConfigError, UnknownComponentError


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
