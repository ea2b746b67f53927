"""Pipelined S2EF: the units of an atomistic model split over ``S`` stages, micro-batches of whole structures,
composed with graph parallelism (``G`` ranks per stage) and data parallelism (``D`` replicas): ``S × G × D``.

Layout (``--stages S --gp-size G --ways D``, ``D·S·G`` ranks): global rank ``r = (d·S + s)·G + g`` is rank ``g``
of the graph-parallel group of stage ``s`` of replica ``d``. Stage ``s`` runs units ``[bounds[s], bounds[s+1])``
(the layer partitioner ``--layer-split``, equal by default); the last stage also holds the readout (``head``).
Every rank of a replica reads the replica's share of the global batch (:func:`~.data.share`), cut into ``C``
micro-batches (``--chunks``) of whole structures (``torch.tensor_split``: contiguous, as even as possible); every
rank builds the same neighbour graph and (``G > 1``) the same graph-parallel plan of each micro-batch, so stage
``s`` rank ``g`` exchanges boundary tensors with stage ``s ± 1`` rank ``g`` only. Weights of the units a rank
does not run stay on the ``meta`` device (their buffers stay): parameters, gradients and Adam moments per rank fall
with ``S``.

Boundary tensors (:meth:`~gnnpipe.models.atomistic.AtomisticModel.pipeline_boundary`): the state entries a unit
passes on — atom or edge activations, DimeNet++'s radial basis and running output sum — flattened into one message
per micro-batch (``O(E + N)`` values); the parameter-free geometry (edge vectors, lengths, the spherical basis of
the triplets) is recomputed from the positions on every stage
(:meth:`~gnnpipe.models.atomistic.AtomisticModel.stage_geometry`), so no ``O(T)`` tensor crosses a stage; their shapes follow from the micro-batch's graph, which every stage builds, so nothing
but the payload is sent. Micro-batches are independent structures and the schedule flushes (gpipe, 1f1b, any
registered flush scheduler), so the pipeline is exact.

Direct forces: ``F`` (first → last stage) ends on the last stage with the readout and the loss; ``B`` back.
Conservative forces ``F = −∂E/∂pos`` (a second-order schedule, ``G`` and ``D`` actions of
:mod:`gnnpipe.schedulers`): with ``y_s = f_s(x_s, pos; θ_s)`` the stage map,

* ``F`` (1→S): ``y_s`` with the received ``x_s`` as leaves requiring grad, ``pos`` requiring grad;
* ``G`` (S→1): stage ``s`` gets ``g_y`` (a leaf requiring grad; on the last stage the seed ``∂ΣE/∂E = 1``) and
  the running sum ``a_{s+1} = Σ_{t>s} ∂E/∂pos|_t`` and computes
  ``(g_x, g_pos) = autograd.grad(y_s, (x_s, pos), g_y, create_graph=True)``, sends ``(g_x, a_{s+1} + g_pos)`` to
  ``s−1``; on stage 0 the forces are ``F = −comm.replicated_grad(a_0)`` and the force loss is formed there;
* ``D`` (1→S): stage ``s`` back-propagates the force loss's gradients of ``(g_x, a_s)`` into its ``G`` graph
  (``retain_graph=True``): the parameters' second-order gradients accumulate, the partial ``dL/dx_s`` is kept,
  ``(dL/dg_y, dL/da_{s+1})`` goes to ``s+1``;
* ``B`` (S→1): ``y_s.backward(dL/dy_s)`` (the energy loss enters on the last stage), and the kept partial is added
  to the ``dL/dx_s`` sent to ``s−1``.

Loss normalisation: every micro-batch's loss is a sum divided by the global batch's counts (``B`` structures,
``n_free`` free atoms over all replicas, :func:`~.loss.s2ef_loss`), so gradients summed over micro-batches, the
``G`` ranks of a group and the ``D`` replicas equal the single process's gradient of the whole batch. At each
``STEP`` the gradients are summed over the ``D·G`` ranks of the stage, the gradient norm is the global one (all
stages), then AdamW, the learning-rate schedule and the moving average of the stage's own weights.

Source: GPipe (Huang et al. 2019) / PipeDream-Flush (Narayanan et al. 2021) schedules over the interaction blocks
of DimeNet++ (Gasteiger et al. 2020) and SchNet (Schütt et al. 2017); graph parallelism of Sriram et al. (ICLR
2022); issue #30.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ...core.settings.config import TrainConfig
from ...errors import ConfigError
from .loss import S2EFMetrics, energy_loss, force_loss
from .normalizer import EnergyNormalizer
from .trainer import S2EFTrainer, plan_info

__all__ = ["AtomisticStage", "PipelineS2EFTrainer", "check_pipeline", "grid3", "pipeline_plan_info", "stage_bounds",
           "worker"]

#: tag of the energies the last stage sends to the first in evaluation (conservative forces); above every
#: chunk tag (4 per chunk, :data:`gnnpipe.core.runtime.execute.TAG_STRIDE`)
EVAL_ENERGY_TAG = 1 << 20


def grid3(rank: int, stages: int, group_size: int) -> tuple[int, int, int]:
    """``(d, s, g)`` of global rank ``rank``: replica, stage and rank in the graph-parallel group
    (``rank = (d·S + s)·G + g``)."""
    ds, g = divmod(int(rank), int(group_size))
    d, s = divmod(ds, int(stages))
    return d, s, g


def stage_bounds(model, num_stages: int, method: str = "equal") -> list[int]:
    """Unit boundaries (``S + 1`` ints) of the stages: the layer partitioner ``method`` over ``model.units``.

    Raises:
        ConfigError: more stages than units; a partitioner other than ``equal`` (the profiled split measures
            node-classification chunks).
    """
    from ...partitioners import split_layers

    units = len(model.units)
    if num_stages > units:
        raise ConfigError(f"--stages {num_stages} exceeds the {units} units of the model (embedding + "
                          f"{units - 1} interaction blocks): use --stages {units} or fewer, or more --layers")
    if method != "equal":
        raise ConfigError(f"--layer-split {method} is not available for atomistic models; use --layer-split equal")
    return list(split_layers(model, num_stages, method).bounds)


def check_pipeline(config: TrainConfig, world: int | None = None) -> None:
    """Refuse a pipelined S2EF configuration that cannot run, before any process starts.

    Raises:
        ConfigError: a model without pipeline boundary (cannot be staged), more stages than units, more chunks
            than structures per replica batch, a scheduler that does not flush (stale weights are not exact), a
            scheduler without the ``G``/``D`` passes for conservative forces, an unknown layer split, a torchrun
            world other than ``D·S·G``.
        UnknownComponentError: an unknown scheduler.
    """
    from ... import schedulers
    from .trainer import make_model

    S, C = config.stages, config.chunks or 1
    G, D = config.graph_parallel_group_size, config.ways
    if C > config.batch_size:
        raise ConfigError(f"--chunks {C} exceeds the {config.batch_size} structures of a replica's batch "
                          f"(--batch-size): a micro-batch is a group of whole structures; use --chunks "
                          f"{config.batch_size} or fewer, or a larger --batch-size")
    cls = schedulers.get(config.scheduler)
    if not getattr(cls, "flush", True):
        raise ConfigError(f"--scheduler {config.scheduler} does not flush: its stale weights would make the S2EF "
                          f"pipeline inexact; use a flush scheduler ({', '.join(n for n in schedulers.available() if getattr(schedulers.get(n), 'flush', True))})")
    if not config.direct_forces:
        try:
            sch = schedulers.make_scheduler(config.scheduler, second_order=True).build(S, list(range(C)))
        except ConfigError:
            sch = None
        if sch is None or not getattr(sch, "second_order", False):
            raise ConfigError(f"--scheduler {config.scheduler} has no G/D passes, which training through "
                              f"conservative forces needs in a pipeline; use --scheduler gpipe or 1f1b, or "
                              f"--direct-forces")
    with torch.device("meta"):  # only its structure is read: no weights drawn (minutes for a 10^8-parameter model)
        model = make_model(config)
    if not model.pipeline_boundary():
        raise ConfigError(f"--model {config.model} cannot be split into pipeline stages (it declares no "
                          f"pipeline boundary); use --stages 1")
    stage_bounds(model, S, config.layer_split)
    if world is not None and world != D * S * G:
        raise ConfigError(f"torchrun started {world} ranks, but --ways {D} × --stages {S} × --gp-size {G} needs "
                          f"{D * S * G}")


def pipeline_plan_info(config: TrainConfig, splits: dict) -> dict:
    """:func:`~.trainer.plan_info` with the ``S × G × D`` layout: ``stages``, ``chunks``, ``scheduler``,
    ``graph_parallel``, ``world_size`` and the stage ``bounds``."""
    from .trainer import make_model

    info = plan_info(config, splits)
    G = config.graph_parallel_group_size
    with torch.device("meta"):
        model = make_model(config)
    info.update(stages=config.stages, chunks=config.chunks or 1, scheduler=config.scheduler,
                world_size=config.ways * config.stages * G, graph_parallel=G,
                bounds=stage_bounds(model, config.stages, config.layer_split))
    if G > 1:
        info.update(graph_parallel_partitioner=config.graph_parallel_partitioner,
                    graph_parallel_mode=config.graph_parallel_mode)
    return info


def _drop_weights(module: nn.Module) -> None:
    """Move ``module``'s parameters to the ``meta`` device (no storage); its buffers stay (parameter-free geometry
    such as SchNet's Gaussian centres is recomputed on every stage)."""
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad)


