"""A model's own hyper-parameters ("model options", e.g. GCNII's ``alpha`` and ``lamda``).

Every registered model is built as ``cls(in_channels, out_channels, num_layers=…, hidden=…, dropout=…,
bias=…, activation=…, **options)``. Its *options* are the other keyword parameters of its
``__init__`` that have a default: they are read from the signature, so a user model's options work
on the command line (``--model-arg name=value``), in study files (``model_args``) and in
``TrainConfig.model_args`` without being declared anywhere else. A model may describe them in a
class attribute ``option_help = {"name": "what it does"}``.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .registry import get

#: constructor arguments every model takes; set by their own TrainConfig fields, not as options
COMMON_ARGS = ("in_channels", "out_channels", "num_layers", "hidden", "dropout", "bias", "activation")


@dataclass(frozen=True)
class ModelOption:
    """One model option: its name, default (its type is the option's type) and description."""

    name: str
    default: Any
    help: str = ""

    @property
    def type_name(self) -> str:
        return _kind(self.default)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "any"


def model_options(name_or_cls: Any) -> dict[str, ModelOption]:
    """The options of a registered model (by name) or model class, in signature order.

    Raises:
        UnknownComponentError: unknown model name (lists the available ones).
    """
    cls = get(name_or_cls) if isinstance(name_or_cls, str) else name_or_cls
    helps = getattr(cls, "option_help", {}) or {}
    out: dict[str, ModelOption] = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name == "self" or p.name in COMMON_ARGS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            continue
        out[p.name] = ModelOption(p.name, p.default, helps.get(p.name, ""))
    return out


def accepts_any_option(name_or_cls: Any) -> bool:
    """Whether the model's constructor takes ``**kwargs`` (then names beyond its listed options are passed on
    unchecked: the model itself decides)."""
    cls = get(name_or_cls) if isinstance(name_or_cls, str) else name_or_cls
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())


def describe_options(name: str) -> str:
    """``"alpha=0.1, lamda=0.5"`` (the options with their defaults), or ``"(none)"``."""
    opts = model_options(name)
    return ", ".join(f"{o.name}={o.default!r}" for o in opts.values()) or "(none)"


def _unknown(model: str, key: str, opts: dict[str, ModelOption]) -> ConfigError:
    close = difflib.get_close_matches(key, list(opts), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    valid = ", ".join(f"{o.name} (default {o.default!r})" for o in opts.values()) or "none"
    return ConfigError(f"model {model!r} has no option {key!r}{hint}; its options: {valid} "
                       f"(`gnnpipe models` lists every model's options)")


def _coerce(model: str, opt: ModelOption, value: Any) -> Any:
    kind = opt.type_name
    bad = ConfigError(f"model {model!r} option {opt.name} must be {'a' if kind != 'int' else 'an'} {kind} "
                      f"(like its default {opt.default!r}), got {value!r}")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.strip().lower() in ("true", "1", "yes", "on")
        raise bad
    if kind == "int":
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise bad from None
        raise bad
    if kind == "float":
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if kind == "str":
        if isinstance(value, str):
            return value
        raise bad
    return value


def _guess(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    low = value.strip().lower()
    return True if low == "true" else False if low == "false" else value


def check_model_args(model: str, args: dict, *, coerce: bool = False) -> dict:
    """Check ``args`` (``{option: value}``) against the options of ``model``; return them (typed).

    Values must have the type of the option's default (an ``int`` is accepted for a ``float``); a model
    whose constructor takes ``**kwargs`` also receives names it does not list. With
    ``coerce=True`` strings are converted too (``"0.6"`` → ``0.6``, ``"true"`` → ``True``), as given on
    the command line.

    Raises:
        ConfigError: an unknown option (the message lists the model's options with their defaults), or a
            value of the wrong type. UnknownComponentError: unknown model.
    """
    if not isinstance(args, dict):
        raise ConfigError(f"model_args must be a dict {{option: value}}, got {type(args).__name__}")
    opts = model_options(model)
    out = {}
    for key, value in args.items():
        if isinstance(key, str) and key not in opts and accepts_any_option(model):
            out[key] = _guess(value) if coerce else value
            continue
        if not isinstance(key, str) or key not in opts:
            raise _unknown(model, str(key), opts)
        if isinstance(value, str) and not coerce and opts[key].type_name not in ("str", "any"):
            raise ConfigError(f"model {model!r} option {key} must be a {opts[key].type_name} (like its default "
                              f"{opts[key].default!r}), got the string {value!r}")
        out[key] = _coerce(model, opts[key], value)
    return out


def parse_model_args(model: str, items: Iterable[str] | str | None) -> dict:
    """Parse ``["alpha=0.1", "lamda=0.6"]`` (or ``"alpha=0.1,lamda=0.6"``) into typed model options.

    Raises:
        ConfigError: an item without ``=``, an unknown option (lists the valid ones), a bad value.
    """
    if items is None:
        return {}
    if isinstance(items, str):
        items = [items]
    raw: dict[str, str] = {}
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                continue
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"model option {part!r} must be written name=value, e.g. --model-arg alpha=0.1 "
                                  f"(options of {model!r}: {describe_options(model)})")
            raw[key.strip()] = value.strip()
    return check_model_args(model, raw, coerce=True)


def format_model_args(args: dict) -> str:
    """``"alpha=0.1,lamda=0.6"`` (sorted by name): the command-line / study-file form of ``args``."""
    return ",".join(f"{k}={'true' if v is True else 'false' if v is False else v}" for k, v in sorted(args.items()))
