"""Models as linear sequences of layer units.

A model is ``units = [encoder, layer_1, …, layer_L, head]``. A runtime may cut the sequence into
contiguous *stages* (GNNPipe's layer-level model parallelism). A unit never runs message
passing over the whole graph by itself: it calls the *aggregation callback* ``agg(h, kind)`` it is
given, so the same unit runs

* on the whole graph (``GraphOps.aggregate``; exact, the single-process reference),
* on one chunk with history (the pipeline's chunk aggregation op),
* on one graph partition with a halo exchange (graph parallelism).

``agg(h, kind)`` takes the embeddings ``h`` (``[n, d]``) of the vertices the caller is processing and
returns ``Â[rows, :] @ H`` for the same rows (``[n, d]``); ``kind`` is ``"gcn"``, ``"mean"`` or
``"sum"`` or any registered kind (see :mod:`gnnpipe.tasks.nodes.kinds`; the graph's ``edge_weight`` is used when
present). A unit that declares ``message_passing = True`` (:class:`gnnpipe.models.MessagePassingUnit`) calls
``agg(h, kind, layer)`` instead and gets ``layer(x_src, x_dst, edge_index, edge_weight)`` computed on the rows'
in-edges (the non-zeros of ``Â`` of ``kind``), ``x_src`` being the rows themselves then their halo rows
(docs/HALO_GRADIENT.md).

On a pipeline chunk the callback also offers ``agg.push_pull(kind)``: the unit's next aggregation op as an
object (or ``None`` where the op cannot be fused: then the unit calls ``agg`` as usual) with ``push(h, mask=None)``
(history write of ``h ⊙ mask``, then the product; ``[n, d]`` → ``[n, d]``) and ``pull(g, scale=None)`` (history write of
``scale · g``, then the pull-backward product), both without autograd
(:class:`gnnpipe.tasks.nodes.history.ChunkPushPull`). A unit may use it to run its whole chunk step as one
``autograd.Function`` (fewer autograd nodes and ATen calls per chunk); it must compute the same values as its plain
``agg`` path up to floating-point rounding. A unit class may also fuse a *run* of consecutive units of its class
(``LayerUnit.run_fused``, :meth:`LayerUnit.fused_op`): :meth:`GNNModel.run_units` then hands the run to it as one call
(GCNII: one autograd node per stage and chunk for all its GCNII layers), which must compute what the units' ``forward``
calls one after the other compute; module hooks are not called for a fused run.

A model may declare one *global shared tensor* (GCNII's initial embedding ``h0``): the encoder
produces it, every later unit may read it, and a pipeline ships it with the stage-boundary tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.transforms import NormalizeFeatures

from ..data.preprocess import preprocess as _pre
from ..errors import ConfigError

Aggregator = Callable[[Tensor, str], Tensor]

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "elu": F.elu,
    "gelu": F.gelu,
    "leaky_relu": F.leaky_relu,
    "tanh": torch.tanh,
    "identity": lambda t: t,
}


def dropout(h: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout: zero each element with probability ``p`` and scale the rest by ``1/(1-p)``.

    Same distribution as ``torch.nn.functional.dropout``, but the mask comes from ``torch.rand``
    (about 2.5× faster than ``bernoulli_`` on CPU); reproducible under ``torch.manual_seed``.
    """
    if not training or p == 0.0:
        return h
    if p >= 1.0:
        return h * 0.0
    mask = torch.rand_like(h).ge_(p).mul_(1.0 / (1.0 - p))  # in place: two ops fewer per call (chunks call it often)
    return h * mask


def activation(name: str) -> Callable[[Tensor], Tensor]:
    """The activation function called ``name`` (one of ``ACTIVATIONS``).

    Raises:
        ConfigError: unknown name.
    """
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ConfigError(f"unknown activation {name!r}; use one of {', '.join(ACTIVATIONS)}") from None


#: builds the exact full-graph aggregation ops of a graph for ``model(x, edge_index)``:
#: ``factory(edge_index, num_nodes, dtype, device)`` → an object with ``aggregate(h, kind)``. The runtime
#: installs its own (:class:`gnnpipe.tasks.nodes.graph.GraphOps`) when it is imported: the adjacency lives in core,
#: which the model zoo must not import (models < core: tests/test_imports.py).
_GRAPH_OPS_FACTORY: Callable | None = None


