"""The built-in models (GNNPipe paper, §5 "models"), each a linear sequence of layer units.

Every model here is ``[encoder, layer_1 … layer_L, head]`` (``L + 2`` units) and registers
through :func:`gnnpipe.models.register`, the same door user models use.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .base import Aggregator, GNNModel, LayerUnit, activation, dropout
from .registry import register


# --------------------------------------------------------------------------- shared units
class Encoder(LayerUnit):
    """``h = act(Linear(dropout(x)))`` (``[n, F]`` → ``[n, H]``); with ``shared=True`` it also emits ``h`` as the
    global shared tensor (GCNII's ``h0``, Chen et al. ICML 2020, eq. 5). ``act=None`` skips the activation."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float, act: str | None = "relu", shared: bool = False):
        super().__init__(in_dim, out_dim)
        self.lin = nn.Linear(in_dim, out_dim)
        self.dropout = dropout
        self.act = activation(act) if act else None
        self.emits_shared = shared

    def forward(self, h, shared, agg):
        h = self.lin(dropout(h, self.dropout, self.training))
        if self.act is not None:
            h = self.act(h)
        return h, (h if self.emits_shared else shared)


class Head(LayerUnit):
    """Classifier ``Linear(dropout(h))`` (``[n, H]`` → ``[n, C]`` logits); ``dropout=0`` for none.
    With ``norm=True`` (DeeperGCN res+): ``Linear(dropout(act(LayerNorm(h))))``."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0, norm: bool = False, act: str = "relu"):
        super().__init__(in_dim, out_dim)
        self.norm = nn.LayerNorm(in_dim) if norm else None
        self.act = activation(act)
        self.lin = nn.Linear(in_dim, out_dim)
        self.dropout = dropout

    def forward(self, h, shared, agg):
        if self.norm is not None:
            h = self.act(self.norm(h))
        return self.lin(dropout(h, self.dropout, self.training)), shared


# --------------------------------------------------------------------------- GNN layers
class GCNLayer(LayerUnit):
    """GCN layer (Kipf & Welling 2017, eq. 2): ``dropout(act(Linear(Â_gcn h)))``.

    ``Linear(Â h) = Â h W + b`` equals PyG ``GCNConv`` (which computes ``Â (h W) + b``).
    """

    aggregations = ("gcn",)
    param_group = "conv"

    def __init__(self, dim: int, dropout: float, bias: bool, act: str):
        super().__init__(dim, dim)
        self.lin = nn.Linear(dim, dim, bias=bias)
        self.dropout = dropout
        self.act = activation(act)

    def forward(self, h, shared, agg: Aggregator):
        h = self.act(self.lin(agg(h, "gcn")))
        return dropout(h, self.dropout, self.training), shared


class SAGELayer(LayerUnit):
    """GraphSAGE-mean layer (Hamilton et al. 2017): ``dropout(act(W_root h + W_neigh mean_agg(h) + b))``.

    Equals PyG ``SAGEConv(aggr="mean")`` (``lin_r`` = root, no bias; ``lin_l`` = neighbours, bias).
    """

    aggregations = ("mean",)
    param_group = "conv"

    def __init__(self, dim: int, dropout: float, bias: bool, act: str):
        super().__init__(dim, dim)
        self.lin_root = nn.Linear(dim, dim, bias=False)
        self.lin_neigh = nn.Linear(dim, dim, bias=bias)
        self.dropout = dropout
        self.act = activation(act)

    def forward(self, h, shared, agg: Aggregator):
        h = self.act(self.lin_root(h) + self.lin_neigh(agg(h, "mean")))
        return dropout(h, self.dropout, self.training), shared


class GCNIILayer(LayerUnit):
    """GCNII layer ℓ (Chen et al., ICML 2020, eq. 5), with input dropout as in the authors' code:

    ``s = (1 − α)·Â·dropout(h) + α·h0``,  ``h' = act(θ_ℓ·s·W_ℓ + (1 − θ_ℓ)·s)``,  ``θ_ℓ = ln(λ/ℓ + 1)``.

    Equals PyG ``GCN2Conv(alpha=α, theta=λ, layer=ℓ, shared_weights=True)`` followed by ``act``.
    Reads the shared tensor ``h0`` (``[n, H]``).
    """

    aggregations = ("gcn",)
    param_group = "conv"

    def __init__(self, dim: int, layer: int, dropout: float, alpha: float, lam: float, bias: bool, act: str):
        super().__init__(dim, dim)
        self.alpha = alpha
        self.theta = math.log(lam / layer + 1.0)
        self.lin = nn.Linear(dim, dim, bias=bias)
        self.dropout = dropout
        self.act = activation(act)
        self.fusable = act == "relu" and not bias  # the fused chunk step covers this (the paper's) form

    def fused_op(self, agg: Aggregator):
        """The op of this unit's aggregation for the fused chunk step (:class:`_GCNIIChunk`): ``agg.push_pull("gcn")``
        on a pipeline chunk, or ``None`` — then the unit runs its plain path (and ``agg`` still counts op 0 as not
        taken). ``None`` also for a form the fused step does not cover (bias, another activation), without autograd,
        for a subclass that overrides :meth:`forward`, and for a unit with forward hooks (the fused run does not call
        the module)."""
        if (not self.fusable or not torch.is_grad_enabled() or type(self).forward is not GCNIILayer.forward
                or self._forward_hooks or self._forward_pre_hooks):
            return None
        push_pull = getattr(agg, "push_pull", None)
        return None if push_pull is None else push_pull("gcn")

    @staticmethod
    def run_fused(units, ops, h: Tensor, shared: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Consecutive GCNII units ``units`` (each with the op its :meth:`fused_op` gave, ``ops``) on one pipeline
        chunk as **one** autograd node (:class:`_GCNIIChunk`): ``h`` ``[n, d]``, ``shared`` = ``h0`` ``[n, d]`` →
        ``(h', h0)``. The same values as the units' plain paths one after the other (forward bit for bit)."""
        if shared is None:
            raise ConfigError("GCNII layers need the shared tensor h0 produced by the encoder")
        steps = tuple((op, u.dropout if u.training else 0.0, u.alpha, u.theta) for u, op in zip(units, ops))
        return _GCNIIChunk.apply(h, shared, steps, *[u.lin.weight for u in units]), shared

    def forward(self, h, shared, agg: Aggregator):
        if shared is None:
            raise ConfigError("GCNII layers need the shared tensor h0 produced by the encoder")
        op = self.fused_op(agg)
        if op is not None:  # a pipeline chunk: the whole step as one autograd node (same values, see _GCNIIChunk)
            return self.run_fused([self], [op], h, shared)
        # fused as in PyG's GCN2Conv: lerp = (1 − α)·a + α·h0; addmm = (1 − θ)·s + θ·s·Wᵀ (fewer ops per call)
        s = torch.lerp(agg(dropout(h, self.dropout, self.training), "gcn"), shared, self.alpha)
        out = torch.addmm(s, s, self.lin.weight.t(), beta=1.0 - self.theta, alpha=self.theta)
        del s  # without autograd (evaluation) nothing else holds it: one [n, d] fewer alive at the activation
        if self.lin.bias is not None:
            out = out + self.theta * self.lin.bias
        return self.act(out), shared


def _run_masks(h: Tensor, steps) -> Tensor | None:
    """The dropout masks of a fused run of ``K > 1`` units drawn in one call, ``[K, n, d]``, or ``None`` (one per
    unit). One ``rand`` of ``K·n·d`` numbers on the CPU generator is the ``K`` draws of ``rand_like(h)`` one after
    the other, number for number (the CPU generator is sequential; checked in tests/models/test_fused_chunk.py),
    so the masks are those of the units one by one, with 3·(K − 1) fewer calls per chunk. Only on the
    CPU in float32/float64 and when every unit has the same probability; CUDA's generator advances per call."""
    if len(steps) < 2 or h.device.type != "cpu" or h.dtype not in (torch.float32, torch.float64):
        return None
    p = steps[0][1]
    if p <= 0.0 or any(st[1] != p for st in steps):
        return None
    return torch.rand((len(steps),) + tuple(h.shape), dtype=h.dtype).ge_(p).mul_(1.0 / (1.0 - p))


class _GCNIIChunk(torch.autograd.Function):
    """A run of ``K ≥ 1`` consecutive ``GCNIILayer`` units (ReLU, no bias) on one pipeline chunk as one
    autograd node (one node per stage and chunk for the run instead of one per unit, and no autograd
    bookkeeping between the units).

    Forward, unit ``k = 1 … K`` in turn, as the plain path (the same ATen ops on the same values, in the same
    order, so the same dropout draws): ``x = dropout(h)`` (the mask as :func:`gnnpipe.models.base.dropout` draws
    it), written straight into history by ``rows_k.push`` (``H_in[R_c] ← x``, then ``Â[R_c, :] @ H_in``);
    ``s = lerp(Â x, h0, α)``; ``h ← relu((1 − θ_k)·s + θ_k·s·W_kᵀ)`` (GCNII eq. 5).
    Backward, unit ``k = K … 1`` by hand (the vector–Jacobian products autograd would take, fused where one
    call does two): ``g_z = g ⊙ [h_k > 0]``; ``∂W_k = θ_k·g_zᵀ s``; ``g_s = (1 − θ_k)·g_z + θ_k·g_z W_k``;
    ``∂h0 += α·g_s`` (summed over the run); ``g ← mask ⊙ rows_k.pull(g_s, scale=1 − α)`` — the pull writes
    ``(1 − α)·g_s`` into ``G_out`` and returns ``Âᵀ[R_c, :] @ G_out`` (the chunk op's pull-based backward).

    Args (to ``apply``): h ``[n, d]``, h0 ``[n, d]`` (same dtype), ``steps`` = one ``(rows, p, alpha, theta)`` per
    unit (``rows``: the unit's ``agg.push_pull("gcn")``; ``p``: its dropout probability, 0 outside training),
    then the units' weights ``W_k`` ``[d, d]``. Returns ``[n, d]``, the last unit's output.
    """

    @staticmethod
    def forward(ctx, h, h0, steps, *weights):  # type: ignore[override]
        saved = []
        masks = _run_masks(h, steps)
        for k, ((rows, p, alpha, theta), weight) in enumerate(zip(steps, weights)):
            if masks is not None:
                mask = masks[k]
            else:
                mask = torch.rand_like(h).ge_(p).mul_(1.0 / (1.0 - p)) if p > 0.0 else None
            s = torch.lerp(rows.push(h, mask), h0, alpha)
            h = torch.addmm(s, s, weight.t(), beta=1.0 - theta, alpha=theta).relu_()
            saved += (s, h, mask)
        ctx.save_for_backward(*saved, *weights)
        ctx.steps = steps
        return h

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        saved = ctx.saved_tensors
        steps, need = ctx.steps, ctx.needs_input_grad
        K = len(steps)
        weights = saved[3 * K:]
        grad_w: list = [None] * K
        gh0 = None
        for k in range(K - 1, -1, -1):
            rows, _, alpha, theta = steps[k]
            s, out, mask = saved[3 * k: 3 * k + 3]
            gz = torch.ops.aten.threshold_backward(g, out, 0)
            if need[3 + k]:  # θ·g_zᵀ s in one call (beta = 0: the input, W_k, only gives the shape, and is not read)
                grad_w[k] = torch.addmm(weights[k], gz.t(), s, beta=0.0, alpha=theta)
            gs = torch.addmm(gz, gz, weights[k], beta=1.0 - theta, alpha=theta)
            if need[1]:
                gh0 = gs * alpha if gh0 is None else gh0.add_(gs, alpha=alpha)
            g = rows.pull(gs, 1.0 - alpha)
            if mask is not None:
                g.mul_(mask)
        return (g, gh0, None, *grad_w)


class ResConv(LayerUnit):
    """DeeperGCN conv ``Linear(h) + Linear(mean_agg(h))`` (Li et al. 2020), optionally as a *res+* block
    ``h + conv(dropout(act(LayerNorm(h))))`` (pre-activation residual, "res+" ordering)."""

    aggregations = ("mean",)
    param_group = "conv"

    def __init__(self, dim: int, dropout: float, bias: bool, act: str, block: bool):
        super().__init__(dim, dim)
        self.norm = nn.LayerNorm(dim) if block else None
        self.lin_root = nn.Linear(dim, dim, bias=bias)
        self.lin_neigh = nn.Linear(dim, dim, bias=False)
        self.dropout = dropout
        self.act = activation(act)

    def conv(self, h: Tensor, agg: Aggregator) -> Tensor:
        return self.lin_root(h) + self.lin_neigh(agg(h, "mean"))

    def forward(self, h, shared, agg: Aggregator):
        if self.norm is None:
            return self.conv(h, agg), shared
        z = dropout(self.act(self.norm(h)), self.dropout, self.training)
        return h + self.conv(z, agg), shared


# --------------------------------------------------------------------------- models
def _check(num_layers: int, hidden: int, dropout: float):
    if num_layers < 1:
        raise ConfigError(f"num_layers must be >= 1, got {num_layers}")
    if hidden < 1:
        raise ConfigError(f"hidden must be >= 1, got {hidden}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {dropout}")


@register("gcn")
class GCN(GNNModel):
    """Deep GCN: encoder ``act(Linear(F→H))``, ``L`` × ``GCNLayer``, head ``Linear(H→C)``.

    Args:
        in_channels, out_channels: ``F`` input features, ``C`` classes.
        num_layers: ``L`` GNN layers. hidden: ``H``. dropout: probability.
        bias: bias of the GNN layers (the GNNPipe paper: off).
        activation: name in ``gnnpipe.models.base.ACTIVATIONS``.
    """

    def __init__(self, in_channels, out_channels, *, num_layers=4, hidden=64, dropout=0.5, bias=False,
                 activation="relu"):
        _check(num_layers, hidden, dropout)
        units = [Encoder(in_channels, hidden, dropout, activation)]
        units += [GCNLayer(hidden, dropout, bias, activation) for _ in range(num_layers)]
        units.append(Head(hidden, out_channels))
        super().__init__(units)


@register("graphsage")
class GraphSAGE(GNNModel):
    """Deep GraphSAGE-mean: encoder, ``L`` × ``SAGELayer``, head ``Linear(H→C)``."""

    def __init__(self, in_channels, out_channels, *, num_layers=4, hidden=64, dropout=0.5, bias=False,
                 activation="relu"):
        _check(num_layers, hidden, dropout)
        units = [Encoder(in_channels, hidden, dropout, activation)]
        units += [SAGELayer(hidden, dropout, bias, activation) for _ in range(num_layers)]
        units.append(Head(hidden, out_channels))
        super().__init__(units)


@register("gcnii")
class GCNII(GNNModel):
    """GCNII (Chen et al., ICML 2020): ``h0 = act(Linear(dropout(x)))``; ``L`` × ``GCNIILayer``
    (ℓ = 1…L); head ``Linear(dropout(h))``. Shared tensor: ``h0``.

    Options (``--model-arg``): ``alpha`` (α ∈ [0, 1], default 0.1), ``lamda`` (λ > 0, default 0.5; spelt
    as in the authors' code). Defaults of the training hyper-parameters follow the GCNII paper's Cora
    settings (lr 0.01, dropout 0.6, weight decay 0.01 on the GCNII layers and 5e-4 on the dense layers;
    the paper uses λ = 0.6 on CiteSeer and 0.4 on PubMed).

    Raises:
        ConfigError: ``alpha`` outside [0, 1] or ``lamda`` ≤ 0 (and bad sizes).
    """

    shared_tensor = "h0"
    default_hparams = {"lr": 0.01, "dropout": 0.6, "weight_decay": 5e-4, "weight_decay_conv": 0.01}
    option_help = {
        "alpha": "initial-residual weight α in [0, 1] (GCNII eq. 5)",
        "lamda": "λ > 0 of the identity-mapping strength θ_ℓ = ln(λ/ℓ + 1) (GCNII eq. 5; "
                 "the paper: 0.5 Cora, 0.6 CiteSeer, 0.4 PubMed)",
    }

    def __init__(self, in_channels, out_channels, *, num_layers=16, hidden=64, dropout=0.6, bias=False,
                 activation="relu", alpha=0.1, lamda=0.5):
        _check(num_layers, hidden, dropout)
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"GCNII alpha must be in [0, 1], got {alpha}")
        if not lamda > 0.0 or not math.isfinite(lamda):
            raise ConfigError(f"GCNII lamda must be a finite number > 0, got {lamda}")
        units = [Encoder(in_channels, hidden, dropout, activation, shared=True)]
        units += [GCNIILayer(hidden, l, dropout, alpha, lamda, bias, activation) for l in range(1, num_layers + 1)]
        units.append(Head(hidden, out_channels, dropout))
        super().__init__(units)


@register("resgcn+")
class ResGCNPlus(GNNModel):
    """DeeperGCN ResGCN+ (Li et al., arXiv 2006.07739, "res+" blocks): encoder ``Linear(F→H)``, a plain
    conv, ``L − 1`` blocks ``LayerNorm → act → Dropout → conv → + shortcut``, head
    ``LayerNorm → act → Dropout → Linear(H→C)``; conv(h) = ``Linear(h) + Linear(mean_agg(h))``."""

    def __init__(self, in_channels, out_channels, *, num_layers=4, hidden=64, dropout=0.5, bias=False,
                 activation="relu"):
        _check(num_layers, hidden, dropout)
        units = [Encoder(in_channels, hidden, 0.0, act=None)]
        units.append(ResConv(hidden, dropout, bias, activation, block=False))
        units += [ResConv(hidden, dropout, bias, activation, block=True) for _ in range(num_layers - 1)]
        units.append(Head(hidden, out_channels, dropout, norm=True, act=activation))
        super().__init__(units)
