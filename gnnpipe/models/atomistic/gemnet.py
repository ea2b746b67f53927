"""GemNet-T and GemNet-dT (Gasteiger, Becker, Günnemann, *GemNet: Universal Directional Graph Neural Networks for
Molecules*, NeurIPS 2021, arXiv 2106.08903; triplets only), as units around the graph-parallel hooks.

Written from the paper (its Fig. 2 and appendix) with the hyper-parameter names of fairchem's configurations
(``num_spherical``, ``num_radial``, ``num_blocks``, ``emb_size_atom``, ``emb_size_edge``, ``emb_size_trip``,
``emb_size_rbf``, ``emb_size_cbf``, ``emb_size_bil_trip``, ``num_before_skip``, ``num_after_skip``, ``num_concat``,
``num_atom``). Edges ``j → i`` carry messages ``m`` ``[E, emb_size_edge]``, atoms ``h`` ``[N_r, emb_size_atom]``.

* bases: a Gaussian radial basis of ``d/c`` (``num_radial`` centres on ``[0, 1]``) times the polynomial envelope
  ``u(x) = 1 − (p+1)(p+2)/2·x^p + p(p+2)·x^{p+1} − p(p+1)/2·x^{p+2}`` (``p = 5``, twice continuously
  differentiable at the cutoff); the circular basis ``Y_l0(cos φ) = √((2l+1)/4π)·P_l(cos φ)``,
  ``l < num_spherical``, of the angle ``φ`` at ``j`` of each triplet ``k → j → i``;
* embedding: ``h = emb(z)``; ``m_ji = σ(W [h_j, h_i, rbf_ji])``; the radial projections shared by every block
  (``rbf3``, ``rbf_h``, ``rbf_out`` ``[E, emb_size_rbf]``; ``rbf_W1`` ``[E, emb_size_cbf, num_spherical]``);
* interaction block: the triplet interaction (``m`` → dense → ``⊙ W rbf3`` → down-projection to
  ``emb_size_trip``, read by the triplets, the bilinear layer with the circular basis onto each edge
  ``[E, emb_size_bil_trip]``, up-projections, the edge's own aggregate plus its reverse edge's), the skip
  connections before and after (residual layers), the atom update (``m ⊙ W rbf_h`` summed onto the target atoms,
  a dense layer and ``num_atom`` residual layers) and the concatenation of each edge with its two atoms;
  every sum is scaled by ``1/√2`` as in the paper;
* output blocks (the embedding's and one per interaction block, summed): per-atom energies from
  ``m ⊙ W rbf_out`` summed onto the atoms; with direct forces (GemNet-dT) a per-edge scalar ``F_ji`` (an MLP of
  ``m``) times the unit vector of the edge, summed onto the target atoms.

The triplet → edge sum of the bilinear layer is a segment sum over the graph's ``idx_ji`` (each edge's triplets
padded to the largest count of the rank's edges, then batched matrix products), so it needs no triplet index
beyond the graph's own; the reverse edge is read through ``comm.edges_gather`` and the graph's ``id_swap``
(``idx_swap`` of a rank's view under graph parallelism), so one definition serves every layout.

Scale factors (:class:`ScaleFactor`): each sum or product whose variance the paper keeps near one is multiplied
by a factor fitted on data before training (:meth:`GemNetT.fit_scale_factors`: one forward pass in which each
factor, in the order the forward pass meets it, is set to ``√(Var(ref) / Var(x))``, fairchem's ``fit_scaling``);
the factors are buffers, so checkpoints and exported models carry them.

Activation: the scaled SiLU ``x·sigmoid(x)/0.6``; initialisation: He-orthogonal (an orthogonal matrix,
standardised, times ``1/√fan_in``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from ...data.atoms.graph import reverse_edges
from ...errors import ConfigError
from ..registry import register
from .base import AtomisticModel, AtomisticUnit, scatter_sum
from .comm import LOCAL, GraphParallelHooks
from .cost import HookCall, UnitWidths, readout_hook_calls
from .dimenet import _check_common, single_threaded

_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def scaled_silu(x: Tensor) -> Tensor:
    """``x·sigmoid(x) / 0.6``: SiLU scaled to keep unit variance (GemNet's activation)."""
    return x * torch.sigmoid(x) * (1.0 / 0.6)


def he_orthogonal_(weight: Tensor, fan_in: int | None = None) -> Tensor:
    """In place: a random (semi-)orthogonal matrix, each output row standardised (zero mean, unit variance over
    its inputs), times ``1/√fan_in`` (He variance with decorrelated features). ``weight`` ``[out, in]`` (or
    ``[out, ...]``: flattened per output row); ``fan_in`` defaults to the inputs per output row."""
    with torch.no_grad():
        flat = weight.view(weight.size(0), -1)
        nn.init.orthogonal_(flat)
        var, mean = torch.var_mean(flat, dim=1, keepdim=True)
        flat.copy_((flat - mean) / (var + 1e-6).sqrt())
        flat.mul_((1.0 / (fan_in or flat.size(1))) ** 0.5)
    return weight


class Dense(nn.Module):
    """``act(x W^T + b)`` with a He-orthogonal ``W`` (and zero bias)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 act: Callable[[Tensor], Tensor] | None = None):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.act = act

    def reset_parameters(self) -> None:
        he_orthogonal_(self.linear.weight)
        if self.linear.bias is not None:
            nn.init.zeros_(self.linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.linear(x)
        return x if self.act is None else self.act(x)


class ResidualLayer(nn.Module):
    """``(x + act(W2 act(W1 x))) / √2`` (two dense layers without bias)."""

    def __init__(self, units: int, act):
        super().__init__()
        self.dense_mlp = nn.Sequential(Dense(units, units, act=act), Dense(units, units, act=act))

    def reset_parameters(self) -> None:
        for d in self.dense_mlp:
            d.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return (x + self.dense_mlp(x)) * _INV_SQRT2


class ScaleFactor(nn.Module):
    """A fitted constant ``s`` (a buffer, 1 until fitted): ``forward(x, ref) = s · x``.

    While :attr:`fitting` (set by :meth:`GemNetT.fit_scale_factors`) the first call sets
    ``s = √(mean_f Var(ref[:, f]) / mean_f Var(x[:, f]))`` (``Var(ref) = 1`` without ``ref``) from the rows it
    is given, then applies it.
    """

    def __init__(self):
        super().__init__()
        self.register_buffer("scale_factor", torch.tensor(1.0, dtype=torch.float64))  # exact until cast
        self.fitting = False

    def forward(self, x: Tensor, ref: Tensor | None = None) -> Tensor:
        if self.fitting:
            with torch.no_grad():
                var_out = float(torch.var(x.detach().double(), dim=0).mean()) if x.size(0) > 1 else 0.0
                var_in = 1.0 if ref is None else (float(torch.var(ref.detach().double(), dim=0).mean())
                                                  if ref.size(0) > 1 else 0.0)
                value = math.sqrt(var_in / var_out) if var_out > 0 and var_in > 0 else 1.0
                self.scale_factor.fill_(value)
            self.fitting = False
        return x * self.scale_factor


def radial_envelope(x: Tensor, p: int) -> Tensor:
    """The polynomial envelope ``u(x)`` of the module docstring for ``x = d / cutoff`` (0 for ``x ≥ 1``)."""
    a, b, c = -(p + 1) * (p + 2) / 2, p * (p + 2), -p * (p + 1) / 2
    xp = x.pow(p)
    env = 1 + a * xp + b * xp * x + c * xp * x * x
    return torch.where(x < 1, env, torch.zeros_like(x))


class GaussianRBF(nn.Module):
    """``[E]`` lengths (Å) → ``[E, R]``: ``exp(−(x − μ_r)² / (2Δ²))`` of ``x = d/cutoff`` on ``R`` centres evenly
    spaced on ``[0, 1]`` (spacing ``Δ``), times the polynomial envelope (parameter-free)."""

    def __init__(self, num_radial: int, cutoff: float, envelope_exponent: int):
        super().__init__()
        self.register_buffer("offset", torch.linspace(0.0, 1.0, num_radial))
        self.coeff = -0.5 / (1.0 / max(num_radial - 1, 1)) ** 2
        self.cutoff, self.p = float(cutoff), int(envelope_exponent)

    def forward(self, dist: Tensor) -> Tensor:
        x = dist / self.cutoff
        g = torch.exp(self.coeff * (x.unsqueeze(-1) - self.offset.to(x.dtype)).square())
        return radial_envelope(x, self.p).unsqueeze(-1) * g


def circular_basis(cos: Tensor, num_spherical: int) -> Tensor:
    """``[T]`` cosines → ``[T, L]``: ``Y_l0 = √((2l+1)/4π) P_l(cos)``, ``l < L`` (Legendre recurrence)."""
    polys = [torch.ones_like(cos), cos]
    for l in range(1, num_spherical - 1):
        polys.append(((2 * l + 1) * cos * polys[l] - l * polys[l - 1]) / (l + 1))
    return torch.stack([math.sqrt((2 * l + 1) / (4 * math.pi)) * polys[l] for l in range(num_spherical)], dim=1)


class BilinearWeights(nn.Module):
    """A weight tensor ``[rows, cols]`` with He-orthogonal initialisation of fan-in ``fan_in``."""

    def __init__(self, shape: tuple[int, ...], fan_in: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape))
        self.fan_in = fan_in

    def reset_parameters(self) -> None:
        he_orthogonal_(self.weight, self.fan_in)


class AtomMLP(nn.Module):
    """``m ⊙ W rbf`` summed onto the target atoms (reduced onto owned atoms), scaled, then a dense layer and
    ``num_atom`` residual layers: the atom update and the output blocks' energy path."""

    def __init__(self, emb_size_atom: int, emb_size_edge: int, emb_size_rbf: int, num_atom: int, act):
        super().__init__()
        self.dense_rbf = Dense(emb_size_rbf, emb_size_edge)
        self.scale_sum = ScaleFactor()
        self.layers = nn.ModuleList([Dense(emb_size_edge, emb_size_atom, act=act)]
                                    + [ResidualLayer(emb_size_atom, act) for _ in range(num_atom)])

    def forward(self, m: Tensor, rbf: Tensor, target: Tensor, num_nodes: int, comm: GraphParallelHooks) -> Tensor:
        x = m * self.dense_rbf(rbf)
        h = self.scale_sum(comm.atoms_reduce(scatter_sum(x, target, num_nodes)), ref=x)
        for layer in self.layers:
            h = layer(h)
        return h


class OutputBlock(nn.Module):
    """One output block: per-atom energies ``[N_r, 1]`` and, with direct forces, per-edge force scalars ``[E, 1]``."""

    def __init__(self, emb_size_atom: int, emb_size_edge: int, emb_size_rbf: int, num_atom: int, act,
                 direct_forces: bool, output_init: str):
        super().__init__()
        self.energy = AtomMLP(emb_size_atom, emb_size_edge, emb_size_rbf, num_atom, act)
        self.out_energy = Dense(emb_size_atom, 1)
        self.output_init = output_init
        self.direct_forces = direct_forces
        if direct_forces:
            self.seq_forces = nn.ModuleList([Dense(emb_size_edge, emb_size_edge, act=act)]
                                            + [ResidualLayer(emb_size_edge, act) for _ in range(num_atom)])
            self.dense_rbf_F = Dense(emb_size_rbf, emb_size_edge)
            self.scale_rbf_F = ScaleFactor()
            self.out_forces = Dense(emb_size_edge, 1)

    def reset_parameters(self) -> None:
        _reset_all(self)
        if self.output_init == "zeros":
            nn.init.zeros_(self.out_energy.linear.weight)
            if self.direct_forces:
                nn.init.zeros_(self.out_forces.linear.weight)

    def forward(self, m: Tensor, rbf_out: Tensor, target: Tensor, num_nodes: int, comm: GraphParallelHooks):
        e = self.out_energy(self.energy(m, rbf_out, target, num_nodes, comm))
        if not self.direct_forces:
            return e, None
        x = m
        for layer in self.seq_forces:
            x = layer(x)
        f = self.scale_rbf_F(x * self.dense_rbf_F(rbf_out), ref=x)
        return e, self.out_forces(f)


def _reset_all(module: nn.Module) -> None:
    """Reset every Dense / ResidualLayer / BilinearWeights / OutputBlock / Embedding below ``module`` once, in
    module order."""
    for sub in module.children():
        if isinstance(sub, (Dense, ResidualLayer, BilinearWeights, OutputBlock)):
            sub.reset_parameters()
        elif isinstance(sub, nn.Embedding):
            nn.init.uniform_(sub.weight, -math.sqrt(3), math.sqrt(3))
        else:
            _reset_all(sub)


class GemNetEmbedding(AtomisticUnit):
    """Geometry and bases, the atom and edge embeddings, the shared radial projections and output block 0."""

    def __init__(self, cfg: dict, act):
        super().__init__()
        c = cfg
        self.num_spherical = c["num_spherical"]
        self.rbf = GaussianRBF(c["num_radial"], c["cutoff"], c["envelope_exponent"])
        self.atom_emb = nn.Embedding(c["max_z"], c["emb_size_atom"])
        self.edge_emb = Dense(2 * c["emb_size_atom"] + c["num_radial"], c["emb_size_edge"], act=act)
        self.mlp_rbf3 = Dense(c["num_radial"], c["emb_size_rbf"])
        self.mlp_cbf3 = BilinearWeights((c["num_radial"], c["emb_size_cbf"] * c["num_spherical"]),
                                        fan_in=c["num_radial"])
        self.mlp_rbf_h = Dense(c["num_radial"], c["emb_size_rbf"])
        self.mlp_rbf_out = Dense(c["num_radial"], c["emb_size_rbf"])
        self.output = OutputBlock(c["emb_size_atom"], c["emb_size_edge"], c["emb_size_rbf"], c["num_atom"], act,
                                  c["direct_forces"], c["output_init"])
        self.emb_size_cbf = c["emb_size_cbf"]

    def reset_parameters(self) -> None:
        _reset_all(self)

    def geometry(self, state, graph, comm: GraphParallelHooks) -> dict:
        """The parameter-free geometry from ``state["pos"]``: edge vectors ``vec`` ``[E, 3]`` (Å, from ``i`` to ``j``'s
        image), lengths ``dist`` ``[E]``, the circular basis of the triplets padded per edge ``sph`` ``[E, L, K]``
        (``K``: the most triplets of a local edge) and the triplets' rows ``pad`` ``[T]`` of the ``[E·K]`` padding
        (a later pipeline stage recomputes them instead of receiving ``O(T)`` rows)."""
        idx_kj, idx_ji = graph.idx_kj, graph.idx_ji
        vec = graph.edge_vectors(state["pos"], state["cell"])
        dist = vec.norm(dim=-1)
        vec_read = comm.edges_gather(vec)
        dist_read = dist if vec_read is vec else vec_read.norm(dim=-1)
        # the angle at j between j → i (−vec_ji) and j → k (vec_kj)
        a = vec.index_select(0, idx_ji) / dist.index_select(0, idx_ji).unsqueeze(-1)
        b = vec_read.index_select(0, idx_kj) / dist_read.index_select(0, idx_kj).unsqueeze(-1)
        cos = -(a * b).sum(-1)
        Y = circular_basis(cos, self.num_spherical)  # [T, L]
        E = vec.size(0)
        counts = torch.bincount(idx_ji, minlength=E)
        K = int(counts.max()) if counts.numel() else 0
        first = torch.cumsum(counts, 0) - counts
        pad = idx_ji * K + (torch.arange(idx_ji.numel(), device=idx_ji.device) - first.index_select(0, idx_ji))
        L = self.num_spherical
        sph = Y.new_zeros(E * K, L).index_copy(0, pad, Y).view(E, K, L).transpose(1, 2)
        return {"vec": vec, "dist": dist, "sph": sph, "pad": pad}

    def forward(self, state, graph, comm: GraphParallelHooks):
        j, i = graph.edge_index[0], graph.edge_index[1]
        geo = self.geometry(state, graph, comm)
        rbf = self.rbf(geo["dist"])
        h = self.atom_emb(state["z"] - 1)  # owned atoms
        h_all = comm.atoms_gather(h)
        m = self.edge_emb(torch.cat([h_all.index_select(0, j), h_all.index_select(0, i), rbf], dim=-1))
        E = rbf.size(0)
        rbf_W1 = (rbf @ self.mlp_cbf3.weight).view(E, self.emb_size_cbf, self.num_spherical)
        rbf_out = self.mlp_rbf_out(rbf)
        P, F = self.output(m, rbf_out, i, graph.num_nodes, comm)
        out = {**state, **geo, "h": h, "m": m, "rbf3": self.mlp_rbf3(rbf), "rbf_h": self.mlp_rbf_h(rbf),
               "rbf_out": rbf_out, "rbf_W1": rbf_W1, "P": P}
        if F is not None:
            out["F"] = F
        return out


def _swap_rows(graph) -> Tensor:
    """Each local edge's reverse as a row of the ``edges_gather`` buffer (−1: none): the rank view's
    ``idx_swap``, the graph's ``id_swap``, or (a whole graph built without it) computed here.

    Raises:
        ConfigError: a rank's view of a graph built without reverse edges.
    """
    rows = getattr(graph, "idx_swap", None)
    if rows is not None:
        return rows
    rows = getattr(graph, "id_swap", None)
    if rows is not None:
        return rows
    if getattr(graph, "edge_ids", None) is not None:
        raise ConfigError("gemnet-t reads each edge's reverse: build the graph with "
                          "build_graph(..., with_reverse=True) before planning graph parallelism")

    return reverse_edges(graph.edge_index, getattr(graph, "cell_offsets", None))


class TripletInteraction(nn.Module):
    """The triplet interaction of one block: ``[E, emb_size_edge]`` messages → ``[E, emb_size_edge]``."""

    def __init__(self, c: dict, act):
        super().__init__()
        self.dense_ba = Dense(c["emb_size_edge"], c["emb_size_edge"], act=act)
        self.mlp_rbf = Dense(c["emb_size_rbf"], c["emb_size_edge"])
        self.scale_rbf = ScaleFactor()
        self.down_projection = Dense(c["emb_size_edge"], c["emb_size_trip"], act=act)
        fan = c["emb_size_cbf"] * c["emb_size_trip"]
        self.mlp_cbf = BilinearWeights((fan, c["emb_size_bil_trip"]), fan_in=fan)
        self.scale_cbf_sum = ScaleFactor()
        self.up_projection_ca = Dense(c["emb_size_bil_trip"], c["emb_size_edge"], act=act)
        self.up_projection_ac = Dense(c["emb_size_bil_trip"], c["emb_size_edge"], act=act)

    def forward(self, m: Tensor, state, graph, comm: GraphParallelHooks) -> Tensor:
        x = self.dense_ba(m)
        x = self.scale_rbf(x * self.mlp_rbf(state["rbf3"]), ref=x)
        x = self.down_projection(x)                                   # [E, trip]
        x_kj = comm.edges_gather(x).index_select(0, graph.idx_kj)     # [T, trip], the in-edges k → j
        sph, pad = state["sph"], state["pad"]                         # [E, L, K], [T]
        E, K = sph.size(0), sph.size(2)
        D = x_kj.size(1)
        padded = x_kj.new_zeros(E * K, D).index_copy(0, pad, x_kj).view(E, K, D)
        sum_k = torch.bmm(sph, padded)                                # [E, L, trip]
        t = torch.bmm(state["rbf_W1"], sum_k)                         # [E, cbf, trip]
        agg = t.reshape(E, t.size(1) * t.size(2)) @ self.mlp_cbf.weight  # [E, bil]
        agg = self.scale_cbf_sum(agg, ref=x_kj)
        # the edge's own aggregate (over the in-edges of its source) plus its reverse edge's
        rows = _swap_rows(graph)
        buf = comm.edges_gather(agg)
        has = (rows >= 0).unsqueeze(-1).to(agg.dtype)
        rev = buf.index_select(0, rows.clamp(min=0))
        return (self.up_projection_ac(agg) + self.up_projection_ca(rev) * has) * _INV_SQRT2


class GemNetInteraction(AtomisticUnit):
    """One GemNet-T interaction block and its output block."""

    def __init__(self, c: dict, act):
        super().__init__()
        self.dense_ca = Dense(c["emb_size_edge"], c["emb_size_edge"], act=act)
        self.trip_interaction = TripletInteraction(c, act)
        self.layers_before_skip = nn.ModuleList(ResidualLayer(c["emb_size_edge"], act)
                                                for _ in range(c["num_before_skip"]))
        self.layers_after_skip = nn.ModuleList(ResidualLayer(c["emb_size_edge"], act)
                                               for _ in range(c["num_after_skip"]))
        self.atom_update = AtomMLP(c["emb_size_atom"], c["emb_size_edge"], c["emb_size_rbf"], c["num_atom"], act)
        self.concat_layer = Dense(2 * c["emb_size_atom"] + c["emb_size_edge"], c["emb_size_edge"], act=act)
        self.residual_m = nn.ModuleList(ResidualLayer(c["emb_size_edge"], act) for _ in range(c["num_concat"]))
        self.output = OutputBlock(c["emb_size_atom"], c["emb_size_edge"], c["emb_size_rbf"], c["num_atom"], act,
                                  c["direct_forces"], c["output_init"])

    def reset_parameters(self) -> None:
        _reset_all(self)

    def forward(self, state, graph, comm: GraphParallelHooks):
        j, i = graph.edge_index[0], graph.edge_index[1]
        m, h = state["m"], state["h"]
        x = (self.dense_ca(m) + self.trip_interaction(m, state, graph, comm)) * _INV_SQRT2
        for layer in self.layers_before_skip:
            x = layer(x)
        m = (m + x) * _INV_SQRT2
        for layer in self.layers_after_skip:
            m = layer(m)
        h = (h + self.atom_update(m, state["rbf_h"], i, graph.num_nodes, comm)) * _INV_SQRT2
        h_all = comm.atoms_gather(h)
        m2 = self.concat_layer(torch.cat([h_all.index_select(0, j), h_all.index_select(0, i), m], dim=-1))
        for layer in self.residual_m:
            m2 = layer(m2)
        m = (m + m2) * _INV_SQRT2
        P, F = self.output(m, state["rbf_out"], i, graph.num_nodes, comm)
        out = {**state, "m": m, "h": h, "P": state["P"] + P}
        if F is not None:
            out["F"] = state["F"] + F
        return out


#: the hyper-parameters of GemNet-T (fairchem's names) and their help
GEMNET_OPTION_HELP = {
    "num_spherical": "circular basis degrees (spherical harmonics, m = 0)",
    "num_radial": "Gaussian radial basis functions",
    "num_blocks": "interaction blocks (0: --layers)",
    "emb_size_atom": "atom embedding width (0: --hidden)",
    "emb_size_edge": "edge embedding width (0: --hidden)",
    "emb_size_trip": "triplet (down-projected) width",
    "emb_size_rbf": "radial basis projection width",
    "emb_size_cbf": "circular basis projection width",
    "emb_size_bil_trip": "bilinear layer output width",
    "num_before_skip": "residual layers before the skip connection",
    "num_after_skip": "residual layers after the skip connection",
    "num_concat": "residual layers after the edge-atom concatenation",
    "num_atom": "residual layers of the atom update and output blocks",
    "cutoff": "neighbour cutoff (Å)",
    "envelope_exponent": "polynomial envelope exponent",
    "max_neighbors": "per-atom neighbour cap of the graph",
    "max_z": "largest atomic number",
    "direct_forces": "GemNet-dT: per-edge direct forces instead of -dE/dpos",
    "output_init": "HeOrthogonal or zeros (the output layers' weights)",
    "scale_file": "JSON file of fitted scale factors to use (empty: fit on the first training batches)",
}


@register("gemnet-t")
class GemNetT(AtomisticModel):
    """GemNet-T (conservative forces) and GemNet-dT (``direct_forces=True``; Gasteiger et al., NeurIPS 2021): see
    the module docstring.

    Args:
        num_layers: interaction blocks (``--layers``), unless ``num_blocks`` > 0. hidden: atom and edge embedding
            width (``--hidden``), unless ``emb_size_atom`` / ``emb_size_edge`` > 0.
        activation: ``None`` (the scaled SiLU) or ``"silu"`` / ``"swish"`` (the same).
        num_spherical, num_radial, emb_size_trip, emb_size_rbf, emb_size_cbf, emb_size_bil_trip, num_before_skip,
        num_after_skip, num_concat, num_atom, cutoff (Å), envelope_exponent, max_neighbors, max_z: fairchem's
            names and meanings (defaults: fairchem's GemNet-dT OC20 configuration).
        direct_forces: GemNet-dT's per-edge force outputs instead of ``−∂E/∂pos``.
        output_init: ``"HeOrthogonal"`` (fairchem's GemNet-dT) or ``"zeros"``.
        scale_file: a JSON file ``{name: factor}`` (:meth:`scale_factor_values` of a fitted model) to load the
            scale factors from; empty: they are fitted on the first training batches.
        in_channels, out_channels, dropout, bias: the zoo's common arguments (see ``DimeNetPlusPlus``).

    Raises:
        ConfigError: ``out_channels != 1``, ``dropout > 0``, ``bias=False``, sizes < 1 (``num_spherical < 2``),
            ``cutoff <= 0``, an unknown ``output_init`` or activation, a missing or malformed ``scale_file``.
    """

    uses_reverse_edges = True
    option_help = GEMNET_OPTION_HELP

    def __init__(self, in_channels: int | None = None, out_channels: int = 1, num_layers: int = 3,
                 hidden: int = 512, dropout: float = 0.0, bias: bool = True, activation: str | None = None,
                 num_spherical: int = 7, num_radial: int = 128, num_blocks: int = 0, emb_size_atom: int = 0,
                 emb_size_edge: int = 0, emb_size_trip: int = 64, emb_size_rbf: int = 16, emb_size_cbf: int = 16,
                 emb_size_bil_trip: int = 64, num_before_skip: int = 1, num_after_skip: int = 2,
                 num_concat: int = 1, num_atom: int = 3, cutoff: float = 6.0, envelope_exponent: int = 5,
                 max_neighbors: int = 50, max_z: int = 94, direct_forces: bool = False,
                 output_init: str = "HeOrthogonal", scale_file: str = ""):
        super().__init__()

        blocks = num_blocks or num_layers
        c = {"num_spherical": num_spherical, "num_radial": num_radial, "emb_size_atom": emb_size_atom or hidden,
             "emb_size_edge": emb_size_edge or hidden, "emb_size_trip": emb_size_trip, "emb_size_rbf": emb_size_rbf,
             "emb_size_cbf": emb_size_cbf, "emb_size_bil_trip": emb_size_bil_trip,
             "num_before_skip": num_before_skip, "num_after_skip": num_after_skip, "num_concat": num_concat,
             "num_atom": num_atom, "cutoff": float(cutoff), "envelope_exponent": envelope_exponent, "max_z": max_z,
             "direct_forces": bool(direct_forces)}
        positive = {k: c[k] for k in ("num_radial", "emb_size_atom", "emb_size_edge", "emb_size_trip",
                                      "emb_size_rbf", "emb_size_cbf", "emb_size_bil_trip", "envelope_exponent",
                                      "max_z")}
        _check_common("gemnet-t", out_channels, dropout, bias, num_blocks=blocks, max_neighbors=max_neighbors,
                      **positive)
        for k in ("num_before_skip", "num_after_skip", "num_concat", "num_atom"):
            if not isinstance(c[k], int) or isinstance(c[k], bool) or c[k] < 0:
                raise ConfigError(f"gemnet-t option {k} must be an int >= 0, got {c[k]!r}")
        if not isinstance(num_spherical, int) or num_spherical < 2:
            raise ConfigError(f"gemnet-t needs num_spherical >= 2, got {num_spherical!r}")
        if not cutoff > 0:
            raise ConfigError(f"gemnet-t needs cutoff > 0 (Å), got {cutoff}")
        init = str(output_init).lower()
        if init not in ("heorthogonal", "zeros"):
            raise ConfigError(f"output_init must be 'HeOrthogonal' or 'zeros', got {output_init!r}")
        if activation not in (None, "silu", "swish", "scaled_silu"):
            raise ConfigError(f"gemnet-t uses the scaled SiLU; activation must be silu, got {activation!r}")
        c["output_init"] = init
        self.config = c
        act = scaled_silu
        self.cutoff, self.max_neighbors, self.max_z = float(cutoff), int(max_neighbors), int(max_z)
        self.direct_forces = bool(direct_forces)
        self.units = nn.ModuleList([GemNetEmbedding(c, act)] + [GemNetInteraction(c, act) for _ in range(blocks)])
        self.head = nn.Module()  # the readout has no parameters: the output blocks live in the units
        self.reset_parameters()
        self.scale_file = str(scale_file or "")
        if self.scale_file:
            self.load_scale_factors(self.scale_file)

    def reset_parameters(self, seed: int | None = None) -> None:
        """:meth:`AtomisticModel.reset_parameters` on one thread: the He-orthogonal initialisation's QR
        factorisations (about a hundred of ``emb_size_edge``² matrices) take seconds on several OpenMP threads of a
        busy machine (:func:`~.dimenet.single_threaded`)."""
        with single_threaded():
            super().reset_parameters(seed)

    # ------------------------------------------------------------------ scale factors
    def scale_factors(self) -> dict[str, ScaleFactor]:
        """The scale factors by module name, in the order the forward pass meets them."""
        return {name: mod for name, mod in self.named_modules() if isinstance(mod, ScaleFactor)}

    def scale_factor_values(self) -> dict[str, float]:
        """``{name: factor}`` (what a ``scale_file`` holds)."""
        return {k: float(v.scale_factor) for k, v in self.scale_factors().items()}

    @property
    def scales_fitted(self) -> bool:
        """Whether any factor differs from 1 (fitted or loaded)."""
        return any(v != 1.0 for v in self.scale_factor_values().values())

    def load_scale_factors(self, path: str) -> None:
        """Set the factors from a JSON file ``{name: factor}`` written from :meth:`scale_factor_values`.

        Raises:
            ConfigError: no such file, not a JSON object of numbers, or names that are not this model's.
        """
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(f"no scale file {path!r}; fit one with gnnpipe atoms scales MODEL --out FILE "
                              "or drop scale_file")
        try:
            values = json.loads(p.read_text())
        except ValueError as exc:
            raise ConfigError(f"scale file {path!r} is not JSON: {exc}") from None
        mine = self.scale_factors()
        if not isinstance(values, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values.values()):
            raise ConfigError(f"scale file {path!r} must be a JSON object mapping this model's {len(mine)} scale "
                              f"factors ({', '.join(list(mine)[:3])}, …) to positive numbers")
        if set(values) != set(mine):
            def some(names) -> str:
                names = sorted(names)
                return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

            missing, foreign = set(mine) - set(values), set(values) - set(mine)
            what = "; ".join(([f"this model's {some(missing)} missing"] if missing else [])
                             + ([f"{some(foreign)} not in this model"] if foreign else []))
            raise ConfigError(f"scale file {path!r} was fitted for another GemNet ({what}): the factors are named by "
                              f"interaction block and by force kind (direct_forces); fit one for this model with "
                              f"gnnpipe atoms scales MODEL --out FILE")
        for k, v in values.items():
            mine[k].scale_factor.fill_(float(v))

    @torch.no_grad()
    def fit_scale_factors(self, batch, graph) -> dict[str, float]:
        """Fit every scale factor on one batch (fairchem's ``fit_scaling``, in one forward pass: each factor, when
        the pass reaches it with the earlier ones already set, becomes ``√(Var(ref)/Var(x))``). Deterministic;
        returns :meth:`scale_factor_values`."""
        factors = self.scale_factors()
        for f in factors.values():
            f.scale_factor.fill_(1.0)
            f.fitting = True
        was = self.training
        self.eval()
        try:
            self(batch, graph)
        finally:
            for f in factors.values():
                f.fitting = False
            self.train(was)
        return self.scale_factor_values()

    # ------------------------------------------------------------------ its own cost
    def _sizes(self) -> dict:
        c = self.config
        return {"A": c["emb_size_atom"], "Ed": c["emb_size_edge"], "Tr": c["emb_size_trip"], "Rb": c["emb_size_rbf"],
                "Cb": c["emb_size_cbf"], "Bil": c["emb_size_bil_trip"], "R": c["num_radial"], "S": c["num_spherical"],
                "before": c["num_before_skip"], "after": c["num_after_skip"], "concat": c["num_concat"],
                "atom": c["num_atom"], "L": len(self.units) - 1, "direct": bool(self.direct_forces)}

    def hook_calls(self, num_atoms: int, num_structures: int) -> list[HookCall]:
        """The embedding's gathers (edge vectors ``k→j``, the atom embedding) and output block 0's reduce; per block
        the gathers of the triplets' in-edges and the reverse edges' aggregates, the atom update's reduce, the
        edge-atom concatenation's gather and the output block's reduce; the readout
        (:func:`~.cost.readout_hook_calls`)."""
        z = self._sizes()
        A, Ed, c = z["A"], z["Ed"], not z["direct"]
        calls = [HookCall(0, "edges_gather", 3, pos=c, grad=c),  # the edge vectors k→j (geometry)
                 HookCall(0, "atoms_gather", A, pos=False),  # the atom embedding of z
                 HookCall(0, "atoms_reduce", Ed, pos=c)]  # output block 0
        for b in range(1, z["L"] + 1):
            calls += [HookCall(b, "edges_gather", z["Tr"], pos=c),  # the triplets' in-edges
                      HookCall(b, "edges_gather", z["Bil"], pos=c),  # the reverse edges' aggregates
                      HookCall(b, "atoms_reduce", Ed, pos=c),  # the atom update
                      HookCall(b, "atoms_gather", A, pos=c),  # the edge-atom concatenation
                      HookCall(b, "atoms_reduce", Ed, pos=c)]  # the output block
        return calls + readout_hook_calls(num_structures, num_atoms, z["direct"])

    def activation_widths(self) -> list[UnitWidths]:
        """Counted with autograd's saved-tensor hooks (floating tensors, per storage) on the model's code: ``A``/``D``
        atom/edge widths, ``Tr`` emb_size_trip, ``Rb`` emb_size_rbf, ``Cb`` emb_size_cbf, ``Bl`` emb_size_bil_trip,
        ``R`` num_radial, ``S`` num_spherical, ``b``, ``a``, ``c`` residual layers before / after the skip and after
        the concatenation, ``n`` num_atom. Embedding: edge ``5D + 2A + 4R + Rb + 9`` (geometry, Gaussian basis with
        its envelope, edge embedding, output block 0), triplet ``3S + 10`` (the angles' cosines, the Legendre
        recurrence, the circular basis), atom ``D + 3A + 6nA``; interaction block: edge
        ``(21 + 6(b + a + c))·D + 2A + 3Rb + 2Tr + Cb·S + S·Tr + Cb·Tr + 2Bl + 1``, triplet ``Tr`` (the in-edges
        read), padded slot ``S + Tr`` (the two batched products of the bilinear layer; ``S`` with direct forces:
        the circular basis then needs no gradient), atom ``2D + 5A + 12nA``. Direct forces add ``(5 + 6n)·D`` per
        edge to each output block and ``8`` per edge to the readout."""
        z = self._sizes()
        A, D, Tr, Rb, Cb, Bl, R, S, n = (z[k] for k in ("A", "Ed", "Tr", "Rb", "Cb", "Bil", "R", "S", "atom"))
        force = (5 + 6 * n) * D if z["direct"] else 0
        units = [UnitWidths(5 * D + 2 * A + 4 * R + Rb + 9 + force, 3 * S + 10, D + 3 * A + 6 * n * A)]
        block = UnitWidths((21 + 6 * (z["before"] + z["after"] + z["concat"])) * D + 2 * A + 3 * Rb + 2 * Tr
                           + Cb * S + S * Tr + Cb * Tr + 2 * Bl + 1 + force, Tr, 2 * D + 5 * A + 12 * n * A, 0,
                           S + (0 if z["direct"] else Tr))
        units += [block for _ in range(z["L"])]
        if z["direct"]:
            units[-1] = units[-1] + UnitWidths(8)
        return units

    def geometry_widths(self, conservative: bool) -> UnitWidths:
        """Conservative: the edge vectors and lengths (edge ``4``), the cosines and their Legendre recurrence
        (triplet ``3S + 10``); direct: nothing (the blocks read no basis needing a gradient)."""
        return UnitWidths(4, 3 * self._sizes()["S"] + 10) if conservative else UnitWidths()

    def embedding_stage_widths(self, conservative: bool) -> UnitWidths:
        """The embedding alone: with conservative forces its radial basis keeps the edge geometry's derivation."""
        return UnitWidths(self.geometry_widths(True).edge) if conservative else UnitWidths()

    def work_widths(self) -> list[UnitWidths]:
        z = self._sizes()
        A, D, Tr, Rb, Cb, Bl, R, S, n = (z[k] for k in ("A", "Ed", "Tr", "Rb", "Cb", "Bil", "R", "S", "atom"))
        out_atom = D * A + 2 * n * A * A + A
        force = (1 + 2 * n) * D * D + Rb * D + D if z["direct"] else 0
        mac = [UnitWidths((2 * A + R) * D + 3 * R * Rb + R * Cb * S + Rb * D + force, 0, out_atom)]
        mac += [UnitWidths((2 + 2 * (z["before"] + z["after"] + z["concat"])) * D * D + 3 * Rb * D + D * Tr
                           + Cb * S * Tr + Cb * Tr * Bl + 2 * Bl * D + (2 * A + D) * D + force, 0,
                           D * A + 2 * n * A * A + out_atom, 0, S * Tr) for _ in range(z["L"])]
        return mac

    def boundary_widths(self) -> UnitWidths:
        """``h``, ``m``, the shared radial projections, ``P`` (and the direct forces' ``F`` per edge)."""
        z = self._sizes()
        return UnitWidths(z["Ed"] + 3 * z["Rb"] + z["Cb"] * z["S"] + z["direct"], 0, z["A"] + 1)

    # ------------------------------------------------------------------ the hooks of AtomisticModel
    def pipeline_boundary(self) -> dict:
        """Atom embeddings ``h``, edge messages ``m``, the shared radial projections (they depend on unit 0's
        weights, so they travel) and the running outputs (``P`` per atom, ``F`` per edge with direct forces);
        the geometry and the circular basis are recomputed on each stage, so a boundary is ``O(E + N)``."""
        c = self.config
        out = {"h": ("atoms", (c["emb_size_atom"],)), "m": ("edges", (c["emb_size_edge"],)),
               "rbf3": ("edges", (c["emb_size_rbf"],)), "rbf_h": ("edges", (c["emb_size_rbf"],)),
               "rbf_out": ("edges", (c["emb_size_rbf"],)),
               "rbf_W1": ("edges", (c["emb_size_cbf"], c["num_spherical"])), "P": ("atoms", (1,))}
        if self.direct_forces:
            out["F"] = ("edges", (1,))
        return out

    def stage_geometry(self, state, graph, comm: GraphParallelHooks = LOCAL):
        return {**state, **self.units[0].geometry(state, graph, comm)}

    def readout_energy(self, state, graph, comm: GraphParallelHooks) -> Tensor:
        return scatter_sum(state["P"].squeeze(-1), state["atom_batch"], state["num_structures"])

    def readout_forces(self, state, graph, comm: GraphParallelHooks) -> Tensor:
        unit = state["vec"] / state["dist"].unsqueeze(-1)
        return comm.atoms_reduce(scatter_sum(state["F"] * unit, graph.edge_index[1], graph.num_nodes))
