"""Exception types raised by gnnpipe.

Every error that a user can cause (bad input data, a bad configuration, an unknown component name)
is raised as a :class:`GnnpipeError` subclass whose message names the problem *and* the fix, so a
user never has to read a stack trace from deep inside torch.
"""

from __future__ import annotations


class GnnpipeError(Exception):
    """Base class of every error gnnpipe raises on purpose."""


class DataValidationError(GnnpipeError, ValueError):
    """The input graph (``torch_geometric.data.Data``) is malformed; the message says how to fix it."""


class ConfigError(GnnpipeError, ValueError):
    """A configuration (sizes, flags, component names) cannot be run; the message says how to fix it."""


class UnknownComponentError(ConfigError, KeyError):
    """A registry was asked for a name it does not hold; the message lists the available names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ScheduleError(GnnpipeError, ValueError):
    """A schedule violates the pipeline's ordering rules, or a simulation deadlocks."""


class TrainingDivergedError(GnnpipeError, RuntimeError):
    """The training loss became NaN or infinite; the run stopped at that epoch (the message names it and the
    likely causes)."""


class DistributedError(GnnpipeError, RuntimeError):
    """A rank of a distributed run failed; the message names the rank and its error."""


class ModelDescriptionError(ConfigError):
    """A model that does not describe its hook calls or activation widths (so the planner cannot cost it)."""

__all__ = [
    "ConfigError",
    "DataValidationError",
    "DistributedError",
    "GnnpipeError",
    "ModelDescriptionError",
    "ScheduleError",
    "TrainingDivergedError",
    "UnknownComponentError",
]
