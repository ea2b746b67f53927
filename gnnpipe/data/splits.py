"""Train/val/test masks: the per-class random split and picking one column of a split matrix.

The random split is the protocol of Shchur, Mumme, Bojchevski & Günnemann, *Pitfalls of Graph Neural
Network Evaluation* (R2L @ NeurIPS 2018, arXiv:1811.05868, §4): per class, 20 labelled vertices for
training and 30 for validation, every other labelled vertex for testing.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError

#: Multiplier that folds ``split`` into the seed of a random split (``seed + _SPLIT_STRIDE * split``).
_SPLIT_STRIDE = 1_000_003


def split_seed(seed: int, split: int) -> int:
    """The generator seed of random split number ``split`` for base ``seed`` (``split=0`` gives ``seed``)."""
    return int(seed) + _SPLIT_STRIDE * int(split)


def random_split(
    y: Tensor,
    train_per_class: int = 20,
    val_per_class: int = 30,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-class random split (Shchur et al. 2018): ``train_per_class`` + ``val_per_class`` per class, rest test.

    Only *labelled* vertices (``y >= 0``) are placed in a mask; unlabelled vertices (e.g. ``y == -1``)
    are in none. A class with fewer than ``train_per_class + val_per_class`` vertices gives up to
    ``train_per_class`` to training, then up to ``val_per_class`` to validation, and has no test vertex
    if none is left. Deterministic for ``seed`` (a CPU ``torch.Generator``; independent of the
    global RNG).

    Args:
        y: ``LongTensor[N]`` class labels.
        train_per_class: training vertices per class (``>= 1``).
        val_per_class: validation vertices per class (``>= 0``).
        seed: generator seed.

    Returns:
        ``(train_mask, val_mask, test_mask)``, each ``BoolTensor[N]``, pairwise disjoint.

    Raises:
        ConfigError: negative counts or ``train_per_class < 1``.
    """
    if train_per_class < 1 or val_per_class < 0:
        raise ConfigError(
            f"random split needs train_per_class >= 1 and val_per_class >= 0, got {train_per_class} and "
            f"{val_per_class}; pass non-negative counts (the Shchur et al. protocol is 20 and 30)"
        )
    y = y.view(-1).long()
    n = y.numel()
    gen = torch.Generator().manual_seed(int(seed))
    # One random permutation, then a stable sort by class: each class's vertices in random order.
    perm = torch.randperm(n, generator=gen)
    labelled = perm[y[perm] >= 0]
    order = labelled[torch.sort(y[labelled], stable=True).indices]
    cls = y[order]
    # Rank of each vertex within its class block.
    counts = torch.bincount(cls) if cls.numel() else torch.zeros(0, dtype=torch.long)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel()) - starts[cls]
    train_mask = torch.zeros(n, dtype=torch.bool)
    val_mask = torch.zeros(n, dtype=torch.bool)
    test_mask = torch.zeros(n, dtype=torch.bool)
    train_mask[order[rank < train_per_class]] = True
    val_mask[order[(rank >= train_per_class) & (rank < train_per_class + val_per_class)]] = True
    test_mask[order[rank >= train_per_class + val_per_class]] = True
    return train_mask, val_mask, test_mask


def select_split(mask: Tensor, split: int, *, what: str = "mask", dataset: str = "the dataset") -> Tensor:
    """Column ``split`` of an ``[N, k]`` split matrix, or a 1-D mask itself (then ``split`` must be 0).

    Raises:
        ConfigError: ``split`` outside ``[0, k)``; the message names ``k``.
    """
    if mask.dim() == 2:
        k = mask.size(1)
        if not 0 <= split < k:
            raise ConfigError(
                f"{dataset} has {k} predefined splits ({what} is [N, {k}]), split={split} is out of range; "
                f"pass split=0..{k - 1}"
            )
        return mask[:, split].contiguous()
    if split != 0:
        raise ConfigError(
            f"{dataset} has a single predefined split ({what} is 1-D), split={split} is out of range; "
            "pass split=0"
        )
    return mask
