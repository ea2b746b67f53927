"""Study (grid) files: parse a TOML grid and expand it into runs of ``gnnpipe train``.

A study file is TOML::

    name = "technique-ablation"          # optional; default: the file's stem
    description = "…"                    # optional, shown in the report
    seeds = [0, 1, 2]                    # optional; default [fixed.seed] or [0]
    run_timeout_s = 7200                 # optional; seconds after which one run is killed (failed)

    [fixed]                              # settings shared by every run
    dataset = "squirrel"
    root = "../../shared/data/heterophilous"
    model = "gcnii"
    layers = 32
    correctors = "t1,t2,t3"              # or a list ["t1", "t2", "t3"]; "none" (or []) for none

    [grid]                               # lists: every combination (cartesian product)
    chunks = [8, 16]

    [[variants]]                         # optional named, non-cartesian variants: crossed with [grid]
    name = "all"
    [[variants]]
    name = "no T1"
    correctors = "t2,t3"

    [simulate]                           # optional: cost settings of ``gnnpipe ablate --simulate``
    forward = 1.0                        # (a list here is varied too); see gnnpipe.experiments.simulate
    backward = 2.0

    [report]                             # optional: the report's sweep plot, a metric against a setting
    x = "params"                         # a setting ([grid] key) or "params" (the model's trained parameters)
    y = "force_mae"                      # a metric of gnnpipe.experiments.grid.SWEEP_METRICS
    log_x = true                         # logarithmic x axis (default: true for "params")

Atomistic (S2EF) runs are studied the same way: ``model = "dimenet++"`` (or ``"schnet"``), ``gp_size``
(``--gp-size``; also ``gp_partitioner``, ``gp_mode``), ``stages``, ``ways``, ``batch_size``, ``cutoff``,
``max_neighbors``, ``frames``, ``direct_forces``…, widths in ``hidden`` and ``model_args``.

Keys of ``[fixed]``, ``[grid]`` and ``[[variants]]`` are the :class:`~gnnpipe.core.settings.config.TrainConfig`
field names that ``gnnpipe train`` has a flag for (``dataset``, ``root``, ``model``, ``layers``, ``hidden``,
``ways``, ``stages``, ``chunks``, ``scheduler``, ``correctors``, ``partitioner``, ``layer_split``,
``recompute``, ``epochs``, ``seed``, …; a dash may replace an underscore). Booleans are TOML booleans
(``recompute = true``, ``bias = false``, ``undirected = false``). The model's own options (``gnnpipe
models``) go in ``model_args``, a table: ``model_args = { alpha = 0.1, lamda = 0.6 }`` (in ``[grid]``, a
list of tables); they become ``--model-arg`` flags and are checked against the model.

Runs: for every seed (outermost, so an interrupted study has all variants of the first seed early),
every combination of ``[grid]`` and every variant, one run with the settings
``fixed ∪ grid combination ∪ variant ∪ {seed}``. A key may not be both in ``[fixed]`` and ``[grid]``, nor
in ``[grid]`` and a variant. Variants may override ``[fixed]``.

Run identity: ``run_id`` is a hash of the run's full settings *as written* (normalised: corrector lists as
``"t1,t2,t3"``, ``"none"`` for none), seed included, variant name excluded. Renaming a variant or
moving the study folder keeps ids; changing any setting (also in ``[fixed]``) makes new runs.

Paths: a relative ``root`` is resolved relative to **the folder of the study file** (not the current
directory), so a study runs the same from anywhere; a relative ``dataset`` file path (``.pt``, ``.pth``,
``.npz``, and the structure files ``.extxyz``, ``.xyz``, ``.traj``, ``.db``) is resolved there too when such a file
exists, else passed on as written (``gnnpipe train`` then also looks under ``root``).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs
import tomllib

from ..core.settings.arguments import add_train_arguments, config_from_args
from ..core.settings.config import TrainConfig, check_names
from ..data.atoms import STRUCTURE_SUFFIXES
from ..data.atoms.sets import FORMATS
from ..data.datasets import DATASET_FILE_SUFFIXES
from ..errors import ConfigError
from .simulate import check_sim_settings, fmt_value  # noqa: F401  (fmt_value: also used by report)

#: top-level keys of a study file
TOP_KEYS = ("name", "description", "seeds", "run_timeout_s", "fixed", "grid", "variants", "simulate", "report")

#: short names a study may use for settings whose TrainConfig field name is long (the ``gnnpipe train`` flag's name)
ALIASES = {"gp_size": "graph_parallel_group_size", "gp_partitioner": "graph_parallel_partitioner",
           "gp_mode": "graph_parallel_mode"}
#: the name a report and a variant label show for a setting
DISPLAY = {v: k for k, v in ALIASES.items()}


# ------------------------------------------------------------------------------------------ train flags
@dataclass(frozen=True)
class FlagSpec:
    """How one setting maps onto ``gnnpipe train``'s command line.

    Attributes:
        key: the TrainConfig field name (argparse ``dest``).
        option: the long option (``--weight-decay``).
        kind: ``"value"`` (takes one argument), ``"true"`` (a ``store_true`` switch: given when the
            setting is true), ``"false"`` (a ``store_false`` switch: given when the setting is false) or
            ``"bool"`` (a ``--x/--no-x`` pair: ``--x`` when true, ``--no-x`` when false, given when it
            differs from the default).
        default: the flag's default.
    """

    key: str
    option: str
    kind: str
    default: Any


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit
        raise ConfigError(message)


def _train_parser() -> argparse.ArgumentParser:
    p = _RaisingParser(prog="gnnpipe train", add_help=False, exit_on_error=False)
    add_train_arguments(p)
    return p


_SPECS: dict[str, FlagSpec] | None = None


def train_flag_specs() -> dict[str, FlagSpec]:
    """The settings a study may set: ``{TrainConfig field: FlagSpec}``, read from ``gnnpipe train``'s parser
    (so the two can never disagree)."""
    global _SPECS
    if _SPECS is None:
        fields = {a.name for a in attrs.fields(TrainConfig)}
        specs = {}
        for a in _train_parser()._actions:
            if a.dest not in fields or not a.option_strings:
                continue
            opt = max(a.option_strings, key=len)
            if isinstance(a, argparse.BooleanOptionalAction):
                opt, kind = a.option_strings[0], "bool"
            elif a.nargs == 0:
                kind = "true" if a.const is True else "false"
            else:
                kind = "value"
            specs[a.dest] = FlagSpec(a.dest, opt, kind, a.default)
        _SPECS = specs
    return _SPECS


def _config_fields() -> list[str]:
    return [a.name for a in attrs.fields(TrainConfig)]


def normalize_key(key: str, where: str, path: Any = None) -> str:
    """Map a study key (``weight-decay`` or ``weight_decay``) onto its TrainConfig field name.

    Raises:
        ConfigError: unknown key (suggests the closest known one) or a TrainConfig field that
            ``gnnpipe train`` has no flag for.
    """
    specs = train_flag_specs()
    k = str(key).replace("-", "_")
    if k == "timeout":
        k = "timeout_s"
    k = ALIASES.get(k, k)
    if k in specs:
        return k
    src = f" of {path}" if path else ""
    if k in _config_fields():
        raise ConfigError(f"{where}{src}: setting {key!r} has no `gnnpipe train` flag, so a study cannot vary it "
                          f"(every run goes through `gnnpipe train`); remove it")
    close = difflib.get_close_matches(k, list(specs), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"{where}{src}: unknown setting {key!r}; {hint}settings are gnnpipe train's TrainConfig "
                      f"fields: {', '.join(sorted(specs))}")


def normalize_value(key: str, value: Any, where: str) -> Any:
    """Canonical form of a setting's value (correctors → ``"t1,t2,t3"`` / ``"none"``).

    Raises:
        ConfigError: a value of the wrong kind (a table, a list where one value is expected, a
            non-boolean for a switch).
    """
    spec = train_flag_specs()[key]
    if key == "model_args":
        return _normalize_model_args(value, where)
    if key == "correctors":
        if isinstance(value, (list, tuple)):
            items = [str(v).strip() for v in value]
        elif isinstance(value, str):
            items = [v.strip() for v in value.split(",")]
        else:
            raise ConfigError(f"{where}: correctors must be a comma-separated string or a list of names, got {value!r}")
        items = [v for v in items if v and v != "none"]
        return ",".join(items) if items else "none"
    if isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a single value, got a table {value!r}")
    if isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: {key} must be a single value here, got the list {value!r}; "
                          f"put lists of values to try under [grid]")
    if spec.kind == "bool" and spec.default is None and isinstance(value, str) and value.lower() == "auto":
        return "auto"
    if spec.kind != "value" and not isinstance(value, bool):
        also = ' or "auto"' if spec.kind == "bool" and spec.default is None else ""
        raise ConfigError(f"{where}: {key} is a switch; use true or false{also}, got {value!r}")
    return value


def _normalize_model_args(value: Any, where: str) -> str:
    """``model_args`` as a study writes it (a table ``{lamda = 0.6}``, ``"lamda=0.6,alpha=0.1"`` or a list of
    ``"name=value"``) in its canonical form: ``"alpha=0.1,lamda=0.6"`` (sorted; ``""`` for none). The names
    are checked against the model later, with the run's other flags."""
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if isinstance(v, (dict, list)):
                raise ConfigError(f"{where}: model_args.{k} must be a single value, got {v!r}")
            items.append((str(k), "true" if v is True else "false" if v is False else str(v)))
    elif isinstance(value, (str, list, tuple)):
        parts = value.split(",") if isinstance(value, str) else [str(p) for p in value]
        items = []
        for part in (p.strip() for p in parts):
            if not part:
                continue
            k, eq, v = part.partition("=")
            if not eq or not k.strip():
                raise ConfigError(f"{where}: model_args entry {part!r} must be name=value (e.g. lamda=0.6)")
            items.append((k.strip(), v.strip()))
    else:
        raise ConfigError(f"{where}: model_args must be a table like {{ lamda = 0.6 }}, got {value!r}")
    return ",".join(f"{k}={v}" for k, v in sorted(items))


