"""Projections to model sizes no machine here holds: a model of a parameter count built on the ``meta``
device (:func:`size_for_params`) and OC20-sized slabs (:func:`oc20_sized_structures`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ase import Atoms
from torch_geometric.data import Data

from ....errors import ConfigError
from ....models import build_model
from .widths import num_parameters

#: hidden widths by parameter count when a projection does not fix one: DimeNet++ with ``I = H/2``, ``O = H``
PROJECTION_WIDTHS = ((3e8, 1024), (float("inf"), 2048))



def size_for_params(name: str, params: float, *, hidden: int | None = None, **options: Any) -> tuple[Any, dict]:
    """A ``name`` model (on the ``meta`` device: no memory) of about ``params`` trained parameters: the width
    ``hidden`` (default :data:`PROJECTION_WIDTHS`; DimeNet++ also ``int_emb_size = H/2``, ``out_emb_channels = H``
    unless given) and the number of interaction blocks that comes closest. Returns ``(model, build arguments)``.

    Raises:
        ConfigError: ``params`` not positive, or not reachable with at least one block.
    """


    if not params or params <= 0:
        raise ConfigError(f"--params must be a positive number of parameters, got {params!r}")
    if hidden is None:
        hidden = next(h for limit, h in PROJECTION_WIDTHS if params <= limit)
    kw = dict(options)
    if name == "dimenet++":
        kw.setdefault("int_emb_size", max(hidden // 2, 1))
        kw.setdefault("out_emb_channels", hidden)
    with torch.device("meta"):
        p1 = num_parameters(build_model(name, 0, 1, num_layers=1, hidden=hidden, **kw))
        p2 = num_parameters(build_model(name, 0, 1, num_layers=2, hidden=hidden, **kw))
        blocks = max(1, round((params - p1) / (p2 - p1)) + 1)
        model = build_model(name, 0, 1, num_layers=blocks, hidden=hidden, **kw)
    args = {"num_layers": blocks, "hidden": hidden, **kw}
    return model, args



def oc20_sized_structures(n: int, seed: int = 0, dtype=None) -> list:
    """``n`` structures of OC20's size (no labels: costs only): a periodic (x, y) ``fcc111`` slab of 4 × 4 × 4
    atoms of a metal (Cu, Ag, Au, Ni, Pd, Pt, Al) with an adsorbate (O, H, N, C, CO, OH) on the top layer, 8 Å
    of vacuum: 65–66 atoms (OC20's S2EF structures: ~73 atoms on average, Chanussot et al. 2021)."""
    from ase.build import add_adsorbate, fcc111, molecule

    rng = np.random.default_rng(seed)
    dtype = dtype or torch.float32
    out = []
    for _ in range(int(n)):
        metal = str(rng.choice(["Cu", "Ag", "Au", "Ni", "Pd", "Pt", "Al"]))
        ads = str(rng.choice(["O", "H", "N", "C", "CO", "OH"]))
        slab = fcc111(metal, size=(4, 4, 4), vacuum=8.0)
        mol = molecule(ads) if len(ads) > 1 else Atoms(ads)
        add_adsorbate(slab, mol, 1.8, str(rng.choice(["ontop", "fcc", "hcp"])))
        slab.rattle(0.05, seed=int(rng.integers(1 << 30)))
        k = len(slab)
        out.append(Data(z=torch.as_tensor(slab.numbers, dtype=torch.long),
                        pos=torch.as_tensor(slab.positions, dtype=dtype),
                        cell=torch.as_tensor(np.array(slab.cell), dtype=dtype).reshape(1, 3, 3),
                        pbc=torch.tensor([[True, True, False]]), energy=torch.zeros(1, dtype=dtype),
                        forces=torch.zeros(k, 3, dtype=dtype), natoms=torch.tensor([k])))
    return out
