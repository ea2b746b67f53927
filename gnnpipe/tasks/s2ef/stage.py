"""Pipelined S2EF: the units of an atomistic model split over ``S`` stages, micro-batches of whole structures,
composed with graph parallelism (``G`` ranks per stage) and data parallelism (``D`` replicas): ``S × G × D``.

Layout (``--stages S --gp-size G --replicas D``, ``D·S·G`` ranks): global rank ``r = (d·S + s)·G + g`` is rank ``g``
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
(:meth:`~gnnpipe.models.atomistic.AtomisticModel.stage_geometry`), so no ``O(T)`` tensor crosses a stage; their
shapes follow from the micro-batch's graph, which every stage builds, so nothing but the payload is sent.
Micro-batches are independent structures and the schedule flushes (gpipe, 1f1b, any registered flush scheduler), so
the pipeline is exact. On a GPU each micro-batch's graph and graph-parallel plan are built on the CPU and moved to
the rank's device; with ``--amp`` the stages compute in bfloat16 autocast and send their boundaries in the training
dtype.

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
2022).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch

from ...core.runtime.protocol import PipelineStage
from ...data.atoms.graph import AtomGraph, split_graph
from ...models.atomistic.base import cell_volumes
from .labels import energy_mask, force_mask, stress_mask
from .loss import energy_loss, force_loss, stress_loss

__all__ = ["EVAL_ENERGY_TAG", "AtomisticStage", "drop_weights"]

#: tag of the energies the last stage sends to the first in evaluation (conservative forces); above every
#: chunk tag (4 per chunk, :data:`gnnpipe.core.runtime.execute.TAG_STRIDE`)
EVAL_ENERGY_TAG = 1 << 20


def drop_weights(module: nn.Module) -> None:
    """Move ``module``'s parameters to the ``meta`` device (no storage); its buffers stay (parameter-free geometry
    such as SchNet's Gaussian centres is recomputed on every stage)."""
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad)


class _MicroBatch:
    """One micro-batch of structures as every rank of the replica sees it: the PyG batch, the (local) graph,
    the graph-parallel hooks, the boundary shapes, the normalised targets."""

    def __init__(self, tr, structures: list, graph=None):
        batch = Batch.from_data_list(structures)
        graph = tr.graph_fn(batch) if graph is None else graph
        self.comm = tr.make_comm(graph, batch)  # the plan from the CPU graph, the same on every rank
        self.batch, graph = tr.to_device(batch, graph)
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


