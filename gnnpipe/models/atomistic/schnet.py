"""SchNet (Schütt et al., *SchNet: A continuous-filter convolutional neural network for modeling quantum
interactions*, NeurIPS 2017) on PyG's blocks, as units around the graph-parallel hooks.

The weights live in PyG's modules (``GaussianSmearing``, ``InteractionBlock`` with its ``CFConv`` and filter
network, of ``torch_geometric.nn.models.schnet``); the forward passes are written here so the per-atom linear
maps (``CFConv.lin1``/``lin2``, the block's ``lin``, the readout MLP) run on owned atoms and the
continuous-filter convolution reads and writes atoms through ``comm.atoms_gather`` / ``comm.atoms_reduce``. With
the same weights the energies equal PyG's ``SchNet`` (tests/models/atomistic/test_equal_pyg.py).

Units: ``[embedding, interaction_1 … interaction_L]``; the state carries the owned atoms' features ``h``
``[N_r, H]``, the edges' filter inputs ``edge_attr`` ``[E, G]`` and distances.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch_geometric.nn.models.schnet import GaussianSmearing, InteractionBlock, ShiftedSoftplus

from ...errors import ConfigError
from ..registry import register
from .base import AtomisticModel, AtomisticUnit, DirectForceHead, atomistic_activation, scatter_sum
from .comm import LOCAL, GraphParallelHooks
from .cost import HookCall, UnitWidths
from .dimenet import _check_common


class SchNetEmbedding(AtomisticUnit):
    """Edge geometry, Gaussian expansion of the distances and the embedding of ``z`` (owned atoms)."""

    def __init__(self, hidden: int, num_gaussians: int, cutoff: float, max_z: int):
        super().__init__()
        self.embedding = nn.Embedding(max_z + 1, hidden, padding_idx=0)
        self.distance_expansion = GaussianSmearing(0.0, cutoff, num_gaussians)

    def geometry(self, state, graph) -> dict:
        """The parameter-free geometry from ``state["pos"]``: ``vec`` ``[E, 3]`` (Å), ``dist`` ``[E]`` and their
        Gaussian expansion ``edge_attr`` ``[E, G]`` (a later pipeline stage recomputes them)."""
        vec = graph.edge_vectors(state["pos"], state["cell"])
        dist = vec.norm(dim=-1)
        return {"vec": vec, "dist": dist, "edge_attr": self.distance_expansion(dist)}

    def forward(self, state, graph, comm: GraphParallelHooks):
        return {**state, **self.geometry(state, graph), "h": self.embedding(state["z"])}


class SchNetInteraction(AtomisticUnit):
    """One SchNet interaction (PyG's ``InteractionBlock``): ``h += lin(ssp(cfconv(h)))``, the continuous-filter
    convolution ``lin2(Σ_j lin1(h_j) ⊙ W(e_ji) · C(d_ji))`` with the cosine cutoff ``C`` (eq. 3–5 of the paper)."""

    def __init__(self, hidden: int, num_gaussians: int, num_filters: int, cutoff: float):
        super().__init__()
        self.interaction = InteractionBlock(hidden, num_gaussians, num_filters, cutoff)
        self.cutoff = float(cutoff)

    def forward(self, state, graph, comm: GraphParallelHooks):
        block = self.interaction
        conv = block.conv
        h, dist = state["h"], state["dist"]
        C = 0.5 * (torch.cos(dist * (math.pi / self.cutoff)) + 1.0)
        W = block.mlp(state["edge_attr"]) * C.unsqueeze(-1)
        x = comm.atoms_gather(conv.lin1(h))  # per-atom map on owned atoms, gathered to the edges' sources
        x = scatter_sum(x.index_select(0, graph.edge_index[0]) * W, graph.edge_index[1], graph.num_nodes)
        x = conv.lin2(comm.atoms_reduce(x))
        return {**state, "h": h + block.lin(block.act(x))}


class SchNetHead(nn.Module):
    """The readout's parameters: ``lin2(ssp(lin1(h)))`` per owned atom, and the optional direct-force head."""

    def __init__(self, hidden: int, num_gaussians: int, direct_forces: bool, act):
        super().__init__()
        self.lin1 = nn.Linear(hidden, hidden // 2)
        self.act = ShiftedSoftplus()
        self.lin2 = nn.Linear(hidden // 2, 1)
        self.forces = DirectForceHead(hidden + num_gaussians, hidden, act) if direct_forces else None

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin1.weight)
        self.lin1.bias.data.fill_(0)
        nn.init.xavier_uniform_(self.lin2.weight)
        self.lin2.bias.data.fill_(0)
        if self.forces is not None:
            self.forces.reset_parameters()


@register("schnet")
class SchNet(AtomisticModel):
    """SchNet (Schütt et al. NeurIPS 2017): continuous-filter convolutions over neighbour pairs, on PyG's blocks;
    energies per structure (sum of per-atom contributions), forces conservative or from a direct head.

    Args:
        num_layers: interaction blocks (``--layers``; default 6). hidden: atom feature width (128).
        activation: ``None`` for the shifted softplus of the paper (used by the direct-force head; the blocks
            keep PyG's shifted softplus).
        num_filters, num_gaussians, cutoff (Å): as PyG's ``SchNet`` (defaults 128, 50, 6.0).
        max_neighbors: per-atom neighbour cap of the graph. max_z: largest atomic number (embedding rows
            ``max_z + 1``; PyG's 100 rows by default). direct_forces: a per-edge force head on
            ``[h_i ⊙ h_j, gaussians(d_ji)]`` instead of ``−∂E/∂pos``.
        in_channels, out_channels, dropout, bias: the zoo's common arguments (see :class:`DimeNetPlusPlus`).

    Built on the CPU even inside a ``torch.device("meta")`` context (PyG's blocks read tensor values when built).

    Raises:
        ConfigError: ``out_channels != 1``, ``dropout > 0``, ``bias=False``, sizes < 1, ``cutoff <= 0``.
    """

    uses_triplets = False  # pairs only

    option_help = {
        "num_filters": "continuous-filter width", "num_gaussians": "Gaussians of the distance expansion",
        "cutoff": "neighbour cutoff (Å)", "max_neighbors": "per-atom neighbour cap of the graph",
        "max_z": "largest atomic number", "direct_forces": "per-edge direct force head instead of -dE/dpos",
    }

    def __init__(self, in_channels: int | None = None, out_channels: int = 1, num_layers: int = 6,
                 hidden: int = 128, dropout: float = 0.0, bias: bool = True, activation: str | None = None,
                 num_filters: int = 128, num_gaussians: int = 50, cutoff: float = 6.0, max_neighbors: int = 50,
                 max_z: int = 99, direct_forces: bool = False):
        super().__init__()
        _check_common("schnet", out_channels, dropout, bias, num_layers=num_layers, hidden=hidden,
                      num_filters=num_filters, num_gaussians=num_gaussians, max_z=max_z, max_neighbors=max_neighbors)
        if hidden < 2 or num_gaussians < 2:
            raise ConfigError(f"schnet needs hidden >= 2 and num_gaussians >= 2, got {hidden}, {num_gaussians}")
        if not cutoff > 0:
            raise ConfigError(f"schnet needs cutoff > 0 (Å), got {cutoff}")
        act = atomistic_activation(activation or "ssp")
        with torch.device("cpu"):  # PyG's GaussianSmearing and ShiftedSoftplus read tensor values when built:
            self._build(hidden, num_layers, num_filters, num_gaussians, cutoff, max_neighbors, max_z,  # not on meta
                        direct_forces, act)
        self.reset_parameters()

    def _build(self, hidden, num_layers, num_filters, num_gaussians, cutoff, max_neighbors, max_z, direct_forces,
               act) -> None:
        self.cutoff, self.max_neighbors, self.max_z = float(cutoff), int(max_neighbors), int(max_z)
        self.direct_forces = bool(direct_forces)
        self.units = nn.ModuleList([SchNetEmbedding(hidden, num_gaussians, cutoff, max_z)]
                                   + [SchNetInteraction(hidden, num_gaussians, num_filters, cutoff)
                                      for _ in range(num_layers)])
        self.head = SchNetHead(hidden, num_gaussians, self.direct_forces, act)
        self.pyg_prefixes = (("units.0.embedding.", "embedding."),
                             ("units.0.distance_expansion.", "distance_expansion."),
                             *((f"units.{b}.interaction.", f"interactions.{b - 1}.")
                               for b in range(1, num_layers + 1)),
                             ("head.lin1.", "lin1."), ("head.lin2.", "lin2."))

    # ------------------------------------------------------------------ its own cost
    def _sizes(self) -> dict:
        L = len(self.units) - 1
        conv = self.units[1].interaction.conv if L else None
        return {"H": self.head.lin1.in_features, "F": conv.lin1.out_features if conv else 0,
                "G": self.units[0].distance_expansion.offset.numel(), "L": L}

    def hook_calls(self, num_atoms: int, num_structures: int) -> list[HookCall]:
        """Per block the gather of ``lin1(h)`` onto the edges' sources and the reduce of the messages; the readout's
        energy sum and the forces' all-reduce (direct: the head's gather, the reduce, the trainer's gather)."""
        direct = bool(self.direct_forces)
        z = self._sizes()
        calls: list[HookCall] = []
        for b in range(1, z["L"] + 1):
            # block 1 gathers lin1(embedding(z)): parameters only; later blocks read h, which depends on pos
            calls.append(HookCall(b, "atoms_gather", z["F"], pos=(b > 1) and not direct))
            calls.append(HookCall(b, "atoms_reduce", z["F"], pos=not direct))
        calls.append(HookCall(-1, "sum", num_structures, pos=False))
        if direct:
            calls.append(HookCall(-1, "atoms_gather", z["H"], pos=False))
            calls.append(HookCall(-1, "atoms_reduce", 3, pos=False))
            calls.append(HookCall(-1, "atoms_gather", 3, pos=False, grad=False, forward_only=True))
        else:
            calls.append(HookCall(-1, "replicated_grad", 3 * num_atoms, pos=False, grad=False))
        return calls

    def activation_widths(self) -> list[UnitWidths]:
        """``H`` hidden, ``F`` filters, ``G`` Gaussians; per block: edge ``5F + 4``, atom ``3H + F``; the embedding:
        edge ``3G + 4``, atom ``H``; the readout atom ``2H``."""
        z = self._sizes()
        H, F, G = z["H"], z["F"], z["G"]
        units = [UnitWidths(3 * G + 4, 0, H)] + [UnitWidths(5 * F + 4, 0, 3 * H + F) for _ in range(z["L"])]
        units[-1] = units[-1] + UnitWidths(0, 0, 2 * H)
        return units

    def geometry_widths(self, conservative: bool) -> UnitWidths:
        """Conservative: edge ``3G + 4`` (vectors, lengths, the Gaussian expansion's derivation); direct: the
        expansion ``G``."""
        G = self._sizes()["G"]
        return UnitWidths(3 * G + 4, 0, 0) if conservative else UnitWidths(G, 0, 0)

    def work_widths(self) -> list[UnitWidths]:
        z = self._sizes()
        H, F, G = z["H"], z["F"], z["G"]
        mac = [UnitWidths(0, 0, 0)] + [UnitWidths(G * F + F * F, 0, 2 * H * F + H * H) for _ in range(z["L"])]
        mac[-1] = mac[-1] + UnitWidths(0, 0, H * H // 2)
        return mac

    def boundary_widths(self) -> UnitWidths:
        """The atom features ``h`` (``H``)."""
        return UnitWidths(0, 0, self._sizes()["H"])

    def pipeline_boundary(self) -> dict:
        """The owned atoms' features ``h`` only: the geometry is recomputed on each stage (:meth:`stage_geometry`)."""
        return {"h": ("atoms", (self.units[0].embedding.embedding_dim,))}

    def stage_geometry(self, state, graph, comm: GraphParallelHooks = LOCAL):
        return {**state, **self.units[0].geometry(state, graph)}

    def readout_energy(self, state, graph, comm: GraphParallelHooks) -> Tensor:
        head = self.head
        e = head.lin2(head.act(head.lin1(state["h"]))).squeeze(-1)
        return scatter_sum(e, state["atom_batch"], state["num_structures"])

    def readout_forces(self, state, graph, comm: GraphParallelHooks) -> Tensor:
        h = comm.atoms_gather(state["h"])
        j, i = graph.edge_index[0], graph.edge_index[1]
        feats = torch.cat([h.index_select(0, i) * h.index_select(0, j), state["edge_attr"]], dim=-1)
        return self.head.forces(feats, state["vec"], state["dist"], i, graph.num_nodes, comm)