def to_flags(settings: dict[str, Any]) -> list[str]:
    """The ``gnnpipe train`` arguments for ``settings`` (normalised values; paths already resolved).

    Switches are given only when they differ from the default state (``--bias``/``--no-bias`` likewise); a
    switch whose default is "auto" (``recompute``) is given whenever the value is ``true`` or ``false``.
    """
    specs = train_flag_specs()
    argv: list[str] = []
    for key, value in settings.items():
        spec = specs[key]
        if key == "model_args":
            argv += [a for item in str(value).split(",") if item for a in (spec.option, item)]
        elif spec.kind == "true":
            if value:
                argv.append(spec.option)
        elif spec.kind == "false":
            if not value:
                argv.append(spec.option)
        elif spec.kind == "bool" and spec.default is None:  # three states (--recompute: auto by default)
            if isinstance(value, bool):
                argv.append(spec.option if value else f"--no-{spec.option[2:]}")
        elif spec.kind == "bool":
            if bool(value) != bool(spec.default):
                argv.append(spec.option if value else f"--no-{spec.option[2:]}")
        elif isinstance(value, bool):
            argv += [spec.option, "true" if value else "false"]
        elif isinstance(value, float):
            argv += [spec.option, repr(value)]
        else:
            argv += [spec.option, str(value)]
    return argv


