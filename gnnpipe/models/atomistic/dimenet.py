"""DimeNet++ (Gasteiger et al., *Fast and Uncertainty-Aware Directional Message Passing for Non-Equilibrium
Molecules*, 2020, arXiv 2011.14115) on PyG's blocks, as units around the graph-parallel hooks.

The weights live in PyG's own modules (``BesselBasisLayer``, ``SphericalBasisLayer``, ``EmbeddingBlock``,
``InteractionPPBlock``, ``OutputPPBlock`` of ``torch_geometric.nn.models.dimenet``); the forward passes are
written here so that per-atom work (the embedding of ``z``, the output blocks' MLPs) runs on owned atoms and
every cross-shard read is a hook call. With the same weights the energies equal PyG's ``DimeNetPlusPlus``
(tests/models/atomistic/test_equal_pyg.py).

Units: ``[embedding, interaction_1 … interaction_L]``. The embedding unit computes the geometry (edge vectors,
distances, angles), the radial basis ``rbf`` ``[E, R]`` and the spherical basis ``sbf`` ``[T, S·R]``, the edge
messages ``x`` ``[E, H]`` (eq. 5 of DimeNet, Gasteiger et al. ICLR 2020) and output block 0; interaction unit
``l`` updates ``x`` (the DimeNet++ interaction, Fig. 2 of arXiv 2011.14115) and adds output block ``l``. The
running per-atom output sum ``P`` ``[N_r, 1]`` travels in the state.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch_geometric.nn.models.dimenet import (
    BesselBasisLayer,
    EmbeddingBlock,
    Envelope,
    InteractionPPBlock,
    OutputPPBlock,
    SphericalBasisLayer,
)

from ...errors import ConfigError
from ..registry import register
from .base import AtomisticModel, AtomisticUnit, DirectForceHead, atomistic_activation, scatter_sum
from .comm import LOCAL, Comm

#: (num_spherical, num_radial) -> (sph_funcs, bessel_funcs) of PyG's SphericalBasisLayer (sympy forms are slow
#: to derive: tens of seconds for 7 × 6; derived once per process)
_SBF_FUNCS: dict[tuple[int, int], tuple[list, list]] = {}


class CachedSphericalBasis(SphericalBasisLayer):
    """PyG's ``SphericalBasisLayer`` (same attributes and forward) whose sympy-derived functions are built once per
    process and shared by every instance of the same sizes (the layer has no parameters)."""

    def __init__(self, num_spherical: int, num_radial: int, cutoff: float = 5.0, envelope_exponent: int = 5):
        key = (int(num_spherical), int(num_radial))
        if key not in _SBF_FUNCS:
            layer = SphericalBasisLayer(num_spherical, num_radial, cutoff, envelope_exponent)
            _SBF_FUNCS[key] = (layer.sph_funcs, layer.bessel_funcs)
        nn.Module.__init__(self)
        self.num_spherical, self.num_radial = key
        self.cutoff = cutoff
        self.envelope = Envelope(envelope_exponent)
        self.sph_funcs, self.bessel_funcs = _SBF_FUNCS[key]

    def __getstate__(self) -> dict:
        """Pickled without the sympy-derived functions (lambdified code cannot be pickled: a model travelling from
        a rank to the launcher); :meth:`__setstate__` takes them from this process's cache."""
        state = dict(self.__dict__)
        state.pop("sph_funcs", None)
        state.pop("bessel_funcs", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        key = (self.num_spherical, self.num_radial)
        if key not in _SBF_FUNCS:
            layer = SphericalBasisLayer(*key, self.cutoff)
            _SBF_FUNCS[key] = (layer.sph_funcs, layer.bessel_funcs)
        self.sph_funcs, self.bessel_funcs = _SBF_FUNCS[key]


#: num_spherical -> (j_0 … j_{S−1}) lambdified spherical Bessel functions (PyG's ``spherical_bessel_formulas``)
_SPHERICAL_BESSEL: dict[int, list] = {}
#: (num_spherical, num_radial) -> (zeros, normalizer) ``[S, R]``: PyG's ``Jn_zeros`` and its normalizer, the values PyG
#: computes (float32 roots), cast to the input's dtype when used
_BESSEL_ROOTS: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}


