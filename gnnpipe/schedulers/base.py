"""The :class:`ChunkScheduler` abstract class and the scheduler registry.

A scheduler turns ``(num_stages, chunk_order)`` into a one-epoch :class:`Schedule`. Add one by
subclassing and registering — the built-ins use the same door::

    from gnnpipe import schedulers
    from gnnpipe.schedulers import F, B, STEP, Schedule

    @schedulers.register("all-forward-then-fifo")
    class Fifo(schedulers.ChunkScheduler):
        def build(self, num_stages, chunk_order):
            order = schedulers.check_chunk_order(num_stages, chunk_order)
            rows = [[F(s, c) for c in order] + [B(s, c) for c in order] + [STEP(s)]
                    for s in range(num_stages)]
            return self.schedule_from_orders(num_stages, len(order), rows)
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from ..errors import ConfigError, ScheduleError
from ..registry import Registry
from .ir import Action, Schedule
from .order import ChunkOrder, order_policy
from .validate import validate as _validate


class ChunkScheduler(ABC):
    """Builds the per-stage action lists of one epoch for a given chunk order.

    Class attributes:
        flush: ``True`` if the pipeline drains every epoch and each stage steps once on gradients of
            that epoch only (weights never stale); ``False`` if epochs overlap.
        weight_staleness: declared bound (in weight versions) on how many optimizer steps behind
            synchronous training a forward may run; 0 for flush schedulers. See
            :meth:`staleness_bound` for bounds that depend on the sizes.

    Args:
        stash_weights: ask the runtime to run each chunk's backward on the weights its forward used
            (PipeDream's weight stashing, Narayanan et al. 2019). Only meaningful without flush.
        second_order: emit the ``G`` and ``D`` passes of conservative-force training (S2EF with
            ``F = −∂E/∂pos``) for every chunk; the built-in flush schedulers (gpipe, 1f1b) honour it. A
            scheduler that does not take it cannot drive a conservative-force pipeline.

    Raises:
        ConfigError: ``stash_weights=True`` on a flush scheduler (there is nothing stale to stash).
    """

    flush: ClassVar[bool] = True
    weight_staleness: ClassVar[int] = 0
    stash_weights: bool = False
    second_order: bool = False

    def __init__(self, *, stash_weights: bool = False, second_order: bool = False):
        if stash_weights and self.flush:
            raise ConfigError(
                f"scheduler {self.name!r} flushes every epoch, so its weights are never stale and there is "
                f"nothing to stash; drop stash_weights"
            )
        self.stash_weights = bool(stash_weights)
        self.second_order = bool(second_order)

    @property
    def name(self) -> str:
        """The name this class was registered under (its class name if it was not)."""
        return type(self).__dict__.get("registry_name", type(self).__name__)

    @classmethod
    def describe(cls) -> str:
        """First line of the class docstring (shown by ``gnnpipe schedule list``)."""
        doc = inspect.getdoc(cls) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    @abstractmethod
    def build(self, num_stages: int, chunk_order: Sequence[int]) -> Schedule:
        """Return the schedule of one epoch (actions labelled epoch 0).

        Args:
            num_stages: ``S >= 1``.
            chunk_order: a permutation of ``range(C)``: the order chunks enter stage 0.

        Raises:
            ConfigError: bad sizes or an order that is not a permutation.
        """

    def staleness_bound(self, num_stages: int, num_chunks: int) -> int:
        """Weight-staleness bound for these sizes (default: the class's ``weight_staleness``)."""
        return self.weight_staleness

    def schedule_from_orders(self, num_stages: int, num_chunks: int, orders, *, epochs: int | None = None) -> Schedule:
        """:meth:`Schedule.from_orders` with this scheduler's ``flush``, staleness bound, stash flag and name."""
        return Schedule.from_orders(
            num_stages, num_chunks, orders, epochs=epochs, flush=self.flush,
            weight_staleness=self.staleness_bound(num_stages, num_chunks),
            stash_weights=self.stash_weights, name=self.name,
        )

    def build_epochs(self, num_stages: int, chunk_orders: Sequence[Sequence[int]]) -> Schedule:
        """A schedule over ``len(chunk_orders)`` consecutive epochs, epoch ``e`` using ``chunk_orders[e]``.

        Default: each stage's actions of :meth:`build` for every epoch, concatenated and relabelled
        with their epoch, then placed on the unit grid — with a flush barrier between epochs if
        ``flush``, else free to overlap as the dependencies allow. Schedulers whose epochs
        interleave (async-stale) override this.

        Raises:
            ConfigError: no epochs, or orders of different lengths.
        """
        if not chunk_orders:
            raise ConfigError("build_epochs needs at least one epoch's chunk order")
        sizes = {len(o) for o in chunk_orders}
        if len(sizes) != 1:
            raise ConfigError(f"every epoch needs the same number of chunks, got sizes {sorted(sizes)}")
        C = sizes.pop()
        rows: list[list[Action]] = [[] for _ in range(num_stages)]
        for e, order in enumerate(chunk_orders):
            one = self.build(num_stages, order)
            if one.num_stages != num_stages:
                raise ScheduleError(f"{self.name}.build returned {one.num_stages} stages, expected {num_stages}")
            for s in range(num_stages):
                rows[s].extend(a.with_epoch(e) for a in one.actions(s))
        return self.schedule_from_orders(num_stages, C, rows, epochs=len(chunk_orders))

    def __repr__(self) -> str:
        extra = ((", stash_weights=True" if self.stash_weights else "")
                 + (", second_order=True" if self.second_order else ""))
        return f"{type(self).__name__}({extra.lstrip(', ')})"


SCHEDULERS: Registry = Registry("scheduler", base=ChunkScheduler)
register = SCHEDULERS.register
get = SCHEDULERS.get
available = SCHEDULERS.available


def make_scheduler(name: str | ChunkScheduler, **options) -> ChunkScheduler:
    """Instantiate the scheduler registered as ``name`` with ``options`` (or return an instance as is).

    Raises:
        UnknownComponentError: unknown name. ConfigError: an option the scheduler does not take.
    """
    if isinstance(name, ChunkScheduler):
        if options:
            raise ConfigError("options can only be given with a scheduler name, not an instance")
        return name
    cls = get(name)
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        raise ConfigError(f"scheduler {name!r} does not take options {sorted(options)}: {exc}") from None
    return cls(**options)


def build_schedule(
    scheduler: str | ChunkScheduler,
    num_stages: int,
    num_chunks: int,
    *,
    order: str | ChunkOrder | None = None,
    seed: int = 0,
    epochs: int = 1,
    start_epoch: int = 0,
    validate: bool = True,
    **options,
) -> Schedule:
    """Build (and by default validate) a schedule by scheduler name or instance.

    Args:
        order: chunk-order policy (``"fixed"``, ``"shuffle"`` with ``seed``, or a :class:`ChunkOrder`).
        epochs: ``1`` → :meth:`ChunkScheduler.build`; more → :meth:`ChunkScheduler.build_epochs`.
        start_epoch: the first epoch's index for the order policy.
        **options: scheduler options (e.g. ``stash_weights=True``).

    Raises:
        ConfigError, UnknownComponentError, ScheduleError: bad arguments; an invalid result.
    """
    if not isinstance(num_chunks, int) or num_chunks < 1:
        raise ConfigError(f"num_chunks must be a positive int, got {num_chunks!r}")
    if not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs must be a positive int, got {epochs!r}")
    sch = make_scheduler(scheduler, **options)
    policy = order_policy(order, seed)
    orders = policy.orders(epochs, num_chunks, start=start_epoch)
    out = sch.build(num_stages, orders[0]) if epochs == 1 else sch.build_epochs(num_stages, orders)
    if validate:
        _validate(out)
    return out
