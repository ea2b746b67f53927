"""Atomistic models as sequences of units over a ``state`` dict, and their force responses.

A model (:class:`AtomisticModel`) maps a batch of structures and its neighbour graph to per-structure energies
(eV) and, with a direct-force head, per-atom forces (eV/Å)::

    state = model.initial_state(batch, graph, comm)      # pos, owned z, owned atoms' structure ids
    for unit in model.units:                             # embedding, interaction blocks (+ their output blocks)
        state = unit(state, graph, comm)                 # a pipeline stage may run any contiguous slice
    out = model.readout(state, graph, comm)              # {"energy": [B], "forces": [N_r, 3]}

``state`` maps names to tensors (per-edge messages, the running per-atom output sum, the bases); what a unit
needs from earlier units travels in it, nothing is parked on ``self``. Every place where graph parallelism must
communicate goes through a hook of ``comm`` (:mod:`.comm`); parameterised per-atom ops run on owned atoms only.

The graph (``gnnpipe.data.atoms.AtomGraph`` or a rank's local view of it) provides ``edge_index`` ``[2, E]``
(row 0 source ``j``, row 1 target ``i``), ``edge_vectors(pos, cell)`` ``[E, 3]`` (from ``i`` to ``j``'s image),
``idx_kj``, ``idx_ji`` ``[T]`` (triplets ``k→j→i``), ``num_nodes`` and optionally ``atom_ids`` (owned atoms;
absent or ``None``: all).

Forces: conservative, ``F = −∂E/∂pos`` (:class:`ConservativeForces`, a response module), or direct: a per-edge
scalar times the unit edge vector summed onto atoms (:class:`DirectForceHead`, GemNet-XL's setting, Sriram et al.
2022). Stress (conservative models): the strain derivative of the energy over the volume, ``σ = (1/V) ∂E/∂ε``, by
autograd through a symmetric strain ``ε`` applied to positions and cell, ``pos·(1 + ε)``, ``cell·(1 + ε)`` (ASE's
convention, eV/Å³; the approach of SchNetPack's ``Strain`` response, MACE and fairchem). Since every edge vector
``r_ij`` is strained alike, ``∂E/∂ε = Σ_edges ∂E/∂r_ij ⊗ r_ij``: a sum over edges, so graph-parallel ranks add
their edges' parts (``comm.replicated_grad``) and the sum is the single process's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import ConfigError, DataValidationError
from ..base import ACTIVATIONS, ZooModel, unit_seed
from ..initflag import initialisation_skipped
from .comm import LOCAL, GraphParallelHooks
from .cost import HookCall, ModelDescriptionError, UnitWidths

State = dict  # name -> Tensor (``num_structures``: int)

_LOG2 = math.log(2.0)


def shifted_softplus(x: Tensor) -> Tensor:
    """``softplus(x) − log 2`` (SchNet's activation, Schütt et al. 2017, eq. 8)."""
    return F.softplus(x) - _LOG2


def swish(x: Tensor) -> Tensor:
    """``x · sigmoid(x)`` (DimeNet's activation; written out as PyG does, whose double backward is a little cheaper
    on the CPU than ``F.silu``'s)."""
    return x * torch.sigmoid(x)


#: activations of the atomistic models (besides :data:`gnnpipe.models.ACTIVATIONS`)
ATOMISTIC_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "swish": swish, "silu": swish, "ssp": shifted_softplus, "shifted_softplus": shifted_softplus,
}


def atomistic_activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation called ``name`` (``swish``/``silu``, ``ssp``/``shifted_softplus`` or one of
    :data:`gnnpipe.models.ACTIVATIONS`).

    Raises:
        ConfigError: unknown name.
    """
    fn = ATOMISTIC_ACTIVATIONS.get(name) or ACTIVATIONS.get(name)
    if fn is None:
        raise ConfigError(f"unknown activation {name!r}; use one of "
                          f"{', '.join([*ATOMISTIC_ACTIVATIONS, *ACTIVATIONS])}")
    return fn


def scatter_sum(src: Tensor, index: Tensor, size: int) -> Tensor:
    """``out[index[e]] += src[e]`` into ``[size, *src.shape[1:]]`` (twice differentiable)."""
    return src.new_zeros((size, *src.shape[1:])).index_add_(0, index, src)


def owned(graph, x: Tensor) -> Tensor:
    """The owned atoms' rows of a replicated per-atom tensor (``graph.atom_ids``; all rows when it is absent)."""
    ids = getattr(graph, "atom_ids", None)
    return x if ids is None else x.index_select(0, ids)


