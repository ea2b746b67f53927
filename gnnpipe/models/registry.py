"""The model registry (``gnnpipe.models.register / get / available``)."""

from __future__ import annotations

from ..registry import Registry
from .base import GNNModel

MODELS: Registry = Registry("model", base=GNNModel)
register = MODELS.register
get = MODELS.get
available = MODELS.available