def _radial_forms(num_spherical: int, num_radial: int) -> tuple[list, Tensor, Tensor]:
    """``(j, zeros, normalizer)`` of PyG's ``bessel_basis(S, R)``: its function ``(l, n)`` is
    ``normalizer[l, n] · j_l(zeros[l, n] · x)`` (the same float32 roots of ``Jn_zeros``, the same normalizer
    ``1/√(½ J_{l+1}(z)²)``), derived once per process."""
    import numpy as np
    import sympy as sym
    from torch_geometric.nn.models.dimenet_utils import Jn, Jn_zeros, spherical_bessel_formulas

    S, R = int(num_spherical), int(num_radial)
    if S not in _SPHERICAL_BESSEL:
        x = sym.symbols("x")
        _SPHERICAL_BESSEL[S] = [sym.lambdify([x], f, {"sin": torch.sin, "cos": torch.cos})
                                for f in spherical_bessel_formulas(S)]
    if (S, R) not in _BESSEL_ROOTS:
        zeros = Jn_zeros(S, R)
        norm = np.array([[1 / (0.5 * Jn(zeros[l, n], l + 1) ** 2) ** 0.5 for n in range(R)] for l in range(S)])
        _BESSEL_ROOTS[S, R] = (torch.from_numpy(zeros.astype(np.float64)), torch.from_numpy(norm))
    return (_SPHERICAL_BESSEL[S], *_BESSEL_ROOTS[S, R])


class SphericalBasis(CachedSphericalBasis):
    """:class:`CachedSphericalBasis` whose forward evaluates the radial functions one order at a time on all their
    roots (``S`` calls on ``[E, R]`` instead of ``S·R`` calls on ``[E]``: fewer operations for small batches, such as
    a pipeline's micro-batches) and reads the triplets' edges with ``index_select``; equal to PyG's values within
    rounding (``tests/models/atomistic/test_equal_pyg.py``)."""

    def radial(self, x: Tensor) -> Tensor:
        """``[E]`` distances over the cutoff → ``[E, S·R]``: ``normalizer[l, n] · j_l(zeros[l, n] · x)`` in PyG's
        order (order ``l`` major, root ``n`` minor), before the envelope."""
        j, zeros, norm = _radial_forms(self.num_spherical, self.num_radial)
        zeros, norm = zeros.to(x.device, x.dtype), norm.to(x.device, x.dtype)
        arg = x.unsqueeze(-1) * zeros.unsqueeze(1)  # [S, E, R]
        return torch.cat([norm[l] * j[l](arg[l]) for l in range(self.num_spherical)], dim=1)

    def forward(self, dist: Tensor, angle: Tensor, idx_kj: Tensor) -> Tensor:
        """PyG's forward with ``index_select`` for the triplets' read (its backward is a dense ``index_add``):
        ``[E]`` distances, ``[T]`` angles, ``[T]`` edge ids → ``[T, S·R]``."""
        dist = dist / self.cutoff
        rbf = self.radial(dist)
        rbf = self.envelope(dist).unsqueeze(-1) * rbf
        cbf = torch.stack([f(angle) for f in self.sph_funcs], dim=1)
        n, k = self.num_spherical, self.num_radial
        return (rbf.index_select(0, idx_kj).view(-1, n, k) * cbf.view(-1, n, 1)).view(-1, n * k)


def output_pp(block: OutputPPBlock, x: Tensor, rbf: Tensor, target: Tensor, num_nodes: int, comm: Comm, act) -> Tensor:
    """PyG's ``OutputPPBlock`` around the hooks: edge messages gated by ``rbf`` are summed onto target atoms
    (``[N, H]`` partial), reduced onto owned atoms, then the per-atom MLP → ``[N_r, out]``."""
    h = scatter_sum(block.lin_rbf(rbf) * x, target, num_nodes)
    h = block.lin_up(comm.atoms_reduce(h))
    for lin in block.lins:
        h = act(lin(h))
    return block.lin(h)


