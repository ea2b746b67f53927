"""eSCN-MD, the backbone of fairchem's UMA models (eSCN: Passaro & Zitnick, *Reducing SO(3) Convolutions to SO(2)
for Efficient Equivariant GNNs*, ICML 2023, arXiv 2302.03655; eSCN-MD and UMA: Wood et al., *UMA: A Family of
Universal Models for Atoms*, 2025), as units around the graph-parallel hooks.

Every atom carries an SO(3)-equivariant embedding ``x`` ``[N_r, (lmax+1)², C]`` (real spherical-harmonic
coefficients of degrees ``0 … lmax``, ``C = sphere_channels``; conventions: :mod:`.so3`). With ``D_e`` the Wigner-D
matrix of the rotation taking edge ``j → i`` onto ``+y``, cut to the ``|m| ≤ mmax`` rows in m-major order
(``[E, M, (lmax+1)²]``), ``u(d) = 1 − 21 (d/c)⁵ + 35 (d/c)⁶ − 15 (d/c)⁷`` the polynomial envelope (exponent 5)
and ``e_ji = [G(d_ji), s(z_j), t(z_i)]`` the invariant edge features (``G``: ``num_distance_basis`` Gaussians on
``[0, cutoff]`` of width twice their spacing; ``s``, ``t``: ``edge_channels``-wide element embeddings)::

    x_i⁰  = [emb(z_i) + σ_i, 0, …]                                   σ: the system embedding (below)
    x_i  += Σ_j u(d_ji) D_eᵀ[:, m=0] · R(e_ji) / 5                   edge-degree embedding (R: radial MLP)
    for each of num_layers blocks:
        y_i   = RMSNorm₁(x_i) + [σ_i, 0, …]
        m_ji  = u(d_ji) D_eᵀ SO2₂(gate(SO2₁(D_e [y_j, y_i] ; R₁(e_ji))))  the message, in the edge's frame
        x_i  += Σ_j m_ji                                               (onto the target atom i)
        x_i  += from_grid(MLP(to_grid(RMSNorm₂(x_i))))                the grid feed-forward, per point of S²
    x_i   = RMSNorm(x_i);   E = Σ_i MLP(x_i[l=0]);   F_i = w · x_i[l=1]   (direct forces) or −∂E/∂pos

* ``SO2`` (:class:`SO2Convolution`): for ``m = 0`` a linear map of the ``l = 0 … lmax`` coefficients (with
  bias; the first one also returns ``lmax·H`` gate scalars), for each ``0 < m ≤ mmax`` the complex product
  ``(W₁ + iW₂)(x₊ₘ + i x₋ₘ)`` over the ``l = m … lmax`` coefficients; ``SO2₁`` scales its inputs per edge by a
  radial MLP of ``e_ji`` (the eSCN paper's SO(2) convolution).
* ``gate``: SiLU on the ``l = 0`` coefficient, the others times ``sigmoid`` of a per-degree gate scalar.
* ``RMSNorm`` (fairchem's ``rms_norm_sh``): the ``l = 0`` coefficient centred over channels, every coefficient
  divided by ``√(mean_c Σ_l mean_m x² / (lmax+1) + 1e-5)``, times a per-degree, per-channel weight, plus a bias
  on ``l = 0``.
* The grid feed-forward evaluates the embedding on an S² grid (``2(lmax+1) × 2(lmax+1)+1`` points, or
  ``grid_resolution``²), applies a bias-free SiLU MLP ``C → H → H → C`` per point and projects back by
  quadrature. A pointwise nonlinearity on a finite grid is equivariant only up to the grid's aliasing: rotations
  mapping the grid onto itself (about ``y`` by multiples of ``2π/res_alpha``, by π about ``z``) leave the energy
  unchanged to rounding, others to the grid's accuracy — as in fairchem's model.
* System embedding ``σ`` (fairchem's charge / spin embedding, ``mix_csd``): ``SiLU(W [sin(2πQw), cos(2πQw),
  spin part] + b)``. Here every structure is neutral with an unspecified spin (fairchem's ``charge = 0``,
  ``spin = 0``: the spin part is zero), so ``σ = SiLU(W [0, 1, 0] + b)``: one learned vector. Per-structure
  charge and spin inputs and fairchem's dataset embeddings may come later.
* Frames: :func:`.so3.edge_rotation` (deterministic; fairchem draws a random roll about the edge on every call).
  The messages do not depend on the roll, so neither do energies and forces (up to rounding);
  ``ESCNEmbedding.random_roll = True`` draws one per edge and call as fairchem does.

Graph parallelism: the message passing is node-centred. Per block each rank normalises its owned atoms,
gathers every atom's row (``comm.atoms_gather``), computes the messages of its local edges, sums them onto their
target atoms and reduces the sums onto the owners (``comm.atoms_reduce``: a local slice under the ``atom-owner``
partitioner, whose edges belong to their target's owner); norms, the feed-forward and the heads run on owned atoms.
Each edge looks its atoms' element embeddings up in the replicated atomic numbers (no gather).
Pipeline: a stage after the first receives the owned atoms' ``x``, ``σ`` and element embeddings (``O(N)``), gathers
the element embeddings and recomputes the geometry (edge frames, envelope, Gaussians) from the positions
(:meth:`ESCNMD.stage_geometry`).

Weights: :func:`import_fairchem_state_dict` loads a fairchem eSCN-MD checkpoint of this configuration (backbone
``escnmd_backbone`` without dataset embedding, an ``MLP_Energy_Head`` / ``MLP_EFS_Head`` and, with direct
forces, a ``Linear_Force_Head``); :func:`export_fairchem_state_dict` writes one back.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import ConfigError
from ..registry import register
from .base import AtomisticModel, AtomisticUnit, scatter_sum
from .comm import LOCAL, GraphParallelHooks
from .cost import HookCall, UnitWidths
from .dimenet import _check_common
from .gemnet import radial_envelope
from .so3 import edge_rotation, m_major_degrees, m_major_index, num_coefficients, s2_grid_matrices, wigner_d

#: fairchem's edge-degree embedding divides its sum over neighbours by this constant (≈ √(average degree))
DEGREE_RESCALE = 5.0
#: the polynomial envelope's exponent
ENVELOPE_EXPONENT = 5


class GaussianBasis(nn.Module):
    """``[E]`` lengths (Å) → ``[E, K]``: ``exp(−(d − μ_k)² / (2 (2Δ)²))`` on ``K`` centres ``μ_k`` evenly spaced on
    ``[0, cutoff]`` (spacing ``Δ``; fairchem's ``GaussianSmearing`` with width factor 2). Parameter-free; the
    centres are computed in float64."""

    def __init__(self, num: int, cutoff: float, width: float = 2.0):
        super().__init__()
        with torch.device("cpu"):
            self.register_buffer("offset", torch.linspace(0.0, float(cutoff), num, dtype=torch.float64),
                                 persistent=False)
        self.coeff = -0.5 / (width * float(cutoff) / (num - 1)) ** 2

    def forward(self, dist: Tensor) -> Tensor:
        return torch.exp(self.coeff * (dist.unsqueeze(-1) - self.offset.to(dist.dtype)).square())


class RadialMLP(nn.Module):
    """``Linear → LayerNorm → SiLU`` for each hidden width, then a last ``Linear``: ``channels[0] → … →
    channels[-1]`` (fairchem's ``RadialMLP``)."""

    def __init__(self, channels: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        for k in range(1, len(channels)):
            layers.append(nn.Linear(channels[k - 1], channels[k]))
            if k < len(channels) - 1:
                layers += [nn.LayerNorm(channels[k]), nn.SiLU()]
        self.layers = nn.Sequential(*layers)

    def reset_parameters(self) -> None:
        for layer in self.layers:
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class RMSNormSH(nn.Module):
    """fairchem's ``rms_norm_sh`` on ``[n, (lmax+1)², C]`` (module docstring): ``weight`` ``[lmax+1, C]`` per degree
    and channel, ``bias`` ``[C]`` on ``l = 0``; each degree weighs ``1/((2l+1)(lmax+1))`` in the mean square."""

    def __init__(self, lmax: int, channels: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(lmax + 1, channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps
        degree = [math.isqrt(i) for i in range(num_coefficients(lmax))]
        with torch.device("cpu"):
            self.register_buffer("degree", torch.tensor(degree), persistent=False)
            self.register_buffer("balance", torch.tensor([1.0 / ((2 * l + 1) * (lmax + 1)) for l in degree],
                                                         dtype=torch.float64), persistent=False)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        x0, rest = _split_l0(x)
        x = torch.cat([x0 - x0.mean(dim=2, keepdim=True), rest], dim=1)
        ms = torch.einsum("nic,i->nc", x.square(), self.balance.to(x.dtype)).mean(dim=1)  # [n]
        scale = (ms + self.eps).rsqrt().view(-1, 1, 1)
        out0, rest = _split_l0(x * scale * self.weight.index_select(0, self.degree))
        return torch.cat([out0 + self.bias, rest], dim=1)


class SO2Convolution(nn.Module):
    """An SO(2) convolution of rotated edge features ``[E, M, C_in]`` (m-major, ``|m| ≤ mmax``) → ``[E, M, C_out]``
    (eSCN's convolution in the edge frame; module docstring).

    Args:
        in_channels, out_channels, lmax, mmax: the sizes.
        radial: the widths of the radial MLP ``[e_dim, hidden, …]`` that scales the inputs per edge (its last
            width, every input value per edge, is added here), or ``None`` (no radial scaling).
        gates: extra ``m = 0`` outputs returned separately (the gate scalars), 0 for none.
    """

    def __init__(self, in_channels: int, out_channels: int, lmax: int, mmax: int,
                 radial: list[int] | None = None, gates: int = 0):
        super().__init__()
        self.lmax, self.mmax, self.cin, self.cout, self.gates = lmax, mmax, in_channels, out_channels, gates
        self.m0 = nn.Linear((lmax + 1) * in_channels, (lmax + 1) * out_channels + gates)
        self.m_linears = nn.ModuleList(
            nn.Linear((lmax - m + 1) * in_channels, 2 * (lmax - m + 1) * out_channels, bias=False)
            for m in range(1, mmax + 1))
        self.x_split = [lmax + 1] + [2 * (lmax - m + 1) for m in range(1, mmax + 1)]
        self.r_split = [(lmax + 1) * in_channels] + [(lmax - m + 1) * in_channels for m in range(1, mmax + 1)]
        self.radial = RadialMLP([*radial, sum(self.r_split)]) if radial is not None else None

    def reset_parameters(self) -> None:
        self.m0.reset_parameters()
        for lin in self.m_linears:
            lin.reset_parameters()
            with torch.no_grad():
                lin.weight.mul_(1 / math.sqrt(2))
        if self.radial is not None:
            self.radial.reset_parameters()

    def forward(self, x: Tensor, edge_features: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``x`` ``[E, M, C_in]``, ``edge_features`` ``[E, e_dim]`` (with a radial MLP) → ``([E, M, C_out], gate
        scalars [E, gates] or None)``."""
        E = x.size(0)
        parts = x.split(self.x_split, dim=1)
        r = self.radial(edge_features).split(self.r_split, dim=1) if self.radial is not None else None
        x0 = parts[0].reshape(E, (self.lmax + 1) * self.cin)
        y0 = self.m0(x0 if r is None else x0 * r[0])
        gates = None
        if self.gates:
            gates, y0 = y0.split([self.gates, y0.size(1) - self.gates], dim=1)
        out = [y0.reshape(E, self.lmax + 1, self.cout)]
        for m, lin in enumerate(self.m_linears, start=1):
            xm = parts[m].reshape(E, 2, (self.lmax - m + 1) * self.cin)  # [E, (+m, −m), (l = m … lmax) · C_in]
            if r is not None:
                xm = xm * r[m].unsqueeze(1)
            w1, w2 = lin(xm).chunk(2, dim=2)  # [E, 2, half] each: W₁ and W₂ applied to x₊ₘ and to x₋ₘ
            (w1p, w1n), (w2p, w2n) = w1.unbind(1), w2.unbind(1)
            n = self.lmax - m + 1
            out += [(w1p - w2n).reshape(E, n, self.cout), (w2p + w1n).reshape(E, n, self.cout)]
        return torch.cat(out, dim=1), gates


class GridFeedForward(nn.Module):
    """The grid feed-forward: ``[n, (lmax+1)², C]`` → the same shape (module docstring)."""

    def __init__(self, lmax: int, channels: int, hidden: int, res_beta: int, res_alpha: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(channels, hidden, bias=False), nn.SiLU(),
                                 nn.Linear(hidden, hidden, bias=False), nn.SiLU(),
                                 nn.Linear(hidden, channels, bias=False))
        to_grid, from_grid = s2_grid_matrices(lmax, res_beta, res_alpha)
        L = num_coefficients(lmax)
        self.register_buffer("to_grid", to_grid.reshape(-1, L), persistent=False)      # [P, L]
        self.register_buffer("from_grid", from_grid.reshape(-1, L), persistent=False)  # [P, L]

    def reset_parameters(self) -> None:
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        grid = torch.einsum("pi,nic->npc", self.to_grid.to(x.dtype), x)
        return torch.einsum("pi,npc->nic", self.from_grid.to(x.dtype), self.mlp(grid))


def _split_l0(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` ``[n, rows, C]`` → its first row ``[n, 1, C]`` (``l = 0``) and the others: a split, whose backward is a
    concatenation (slices' backward would zero-fill ``x``'s size in each backward pass)."""
    return x.split([1, x.size(1) - 1], dim=1)


def _sum_onto(src: Tensor, index: Tensor, num_nodes: int) -> Tensor:
    """``[E, d]`` rows summed onto ``[num_nodes, d]`` by ``index`` (``index_put_`` with accumulation: the sum keeps
    only the index for its backward, where ``index_add_`` keeps ``src`` too)."""
    return src.new_zeros(num_nodes, src.size(1)).index_put_((index,), src, accumulate=True)


def _edge_frames(vec: Tensor, lmax: int, index: Tensor, random_roll: bool) -> Tensor:
    """The rotated-frame Wigner-D rows ``[E, M, (lmax+1)²]`` of edge vectors ``[E, 3]`` (``index``: the m-major
    rows)."""
    roll = torch.rand(vec.size(0), dtype=vec.dtype, device=vec.device) * (2 * math.pi) if random_roll else None
    return wigner_d(edge_rotation(vec, roll), lmax).index_select(1, index)


class ESCNEmbedding(AtomisticUnit):
    """Unit 0: the geometry (edge frames, envelope, Gaussians), the system, atom and element embeddings and the
    edge-degree embedding. State out: ``x`` ``[N_r, (lmax+1)², C]``, ``sigma`` ``[N_r, C]`` (the system embedding of
    each owned atom's structure), ``elem`` ``[N_r, 2·edge_channels]`` (each owned atom's source and target element
    embeddings) and the geometry (:meth:`geometry`)."""

    #: draw a random roll of every edge frame on every call (fairchem's behaviour); off: deterministic frames
    random_roll: bool = False

    def __init__(self, c: dict):
        super().__init__()
        C, ec, lmax = c["sphere_channels"], c["edge_channels"], c["lmax"]
        self.lmax, self.C, self.ec, self.cutoff = lmax, C, ec, c["cutoff"]
        self.atom_emb = nn.Embedding(c["max_z"] + 1, C)
        self.system_mix = nn.Linear(2 * C, C)
        self.source_emb = nn.Embedding(c["max_z"] + 1, ec)
        self.target_emb = nn.Embedding(c["max_z"] + 1, ec)
        self.distances = GaussianBasis(c["num_distance_basis"], c["cutoff"])
        self.degree_radial = RadialMLP([c["num_distance_basis"] + 2 * ec, ec, ec, (lmax + 1) * C])
        with torch.device("cpu"):
            self.register_buffer("rows", torch.tensor(m_major_index(lmax, c["mmax"])), persistent=False)

    def reset_parameters(self) -> None:
        self.atom_emb.reset_parameters()
        self.system_mix.reset_parameters()
        nn.init.uniform_(self.source_emb.weight, -0.001, 0.001)
        nn.init.uniform_(self.target_emb.weight, -0.001, 0.001)
        self.degree_radial.reset_parameters()

    def system_embedding(self, num_structures: int) -> Tensor:
        """``[B, C]``: σ of neutral structures of unspecified spin (module docstring)."""
        C = self.C
        w = self.system_mix.weight
        v = torch.cat([w.new_zeros(C // 2), w.new_ones(C // 2), w.new_zeros(C)])
        return F.silu(self.system_mix(v)).expand(num_structures, C)

    def geometry(self, state, graph, comm: GraphParallelHooks, elements: Tensor | None = None) -> dict:
        """The geometry from ``state["pos"]``: ``vec`` ``[E, 3]`` (Å, from ``i`` to ``j``'s image), ``dist`` ``[E]``,
        the Wigner-D rows ``wigner`` ``[E, M, (lmax+1)²]``, the envelope ``env`` ``[E]`` and the edge features
        ``edge_features`` ``[E, K + 2·edge_channels]``. Differentiable in ``pos`` (conservative forces).

        ``elements``: each edge's source and target element embeddings ``[E, 2·edge_channels]``; ``None`` (a later
        pipeline stage, which holds no embedding weights): read from the owned atoms' ``state["elem"]`` gathered with
        ``comm.atoms_gather``."""
        vec = graph.edge_vectors(state["pos"], state["cell"])
        dist = vec.norm(dim=-1)
        if elements is None:
            j, i = graph.edge_index[0], graph.edge_index[1]
            source, target = comm.atoms_gather(state["elem"]).split(self.ec, dim=1)
            elements = torch.cat([source.index_select(0, j), target.index_select(0, i)], dim=1)
        feats = torch.cat([self.distances(dist), elements], dim=1)
        return {"vec": vec, "dist": dist, "wigner": _edge_frames(vec, self.lmax, self.rows, self.random_roll),
                "env": radial_envelope(dist / self.cutoff, ENVELOPE_EXPONENT), "edge_features": feats}

    def forward(self, state, graph, comm: GraphParallelHooks):
        z = state["z"]
        C, L = self.C, num_coefficients(self.lmax)
        sigma = self.system_embedding(state["num_structures"]).index_select(0, state["atom_batch"])
        elem = torch.cat([self.source_emb(z), self.target_emb(z)], dim=1)  # owned atoms': for a later stage
        # each edge looks its atoms' element embeddings up in the replicated atomic numbers: no gather
        j, i = graph.edge_index[0], graph.edge_index[1]
        z_all = state["z_all"]
        elements = torch.cat([self.source_emb(z_all.index_select(0, j)), self.target_emb(z_all.index_select(0, i))],
                             dim=1)
        geo = self.geometry(state, graph, comm, elements)
        x0 = (self.atom_emb(z) + sigma).unsqueeze(1)
        x = torch.cat([x0, x0.new_zeros(z.size(0), L - 1, C)], dim=1)
        # the edge-degree embedding: per edge the m = 0 coefficients rotated back, onto the target atom
        E = geo["dist"].size(0)
        radial = self.degree_radial(geo["edge_features"]).reshape(E, self.lmax + 1, C)
        back = geo["wigner"][:, :self.lmax + 1].transpose(1, 2) * geo["env"].view(-1, 1, 1)   # [E, L, lmax+1]
        deg = _sum_onto(torch.bmm(back, radial).reshape(E, L * C) / DEGREE_RESCALE, graph.edge_index[1],
                        graph.num_nodes)
        x = x + comm.atoms_reduce(deg).reshape(z.size(0), L, C)
        return {**state, **geo, "x": x, "sigma": sigma, "elem": elem}


class ESCNBlock(AtomisticUnit):
    """One eSCN-MD block (module docstring): the edge-wise SO(2) message passing and the grid feed-forward, each
    after an RMS norm and with a residual connection. Reads and writes ``x``."""

    def __init__(self, c: dict):
        super().__init__()
        C, H, lmax, mmax = c["sphere_channels"], c["hidden_channels"], c["lmax"], c["mmax"]
        self.lmax, self.C = lmax, C
        ec = c["edge_channels"]
        self.norm_1 = RMSNormSH(lmax, C)
        self.conv_1 = SO2Convolution(2 * C, H, lmax, mmax, radial=[c["num_distance_basis"] + 2 * ec, ec, ec],
                                     gates=lmax * H)
        self.conv_2 = SO2Convolution(H, C, lmax, mmax)
        self.norm_2 = RMSNormSH(lmax, C)
        self.ff = GridFeedForward(lmax, C, H, c["res_beta"], c["res_alpha"])
        with torch.device("cpu"):
            self.register_buffer("gate_degree", torch.tensor(m_major_degrees(lmax, mmax)[1:]) - 1, persistent=False)

    def reset_parameters(self) -> None:
        for mod in (self.norm_1, self.conv_1, self.conv_2, self.norm_2, self.ff):
            mod.reset_parameters()

    def gate(self, x: Tensor, gates: Tensor) -> Tensor:
        """SiLU on ``l = 0``, the other rows of ``x`` ``[E, M, H]`` times ``sigmoid`` of their degree's gate."""
        g = torch.sigmoid(gates).reshape(x.size(0), self.lmax, x.size(2)).index_select(1, self.gate_degree)
        x0, rest = _split_l0(x)
        return torch.cat([F.silu(x0), rest * g], dim=1)

    def forward(self, state, graph, comm: GraphParallelHooks):
        x = state["x"]
        n, L, C = x.shape
        y0, rest = _split_l0(self.norm_1(x))
        y = torch.cat([y0 + state["sigma"].unsqueeze(1), rest], dim=1)
        y = comm.atoms_gather(y.reshape(n, L * C))  # [N, L·C]: rows gathered in 2-D (a cheaper backward)
        j, i = graph.edge_index[0], graph.edge_index[1]
        E = j.numel()
        D = state["wigner"]
        pair = torch.cat([y.index_select(0, j).view(E, L, C), y.index_select(0, i).view(E, L, C)], dim=2)
        msg = torch.bmm(D, pair)  # [E, M, 2C]
        msg, gates = self.conv_1(msg, state["edge_features"])
        msg, _ = self.conv_2(self.gate(msg, gates))
        msg = torch.bmm(D.transpose(1, 2) * state["env"].view(-1, 1, 1), msg)              # [E, L, C]
        agg = _sum_onto(msg.reshape(E, L * C), i, graph.num_nodes)
        x = x + comm.atoms_reduce(agg).reshape(n, L, C)
        x = x + self.ff(self.norm_2(x))
        return {**state, "x": x}


class L1ForceHead(nn.Module):
    """Direct forces from the ``l = 1`` coefficients: ``F_i = Σ_c w_c x_i[l=1, c]`` (``w`` ``[C]``; fairchem's
    ``Linear_Force_Head``, an ``SO3_Linear`` to one channel whose ``l = 1`` output is the force)."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.numel())
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """``[n, (lmax+1)², C]`` → ``[n, 3]`` (eV/Å)."""
        return x[:, 1:4] @ self.weight


class ESCNHead(nn.Module):
    """The readout's parameters: the final norm, the energy MLP ``C → H → H → 1`` (SiLU) on ``l = 0`` and, with
    direct forces, the :class:`L1ForceHead`."""

    def __init__(self, c: dict):
        super().__init__()
        C, H = c["sphere_channels"], c["hidden_channels"]
        self.norm = RMSNormSH(c["lmax"], C)
        self.energy = nn.Sequential(nn.Linear(C, H), nn.SiLU(), nn.Linear(H, H), nn.SiLU(), nn.Linear(H, 1))
        self.forces = L1ForceHead(C) if c["direct_forces"] else None

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        for layer in self.energy:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
        if self.forces is not None:
            self.forces.reset_parameters()


#: the options of eSCN-MD (fairchem's names) and their help
ESCN_OPTION_HELP = {
    "lmax": "largest degree l of the spherical-harmonic embeddings",
    "mmax": "largest order |m| the SO(2) convolutions keep (<= lmax)",
    "sphere_channels": "channels C per coefficient of the atom embeddings (0: --hidden)",
    "hidden_channels": "hidden width H of the SO(2) convolutions, the grid MLP and the energy MLP (0: --hidden)",
    "edge_channels": "width of the element embeddings and the radial MLPs",
    "num_distance_basis": "Gaussians of the distance expansion",
    "distance_function": "distance expansion: gaussian (the only one fairchem has)",
    "norm_type": "rms_norm_sh (fairchem's; layer_norm and layer_norm_sh may come later)",
    "act_type": "gate (fairchem's s2 activation may come later)",
    "ff_type": "grid (fairchem's spectral feed-forward may come later)",
    "grid_resolution": "points per S² grid axis of the feed-forward (0: 2(lmax+1) x 2(lmax+1)+1)",
    "cutoff": "neighbour cutoff (Å)",
    "max_neighbors": "per-atom neighbour cap of the graph",
    "max_z": "largest atomic number (fairchem's max_num_elements = max_z + 1)",
    "direct_forces": "force head on the l=1 channels instead of -dE/dpos",
}


@register("escn-md")
class ESCNMD(AtomisticModel):
    """eSCN-MD (fairchem's UMA backbone; Passaro & Zitnick 2023, Wood et al. 2025): SO(3)-equivariant atom
    embeddings, SO(2) convolutions in edge-aligned frames, a grid feed-forward; see the module docstring. Charge,
    spin and dataset embeddings may come later (structures are neutral, with unspecified spin).

    Args:
        num_layers: eSCN-MD blocks (``--layers``; fairchem's ``num_layers``, default 2).
        hidden: ``sphere_channels`` and ``hidden_channels`` where those are 0 (``--hidden``; default 128).
        activation: ``None`` (eSCN-MD's SiLU and sigmoid gates) or ``"silu"`` / ``"swish"``.
        lmax, mmax, sphere_channels, hidden_channels, edge_channels, num_distance_basis, distance_function,
        norm_type, act_type, ff_type, grid_resolution, cutoff (Å), max_neighbors: fairchem's ``escnmd_backbone``
            options of the same names and defaults (``grid_resolution`` 0 for its ``None``).
        max_z: the largest atomic number (embedding rows ``max_z + 1``, indexed by ``z``: fairchem's
            ``max_num_elements`` is ``max_z + 1``).
        direct_forces: a force head on the ``l = 1`` coefficients (fairchem's ``Linear_Force_Head``) instead of
            ``−∂E/∂pos`` (its ``MLP_EFS_Head``).
        in_channels, out_channels, dropout, bias: the zoo's common arguments (``out_channels`` 1, no dropout,
            biases on).

    Raises:
        ConfigError: ``out_channels != 1``, ``dropout > 0``, ``bias=False``, sizes < 1, ``lmax < 1``, ``mmax``
            outside ``0 … lmax``, an odd ``sphere_channels`` (the charge embedding's sine / cosine halves),
            ``cutoff <= 0``, ``num_distance_basis < 2``, a grid too coarse for ``lmax``, an activation, norm,
            feed-forward or distance function eSCN-MD here does not have.
    """

    uses_triplets = False
    graph_parallel = True
    option_help = ESCN_OPTION_HELP

    def __init__(self, in_channels: int | None = None, out_channels: int = 1, num_layers: int = 2,
                 hidden: int = 128, dropout: float = 0.0, bias: bool = True, activation: str | None = None,
                 lmax: int = 2, mmax: int = 2, sphere_channels: int = 0, hidden_channels: int = 0,
                 edge_channels: int = 128, num_distance_basis: int = 512, distance_function: str = "gaussian",
                 norm_type: str = "rms_norm_sh", act_type: str = "gate", ff_type: str = "grid",
                 grid_resolution: int = 0, cutoff: float = 5.0, max_neighbors: int = 300, max_z: int = 99,
                 direct_forces: bool = False):
        super().__init__()

        C, H = sphere_channels or hidden, hidden_channels or hidden
        _check_common("escn-md", out_channels, dropout, bias, num_layers=num_layers, sphere_channels=C,
                      hidden_channels=H, edge_channels=edge_channels, num_distance_basis=num_distance_basis,
                      lmax=lmax, max_neighbors=max_neighbors, max_z=max_z)
        for name, value, allowed in (("distance_function", distance_function, ("gaussian",)),
                                     ("norm_type", norm_type, ("rms_norm_sh",)), ("act_type", act_type, ("gate",)),
                                     ("ff_type", ff_type, ("grid",))):
            if value not in allowed:
                raise ConfigError(f"escn-md option {name} must be {' or '.join(allowed)} here, got {value!r}")
        if activation not in (None, "silu", "swish"):
            raise ConfigError(f"escn-md uses SiLU and sigmoid gates; activation must be silu, got {activation!r}")
        if not isinstance(mmax, int) or isinstance(mmax, bool) or not 0 <= mmax <= lmax:
            raise ConfigError(f"escn-md needs 0 <= mmax <= lmax ({lmax}), got {mmax!r}")
        if C % 2:
            raise ConfigError(f"escn-md needs an even sphere_channels (the charge embedding's sine and cosine halves), "
                              f"got {C}")
        if num_distance_basis < 2:
            raise ConfigError(f"escn-md needs num_distance_basis >= 2, got {num_distance_basis}")
        if not cutoff > 0:
            raise ConfigError(f"escn-md needs cutoff > 0 (Å), got {cutoff}")
        res_beta, res_alpha = ((grid_resolution, grid_resolution) if grid_resolution
                               else (2 * (lmax + 1), 2 * (lmax + 1) + 1))
        if res_beta % 2 or res_beta < 2 * (lmax + 1) or res_alpha < 2 * lmax + 1:
            raise ConfigError(f"escn-md option grid_resolution must be even and >= {2 * (lmax + 1)} for lmax {lmax}, "
                              f"got {grid_resolution}")
        c = {"lmax": lmax, "mmax": mmax, "sphere_channels": C, "hidden_channels": H, "edge_channels": edge_channels,
             "num_distance_basis": num_distance_basis, "cutoff": float(cutoff), "max_z": max_z,
             "direct_forces": bool(direct_forces), "res_beta": res_beta, "res_alpha": res_alpha}
        self.config = c
        self.cutoff, self.max_neighbors, self.max_z = float(cutoff), int(max_neighbors), int(max_z)
        self.direct_forces = bool(direct_forces)
        self.units = nn.ModuleList([ESCNEmbedding(c)] + [ESCNBlock(c) for _ in range(num_layers)])
        self.head = ESCNHead(c)
        self.reset_parameters()

    # ------------------------------------------------------------------ its own cost
    def _sizes(self) -> dict:
        """``C`` sphere channels, ``H`` hidden channels, ``ec`` edge channels, ``K`` Gaussians, ``l1 = lmax + 1``,
        ``L = (lmax+1)²`` coefficients, ``M`` coefficients with ``|m| ≤ mmax`` (the edge frames' rows), ``P`` points
        of the S² grid, ``Q`` points of the Wigner-D fit (:func:`.so3.wigner_d`), ``B`` blocks."""
        c = self.config
        lmax = c["lmax"]
        return {"C": c["sphere_channels"], "H": c["hidden_channels"], "ec": c["edge_channels"],
                "K": c["num_distance_basis"], "lmax": lmax, "l1": lmax + 1, "L": num_coefficients(lmax),
                "M": len(m_major_index(lmax, c["mmax"])), "P": c["res_beta"] * c["res_alpha"],
                "Q": 2 * (2 * lmax + 1), "B": len(self.units) - 1, "direct": self.direct_forces}

    def activation_widths(self) -> list[UnitWidths]:
        """Counted with autograd's saved-tensor hooks (floating tensors, per storage; tests/models/atomistic/
        test_escn.py) on this module's code, in the sizes of :meth:`_sizes`. Per edge and block (conservative
        forces): ``2LC + (6M + l1)C + (4M − 2)H + LM + 6ec + 4`` (the gathered pair ``[y_j, y_i]`` rotated; the
        radial MLP's hidden values and its output; the rotated rows and their radial products; the gate's scalars,
        inputs and factors; the second convolution's inputs; the frames scaled by the envelope and the message
        rotated back); direct forces keep neither the pair (``2LC``) nor the message rotated back (``MC``): the frames
        need no gradient. Per atom and block: the two norms
        ``2(2LC + 1)`` and the grid feed-forward ``PC + 4PH``. The embedding: the geometry
        (:meth:`geometry_widths`, conservative) and the edge-degree embedding ``6ec + 4 + L·l1`` per edge
        (``+ l1·C`` with conservative forces: its radial values, multiplied by frames that need a gradient). The
        readout per atom: the final norm and the energy MLP's inputs ``3LC + 4H + 2`` (direct: ``+ 3C``, the force
        head's ``l = 1`` rows). Per-call constants (the norms' per-degree weights, the system embedding) are not
        widths."""
        z = self._sizes()
        C, H, ec, l1, L, M, P = (z[k] for k in ("C", "H", "ec", "l1", "L", "M", "P"))
        direct = z["direct"]
        degree = 6 * ec + 4 + L * l1 + (0 if direct else l1 * C)
        units = [self.geometry_widths(True) + UnitWidths(degree)]
        edge = 2 * L * C + (6 * M + l1) * C + (4 * M - 2) * H + L * M + 6 * ec + 4
        if direct:
            edge -= 2 * L * C + M * C
        block = UnitWidths(edge, 0, 2 * (2 * L * C + 1) + P * C + 4 * P * H)
        units += [block for _ in range(z["B"])]
        units[-1] = units[-1] + UnitWidths(0, 0, 3 * L * C + 4 * H + 2 + (3 * C if direct else 0))
        return units

    def geometry_widths(self, conservative: bool) -> UnitWidths:
        """Per edge. Conservative: the whole derivation from the positions: vectors and lengths (4), the Gaussians
        (``2K``), the edge rotation (25), the spherical harmonics at the ``Q`` rotated fit points
        (``Q(2·lmax² + 3·lmax + 3)``, ``Q(2·lmax² + 3·lmax)`` for ``lmax = 1``), the frames' rows (``LM``), the
        envelope's polynomial and value (5) and the edge features (``K + 2ec``). Direct: what the blocks read that
        needs no gradient itself: the frames (``LM``) and the edge features."""
        z = self._sizes()
        K, ec, L, M, lmax = z["K"], z["ec"], z["L"], z["M"], z["lmax"]
        if not conservative:
            return UnitWidths(L * M + K + 2 * ec)
        harmonics = z["Q"] * (2 * lmax * lmax + 3 * lmax + (3 if lmax >= 2 else 0))
        return UnitWidths(4 + 2 * K + 25 + harmonics + L * M + 5 + K + 2 * ec)

    def embedding_stage_widths(self, conservative: bool) -> UnitWidths:
        """The embedding alone: with conservative forces its edge-degree embedding keeps the whole geometry; with
        direct ones its radial MLP keeps the edge features."""
        return self.geometry_widths(True) if conservative else UnitWidths(self._sizes()["K"] + 2 * self._sizes()["ec"])

    def work_widths(self) -> list[UnitWidths]:
        """Multiply-adds of the linear maps. Per edge: the Wigner-D fit (``9Q`` to rotate the points, ``Q·Σ(2l+1)²``
        to solve for the blocks) and the edge-degree embedding (radial MLP, ``L·l1·C`` to rotate back); per block
        the rotation ``2LMC``, the radial MLP, the SO(2) convolutions per ``m`` (``m = 0``: ``l1·2C·(l1 + lmax)H``
        and ``l1²HC``; ``m > 0``: ``8(l1 − m)²CH`` and ``4(l1 − m)²HC``), the rotation back ``LMC``; per atom the
        norms (``2LC``), the grid's projections ``2PLC`` and MLP ``P(2CH + H²)``; the readout's norm and energy
        MLP (``LC + CH + H² + H``; ``3C`` for direct forces)."""
        z = self._sizes()
        C, H, ec, K, lmax, l1, L, M, P, Q = (z[k] for k in ("C", "H", "ec", "K", "lmax", "l1", "L", "M", "P", "Q"))
        mmax = self.config["mmax"]
        radial_in = (K + 2 * ec) * ec + ec * ec
        fit = 9 * Q + Q * sum((2 * l + 1) ** 2 for l in range(l1))
        units = [UnitWidths(fit + radial_in + ec * l1 * C + L * l1 * C)]
        conv = (2 * L * M * C + radial_in + ec * (M + l1) * C + l1 * 2 * C * (l1 + lmax) * H + l1 * l1 * H * C
                + sum(12 * (l1 - m) ** 2 * C * H for m in range(1, mmax + 1)) + L * M * C)
        block = UnitWidths(conv, 0, 2 * L * C + 2 * P * L * C + P * (2 * C * H + H * H))
        units += [block for _ in range(z["B"])]
        units[-1] = units[-1] + UnitWidths(0, 0, L * C + C * H + H * H + H + (3 * C if z["direct"] else 0))
        return units

    def boundary_widths(self) -> UnitWidths:
        """Per owned atom: ``x`` (``LC``), ``sigma`` (``C``) and ``elem`` (``2ec``)."""
        z = self._sizes()
        return UnitWidths(0, 0, z["L"] * z["C"] + z["C"] + 2 * z["ec"])

    # ------------------------------------------------------------------ the hooks of AtomisticModel
    def pipeline_boundary(self) -> dict:
        """The owned atoms' embeddings ``x`` ``[(lmax+1)², C]``, system embedding ``sigma`` ``[C]`` and element
        embeddings ``elem`` ``[2·edge_channels]`` (all depend on unit 0's weights): ``O(N)``; the geometry is
        recomputed on each stage."""
        c = self.config
        C = c["sphere_channels"]
        return {"x": ("atoms", (num_coefficients(c["lmax"]), C)), "sigma": ("atoms", (C,)),
                "elem": ("atoms", (2 * c["edge_channels"],))}

    def initial_state(self, batch, graph, comm: GraphParallelHooks = LOCAL, *, pos_grad: bool = False,
                      strain: bool = False) -> dict:
        """:meth:`AtomisticModel.initial_state` and every atom's ``z_all`` ``[N]`` (replicated, like the positions:
        each edge looks its atoms' element embeddings up)."""
        return {**super().initial_state(batch, graph, comm, pos_grad=pos_grad, strain=strain), "z_all": batch.z}

    def stage_geometry(self, state, graph, comm: GraphParallelHooks = LOCAL):
        return {**state, **self.units[0].geometry(state, graph, comm)}

    def hook_calls(self, num_atoms: int, num_structures: int) -> list[HookCall]:
        """The graph-parallel hook calls of one forward (with the trainer's gather of direct forces), in call order
        (``unit`` −1: the readout; ``width``: values per row, or of the whole tensor for ``sum`` /
        ``replicated_grad``; ``pos``: the input depends on the positions with conservative forces; ``grad``: it needs
        a gradient; ``forward_only``: no autograd). The embedding looks the element embeddings up per edge (no
        gather); a pipeline stage after the first gathers ``elem`` (``2·edge_channels`` per atom) in
        :meth:`stage_geometry`."""
        c = self.config
        row, cons = num_coefficients(c["lmax"]) * c["sphere_channels"], not self.direct_forces

        def call(unit, hook, width, pos=True, grad=True, forward_only=False):
            return HookCall(unit, hook, int(width), pos=pos, grad=grad, forward_only=forward_only)

        calls = [call(0, "atoms_reduce", row, pos=cons)]  # the edge-degree embedding
        for b in range(1, len(self.units)):
            calls += [call(b, "atoms_gather", row, pos=cons), call(b, "atoms_reduce", row, pos=cons)]
        calls.append(call(-1, "sum", num_structures, pos=False))
        if cons:
            calls.append(call(-1, "replicated_grad", 3 * num_atoms, pos=False, grad=False))
        else:
            calls.append(call(-1, "atoms_gather", 3, pos=False, grad=False, forward_only=True))
        return calls

    def readout(self, state, graph, comm: GraphParallelHooks = LOCAL) -> dict[str, Tensor]:
        """The final norm once (``x_out``), read by the energy head and the direct-force head."""
        return super().readout({**state, "x_out": self.head.norm(state["x"])}, graph, comm)

    def readout_energy(self, state, graph, comm: GraphParallelHooks) -> Tensor:
        e = self.head.energy(state["x_out"][:, 0]).squeeze(-1)
        return scatter_sum(e, state["atom_batch"], state["num_structures"])

    def readout_forces(self, state, graph, comm: GraphParallelHooks) -> Tensor:
        return self.head.forces(state["x_out"])


# --------------------------------------------------------------------------------------------- fairchem's weights
def fairchem_key_map(model: ESCNMD, backbone: str = "backbone.", energy_head: str = "output_heads.energy.",
                     force_head: str = "output_heads.forces.") -> dict[str, str]:
    """Our state-dict key → fairchem's, for a fairchem ``HydraModel`` whose backbone is ``escnmd_backbone`` (keys
    under ``backbone``), energy head ``MLP_Energy_Head`` / ``MLP_EFS_Head`` (under ``energy_head``) and, with
    direct forces, ``Linear_Force_Head`` (under ``force_head``). The force weights map onto the ``l = 1`` slice of
    fairchem's ``linear.weight`` (see :func:`import_fairchem_state_dict`)."""
    def rad(key: str) -> str:  # our RadialMLP's ``layers`` are fairchem's ``rad_func.net`` (same indices)
        return re.sub(r"(degree_)?radial\.layers\.", "rad_func.net.", key)

    out = {}
    for key in model.state_dict():
        k = key
        if k.startswith("units.0."):
            k = k[len("units.0."):]
            k = {"atom_emb.weight": "sphere_embedding.weight", "source_emb.weight": "source_embedding.weight",
                 "target_emb.weight": "target_embedding.weight", "system_mix.weight": "mix_csd.weight",
                 "system_mix.bias": "mix_csd.bias"}.get(k, k)
            if k.startswith("degree_radial."):
                k = "edge_degree_embedding." + rad(k)
            out[key] = backbone + k
        elif k.startswith("units."):
            b, rest = k[len("units."):].split(".", 1)
            rest = re.sub(r"^norm_(\d)\.weight$", r"norm_\1.affine_weight", rest)
            rest = re.sub(r"^norm_(\d)\.bias$", r"norm_\1.affine_bias", rest)
            rest = re.sub(r"^conv_(\d)\.m0\.", r"edge_wise.so2_conv_\1.fc_m0.", rest)
            rest = re.sub(r"^conv_(\d)\.m_linears\.(\d+)\.weight$", r"edge_wise.so2_conv_\1.so2_m_conv.\2.fc.weight",
                          rest)
            rest = re.sub(r"^conv_(\d)\.radial\.", r"edge_wise.so2_conv_\1.radial.", rest)
            rest = rad(rest)
            rest = re.sub(r"^ff\.mlp\.", "atom_wise.grid_mlp.", rest)
            out[key] = f"{backbone}blocks.{int(b) - 1}.{rest}"
        elif k == "head.norm.weight":
            out[key] = backbone + "norm.affine_weight"
        elif k == "head.norm.bias":
            out[key] = backbone + "norm.affine_bias"
        elif k.startswith("head.energy."):
            out[key] = energy_head + "energy_block." + k[len("head.energy."):]
        elif k == "head.forces.weight":
            out[key] = force_head + "linear.weight"
        else:  # pragma: no cover - every key of the model is named above
            raise ConfigError(f"no fairchem name for {key!r}")
    return out


def _find_prefix(state_dict: dict, suffix: str, what: str, shape_ok=lambda t: True) -> str:
    found = sorted({k[:-len(suffix)] for k, v in state_dict.items() if k.endswith(suffix) and shape_ok(v)})
    if len(found) != 1:
        raise ConfigError(f"the fairchem state dict has {len(found)} {what} (keys ending {suffix!r}: {found[:4]}); "
                          f"name its prefix")
    return found[0]


def import_fairchem_state_dict(model: ESCNMD, state_dict: dict, backbone: str | None = None,
                               energy_head: str | None = None, force_head: str | None = None) -> None:
    """Load the weights of a fairchem eSCN-MD model of this configuration into ``model`` (in place).

    ``state_dict``: a fairchem checkpoint's model state (a ``HydraModel``'s, keys ``backbone.…`` and
    ``output_heads.<name>.…``, possibly under ``module.``), or the backbone's and heads' own state dicts merged under
    prefixes. Prefixes ``None`` are found: the backbone's from ``sphere_embedding.weight``, the energy head's from
    ``energy_block.0.weight``, the force head's from a ``linear.weight`` of shape ``[2, 1, C]`` (direct forces).
    fairchem's constant buffers (``Jd_l``), its charge / spin frequency vectors (no effect on neutral structures of
    unspecified spin) and the force head's ``l = 0`` weights and bias (its output is dropped) are not read.

    Raises:
        ConfigError: a missing key, a shape that differs (another size), a dataset embedding (``mix_csd`` with
            ``3·C`` inputs), or prefixes that cannot be found.
    """
    sd = {k.removeprefix("module."): v for k, v in state_dict.items()}
    C = model.config["sphere_channels"]
    if backbone is None:
        backbone = _find_prefix(sd, "sphere_embedding.weight", "backbones")
    if energy_head is None:
        energy_head = _find_prefix(sd, "energy_block.0.weight", "energy heads")
    if force_head is None and model.direct_forces:
        force_head = _find_prefix(sd, "linear.weight", "force heads",
                                  lambda t: tuple(t.shape) == (2, 1, C))
    mix = sd.get(backbone + "mix_csd.weight")
    if mix is not None and mix.size(1) == 3 * C:
        raise ConfigError("this fairchem model has a dataset embedding (mix_csd takes 3·sphere_channels inputs); "
                          "escn-md here has none yet (use_dataset_embedding=False)")
    keys = fairchem_key_map(model, backbone, energy_head, force_head or "")
    ours = model.state_dict()
    loaded = {}
    for mine, theirs in keys.items():
        if theirs not in sd:
            raise ConfigError(f"the fairchem state dict has no {theirs!r} (for our {mine!r})")
        value = sd[theirs]
        if mine == "head.forces.weight":
            value = value[1, 0]
        if tuple(value.shape) != tuple(ours[mine].shape):
            raise ConfigError(f"{mine!r} has shape {list(ours[mine].shape)}, fairchem's {theirs!r} "
                              f"{list(value.shape)}: build escn-md with the checkpoint's sizes")
        loaded[mine] = value
    model.load_state_dict(loaded, strict=True)


def export_fairchem_state_dict(model: ESCNMD, backbone: str = "backbone.", energy_head: str = "output_heads.energy.",
                               force_head: str = "output_heads.forces.") -> dict[str, Tensor]:
    """``model``'s weights under fairchem's names (:func:`fairchem_key_map`): what fairchem's ``load_state_dict``
    of the same configuration takes with ``strict=False`` (its constant ``Jd_l`` buffers and charge / spin frequency
    vectors stay its own). The force head's ``linear.weight`` ``[2, 1, C]`` gets zeros for ``l = 0`` and its
    ``linear.bias`` zero."""
    out = {}
    sd = model.state_dict()
    for mine, theirs in fairchem_key_map(model, backbone, energy_head, force_head).items():
        value = sd[mine].detach().clone()
        if mine == "head.forces.weight":
            value = torch.stack([torch.zeros_like(value), value]).unsqueeze(1)
            out[force_head + "linear.bias"] = value.new_zeros(1)
        out[theirs] = value
    return out
