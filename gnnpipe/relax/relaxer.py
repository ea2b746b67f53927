"""Relax many structures at once with a trained S2EF model (IS2RS: initial structure → relaxed structure).

Every step builds one neighbour graph and runs one forward (energies and conservative or direct forces) over all
structures still running; each structure leaves the batch when the largest force on its free atoms falls below
``fmax`` or after ``steps`` steps, exactly where ASE's ``Optimizer.run(fmax, steps)`` would stop it (the same
checks in the same order: forces, convergence, step). The optimizers are ``gnnpipe.relax.optimizers``'.

As fairchem's batched relaxations (``OptimizableBatch`` and its L-BFGS; Chanussot et al., *Open Catalyst 2020*,
ACS Catal. 2021, §IS2RS), but with each structure's trajectory the one ASE gives it alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError

__all__ = ["RelaxResult", "relax", "relax_file"]


@dataclass
class RelaxResult:
    """Relaxed structures and how each relaxation ended.

    Attributes:
        structures: one ``Data`` per input structure, in input order: ``pos`` float64 Å (the last positions),
            ``energy [1]`` eV and ``forces [n, 3]`` eV/Å (the model's, raw) at them, and the input's other fields.
        energies: float64 ``[S]`` eV, the model's energies of the relaxed structures.
        fmax: float64 ``[S]`` eV/Å, the largest force on a free atom at the end.
        steps: int64 ``[S]``, optimizer steps taken.
        converged: bool ``[S]``, ``fmax`` below the threshold.
        done: bool ``[S]``, finished (converged or out of steps); false only after an interruption.
        interrupted: a ``KeyboardInterrupt`` stopped the run (the running structures keep their current positions).
        forward_calls: batched forwards run; evaluations: structure-forwards summed over steps.
        trajectories: per structure, the list of ``(pos [n, 3], energy, forces [n, 3])`` frames, when asked for.
    """

    structures: list
    energies: Tensor
    fmax: Tensor
    steps: Tensor
    converged: Tensor
    done: Tensor
    interrupted: bool = False
    forward_calls: int = 0
    evaluations: int = 0
    trajectories: Optional[list] = field(default=None, repr=False)

    def to_atoms(self) -> list:
        """The relaxed structures as ``ase.Atoms`` (``FixAtoms``, tags, a ``SinglePointCalculator`` with the
        model's energy and forces); ``info`` holds ``relax_steps``, ``relax_converged``, ``relax_fmax``,
        ``relax_done``."""
        from ..data.atoms import to_atoms

        out = []
        for k, d in enumerate(self.structures):
            a = to_atoms(d)
            a.info.update(relax_steps=int(self.steps[k]), relax_converged=bool(self.converged[k]),
                          relax_fmax=float(self.fmax[k]), relax_done=bool(self.done[k]))
            out.append(a)
        return out


def _optimizer(name: str, batch: Tensor, num: int, options: dict):
    from .optimizers import OPTIMIZERS

    cls = OPTIMIZERS.get(name)
    if cls is None:
        raise ConfigError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
    try:
        return cls(batch, num, **options)
    except TypeError as exc:
        raise ConfigError(f"optimizer {name!r}: {exc}; see gnnpipe.relax.optimizers.{cls.__name__}") from None


def relax(model, structures: Sequence, *, optimizer: str = "fire", fmax: float = 0.05, steps: int = 200,
          device: str | torch.device = "cpu", batch_size: Optional[int] = None, trajectories: bool = False,
          progress: bool = False, **options) -> RelaxResult:
    """Relax ``structures`` together with ``model``'s energies and forces.

    Args:
        model: an S2EF model (a training result's model, or one loaded by :func:`gnnpipe.models.load` from a file of
            ``gnnpipe export``), or the path of such a file.
        structures: PyG ``Data`` as ``gnnpipe.data.atoms.read_structures`` gives them (``z``, ``pos``, ``cell``,
            ``pbc``, ``fixed``; labels ignored), or ``ase.Atoms`` (``FixAtoms`` read as ``fixed``).
        optimizer: ``"fire"`` or ``"lbfgs"`` (``gnnpipe.relax.optimizers``); ``options`` are its parameters
            (ASE's names: ``dt``, ``maxstep``, ``downhill_check``, ``memory``, ``alpha``, …).
        fmax: eV/Å; a structure stops when the largest force norm on its free atoms is below it (> 0).
        steps: the most optimizer steps per structure (≥ 0).
        device: where the model runs (``"cpu"``, ``"cuda"``); the optimizer state lives there too.
        batch_size: at most this many structures in one batch (``None``: all at once); further batches run after.
        trajectories: keep every structure's frames (``RelaxResult.trajectories``).
        progress: draw a progress bar (structures converged / running) on a terminal.

    Returns:
        a :class:`RelaxResult`; on ``KeyboardInterrupt`` the structures relaxed so far and the others at their
        current positions, ``interrupted=True``.

    Raises:
        ConfigError: ``fmax <= 0``, ``steps < 0``, an unknown optimizer or option, a model not trained for S2EF.
        DataValidationError: a malformed structure.
    """
    from ..progress import progress_bar
    from ..tasks.s2ef.predict import task_meta

    if not fmax > 0:
        raise ConfigError(f"fmax must be > 0 eV/Å, got {fmax}")
    if steps < 0:
        raise ConfigError(f"steps must be >= 0, got {steps}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(model, (str, os.PathLike)):
        from ..models import load

        model = load(model)
    task_meta(model)
    _optimizer(optimizer, torch.zeros(0, dtype=torch.long), 0, options)  # unknown names fail before any work
    structures = _as_structures(structures)
    device = torch.device(device)
    model = model.to(device).eval()
    n = len(structures)
    res = RelaxResult(structures=[None] * n, energies=torch.zeros(n, dtype=torch.float64),
                      fmax=torch.full((n,), float("nan"), dtype=torch.float64),
                      steps=torch.zeros(n, dtype=torch.long), converged=torch.zeros(n, dtype=torch.bool),
                      done=torch.zeros(n, dtype=torch.bool), trajectories=[[] for _ in range(n)] if trajectories
                      else None)
    bar = progress_bar(total=n, unit="structure", desc="relax", enabled=progress)
    size = batch_size or max(n, 1)
    try:
        for start in range(0, n, size):
            _relax_group(model, structures, list(range(start, min(n, start + size))), res, optimizer, options,
                         fmax, steps, device, bar)
    except KeyboardInterrupt:
        res.interrupted = True
    finally:
        bar.close()
    for k in range(n):  # structures of batches never started keep their initial positions
        if res.structures[k] is None:
            d = structures[k].clone()
            d.pos = d.pos.double()
            res.structures[k] = d
    return res


def _as_structures(structures) -> list:
    from ase import Atoms

    from ..data.atoms import from_atoms

    structures = list(structures)
    if structures and isinstance(structures[0], Atoms):
        structures = from_atoms(structures, dtype=torch.float64)
    return structures


def _relax_group(model, structures, indices, res: RelaxResult, optimizer, options, fmax, steps, device, bar):
    """Relax the structures ``indices`` as one batch, writing each into ``res`` as it finishes."""
    from torch_geometric.data import Batch

    from ..tasks.s2ef.data import prepare_structures
    from ..tasks.s2ef.normalizer import EnergyNormalizer
    from ..tasks.s2ef.predict import energies_forces, task_meta
    from ..data.atoms import build_graph
    from .optimizers import segment_max

    meta = task_meta(model)
    norm = EnergyNormalizer.from_dict(meta["normalizer"])
    cutoff, cap, tri = meta["cutoff"], meta["max_neighbors"], bool(getattr(model, "uses_triplets", True))

    def graph_fn(b):   # the calculator's graph (graph_builder's), found for all structures at once
        return build_graph(b, cutoff, cap, with_triplets=tri, method="batch")
    dtype = next(model.parameters()).dtype
    group = [structures[k] for k in indices]
    # positions stay float64 (ASE's) in the optimizer; the model sees them cast to its dtype, as the calculator does
    pos = torch.cat([d.pos.to(torch.float64) for d in group]).to(device)
    prepared = prepare_structures(group, dtype, labelled=False, source="structure")
    for d in prepared:
        for key in ("energy", "forces"):
            if key in d:
                del d[key]
    running = list(range(len(group)))        # positions in ``group`` of the structures still running
    batch = Batch.from_data_list(prepared).to(device)
    free = ~batch.fixed.bool()
    opt = _optimizer(optimizer, batch.batch, len(group), options)
    taken = 0
    try:
        while running:
            batch.pos = pos.to(dtype)
            with torch.no_grad():
                energy, forces = energies_forces(model, batch, graph_fn(batch), norm)
            res.forward_calls += 1
            res.evaluations += len(running)
            forces = torch.where(free.unsqueeze(-1), forces, torch.zeros_like(forces))
            worst = segment_max(forces.norm(dim=1), batch.batch, len(running)).clamp(min=0)
            if res.trajectories is not None:
                _record(res, indices, running, batch, pos, energy, forces)
            finished = (worst < fmax) | (taken >= steps)
            if bool(finished.any()):
                for local in torch.nonzero(finished).flatten().tolist():
                    _finish(res, indices[running[local]], group[running[local]], batch, local, pos, energy,
                            forces, worst, taken, fmax)
                keep = ~finished
                running = [r for r, k in zip(running, keep.tolist()) if k]
                bar.update(int(finished.sum()))
                bar.set_postfix_str(f"converged {int(res.converged.sum())}, running {len(running)}")
                if not running:
                    break
                atoms = keep[batch.batch]
                opt.select(keep)
                pos, energy, forces = pos[atoms], energy[keep], forces[atoms]
                batch = Batch.from_data_list([prepared[r] for r in running]).to(device)
                free = ~batch.fixed.bool()
            pos = opt.step(pos, forces, energy)
            taken += 1
    except KeyboardInterrupt:
        for local, r in enumerate(running):     # the running structures at their current positions
            k = indices[r]
            sel = batch.batch == local
            d = group[r].clone()
            d.pos = pos[sel].detach().cpu()
            res.structures[k] = d
            res.steps[k] = taken
        raise


def _finish(res, k, source, batch, local, pos, energy, forces, worst, taken, fmax):
    sel = batch.batch == local
    d = source.clone()
    d.pos = pos[sel].detach().cpu().to(torch.float64)
    d.energy = energy[local].detach().cpu().reshape(1)
    d.forces = forces[sel].detach().cpu()
    res.structures[k] = d
    res.energies[k] = float(energy[local])
    res.fmax[k] = float(worst[local])
    res.steps[k] = taken
    res.converged[k] = bool(worst[local] < fmax)
    res.done[k] = True


def _record(res, indices, running, batch, pos, energy, forces):
    for local, r in enumerate(running):
        sel = batch.batch == local
        res.trajectories[indices[r]].append((pos[sel].detach().cpu().clone(), float(energy[local]),
                                             forces[sel].detach().cpu().clone()))


def write_trajectories(res: RelaxResult, folder: str | Path) -> list[Path]:
    """Write each structure's frames as ``FOLDER/<index>.extxyz`` (positions, energy, forces of every step).

    Raises:
        ConfigError: the result holds no trajectories (relax with ``trajectories=True``).
    """
    import ase.io
    from ase.calculators.singlepoint import SinglePointCalculator

    from ..data.atoms import to_atoms

    if res.trajectories is None:
        raise ConfigError("no trajectories were kept; relax with trajectories=True (gnnpipe relax --trajectory DIR)")
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, frames in enumerate(res.trajectories):
        images = []
        for pos, e, f in frames:
            d = res.structures[k].clone()
            d.pos = pos
            for key in ("energy", "forces"):
                if key in d:
                    del d[key]
            a = to_atoms(d)
            a.calc = SinglePointCalculator(a, energy=e, forces=f.numpy())
            images.append(a)
        p = out / f"{k}.extxyz"
        ase.io.write(str(p), images, format="extxyz")
        paths.append(p)
    return paths


def relax_file(model, dataset: str | os.PathLike, out: str | os.PathLike, **kwargs) -> RelaxResult:
    """Read ``dataset`` (extended XYZ, ``.traj``, ASE ``.db``), relax it with :func:`relax` (``kwargs``) and write the
    relaxed structures to ``out`` as extended XYZ (written also when interrupted: the structures relaxed so far,
    the others at their current positions with ``relax_done=False``)."""
    import ase.io

    from ..data.atoms import read_structures

    structures = read_structures(dataset, dtype=torch.float64)
    res = relax(model, structures, **kwargs)
    target = Path(out).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    ase.io.write(str(tmp), res.to_atoms(), format="extxyz")
    os.replace(tmp, target)
    return res
