"""What an atomistic model says about its own cost: the graph-parallel hook calls of a forward, and per unit the
values autograd keeps and the multiply-adds, per owned edge, triplet and atom.

The cost and memory models of S2EF layouts (``gnnpipe.tasks.s2ef.cost``) ask a model these questions instead of
knowing models by name; a model that cannot answer (:class:`ModelDescriptionError`) is refused by the planner with
a message, never costed as another. The counts are read off each model's code: each linear map's input, each
activation's input and output, each product's factors, tensors shared between units once (checked against
autograd's saved-tensor hooks by the tests of each model).
"""

from __future__ import annotations

import attrs

from ...errors import ConfigError, ModelDescriptionError  # noqa: F401 (re-exported)

__all__ = ["HookCall", "ModelDescriptionError", "UnitWidths", "readout_hook_calls"]


@attrs.frozen
class HookCall:
    """One call of a graph-parallel hook in a model's forward.

    Attributes:
        unit: the unit that calls it (0: the embedding, ``l``: interaction block ``l``; ``-1``: the readout).
        hook: ``atoms_gather``, ``atoms_reduce``, ``edges_gather``, ``sum`` or ``replicated_grad``.
        width: values per row (``sum``/``replicated_grad``: the whole tensor's values).
        pos: its input depends on the positions (its backward runs inside ``∂E/∂pos``).
        grad: its input needs a gradient in the loss's backward (parameters or positions requiring one).
        forward_only: the call runs without autograd (the trainer's gather of direct forces).
    """

    unit: int
    hook: str
    width: int
    pos: bool = True
    grad: bool = True
    forward_only: bool = False


@attrs.frozen
class UnitWidths:
    """Values per element of one unit (activation widths) or multiply-adds per element (work).

    Attributes:
        edge: per edge the unit's rank owns. triplet: per owned triplet. atom: per owned atom. read_edge: per edge
        row the rank's triplets read (``E_read``: all ``E`` edges in ``allgather`` mode, the owned and halo rows in
        ``halo`` mode; DimeNet++'s spherical basis is computed on them). padded: per slot of the rank's triplets
        padded per edge (``E_r · K_r``, ``K_r`` the most triplets of an owned edge: GemNet's bilinear layer).
    """

    edge: float = 0.0
    triplet: float = 0.0
    atom: float = 0.0
    read_edge: float = 0.0
    padded: float = 0.0

    def total(self, edges: float, triplets: float, atoms: float, read_edges: float | None = None,
              padded: float | None = None) -> float:
        """``Σ width × count``; ``read_edges`` defaults to ``edges`` (a single process reads its own edges),
        ``padded`` to ``triplets``."""
        read = edges if read_edges is None else read_edges
        pad = triplets if padded is None else padded
        return (self.edge * edges + self.triplet * triplets + self.atom * atoms + self.read_edge * read
                + self.padded * pad)

    def __add__(self, other: UnitWidths) -> UnitWidths:
        return UnitWidths(self.edge + other.edge, self.triplet + other.triplet, self.atom + other.atom,
                          self.read_edge + other.read_edge, self.padded + other.padded)

    def __sub__(self, other: UnitWidths) -> UnitWidths:
        return UnitWidths(self.edge - other.edge, self.triplet - other.triplet, self.atom - other.atom,
                          self.read_edge - other.read_edge, self.padded - other.padded)


def readout_hook_calls(num_structures: int, num_atoms: int, direct: bool) -> list[HookCall]:
    """The readout's hook calls of a model whose direct forces are reduced per edge onto atoms: the energies' sum,
    then the direct forces' reduce and the trainer's gather, or the conservative forces' all-reduce of
    ``∂E_r/∂pos``."""
    if direct:
        return [HookCall(-1, "sum", num_structures, pos=False), HookCall(-1, "atoms_reduce", 3, pos=False),
                HookCall(-1, "atoms_gather", 3, pos=False, grad=False, forward_only=True)]
    return [HookCall(-1, "sum", num_structures, pos=False),
            HookCall(-1, "replicated_grad", 3 * num_atoms, pos=False, grad=False)]
