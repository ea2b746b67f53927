"""A kind of work: the interface through which node classification and atomistic S2EF share one runtime.

The runtime (stages, the schedule interpreter, communication, the launcher, checkpoints, results, the epoch
log; :mod:`gnnpipe.core`) knows nothing of what is trained. What belongs to a kind of work — its data and their
validation, the models that serve it, its loss and metrics, what the planner needs of it — sits behind :class:`Task`.
``api.train`` is the same short sequence of named steps for every kind (a new kind is one module in
:mod:`gnnpipe.tasks` with one registered subclass, not a branch in the runtime)::

    task = tasks.for_config(config)        # which kind of work the dataset and the model name
    config = task.resolve(config)          # defaults filled in, names checked
    data = task.load(config, data)         # read, validate (in the training dtype), preprocess
    plan = task.plan(config, data)         # the layout: ranks, what each holds, the predicted memory
    task.check(config, plan, options)      # refuse bad configurations before any process starts
    result = task.launch(config, plan, progress, options)   # run the ranks (or this process) and collect
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Task(ABC):
    """One kind of work (``"node-classification"``, ``"s2ef"``), registered in ``gnnpipe.tasks.TASKS``.

    Subclasses implement each step; ``api.train`` calls them in order. A step raises
    :class:`~gnnpipe.errors.ConfigError` / :class:`~gnnpipe.errors.DataValidationError` with the fix in the
    message; nothing is started or written before :meth:`launch`.
    """

    #: the registry name
    name: str = ""

    @classmethod
    @abstractmethod
    def claims(cls, config: Any) -> bool:
        """Whether ``config`` (its dataset, a file's suffix, or its model) is this kind of work."""

    @abstractmethod
    def resolve(self, config: Any) -> Any:
        """The config with every default filled in and every component name checked."""

    @abstractmethod
    def load(self, config: Any, data: Any | None = None) -> Any:
        """Read (or take ``data``), validate in the dtype training uses, and preprocess."""

    @abstractmethod
    def describe(self, config: Any, data: Any, given: bool = False) -> str:
        """The one line a run starts with: what is trained, on what, in which layout."""

    @abstractmethod
    def plan(self, config: Any, data: Any) -> Any:
        """The layout's plan (ranks, what each rank holds, predicted memory)."""

    @abstractmethod
    def check(self, config: Any, plan: Any, options: Any) -> None:
        """Refuse what cannot run (before any process starts); predictions it makes (memory) go into ``plan``.
        ``options``: the run's ``gnnpipe.core.settings.options.RunOptions`` (``memory_check``)."""

    @abstractmethod
    def launch(self, config: Any, plan: Any, progress: bool, options: Any) -> Any:
        """Run in this process or start the ranks (shared launcher), and collect the
        :class:`~gnnpipe.core.run.results.TrainResult` (``None`` on torchrun ranks other than 0)."""
