"""Which labels a structure has: S2EF trains each structure on the labels it carries.

Data sets mix what they label: force-only sets (no total energies), energy-only sets (relaxed structures), and sets
where only some structures carry each label. A prepared structure always has an ``energy`` ``[1]`` and ``forces``
``[n, 3]`` tensor (zeros where the label is missing, so structures batch together) and the flags
``has_energy`` / ``has_forces`` (``[1]`` bool; :func:`~gnnpipe.data.atoms.structures.with_label_slots`), and a
``stress`` slot with ``has_stress``. The loss's energy term is the mean over the structures with an
energy, its force term the mean over the force components of free atoms of structures with forces
(:func:`~.loss.s2ef_loss`), and each metric is computed over the structures that have its label: a set without
energies claims no energy metric.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from ...data.atoms.structures import with_label_slots

__all__ = ["Counts", "energy_mask", "force_mask", "label_counts", "stress_mask", "with_label_slots"]


def energy_mask(batch) -> Tensor:
    """``[B]`` bool: the structures of ``batch`` with an energy label (all without flags)."""
    flag = getattr(batch, "has_energy", None)
    return torch.ones(int(batch.num_graphs), dtype=torch.bool, device=batch.pos.device) if flag is None \
        else flag.reshape(-1).bool()


def force_mask(batch) -> Tensor:
    """``[N]`` bool: the free atoms (``fixed`` False) of the structures of ``batch`` with forces."""
    free = ~batch.fixed.bool()
    flag = getattr(batch, "has_forces", None)
    return free if flag is None else free & flag.reshape(-1).bool()[batch.batch]


def stress_mask(batch) -> Tensor:
    """``[B]`` bool: the structures of ``batch`` with a stress label (without ``has_stress`` flags: all when the
    batch has a ``stress``, else none)."""
    flag = getattr(batch, "has_stress", None)
    if flag is None:
        labelled = getattr(batch, "stress", None) is not None
        return torch.full((int(batch.num_graphs),), labelled, dtype=torch.bool, device=batch.pos.device)
    return flag.reshape(-1).bool()


def label_counts(d) -> tuple[int, int, int]:
    """``(1 if it has an energy else 0, its free atoms if it has forces else 0, 1 if it has a stress else 0)``: what
    one structure adds to a batch's loss normalisation (without flags, a label present counts)."""
    has_e = getattr(d, "has_energy", None)
    has_f = getattr(d, "has_forces", None)
    has_s = getattr(d, "has_stress", None)
    e = 1 if has_e is None or bool(has_e.reshape(-1)[0]) else 0
    f = int((~d.fixed.bool()).sum()) if has_f is None or bool(has_f.reshape(-1)[0]) else 0
    s = int(getattr(d, "stress", None) is not None) if has_s is None else int(bool(has_s.reshape(-1)[0]))
    return e, f, s


@attrs.frozen
class Counts:
    """A global batch's loss denominators: structures with an energy, free atoms of structures with forces,
    structures with a stress (all ranks' shares together)."""

    energy: int = 0
    forces: int = 0
    stress: int = 0
