"""The graph-parallel hooks an atomistic model calls (Sriram et al., ICLR 2022, §3), and their local identity.

A model never indexes across shards itself: at each place where graph parallelism must communicate it calls one
of the hooks below on an object ``comm``. :class:`LocalHooks` (every hook the identity; every rank owns every atom
and edge) is the single-process default; the graph-parallel implementation (``gnnpipe.tasks.s2ef.graph_parallel``)
puts autograd-aware collectives behind the same methods, so one model definition serves every layout.

Shapes: ``N`` atoms of the batch, ``N_r`` atoms the rank owns (``graph.atom_ids``), ``E_r`` local edges,
``E_read`` the edge rows the local triplets read (``graph.idx_kj`` indexes them).
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class GraphParallelHooks(Protocol):
    """The hook interface (see the module docstring)."""

    def atoms_gather(self, h_owned: Tensor) -> Tensor:
        """Owned atom rows ``[N_r, d]`` → every atom's row ``[N, d]`` (backward: sum-reduce-scatter)."""

    def atoms_reduce(self, h_partial: Tensor) -> Tensor:
        """Partial per-atom sums from local edges ``[N, d]`` → owned atoms' totals ``[N_r, d]`` (backward:
        all-gather)."""

    def edges_gather(self, x_local: Tensor) -> Tensor:
        """Local edge rows ``[E_r, d]`` → the rows local triplets read ``[E_read, d]``."""

    def sum(self, x: Tensor) -> Tensor:
        """All-reduce sum over the group (partial energies); backward: identity."""

    def replicated_grad(self, g: Tensor) -> Tensor:
        """All-reduce of a rank's partial gradient of a replicated input (``∂E_r/∂pos``)."""


class LocalHooks:
    """The hooks of one process owning everything: each returns its argument unchanged."""

    def atoms_gather(self, h_owned: Tensor) -> Tensor:
        return h_owned

    def atoms_reduce(self, h_partial: Tensor) -> Tensor:
        return h_partial

    def edges_gather(self, x_local: Tensor) -> Tensor:
        return x_local

    def sum(self, x: Tensor) -> Tensor:
        return x

    def replicated_grad(self, g: Tensor) -> Tensor:
        return g

    def __repr__(self) -> str:
        return "LocalHooks()"


#: the default hooks (stateless, shared)
LOCAL = LocalHooks()