class DimeNetEmbedding(AtomisticUnit):
    """Geometry, bases, edge embedding and output block 0 (see the module docstring)."""

    def __init__(self, hidden: int, out_emb_channels: int, num_spherical: int, num_radial: int, cutoff: float,
                 envelope_exponent: int, num_output_layers: int, max_z: int, act, output_initializer: str):
        super().__init__()
        self.act = act
        self.rbf = BesselBasisLayer(num_radial, cutoff, envelope_exponent)
        self.sbf = SphericalBasis(num_spherical, num_radial, cutoff, envelope_exponent)
        self.emb = EmbeddingBlock(num_radial, hidden, act)
        self.emb.emb = nn.Embedding(max_z + 1, hidden)
        self.emb.reset_parameters()
        self.output = OutputPPBlock(num_radial, hidden, out_emb_channels, 1, num_output_layers, act,
                                    output_initializer)

    def geometry(self, state, graph, comm: Comm) -> dict:
        """The parameter-free geometry from ``state["pos"]``: edge vectors ``vec`` ``[E, 3]`` (Å, from ``i`` to
        ``j``'s image), lengths ``dist`` ``[E]`` and the spherical basis ``sbf`` ``[T, S·R]`` of the triplet angles
        (a later pipeline stage recomputes them instead of receiving ``O(T)`` rows)."""
        idx_kj, idx_ji = graph.idx_kj, graph.idx_ji
        vec = graph.edge_vectors(state["pos"], state["cell"])  # [E, 3], from i to j's image
        dist = vec.norm(dim=-1)
        vec_read = comm.edges_gather(vec)  # the edges k→j the local triplets read
        dist_read = dist if vec_read is vec else vec_read.norm(dim=-1)
        a, b = vec.index_select(0, idx_ji), vec_read.index_select(0, idx_kj)
        angle = torch.atan2(torch.cross(a, b, dim=1).norm(dim=-1), (a * b).sum(dim=-1))
        return {"vec": vec, "dist": dist, "sbf": self.sbf(dist_read, angle, idx_kj)}

    def forward(self, state, graph, comm: Comm):
        j, i = graph.edge_index[0], graph.edge_index[1]
        geo = self.geometry(state, graph, comm)
        vec, dist, sbf = geo["vec"], geo["dist"], geo["sbf"]
        rbf = self.rbf(dist)
        emb = self.emb
        h = comm.atoms_gather(emb.emb(state["z"]))  # per-atom embedding on owned atoms, gathered to the edges
        x = self.act(emb.lin(torch.cat([h.index_select(0, i), h.index_select(0, j), self.act(emb.lin_rbf(rbf))],
                                       dim=-1)))
        P = output_pp(self.output, x, rbf, i, graph.num_nodes, comm, self.act)
        return {**state, "vec": vec, "dist": dist, "rbf": rbf, "sbf": sbf, "x": x, "P": P}


