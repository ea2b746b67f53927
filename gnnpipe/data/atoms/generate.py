"""Data sets that need no network: structures built with ASE and labelled with its EMT calculator.

* **OC20-like** (:func:`generate_oc20_like`): fcc(111) slabs of the EMT metals (Al, Ni, Cu, Pd, Ag, Pt, Au) with
  an adsorbate (O, H, N, C, CO, OH) on a standard site (ontop, bridge, fcc, hcp) placed by
  ``ase.build.add_adsorbate``; bottom layers fixed (``FixAtoms`` → ``fixed``), periodic in-plane
  (``pbc = [T, T, F]``), vacuum above and below, OC20 tags (0 sub-surface, 1 surface, 2 adsorbate). Frames are
  rattled copies and the steps of short BFGS relaxations (Chanussot et al., *Open Catalyst 2020*, ACS Catal. 2021:
  the S2EF task labels frames of relaxation trajectories).
* **OC20-like relaxation paths** (:func:`generate_oc20_paths`): frames along whole EMT relaxations of structures
  drawn as the IS2RS set's initial ones (:func:`generate_oc20_is2rs`), from the initial structure to the minimum:
  training data that covers what a relaxation visits.
* **MD17-like** (:func:`generate_md17_like`): small molecules of H, C, N, O from ``ase.build.molecule``, frames
  of a Langevin trajectory at 300 K (Chmiela et al., *Machine learning of accurate energy-conserving molecular
  force fields*, Sci. Adv. 2017, sample molecular-dynamics trajectories).
* **Bulk** (:func:`generate_bulk_like`): strained and rattled bulk crystals (fcc, bcc, hcp) and random
  substitutional alloys of the EMT metals, 1–2 conventional cells along each axis (4–32 atoms), periodic in 3D,
  labelled with EMT's stress as well (eV/Å³, ASE's convention): the set for training on stress, as materials sets
  (Materials Project trajectories, OMat24) label strained and rattled bulk structures.

Labels: EMT energies (eV) and forces (eV/Å; the raw forces, fixed atoms included), and for the bulk set the stress,
stored in a ``SinglePointCalculator``, so ``ase.io.write`` writes them as extended-XYZ properties. EMT (Jacobsen,
Stoltze, Nørskov, Surf. Sci. 1996) is an effective-medium potential: cheap and smooth, not DFT; these sets exercise
the pipeline, they are not chemistry. :func:`generated_file` writes a set once under the cache folder, keyed by its
arguments; ``gnnpipe atoms generate`` is its command.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from ase import Atoms, units
from ase.calculators.singlepoint import SinglePointCalculator
from ase.units import Bohr

from ..datasets import default_cache_dir
from .sets import read_structures

__all__ = [
    "BULK_LATTICES",
    "EMT_METALS",
    "GENERATORS",
    "MD17_MOLECULES",
    "OC20_ADSORBATES",
    "OC20_SITES",
    "generate_bulk_like",
    "generate_md17_like",
    "generate_oc20_is2rs",
    "generate_oc20_like",
    "generate_oc20_paths",
    "generated_file",
    "generated_structures",
    "reference_path",
]

#: fcc metals EMT has parameters for
EMT_METALS = ("Al", "Ni", "Cu", "Pd", "Ag", "Pt", "Au")
#: adsorbates of the OC20-like set
OC20_ADSORBATES = ("O", "H", "N", "C", "CO", "OH")
#: adsorption sites of an fcc(111) surface (``ase.build.fcc111``)
OC20_SITES = ("ontop", "bridge", "fcc", "hcp")
#: crystal structures of the bulk set (``ase.build.bulk`` names)
BULK_LATTICES = ("fcc", "bcc", "hcp")
#: molecules of the MD17-like set (``ase.build.molecule`` names; only H, C, N, O)
MD17_MOLECULES = ("CH3CH2OH", "C6H6", "CH3CHO", "HCOOH", "CH3COOH", "C2H6", "CH3OH", "CH4", "NH3", "C2H4")

#: height of the adsorbate's binding atom above the surface, Å, per site
_HEIGHT = {"ontop": 1.85, "bridge": 1.55, "fcc": 1.25, "hcp": 1.25}
#: the version of the generators' output: part of the cache key, raised whenever the output changes
_VERSION = 1


def _adsorbate(name: str):
    if name == "CO":
        return Atoms("CO", positions=[[0, 0, 0], [0, 0, 1.15]])
    if name == "OH":
        return Atoms("OH", positions=[[0, 0, 0], [0, 0, 0.97]])
    return Atoms(name, positions=[[0, 0, 0]])


def _label(atoms, calc, stress: bool = False) -> object:
    """A copy of ``atoms`` holding its EMT energy and raw forces (and with ``stress`` its stress, ASE's 6 Voigt
    values) in a SinglePointCalculator.

    ``atoms`` keeps ``calc`` attached, so a relaxation that already evaluated this geometry is not recomputed.
    """
    if atoms.calc is not calc:
        atoms.calc = calc
    results = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(apply_constraint=False)}
    if stress:
        results["stress"] = atoms.get_stress(voigt=True, apply_constraint=False)
    out = atoms.copy()
    out.calc = SinglePointCalculator(out, **results)
    return out


def _random_slab(rng, metals, adsorbates, sites, size: Sequence[int], vacuum: float, fixed_layers: int):
    """:func:`_slab` of a metal, an adsorbate and a site drawn from ``rng`` (in that order)."""
    metal = metals[rng.integers(len(metals))]
    ads = adsorbates[rng.integers(len(adsorbates))]
    site = sites[rng.integers(len(sites))]
    return _slab(metal, ads, site, size, vacuum, fixed_layers)


def _slab(metal: str, adsorbate: str, site: str, size: Sequence[int], vacuum: float, fixed_layers: int):
    from ase.build import add_adsorbate, fcc111
    from ase.constraints import FixAtoms

    slab = fcc111(metal, size=tuple(size), vacuum=vacuum)
    layer = slab.get_tags()                            # 1 = top layer ... size[2] = bottom layer
    n_slab = len(slab)
    height = _HEIGHT[site] - (0.3 if adsorbate == "H" else 0.0)
    add_adsorbate(slab, _adsorbate(adsorbate), height, position=site, mol_index=0)
    slab.center(vacuum=vacuum, axis=2)
    tags = np.full(len(slab), 2)
    tags[:n_slab] = np.where(layer == 1, 1, 0)
    slab.set_tags(tags)
    fixed = np.zeros(len(slab), dtype=bool)
    fixed[:n_slab] = layer > size[2] - fixed_layers
    slab.set_constraint(FixAtoms(mask=fixed))
    slab.info.pop("adsorbate_info", None)
    slab.info.update(metal=metal, adsorbate=adsorbate, site=site)
    return slab


def generate_oc20_like(frames: int, seed: int = 0, *, metals: Sequence[str] = EMT_METALS,
                       adsorbates: Sequence[str] = OC20_ADSORBATES, sites: Sequence[str] = OC20_SITES,
                       size: Sequence[int] = (2, 2, 3), vacuum: float = 6.0, fixed_layers: int = 1,
                       rattle: float = 0.05, relax_steps: int = 4, relax_share: float = 0.5) -> list:
    """OC20-like adsorbate-on-slab frames labelled by EMT.

    Each system draws a metal, an adsorbate and a site; with probability ``relax_share`` it contributes the
    first ``relax_steps + 1`` frames of a BFGS relaxation started from a rattled copy (``2 · rattle``), else one
    rattled copy (Gaussian displacements of std ``rattle`` Å on the free atoms).

    Args:
        frames: number of structures (≥ 1).
        seed: seeds every draw (metal, adsorbate, site, displacements): the same arguments give the same frames.
        metals, adsorbates, sites: the choices (EMT metals; ``O H N C CO OH``; ``ontop bridge fcc hcp``).
        size: the slab's atoms along a, b and its layers (``ase.build.fcc111``); ``(2, 2, 3)`` = 12 metal atoms.
        vacuum: Å of vacuum on each side of the slab along z (non-periodic).
        fixed_layers: bottom layers held fixed (``FixAtoms``; ``fixed`` in the data).
        rattle: std of the displacements, Å.
        relax_steps: BFGS steps per relaxation trajectory.
        relax_share: the probability that a system contributes a relaxation trajectory rather than a rattle.

    Returns:
        ``frames`` ``ase.Atoms`` with ``pbc = [T, T, F]``, OC20 tags, ``FixAtoms`` and a ``SinglePointCalculator``
        (energy eV, forces eV/Å); ``info`` names metal, adsorbate and site.

    Raises:
        ValueError: ``frames < 1``, an unknown metal, adsorbate or site, or ``fixed_layers`` not below the layers.
    """
    from ase.calculators.emt import EMT
    from ase.optimize import BFGS

    _check_choices(metals, EMT_METALS, "metal")
    _check_choices(sites, OC20_SITES, "site")
    for a in adsorbates:
        if a not in OC20_ADSORBATES:
            raise ValueError(f"unknown adsorbate {a!r}; choose from {', '.join(OC20_ADSORBATES)}")
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if not 0 <= fixed_layers < size[2]:
        raise ValueError(f"fixed_layers must be in [0, {size[2]}) for {size[2]} layers, got {fixed_layers}")
    rng = np.random.default_rng(seed)
    calc = EMT()
    out: list = []
    while len(out) < frames:
        slab = _random_slab(rng, metals, adsorbates, sites, size, vacuum, fixed_layers)
        if rng.random() < relax_share and relax_steps > 0:
            slab.rattle(2 * rattle, seed=int(rng.integers(2**31)))
            slab.calc = calc
            traj: list = []
            opt = BFGS(slab, logfile=None)
            opt.attach(lambda s=slab, t=traj: t.append(_label(s, calc)), interval=1)
            opt.run(fmax=0.05, steps=relax_steps)
            out.extend(traj[: frames - len(out)])
        else:
            slab.rattle(rattle, seed=int(rng.integers(2**31)))
            out.append(_label(slab, calc))
    return out


def generate_md17_like(frames: int, seed: int = 0, *, molecules: Sequence[str] = MD17_MOLECULES,
                       temperature: float = 300.0, timestep: float = 0.5, stride: int = 3) -> list:
    """MD17-like frames of small molecules labelled by EMT.

    The frames are split evenly over ``molecules``; each molecule runs a Langevin trajectory (``ase.md.Langevin``,
    friction 0.02 / fs) from a Maxwell-Boltzmann start at ``temperature``, keeping every ``stride``-th step.

    Args:
        frames: number of structures (≥ 1).
        seed: seeds the velocities and the thermostat's noise.
        molecules: ``ase.build.molecule`` names made of H, C, N, O (EMT's light elements).
        temperature: K.
        timestep: fs.
        stride: MD steps between kept frames.

    Returns:
        ``frames`` non-periodic ``ase.Atoms`` (zero cell) with a ``SinglePointCalculator`` (energy eV, forces
        eV/Å); ``info["molecule"]`` names the molecule.

    Raises:
        ValueError: ``frames < 1``, ``stride < 1``, or a molecule with an element EMT lacks.
    """
    from ase.build import molecule
    from ase.calculators.emt import EMT
    from ase.md import velocitydistribution
    from ase.md.langevin import Langevin

    # ase >= 3.29 names it thermalize_momenta (MaxwellBoltzmannDistribution is deprecated there)
    thermalize = getattr(velocitydistribution, "thermalize_momenta",
                         velocitydistribution.MaxwellBoltzmannDistribution)

    if frames < 1 or stride < 1:
        raise ValueError(f"frames and stride must be >= 1, got frames={frames}, stride={stride}")
    mols = [molecule(name) for name in molecules]
    for name, m in zip(molecules, mols):
        if not set(m.get_chemical_symbols()) <= {"H", "C", "N", "O"}:
            raise ValueError(f"molecule {name!r} has elements EMT cannot label; use molecules of H, C, N, O")
    rng = np.random.default_rng(seed)
    share = [frames // len(mols) + (1 if k < frames % len(mols) else 0) for k in range(len(mols))]
    out: list = []
    for name, m, count in zip(molecules, mols, share):
        if count == 0:
            continue
        m.calc = EMT()
        thermalize(m, temperature_K=temperature, rng=rng)
        dyn = Langevin(m, timestep * units.fs, temperature_K=temperature, friction=0.02 / units.fs,
                       fixcm=False, rng=rng)
        for _ in range(count):
            dyn.run(stride)
            frame = _label(m, m.calc)
            frame.info["molecule"] = name
            out.append(frame)
    return out


def _atomic_volume(metal: str) -> float:
    """Å³ per atom of ``metal`` at EMT's equilibrium Wigner–Seitz radius ``s0`` (its parameters): ``4π s0³ / 3``."""
    from ase.calculators.emt import parameters

    return 4.0 * np.pi / 3.0 * (parameters[metal][1] * Bohr) ** 3


def _crystal(metal: str, lattice: str):
    """The conventional cell of ``metal`` in ``lattice`` at EMT's atomic volume: fcc cubic (4 atoms), bcc cubic
    (2), hcp orthorhombic (4, ideal c/a)."""
    from ase.build import bulk

    volume = _atomic_volume(metal)
    if lattice == "fcc":
        return bulk(metal, "fcc", a=(4.0 * volume) ** (1 / 3), cubic=True)
    if lattice == "bcc":
        return bulk(metal, "bcc", a=(2.0 * volume) ** (1 / 3), cubic=True)
    c_a = np.sqrt(8.0 / 3.0)
    a = (2.0 * volume / (np.sqrt(3.0) / 2.0 * c_a)) ** (1 / 3)
    return bulk(metal, "hcp", a=a, c=c_a * a, orthorhombic=True)


def generate_bulk_like(frames: int, seed: int = 0, *, metals: Sequence[str] = EMT_METALS,
                       lattices: Sequence[str] = BULK_LATTICES, max_repeat: int = 2, strain: float = 0.03,
                       rattle: float = 0.05, alloy_share: float = 0.5, max_fraction: float = 0.5) -> list:
    """Bulk crystals and alloys labelled by EMT with energy, forces and stress.

    Each frame draws a lattice, a host metal and repeats of the conventional cell (1 … ``max_repeat`` along each
    axis; a 2-atom bcc cell at least twice along one, so 4–32 atoms with the defaults); with probability
    ``alloy_share`` a second metal replaces each atom with probability ``x ~ U(0.1, max_fraction)``. The cell is
    scaled to the mean EMT atomic volume of its atoms (Vegard's law: near zero pressure), then strained by a random
    symmetric strain ε (entries ``U(−strain, strain)``; cell and positions times ``1 + ε``), and the atoms rattled
    (Gaussian displacements of std ``rattle`` Å): the strain gives each frame a stress, the rattle forces.

    Args:
        frames: number of structures (≥ 1).
        seed: seeds every draw: the same arguments give the same frames.
        metals: the choices of host and alloying metal (EMT metals). lattices: ``fcc``, ``bcc``, ``hcp``.
        max_repeat: the most repeats of the conventional cell along an axis. strain: the largest strain component.
        rattle: std of the displacements, Å. alloy_share: the probability of an alloy. max_fraction: the largest
            expected share of the second metal.

    Returns:
        ``frames`` ``ase.Atoms`` periodic in 3D with a ``SinglePointCalculator`` (energy eV, forces eV/Å, stress
        eV/Å³ as ASE's 6 Voigt values); ``info`` names the ``lattice`` and the ``metals`` (``"Cu"``, ``"Cu-Pd"``:
        host first).

    Raises:
        ValueError: ``frames < 1``, an unknown metal or lattice, ``max_repeat < 1``, or a negative ``strain``,
            ``rattle`` or a ``max_fraction`` outside [0.1, 1].
    """
    from ase.calculators.emt import EMT

    _check_choices(metals, EMT_METALS, "metal")
    _check_choices(lattices, BULK_LATTICES, "lattice")
    if frames < 1 or max_repeat < 1:
        raise ValueError(f"frames and max_repeat must be >= 1, got frames={frames}, max_repeat={max_repeat}")
    if strain < 0 or rattle < 0 or not 0.1 <= max_fraction <= 1:
        raise ValueError(f"strain and rattle must be >= 0 and max_fraction in [0.1, 1], got strain={strain}, "
                         f"rattle={rattle}, max_fraction={max_fraction}")
    rng = np.random.default_rng(seed)
    calc = EMT()
    out: list = []
    for _ in range(frames):
        lattice = lattices[rng.integers(len(lattices))]
        host = metals[rng.integers(len(metals))]
        unit = _crystal(host, lattice)
        reps = rng.integers(1, max_repeat + 1, size=3)
        if len(unit) * int(np.prod(reps)) < 4 and max_repeat > 1:
            reps[rng.integers(3)] = 2
        atoms = unit.repeat(tuple(int(r) for r in reps))
        names = host
        others = [m for m in metals if m != host]
        if others and rng.random() < alloy_share:
            other = others[rng.integers(len(others))]
            swap = rng.random(len(atoms)) < rng.uniform(0.1, max_fraction)
            symbols = np.array(atoms.get_chemical_symbols(), dtype=object)
            symbols[swap] = other
            atoms.set_chemical_symbols(list(symbols))
            names = f"{host}-{other}" if swap.any() else host
        volume = np.mean([_atomic_volume(s) for s in atoms.get_chemical_symbols()])
        atoms.set_cell(atoms.cell.array * (volume / _atomic_volume(host)) ** (1 / 3), scale_atoms=True)
        eps = rng.uniform(-strain, strain, size=(3, 3))
        eps = (eps + eps.T) / 2
        atoms.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
        atoms.positions = atoms.positions + rng.normal(0.0, rattle, size=(len(atoms), 3))
        atoms.info.update(lattice=lattice, metals=names)
        out.append(_label(atoms, calc, stress=True))
    return out


def _check_choices(given, allowed, what):
    for g in given:
        if g not in allowed:
            raise ValueError(f"unknown {what} {g!r}; choose from {', '.join(allowed)}")


def reference_path(path: str | Path) -> Path:
    """Where the reference relaxed structures of an IS2RS set's initial file go: ``X.extxyz`` → ``X.relaxed.extxyz``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.relaxed{p.suffix or '.extxyz'}")


def generate_oc20_is2rs(frames: int, seed: int = 0, *, metals: Sequence[str] | None = None,
                        adsorbates: Sequence[str] | None = None, sites: Sequence[str] | None = None,
                        size: Sequence[int] = (2, 2, 3), vacuum: float = 6.0, fixed_layers: int = 1,
                        rattle: float = 0.1, lift: float = 0.3, fmax: float = 0.01, steps: int = 500) -> tuple:
    """``frames`` initial structures and their EMT-relaxed structures: an OC20-like IS2RS / IS2RE set (EMT is the
    oracle here; DFT in OC20: Chanussot et al., *Open Catalyst 2020*, ACS Catal. 2021, whose IS2RS and IS2RE tasks
    pair each initial structure with the end of its DFT relaxation).

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
        slab = _random_slab(rng, metals, adsorbates, sites, size, vacuum, fixed_layers)
        slab.positions[slab.get_tags() == 2, 2] += rng.uniform(0, lift)
        slab.rattle(rattle, seed=int(rng.integers(2**31)))
        initial.append(_label(slab, calc))
        opt = BFGS(slab, logfile=None)
        converged = opt.run(fmax=fmax, steps=steps)
        end = _label(slab, calc)
        end.info.update(relax_steps=int(opt.nsteps), relax_converged=bool(converged))
        relaxed.append(end)
    return initial, relaxed


def generate_oc20_paths(frames: int, seed: int = 0, *, metals: Sequence[str] | None = None,
                        adsorbates: Sequence[str] | None = None, sites: Sequence[str] | None = None,
                        size: Sequence[int] = (2, 2, 3), vacuum: float = 6.0, fixed_layers: int = 1,
                        rattle: float = 0.1, lift: float = 0.3, fmax: float = 0.01, steps: int = 500,
                        stride: int = 3) -> list:
    """S2EF frames along whole EMT relaxations of OC20-like IS2RS initial structures: training data whose
    distribution covers the structures a relaxation visits, from the initial structure to the minimum (the S2EF
    task of Chanussot et al., *Open Catalyst 2020*, ACS Catal. 2021, labels frames of DFT relaxation trajectories).

    Each system is drawn as :func:`generate_oc20_is2rs` draws one (the same arguments); its ASE ``BFGS`` relaxation
    with EMT to ``fmax`` eV/Å (at most ``steps``) contributes every ``stride``-th frame and the last one, until
    ``frames`` frames are written. ``generate_oc20_paths(n, seed)`` and ``generate_oc20_is2rs(m, seed)`` draw the
    same first systems: give the evaluation set another seed.

    Returns:
        ``frames`` ``ase.Atoms`` with ``FixAtoms``, OC20 tags and a ``SinglePointCalculator`` (EMT energy eV,
        forces eV/Å); ``info`` names metal, adsorbate and site.

    Raises:
        ValueError: ``frames < 1``, ``stride < 1`` or the choices :func:`generate_oc20_like` refuses.
    """
    from ase.calculators.emt import EMT
    from ase.optimize import BFGS

    metals, adsorbates, sites = metals or EMT_METALS, adsorbates or OC20_ADSORBATES, sites or OC20_SITES
    _check_choices(metals, EMT_METALS, "metal")
    _check_choices(adsorbates, OC20_ADSORBATES, "adsorbate")
    _check_choices(sites, OC20_SITES, "site")
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    rng = np.random.default_rng(seed)
    calc = EMT()
    out: list = []
    while len(out) < frames:
        slab = _random_slab(rng, metals, adsorbates, sites, size, vacuum, fixed_layers)
        slab.positions[slab.get_tags() == 2, 2] += rng.uniform(0, lift)
        slab.rattle(rattle, seed=int(rng.integers(2**31)))
        slab.calc = calc
        traj: list = []
        opt = BFGS(slab, logfile=None)
        opt.attach(lambda s=slab, t=traj: t.append(_label(s, calc)), interval=1)
        opt.run(fmax=fmax, steps=steps)
        keep = traj[::stride] + ([traj[-1]] if (len(traj) - 1) % stride else [])
        out.extend(keep[: frames - len(out)])
    return out


#: generator of each kind of data set (``oc20-is2rs`` returns initial and relaxed structures: two files)
GENERATORS = {"oc20": generate_oc20_like, "md17": generate_md17_like, "oc20-is2rs": generate_oc20_is2rs,
              "oc20-paths": generate_oc20_paths, "bulk": generate_bulk_like}


def _cache_root() -> Path:
    return default_cache_dir() / "atoms"


def generated_file(kind: str = "oc20", frames: int = 200, seed: int = 0, *, out: str | os.PathLike | None = None,
                   overwrite: bool = False, **kwargs) -> Path:
    """Write a generated data set as extended XYZ once, and return its path.

    Args:
        kind: ``"oc20"`` (:func:`generate_oc20_like`), ``"md17"`` (:func:`generate_md17_like`), ``"bulk"``
            (:func:`generate_bulk_like`: with stresses), ``"oc20-paths"`` (:func:`generate_oc20_paths`) or
            ``"oc20-is2rs"`` (:func:`~gnnpipe.data.atoms.generate.generate_oc20_is2rs`: the initial structures, and
            their EMT-relaxed ones written beside them as ``<stem>.relaxed.extxyz``).
        frames, seed, kwargs: the generator's arguments.
        out: the file to write (always written); ``None``: the cached file
            ``<cache>/atoms/<kind>-<frames>-s<seed>-<hash>.extxyz`` under ``$GNNPIPE_CACHE`` (default
            ``~/.cache/gnnpipe/datasets``), the hash keying every argument, its arguments recorded beside it in
            ``<file>.args.json``; written once, then reused.
        overwrite: regenerate the cached file even if it exists.

    Returns:
        the path of the extended-XYZ file (energies and forces as properties, read back by
        :func:`~gnnpipe.data.atoms.read_structures`).

    Raises:
        ValueError: an unknown kind, or the generator's own errors.
    """
    if kind not in GENERATORS:
        raise ValueError(f"unknown generated data set {kind!r}; choose from {', '.join(GENERATORS)}")
    args = {"kind": kind, "frames": int(frames), "seed": int(seed), "version": _VERSION,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in sorted(kwargs.items())}}
    key = hashlib.sha1(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    path = Path(out).expanduser() if out is not None else _cache_root() / f"{kind}-{frames}-s{seed}-{key}.extxyz"
    stamp = path.with_name(path.name + ".args.json")
    if out is None and not overwrite and path.is_file() and stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == args:
                return path
        except (OSError, ValueError):
            pass
    import ase.io

    atoms = GENERATORS[kind](frames, seed, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(atoms, tuple):  # an IS2RS set: the initial structures here, the relaxed ones beside them
        atoms, relaxed = atoms
        ref = reference_path(path)
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        ase.io.write(str(tmp), relaxed, format="extxyz")
        os.replace(tmp, ref)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    ase.io.write(str(tmp), atoms, format="extxyz")
    os.replace(tmp, path)
    if out is None:
        stamp.write_text(json.dumps(args, sort_keys=True))
    return path


def generated_structures(kind: str = "oc20", frames: int = 200, seed: int = 0, *, dtype=None, **kwargs) -> list:
    """The structures (``Data``) of :func:`generated_file`, read back from the cached file."""
    path = generated_file(kind, frames, seed, **kwargs)
    return read_structures(path, dtype=dtype or torch.float32, require_labels=True)
