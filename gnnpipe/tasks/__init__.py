"""Kinds of work (:class:`Task`) behind one runtime: ``register(name)``, ``get(name)``, ``available()``,
:func:`for_config`.

A kind of work is one module here with one registered :class:`Task` subclass (its data, loss, metrics,
models and what the planner needs of it); the runtime in ``gnnpipe.core`` is shared. Built in:
``"s2ef"`` (``gnnpipe.tasks.s2ef``: structures to energy and forces) and ``"node-classification"``
(``gnnpipe.tasks.nodes``), which takes every configuration no other task claims.
"""

from __future__ import annotations

from . import (
    nodes,  # noqa: F401  (registers node-classification)
    s2ef,  # noqa: F401  (registers s2ef)
)
from .base import Task
from .nodes import NodeClassification
from .registry import TASKS, available, for_config, get, register
from .s2ef import S2EF

__all__ = ["TASKS", "NodeClassification", "S2EF", "Task", "available", "for_config", "get", "register"]
