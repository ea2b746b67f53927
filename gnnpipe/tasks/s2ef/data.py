"""S2EF data: structure files or a generated set, validated in the training dtype, split, and batched.

A batch is ``torch_geometric.data.Batch.from_data_list`` of structures (``z``, ``pos``, ``cell``, ``pbc``,
``energy``, ``forces``, ``fixed``, ``natoms``; see :mod:`gnnpipe.data.atoms`). Batches are a pure function of
``(seed, epoch)`` (a permutation of the training split cut into global batches), so a resumed run and every
data-parallel rank see the same ones without any state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

#: the suffixes of structure files (read with ``ase.io`` / ``ase.db``)
STRUCTURE_SUFFIXES = (".extxyz", ".xyz", ".traj", ".db")
#: generated data sets (ASE + EMT labels; :mod:`gnnpipe.data.atoms`)
GENERATED = ("oc20-like", "md17-like")


def is_structure_dataset(dataset: Optional[str]) -> bool:
    """Whether ``dataset`` names a structure file (by suffix) or a generated structure set."""
    return isinstance(dataset, str) and (dataset.lower().endswith(STRUCTURE_SUFFIXES)
                                         or dataset.lower() in GENERATED)


def load_structures(config) -> list:
    """The structures of ``config.dataset`` (``None``: the generated ``oc20-like`` set of ``config.frames``
    frames, seeded by ``config.seed``), in ``config.dtype``, validated.

    Raises:
        ConfigError: a missing file. DataValidationError: a malformed structure (the message names it and the fix).
    """
    from ...data import atoms
    from ...errors import ConfigError

    ds = config.dataset or "oc20-like"
    if ds.lower() in GENERATED:  # generated once, then read from the cache (gnnpipe.data.atoms.generated_file)
        structures = atoms.generated_structures(ds.lower().split("-")[0], config.frames, config.seed,
                                                dtype=config.torch_dtype)
    else:
        path = Path(ds).expanduser()
        if not path.is_file() and config.root is not None:
            path = Path(config.root).expanduser() / ds
        if not path.is_file():
            raise ConfigError(f"no structure file {ds!r}; give an existing .extxyz/.xyz/.traj/.db file, or "
                              f"--dataset oc20-like for a generated set")
        kw = {k: v for k, v in (("energy_key", config.energy_key), ("forces_key", config.forces_key)) if v}
        structures = atoms.read_structures(str(path), dtype=config.torch_dtype, **kw)
        return prepare_structures(structures, config.torch_dtype, cutoff=config.cutoff,
                                  source=f"{path.name}: structure")
    return prepare_structures(structures, config.torch_dtype, cutoff=config.cutoff)


def prepare_structures(structures: Sequence, dtype: torch.dtype, labelled: bool = True,
                       cutoff: Optional[float] = None, source: str = "structure") -> list:
    """``structures`` validated (:func:`gnnpipe.data.atoms.validate_structures`) with floats in ``dtype`` and a
    ``fixed`` mask (all free when absent); ``source`` names them in errors (``"FILE: structure"``).

    Raises:
        DataValidationError: a malformed structure; ``labelled`` and one without energy or forces.
    """
    from ...data.atoms import validate_structures
    from ...errors import DataValidationError

    out = []
    for i, d in enumerate(structures):
        d = d.clone()
        for k in ("pos", "cell", "energy", "forces"):
            if getattr(d, k, None) is not None:
                setattr(d, k, getattr(d, k).to(dtype))
        if getattr(d, "fixed", None) is None:
            d.fixed = torch.zeros(d.z.numel(), dtype=torch.bool)
        if labelled and (getattr(d, "energy", None) is None or getattr(d, "forces", None) is None):
            raise DataValidationError(f"{source} {i} has no energy or forces label: S2EF training needs both "
                                      f"(name them with --energy-key / --forces-key)")
        out.append(d)
    validate_structures(out, dtype, cutoff=cutoff, source=source)
    return out


def split(config, n: int) -> dict[str, Tensor]:
    """``{"train", "val", "test"}`` index tensors: 80/10/10 seeded by ``config.seed``
    (:func:`gnnpipe.data.atoms.split_structures`)."""
    from ...data.atoms import split_structures

    tr, va, te = split_structures(n, seed=config.seed)
    return {"train": torch.as_tensor(tr), "val": torch.as_tensor(va), "test": torch.as_tensor(te)}


def epoch_batches(n: int, global_batch: int, seed: int, epoch: int) -> list[Tensor]:
    """The global batches of an epoch: a permutation of ``range(n)`` drawn from ``(seed, epoch)`` cut into
    ``ceil(n / global_batch)`` batches (the last one shorter)."""
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + 7919 * (int(epoch) + 1)) % (2**63 - 1))
    return list(torch.randperm(n, generator=g).split(global_batch))


def share(indices: Tensor, rank: int, world: int) -> Tensor:
    """Rank ``rank``'s part of ``indices``: contiguous, as even as possible (the first ranks one more; a rank may
    get none)."""
    return torch.tensor_split(indices, world)[rank]
