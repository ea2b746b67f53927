"""A pipeline stage that only computes: its units, its aggregation ops, one chunk at a time.

A :class:`Stage` runs units ``[lo_unit, hi_unit)`` of the model on one chunk forward
(:meth:`Stage.forward_chunk`) or backward (:meth:`Stage.backward_chunk`) and takes optimizer steps
(:meth:`Stage.step`). It sends and receives nothing and knows no schedule: the boundary tensors come in
and go out as arguments and return values, the epoch is an argument, and the interpreter
(:mod:`gnnpipe.core.runtime.execute`) decides what runs when. How an aggregation reaches rows the stage does
not compute is its ops' business (:mod:`gnnpipe.tasks.nodes.aggregation`), so the same class is the stage of a
pipeline, of a hybrid way and of a graph-parallel way.

The boundary tensor of chunk ``c`` is ``[|R_c|, d]`` with the model's shared tensor (GCNII's ``h0``)
concatenated on the right; its gradient has the same layout (the shared tensor's gradient thus sums over
the stages).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ...core.runtime.protocol import PipelineStage
from ...core.settings.config import TrainConfig
from ...errors import ConfigError
from ...models import GNNModel
from .aggregation import AggregationOp, unit_aggregators
from .metrics import masked_loss


def _rng_state(device: torch.device):
    """The RNG state dropout draws from on ``device`` (replayed when recomputing a chunk)."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def make_optimizer_for(model: GNNModel, config: TrainConfig, units: range) -> torch.optim.Optimizer:
    """Adam over the given units' parameters (dense / conv weight decay as in
    :func:`gnnpipe.tasks.nodes.trainer.make_optimizer`)."""
    groups = model.param_groups(config.weight_decay, config.weight_decay_conv, units=units)
    if not groups:  # a stage without parameters still needs a steppable optimizer
        groups = [{"params": [torch.nn.Parameter(torch.zeros(0))]}]
    return torch.optim.Adam(groups, lr=config.lr)