def check_flags(argv: list[str], where: str) -> None:
    """Parse ``argv`` with ``gnnpipe train``'s own parser and build its TrainConfig, and check component
    names against their registries — the checks ``gnnpipe train`` would do first, before any run starts.

    Raises:
        ConfigError, UnknownComponentError: the message names the run (``where``) and the problem.
    """
    try:
        args = _train_parser().parse_args(argv)
    except argparse.ArgumentError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        config = config_from_args(args)
        _check_names(config)
    except ConfigError as exc:
        raise type(exc)(f"{where}: {exc}") from None


def _check_names(config) -> None:
    check_names(config)


# ------------------------------------------------------------------------------------------ study
@dataclass
class Run:
    """One training run of a study.

    Attributes:
        run_id: stable 12-hex-digit id (hash of ``settings``).
        variant: display name: the variant's ``name`` and/or what differs from ``[fixed]`` (seed excluded).
        seed: the run's seed.
        overrides: the settings that differ from ``[fixed]`` (grid values and variant overrides).
        settings: every setting as written in the study (normalised), seed included.
        argv: the ``gnnpipe train`` arguments (paths resolved), without ``--out``/``--no-progress``.
    """

    run_id: str
    variant: str
    seed: int
    overrides: dict[str, Any]
    settings: dict[str, Any]
    argv: list[str]