class _MicroBatch:
    """One micro-batch of structures as every rank of the replica sees it: the PyG batch, the (local) graph,
    the graph-parallel hooks, the boundary shapes, the normalised targets."""

    def __init__(self, tr: PipelineS2EFTrainer, structures: list, graph=None):
        from torch_geometric.data import Batch

        self.batch = batch = Batch.from_data_list(structures)
        graph = tr.graph_fn(batch) if graph is None else graph
        self.comm = tr.make_comm(graph, batch)
        self.graph = graph if self.comm is None else self.comm.local_graph(graph)
        self.shapes = tr.model.boundary_shapes(self.graph)
        self.numel = sum(_numel(sh) for sh in self.shapes.values())
        self.num_atoms = int(batch.num_nodes)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _unpack(flat: Tensor, shapes: dict) -> dict[str, Tensor]:
    out, off = {}, 0
    for k, sh in shapes.items():
        n = _numel(sh)
        out[k] = flat[off:off + n].view(sh)
        off += n
    return out


def _flat(tensors) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


class AtomisticStage:
    """The compute of one pipeline stage of an atomistic model (see the module docstring): the interface the
    schedule interpreter (:class:`~gnnpipe.core.runtime.execute.Executor`) drives — ``forward_chunk`` (``F``),
    ``force_grad_chunk`` (``G``), ``second_chunk`` (``D``), ``backward_chunk`` (``B``), each taking the received
    flat boundary tensor (``None`` where nothing is received) and returning the one to send (``None``: nothing),
    ``recv_shape(kind, c)``, ``zero_grad``, ``step``, ``pending``, ``pop_loss``."""

    def __init__(self, tr: PipelineS2EFTrainer):
        self.tr = tr
        self.histories: dict = {}  # no history: micro-batches are independent structures
        self.s, self.S = tr.stage, tr.S
        self.is_first, self.is_last = self.s == 0, self.s == self.S - 1
        self.lo, self.hi = tr.bounds[self.s], tr.bounds[self.s + 1]
        self.device = tr.device
        self.dtype = tr.config.torch_dtype
        self.conservative = not tr.direct
        self.training = True
        self.mbs: list[_MicroBatch | None] = []
        self.ctx: dict[int, dict] = {}
        self.loss = 0.0
        self.version = 0
        self.eval_energy: dict[int, Tensor] = {}
        self.eval_forces: dict[int, Tensor] = {}
        self.split_graphs = True  # one graph per step, split by micro-batch (:meth:`_graphs`)

    @property
    def params(self) -> list:
        return self.tr.params

    # ------------------------------------------------------------------ micro-batches
    def set_batches(self, groups: list[list], num_structures: int, num_free: int, training: bool = True) -> None:
        """The micro-batches of the next schedule: ``groups[c]`` the structures of chunk ``c`` (may be empty);
        ``num_structures``, ``num_free``: the global batch's counts (loss normalisation)."""
        graphs = self._graphs(groups)
        self.mbs = [_MicroBatch(self.tr, g, gr) if len(g) else None for g, gr in zip(groups, graphs)]
        self.num_structures, self.num_free, self.training = num_structures, num_free, training

    def _graphs(self, groups: list[list]) -> list:
        """The micro-batches' graphs: one graph of the step's structures, split by micro-batch
        (:func:`~gnnpipe.data.atoms.graph.split_graph`; one ``graph_fn`` call per step, as the single process
        builds it). A custom ``graph_fn`` whose result is not a plain ``AtomGraph`` or cannot be split (edges or
        triplets in another order) gets one call per micro-batch instead (``None`` here), from then on."""
        from torch_geometric.data import Batch

        from ...data.atoms.graph import AtomGraph, split_graph

        flat = [s for g in groups for s in g]
        if self.split_graphs and flat:
            graph = self.tr.graph_fn(Batch.from_data_list(flat))
            if type(graph) is AtomGraph:
                try:
                    return split_graph(graph, [len(g) for g in groups])
                except ValueError:
                    pass
            self.split_graphs = False
        return [None] * len(groups)

    def recv_shape(self, kind: str, c: int) -> tuple[int] | None:
        """The flat shape of what action ``kind`` on chunk ``c`` receives (``None``: nothing)."""
        mb = self.mbs[c]
        if mb is None:
            return None
        if kind == "F" and not self.is_first or kind == "B" and not self.is_last:
            return (mb.numel,)
        if kind == "G" and not self.is_last or kind == "D" and not self.is_first:
            return (mb.numel + 3 * mb.num_atoms,)
        return None

    # ------------------------------------------------------------------ the four passes
    def forward_chunk(self, c: int, x: Tensor | None, e: int) -> Tensor | None:
        """``F``: the stage's units on chunk ``c`` (stage 0 from the structures, others from ``x``); the last stage
        reads out energies (and direct forces) and forms its loss terms; returns the flat boundary tensor."""
        mb = self.mbs[c]
        if mb is None:
            return None
        model = self.tr.model
        grad = self.training or self.conservative
        with torch.set_grad_enabled(grad):
            state = model.initial_state(mb.batch, mb.graph, self.tr.hooks(mb), pos_grad=self.conservative)
            ins: list[Tensor] = []
            if not self.is_first:
                parts = _unpack(x, mb.shapes)
                for t in parts.values():
                    if grad:
                        t.requires_grad_(True)
                    ins.append(t)
                state.update(parts)
                state = model.stage_geometry(state, mb.graph, self.tr.hooks(mb))
            state = model.run_units(self.lo, self.hi, state, mb.graph, self.tr.hooks(mb))
            ctx = {"ins": ins, "pos": state["pos"]}
            self.ctx[c] = ctx
            if not self.is_last:
                y = _flat(state[k] for k in mb.shapes)
                ctx["y"] = y
                return y.detach()
            out = model.readout(state, mb.graph, self.tr.hooks(mb))
        energy = out["energy"].reshape(-1)
        ctx["energy"] = energy
        e_t, f_t, ref = self.tr._targets(mb.batch)
        cfg = self.tr.config
        le = energy_loss(energy, e_t, num_structures=self.num_structures, energy_coef=cfg.energy_coef,
                         loss_fn=cfg.loss_fn)
        if self.conservative:
            ctx["loss"] = le
            if not self.training:
                self.eval_energy[c] = energy.detach()
            elif self.tr.reporting:
                self.loss += float(le.detach())
                self.tr.metrics.update_energy(self.tr.normalizer.denormalise(energy.detach(), ref),
                                              mb.batch.energy.reshape(-1), mb.batch.natoms.reshape(-1))
            return None
        forces = self.tr.replicate(out["forces"], mb)
        loss = le + force_loss(forces, f_t, ~mb.batch.fixed, num_free=self.num_free, force_coef=cfg.force_coef,
                               loss_fn=cfg.loss_fn)
        ctx["loss"], ctx["forces"] = loss, forces
        self._record(mb, energy, forces, float(loss.detach()))
        return None

    def force_grad_chunk(self, c: int, g: Tensor | None, e: int) -> Tensor | None:
        """``G``: ``(g_x, g_pos) = ∂y/∂(x, pos) · g_y`` with ``create_graph`` (training); sends ``g_x`` and the running
        position-gradient sum to ``s−1``; stage 0 forms the forces ``F = −Σ_s g_pos`` and the force loss."""
        mb = self.mbs[c]
        if mb is None:
            return None
        ctx = self.ctx[c]
        targets = ctx["ins"] + [ctx["pos"]]
        create = self.training
        if self.is_last:
            outputs, seeds, acc_in, gy = [ctx["energy"].sum()], None, None, None
        else:
            gy = g[:mb.numel].clone().requires_grad_(create)
            acc_in = g[mb.numel:].view(mb.num_atoms, 3).clone().requires_grad_(create)
            outputs, seeds = [ctx["y"]], [gy]
        with torch.enable_grad():
            grads = torch.autograd.grad(outputs, targets, seeds, create_graph=create, allow_unused=True,
                                        retain_graph=True)
            grads = [torch.zeros_like(t) if gr is None else gr for gr, t in zip(grads, targets)]
            g_x, g_pos = grads[:-1], grads[-1]
            acc = g_pos if acc_in is None else acc_in + g_pos
        ctx.update(gy=gy, acc_in=acc_in, gx=g_x, acc=acc)
        if not self.is_first:
            return _flat([*g_x, acc]).detach()
        with torch.set_grad_enabled(create):
            forces = -self.tr.hooks(mb).replicated_grad(acc)
        ctx["forces"] = forces
        cfg = self.tr.config
        lf = force_loss(forces, self.tr._targets(mb.batch)[1], ~mb.batch.fixed, num_free=self.num_free,
                        force_coef=cfg.force_coef, loss_fn=cfg.loss_fn)
        ctx["force_loss"] = lf
        if not self.training:
            self.eval_forces[c] = forces.detach()
        elif self.tr.reporting:
            self.loss += float(lf.detach())
            self.tr.metrics.update_forces(forces.detach() * self.tr.normalizer.std, mb.batch.forces,
                                          ~mb.batch.fixed)
        return None

    def second_chunk(self, c: int, g: Tensor | None, e: int) -> Tensor | None:
        """``D``: back-propagate the force loss's gradient of what ``G`` produced into the ``G`` graph (parameters'
        second-order gradients; the partial ``dL/dx`` kept for ``B``); sends ``(dL/dg_y, dL/da)`` to ``s+1``."""
        mb = self.mbs[c]
        if mb is None:
            return None
        ctx = self.ctx[c]
        if self.is_first:
            pairs = [(ctx["force_loss"], None)]
        else:
            parts = list(_unpack(g[:mb.numel], mb.shapes).values())
            pairs = list(zip(ctx["gx"], parts)) + [(ctx["acc"], g[mb.numel:].view(mb.num_atoms, 3))]
        pairs = [(t, d) for t, d in pairs if t.requires_grad]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [d for _, d in pairs] if pairs[0][1] is not None else None,
                                    retain_graph=True)
        if self.is_last:
            return None
        gy, acc_in = ctx["gy"], ctx["acc_in"]
        dgy = gy.grad if gy is not None and gy.grad is not None else torch.zeros(mb.numel, dtype=self.dtype)
        dacc = (acc_in.grad if acc_in is not None and acc_in.grad is not None
                else torch.zeros(mb.num_atoms, 3, dtype=self.dtype))
        if self.is_first and gy is None:  # a one-stage pipeline has no seed to pass on
            return None
        return _flat([dgy, dacc])

    def backward_chunk(self, c: int, g: Tensor | None, e: int) -> Tensor | None:
        """``B``: ``y.backward(dL/dy)`` (the last stage: its loss terms); returns ``dL/dx`` (with ``D``'s partial)."""
        mb = self.mbs[c]
        if mb is None:
            return None
        ctx = self.ctx.pop(c)
        if self.is_last:
            if ctx["loss"].requires_grad:
                ctx["loss"].backward()
        else:
            ctx["y"].backward(g)
        if self.is_first:
            return None
        return _flat([t.grad if t.grad is not None else torch.zeros_like(t) for t in ctx["ins"]])

    # ------------------------------------------------------------------ metrics
    def _record(self, mb: _MicroBatch, energy: Tensor, forces: Tensor, loss: float) -> None:
        """Energies and forces of a micro-batch together (direct forces on the last stage; conservative forces on
        the first stage in evaluation): the loss and every metric, EFwT included (reporting ranks only)."""
        if not self.tr.reporting:
            return
        b = mb.batch
        if self.training:
            self.loss += loss
        ref = self.tr._targets(b)[2]
        self.tr.metrics.update(self.tr.normalizer.denormalise(energy.detach(), ref), b.energy.reshape(-1),
                               forces.detach() * self.tr.normalizer.std, b.forces, ~b.fixed, b.natoms.reshape(-1),
                               b.batch, loss=0.0 if self.training else loss)

    # ------------------------------------------------------------------ the interpreter's other calls
    def zero_grad(self) -> None:
        self.tr.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.tr.optimizer_step()
        self.version += 1

    def pending(self) -> list[int]:
        return sorted(self.ctx)

    def pop_loss(self, epoch: int) -> float:
        out, self.loss = self.loss, 0.0
        return out