def set_graph_ops_factory(factory: Callable | None) -> None:
    """Install the factory of full-graph aggregation ops ``model(x, edge_index)`` uses (see above)."""
    global _GRAPH_OPS_FACTORY
    _GRAPH_OPS_FACTORY = factory


class LayerUnit(nn.Module):
    """One element of a model's linear sequence (encoder, a GNN layer, or the head).

    Subclasses implement :meth:`forward`.

    Class attributes:
        aggregations: the aggregation kinds the unit calls, in call order, once each per forward
            (e.g. ``("gcn",)``); the runtime keeps one history buffer per entry.
        param_group: ``"conv"`` for GNN-layer weights or ``"dense"`` for encoder/head weights;
            the trainer can apply a different weight decay to each (as GCNII does).
        message_passing: the unit passes a layer to ``agg`` (its aggregations then run through the
            halo-gradient ops of the runtime).
        run_fused: optional static method ``run_fused(units, ops, h, shared) -> (h', shared')`` that runs a run of
            consecutive units of the class on one pipeline chunk as one step, ``ops[k]`` being what
            :meth:`fused_op` of ``units[k]`` gave (:meth:`GNNModel.run_units`; GCNII's layer).
    """

    aggregations: tuple[str, ...] = ()
    param_group: str = "dense"
    message_passing: bool = False
    run_fused: Callable | None = None  # see the class docstring; None: the class does not fuse runs

    def fused_op(self, agg: Aggregator):
        """The op this unit hands to ``run_fused`` on this chunk (e.g. ``agg.push_pull(kind)``), or ``None``
        (the default): the unit then runs through :meth:`forward` with ``agg``."""
        return None

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim

    def forward(self, h: Tensor, shared: Tensor | None, agg: Aggregator) -> tuple[Tensor, Tensor | None]:
        """Run the unit.

        Args:
            h: ``[n, in_dim]`` embeddings of the ``n`` vertices being processed.
            shared: the model's global shared tensor for the same rows (``[n, d]``) or ``None``.
            agg: aggregation callback (see module docstring).

        Returns:
            ``(h', shared')``: ``[n, out_dim]`` and the (possibly newly produced) shared tensor.
        """
        raise NotImplementedError


def unit_seed(seed: int, unit: int) -> int:
    """The seed unit ``unit``'s parameters are drawn with: one per unit, so a process that builds only some units
    (a pipeline stage) draws the same weights as the single-process model."""
    return (int(seed) * 1_000_003 + 7919 * (unit + 1)) % (2**63 - 1)


class ZooModel(nn.Module):
    """What every model of the zoo (:func:`gnnpipe.models.register`) is: a sequence of units (``units``) with a
    ``task`` it solves, recommended hyper-parameters and the spec it was built from.

    Attributes:
        task: ``"node-classification"`` (:class:`GNNModel`) or ``"s2ef"`` (structure → energy and forces,
            :class:`gnnpipe.models.AtomisticModel`).
        default_hparams: recommended training hyper-parameters (``lr``, ``dropout``, ``weight_decay``,
            ``weight_decay_conv``) that the trainer uses for flags left unset.
        spec: how to rebuild the model (set by :func:`gnnpipe.models.build_model`).
    """

    task: str = ""
    default_hparams: dict = {"lr": 0.01, "dropout": 0.5, "weight_decay": 5e-4, "weight_decay_conv": 5e-4}
    spec: dict | None = None

    @property
    def num_units(self) -> int:
        return len(self.units)


