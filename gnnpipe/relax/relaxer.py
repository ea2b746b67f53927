"""Relax many structures at once with a trained S2EF model (IS2RS: initial structure → relaxed structure).

Every step builds one neighbour graph and runs one forward (energies and conservative or direct forces) over all
structures still running; each structure leaves the batch when the largest force on its free atoms falls below
``fmax`` or after ``steps`` steps, exactly where ASE's ``Optimizer.run(fmax, steps)`` would stop it (the same
checks in the same order: forces, convergence, step). The optimizers are ``gnnpipe.relax.optimizers``'.

As fairchem's batched relaxations (``OptimizableBatch`` and its L-BFGS; Chanussot et al., *Open Catalyst 2020*,
ACS Catal. 2021, §IS2RS), but with each structure's trajectory the one ASE gives it alone.

Cells (``relax_cell=True``, ``gnnpipe relax --relax-cell``): positions and cell move together as ASE's
``FrechetCellFilter`` moves them (:class:`gnnpipe.relax.cell.FrechetCell`): each structure's forces and stress
give ``n + 3`` generalised forces, the optimizer steps its ``n + 3`` rows, and it stops when the largest row (the
atoms' forces and the cell's scaled virial) is below ``fmax``, where ``FIRE(FrechetCellFilter(atoms)).run(fmax)``
stops.

Graph parallelism (``gp_size = G > 1``; Sriram et al., *Towards Training Billion Parameter Graph Neural Networks for
Atomic Simulations*, ICLR 2022): the launcher (:func:`gnnpipe.core.run.launch.spawn`) starts ``G`` ranks joined in
one gloo group, as graph-parallel S2EF training does; each step every rank builds the same graph and the same
:class:`~gnnpipe.partitioners.GraphParallelPlan`, runs the model on its shard of the edges and triplets through
:class:`~gnnpipe.tasks.s2ef.graph_parallel.GraphParallelComm` (energies and conservative forces come back reduced and
replicated), takes rank 0's energies and forces (one broadcast, so every rank decides alike) and runs the same
optimizer step; rank 0 returns the result. Ctrl-C reaches every rank, which agree after the current step (one
all-reduce of the stop flag) to return what they have.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from torch import Tensor
from torch_geometric.data import Batch

from .. import partitioners
from ..core.comm import Comm
from ..core.run import launch, stopping
from ..data.atoms import build_graph, from_atoms, read_structures, to_atoms
from ..errors import ConfigError
from ..models import load
from ..partitioners import plan_graph_parallel
from ..progress import progress_bar
from ..tasks.s2ef import predict
from ..tasks.s2ef.data import prepare_structures
from ..tasks.s2ef.graph_parallel import MODES, GraphParallelComm
from ..tasks.s2ef.normalizer import EnergyNormalizer
from ..tasks.s2ef.predict import task_meta
from .cell import FrechetCell
from .optimizers import OPTIMIZERS, segment_max

__all__ = ["RelaxResult", "relax", "relax_file"]


@dataclass
class RelaxResult:
    """Relaxed structures and how each relaxation ended.

    Attributes:
        structures: one ``Data`` per input structure, in input order: ``pos`` float64 Å (the last positions),
            ``energy [1]`` eV and ``forces [n, 3]`` eV/Å (the model's, raw) at them, and the input's other fields;
            with cells relaxed also the last ``cell [1, 3, 3]`` (float64 Å) and the ``stress [1, 3, 3]`` (eV/Å³).
        energies: float64 ``[S]`` eV, the model's energies of the relaxed structures.
        fmax: float64 ``[S]`` eV/Å, the largest force on a free atom at the end (with cells relaxed: the largest
            generalised force, cell rows included, as ``FrechetCellFilter`` reports it).
        steps: int64 ``[S]``, optimizer steps taken.
        converged: bool ``[S]``, ``fmax`` below the threshold.
        done: bool ``[S]``, finished (converged or out of steps); false only after an interruption.
        interrupted: a ``KeyboardInterrupt`` stopped the run (the running structures keep their current positions).
        forward_calls: batched forwards run; evaluations: structure-forwards summed over steps.
        trajectories: per structure, the list of ``(pos [n, 3], energy, forces [n, 3], cell [3, 3])`` frames, when
            asked for.
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
    trajectories: list | None = field(default=None, repr=False)

    def to_atoms(self) -> list:
        """The relaxed structures as ``ase.Atoms`` (``FixAtoms``, tags, a ``SinglePointCalculator`` with the
        model's energy and forces); ``info`` holds ``relax_steps``, ``relax_converged``, ``relax_fmax``,
        ``relax_done``."""
        out = []
        for k, d in enumerate(self.structures):
            a = to_atoms(d)
            a.info.update(relax_steps=int(self.steps[k]), relax_converged=bool(self.converged[k]),
                          relax_fmax=float(self.fmax[k]), relax_done=bool(self.done[k]))
            out.append(a)
        return out


def _optimizer(name: str, batch: Tensor, num: int, options: dict):
    cls = OPTIMIZERS.get(name)
    if cls is None:
        raise ConfigError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
    try:
        return cls(batch, num, **options)
    except TypeError as exc:
        raise ConfigError(f"optimizer {name!r}: {exc}; see gnnpipe.relax.optimizers.{cls.__name__}") from None


def relax(model, structures: Sequence, *, optimizer: str = "fire", fmax: float = 0.05, steps: int = 200,
          device: str | torch.device = "cpu", batch_size: int | None = None, trajectories: bool = False,
          progress: bool = False, gp_size: int = 1, gp_partitioner: str = "edge-chunk", gp_mode: str = "allgather",
          threads: int | None = None, log_every_steps: int = 0, relax_cell: bool = False,
          scalar_pressure: float = 0.0, exp_cell_factor: float | None = None, hydrostatic_strain: bool = False,
          constant_volume: bool = False, **options) -> RelaxResult:
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
        log_every_steps: where no bar is drawn (not a terminal, or ``progress=False``), a line on standard error
            every ``k`` optimizer steps (the batch, structures converged and running, the largest force) and one as
            each batch starts; ``0``: none.
        gp_size: graph-parallel ranks ``G`` computing each step's forces (the module docstring); ``1``: this
            process. ``gp_partitioner`` (``edge-chunk``, ``atom-owner``, …) and ``gp_mode`` (``allgather``,
            ``halo``) as ``gnnpipe train --gp-partitioner / --gp-mode``.
        threads: torch threads of each graph-parallel rank (default: this process's threads over ``G``, at least 1).
        relax_cell: relax each cell with its positions (ASE's ``FrechetCellFilter``: the module docstring; structures
            periodic in 3D, a model with conservative forces); ``scalar_pressure`` (eV/Å³: the enthalpy ``E + pV``
            is relaxed), ``exp_cell_factor`` (default: the structure's atom count), ``hydrostatic_strain`` and
            ``constant_volume`` are the filter's options.

    Returns:
        a :class:`RelaxResult`; on ``KeyboardInterrupt`` the structures relaxed so far and the others at their
        current positions, ``interrupted=True``.

    Raises:
        ConfigError: ``fmax <= 0``, ``steps < 0``, an unknown optimizer or option, a model not trained for S2EF,
            ``gp_size < 1``, a model without graph-parallel hooks with ``gp_size > 1``, an unknown ``gp_mode``;
            ``relax_cell`` with a direct-forces model or a structure not periodic in 3D, a pressure that is not
            finite, ``exp_cell_factor <= 0``, ``hydrostatic_strain`` with ``constant_volume``.
        UnknownComponentError: an unknown ``gp_partitioner``.
        DataValidationError: a malformed structure.
        DistributedError: a graph-parallel rank failed (the message names it).
    """
    if not fmax > 0:
        raise ConfigError(f"fmax must be > 0 eV/Å, got {fmax}")
    if steps < 0:
        raise ConfigError(f"steps must be >= 0, got {steps}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(model, (str, os.PathLike)):
        model = load(model)
    task_meta(model)
    gp = options.pop("_gp", None)                # set inside a graph-parallel rank (_gp_rank)
    _optimizer(optimizer, torch.zeros(0, dtype=torch.long), 0, options)  # unknown names fail before any work
    _check_gp(model, gp_size, gp_partitioner, gp_mode)
    structures = _as_structures(structures)
    cell = None
    if relax_cell:
        if not math.isfinite(scalar_pressure):
            raise ConfigError(f"the pressure must be finite (eV/Å³; --pressure in GPa), got {scalar_pressure}")
        if exp_cell_factor is not None and not (math.isfinite(exp_cell_factor) and exp_cell_factor > 0):
            raise ConfigError(f"exp_cell_factor must be a finite number > 0, got {exp_cell_factor}")
        if hydrostatic_strain and constant_volume:
            raise ConfigError("--hydrostatic-strain with --constant-volume leaves the cell no freedom (it may only "
                              "scale, and its volume is fixed): give one of them")
        cell = dict(scalar_pressure=scalar_pressure, exp_cell_factor=exp_cell_factor,
                    hydrostatic_strain=hydrostatic_strain, constant_volume=constant_volume)
        _check_cells(model, structures)
    if gp_size > 1 and gp is None:
        return _spawn_gp(model, structures, dict(optimizer=optimizer, fmax=fmax, steps=steps, device=str(device),
                                                 batch_size=batch_size, trajectories=trajectories,
                                                 progress=progress, log_every_steps=log_every_steps,
                                                 relax_cell=relax_cell, **(cell or {}), **options),
                         gp_size, gp_partitioner, gp_mode, threads)
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
    # the forces need ∂E/∂pos only: parameters that do not require grad spare the backward their weight gradients
    # and the forward the tensors saved for them (the same values: tests/relax/test_optimizers.py)
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    lines = _StepLines(log_every_steps if bar.disable and (gp is None or gp["rank"] == 0) else 0,
                       -(-n // size), n)
    try:
        for start in range(0, n, size):
            lines.batch(min(n, start + size) - start)
            _relax_group(model, structures, list(range(start, min(n, start + size))), res, optimizer, options,
                         fmax, steps, device, bar, gp, lines, cell)
    except KeyboardInterrupt:
        res.interrupted = True
    finally:
        bar.close()
        for p in frozen:
            p.requires_grad_(True)
    for k in range(n):  # structures of batches never started keep their initial positions
        if res.structures[k] is None:
            d = structures[k].clone()
            d.pos = d.pos.double()
            res.structures[k] = d
    return res


def _check_cells(model, structures) -> None:
    """Refuse a cell relaxation without stresses: a direct-forces model, a structure not periodic in 3D."""
    if getattr(model, "direct_forces", False):
        raise ConfigError("--relax-cell needs stresses, and a model with direct forces has none; relax its positions "
                          "only, or train with conservative forces")
    for k, d in enumerate(structures):
        pbc = getattr(d, "pbc", None)
        if (pbc is None or not bool(pbc.bool().all())
                or abs(float(torch.linalg.det(d.cell.reshape(3, 3).double()))) < 1e-9):
            raise ConfigError(f"--relax-cell: structure {k} is not periodic in 3D (pbc and a cell of non-zero "
                              f"volume); relax such structures without --relax-cell")


def _check_gp(model, gp_size, partitioner, mode) -> None:
    if not isinstance(gp_size, int) or isinstance(gp_size, bool) or gp_size < 1:
        raise ConfigError(f"gp_size (--gp-size) must be an int >= 1, got {gp_size!r}")
    if mode not in MODES:
        raise ConfigError(f"unknown graph-parallel mode {mode!r} (--gp-mode); choose from {', '.join(MODES)}")
    partitioners.get_edge_partitioner(partitioner)        # a typo is refused with any G
    if gp_size > 1 and not getattr(model, "graph_parallel", False):
        raise ConfigError(f"{type(model).__name__} has no graph-parallel hooks: relax it with --gp-size 1 (one "
                          "process), or train a schnet, dimenet++ or gemnet-t model")


def _spawn_gp(model, structures, opts, G, partitioner, mode, threads) -> RelaxResult:
    """Relax in ``G`` graph-parallel ranks started by the launcher; rank 0's result."""
    threads = threads or max(1, torch.get_num_threads() // G)
    if opts.get("progress"):
        print(f"graph parallel: {G} ranks (gloo) share each step's edges and triplets ({partitioner}, {mode})",
              file=sys.stderr)
    outs = launch.spawn(_gp_rank, G, (model, structures, opts, partitioner, mode), backend="gloo", threads=threads,
                        graceful=True)
    return outs[0]


def _gp_rank(rank: int, world: int, model, structures, opts, partitioner, mode):
    """One graph-parallel rank of :func:`relax` (every rank runs the same optimizer; rank 0 returns the result)."""
    if rank:
        opts = {**opts, "progress": False}
    gp = {"size": world, "partitioner": partitioner, "mode": mode, "comm": Comm(torch.device(opts["device"])),
          "rank": rank}
    with stopping.installed(announce=rank == 0, unit="step"):
        res = relax(model, structures, _gp=gp, **opts)
    return res if rank == 0 else None


def _as_structures(structures) -> list:
    structures = list(structures)
    if structures and isinstance(structures[0], Atoms):
        structures = from_atoms(structures, dtype=torch.float64)
    return structures


class _StepLines:
    """Progress of :func:`relax` as plain lines on standard error, where no bar is drawn: one as each batch starts,
    one every ``every`` optimizer steps (``0``: none)."""

    def __init__(self, every: int, batches: int, total: int):
        self.every, self.batches, self.total, self.number = int(every or 0), batches, total, 0

    def batch(self, size: int) -> None:
        self.number += 1
        if self.every:
            print(f"relax: batch {self.number}/{self.batches}: {size} structure{'s' if size != 1 else ''}",
                  file=sys.stderr, flush=True)

    def step(self, taken: int, res: RelaxResult, running: int, worst: Tensor) -> None:
        if self.every and taken and taken % self.every == 0:
            print(f"relax: batch {self.number}/{self.batches} step {taken}: {int(res.done.sum())} of {self.total} "
                  f"done ({int(res.converged.sum())} converged), {running} running, largest force "
                  f"{float(worst.max()) if worst.numel() else 0.0:.3g} eV/Å", file=sys.stderr, flush=True)


def _relax_group(model, structures, indices, res: RelaxResult, optimizer, options, fmax, steps, device, bar,
                 gp=None, lines: _StepLines | None = None, cell: dict | None = None):
    """Relax the structures ``indices`` as one batch, writing each into ``res`` as it finishes (``gp``: this
    graph-parallel rank's group size, partitioner, mode and byte counter; ``cell``: the options of
    :class:`~.cell.FrechetCell`, the cells relaxed too)."""
    meta = task_meta(model)
    norm = EnergyNormalizer.from_dict(meta["normalizer"])
    cutoff, cap, tri = meta["cutoff"], meta["max_neighbors"], bool(getattr(model, "uses_triplets", True))
    rev = bool(getattr(model, "uses_reverse_edges", False))     # GemNet reads each edge's reverse

    if gp is not None:
        tri = True             # the graph-parallel partitioners balance the shards by triplets

    def graph_fn(b):   # the calculator's graph (graph_builder's), found for all structures at once
        return build_graph(b, cutoff, cap, with_triplets=tri, method="batch", with_reverse=rev)

    stress = cell is not None

    def forward(b):
        """``(energy [B], forces [N, 3], [stress [B, 3, 3]])`` float64 of batch ``b``: one process, or this rank's
        shard."""
        graph = graph_fn(b)
        if gp is None:
            return predict.energies_forces(model, b, graph, norm, stress=stress)

        plan = plan_graph_parallel(graph, gp["size"], gp["partitioner"], pos=b.pos)
        comm = GraphParallelComm(plan, mode=gp["mode"], comm=gp["comm"], device=device)
        out = [x.contiguous()
               for x in predict.energies_forces(model, b, comm.local_graph(graph), norm, comm, stress=stress)]
        for x in out:
            dist.broadcast(x, 0)   # rank 0's values on every rank: the same decisions everywhere
        return out

    def stop_requested() -> bool:
        """Graph parallel: whether any rank got a stop signal (every rank calls this at the same step)."""
        flag = torch.tensor([1.0 if stopping.requested() else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
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
    # the optimizer's coordinates x: the positions, or with cells the filter's generalised coordinates
    filt = FrechetCell(batch.cell.to(torch.float64), batch.batch, **cell) if cell is not None else None
    x = pos if filt is None else filt.initial(pos)
    cells = batch.cell.to(torch.float64)
    opt = _optimizer(optimizer, batch.batch if filt is None else filt.rows_batch(), len(group), options)
    taken, stresses = 0, None
    try:
        while running:
            if gp is not None and stop_requested():
                raise KeyboardInterrupt("stopped by signal")
            if filt is not None:
                pos, cells = filt.structures(x)
                batch.cell = cells.to(dtype)
            else:
                pos = x
            batch.pos = pos.to(dtype)
            with torch.no_grad():
                energy, forces, *stresses = forward(batch)
            res.forward_calls += 1
            res.evaluations += len(running)
            forces = torch.where(free.unsqueeze(-1), forces, torch.zeros_like(forces))
            if filt is None:
                moved, objective = forces, energy
            else:
                stresses = stresses[0]
                moved, _ = filt.forces(x, forces, stresses, cells)
                objective = filt.energy(energy, cells)
            rows = batch.batch if filt is None else filt.rows_batch()
            worst = segment_max(moved.norm(dim=1), rows, len(running)).clamp(min=0)
            if res.trajectories is not None:
                _record(res, indices, running, batch, pos, energy, forces, cells)
            finished = (worst < fmax) | (taken >= steps)
            if bool(finished.any()):
                for local in torch.nonzero(finished).flatten().tolist():
                    _finish(res, indices[running[local]], group[running[local]], batch, local, pos, energy,
                            forces, worst, taken, fmax, cells if filt is not None else None,
                            stresses if filt is not None else None)
                keep = ~finished
                running = [r for r, k in zip(running, keep.tolist()) if k]
                bar.update(int(finished.sum()))
                bar.set_postfix_str(f"converged {int(res.converged.sum())}, running {len(running)}")
                if not running:
                    break
                kept_rows = keep[batch.batch] if filt is None else filt.rows_of(keep)
                opt.select(keep)
                if filt is not None:
                    filt.select(keep)
                    cells = cells[keep]
                x, moved, objective = x[kept_rows], moved[kept_rows], objective[keep]
                batch = Batch.from_data_list([prepared[r] for r in running]).to(device)
                free = ~batch.fixed.bool()
            x = opt.step(x, moved, objective)
            taken += 1
            if lines is not None:
                lines.step(taken, res, len(running), worst)
    except KeyboardInterrupt:
        if filt is not None:
            pos, cells = filt.structures(x)
        else:
            pos = x
        for local, r in enumerate(running):     # the running structures at their current positions
            k = indices[r]
            sel = batch.batch == local
            d = group[r].clone()
            d.pos = pos[sel].detach().cpu()
            if filt is not None:
                d.cell = cells[local:local + 1].detach().cpu()
            res.structures[k] = d
            res.steps[k] = taken
        raise


def _finish(res, k, source, batch, local, pos, energy, forces, worst, taken, fmax, cells=None, stresses=None):
    sel = batch.batch == local
    d = source.clone()
    d.pos = pos[sel].detach().cpu().to(torch.float64)
    d.energy = energy[local].detach().cpu().reshape(1)
    d.forces = forces[sel].detach().cpu()
    for key in ("stress", "has_stress"):  # an input's stress label is not the model's at these positions
        if key in d:
            del d[key]
    if cells is not None:
        d.cell = cells[local:local + 1].detach().cpu()
        d.stress, d.has_stress = stresses[local:local + 1].detach().cpu(), torch.tensor([True])
    res.structures[k] = d
    res.energies[k] = float(energy[local])
    res.fmax[k] = float(worst[local])
    res.steps[k] = taken
    res.converged[k] = bool(worst[local] < fmax)
    res.done[k] = True


def _record(res, indices, running, batch, pos, energy, forces, cells):
    for local, r in enumerate(running):
        sel = batch.batch == local
        res.trajectories[indices[r]].append((pos[sel].detach().cpu().clone(), float(energy[local]),
                                             forces[sel].detach().cpu().clone(),
                                             cells[local].detach().cpu().clone()))


def write_trajectories(res: RelaxResult, folder: str | Path) -> list[Path]:
    """Write each structure's frames as ``FOLDER/<index>.extxyz`` (positions, energy, forces of every step).

    Raises:
        ConfigError: the result holds no trajectories (relax with ``trajectories=True``).
    """
    import ase.io

    if res.trajectories is None:
        raise ConfigError("no trajectories were kept; relax with trajectories=True (gnnpipe relax --trajectory DIR)")
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, frames in enumerate(res.trajectories):
        images = []
        for pos, e, f, cell in frames:
            d = res.structures[k].clone()
            d.pos, d.cell = pos, cell.reshape(1, 3, 3).to(d.cell.dtype)
            for key in ("energy", "forces", "stress", "has_stress"):
                if key in d:
                    del d[key]
            a = to_atoms(d)
            a.calc = SinglePointCalculator(a, energy=e, forces=f.numpy())
            images.append(a)
        p = out / f"{k}.extxyz"
        ase.io.write(str(p), images, format="extxyz")
        paths.append(p)
    return paths


#: suffixes of the extended XYZ files relaxed structures are written to
EXTXYZ_SUFFIXES = (".extxyz", ".xyz")


def check_extxyz_out(path: str | os.PathLike, flag: str = "out") -> None:
    """Refuse (``ConfigError``, before any relaxation runs) a file for relaxed structures whose suffix is not
    ``.extxyz``/``.xyz``: they are written as extended XYZ, and a ``.db`` or ``.lmdb`` name would hold text ASE and
    fairchem cannot open as such."""
    if Path(path).suffix.lower() not in EXTXYZ_SUFFIXES:
        raise ConfigError(f"{flag} {str(path)!r}: relaxed structures are written as extended XYZ; name the file "
                          f".extxyz (then `gnnpipe atoms convert` it to .db, .aselmdb or .lmdb)")


def relax_file(model, dataset: str | os.PathLike, out: str | os.PathLike, **kwargs) -> RelaxResult:
    """Read ``dataset`` (extended XYZ, ``.traj``, ASE ``.db``), relax it with :func:`relax` (``kwargs``) and write the
    relaxed structures to ``out`` as extended XYZ (written also when interrupted: the structures relaxed so far,
    the others at their current positions with ``relax_done=False``).

    Raises:
        ConfigError: ``out`` does not end in ``.extxyz`` or ``.xyz`` (checked before relaxing).
    """
    import ase.io

    check_extxyz_out(out)

    structures = read_structures(dataset, dtype=torch.float64)
    res = relax(model, structures, **kwargs)
    target = Path(out).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    ase.io.write(str(tmp), res.to_atoms(), format="extxyz")
    os.replace(tmp, target)
    return res
