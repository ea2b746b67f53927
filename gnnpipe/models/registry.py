"""The model registry (``gnnpipe.models.register / get / available``)."""

from __future__ import annotations

from ..registry import Registry
from .base import ZooModel

MODELS: Registry = Registry("model", base=ZooModel)
register = MODELS.register
get = MODELS.get
available = MODELS.available
