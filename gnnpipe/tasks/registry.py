"""The task registry (``register(name)``, ``get(name)``, ``available()``) and :func:`for_config`, which picks
the kind of work a configuration is."""

from __future__ import annotations

from ..errors import ConfigError
from ..registry import Registry
from .base import Task

TASKS: Registry = Registry("task", base=Task)
register = TASKS.register
get = TASKS.get
available = TASKS.available


def for_config(config) -> Task:
    """The registered task that claims ``config`` (the first that does, by name; node classification, which
    claims everything, is asked last).

    Raises:
        ConfigError: no task claims it.
    """
    names = sorted(available(), key=lambda n: n == "node-classification")
    for name in names:
        if get(name).claims(config):
            return get(name)()
    raise ConfigError(f"no kind of work takes this configuration (dataset {getattr(config, 'dataset', None)!r}, "
                      f"model {getattr(config, 'model', None)!r}); known: {', '.join(names)}")

