"""Run files: one TOML holding every ``gnnpipe train`` flag, and the resolved configuration every run writes.

``gnnpipe train --config run.toml [flags]`` reads the file's settings as if they were given first on the command
line, so flags given after override them. A key is a flag's name with ``-`` or ``_`` (``weight-decay``,
``weight_decay``, ``gp-size``) or its field name (``graph_parallel_group_size``); switches take ``true`` /
``false``; repeatable flags (``--val-dataset``, ``--model-arg``) take arrays (``model_args`` also a table)::

    model = "dimenet++"
    dataset = "train.lmdb"
    val_datasets = ["val_id.lmdb", "val_ood_ads.lmdb"]
    max-steps = 20000
    eval-every-steps = 1000
    gp-size = 2
    out = "run.json"

    [model_args]
    num_spherical = 7

Every run writes its resolved configuration (every field of :class:`~gnnpipe.core.settings.config.TrainConfig`
after the kind of work filled in its defaults, with file paths made absolute) beside its result
(``<out stem>.config.toml``) and in its checkpoint folder (``config.toml``): ``gnnpipe train --config`` of that file
repeats the run.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
from pathlib import Path
from typing import Any

import attrs
import tomllib

from ...errors import ConfigError
from .config import TrainConfig

__all__ = ["expand_config_flag", "run_file_path", "write_run_file"]

#: short names of settings whose field name is long (the flag's name)
_ALIASES = {"gp_size": "graph_parallel_group_size", "gp_partitioner": "graph_parallel_partitioner",
            "gp_mode": "graph_parallel_mode", "val_dataset": "val_datasets", "model_arg": "model_args",
            "timeout": "timeout_s"}
#: fields holding a path, made absolute in a written run file (so it repeats from any folder)
_PATHS = ("dataset", "root", "test_dataset", "energy_reference")


def _field_defaults() -> dict:
    return {f.name: (f.default.factory() if isinstance(f.default, attrs.Factory) else f.default)
            for f in attrs.fields(TrainConfig)}


_DEFAULTS = _field_defaults()


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out = {}
    for a in parser._actions:
        if not a.option_strings or a.dest in (argparse.SUPPRESS, "help", "config"):
            continue
        out.setdefault(a.dest, a)
        for opt in a.option_strings:
            out.setdefault(opt.lstrip("-").replace("-", "_"), a)
    return out


def _flags_of(path: Path, table: dict, parser: argparse.ArgumentParser) -> list[str]:
    """The command-line words of a run file's settings."""
    actions = _actions(parser)
    argv: list[str] = []
    for key, value in table.items():
        k = str(key).replace("-", "_")
        k = _ALIASES.get(k, k)
        action = actions.get(k)
        if action is None and k in _DEFAULTS:  # a field without a flag: only its default can be repeated
            if value == _DEFAULTS[k] or k == "task":
                continue
            raise ConfigError(f"{path}: {key} = {value!r} has no gnnpipe train flag; remove it (its default is "
                              f"{_DEFAULTS[k]!r})")
        if action is None:
            close = difflib.get_close_matches(k, sorted({a.dest for a in actions.values()}), n=1)
            raise ConfigError(f"{path}: unknown setting {key!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                              + " (settings are gnnpipe train's flags: gnnpipe train --help)")
        opt = max((o for o in action.option_strings if o.startswith("--")), key=len)
        if isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: {key} takes true or false, got {value!r}")
            argv.append(action.option_strings[0] if value else f"--no-{action.option_strings[0][2:]}")
        elif action.nargs == 0:  # store_true / store_false
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: {key} takes true or false, got {value!r}")
            if value == bool(action.const):
                argv.append(opt)
        elif isinstance(action, argparse._AppendAction):
            if isinstance(value, dict):  # model_args as a table
                value = [f"{a}={_word(v)}" for a, v in value.items()]
            for v in value if isinstance(value, list) else [value]:
                argv += [opt, _word(v)]
        else:
            if isinstance(value, (dict, list)) and k != "correctors":
                raise ConfigError(f"{path}: {key} takes one value, got {value!r}")
            argv += [opt, ",".join(map(str, value)) if isinstance(value, list) else _word(value)]
    return argv


def _word(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def expand_config_flag(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` of ``gnnpipe train`` with ``--config FILE`` replaced by the file's settings, placed first (the flags
    given on the command line come after them, so they override).

    Raises:
        ConfigError: a missing or malformed file, an unknown setting, a value of the wrong kind.
    """
    words = list(argv)
    for i, w in enumerate(words):
        if w == "--config" or w.startswith("--config="):
            path = w.split("=", 1)[1] if "=" in w else (words[i + 1] if i + 1 < len(words) else None)
            if path is None:
                raise ConfigError("--config needs a file: --config run.toml")
            rest = words[:i] + words[i + (1 if "=" in w else 2):]
            p = Path(path).expanduser()
            if not p.is_file():
                raise ConfigError(f"--config {path}: no such run file")
            try:
                table = tomllib.loads(p.read_text())
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"--config {path}: not a TOML file ({exc})") from None
            head = rest[:1] if rest[:1] == ["train"] else []
            return head + _flags_of(p, table, parser) + rest[len(head):]
    return words


def run_file_path(out: str | Path) -> Path:
    """Where the run file of a result written to ``out`` goes: ``<out stem>.config.toml`` beside it."""
    out = Path(out)
    return out.with_name(out.name.rsplit(".", 1)[0] + ".config.toml")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def write_run_file(config: dict, path: str | Path, *, options: dict | None = None) -> Path:
    """Write the resolved configuration ``config`` (``TrainConfig.to_dict()``) and the run ``options`` that shape it
    (``keep``, ``checkpoint_every``, …; not where results go) as a run file ``path`` (module docstring)."""
    path = Path(path)
    lines = ["# the resolved configuration of a gnnpipe train run: gnnpipe train --config THIS_FILE repeats it", ""]
    tables = {}
    for k, v in {**config, **(options or {})}.items():
        if v is None or k == "task":
            continue
        if isinstance(v, dict):
            tables[k] = v
            continue
        if k in _PATHS and isinstance(v, str) and (Path(v).expanduser().exists()):
            v = str(Path(v).expanduser().resolve())
        if k == "val_datasets":
            v = [str(Path(x).expanduser().resolve()) if Path(x).expanduser().exists() else x for x in v]
            if not v:
                continue
        lines.append(f"{k} = {_toml_value(v)}")
    for name, table in tables.items():
        if not table:
            continue
        lines += ["", f"[{name}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
