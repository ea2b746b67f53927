"""A synthetic stand-in for large real graphs: power-law degrees, tunable homophily, class features.

Degree-corrected stochastic block model drawn the Chung-Lu way:

* Chung & Lu, *Connected components in random graphs with given expected degree sequences*,
  Annals of Combinatorics 6, 2002: edge endpoints drawn in proportion to per-vertex weights, so the
  expected degree of a vertex is proportional to its weight;
* Karrer & Newman, *Stochastic blockmodels and community structure in networks*, Phys. Rev. E 83,
  2011: the degree-corrected SBM, here with one "within-class" block mixed into a background;
* power-law weights (exponent ``gamma``) as in real social/citation graphs (Barabási & Albert,
  Science 1999; Clauset, Shalizi & Newman, SIAM Review 2009), capped at ``10·sqrt(N)`` so that no
  vertex is expected to touch more than a bounded share of the graph (the structural cutoff of
  Boguñá, Pastor-Satorras & Vespignani, EPJ B 38, 2004, is ``sqrt(<k> N)``).

Unlike PyG's ``FakeDataset`` (near-uniform degrees) or ``StochasticBlockModelDataset`` (Poisson
degrees), the graph has hubs, so graph partitioners and communication measurements see realistic skew.
"""

from __future__ import annotations

import math

import torch
from torch_geometric.data import Data
from torch_geometric.utils import remove_self_loops, to_undirected

