"""PyG message-passing layers as layer units, and the zoo models built on them (``gat``, ``gat-res``,
``gatv2``, ``gin``).

A :class:`MessagePassingUnit` wraps any ``torch_geometric.nn.MessagePassing`` that accepts bipartite input
``conv((x_src, x_dst), edge_index[, edge_weight])``. Its aggregation is not a fixed ``Â``: the unit hands
its layer to the aggregation callback, ``agg(h, kind, self.layer)``, and the runtime runs the layer on the
in-edges of the rows it processes, with the sources ``[own rows ; halo rows]`` — on the whole graph, on a
pipeline chunk with the halo read from history and its gradient *pushed* back
(:class:`gnnpipe.tasks.nodes.aggregation.PushHistoryOp`, docs/HALO_GRADIENT.md), or on a graph-parallel part
with the halo exchanged. ``kind`` names the aggregation kind whose non-zeros are the edges (``sum``: the
graph's edges, weights 1 or ``data.edge_weight``; ``gcn``: with self-loops and symmetric weights).

Registering a model around another PyG conv takes a few lines::

    from torch_geometric.nn import SAGEConv
    from gnnpipe.models import GNNModel, MessagePassingUnit, register
    from gnnpipe.models.zoo import Encoder, Head

    @register("pyg-sage")
    class PyGSAGE(GNNModel):
        def __init__(self, in_channels, out_channels, *, num_layers=2, hidden=64, dropout=0.5, **_):
            units = [Encoder(in_channels, hidden, dropout)]
            units += [MessagePassingUnit(SAGEConv(hidden, hidden), hidden, hidden, act="relu", dropout=dropout)
                      for _ in range(num_layers)]
            super().__init__(units + [Head(hidden, out_channels)])
"""

from __future__ import annotations

import torch_geometric.nn as pyg
from torch import Tensor, nn
from torch_geometric.nn import GINConv

from ..errors import ConfigError
from .base import GNNModel, LayerUnit, activation, dropout
from .registry import register
from .zoo import Encoder, Head


class MessagePassingUnit(LayerUnit):
    """``h' = act(norm(conv(dropout(h))))``, or with ``residual`` the pre-activation ("res+", DeeperGCN, Li et
    al. 2020) block ``h' = h + conv(dropout(act(norm(h))))`` (the conv on ``(x_src, x_dst)``, edges as below).

    Args:
        conv: a PyG ``MessagePassing`` accepting ``((x_src [n_src, in_dim], x_dst [n_dst, in_dim]), edge_index
            [2, E])`` and returning ``[n_dst, out_dim]``; with ``edge_weight`` the edges' weights are passed
            as that keyword (e.g. ``"edge_weight"`` for ``GCNConv``/``SimpleConv``).
        in_dim, out_dim: widths. kind: the aggregation kind whose ``Â`` non-zeros are the edges (``"sum"``:
            the graph's edges). dropout: on the unit's input (both sides). act: activation name.
        residual: the res+ block (needs ``in_dim == out_dim``). norm: ``"layer"`` for a LayerNorm (of the output,
            or of the input in a residual block).

    Raises:
        ConfigError: residual with ``in_dim != out_dim``; unknown norm or activation.
    """

    message_passing = True
    param_group = "conv"

    def __init__(self, conv: nn.Module, in_dim: int, out_dim: int, *, kind: str = "sum", dropout: float = 0.0,
                 act: str = "identity", residual: bool = False, norm: str | None = None,
                 edge_weight: str | None = None):
        super().__init__(in_dim, out_dim)
        if residual and in_dim != out_dim:
            raise ConfigError(f"a residual unit needs in_dim == out_dim, got {in_dim} and {out_dim}")
        if norm not in (None, "layer"):
            raise ConfigError(f"unknown norm {norm!r}; use None or 'layer'")
        self.conv = conv
        self.kind = kind
        self.aggregations = (kind,)
        self.dropout = dropout
        self.act = activation(act)
        self.residual = residual
        self.norm = nn.LayerNorm(in_dim if residual else out_dim) if norm == "layer" else None
        self.edge_weight = edge_weight

    def layer(self, x_src: Tensor, x_dst: Tensor, edge_index: Tensor, edge_weight: Tensor) -> Tensor:
        """The conv on bipartite input: sources ``x_src`` ``[n_src, in_dim]`` (the rows themselves first, then
        halo rows), destinations ``x_dst`` ``[n_dst, in_dim]``; returns ``[n_dst, out_dim]``."""
        if self.edge_weight:
            return self.conv((x_src, x_dst), edge_index, **{self.edge_weight: edge_weight})
        return self.conv((x_src, x_dst), edge_index)

    def forward(self, h, shared, agg):
        if self.residual:
            z = self.act(self.norm(h) if self.norm is not None else h)
            return h + agg(dropout(z, self.dropout, self.training), self.kind, self.layer), shared
        out = agg(dropout(h, self.dropout, self.training), self.kind, self.layer)
        if self.norm is not None:
            out = self.norm(out)
        return self.act(out), shared


class Identity(LayerUnit):
    """``h`` unchanged: the encoder of models whose first layer reads the features, the head of those whose
    last layer gives the logits."""

    def __init__(self, dim: int):
        super().__init__(dim, dim)

    def forward(self, h, shared, agg):
        return h, shared


