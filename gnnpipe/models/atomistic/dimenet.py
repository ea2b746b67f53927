"""DimeNet++ (Gasteiger et al., *Fast and Uncertainty-Aware Directional Message Passing for Non-Equilibrium
Molecules*, 2020, arXiv 2011.14115) on PyG's blocks, as units around the graph-parallel hooks.

The weights live in PyG's own modules (``BesselBasisLayer``, ``EmbeddingBlock``, ``InteractionPPBlock``,
``OutputPPBlock`` of ``torch_geometric.nn.models.dimenet``); the forward passes are written here so that per-atom
work (the embedding of ``z``, the output blocks' MLPs) runs on owned atoms and every cross-shard read is a hook
call. The parameter-free spherical basis is PyG's ``SphericalBasisLayer`` with its functions evaluated numerically
(:mod:`.basis`) instead of derived with sympy (tens of seconds per process). With the same weights the energies
equal PyG's ``DimeNetPlusPlus`` (tests/models/atomistic/test_equal_pyg.py, test_basis.py).

Units: ``[embedding, interaction_1 … interaction_L]``. The embedding unit computes the geometry (edge vectors,
distances, angles), the radial basis ``rbf`` ``[E, R]`` and the spherical basis ``sbf`` ``[T, S·R]``, the edge
messages ``x`` ``[E, H]`` (eq. 5 of DimeNet, Gasteiger et al. ICLR 2020) and output block 0; interaction unit
``l`` updates ``x`` (the DimeNet++ interaction, Fig. 2 of arXiv 2011.14115) and adds output block ``l``. The
running per-atom output sum ``P`` ``[N_r, 1]`` travels in the state.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import ClassVar

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
from .basis import bessel_normalizers, spherical_bessel_zeros, spherical_harmonics_y0, spherical_jn
from .comm import LOCAL, GraphParallelHooks
from .cost import HookCall, UnitWidths, readout_hook_calls


@contextmanager
def single_threaded():
    """torch's intra-op threads set to 1 inside the block (restored after). The models' orthogonal initialisations
    (PyG's ``glorot_orthogonal``, GemNet's He-orthogonal) are QR factorisations of small matrices, which run 10–40×
    slower on several OpenMP threads of a busy machine (seconds per model) and whose last bits depend on the
    thread count; on one thread they are fast and the same in every process."""
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)


def _bessel_radial(zeros: Tensor, norm: Tensor, order: int, x: Tensor) -> Tensor:
    """``[E]`` distances over the cutoff → ``[E]``: ``norm · j_order(zeros · x)`` (one of PyG's ``bessel_funcs``)."""
    return norm.to(x.dtype) * spherical_jn(order, zeros.to(x.dtype) * x)


def _spherical_harmonic(order: int, angle: Tensor) -> Tensor:
    """``[T]`` angles → ``[T]``: ``Y_order^0(angle)`` (one of PyG's ``sph_funcs``)."""
    return spherical_harmonics_y0(angle, order + 1)[..., order]


#: (num_spherical, num_radial) -> (zeros, normalizers), float64 ``[S, R]`` on the CPU (float32 values, DimeNet's)
_SBF_CONSTANTS: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
#: (num_spherical, num_radial, dtype, device) -> (zeros, normalizers, orders) flattened ``[S·R]`` for the forward
_SBF_FLAT: dict[tuple, tuple[Tensor, Tensor, tuple[int, ...]]] = {}


def _sbf_constants(num_spherical: int, num_radial: int) -> tuple[Tensor, Tensor]:
    key = (int(num_spherical), int(num_radial))
    if key not in _SBF_CONSTANTS:
        zeros = spherical_bessel_zeros(*key)
        _SBF_CONSTANTS[key] = (torch.from_numpy(zeros.astype("float64")),
                               torch.from_numpy(bessel_normalizers(zeros).astype("float64")))
    return _SBF_CONSTANTS[key]


class CachedSphericalBasis(SphericalBasisLayer):
    """PyG's ``SphericalBasisLayer`` (same constructor, attributes and forward) with its functions evaluated
    numerically (:mod:`.basis`) instead of derived with sympy: built in microseconds, with PyG's values (its roots
    and normalisers; ``tests/models/atomistic/test_basis.py``). The layer has no parameters.

    Attributes:
        num_spherical, num_radial, cutoff, envelope: as PyG's.
        bessel_funcs: ``S·R`` callables ``[E] → [E]``, ``N_ln · j_l(z_ln · x)`` of ``x = d/c`` (order ``l``
            major, root ``n`` minor). sph_funcs: ``S`` callables ``[T] → [T]``, ``Y_l^0(α)``. Both are built on
            each access (plain functions, so the layer pickles).
    """

    def __init__(self, num_spherical: int, num_radial: int, cutoff: float = 5.0, envelope_exponent: int = 5):
        nn.Module.__init__(self)
        self.num_spherical, self.num_radial = int(num_spherical), int(num_radial)
        if self.num_spherical < 1 or self.num_radial < 1:
            raise ConfigError(f"the spherical basis needs num_spherical, num_radial >= 1, got {num_spherical}, "
                              f"{num_radial}")
        self.cutoff = cutoff
        self.envelope = Envelope(envelope_exponent)

    @property
    def bessel_funcs(self) -> list:
        zeros, norm = _sbf_constants(self.num_spherical, self.num_radial)
        return [partial(_bessel_radial, zeros[l, n], norm[l, n], l)
                for l in range(self.num_spherical) for n in range(self.num_radial)]

    @property
    def sph_funcs(self) -> list:
        return [partial(_spherical_harmonic, l) for l in range(self.num_spherical)]


class SphericalBasis(CachedSphericalBasis):
    """:class:`CachedSphericalBasis` whose forward evaluates all ``S·R`` radial functions at once (one
    :func:`~.basis.spherical_jn` call on ``[E, S·R]``, whose backward keeps only its argument) and reads the
    triplets' edges with ``index_select``; equal to PyG's values within rounding
    (``tests/models/atomistic/test_basis.py``, ``test_equal_pyg.py``)."""

    def _flat(self, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor, tuple[int, ...]]:
        key = (self.num_spherical, self.num_radial, dtype, device)
        flat = _SBF_FLAT.get(key)
        if flat is None:
            zeros, norm = _sbf_constants(self.num_spherical, self.num_radial)
            orders = tuple(l for l in range(self.num_spherical) for _ in range(self.num_radial))
            flat = _SBF_FLAT[key] = (zeros.reshape(-1).to(device, dtype), norm.reshape(-1).to(device, dtype), orders)
        return flat

    def radial(self, x: Tensor) -> Tensor:
        """``[E]`` distances over the cutoff → ``[E, S·R]``: ``normalizer[l, n] · j_l(zeros[l, n] · x)`` in PyG's
        order (order ``l`` major, root ``n`` minor), before the envelope."""
        zeros, norm, orders = self._flat(x.dtype, x.device)
        return spherical_jn(orders, x.unsqueeze(-1) * zeros) * norm

    def forward(self, dist: Tensor, angle: Tensor, idx_kj: Tensor) -> Tensor:
        """PyG's forward with ``index_select`` for the triplets' read (its backward is a dense ``index_add``):
        ``[E]`` distances (Å), ``[T]`` angles (radians), ``[T]`` edge ids → ``[T, S·R]``."""
        dist = dist / self.cutoff
        rbf = self.radial(dist)
        rbf = self.envelope(dist).unsqueeze(-1) * rbf
        cbf = spherical_harmonics_y0(angle, self.num_spherical)
        n, k = self.num_spherical, self.num_radial
        return (rbf.index_select(0, idx_kj).view(-1, n, k) * cbf.view(-1, n, 1)).view(-1, n * k)


def output_pp(block: OutputPPBlock, x: Tensor, rbf: Tensor, target: Tensor, num_nodes: int, comm: GraphParallelHooks,
              act) -> Tensor:
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

    def geometry(self, state, graph, comm: GraphParallelHooks) -> dict:
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

    def forward(self, state, graph, comm: GraphParallelHooks):
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

    def forward(self, state, graph, comm: GraphParallelHooks):
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

    option_help: ClassVar[dict[str, str]] = {
        "int_emb_size": "triplet (interaction) embedding width", "basis_emb_size": "basis embedding width",
        "out_emb_channels": "output block MLP width", "num_spherical": "spherical harmonics degrees",
        "num_radial": "radial basis functions", "cutoff": "neighbour cutoff (Å)",
        "envelope_exponent": "smooth cutoff envelope exponent", "num_before_skip": "residual layers before skip",
        "num_after_skip": "residual layers after skip", "num_output_layers": "output block MLP layers",
        "max_neighbors": "per-atom neighbour cap of the graph", "max_z": "largest atomic number",
        "direct_forces": "per-edge direct force head instead of -dE/dpos",
        "output_initializer": "zeros or glorot_orthogonal",
    }

    def __init__(self, in_channels: int | None = None, out_channels: int = 1, num_layers: int = 4,
                 hidden: int = 128, dropout: float = 0.0, bias: bool = True, activation: str | None = None,
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
        with single_threaded():  # PyG's blocks initialise their weights when built
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

    def reset_parameters(self, seed: int | None = None) -> None:
        """:meth:`AtomisticModel.reset_parameters` on one thread (:func:`single_threaded`)."""
        with single_threaded():
            super().reset_parameters(seed)

    # ------------------------------------------------------------------ its own cost
    def _sizes(self) -> dict:
        emb, L = self.units[0], len(self.units) - 1
        out = emb.output
        sizes = {"H": emb.emb.lin.out_features, "R": emb.rbf.freq.numel(), "S": emb.sbf.num_spherical,
                 "O": out.lin_up.out_features, "n_out": len(out.lins), "L": L}
        if L:
            ib = self.units[1].interaction
            sizes.update(I=ib.lin_down.out_features, B=ib.lin_rbf1.out_features, before=len(ib.layers_before_skip),
                         after=len(ib.layers_after_skip))
        else:
            sizes.update(I=0, B=0, before=0, after=0)
        return sizes

    def hook_calls(self, num_atoms: int, num_structures: int) -> list[HookCall]:
        """The embedding's gather of the edge vectors ``k→j`` and of the embedded ``z``, and output block 0's
        reduce; per block the gather of the down-projected messages its triplets read and its output block's
        reduce; the readout (:func:`~.cost.readout_hook_calls`)."""
        z = self._sizes()
        direct = bool(self.direct_forces)
        c = not direct
        calls = [HookCall(0, "edges_gather", 3, pos=c, grad=c),  # the edge vectors k→j (geometry)
                 HookCall(0, "atoms_gather", z["H"], pos=False),  # the embedding of z
                 HookCall(0, "atoms_reduce", z["H"], pos=c)]  # output block 0
        for b in range(1, z["L"] + 1):
            calls += [HookCall(b, "edges_gather", z["I"], pos=c), HookCall(b, "atoms_reduce", z["H"], pos=c)]
        return calls + readout_hook_calls(num_structures, num_atoms, direct)

    def activation_widths(self) -> list[UnitWidths]:
        """``H`` hidden, ``I`` int_emb_size, ``B`` basis_emb_size, ``R`` num_radial, ``S`` num_spherical, ``O``
        out_emb_channels, ``n`` output layers, ``b``/``a`` residual layers before/after the skip; per interaction
        block: edge ``(14 + 6b + 6a)·H + B + 3I``, triplet ``2I + B``, atom ``H + (3n + 1)·O``; the embedding: edge
        ``9H + 3R + 10`` (geometry, the radial basis, the embedding MLP, output block 0), read edge ``10·SR`` (the
        spherical basis's radial part), triplet ``2SR + 9S + 2`` (angles, the angular part)."""
        z = self._sizes()
        H, I, B, R, S, O, n = z["H"], z["I"], z["B"], z["R"], z["S"], z["O"], z["n_out"]
        SR = S * R
        out_atom = H + (3 * n + 1) * O
        units = [UnitWidths(9 * H + 3 * R + 10, 2 * SR + 9 * S + 2, out_atom, 10 * SR)]
        units += [UnitWidths((14 + 6 * z["before"] + 6 * z["after"]) * H + B + 3 * I, 2 * I + B, out_atom)
                  for _ in range(z["L"])]
        return units

    def geometry_widths(self, conservative: bool) -> UnitWidths:
        """Conservative: edge ``10``, read edge ``10·SR``, triplet ``2SR + 9S + 2``; direct: the spherical basis,
        triplet ``SR``."""
        z = self._sizes()
        SR, S = z["S"] * z["R"], z["S"]
        return UnitWidths(10, 2 * SR + 9 * S + 2, 0, 10 * SR) if conservative else UnitWidths(0, SR, 0, 0)

    def embedding_stage_widths(self, conservative: bool) -> UnitWidths:
        """The embedding alone: with conservative forces its radial basis keeps the edge geometry's derivation."""
        return UnitWidths(self.geometry_widths(True).edge) if conservative else UnitWidths()

    def work_widths(self) -> list[UnitWidths]:
        z = self._sizes()
        H, I, B, R, S, O, n = z["H"], z["I"], z["B"], z["R"], z["S"], z["O"], z["n_out"]
        out_atom = H * O + n * O * O + O
        mac = [UnitWidths(3 * H * H + 2 * R * H, 0, out_atom)]
        mac += [UnitWidths((3 + 2 * (z["before"] + z["after"])) * H * H + 2 * H * I + B * H + R * B + R * H,
                           S * R * B + B * I, out_atom) for _ in range(z["L"])]
        return mac

    def boundary_widths(self) -> UnitWidths:
        """The edge messages ``x`` (``H``), the radial basis ``rbf`` (``R``: it depends on the learnable Bessel
        frequencies) and the running output ``P`` (1 per atom)."""
        z = self._sizes()
        return UnitWidths(z["H"] + z["R"], 0, 1)

    def pipeline_boundary(self) -> dict:
        """The radial basis ``rbf`` (it depends on the learnable Bessel frequencies of unit 0, so it travels), the
        edge messages ``x`` and the running output sum ``P``; the geometry and the spherical basis are recomputed
        on each stage (:meth:`stage_geometry`), so a boundary is ``O(E + N)``, never ``O(T)``."""
        emb = self.units[0]
        R = emb.rbf.freq.numel()
        return {"rbf": ("edges", (R,)), "x": ("edges", (emb.emb.lin.out_features,)), "P": ("atoms", (1,))}

    def stage_geometry(self, state, graph, comm: GraphParallelHooks = LOCAL):
        return {**state, **self.units[0].geometry(state, graph, comm)}

    def readout_energy(self, state, graph, comm: GraphParallelHooks) -> Tensor:
        return scatter_sum(state["P"].squeeze(-1), state["atom_batch"], state["num_structures"])

    def readout_forces(self, state, graph, comm: GraphParallelHooks) -> Tensor:
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