from ..errors import ConfigError
from .splits import random_split


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def synthetic_graph(
    num_nodes: int = 2000,
    avg_degree: float = 10.0,
    num_classes: int = 5,
    num_features: int = 32,
    homophily: float = 0.85,
    gamma: float = 2.2,
    noise: float = 1.0,
    train_per_class: int = 20,
    val_per_class: int = 30,
    seed: int = 0,
) -> Data:
    """Draw a power-law, homophilous node-classification graph (deterministic for ``seed``).

    Recipe (a degree-corrected SBM drawn the Chung-Lu way, see the module docstring):

    1. label ``y_v`` uniform over ``num_classes``;
    2. Chung-Lu weight ``w_v = U^(-1/(gamma-1))`` (inverse CDF of a Pareto with tail exponent
       ``gamma`` for the degree distribution, ``w >= 1``), capped at ``10·sqrt(N)``;
    3. ``M = round(N · avg_degree / 2)`` edges, both endpoints drawn with replacement in proportion to
       ``w`` (inverse-CDF sampling: cumulative weights + ``searchsorted``);
    4. for a fraction ``homophily`` of the edges (a Bernoulli draw per edge) the destination is redrawn
       within the source's class, still in proportion to ``w`` (cumulative weights of the
       class-sorted vertices + ``searchsorted`` inside the class's range);
    5. drop self-loops, make undirected, remove duplicate edges (``to_undirected`` coalesces);
    6. features ``x_v = mu_{y_v} + noise · eps_v`` with class centroids ``mu_c ~ N(0, I/F)`` (expected
       norm 1) and ``eps_v ~ N(0, I)``: a noise of ``noise`` per dimension against centroids about
       ``sqrt(2)`` apart, so features alone are weakly informative and neighbourhood aggregation helps.
    7. masks: per-class random split, ``train_per_class`` / ``val_per_class`` / rest (Shchur et al. 2018).

    Edge homophily (fraction of edges joining equal labels) comes out near
    ``homophily + (1 - homophily) · sum_c (W_c / W)^2`` (≈ ``homophily + (1 - homophily) / C`` for
    balanced classes) before deduplication; duplicates collapse more among within-class hub pairs, so
    the final value is a little lower. The mean degree is a little below ``avg_degree`` because of
    dropped self-loops and duplicates (ask for ~1.17x the target mean at large ``avg_degree``).

    Defaults give a graph that deep GNNs learn well but not perfectly: features alone are weakly
    informative (``noise = 1``), and 85 % of the edges are drawn within a class, so aggregation over
    neighbourhoods is what lifts the accuracy far above the majority class (chance: ``1/C``).

    Args:
        num_nodes: ``N >= num_classes``.
        avg_degree: requested mean (undirected) degree before deduplication, ``> 0``.
        num_classes: ``C >= 1``.
        num_features: ``F >= 1``.
        homophily: fraction in ``[0, 1]`` of edges whose destination is redrawn within the source's class.
        gamma: power-law exponent of the expected degree distribution, ``> 1`` (2 < gamma <= 3 is the
            real-world range).
        noise: per-dimension feature noise standard deviation, ``>= 0``.
        train_per_class, val_per_class: split sizes per class; every other vertex is a test vertex.
        seed: seed of a private ``torch.Generator``; the global RNG is not touched.

    Returns:
        ``Data`` with ``x`` (float32 ``[N, F]``), ``y`` (int64 ``[N]``), ``edge_index`` (int64
        ``[2, E]``, undirected: both directions stored, sorted, no self-loops, no duplicates),
        ``train_mask`` / ``val_mask`` / ``test_mask`` (bool ``[N]``), and ``name == "synthetic"``.

    Raises:
        ConfigError: a parameter outside the ranges above.
    """
    _check(int(num_classes) >= 1, f"num_classes must be >= 1, got {num_classes}; pass a positive class count")
    _check(
        int(num_nodes) >= int(num_classes),
        f"num_nodes ({num_nodes}) must be >= num_classes ({num_classes}); pass more nodes or fewer classes",
    )
    _check(int(num_features) >= 1, f"num_features must be >= 1, got {num_features}; pass a positive width")
    _check(
        math.isfinite(avg_degree) and avg_degree > 0,
        f"avg_degree must be a positive number, got {avg_degree}; pass e.g. avg_degree=10",
    )
    _check(
        0.0 <= homophily <= 1.0, f"homophily must be in [0, 1], got {homophily}; pass e.g. homophily=0.85"
    )
    _check(math.isfinite(gamma) and gamma > 1.0, f"gamma must be > 1, got {gamma}; pass e.g. gamma=2.2")
    _check(math.isfinite(noise) and noise >= 0.0, f"noise must be >= 0, got {noise}; pass e.g. noise=1.0")
    n, c, f = int(num_nodes), int(num_classes), int(num_features)
    gen = torch.Generator().manual_seed(int(seed))

    # 1. labels
    y = torch.randint(0, c, (n,), generator=gen)

    # 2. Chung-Lu weights from a Pareto(gamma - 1) tail, capped.
    u = 1.0 - torch.rand(n, generator=gen, dtype=torch.float64)  # (0, 1]
    w = u.pow(-1.0 / (gamma - 1.0)).clamp_(max=10.0 * math.sqrt(n))

    # 3. endpoints in proportion to w (inverse CDF on the cumulative weights)
    m = max(1, round(n * avg_degree / 2.0))
    cum = torch.cumsum(w, 0)
    total = cum[-1]

    def draw(r: torch.Tensor, cumw: torch.Tensor, lo: torch.Tensor | int, hi: torch.Tensor | int) -> torch.Tensor:
        idx = torch.searchsorted(cumw, r, right=True)
        return torch.minimum(torch.maximum(idx, torch.as_tensor(lo)), torch.as_tensor(hi))

    src = draw(torch.rand(m, generator=gen, dtype=torch.float64) * total, cum, 0, n - 1)
    dst = draw(torch.rand(m, generator=gen, dtype=torch.float64) * total, cum, 0, n - 1)

    # 4. homophilous redraw of destinations within the source's class
    redraw = torch.rand(m, generator=gen) < homophily
    if homophily > 0 and bool(redraw.any()):
        order = torch.sort(y, stable=True).indices  # vertices grouped by class
        cum_c = torch.cumsum(w[order], 0)
        counts = torch.bincount(y, minlength=c)
        end = torch.cumsum(counts, 0)  # exclusive end of each class block in `order`
        start = end - counts
        before = torch.cat([torch.zeros(1, dtype=cum_c.dtype), cum_c])[start]  # weight before the block
        block = cum_c[end - 1] - before  # class weight (every class in y has >= 1 vertex)
        s_cls = y[src[redraw]]
        r = before[s_cls] + torch.rand(int(redraw.sum()), generator=gen, dtype=torch.float64) * block[s_cls]
        pos = draw(r, cum_c, start[s_cls], end[s_cls] - 1)
        dst[redraw] = order[pos]

    # 5. simple undirected graph
    edge_index = torch.stack([src, dst]).long()
    edge_index, _ = remove_self_loops(edge_index)
    edge_index = to_undirected(edge_index, num_nodes=n)

    # 6. features
    centroids = torch.randn(c, f, generator=gen) / math.sqrt(f)
    x = centroids[y] + noise * torch.randn(n, f, generator=gen)

    # 7. split (drawn from the same seed; a separate stream so that it does not depend on the sizes above)
    train_mask, val_mask, test_mask = random_split(
        y, train_per_class=train_per_class, val_per_class=val_per_class, seed=int(seed)
    )
    data = Data(
        x=x.float().contiguous(),
        y=y,
        edge_index=edge_index,
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
    )
    data.name = "synthetic"
    return data