class PipelineS2EFTrainer(S2EFTrainer):
    """The S2EF executor of one rank of an ``S × G × D`` layout (see the module docstring).

    Args: as :class:`~gnnpipe.tasks.s2ef.trainer.S2EFTrainer`; ``world = D·S·G`` (a process group must be
    initialised when ``world > 1``).

    Raises:
        ConfigError: ``S·G`` does not divide ``world``; see :func:`stage_bounds`.
    """

    def __init__(self, config: TrainConfig, structures: list, splits: dict, normalizer: EnergyNormalizer, *,
                 rank: int = 0, world: int = 1, model=None, graph_fn=None):
        from ... import schedulers
        from ...core.ops.comm import Comm
        from ...core.runtime.execute import Executor

        self.S, self.G = config.stages, config.graph_parallel_group_size
        self.C = config.chunks or 1
        if world % (self.S * self.G):
            raise ConfigError(f"--stages {self.S} × --gp-size {self.G} does not divide the {world} ranks")
        self.D = world // (self.S * self.G)
        _, self.stage, self.g = grid3(rank, self.S, self.G)
        self._model_for_bounds = model if model is not None else None
        super().__init__(config, structures, splits, normalizer, rank=rank, world=world, model=model,
                         graph_fn=graph_fn)
        self.direct = bool(getattr(self.model, "direct_forces", False))
        S, G, D = self.S, self.G, self.D
        self.gp_group = self.stage_group = None
        if world > 1:  # every rank creates every group, in the same order
            for d in range(D):
                for s in range(S):
                    grp = dist.new_group([(d * S + s) * G + g for g in range(G)]) if G > 1 else None
                    if (d, s) == (self.replica, self.stage):
                        self.gp_group = grp
            for s in range(S):
                grp = dist.new_group([(d * S + s) * G + g for d in range(D) for g in range(G)])
                if s == self.stage:
                    self.stage_group = grp
        self.comm = Comm(self.device)
        self.gp_comm = Comm(self.device)
        self.metrics = S2EFMetrics()
        self.pipe_stage = AtomisticStage(self)
        self.ranks = [(self.replica * S + s) * G + self.g for s in range(S)]
        scheduler = schedulers.make_scheduler(config.scheduler, **({} if self.direct else {"second_order": True}))
        self.executor = Executor(self.pipe_stage, config=config, num_stages=S, ranks=self.ranks,
                                 chunks=range(self.C), scheduler=scheduler,
                                 order_policy=schedulers.order_policy("fixed"), correctors=[], comm=self.comm,
                                 data=None, chunk_ptr=torch.arange(self.C + 1))
        self.steps = 0

    # ------------------------------------------------------------------ layout
    graph_in_loader = False  # a step's graph is built once from all its micro-batches (AtomisticStage._graphs)

    def comms(self) -> list:
        return [self.comm, self.gp_comm]

    def needs_triplets(self) -> bool:
        """When the model reads triplets, or under graph parallelism (its partitioners balance by them)."""
        return self.G > 1 or super().needs_triplets()

    def replica_of(self, rank: int, world: int) -> tuple[int, int, bool]:
        d, _, g = grid3(rank, self.S, self.G)
        return d, world // (self.S * self.G), g == 0

    def trained_module(self) -> nn.Module:
        """The stage's units (and the readout on the last stage) under their single-process names; the other
        units' weights are moved to the ``meta`` device (no storage)."""
        self.bounds = stage_bounds(self.model, self.S, self.config.layer_split)
        lo, hi = self.bounds[self.stage], self.bounds[self.stage + 1]
        mod = nn.Module()
        mod.units = nn.ModuleDict({str(i): self.model.units[i] for i in range(lo, hi)})
        if self.stage == self.S - 1:
            mod.head = self.model.head
        else:
            _drop_weights(self.model.head)
        for i, u in enumerate(self.model.units):
            if not lo <= i < hi:
                _drop_weights(u)
        return mod

    def export_model(self):
        from .trainer import make_model

        return make_model(self.config)

    def make_comm(self, graph, batch):
        """The graph-parallel hooks of a micro-batch (``None`` with ``G = 1``)."""
        if self.G == 1:
            return None
        from ...core.ops.graph_parallel import GraphParallelComm
        from ...partitioners import plan_graph_parallel

        cfg = self.config
        plan = plan_graph_parallel(graph, self.G, cfg.graph_parallel_partitioner, pos=batch.pos)
        return GraphParallelComm(plan, group=self.gp_group, mode=cfg.graph_parallel_mode, comm=self.gp_comm,
                                 device=self.device)

    def hooks(self, mb: _MicroBatch):
        from ...models.atomistic import LOCAL

        return LOCAL if mb.comm is None else mb.comm

    def replicate(self, rows: Tensor, mb: _MicroBatch) -> Tensor:
        if mb.comm is None:
            return rows
        from .graph_parallel import replicate_owned

        return replicate_owned(rows, mb.comm)

    # ------------------------------------------------------------------ the checkpoint interface
    def weights(self) -> dict[str, Tensor]:
        """Collective: on rank 0 the averaged weights of every stage merged (the single-process ``state_dict``); on
        the other ranks their own stage's. Gathered on rank 0 only: a rank holding every stage's weights (and the
        buffers of an all-gather: ``world`` pickles of a stage) would hold far more than its stage."""
        own = super().weights()
        if self.world == 1:
            return own
        parts = [None] * self.world if self.rank == 0 else None
        dist.gather_object(own if self.replica == 0 and self.g == 0 else {}, parts, dst=0)
        if parts is None:
            return own
        merged: dict[str, Tensor] = {}
        for p in parts:
            merged.update(p)
        return merged

    def task_state(self) -> dict | None:
        """Collective: on rank 0 every stage's moving average, the schedule and ``weights`` (all stages' averaged
        weights); ``None`` on the other ranks (the checkpoint stores rank 0's, which every rank reads on resume)."""
        weights = self.weights()
        ema = self.ema.state_dict()
        if self.world > 1:
            parts = [None] * self.world if self.rank == 0 else None
            dist.gather_object(ema if self.replica == 0 and self.g == 0 else None, parts, dst=0)
            if parts is None:
                return None
            shadow = {}
            for p in parts:
                if p:
                    shadow.update(p["shadow"])
            ema = {"updates": ema["updates"], "shadow": shadow}
        return {"ema": ema, "schedule": self.schedule.state_dict(), "weights": weights}

    def load_task_state(self, state: dict) -> None:
        own = set(self.ema.shadow)
        ema = state["ema"]
        self.ema.load_state_dict({"updates": ema["updates"], "shadow": {k: v for k, v in ema["shadow"].items()
                                                                           if k in own}})
        self.schedule.load_state_dict(state["schedule"])

    # ------------------------------------------------------------------ training
    def _groups(self, structures: list) -> list[list]:
        """A replica's share (the structures a loader step read) cut into ``C`` micro-batches."""
        return [[structures[i] for i in part.tolist()]
                for part in torch.tensor_split(torch.arange(len(structures)), self.C)]

    def train_step(self, epoch: int) -> dict:
        """One epoch of steps, each one schedule through the stages (from the resumed batch of a checkpoint written
        inside it); returns ``loss`` (mean over steps of the global batch's loss), ``lr``, ``train_energy_mae`` /
        ``train_force_mae`` (eV, eV/Å), ``bytes_layer`` (boundary bytes sent, summed over ranks), ``bytes_weight`` (the
        stages' gradient all-reduces over their ``D·G`` ranks, summed over ranks), ``idle_s`` (per
        rank: seconds blocked waiting for a peer, in receives and in sends not yet taken); ``{"loss": nan}`` when the
        run ended inside the epoch (``--max-steps``)."""
        c0, t0 = time.thread_time(), time.perf_counter()
        self.comm.reset()
        self.gp_comm.reset()
        if not self.epoch_steps(epoch):
            return {"loss": float("nan")}
        m = self.metrics.compute(self._all_reduce(self.metrics.totals().clone()))
        c = self.comm.counters()
        per = torch.tensor([c["bytes_layer"], c["idle_s"], self.gp_comm.counters()["bytes_gp"],
                            time.thread_time() - c0, c["bytes_weight"]], dtype=torch.float64)
        rows = [torch.zeros_like(per) for _ in range(self.world)] if self.world > 1 else [per]
        if self.world > 1:
            dist.all_gather(rows, per)
        r = torch.stack(rows)
        n = len(self.epoch_losses)
        out = {"loss": sum(self.epoch_losses) / n if n else 0.0, "lr": self.lr, "train_energy_mae": m["energy_mae"],
               "train_force_mae": m["force_mae"], "bytes_layer": round(float(r[:, 0].sum())),
               "idle_s": r[:, 1].tolist(), "bytes_gp": round(float(r[:, 2].sum())), "cpu_s": r[:, 3].tolist(),
               "bytes_weight": round(float(r[:, 4].sum()))}
        if self.steps_loop is not None:
            out["time_s"] = self.steps_loop.epoch_time(t0)
        return out

    def train_batch(self, ids: Tensor, step=None) -> float:
        """One step on the global batch ``ids``: this replica's share (``step``: as the loader read it; ``None``:
        read here) in ``C`` micro-batches through the schedule (its ``STEP``: :meth:`optimizer_step`); returns this
        rank's part of the loss (made global by :meth:`flush_losses`)."""
        if step is None:
            step = next(iter(self.loader.iterate([self.share(ids)])))
        num_structures, num_free, skip = self.global_counts(ids, step)
        self.skipped += skip
        self.pipe_stage.set_batches(self._groups(step.structures), num_structures, num_free)
        out = self.executor.train_epoch(self.steps)
        self.steps += 1
        return float(out["loss"])

    def flush_losses(self) -> None:
        """Collective: the step losses since the last call summed over the ranks (each stage's and replica's part)
        and appended to :attr:`epoch_losses`."""
        if not self._pending:
            return
        vec = torch.tensor(self._pending, dtype=torch.float64)
        self._all_reduce(vec)
        self.epoch_losses.extend(vec.tolist())
        self._pending = []

    def optimizer_step(self) -> None:
        """The interpreter's ``STEP``: gradients summed over the stage's ``D·G`` ranks, clipped at the global norm
        (every stage's parameters), the learning rate of the step, AdamW, the moving average."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.D * self.G > 1 and grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.comm.all_reduce(flat, group=self.stage_group, kind="weight")
            off = 0
            for p, g in zip(self.params, grads):
                p.grad = flat[off:off + g.numel()].view_as(g).clone()
                off += g.numel()
        else:
            for p, g in zip(self.params, grads):
                p.grad = g
        max_norm = self.config.clip_grad_norm
        if max_norm:
            sq = torch.zeros((), dtype=torch.float64)
            for p in self.params:
                sq += p.grad.double().square().sum()
            if self.world > 1:
                dist.all_reduce(sq)  # each stage counted once per (replica, group rank): D·G times
                sq /= self.D * self.G
            norm = float(sq.sqrt())
            coef = min(max_norm / (norm + 1e-6), 1.0)
            if coef < 1.0:
                for p in self.params:
                    p.grad.mul_(coef)
        self.lr = self.schedule.apply()
        self.optimizer.step()
        self.ema.update(self.trained)

    # ------------------------------------------------------------------ evaluation
    def _eval_split(self, ids: Tensor) -> None:
        """Exact inference through the stages, ``C`` micro-batches per batch: ``F`` (and ``G`` without a graph for
        conservative forces, whose energies the last stage then sends to stage 0); the metrics are summed where
        energies and forces are together (direct: the last stage; conservative: stage 0)."""
        cfg = self.config
        st, ex = self.pipe_stage, self.executor
        parts = [self.share(gb) for gb in ids.split(cfg.batch_size * self.replicas)]
        num_structures, num_free = self.eval_counts(ids, parts)
        for k, step in enumerate(self.loader.iterate(parts)):
            st.set_batches(self._groups(step.structures), num_structures, num_free, training=False)
            st.eval_energy, st.eval_forces = {}, {}
            for c in range(self.C):
                ex.forward(c, k)
            if not self.direct:
                for c in reversed(range(self.C)):
                    ex.force_grad(c, k)
                self._conservative_metrics(st)
            st.ctx.clear()
        ex.comm.wait_sends()

    def _conservative_metrics(self, st: AtomisticStage) -> None:
        """The last stage sends its micro-batches' energies to stage 0, which adds the metrics of each."""
        if not self.reporting or not (st.is_first or st.is_last):
            return
        chunks = [c for c, mb in enumerate(st.mbs) if mb is not None]
        if st.is_last and not st.is_first:
            if chunks:
                self.comm.isend(torch.cat([st.eval_energy[c] for c in chunks]), self.ranks[0], EVAL_ENERGY_TAG,
                                "eval")
            return
        if not chunks:
            return
        if not st.is_last:
            n = sum(int(st.mbs[c].batch.num_graphs) for c in chunks)
            flat = self.comm.recv((n,), st.dtype, self.ranks[-1], EVAL_ENERGY_TAG)
            sizes = [int(st.mbs[c].batch.num_graphs) for c in chunks]
            st.eval_energy = dict(zip(chunks, flat.split(sizes)))
        cfg = self.config
        for c in chunks:
            mb = st.mbs[c]
            e_t = self._targets(mb.batch)[0]
            loss = (energy_loss(st.eval_energy[c], e_t, num_structures=st.num_structures,
                                energy_coef=cfg.energy_coef, loss_fn=cfg.loss_fn)
                    + st.ctx[c]["force_loss"])
            st._record(mb, st.eval_energy[c], st.eval_forces[c], float(loss.detach()))

    def evaluate(self, size: int | None = None) -> dict:
        """Validation and test metrics with the averaged weights (as :meth:`S2EFTrainer.evaluate`; ``size``: the
        first ``size`` structures of each split)."""
        out = {}
        with self.ema.averaged(self.trained):
            self.model.eval()
            totals = []
            for k in ("val", "test"):
                self.metrics = S2EFMetrics()
                self._eval_split(self.splits[k][:size])
                totals.append(self.metrics.totals())
            sums = self._all_reduce(torch.stack(totals))
            for j, k in enumerate(("val", "test")):
                out[f"{k}_loss"] = float(sums[j, S2EFMetrics.FIELDS.index("loss")])
                out.update(S2EFMetrics().compute(sums[j], prefix=f"{k}_"))
        self.metrics = S2EFMetrics()
        self.schedule.observe(out["val_force_mae"])
        return out


def worker(rank: int, world: int, config: TrainConfig, structures: list, splits: dict, normalizer: dict,
           progress: bool = True, options=None, records=None) -> dict | None:
    """The function each rank of an ``S × G × D`` layout runs (:func:`gnnpipe.core.run.launch.spawn`, or a
    torchrun rank). Returns ``{"result": TrainResult}`` on rank 0, ``None`` elsewhere."""
    torch.set_num_threads(config.threads)
    tr = PipelineS2EFTrainer(config, structures, splits, EnergyNormalizer.from_dict(normalizer), rank=rank,
                             world=world)
    result = tr.run(progress, options, plan_info=pipeline_plan_info(config, splits), records=records)
    peaks = [None] * world
    if world > 1:
        dist.all_gather_object(peaks, result.extra["peak_mem_bytes"][0])
    else:
        peaks = result.extra["peak_mem_bytes"]
    result.extra["peak_mem_bytes"] = peaks
    return {"result": result} if rank == 0 else None