def _check(num_layers: int, hidden: int, heads: int, p: float):
    if num_layers < 1 or hidden < 1 or heads < 1:
        raise ConfigError(f"num_layers, hidden and heads must be >= 1, got {num_layers}, {hidden}, {heads}")
    if not 0.0 <= p < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {p}")


def _attention_model(conv_cls, in_channels, out_channels, num_layers, hidden, heads, dropout, bias, act,
                     residual, out_heads):
    """Units of a GAT-like model (module docstring of :class:`GAT`)."""
    _check(num_layers, hidden, heads, dropout)
    width = heads * hidden
    if residual:
        units = [Encoder(in_channels, width, dropout, act=None)]
        units += [MessagePassingUnit(conv_cls(width, hidden, heads=heads, dropout=dropout, bias=bias), width, width,
                                     dropout=dropout, act=act, residual=True, norm="layer") for _ in range(num_layers)]
        return units + [Head(width, out_channels, dropout, norm=True, act=act)]
    units: list[LayerUnit] = [Identity(in_channels)]
    d = in_channels
    for _ in range(num_layers - 1):
        units.append(MessagePassingUnit(conv_cls(d, hidden, heads=heads, dropout=dropout, bias=bias), d, width,
                                        dropout=dropout, act=act))
        d = width
    units.append(MessagePassingUnit(conv_cls(d, out_channels, heads=out_heads, concat=False, dropout=dropout,
                                             bias=bias),
                                    d, out_channels, dropout=dropout))
    return units + [Identity(out_channels)]


@register("gat")
class GAT(GNNModel):
    """GAT (Veličković et al., ICLR 2018, arXiv 1710.10903) from PyG ``GATConv``.

    Paper form (``residual=False``): an identity encoder, ``L − 1`` layers ``act(GATConv(dropout(h)))`` with
    ``heads`` heads of ``hidden`` features concatenated, a last ``GATConv`` to the classes (``out_heads`` heads,
    averaged), and an identity head. The paper's Cora setting: ``num_layers=2, hidden=8, heads=8,
    dropout=0.6, activation="elu", bias=True`` (dropout also on the attention coefficients).
    Deep form (``residual=True``, registered as ``gat-res``), shaped as ResGCN+: encoder ``Linear(F → heads·hidden)``,
    ``L`` res+ blocks ``h + GATConv(dropout(act(LayerNorm(h))))``, head ``Linear(dropout(act(LayerNorm(h))))``.
    """

    default_hparams = {"lr": 0.005, "dropout": 0.6, "weight_decay": 5e-4, "weight_decay_conv": 5e-4}
    option_help = {"heads": "attention heads of the hidden layers (concatenated)",
                   "residual": "the deep form: res+ blocks between a linear encoder and head",
                   "out_heads": "attention heads of the last layer (averaged; paper form only)"}
    conv_name = "GATConv"

    def __init__(self, in_channels, out_channels, *, num_layers=2, hidden=8, heads=8, dropout=0.6, bias=True,
                 activation="elu", residual=False, out_heads=1):
        super().__init__(_attention_model(getattr(pyg, self.conv_name), in_channels, out_channels, num_layers, hidden,
                                          heads, dropout, bias, activation, residual, out_heads))


@register("gat-res")
class GATResidual(GAT):
    """The deep residual form of :class:`GAT` (``residual=True``)."""

    def __init__(self, in_channels, out_channels, *, num_layers=16, hidden=8, heads=8, dropout=0.6, bias=True,
                 activation="elu", residual=True, out_heads=1):
        super().__init__(in_channels, out_channels, num_layers=num_layers, hidden=hidden, heads=heads,
                         dropout=dropout, bias=bias, activation=activation, residual=residual, out_heads=out_heads)


@register("gatv2")
class GATv2(GAT):
    """GATv2 (Brody et al., ICLR 2022, arXiv 2105.14491) from PyG ``GATv2Conv``; the same shapes as :class:`GAT`."""

    conv_name = "GATv2Conv"


@register("gin")
class GIN(GNNModel):
    """GIN (Xu et al., ICLR 2019, arXiv 1810.00826, eq. 4.1) from PyG ``GINConv``: encoder ``Linear(F → H)``,
    ``L`` layers ``act(GINConv(MLP)(dropout(h)))`` with ``MLP = Linear → act → Linear`` and learnable ε,
    head ``Linear(H → C)``."""

    default_hparams = {"lr": 0.01, "dropout": 0.5, "weight_decay": 5e-4, "weight_decay_conv": 5e-4}

    def __init__(self, in_channels, out_channels, *, num_layers=2, hidden=64, dropout=0.5, bias=True,
                 activation="relu"):
        _check(num_layers, hidden, 1, dropout)
        act = activation

        def mlp():
            return nn.Sequential(nn.Linear(hidden, hidden, bias=bias), _Act(act), nn.Linear(hidden, hidden, bias=bias))

        units: list[LayerUnit] = [Encoder(in_channels, hidden, dropout, act)]
        units += [MessagePassingUnit(GINConv(mlp(), train_eps=True), hidden, hidden, dropout=dropout, act=act)
                  for _ in range(num_layers)]
        super().__init__(units + [Head(hidden, out_channels, dropout)])


class _Act(nn.Module):
    def __init__(self, name: str):
        super().__init__()
        self.fn = activation(name)

    def forward(self, x):
        return self.fn(x)


__all__ = ["GAT", "GIN", "GATResidual", "GATv2", "Identity", "MessagePassingUnit"]