class Stage(PipelineStage):
    """Units ``[bounds[s], bounds[s+1])`` of a model with their aggregation ops, on this rank.

    Args:
        config: the resolved configuration (``dtype``, ``recompute``, optimizer settings).
        model: the model (:func:`~gnnpipe.tasks.nodes.trainer.make_model`; only the stage's units need to be
            materialised, the others may stay on the ``meta`` device).
        data: the relabelled graph (read, not kept): ``x`` ``[N, F]``, ``y`` ``[N]``, ``train_mask`` ``[N]``,
            ``num_nodes``; e.g. a memory-mapped :class:`~gnnpipe.tasks.nodes.graphfile.GraphFile`.
        bounds: unit boundaries of the stages (``S+1`` ints). stage: ``s``.
        rows: ``c → (lo, hi)``, the global rows of chunk ``c``.
        ops: ``{(unit, op index): AggregationOp}`` for every aggregation of the stage's units.
        flush: the scheduler flushes (gpipe, 1f1b); ``False`` (async-stale) recomputes every chunk in its
            backward, since autograd cannot back-propagate through weights changed in place.
        stash: weight stashing (non-flush only): back-propagate each chunk at the weights its forward used.
        recompute: recompute activations in the backward (default: ``config.recompute`` or not ``flush``).
        device: where the stage computes.
        row_range: the global rows ``(lo, hi)`` this stage ever processes (default: all ``N``): the first stage
            holds ``x`` of these rows only, the last stage their labels and training mask; other stages hold
            neither (lean ranks).

    Raises:
        ConfigError: the stage owns no unit.
    """

    def __init__(self, config: TrainConfig, model: GNNModel, data, bounds: Sequence[int], stage: int,
                 rows: Callable[[int], tuple[int, int]], ops: dict[tuple[int, int], AggregationOp], *,
                 flush: bool = True, stash: bool = False, recompute: bool | None = None,
                 device: torch.device | str = "cpu", row_range: tuple[int, int] | None = None):
        self.config = config
        self.device = torch.device(device)
        self.dtype = config.torch_dtype
        self.s = stage
        self.S = len(bounds) - 1
        self.lo_unit, self.hi_unit = int(bounds[stage]), int(bounds[stage + 1])
        if self.hi_unit <= self.lo_unit:
            raise ConfigError(f"stage {stage} owns no unit (bounds {list(bounds)})")
        self.units = range(self.lo_unit, self.hi_unit)
        self.num_nodes = int(data.num_nodes)
        # lean rank: only the own units move to the device (the others may be meta: never allocated);
        # the first stage holds the features of the rows it processes, the last the labels and training mask
        for i in self.units:
            model.units[i].to(self.device, self.dtype)
        self.model = model
        self._unit_list = list(model.units)  # indexed per unit and chunk action (a ModuleList's indexing is Python)
        self.row_range = (0, self.num_nodes) if row_range is None else (int(row_range[0]), int(row_range[1]))
        lo, hi = self.row_range
        # x: a view of the rows (no copy on the CPU in the compute dtype: of a memory-mapped graph file only the pages
        # read become resident, once; a copy doubled them)
        self.x = data.x[lo:hi].to(self.device, self.dtype) if self.is_first else None
        self.y = data.y[lo:hi].to(self.device).clone() if self.is_last else None
        self.train_mask = data.train_mask[lo:hi].to(self.device).clone() if self.is_last else None
        self.num_train = int(data.train_mask.sum())
        self.rows = rows
        self.ops = ops
        self.flush, self.stash = flush, stash
        self.recompute = (config.recompute or not flush) if recompute is None else recompute
        for hist in self.histories.values():  # --recompute trades compute for memory: G_out too (History)
            hist.release_grads = bool(config.recompute)
            # a recomputed chunk sees what its forward read of history (History.recall), not what later chunks
            # wrote since: the same gradients as without recompute. Without a flush (async-stale) a chunk's
            # backward may come after its next forward; it reads history as it is then.
            hist.kept = {} if (self.recompute and flush) else None
        self.shared_dim = model.units[0].out_dim if model.shared_tensor else 0
        self.in_dim = model.units[self.lo_unit].in_dim
        self.out_dim = model.units[self.hi_unit - 1].out_dim
        self.optimizer = make_optimizer_for(self.model, config, self.units)
        self.params = [p for i in self.units for p in self.model.units[i].parameters() if p.requires_grad]
        self.version = 0  # optimizer steps taken by this stage
        self._saved: dict[tuple[int, int], tuple] = {}
        self._losses: dict[int, list[float]] = {}
        self._stashed: dict[int, list[Tensor]] = {}

    # ------------------------------------------------------------------ shape of the boundary
    @property
    def is_first(self) -> bool:
        return self.s == 0

    @property
    def is_last(self) -> bool:
        return self.s == self.S - 1

    @property
    def histories(self) -> dict:
        """``{(unit, op index): History}`` of the ops that keep one (correctors see these)."""
        return {k: op.history for k, op in self.ops.items() if op.history is not None}

    def recv_shape(self, kind: str, c: int) -> tuple[int, int] | None:
        """``[rows of chunk c, width]`` of the boundary tensor ``F`` receives from ``s − 1`` (the input rows and the
        shared tensor) and ``B`` from ``s + 1`` (their gradient); ``None`` on the first stage's ``F`` and the last
        stage's ``B``."""
        lo, hi = self.rows(c)
        if kind == "F" and not self.is_first:
            return (hi - lo, self.input_width())
        if kind == "B" and not self.is_last:
            return (hi - lo, self.output_width())
        return None

    def input_width(self) -> int:
        """Columns of the boundary tensor this stage receives (its input rows plus the shared tensor)."""
        return self.in_dim + self.shared_dim

    def output_width(self) -> int:
        """Columns of the boundary tensor this stage sends (its output rows plus the shared tensor)."""
        return self.out_dim + self.shared_dim

    def boundary(self, out: Tensor, sh: Tensor | None) -> Tensor:
        """The stage-boundary payload: output rows with the shared tensor (e.g. GCNII's h0) on the right."""
        return torch.cat([out, sh], 1) if self.shared_dim else out

    def split_boundary(self, buf: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(h, shared)`` of a received boundary tensor (views)."""
        return buf[:, : self.in_dim], (buf[:, self.in_dim:] if self.shared_dim else None)

    # ------------------------------------------------------------------ compute
    def _run(self, c: int, h: Tensor, sh: Tensor | None, write: bool):
        rows, ops = self.rows(c), self.ops
        make = unit_aggregators(self._unit_list,
                                lambda i, j, t, kind, layer: ops[(i, j)].train(t, c, rows, write, layer),
                                lambda i, j, kind: ops[(i, j)].push_pull(c, rows, write))
        return self.model.run_units(self.lo_unit, self.hi_unit, h, sh, make)

    def _loss(self, c: int, out: Tensor) -> Tensor:
        lo, hi = self.rows(c)
        b = self.row_range[0]
        return masked_loss(out, self.y[lo - b:hi - b], self.train_mask[lo - b:hi - b], self.num_train)

    def forward_chunk(self, c: int, h_in: Tensor | None, epoch: int) -> Tensor | None:
        """Forward of chunk ``c`` in ``epoch`` through the stage's units.

        Args:
            h_in: the received boundary tensor ``[|R_c|, input_width]`` (``None`` on the first stage, which
                reads ``x[R_c]``).

        Returns:
            The boundary tensor to send on (``[|R_c|, output_width]``), or ``None`` on the last stage, which
            records the chunk's loss (train cross-entropy / global number of training vertices).
        """
        lo, hi = self.rows(c)
        if self.is_first:
            h, sh = self.x[lo - self.row_range[0]:hi - self.row_range[0]], None
        else:
            # the received tensor is this stage's own (a fresh receive buffer): its column views are the leaves
            # whose gradients the backward sends back, without copying them out first
            h, sh = self.split_boundary(h_in.detach())
            h = h.requires_grad_()
            sh = sh.requires_grad_() if sh is not None else None
        rng = _rng_state(self.device) if self.recompute else None
        if not self.model.training:  # once after an evaluation, not per chunk (train() walks every module)
            self.model.train()
        with torch.set_grad_enabled(not self.recompute):
            out, sh_out = self._run(c, h, sh, write=True)
        loss = None
        if self.is_last:
            if self.recompute:
                with torch.no_grad():
                    self._losses.setdefault(epoch, []).append(float(self._loss(c, out)))
            else:
                loss = self._loss(c, out)
                self._losses.setdefault(epoch, []).append(float(loss.detach()))
        if self.recompute:
            self._saved[(epoch, c)] = (h, sh, None, None, None, rng, self.version)
            if self.stash and self.version not in self._stashed:
                self._stashed[self.version] = [p.detach().clone() for p in self._all_params()]
        else:
            self._saved[(epoch, c)] = (h, sh, out, sh_out, loss, None, self.version)
        return None if self.is_last else self.boundary(out, sh_out)

    def _all_params(self) -> list[Tensor]:
        return [p for i in self.units for p in self.model.units[i].parameters()]

    def backward_chunk(self, c: int, grad_out: Tensor | None, epoch: int) -> Tensor | None:
        """Backward of chunk ``c`` in ``epoch`` (its forward must have run): weight gradients accumulate.

        Args:
            grad_out: the received gradient of the boundary tensor sent forward (``None`` on the last
                stage, which back-propagates its loss).

        Returns:
            The gradient of the boundary tensor received in the forward (``[|R_c|, input_width]``), or
            ``None`` on the first stage.
        """
        h_in, sh_in, out, sh_out, loss, rng, version = self._saved.pop((epoch, c))
        swap = False
        if self.recompute:
            swap = self.stash and version != self.version
            if swap:  # weight stashing: recompute and differentiate at the weights the forward used
                current = [p.detach().clone() for p in self._all_params()]
                with torch.no_grad():
                    for p, w in zip(self._all_params(), self._stashed[version]):
                        p.copy_(w)
            cur = _rng_state(self.device)
            _set_rng_state(self.device, rng)
            out, sh_out = self._run(c, h_in, sh_in, write=False)
            _set_rng_state(self.device, cur)
            if self.is_last:
                loss = self._loss(c, out)
        if self.is_last:
            loss.backward()
        else:
            tensors, grads = [out], [grad_out[:, : self.out_dim]]
            if self.shared_dim and sh_out is not None and sh_out.requires_grad:
                tensors.append(sh_out)
                grads.append(grad_out[:, self.out_dim:])
            torch.autograd.backward(tensors, grads)
        grad_in = None
        if not self.is_first:
            grad_in = h_in.grad if h_in.grad is not None else torch.zeros_like(h_in)
            if self.shared_dim:
                gs = sh_in.grad if sh_in.grad is not None else torch.zeros_like(sh_in)
                grad_in = torch.cat([grad_in, gs], 1)
        if swap:
            with torch.no_grad():
                for p, w in zip(self._all_params(), current):
                    p.copy_(w)
        if self.stash:
            live = {v for *_, v in self._saved.values()}
            for v in [v for v in self._stashed if v not in live and v != self.version]:
                del self._stashed[v]
        return grad_in

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)

    def step(self) -> None:
        """One optimizer step on the accumulated gradients (a new weight version). Non-flush stages start
        the next gradient accumulation right away."""
        self.optimizer.step()
        self.version += 1
        if not self.flush:
            self.optimizer.zero_grad(set_to_none=False)

    def pop_loss(self, epoch: int) -> float:
        """The epoch's loss on the last stage (the sum of its chunk losses = the full-batch mean loss); 0 elsewhere."""
        return sum(self._losses.pop(epoch, []))

    def pending(self) -> list[tuple[int, int]]:
        """``(epoch, chunk)`` forwarded but not yet back-propagated."""
        return sorted(self._saved)

    @torch.no_grad()
    def infer_units(self, inputs: list, capture: bool = False) -> tuple[Tensor, Tensor | None]:
        """Exact inference of the stage's units on its inference rows (eval mode; each op's :meth:`infer`).
        ``capture=True`` writes every op's exact input into its history (a full refresh).

        Args:
            inputs: ``[h, shared]`` (``h`` ``[n, in_dim]``, ``shared`` ``[n, shared_dim]`` or ``None``); the list is
                emptied, so that no reference to ``h`` outlives the first unit: each unit's input is freed once the
                unit has run (a pipeline stage infers all ``N`` rows at once).

        Returns:
            ``(out [n, out_dim], shared)``.
        """
        self.model.eval()
        make = unit_aggregators(self.model.units,
                                lambda i, j, t, kind, layer: self.ops[(i, j)].infer(t, capture, layer))
        h, sh = inputs
        inputs.clear()
        for i in self.units:  # GNNModel.run_units' loop, here so that nothing else holds a unit's input
            h, sh = self.model.units[i](h, sh, make(i))
        return h, sh

    # ------------------------------------------------------------------ reporting
    def history_bytes(self) -> int:
        return sum(h.nbytes for h in self.histories.values())

    def named_grads(self) -> dict[str, Tensor]:
        """Gradients of this stage's parameters, keyed by the full model's parameter names."""
        out = {}
        for i in self.units:
            for name, p in self.model.units[i].named_parameters():
                out[f"units.{i}.{name}"] = (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        return out


__all__ = ["Stage", "make_optimizer_for"]