class DimeNetInteraction(AtomisticUnit):
    """One DimeNet++ interaction block (PyG's ``InteractionPPBlock``) and its output block."""

    def __init__(self, hidden: int, int_emb_size: int, basis_emb_size: int, out_emb_channels: int,
                 num_spherical: int, num_radial: int, num_before_skip: int, num_after_skip: int,
                 num_output_layers: int, act, output_initializer: str):
        super().__init__()
        self.act = act
        self.interaction = InteractionPPBlock(hidden, int_emb_size, basis_emb_size, num_spherical, num_radial,
                                              num_before_skip, num_after_skip, act)
        self.output = OutputPPBlock(num_radial, hidden, out_emb_channels, 1, num_output_layers, act,
                                    output_initializer)

    def forward(self, state, graph, comm: Comm):
        act, ib = self.act, self.interaction
        x, rbf, sbf = state["x"], state["rbf"], state["sbf"]
        x_ji = act(ib.lin_ji(x))
        x_kj = act(ib.lin_kj(x)) * ib.lin_rbf2(ib.lin_rbf1(rbf))
        x_kj = comm.edges_gather(act(ib.lin_down(x_kj)))  # down-projected messages of the edges triplets read
        m = x_kj.index_select(0, graph.idx_kj) * ib.lin_sbf2(ib.lin_sbf1(sbf))
        m = act(ib.lin_up(scatter_sum(m, graph.idx_ji, x.size(0))))
        h = x_ji + m
        for layer in ib.layers_before_skip:
            h = layer(h)
        h = act(ib.lin(h)) + x
        for layer in ib.layers_after_skip:
            h = layer(h)
        P = state["P"] + output_pp(self.output, h, rbf, graph.edge_index[1], graph.num_nodes, comm, act)
        return {**state, "x": h, "P": P}


class DimeNetHead(nn.Module):
    """The readout's parameters: the optional direct-force head on the final edge messages."""

    def __init__(self, hidden: int, direct_forces: bool, act):
        super().__init__()
        self.forces = DirectForceHead(hidden, hidden, act) if direct_forces else None


