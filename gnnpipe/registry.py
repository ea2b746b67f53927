"""A tiny name → class registry shared by every component family.

Each family (models, partitioners, layer partitioners, schedulers, correctors) owns one
:class:`Registry`. Built-ins register through exactly the same door as user code::

    from gnnpipe import schedulers

    @schedulers.register("my-schedule")
    class MySchedule(schedulers.ChunkScheduler):
        ...

    schedulers.get("my-schedule")   # -> MySchedule
    schedulers.available()          # -> [..., 'my-schedule']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .errors import ConfigError, UnknownComponentError

T = TypeVar("T")

#: every Registry made so far (one per component family), for :func:`registered_from`
_REGISTRIES: list[Registry] = []


def registered_from(module: str) -> list[str]:
    """``"<family> '<name>'"`` of every registered component defined in ``module`` (e.g. ``"__main__"``,
    which local ranks started by ``spawn`` cannot always re-import)."""
    return [f"{r.family} {name!r}" for r in _REGISTRIES for name, obj in sorted(r._items.items())
            if getattr(obj, "__module__", None) == module]


class Registry(Generic[T]):
    """Maps names to component classes (or factories) of one family.

    Args:
        family: human-readable family name used in error messages (e.g. ``"scheduler"``).
        base: optional base class every registered class must subclass.
    """

    def __init__(self, family: str, base: type | None = None):
        self.family = family
        self.base = base
        self._items: dict[str, T] = {}
        _REGISTRIES.append(self)

    def register(self, name: str, *, overwrite: bool = False) -> Callable[[T], T]:
        """Class decorator registering the decorated class under ``name``.

        Raises:
            ConfigError: ``name`` is already taken (pass ``overwrite=True`` to replace it), or the
                class does not subclass the family's base class.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a {self.family} name must be a non-empty string, got {name!r}")

        def deco(obj: T) -> T:
            if self.base is not None and isinstance(obj, type) and not issubclass(obj, self.base):
                raise ConfigError(
                    f"cannot register {obj!r} as a {self.family}: it must subclass {self.base.__name__}"
                )
            if name in self._items and not overwrite and self._items[name] is not obj:
                raise ConfigError(
                    f"a {self.family} named {name!r} is already registered; pick another name "
                    f"or pass overwrite=True"
                )
            self._items[name] = obj
            try:
                obj.registry_name = name  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            return obj

        return deco

    def get(self, name: str) -> T:
        """Return the component registered under ``name``.

        Raises:
            UnknownComponentError: no such name; the message lists :meth:`available`.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise UnknownComponentError(
                f"unknown {self.family} {name!r}; available: {', '.join(self.available()) or '(none)'}"
            ) from None

    def available(self) -> list[str]:
        """Sorted names of every registered component."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {self.available()})"