class GNNModel(ZooModel):
    """A GNN as a linear sequence of :class:`LayerUnit` s.

    Attributes:
        units: ``nn.ModuleList`` of ``L + 2`` units (encoder, ``L`` layers, head).
        shared_tensor: name of the global shared tensor (``"h0"`` for GCNII) or ``None``.
        default_hparams: recommended training hyper-parameters (``lr``, ``dropout``,
            ``weight_decay``, ``weight_decay_conv``) that the trainer uses for flags left unset.
    """

    task = "node-classification"
    shared_tensor: str | None = None
    #: How to rebuild the model, ``{"name", "in_channels", "out_channels", "kwargs", "dtype"}`` (set by
    #: :func:`gnnpipe.models.build_model`; what :func:`gnnpipe.models.save` stores)
    spec: dict | None = None
    #: the edge/feature preprocessing of the run that trained it (``undirected``, ``remove_self_loops``,
    #: ``dedupe``, ``normalize_features``), which :meth:`predict` repeats; ``None`` = none
    preprocessing: dict | None = None

    def __init__(self, units: list[LayerUnit]):
        super().__init__()
        if len(units) < 2:
            raise ConfigError("a model needs at least an encoder and a head unit")
        self.units = nn.ModuleList(units)

    def run_units(
        self,
        start: int,
        end: int,
        h: Tensor,
        shared: Tensor | None,
        make_agg: Callable[[int], Aggregator],
    ) -> tuple[Tensor, Tensor | None]:
        """Run units ``[start, end)``; ``make_agg(i)`` gives the aggregation callback of unit ``i`` (called once per
        unit, in order).

        A maximal run of consecutive units of one class with a ``LayerUnit.run_fused`` whose
        :meth:`~LayerUnit.fused_op` gives an op (on a pipeline chunk: ``agg.push_pull``) runs as one
        ``run_fused(units, ops, h, shared)`` call (GCNII: one autograd node per stage and chunk); every
        other unit is called as ``unit(h, shared, agg)``."""
        units = list(self.units)
        i = start
        while i < end:
            unit = units[i]
            agg = make_agg(i)
            run = type(unit).run_fused
            op = None if run is None else unit.fused_op(agg)
            i += 1
            if op is None:
                h, shared = unit(h, shared, agg)
                continue
            chain, ops, rest = [unit], [op], None
            while i < end and type(units[i]).run_fused is run:
                rest = make_agg(i)
                op = units[i].fused_op(rest)
                if op is None:  # not fusable here: it runs plainly, with the callback just made
                    break
                chain.append(units[i])
                ops.append(op)
                rest = None
                i += 1
            h, shared = run(chain, ops, h, shared)
            if rest is not None:
                h, shared = units[i](h, shared, rest)
                i += 1
        return h, shared

    def forward(self, x: Tensor, agg: Tensor | Aggregator | Callable[[int], Aggregator], *,
                per_unit: bool = False, edge_weight: Tensor | None = None) -> Tensor:
        """Full forward: ``x`` (``[n, F]``) → logits (``[n, C]``).

        ``agg`` is either

        * an ``edge_index`` (``LongTensor[2, E]``, edges ``source → target`` as in PyG; optional
          ``edge_weight`` ``[E]``): the call is
          ``model(x, edge_index)`` as PyG users expect; the exact full-graph aggregation ops of the
          graph (``Â`` of each kind, ``gnnpipe.tasks.nodes.graph``) are built on first use and cached for
          later calls with the same (unmodified) ``edge_index``, like PyG's ``cached=True``;
        * one aggregation callback for every unit, or (``per_unit=True``) a factory ``unit_index → callback``.

        Raises:
            ConfigError: ``agg`` is a tensor that is not a ``[2, E]`` integer ``edge_index``.
        """
        if isinstance(agg, Tensor):
            agg, per_unit = self._edge_index_aggregator(agg, x, edge_weight), False
        make = agg if per_unit else (lambda i: agg)
        h, _ = self.run_units(0, self.num_units, x, None, make)  # type: ignore[arg-type]
        return h

    def _edge_index_aggregator(self, edge_index: Tensor, x: Tensor, edge_weight: Tensor | None = None) -> Aggregator:
        """The cached full-graph aggregation callback of ``edge_index`` for ``x``'s rows, dtype and device."""
        if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.is_floating_point():
            raise ConfigError(f"model(x, edge_index) needs edge_index as an integer tensor of shape [2, E], got "
                              f"{edge_index.dtype} of shape {list(edge_index.shape)}; or pass an aggregation callback")
        key = (edge_index.data_ptr(), tuple(edge_index.shape), edge_index._version, x.size(0), x.dtype, x.device,
               None if edge_weight is None else (edge_weight.data_ptr(), edge_weight._version))
        cached = self.__dict__.get("_graph_ops")
        if cached is None or cached[0] != key:
            if _GRAPH_OPS_FACTORY is None:
                raise ConfigError("model(x, edge_index) needs the runtime's graph ops: import gnnpipe.api (or "
                                  "gnnpipe.core) first, or call gnnpipe.api.predict(model, data)")
            ops = _GRAPH_OPS_FACTORY(edge_index.long(), x.size(0), x.dtype, x.device, edge_weight=edge_weight)
            self.__dict__["_graph_ops"] = cached = (key, ops)
        return cached[1].aggregate

    @torch.no_grad()
    def predict(self, data, *, preprocess: bool = True) -> Tensor:
        """Class scores (logits) of every vertex of ``data`` in ``data``'s own vertex order.

        Exact full-graph inference in eval mode (no dropout). With ``preprocess`` the edges are
        preprocessed as at training (:attr:`preprocessing`, set by the trainer or by
        :func:`gnnpipe.models.load`: made undirected, self-loops and duplicates removed, features
        row-normalised if the run did); vertices are never reordered.

        Args:
            data: a PyG ``Data`` with ``x`` (``[N, F]``) and ``edge_index`` (``[2, E]``).

        Returns:
            ``[N, C]`` float logits on the model's device (argmax = predicted class).

        Raises:
            ConfigError: ``data`` has another number of features than the model was trained on.
        """
        x, edge_index, ew = data.x, data.edge_index, getattr(data, "edge_weight", None)
        want = int(self.units[0].in_dim) if len(self.units) else None
        if want is not None and x.dim() == 2 and int(x.size(1)) != want:
            raise ConfigError(f"the model expects {want} input features per vertex, the graph has {int(x.size(1))}; "
                              f"predict on a graph like the one it was trained on (--dataset/--root, or the Data "
                              f"you trained with)")
        pre = self.preprocessing if preprocess else None
        if pre:
            d = _pre(Data(x=x, edge_index=edge_index, num_nodes=x.size(0),
                          **({} if ew is None else {"edge_weight": ew})),
                     undirected=pre.get("undirected", True), remove_self_loops=pre.get("remove_self_loops", True),
                     dedupe=pre.get("dedupe", True))
            x, edge_index, ew = d.x, d.edge_index, getattr(d, "edge_weight", None)
            if pre.get("normalize_features"):
                x = NormalizeFeatures()(Data(x=x.clone())).x
        p = next(self.parameters(), None)
        if p is not None:
            x, edge_index = x.to(p.device, p.dtype), edge_index.to(p.device)
            ew = None if ew is None else ew.to(p.device, p.dtype)
        was = self.training
        self.eval()
        try:
            return self(x, edge_index, edge_weight=ew)
        finally:
            self.train(was)

    def aggregation_dims(self) -> list[tuple[int, str, int]]:
        """``(unit_index, kind, width)`` of every aggregation op, in execution order (width = input width of the op)."""
        out = []
        for i, u in enumerate(self.units):
            for kind in u.aggregations:
                out.append((i, kind, getattr(u, "agg_dim", u.in_dim)))
        return out

    def backward_aggregation_dims(self) -> list[tuple[int, str, int]]:
        """The entries of :meth:`aggregation_dims` whose input needs a gradient, i.e. those of units after the
        first unit with trainable parameters (a layer reading the raw features, e.g. GAT's first, sends no
        halo gradient back in graph parallelism)."""
        first = next((i for i, u in enumerate(self.units) if any(p.requires_grad for p in u.parameters())),
                     self.num_units)
        return [t for t in self.aggregation_dims() if t[0] > first]

    def param_groups(self, weight_decay: float, weight_decay_conv: float | None = None,
                     units: range | None = None) -> list[dict]:
        """Parameter groups for an optimizer: dense units with ``weight_decay``, GNN layers with
        ``weight_decay_conv``; only the units in ``units`` (default: all — a pipeline stage passes its own)."""
        wd_conv = weight_decay if weight_decay_conv is None else weight_decay_conv
        dense, conv = [], []
        for i in units if units is not None else range(self.num_units):
            u = self.units[i]
            (conv if u.param_group == "conv" else dense).extend(p for p in u.parameters() if p.requires_grad)
        groups = []
        if dense:
            groups.append({"params": dense, "weight_decay": weight_decay})
        if conv:
            groups.append({"params": conv, "weight_decay": wd_conv})
        return groups