@register("dimenet++")
class DimeNetPlusPlus(AtomisticModel):
    """DimeNet++ (Gasteiger et al. 2020, arXiv 2011.14115): directional message passing over edges with triplet
    angles, on PyG's blocks; energies per structure, forces conservative or from a direct head.

    Args:
        num_layers: interaction blocks (``--layers``; OC20 default 4). hidden: edge embedding width (128).
        activation: ``None`` for swish (the paper's), or a name (:func:`atomistic_activation`).
        int_emb_size, basis_emb_size, out_emb_channels, num_spherical, num_radial, cutoff (Å),
        envelope_exponent, num_before_skip, num_after_skip, num_output_layers: as PyG's ``DimeNetPlusPlus``
            (defaults: fairchem's OC20 configuration).
        max_neighbors: per-atom neighbour cap of the graph. max_z: largest atomic number (embedding rows
            ``max_z + 1``). direct_forces: add a per-edge force head (GemNet-XL style) instead of ``−∂E/∂pos``.
        output_initializer: ``"zeros"`` (PyG's default: energies start at 0) or ``"glorot_orthogonal"``.
        in_channels, out_channels, dropout, bias: the zoo's common arguments; atomistic models read atomic
            numbers (``in_channels`` unused), predict one energy (``out_channels`` must be 1), have no dropout
            and always use biases.

    Raises:
        ConfigError: ``out_channels != 1``, ``dropout > 0``, ``bias=False``, ``num_spherical < 2``, sizes < 1.
    """

    option_help = {
        "int_emb_size": "triplet (interaction) embedding width", "basis_emb_size": "basis embedding width",
        "out_emb_channels": "output block MLP width", "num_spherical": "spherical harmonics degrees",
        "num_radial": "radial basis functions", "cutoff": "neighbour cutoff (Å)",
        "envelope_exponent": "smooth cutoff envelope exponent", "num_before_skip": "residual layers before skip",
        "num_after_skip": "residual layers after skip", "num_output_layers": "output block MLP layers",
        "max_neighbors": "per-atom neighbour cap of the graph", "max_z": "largest atomic number",
        "direct_forces": "per-edge direct force head instead of -dE/dpos",
        "output_initializer": "zeros or glorot_orthogonal",
    }

    def __init__(self, in_channels: Optional[int] = None, out_channels: int = 1, num_layers: int = 4,
                 hidden: int = 128, dropout: float = 0.0, bias: bool = True, activation: Optional[str] = None,
                 int_emb_size: int = 64, basis_emb_size: int = 8, out_emb_channels: int = 256,
                 num_spherical: int = 7, num_radial: int = 6, cutoff: float = 6.0, envelope_exponent: int = 5,
                 num_before_skip: int = 1, num_after_skip: int = 2, num_output_layers: int = 3,
                 max_neighbors: int = 50, max_z: int = 94, direct_forces: bool = False,
                 output_initializer: str = "zeros"):
        super().__init__()
        _check_common("dimenet++", out_channels, dropout, bias, num_layers=num_layers, hidden=hidden,
                      int_emb_size=int_emb_size, basis_emb_size=basis_emb_size, out_emb_channels=out_emb_channels,
                      num_radial=num_radial, max_z=max_z, max_neighbors=max_neighbors)
        if num_spherical < 2:
            raise ConfigError(f"dimenet++ needs num_spherical >= 2, got {num_spherical}")
        if not cutoff > 0:
            raise ConfigError(f"dimenet++ needs cutoff > 0 (Å), got {cutoff}")
        if output_initializer not in ("zeros", "glorot_orthogonal"):
            raise ConfigError(f"output_initializer must be 'zeros' or 'glorot_orthogonal', got {output_initializer!r}")
        act = atomistic_activation(activation or "swish")
        self.cutoff, self.max_neighbors, self.max_z = float(cutoff), int(max_neighbors), int(max_z)
        self.direct_forces = bool(direct_forces)
        self.units = nn.ModuleList(
            [DimeNetEmbedding(hidden, out_emb_channels, num_spherical, num_radial, cutoff, envelope_exponent,
                              num_output_layers, max_z, act, output_initializer)]
            + [DimeNetInteraction(hidden, int_emb_size, basis_emb_size, out_emb_channels, num_spherical,
                                  num_radial, num_before_skip, num_after_skip, num_output_layers, act,
                                  output_initializer) for _ in range(num_layers)])
        self.head = DimeNetHead(hidden, self.direct_forces, act)
        self.pyg_prefixes = (("units.0.rbf.", "rbf."), ("units.0.sbf.", "sbf."), ("units.0.emb.", "emb."),
                             ("units.0.output.", "output_blocks.0."),
                             *((f"units.{b}.interaction.", f"interaction_blocks.{b - 1}.") for b in
                               range(1, num_layers + 1)),
                             *((f"units.{b}.output.", f"output_blocks.{b}.") for b in range(1, num_layers + 1)))
        self.reset_parameters()

    def pipeline_boundary(self) -> dict:
        """The radial basis ``rbf`` (it depends on the learnable Bessel frequencies of unit 0, so it travels), the
        edge messages ``x`` and the running output sum ``P``; the geometry and the spherical basis are recomputed
        on each stage (:meth:`stage_geometry`), so a boundary is ``O(E + N)``, never ``O(T)``."""
        emb = self.units[0]
        R = emb.rbf.freq.numel()
        return {"rbf": ("edges", (R,)), "x": ("edges", (emb.emb.lin.out_features,)), "P": ("atoms", (1,))}

    def stage_geometry(self, state, graph, comm: Comm = LOCAL):
        return {**state, **self.units[0].geometry(state, graph, comm)}

    def readout_energy(self, state, graph, comm: Comm) -> Tensor:
        return scatter_sum(state["P"].squeeze(-1), state["atom_batch"], state["num_structures"])

    def readout_forces(self, state, graph, comm: Comm) -> Tensor:
        return self.head.forces(state["x"], state["vec"], state["dist"], graph.edge_index[1], graph.num_nodes, comm)


def _check_common(name: str, out_channels, dropout, bias, **sizes) -> None:
    if out_channels != 1:
        raise ConfigError(f"{name} predicts one energy per structure: out_channels must be 1, got {out_channels}")
    if dropout:
        raise ConfigError(f"{name} has no dropout: pass dropout=0 (got {dropout})")
    if bias is False:
        raise ConfigError(f"{name} always uses biases (PyG's blocks): pass bias=True")
    for key, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} option {key} must be a positive int, got {value!r}")