@dataclass
class Study:
    """A parsed study file (see the module docstring for the format).

    Attributes:
        path: the study file. name, description: from the file.
        fixed: shared settings. grid: ``{key: [values]}``. variants: ``[(name or None, overrides)]``.
        seeds: seeds every variant runs with. run_timeout_s: per-run time limit in seconds (None: none).
        simulate: the ``[simulate]`` table (cost settings of ``--simulate``), values or lists of values.
        report: the ``[report]`` table: ``{"x": …, "y": …, "log_x": bool}`` of the sweep plot (may be empty).
        runs: the expanded runs, in execution order, without duplicates.
    """

    path: Path | None
    name: str
    description: str = ""
    fixed: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list] = field(default_factory=dict)
    variants: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])
    run_timeout_s: float | None = None
    simulate: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)

    @property
    def base_dir(self) -> Path:
        """Folder that relative paths are resolved against (the study file's folder; else the CWD)."""
        return self.path.parent if self.path is not None else Path.cwd()

    def variant_names(self) -> list[str]:
        """Distinct variant names in run order."""
        return list(dict.fromkeys(r.variant for r in self.runs))


def variant_label(name: str | None, overrides: dict[str, Any], grid_keys: list[str]) -> str:
    """``name`` plus the grid values, or — for an unnamed variant — everything that differs from ``[fixed]``.

    ``"fixed"`` when nothing differs.
    """
    if name:
        parts = [name] + [f"{DISPLAY.get(k, k)}={fmt_value(overrides[k])}" for k in grid_keys if k in overrides]
    else:
        parts = [f"{DISPLAY.get(k, k)}={fmt_value(v)}" for k, v in overrides.items()]
    return ", ".join(parts) if parts else "fixed"