class AtomisticUnit(nn.Module):
    """One unit of an atomistic model: ``state → state`` (see the module docstring)."""

    def forward(self, state: State, graph, comm: GraphParallelHooks) -> State:  # pragma: no cover - interface
        raise NotImplementedError


class ConservativeForces(nn.Module):
    """Forces as the response ``F = −∂E/∂pos`` (SchNetPack's ``Forces`` module).

    ``E`` is the per-structure energy (under graph parallelism already summed over the group by ``comm.sum``,
    whose backward is the identity, so each rank differentiates only its own partial energy); the rank's
    gradient goes through ``comm.replicated_grad`` (an all-reduce under graph parallelism) exactly once.
    With ``create_graph`` (training) the forces are differentiable again, so a force loss trains the weights
    (a second backward).
    """

    def forward(self, energy: Tensor, pos: Tensor, comm: GraphParallelHooks, create_graph: bool,
                strain: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``[B]`` energies, ``[N, 3]`` positions (requiring grad) → ``([N, 3]`` forces, ``[B, 3, 3]`` ``∂E/∂ε``
        of the ``strain`` leaf, or ``None`` without one``)``; each reduced over the group exactly once."""
        targets = [pos] if strain is None else [pos, strain]
        grads = torch.autograd.grad(energy.sum(), targets, create_graph=create_graph)
        forces = -comm.replicated_grad(grads[0])
        return forces, (None if strain is None else comm.replicated_grad(grads[1]))


class DirectForceHead(nn.Module):
    """Direct forces (GemNet-XL's setting): a per-edge scalar ``s_e`` (an MLP of the edge's features) times the
    unit vector of edge ``j→i`` summed onto the target atom: ``F_i = Σ_j s_ji · (r_j − r_i)/|r_j − r_i|``,
    then reduced onto owned atoms (``comm.atoms_reduce``). Rotation-equivariant when ``s_e`` is invariant.
    """

    def __init__(self, in_channels: int, hidden: int, act: Callable[[Tensor], Tensor]):
        super().__init__()
        self.lin1 = nn.Linear(in_channels, hidden)
        self.lin2 = nn.Linear(hidden, 1)
        self.act = act

    def reset_parameters(self) -> None:
        self.lin1.reset_parameters()
        self.lin2.reset_parameters()

    def forward(self, edge_features: Tensor, vec: Tensor, dist: Tensor, target: Tensor, num_nodes: int,
                comm: GraphParallelHooks) -> Tensor:
        """``[E, in]`` features, ``[E, 3]`` vectors, ``[E]`` lengths, ``[E]`` target atoms → ``[N_r, 3]`` forces."""
        s = self.lin2(self.act(self.lin1(edge_features)))
        return comm.atoms_reduce(scatter_sum(s * (vec / dist.unsqueeze(-1)), target, num_nodes))


class AtomisticModel(ZooModel):
    """An atomistic model (``task = "s2ef"``): ``units`` then a ``head`` (readout); see the module docstring.

    Subclasses build ``units`` and ``head``, set ``direct_forces``, and implement :meth:`readout_energy`.
    Parameters are initialised unit by unit (:meth:`reset_parameters`): unit ``i`` under
    ``torch.manual_seed(unit_seed(seed, i))`` (the head is unit ``len(units)``), so a process that builds the
    model draws the same weights whatever slice of units it runs.

    Attributes:
        cutoff: neighbour cutoff (Å) the graph must be built with. max_neighbors: the per-atom cap.
        max_z: the largest atomic number the embedding accepts.
    """

    task = "s2ef"
    #: runs under graph parallelism (``--gp-size``): every cross-shard access goes through the ``comm`` hooks
    graph_parallel: bool = True
    #: reads the triplets ``idx_kj``, ``idx_ji`` of the graph (a model that does not lets training skip them)
    uses_triplets: bool = True
    default_hparams: dict = {"lr": 5e-4, "dropout": 0.0, "weight_decay": 0.0, "weight_decay_conv": 0.0}
    direct_forces: bool = False
    cutoff: float = 6.0
    max_neighbors: int = 50
    max_z: int = 94
    #: ``(our prefix, PyG prefix)`` pairs mapping this model's state-dict keys onto the PyG model's
    pyg_prefixes: tuple = ()

    def __init__(self):
        super().__init__()
        self.forces_response = ConservativeForces()

    # ------------------------------------------------------------------ weights
    def reset_parameters(self, seed: int | None = None) -> None:
        """Initialise every unit and the head, unit ``i`` after ``torch.manual_seed(unit_seed(seed, i))``.

        ``seed=None`` draws the base seed from torch's global generator (so ``torch.manual_seed(s)`` before
        building gives reproducible weights). The global generator is restored afterwards. Inside
        ``gnnpipe.models.initflag.skipping_initialisation`` (a model whose weights are about to be loaded) it
        does nothing.
        """
        if initialisation_skipped():
            return
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), device="cpu"))
        parts = [*self.units, self.head]
        with torch.random.fork_rng(devices=[]):
            for i, part in enumerate(parts):
                torch.manual_seed(unit_seed(seed, i))
                _reset_topmost(part)

    def load_pyg_state_dict(self, state_dict: dict) -> None:
        """Load the weights of the equivalent PyG model (``torch_geometric.nn.models``), keys renamed by
        :attr:`pyg_prefixes`; the direct-force head keeps its weights.

        Raises:
            ConfigError: a key of ours has no PyG counterpart, or shapes differ (other sizes).
        """
        ours = self.state_dict()
        mapped = {}
        for key in ours:
            for mine, theirs in self.pyg_prefixes:
                if key.startswith(mine):
                    src = theirs + key[len(mine):]
                    if src not in state_dict:
                        raise ConfigError(f"the PyG state dict has no {src!r} (for our {key!r})")
                    if state_dict[src].shape != ours[key].shape:
                        raise ConfigError(f"{key!r} has shape {list(ours[key].shape)}, PyG's {src!r} "
                                          f"{list(state_dict[src].shape)}: build both with the same sizes")
                    mapped[key] = state_dict[src]
                    break
        missing = [k for k in ours if k not in mapped and not k.startswith("head.forces")]
        if missing:
            raise ConfigError(f"no PyG weights for {missing[:5]}")
        self.load_state_dict(mapped, strict=False)

    # ------------------------------------------------------------------ running
    def initial_state(self, batch, graph, comm: GraphParallelHooks = LOCAL, *, pos_grad: bool = False,
                      strain: bool = False) -> State:
        """The state the first unit reads: ``pos`` ``[N, 3]`` (requiring grad with ``pos_grad``, for conservative
        forces; ``batch.pos`` itself when it already does), ``cell`` ``[B, 3, 3]`` (``None`` when no structure
        is periodic: ``graph.edge_vectors`` then skips the image shifts), the owned atoms' ``z`` ``[N_r]`` and
        structure ids ``atom_batch`` ``[N_r]``, ``num_structures`` (int). With ``strain``: a zero strain leaf
        ``strain`` ``[B, 3, 3]`` (requiring grad), ``pos`` and ``cell`` strained by its symmetric part
        (``x·(1 + ε)``: the same values), the unstrained leaf kept as ``pos_leaf`` (module docstring: stress).

        Raises:
            DataValidationError: an atomic number outside ``1 … max_z``.
        """
        z = batch.z
        if z.numel() and (int(z.min()) < 1 or int(z.max()) > self.max_z):
            raise DataValidationError(f"atomic numbers must lie in 1 … {self.max_z} (max_z), got "
                                      f"{int(z.min())} … {int(z.max())}: drop those atoms or raise the model "
                                      f"option max_z")
        pos = batch.pos
        if pos_grad and not pos.requires_grad:
            pos = pos.detach().requires_grad_(True)
        atom_batch = getattr(batch, "batch", None)
        if atom_batch is None:
            atom_batch = torch.zeros_like(z)
        num_structures = int(batch.num_graphs) if hasattr(batch, "num_graphs") else 1
        pbc = getattr(batch, "pbc", None)
        cell = getattr(batch, "cell", None) if pbc is not None and bool(pbc.any()) else None
        state = {"pos": pos, "cell": cell, "z": owned(graph, z), "atom_batch": owned(graph, atom_batch),
                 "num_structures": num_structures}
        if strain:
            eps = torch.zeros(num_structures, 3, 3, dtype=pos.dtype, device=pos.device, requires_grad=True)
            sym = 0.5 * (eps + eps.transpose(1, 2))
            state.update(pos_leaf=pos, strain=eps,
                         pos=pos + torch.einsum("ni,nij->nj", pos, sym.index_select(0, atom_batch)),
                         cell=None if cell is None else cell + cell.to(pos.dtype) @ sym)
        return state

    def run_units(self, start: int, end: int, state: State, graph, comm: GraphParallelHooks = LOCAL) -> State:
        """Run units ``[start, end)`` on ``state`` (a pipeline stage's slice)."""
        for unit in self.units[start:end]:
            state = unit(state, graph, comm)
        return state

    def pipeline_boundary(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The state entries one pipeline stage passes to the next (after any unit): ``name → (rows, trailing
        shape)``, rows ``"atoms"`` (the owned atoms, ``N_r``), ``"edges"`` (the local edges, ``E_r``) or
        ``"triplets"`` (the local triplets, ``T_r``). Every other entry of the state is rebuilt on each stage by
        :meth:`initial_state` (positions, ``z``, structure ids). Empty (the default): the model cannot be staged.
        """
        return {}

    def stage_geometry(self, state: State, graph, comm: GraphParallelHooks = LOCAL) -> State:
        """``state`` with the parameter-free entries a pipeline stage after the first recomputes from ``pos``
        rather than receiving (edge vectors, lengths, bases; differentiable in ``pos``, so conservative forces
        collect each stage's share). Parameter-free modules of unit 0 keep their buffers on every stage. Default:
        nothing to recompute."""
        return state

    def boundary_shapes(self, graph) -> dict[str, tuple[int, ...]]:
        """The shapes of :meth:`pipeline_boundary`'s tensors for ``graph`` (the rank's local view under graph
        parallelism), in its order."""
        ids = getattr(graph, "atom_ids", None)
        rows = {"atoms": int(graph.num_nodes) if ids is None else int(ids.numel()),
                "edges": int(graph.edge_index.size(1))}
        boundary = self.pipeline_boundary()
        if any(r == "triplets" for r, _ in boundary.values()):
            rows["triplets"] = int(graph.idx_kj.numel())
        return {k: (rows[r], *tail) for k, (r, tail) in boundary.items()}

    # ------------------------------------------------------------------ its own cost (what the planner asks)
    def _undescribed(self, what: str):
        return ModelDescriptionError(f"{type(self).__name__} does not describe its {what}, which the cost and memory "
                                     f"models of S2EF layouts need (gnnpipe plan, --layout auto, the predicted peak); "
                                     f"implement {what}() on the model (gnnpipe.models.atomistic.cost), or choose the "
                                     f"layout yourself (--stages, --gp-size, --ways)")

    def hook_calls(self, num_atoms: int, num_structures: int) -> list[HookCall]:
        """The graph-parallel hook calls of one forward on a batch of ``num_atoms`` atoms and ``num_structures``
        structures, in call order (with the trainer's gather of direct forces).

        Raises:
            ModelDescriptionError: the model does not describe them.
        """
        raise self._undescribed("hook_calls")

    def activation_widths(self) -> list[UnitWidths]:
        """Per unit, the values its forward keeps for the backward, per owned edge, triplet and atom (the readout's
        atoms added to the last unit; unit 0 holds the geometry derived with conservative forces).

        Raises:
            ModelDescriptionError: the model does not describe them.
        """
        raise self._undescribed("activation_widths")

    def geometry_widths(self, conservative: bool) -> UnitWidths:
        """The kept values of the parameter-free geometry (edge vectors, lengths, angles, the bases computed from
        them) that a stage running an interaction block holds, with conservative forces (the positions need a
        gradient: the whole derivation is kept) or direct ones (only the bases the blocks' linear maps read).

        Raises:
            ModelDescriptionError: the model does not describe them.
        """
        raise self._undescribed("geometry_widths")

    def embedding_stage_widths(self, conservative: bool) -> UnitWidths:
        """What a pipeline stage holding the embedding alone keeps of the geometry (default: nothing)."""
        return UnitWidths()

    def work_widths(self) -> list[UnitWidths]:
        """Per unit, the multiply-adds of the forward's linear maps per owned edge, triplet and atom (the cost model
        adds one per kept value for the element-wise work).

        Raises:
            ModelDescriptionError: the model does not describe them.
        """
        raise self._undescribed("work_widths")

    def boundary_widths(self) -> UnitWidths:
        """Values per owned edge and atom crossing a pipeline stage boundary (:meth:`pipeline_boundary`'s tensors).

        Raises:
            ModelDescriptionError: the model does not describe them.
        """
        raise self._undescribed("boundary_widths")

    def readout_energy(self, state: State, graph, comm: GraphParallelHooks) -> Tensor:
        """The rank's partial per-structure energies ``[B]`` (before ``comm.sum``)."""
        raise NotImplementedError

    def readout_forces(self, state: State, graph, comm: GraphParallelHooks) -> Tensor:
        """Direct forces of the owned atoms ``[N_r, 3]`` (models with a direct-force head)."""
        raise NotImplementedError

    def readout(self, state: State, graph, comm: GraphParallelHooks = LOCAL) -> dict[str, Tensor]:
        """``{"energy": [B]}`` and, with a direct-force head, ``"forces"`` ``[N_r, 3]`` of the owned atoms, in the
        positions' dtype (under bfloat16 autocast the heads' outputs are cast up: energies and forces in float32)."""
        dtype = state["pos"].dtype
        out = {"energy": comm.sum(self.readout_energy(state, graph, comm).to(dtype))}
        if self.direct_forces:
            out["forces"] = self.readout_forces(state, graph, comm).to(dtype)
        return out

    def forward(self, batch, graph, comm: GraphParallelHooks | None = None, *,
                forces: bool = False, stress: bool = False) -> dict[str, Tensor]:
        """Energies ``[B]`` (eV) of a batch of structures; forces ``[N_r, 3]`` (eV/Å) from the direct head, or,
        with ``forces=True`` and no direct head, conservative forces ``−∂E/∂pos`` (differentiable in training
        mode: ``create_graph=True``); with ``stress=True`` the stress ``[B, 3, 3]`` (eV/Å³, ``(1/V) ∂E/∂ε``:
        module docstring; NaN for a structure without a 3D cell).

        Args:
            batch: a PyG ``Batch`` (or ``Data``) with ``z`` int64 ``[N]``, ``pos`` ``[N, 3]`` Å, ``cell``
                ``[B, 3, 3]`` Å, ``batch`` ``[N]``.
            graph: its neighbour graph built with :attr:`cutoff` (see the module docstring).
            comm: the graph-parallel hooks (default ``LocalHooks``).

        Raises:
            ConfigError: ``stress`` of a model with direct forces (its forces are not ``−∂E/∂pos``: it has no
                consistent stress).
        """
        comm = LOCAL if comm is None else comm
        if stress and self.direct_forces:
            raise ConfigError(f"{type(self).__name__} with direct forces has no stress (its forces are not −∂E/∂pos); "
                              f"train it with conservative forces (without --direct-forces) for stresses")
        conservative = (forces or stress) and not self.direct_forces
        grad_was = torch.is_grad_enabled()
        with torch.set_grad_enabled(grad_was or conservative):
            state = self.initial_state(batch, graph, comm, pos_grad=conservative, strain=stress)
            state = self.run_units(0, len(self.units), state, graph, comm)
            out = self.readout(state, graph, comm)
            if conservative:
                create = grad_was and self.training
                f, de_deps = self.forces_response(out["energy"], state.get("pos_leaf", state["pos"]), comm, create,
                                                  state.get("strain"))
                if forces:
                    out["forces"] = f
                if stress:
                    out["stress"] = stress_from_strain(de_deps, cell_volumes(batch))
        if not grad_was:
            out = {k: v.detach() for k, v in out.items()}
        return out


def stress_from_strain(de_deps: Tensor, volumes: Tensor) -> Tensor:
    """``[B, 3, 3]`` eV/Å³: ``∂E/∂ε / V`` per structure, NaN where ``volumes`` is NaN (no 3D cell). The division
    runs on a volume of 1 there, so the backward of a loss that leaves those structures out stays finite (a NaN
    volume in the division would turn their zero gradients into NaN)."""
    vol = volumes.to(de_deps.dtype).reshape(-1, 1, 1)
    periodic = ~torch.isnan(vol)
    safe = torch.where(periodic, vol, torch.ones_like(vol))
    return torch.where(periodic, de_deps / safe, torch.full_like(de_deps, float("nan")))


def cell_volumes(batch) -> Tensor:
    """``[B]`` Å³: each structure's cell volume ``|det cell|``, NaN where it is not periodic in 3D (no stress)."""
    num = int(batch.num_graphs) if hasattr(batch, "num_graphs") else 1
    cell = getattr(batch, "cell", None)
    if cell is None:
        return torch.full((num,), float("nan"), dtype=batch.pos.dtype, device=batch.pos.device)
    vol = torch.linalg.det(cell.reshape(num, 3, 3).to(torch.float64)).abs()
    pbc = getattr(batch, "pbc", None)
    periodic = torch.ones(num, dtype=torch.bool, device=vol.device) if pbc is None else \
        pbc.reshape(num, 3).bool().all(-1)
    return torch.where(periodic & (vol > 0), vol, torch.full_like(vol, float("nan")))


def _reset_topmost(module: nn.Module) -> None:
    """Call ``reset_parameters`` of the outermost submodules that have one (each resets its own children)."""
    for child in module.children():
        fn = getattr(child, "reset_parameters", None)
        if callable(fn):
            fn()
        else:
            _reset_topmost(child)
