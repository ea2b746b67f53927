"""The corrector registry."""

from ..registry import Registry
from .base import Corrector

CORRECTORS: Registry = Registry("corrector", base=Corrector)
register = CORRECTORS.register
get = CORRECTORS.get
available = CORRECTORS.available
