"""The rank grid: every layout's ranks as one row-major grid of named axes, and the process groups along them.

A layout of ``R`` ranks is a grid whose axes, outermost first, are its kinds of parallelism; global rank ``r`` is
the row-major index of its coordinates (as ``numpy.arange(R).reshape(sizes)``)::

    node classification   RankGrid.of(way=W, stage=S)               r = way·S + stage
    S2EF                  RankGrid.of(replica=D, stage=S, gp=G)     r = (replica·S + stage)·G + gp

    S2EF, D = 2, S = 2, G = 2:        stage 0      stage 1
                          replica 0:  [0  1]       [2  3]      ← each [..] a graph-parallel group (axis gp)
                          replica 1:  [4  5]       [6  7]
                          a stage's gradient group (axes replica, gp): {0, 1, 4, 5} and {2, 3, 6, 7}

The ranks that differ from ``r`` only along some axes form ``r``'s group along those axes
(:meth:`RankGrid.members`); :meth:`RankGrid.new_group` creates every such group of the grid, in one order on every
rank (``torch.distributed.new_group`` must be called by all ranks for every group), and returns ``r``'s. This is
the one place where layouts build process groups (fairchem's ``gp_utils.setup_graph_parallel_groups`` builds its
groups the same way, from one reshape of the world).
"""

from __future__ import annotations

import itertools

import attrs
import torch.distributed as dist

from ..errors import ConfigError


@attrs.frozen
class RankGrid:
    """Ranks as a row-major grid of named axes (see the module docstring).

    Attributes:
        axes: ``((name, size), …)``, outermost first; every size ≥ 1.

    Raises:
        ConfigError: a size below 1 or a repeated axis name.
    """

    axes: tuple

    def __attrs_post_init__(self) -> None:
        names = [n for n, _ in self.axes]
        if len(set(names)) != len(names):
            raise ConfigError(f"a rank grid names each axis once, got {names}")
        bad = [f"{n}={s}" for n, s in self.axes if not isinstance(s, int) or s < 1]
        if bad:
            raise ConfigError(f"every axis of a rank grid has at least one rank, got {', '.join(bad)}")

    @classmethod
    def of(cls, **sizes: int) -> RankGrid:
        """The grid with the axes ``sizes`` in keyword order (outermost first)."""
        return cls(tuple((k, int(v)) for k, v in sizes.items()))

    @property
    def size(self) -> int:
        """The number of ranks ``R`` (the product of the axis sizes)."""
        n = 1
        for _, s in self.axes:
            n *= s
        return n

    def axis_size(self, name: str) -> int:
        return dict(self.axes)[name]

    def coords(self, rank: int) -> dict[str, int]:
        """``{axis: coordinate}`` of global rank ``rank``.

        Raises:
            ConfigError: ``rank`` outside ``0 … R−1``.
        """
        if not 0 <= int(rank) < self.size:
            raise ConfigError(f"rank {rank} is outside the grid of {self.size} ranks {dict(self.axes)}")
        out, rest = {}, int(rank)
        for name, size in reversed(self.axes):
            rest, out[name] = divmod(rest, size)
        return {n: out[n] for n, _ in self.axes}

    def rank(self, **coords: int) -> int:
        """The global rank at ``coords`` (every axis named)."""
        r = 0
        for name, size in self.axes:
            c = int(coords[name])
            if not 0 <= c < size:
                raise ConfigError(f"coordinate {name}={c} is outside 0 … {size - 1}")
            r = r * size + c
        return r

    def members(self, along: tuple[str, ...], rank: int) -> list[int]:
        """The ranks that differ from ``rank`` only along the axes ``along`` (``rank`` included), ascending."""
        fixed = self.coords(rank)
        free = [(n, s) for n, s in self.axes if n in along]
        out = []
        for values in itertools.product(*(range(s) for _, s in free)):
            out.append(self.rank(**{**fixed, **dict(zip((n for n, _ in free), values))}))
        return sorted(out)

    def groups(self, along: tuple[str, ...]) -> list[list[int]]:
        """Every group along ``along``, in ascending order of their first ranks (the same order on every rank)."""
        seen, out = set(), []
        for r in range(self.size):
            g = self.members(along, r)
            if g[0] not in seen:
                seen.add(g[0])
                out.append(g)
        return out

    def new_group(self, along: tuple[str, ...], rank: int):
        """Create every process group along ``along`` (collective: every rank calls it with the same ``along``) and
        return ``rank``'s; ``None`` where a group would be the whole world (the default group serves), where every
        group has one rank (nothing to communicate), or where no process group is initialised (one process)."""
        if not dist.is_initialized() or self.size == 1 or all(s == 1 for n, s in self.axes if n in along):
            return None
        groups = self.groups(along)
        if len(groups) == 1:
            return None
        mine: object | None = None
        for g in groups:
            pg = dist.new_group(g)
            if rank in g:
                mine = pg
        return mine


__all__ = ["RankGrid"]
