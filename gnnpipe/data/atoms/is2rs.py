"""An OC20-like IS2RS / IS2RE set: initial adsorbate-on-slab structures and their relaxed structures and energies,
relaxed by ASE's EMT (the oracle here; DFT in OC20: Chanussot et al., *Open Catalyst 2020*, ACS Catal. 2021, the
IS2RS and IS2RE tasks pair each initial structure with the end of its DFT relaxation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["generate_oc20_is2rs", "reference_path"]


def reference_path(path: str | Path) -> Path:
    """Where the reference relaxed structures of an IS2RS set's initial file go: ``X.extxyz`` → ``X.relaxed.extxyz``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.relaxed{p.suffix or '.extxyz'}")


def generate_oc20_is2rs(frames: int, seed: int = 0, *, metals: Sequence[str] | None = None,
                        adsorbates: Sequence[str] | None = None, sites: Sequence[str] | None = None,
                        size: Sequence[int] = (2, 2, 3), vacuum: float = 6.0, fixed_layers: int = 1,
                        rattle: float = 0.1, lift: float = 0.3, fmax: float = 0.01, steps: int = 500) -> tuple:
    """``frames`` initial structures and their EMT-relaxed structures.

    Each system draws a metal, an adsorbate and a site as :func:`~gnnpipe.data.atoms.generate_oc20_like`; the
    initial structure places the adsorbate ``U(0, lift)`` Å higher than the site's height and rattles the free atoms
    (std ``rattle`` Å); the reference is its ASE ``BFGS`` relaxation with EMT to ``fmax`` eV/Å (at most ``steps``).

    Returns:
        ``(initial, relaxed)``: two lists of ``ase.Atoms`` with ``FixAtoms``, OC20 tags and a
        ``SinglePointCalculator`` (EMT energy eV, forces eV/Å); ``relaxed[k].info`` has ``relax_steps`` and
        ``relax_converged``.

    Raises:
        ValueError: ``frames < 1`` or the choices :func:`generate_oc20_like` refuses.
    """
    from ase.calculators.emt import EMT
    from ase.optimize import BFGS

    from .generate import EMT_METALS, OC20_ADSORBATES, OC20_SITES, _check_choices, _label, _slab

    metals, adsorbates, sites = metals or EMT_METALS, adsorbates or OC20_ADSORBATES, sites or OC20_SITES
    _check_choices(metals, EMT_METALS, "metal")
    _check_choices(adsorbates, OC20_ADSORBATES, "adsorbate")
    _check_choices(sites, OC20_SITES, "site")
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    rng = np.random.default_rng(seed)
    calc = EMT()
    initial, relaxed = [], []
    for _ in range(frames):
        metal = metals[rng.integers(len(metals))]
        ads = adsorbates[rng.integers(len(adsorbates))]
        site = sites[rng.integers(len(sites))]
        slab = _slab(metal, ads, site, size, vacuum, fixed_layers)
        slab.positions[slab.get_tags() == 2, 2] += rng.uniform(0, lift)
        slab.rattle(rattle, seed=int(rng.integers(2**31)))
        initial.append(_label(slab, calc))
        opt = BFGS(slab, logfile=None)
        converged = opt.run(fmax=fmax, steps=steps)
        end = _label(slab, calc)
        end.info.update(relax_steps=int(opt.nsteps), relax_converged=bool(converged))
        relaxed.append(end)
    return initial, relaxed
