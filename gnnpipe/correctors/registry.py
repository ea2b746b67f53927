"""The corrector registry, and the one parser of a corrector spec (``"t1,t2,t3"``, ``"ema:0.9"``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError
from ..registry import Registry
from .base import Corrector

CORRECTORS: Registry = Registry("corrector", base=Corrector)
register = CORRECTORS.register
get = CORRECTORS.get
available = CORRECTORS.available


def parse_spec(spec) -> list:
    """The list form of a corrector spec: names (with options) and :class:`Corrector` objects, ``none`` dropped.

    Accepts ``None`` (no correctors), a comma-separated string as on the command line (``"t1,t2,t3"``,
    ``"ema:0.9,t3:10"``, ``"none"``) or a sequence of names / objects. Names are stripped; empty names and
    ``"none"`` are dropped. Names are not looked up here (:func:`build_correctors` does that).
    """
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        if isinstance(item, str):
            item = item.strip()
            if not item or item.lower() == "none":
                continue
        out.append(item)
    return out


def build_correctors(spec: Sequence[str | Corrector] | str | None) -> list[Corrector]:
    """Instantiate a corrector spec (see :func:`parse_spec`): names (``"ema"``, ``"ema:0.9"``, ``"t3:10"``) or objects.

    A name may carry one numeric option after a colon (the momentum of ``ema``, the period of ``t3``
    and ``refresh``). ``None``, ``[]`` and ``["none"]`` give no correctors; correctors that declare
    :attr:`Corrector.is_noop` are dropped.

    Raises:
        UnknownComponentError: unknown name (lists the available ones).
        ConfigError: a malformed option.
    """
    out: list[Corrector] = []
    for item in parse_spec(spec):
        if isinstance(item, Corrector):
            out.append(item)
            continue
        name, _, opt = str(item).partition(":")
        cls = get(name.strip().lower())
        if opt:
            try:
                value = float(opt)
            except ValueError:
                raise ConfigError(f"corrector option in {item!r} must be a number, e.g. 'ema:0.9' or 't3:23'") from None
            out.append(cls(value))
        else:
            out.append(cls())
    return [c for c in out if not c.is_noop]