def run_id_of(settings: dict[str, Any]) -> str:
    """Stable id of a run: the first 12 hex digits of the SHA-1 of its settings as sorted JSON."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def resolve_paths(settings: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """A copy of ``settings`` with a relative ``root`` (and an existing relative dataset file) made
    absolute against ``base_dir``."""
    out = dict(settings)
    root = out.get("root")
    if isinstance(root, str) and root:
        p = Path(root).expanduser()
        out["root"] = str(p if p.is_absolute() else (base_dir / p).resolve())

    ds = out.get("dataset")
    if isinstance(ds, str) and ds.lower().endswith(tuple(DATASET_FILE_SUFFIXES) + tuple(STRUCTURE_SUFFIXES)
                                                   + tuple(FORMATS)):
        p = Path(ds).expanduser()
        if not p.is_absolute() and (base_dir / p).exists():
            out["dataset"] = str((base_dir / p).resolve())
    return out


#: metrics the sweep plot of a report (gnnpipe.experiments.report) can draw: name → (VariantStats attribute, axis label)
SWEEP_METRICS = {
    "force_mae": ("f_mae", "test force MAE at best val (eV/Å)"),
    "val_force_mae": ("val_f_mae", "best validation force MAE (eV/Å)"),
    "energy_mae": ("e_mae", "test energy MAE at best val (meV)"),
    "force_cos": ("f_cos", "test force cosine at best val"),
    "efwt": ("efwt", "test EFwT at best val (%)"),
    "test_acc": ("test_acc", "test accuracy at best val (%)"),
    "best_val_acc": ("best_val", "best validation accuracy (%)"),
    "step_ms": ("step_ms", "time per training step (ms)"),
    "epoch_ms": ("epoch_ms", "time per epoch (ms)"),
    "peak_mib": ("peak_mib", "peak memory, largest rank (MiB)"),
}


def check_report_settings(tbl: dict, src: str) -> dict:
    """The ``[report]`` table, checked: ``x`` (a setting or ``"params"``), ``y`` (a metric name of
    :data:`gnnpipe.experiments.grid.SWEEP_METRICS`), ``log_x`` (bool). Returns it with ``x`` normalised.

    Raises:
        ConfigError: an unknown key or metric, a value of the wrong kind.
    """
    out: dict[str, Any] = {}
    for k, v in tbl.items():
        if k not in ("x", "y", "log_x"):
            raise ConfigError(f"{src}: [report] has no key {k!r}; allowed: x, y, log_x")
    if "x" in tbl:
        x = tbl["x"]
        if not isinstance(x, str) or not x:
            raise ConfigError(f"{src}: [report] x must be a setting name or \"params\", got {x!r}")
        out["x"] = x if x == "params" else normalize_key(x, "[report] x", src)
    if "y" in tbl:
        if tbl["y"] not in SWEEP_METRICS:
            raise ConfigError(f"{src}: [report] y must be one of {', '.join(SWEEP_METRICS)}, got {tbl['y']!r}")
        out["y"] = tbl["y"]
    if "log_x" in tbl:
        if not isinstance(tbl["log_x"], bool):
            raise ConfigError(f"{src}: [report] log_x must be true or false, got {tbl['log_x']!r}")
        out["log_x"] = tbl["log_x"]
    return out


def _table(raw: dict, key: str, path) -> dict:
    val = raw.get(key, {})
    if not isinstance(val, dict):
        raise ConfigError(f"{path}: [{key}] must be a table, got {type(val).__name__}; write it as [{key}] "
                          f"followed by key = value lines")
    return val


def parse_study(raw: dict, path: Path | None = None, *, check: bool = True) -> Study:
    """Build a :class:`Study` from the parsed TOML mapping ``raw`` and expand its runs.

    Args:
        raw: the TOML document as a dict. path: the study file (for messages and relative paths).
        check: validate every run's flags with ``gnnpipe train``'s parser and the component registries.

    Raises:
        ConfigError: the message names the offending key (and table) and how to fix it.
    """
    src = str(path) if path else "study"
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        hints = []
        specs = train_flag_specs()
        for k in unknown:
            if str(k).replace("-", "_") in specs:
                hints.append(f"{k!r} looks like a run setting: put it under [fixed] (same for all runs) "
                             "or [grid] (a list)")
        raise ConfigError(f"{src}: unknown top-level key(s) {unknown}; allowed: {', '.join(TOP_KEYS)}"
                          + (". " + "; ".join(hints) if hints else ""))
    name = raw.get("name", path.stem if path else "study")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{src}: name must be a non-empty string, got {name!r}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{src}: description must be a string")

    fixed: dict[str, Any] = {}
    for k, v in _table(raw, "fixed", src).items():
        key = normalize_key(k, "[fixed]", src)
        if key in fixed:
            raise ConfigError(f"{src}: [fixed] sets {key!r} twice (as {k!r}); keep one")
        fixed[key] = normalize_value(key, v, f"{src}: [fixed] {k}")

    grid: dict[str, list] = {}
    for k, v in _table(raw, "grid", src).items():
        key = normalize_key(k, "[grid]", src)
        if not isinstance(v, list) or not v:
            raise ConfigError(f"{src}: [grid] {k} must be a non-empty list of values to try, got {v!r}; "
                              f"a single value belongs under [fixed]")
        if key in fixed:
            raise ConfigError(f"{src}: {key!r} is in both [fixed] and [grid]; remove it from one of them")
        if key in grid:
            raise ConfigError(f"{src}: [grid] sets {key!r} twice (as {k!r}); keep one")
        vals = [normalize_value(key, x, f"{src}: [grid] {k}") for x in v]
        if len(set(map(json.dumps, vals))) != len(vals):
            raise ConfigError(f"{src}: [grid] {k} lists a value twice: {v!r}")
        grid[key] = vals

    rv = raw.get("variants", [])
    if not isinstance(rv, list) or not all(isinstance(x, dict) for x in rv):
        raise ConfigError(f"{src}: variants must be an array of tables: write each as [[variants]] followed by "
                          f"name = \"…\" and its settings")
    variants: list[tuple[str | None, dict[str, Any]]] = []
    seen_names: set[str] = set()
    for i, tbl in enumerate(rv):
        vname = tbl.get("name")
        if vname is not None and (not isinstance(vname, str) or not vname):
            raise ConfigError(f"{src}: [[variants]] #{i + 1}: name must be a non-empty string, got {vname!r}")
        if vname is not None:
            if vname in seen_names:
                raise ConfigError(f"{src}: two [[variants]] are named {vname!r}; names must be unique")
            seen_names.add(vname)
        where = f"[[variants]] #{i + 1}" + (f" ({vname!r})" if vname else "")
        ov: dict[str, Any] = {}
        for k, v in tbl.items():
            if k == "name":
                continue
            key = normalize_key(k, where, src)
            if key in grid:
                raise ConfigError(f"{src}: {where} sets {key!r}, which [grid] varies; remove it from one of them")
            if key == "seed":
                raise ConfigError(f"{src}: {where} sets seed; seeds are given once for all runs by the top-level "
                                  f"`seeds = [..]`")
            ov[key] = normalize_value(key, v, f"{src}: {where} {k}")
        variants.append((vname, ov))

    if "seeds" in raw:
        seeds = raw["seeds"]
        if (not isinstance(seeds, list) or not seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
            raise ConfigError(f"{src}: seeds must be a non-empty list of integers, e.g. seeds = [0, 1, 2]; "
                              f"got {seeds!r}")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"{src}: seeds lists a seed twice: {seeds!r}")
        if "seed" in grid:
            raise ConfigError(f"{src}: give seeds either as the top-level `seeds` or as [grid] seed, not both")
    elif "seed" in grid:
        seeds = grid.pop("seed")
    else:
        seeds = [int(fixed.get("seed", 0))]
    fixed.pop("seed", None)

    timeout = raw.get("run_timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ConfigError(f"{src}: run_timeout_s must be a positive number of seconds, got {timeout!r}")

    simulate = _table(raw, "simulate", src)
    check_sim_settings(simulate, src)
    report = check_report_settings(_table(raw, "report", src), src)

    study = Study(path=path, name=name, description=description, fixed=fixed, grid=grid, variants=variants,
                  seeds=list(seeds), run_timeout_s=float(timeout) if timeout is not None else None,
                  simulate=dict(simulate), report=report)
    study.runs = expand(study, check=check)
    return study


def expand(study: Study, *, check: bool = True) -> list[Run]:
    """The study's runs: seeds (outer) × grid combinations × variants, duplicates (same ``run_id``) dropped.

    Raises:
        ConfigError: a run's settings fail ``gnnpipe train``'s parser/config checks (``check=True``).
    """
    keys = list(study.grid)
    combos = list(itertools.product(*(study.grid[k] for k in keys))) if keys else [()]
    variants = study.variants or [(None, {})]
    runs: list[Run] = []
    seen: set[str] = set()
    checked: set[str] = set()
    for seed in study.seeds:
        for combo in combos:
            for vname, vov in variants:
                ov = dict(zip(keys, combo))
                ov.update(vov)
                settings = {**study.fixed, **ov, "seed": seed}
                overrides = {k: v for k, v in ov.items() if k not in study.fixed or study.fixed[k] != v}
                rid = run_id_of(settings)
                if rid in seen:
                    continue
                seen.add(rid)
                label = variant_label(vname, overrides, keys)
                argv = to_flags(resolve_paths(settings, study.base_dir))
                if check:
                    # one check per variant (the seed cannot make a valid run invalid)
                    key = run_id_of({k: v for k, v in settings.items() if k != "seed"})
                    if key not in checked:
                        check_flags(argv, f"{study.path or 'study'}: variant {label!r}")
                        checked.add(key)
                runs.append(Run(rid, label, int(seed), overrides, settings, argv))
    return runs


def load_study(path: str | Path, *, check: bool = True) -> Study:
    """Read and expand a study file (see the module docstring).

    Raises:
        ConfigError: missing file, TOML syntax error (with its line), or a bad key/value (named).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"study file {str(p)!r} not found")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_study(raw, p.resolve(), check=check)