class AtomisticStage(PipelineStage):
    """The compute of one pipeline stage of an atomistic model (see the module docstring): the interface the
    schedule interpreter (:class:`~gnnpipe.core.runtime.execute.Executor`) drives — ``forward_chunk`` (``F``),
    ``force_grad_chunk`` (``G``), ``second_chunk`` (``D``), ``backward_chunk`` (``B``), each taking the received
    flat boundary tensor (``None`` where nothing is received) and returning the one to send (``None``: nothing),
    ``recv_shape(kind, c)``, ``zero_grad``, ``step``, ``pending``, ``pop_loss``."""

    def __init__(self, tr):
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
        self.eval_stress: dict[int, Tensor | None] = {}
        self.split_graphs = True  # one graph per step, split by micro-batch (:meth:`_graphs`)

    @property
    def params(self) -> list:
        return self.tr.params

    # ------------------------------------------------------------------ micro-batches
    def set_batches(self, groups: list[list], counts, training: bool = True) -> None:
        """The micro-batches of the next schedule: ``groups[c]`` the structures of chunk ``c`` (may be empty);
        ``counts``: the global batch's :class:`~.labels.Counts` (loss normalisation)."""
        graphs = self._graphs(groups)
        self.mbs = [_MicroBatch(self.tr, g, gr) if len(g) else None for g, gr in zip(groups, graphs)]
        self.counts, self.training = counts, training
        self.num_structures, self.num_free = counts.energy, counts.forces

    def _graphs(self, groups: list[list]) -> list:
        """The micro-batches' graphs: one graph of the step's structures, split by micro-batch
        (:func:`~gnnpipe.data.atoms.graph.split_graph`; one ``graph_fn`` call per step, as the single process
        builds it). A custom ``graph_fn`` whose result is not a plain ``AtomGraph`` or cannot be split (edges or
        triplets in another order) gets one call per micro-batch instead (``None`` here), from then on."""
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
            return (mb.numel + self._acc_size(mb),)
        return None

    def _acc_size(self, mb) -> int:
        """Values of the running position (and strain) gradient sum a ``G`` or ``D`` message carries."""
        return 3 * mb.num_atoms + (9 * int(mb.batch.num_graphs) if self.tr.with_stress else 0)

    # ------------------------------------------------------------------ the four passes
    def forward_chunk(self, c: int, x: Tensor | None, e: int) -> Tensor | None:
        """``F``: the stage's units on chunk ``c`` (stage 0 from the structures, others from ``x``); the last stage
        reads out energies (and direct forces) and forms its loss terms; returns the flat boundary tensor."""
        mb = self.mbs[c]
        if mb is None:
            return None
        model = self.tr.model
        grad = self.training or self.conservative
        with torch.set_grad_enabled(grad), self.tr.autocast():
            state = model.initial_state(mb.batch, mb.graph, self.tr.hooks(mb), pos_grad=self.conservative,
                                        strain=self.tr.with_stress)
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
            ctx = {"ins": ins, "pos": state.get("pos_leaf", state["pos"]), "strain": state.get("strain")}
            self.ctx[c] = ctx
            if not self.is_last:
                y = _flat(state[k] for k in mb.shapes).to(self.dtype)  # --amp: the boundary in the training dtype
                ctx["y"] = y
                return y.detach()
            out = model.readout(state, mb.graph, self.tr.hooks(mb))
        energy = out["energy"].reshape(-1)
        ctx["energy"] = energy
        e_t, f_t, ref = self.tr._targets(mb.batch)
        cfg = self.tr.config
        le = energy_loss(energy, e_t, num_structures=self.num_structures, energy_coef=cfg.energy_coef,
                         loss_fn=cfg.loss_fn, mask=energy_mask(mb.batch))
        if self.conservative:
            ctx["loss"] = le
            if not self.training:
                self.eval_energy[c] = energy.detach()
            elif self.tr.reporting:
                self.loss += float(le.detach())
                self.tr.metrics.update_energy(self.tr.normalizer.denormalise(energy.detach(), ref),
                                              mb.batch.energy.reshape(-1), mb.batch.natoms.reshape(-1),
                                              mask=energy_mask(mb.batch))
            return None
        forces = self.tr.replicate(out["forces"], mb)
        loss = le + force_loss(forces, f_t, force_mask(mb.batch), num_free=self.num_free, force_coef=cfg.force_coef,
                               loss_fn=cfg.loss_fn)
        ctx["loss"], ctx["forces"] = loss, forces
        self.record(mb, energy, forces, float(loss.detach()))
        return None

    def force_grad_chunk(self, c: int, g: Tensor | None, e: int) -> Tensor | None:
        """``G``: ``(g_x, g_pos) = ∂y/∂(x, pos) · g_y`` with ``create_graph`` (training); sends ``g_x`` and the running
        position-gradient sum to ``s−1``; stage 0 forms the forces ``F = −Σ_s g_pos`` and the force loss."""
        mb = self.mbs[c]
        if mb is None:
            return None
        ctx = self.ctx[c]
        leaves = [ctx["pos"]] + ([ctx["strain"]] if ctx["strain"] is not None else [])
        targets = ctx["ins"] + leaves
        create = self.training
        if self.is_last:
            outputs, seeds, acc_in, gy = [ctx["energy"].sum()], None, None, None
        else:
            gy = g[:mb.numel].clone().requires_grad_(create)
            acc_in = g[mb.numel:].clone().requires_grad_(create)
            outputs, seeds = [ctx["y"]], [gy]
        with torch.enable_grad():
            grads = torch.autograd.grad(outputs, targets, seeds, create_graph=create, allow_unused=True,
                                        retain_graph=True)
            grads = [torch.zeros_like(t) if gr is None else gr for gr, t in zip(grads, targets)]
            g_x, g_leaves = grads[:len(ctx["ins"])], _flat(grads[len(ctx["ins"]):])
            acc = g_leaves if acc_in is None else acc_in + g_leaves
        ctx.update(gy=gy, acc_in=acc_in, gx=g_x, acc=acc)
        if not self.is_first:
            return _flat([*g_x, acc]).detach()
        n3 = 3 * mb.num_atoms
        with torch.set_grad_enabled(create):
            forces = -self.tr.hooks(mb).replicated_grad(acc[:n3].view(mb.num_atoms, 3))
            stress = None
            if ctx["strain"] is not None:  # (1/V) ∂E/∂ε, summed over the stages and the group's ranks
                volume = cell_volumes(mb.batch).to(acc.dtype).reshape(-1, 1, 1)
                stress = self.tr.hooks(mb).replicated_grad(acc[n3:].view(-1, 3, 3)) / volume
        ctx["forces"], ctx["stress"] = forces, stress
        cfg = self.tr.config
        lf = force_loss(forces, self.tr._targets(mb.batch)[1], force_mask(mb.batch), num_free=self.num_free,
                        force_coef=cfg.force_coef, loss_fn=cfg.loss_fn)
        if stress is not None and cfg.stress_coef:
            lf = lf + stress_loss(stress, mb.batch.stress / self.tr.normalizer.std, stress_mask(mb.batch),
                                  num_stress=self.counts.stress, stress_coef=cfg.stress_coef, loss_fn=cfg.loss_fn)
        ctx["force_loss"] = lf
        if not self.training:
            self.eval_forces[c] = forces.detach()
            self.eval_stress[c] = None if stress is None else stress.detach()
        elif self.tr.reporting:
            self.loss += float(lf.detach())
            self.tr.metrics.update_forces(forces.detach() * self.tr.normalizer.std, mb.batch.forces,
                                          force_mask(mb.batch))
            if stress is not None:
                self.tr.metrics.update_stress(stress.detach() * self.tr.normalizer.std, mb.batch.stress,
                                              stress_mask(mb.batch))
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
            pairs = list(zip(ctx["gx"], parts)) + [(ctx["acc"], g[mb.numel:])]
        pairs = [(t, d) for t, d in pairs if t.requires_grad]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [d for _, d in pairs] if pairs[0][1] is not None else None,
                                    retain_graph=True)
        if self.is_last:
            return None
        gy, acc_in = ctx["gy"], ctx["acc_in"]
        dgy = (gy.grad if gy is not None and gy.grad is not None
               else torch.zeros(mb.numel, dtype=self.dtype, device=self.device))
        dacc = (acc_in.grad if acc_in is not None and acc_in.grad is not None
                else torch.zeros(self._acc_size(mb), dtype=self.dtype, device=self.device))
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
    def record(self, mb: _MicroBatch, energy: Tensor, forces: Tensor, loss: float,
               stress: Tensor | None = None) -> None:
        """Energies and forces of a micro-batch together (direct forces on the last stage; conservative forces on
        the first stage in evaluation): the loss and every metric, EFwT included (reporting ranks only)."""
        if not self.tr.reporting:
            return
        b = mb.batch
        if self.training:
            self.loss += loss
        ref = self.tr._targets(b)[2]
        self.tr._update_metrics(b, energy, forces, ref, force_mask(b), energy_mask(b),
                                loss=0.0 if self.training else loss, s_hat=stress)

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
