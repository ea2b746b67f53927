"""Checkpoints of a run in any layout, written with ``torch.distributed.checkpoint`` (DCP).

One checkpoint is one DCP folder ``DIR/ckpt-EEEEEE`` (``EEEEEE`` = epochs completed), written by all
ranks together into ``DIR/.tmp-ckpt-EEEEEE`` and renamed into place by rank 0 once DCP has written its
``.metadata`` — so a run killed while writing leaves the previous checkpoint complete and the torn one
under a name :func:`find_checkpoint` never picks. The two newest checkpoints (by epoch, then step) are kept.
Inside an epoch (S2EF's ``--checkpoint-every-steps``, ``--max-steps``) the folder is ``DIR/ckpt-EEEEEE-sSSSSSS``
(``SSSSSS`` = optimizer steps of epoch ``EEEEEE`` done): a resume continues at that epoch's next batch.

Keys of the flat state (DCP deduplicates keys that several ranks write, e.g. graph-parallel replicas):

==========================================  =========================================================
``model.units.{i}.{name}``                  parameters and buffers, named as in the single-process
                                            model's ``state_dict`` (so any layout loads any other's)
``optim.units.{i}.{name}.{step|exp_avg|…}`` Adam state of that parameter, same names
``best.units.{i}.{name}``                   weights of the best-validation epoch (``keep="best"``)
``loop``                                    the epoch loop's state (records, best, early stopping)
``meta``                                    format version, config, layout and plan
``rank{r}.history.unit{i}.op{j}.H_in|G_out`` rank ``r``'s history buffers (layout-specific; a halo-gradient
                                            op: ``H_in|G_in|push{c}.halo|grad|start``, ``History.state_tensors``)
``rank{r}.correctors``                      rank ``r``'s corrector state (T3 snapshots, EMA averages…)
``rank{r}.rng.cpu`` / ``rank{r}.rng.cuda``  rank ``r``'s RNG states (dropout)
``rank{r}.stage``                           rank ``r``'s executor counters (weight version)
==========================================  =========================================================

``task_state``                              what the executor's kind of work keeps beyond weights and optimizer
                                            (S2EF: the moving average of the weights, the learning-rate
                                            schedule), when it has ``task_state()`` / ``load_task_state()``
==========================================  =========================================================

An executor names the modules it trains with ``checkpoint_modules()`` (``{prefix: module}``; default: its
model's ``units.{i}`` for ``i`` in its ``units``; prefix ``""``: the module's own ``state_dict`` names), and
may add plain values to ``meta["task_meta"]`` with ``task_meta()`` (what a model file needs to be used, e.g.
an S2EF model's energy reference and cutoff; :func:`model_from_checkpoint` puts it into ``model.meta``).

Objects (``loop``, ``meta``, ``correctors``, ``stage``) are pickled to bytes, which DCP stores as
byte items. The chunk order needs no state: T1's shuffle is a pure function of (seed, epoch).

Resuming (:func:`load_checkpoint`) into the same layout and chunking restores everything, so the run
continues bit for bit. Into another layout only weights, optimizer state and the epoch loop carry over;
history, corrector state and RNG restart (a warning says so). A configuration that changes what is
computed in other ways (model, seed, data, optimiser, correctors, …) is refused, naming the fields.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import time
import warnings
from pathlib import Path

import attrs
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

from ...data.datasets import DATASET_FILE_SUFFIXES
from ...errors import ConfigError
from ...models import build_model
from ..settings.config import TrainConfig
from .state import compute_of, preprocessing_of

FORMAT_VERSION = 1
#: configuration fields that choose the layout: a change restarts history (with a warning)
LAYOUT_FIELDS = ("ways", "replicas", "stages", "chunks", "scheduler", "stash_weights", "partitioner", "over_partition",
                 "layer_split", "graph_parallel_group_size", "graph_parallel_partitioner", "graph_parallel_mode")
#: fields free to change on resume (they do not change the numbers of the epochs run)
FREE_FIELDS = ("epochs", "patience", "threads", "backend", "timeout_s", "root", "recompute", "max_steps",
               "num_workers", "skip_invalid", "device")
#: test hook: ``"EPOCHS:RANK"`` makes that rank stall forever inside the write of that checkpoint
STALL_ENV = "GNNPIPE_TEST_STALL_CHECKPOINT"

_PREFIX = "ckpt-"
_TMP = ".tmp-" + _PREFIX


class _Quiet:
    """DCP's own noise off while it reads or writes (entered on construction): its warning that torch.distributed
    is disabled (``no_dist``), and the tracebacks it logs to the root logger when a damaged ``.metadata`` fails to
    load (the ConfigError of :func:`_unreadable` says it in one line)."""

    _DCP_DIR = os.path.dirname(dcp.__file__)

    def __init__(self):
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message=r".*torch.distributed is disabled.*")
        logging.getLogger().addFilter(self._filter)

    def _filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(self._DCP_DIR)

    def __exit__(self, *exc) -> None:
        logging.getLogger().removeFilter(self._filter)
        self._warnings.__exit__(*exc)


def _quiet() -> _Quiet:
    return _Quiet()


# ---------------------------------------------------------------------------------------------- finding
def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder ``path`` names: ``path`` itself if it is one, else its newest ``ckpt-*``.

    Raises:
        ConfigError: no complete checkpoint there.
    """
    p = Path(path).expanduser()
    if (p / ".metadata").is_file():
        return p
    found = list_checkpoints(p)
    if not found:
        raise ConfigError(f"no checkpoint in {p} (a folder written by --checkpoint-dir, or one ckpt-* folder in it)")
    return found[-1][1]


def _obj(v) -> bytes:
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


def checkpoint_name(epochs: int, steps: int = 0) -> str:
    """The folder name of the checkpoint at ``epochs`` completed and ``steps`` optimizer steps into the next
    epoch: ``ckpt-EEEEEE`` at an epoch boundary, ``ckpt-EEEEEE-sSSSSSS`` inside an epoch."""
    return f"{_PREFIX}{epochs:06d}" + (f"-s{steps:06d}" if steps else "")


def checkpoint_position(name: str) -> tuple[int, int] | None:
    """``(epochs, steps)`` of a checkpoint folder name (:func:`checkpoint_name`), ``None`` for another name."""
    if not name.startswith(_PREFIX):
        return None
    head, _, tail = name[len(_PREFIX):].partition("-s")
    try:
        return int(head), int(tail) if tail else 0
    except ValueError:
        return None


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """The complete checkpoints in ``directory`` as ``(epochs completed, folder)``, oldest first by epoch, then
    by the steps into the next epoch (``[]`` if none)."""
    d = Path(directory).expanduser()
    out = []
    for c in d.glob(_PREFIX + "*") if d.is_dir() else []:
        pos = checkpoint_position(c.name)
        if pos is not None and (c / ".metadata").is_file():
            out.append((pos, c))
    return [(pos[0], c) for pos, c in sorted(out)]


def check_checkpoint_dir(directory: str | Path | None, start_epoch: int = 0, start_step: int = 0) -> None:
    """Refuse a ``--checkpoint-dir`` whose checkpoints this run would not continue: one written after the epoch the
    run starts from (``start_epoch``: 0, or the epochs of the ``--resume`` checkpoint; ``start_step``: its steps
    into the next epoch) would make this run's newest checkpoints look older (the pruning of all but the two newest
    would delete them) and would be what a later ``--resume DIR`` picks.

    Raises:
        ConfigError: ``directory`` is a file, or holds such checkpoints (the message names them and the fix).
    """
    if not directory:
        return
    d = Path(directory).expanduser()
    if d.exists() and not d.is_dir():
        raise ConfigError(f"--checkpoint-dir {d} is a file; give a folder (it is created if missing)")
    later = [p.name for _, p in list_checkpoints(d) if checkpoint_position(p.name) > (start_epoch, start_step)]
    if later:
        what = ("an earlier run's checkpoints" if (start_epoch, start_step) == (0, 0) else
                f"checkpoints after epoch {start_epoch}" + (f", step {start_step}" if start_step else ""))
        raise ConfigError(f"--checkpoint-dir {d} already holds {what} ({', '.join(later)}); continue that run with "
                          f"--resume {d}, or give an empty or new folder")


def _load(path: Path, template: dict) -> dict:
    ctx = _quiet()
    try:
        dcp.load(template, checkpoint_id=str(path), no_dist=True)
    except (Exception, CheckpointException) as exc:  # damaged or truncated: name the checkpoint, not DCP's internals
        raise ConfigError(_unreadable(path, exc)) from None
    finally:
        ctx.__exit__(None, None, None)
    return template


def _unreadable(path: Path, exc: BaseException) -> str:
    last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    older = [p.name for n, p in list_checkpoints(path.parent) if p != path]
    hint = f"; resume from an older one ({', '.join(str(path.parent / o) for o in older)})" if older else ""
    return f"checkpoint {path} cannot be read (damaged or incomplete: {last[:200]}){hint}"


def _metadata(path: Path) -> dict:
    try:
        return dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except (Exception, CheckpointException) as exc:
        raise ConfigError(_unreadable(path, exc)) from None


def _tensor_template(md: dict, keys) -> dict:
    out = {}
    for k in keys:
        m = md[k]
        out[k] = torch.empty(m.size, dtype=m.properties.dtype)
    return out


def read_meta(path: str | Path) -> dict:
    """The ``meta`` record of a checkpoint (``format``, ``config``, ``layout``, ``plan``, ``world``, ``epochs``)."""
    p = find_checkpoint(path)
    return _current_names(pickle.loads(_load(p, {"meta": None})["meta"]))


def _current_names(meta: dict) -> dict:
    """``meta`` in today's field names: an S2EF checkpoint written when its data-parallel replicas were ``ways``
    records them as ``replicas``."""
    cfg = meta.get("config") or {}
    if cfg.get("task") == "s2ef" and "replicas" not in cfg:
        cfg["replicas"], cfg["ways"] = cfg.get("ways", 1), 1
        if isinstance(meta.get("layout"), dict):
            meta["layout"]["replicas"], meta["layout"]["ways"] = meta["layout"].get("ways", 1), 1
    return meta


def read_weights(path: str | Path, which: str = "best") -> dict[str, Tensor]:
    """The single-process ``state_dict`` stored in a checkpoint: the best-validation weights (``"best"``,
    falling back to the last ones when the run kept none) or the last ones (``"last"``: the weights the run
    evaluates with — ``task_state["weights"]`` over the trained ones, when the executor's task state has them,
    e.g. S2EF's moving average)."""
    p = find_checkpoint(path)
    md = _metadata(p)
    prefix = "best." if which == "best" and any(k.startswith("best.") for k in md) else "model."
    keys = [k for k in md if k.startswith(prefix)]
    t = _load(p, _tensor_template(md, keys))
    out = {k[len(prefix):]: v for k, v in t.items()}
    if prefix == "model." and "task_state" in md:
        state = pickle.loads(_load(p, {"task_state": None})["task_state"])
        if isinstance(state, dict) and state.get("weights"):
            out.update(state["weights"])
    return out


def model_from_checkpoint(path, which: str = "best"):
    """The single-process model a checkpoint folder holds (``which``: ``"best"`` or ``"last"`` weights), with
    ``meta`` = ``{"config", "epochs", "checkpoint", "weights", "data_paths"}`` (``weights``: those loaded, ``"last"``
    when the run kept no best ones; ``data_paths``: :func:`data_paths` of the run; with the best weights also
    ``best_epoch``, counted from 0, and ``best_step`` when a step evaluation chose them; ``steps``: the optimizer
    steps done, where the checkpoint counts them) and the run's preprocessing.

    Raises:
        ConfigError: no checkpoint at ``path``.
    """
    p = find_checkpoint(path)
    meta = read_meta(p)
    spec = meta["spec"]
    model = build_model(spec["name"], spec["in_channels"], spec["out_channels"], init=False, **spec["kwargs"])
    model = model.to(getattr(torch, spec.get("dtype", "float32")))
    model.load_state_dict(read_weights(p, which), strict=True)
    cfg = TrainConfig(**{k: v for k, v in meta["config"].items() if k in attrs.fields_dict(TrainConfig)})
    model.preprocessing = preprocessing_of(cfg)
    held = "best" if which == "best" and any(k.startswith("best.") for k in _metadata(p)) else "last"
    model.meta = {"config": meta["config"], "epochs": meta["epochs"], "checkpoint": str(p), "weights": held,
                  "data_paths": meta.get("data_paths") or {}}  # older checkpoints lack it
    if held == "best":
        loop = pickle.loads(_load(p, {"loop": None})["loop"])
        model.meta["best_epoch"] = int(loop.get("best_epoch", -1))  # counted from 0
        best_step = (loop.get("best_metrics") or {}).get("step")  # the best at a step evaluation (--eval-every-steps)
        if best_step is not None:
            model.meta["best_step"] = int(best_step)
    if meta.get("steps") is not None:
        model.meta["steps"] = int(meta["steps"])  # optimizer steps done
    if meta.get("task_meta"):
        model.meta["task_meta"] = meta["task_meta"]
    return model.eval()


def data_paths(config: TrainConfig) -> dict:
    """The data paths of a run made absolute against the current directory, so that ``gnnpipe predict`` finds
    the data of a model (checkpoint meta and model file meta ``"data_paths"``) wherever it runs:
    ``{"root": absolute --root}`` (when given) and ``{"dataset": absolute path}`` when ``--dataset`` names a file
    that exists here (a file found under ``--root`` needs only the root)."""
    out = {}
    if config.root is not None:
        out["root"] = str(Path(config.root).expanduser().resolve())
    ds = config.dataset
    if isinstance(ds, str) and ds.lower().endswith(DATASET_FILE_SUFFIXES) and Path(ds).expanduser().is_file():
        out["dataset"] = str(Path(ds).expanduser().resolve())
    return out


def run_meta(config: TrainConfig, epochs: int) -> dict:
    """The ``meta`` of a trained ``result.model`` (what :func:`gnnpipe.models.save` writes beside its weights, as
    ``gnnpipe export`` does for a checkpoint): ``{"config", "epochs", "data_paths"}``."""
    return {"config": config.to_dict(), "epochs": int(epochs), "data_paths": data_paths(config)}


# ---------------------------------------------------------------------------------------------- config
def layout_of(config: TrainConfig, plan_info: dict) -> dict:
    """What history depends on: ways, stages, chunks, their sizes, the stage bounds, the scheduler."""
    return {"ways": config.ways, "replicas": config.replicas, "stages": config.stages,
            "chunks": plan_info.get("chunks"), "chunk_sizes": plan_info.get("chunk_sizes"),
            "stage_bounds": plan_info.get("stage_bounds"), "way_ptr": plan_info.get("way_ptr"),
            "scheduler": config.scheduler, "stash_weights": config.stash_weights}


def _same_file(old, new, recorded=None) -> bool:
    """Whether dataset names ``old`` (the checkpoint's) and ``new`` name one file here (``recorded``: the absolute
    path the checkpoint's run recorded, :func:`data_paths`)."""
    if not (isinstance(old, str) and isinstance(new, str)):
        return False
    try:
        b = Path(new).expanduser()
        if not b.is_file():
            return False
        return any(a is not None and Path(a).expanduser().is_file() and os.path.samefile(Path(a).expanduser(), b)
                   for a in (recorded, old))
    except OSError:
        return False


def check_resume(config: TrainConfig, meta: dict) -> list[str]:
    """Compare a run's configuration with a checkpoint's; returns the layout fields that differ.

    Raises:
        ConfigError: a field that changes the computation (other than the layout) differs; the message
            names each field with both values.
    """
    if meta.get("format") != FORMAT_VERSION:
        raise ConfigError(f"checkpoint format {meta.get('format')} is not {FORMAT_VERSION}; it cannot be resumed")
    old, new = meta["config"], config.to_dict()
    # a field the checkpoint's version did not have yet held its default there
    defaults = {f.name: f.default for f in attrs.fields(TrainConfig) if not isinstance(f.default, attrs.Factory)}
    old = {**{k: defaults[k] for k in new if k not in old and k in defaults}, **old}
    diff = [k for k in sorted(set(old) | set(new)) if k not in FREE_FIELDS and old.get(k) != new.get(k)]
    # a dataset file named by another path (relative, absolute, through a link) is the same data set
    if "dataset" in diff and _same_file(old.get("dataset"), new.get("dataset"),
                                        (meta.get("data_paths") or {}).get("dataset")):
        diff.remove("dataset")
    refused = [k for k in diff if k not in LAYOUT_FIELDS]
    if refused:
        what = "; ".join(f"{k}: checkpoint {old.get(k)!r}, now {new.get(k)!r}" for k in refused)
        raise ConfigError(f"--resume with a configuration that changes the results: {what}. Resume with the "
                          f"checkpoint's settings (only {', '.join(FREE_FIELDS)} and the layout may change)")
    return [k for k in diff if k in LAYOUT_FIELDS]


# ---------------------------------------------------------------------------------------------- state
def trained_modules(c) -> dict[str, torch.nn.Module]:
    """``{name prefix: module}`` of what an executor (its :func:`~gnnpipe.core.run.state.compute_of`) trains:
    its ``checkpoint_modules()`` when it has one, else its model's ``units.{i}`` for ``i`` in its ``units``."""
    if callable(getattr(c, "checkpoint_modules", None)):
        return c.checkpoint_modules()
    return {f"units.{i}": c.model.units[i] for i in c.units}


def _name(prefix: str, k: str) -> str:
    return f"{prefix}.{k}" if prefix else k


def _param_names(c) -> dict[int, str]:
    return {id(p): _name(pre, n) for pre, m in trained_modules(c).items() for n, p in m.named_parameters()}


def _rng_state(device: torch.device) -> dict[str, Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def _device(ex) -> torch.device:
    return torch.device(getattr(ex, "device", "cpu"))


def executor_checkpoint(ex, rank: int) -> dict:
    """The flat DCP state of one executor (weights, optimizer, history, correctors, RNG, counters)."""
    c = compute_of(ex)
    sd: dict = {}
    for pre, m in trained_modules(c).items():
        for k, v in m.state_dict().items():
            sd[f"model.{_name(pre, k)}"] = v.detach()
    names = _param_names(c)
    for group in c.optimizer.param_groups:
        for p in group["params"]:
            st = c.optimizer.state.get(p)
            if not st or id(p) not in names:
                continue
            for k, v in st.items():
                sd[f"optim.{names[id(p)]}.{k}"] = v if isinstance(v, Tensor) else torch.tensor(v)
    for (i, j), h in getattr(c, "histories", {}).items():
        for name, t in h.state_tensors().items():
            sd[f"rank{rank}.history.unit{i}.op{j}.{name}"] = t
    sd[f"rank{rank}.correctors"] = _obj([k.state_dict() for k in getattr(ex, "correctors", [])])
    for k, v in _rng_state(_device(ex)).items():
        sd[f"rank{rank}.rng.{k}"] = v
    sd[f"rank{rank}.stage"] = _obj({"version": getattr(c, "version", 0)})
    if callable(getattr(c, "task_state", None)):
        task = c.task_state()  # None: another rank holds it (an S2EF pipeline stage: rank 0)
        if task is not None:
            sd["task_state"] = _obj(task)
    return sd


def can_checkpoint(ex) -> bool:
    """Whether the executor is between action streams (async-stale runs several epochs as one stream)."""
    return not getattr(ex, "_stream", None)


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer with a test hook: stall one rank after it wrote its data (:data:`STALL_ENV`)."""

    def __init__(self, path, stall: bool):
        super().__init__(str(path))
        self._stall = stall

    def write_data(self, plan, planner):
        fut = super().write_data(plan, planner)
        if self._stall:
            fut.wait()
            time.sleep(3600)
        return fut


class Checkpointer:
    """``after_epoch`` hook writing checkpoints of one rank's executor (all ranks run it together).

    Args:
        directory: the checkpoint folder. every: every k epochs (``0``: only at the end; :meth:`finish`).
        executor: this rank's executor. config, plan_info: the run's (stored in ``meta``).
        rank, world: this rank and the world size (``world = 1``: no process group).
        session: the :class:`~gnnpipe.core.run.session.RunSession` (its best weights are saved too).
    """

    def __init__(self, directory: str | Path, every: int, executor, config: TrainConfig, plan_info: dict,
                 rank: int, world: int, session):
        self.dir = Path(directory).expanduser()
        self.every, self.ex, self.config, self.plan_info = every, executor, config, plan_info
        self.rank, self.world, self.session = rank, world, session
        self.last_saved: tuple[int, int] | None = None  # (epochs, steps into the next) of the last save
        self.pending = False
        self.seconds: list[float] = []  # write time of each save on this rank
        if rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            for tmp in self.dir.glob(_TMP + "*"):  # torn writes of a killed run
                shutil.rmtree(tmp, ignore_errors=True)
        if world > 1:
            dist.barrier()

    def __call__(self, epoch: int, rec: dict, st) -> None:
        if self.every and (epoch + 1) % self.every == 0:
            self.pending = True
        if self.pending and can_checkpoint(self.ex):
            self.save(st)

    def finish(self, st) -> None:
        """The checkpoint at the end of the run (unless the last epoch's, or step's, is written already)."""
        if self.last_saved != _position(st) and can_checkpoint(self.ex):
            self.save(st)

    def save(self, st) -> Path:
        """Write the checkpoint of loop state ``st`` (collective): at an epoch boundary, or inside an epoch when
        ``st.next_step > 0`` (``st.partial`` then holds the epoch's sums so far)."""
        t0 = time.perf_counter()
        n, steps = _position(st)
        sd = executor_checkpoint(self.ex, self.rank)
        best = self.session.best_state if self.session is not None else None
        for k, v in (best or {}).items():
            sd["best." + k] = v
        sd["loop"] = _obj(st.to_dict())
        meta = {"format": FORMAT_VERSION, "config": self.config.to_dict(),
                "layout": layout_of(self.config, self.plan_info), "plan": self.plan_info, "world": self.world,
                "epochs": n, "steps_in_epoch": steps, "steps": int(getattr(st, "step", 0)),
                "spec": dict(compute_of(self.ex).model.spec or {}, dtype=self.config.dtype),
                "data_paths": data_paths(self.config)}
        if callable(getattr(compute_of(self.ex), "task_meta", None)):
            meta["task_meta"] = compute_of(self.ex).task_meta()
        sd["meta"] = _obj(meta)
        name = checkpoint_name(n, steps)
        tmp, final = self.dir / f".tmp-{name}", self.dir / name
        stall = os.environ.get(STALL_ENV) == f"{n}:{self.rank}"
        ctx = _quiet()
        try:
            dcp.save(sd, storage_writer=_Writer(tmp, stall), no_dist=self.world == 1)
        finally:
            ctx.__exit__(None, None, None)
        if self.rank == 0:
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)  # atomic: a reader sees the whole checkpoint or none
            keys = ("epochs", "steps_in_epoch", "steps", "world", "layout", "config")
            (final / "meta.json").write_text(json.dumps({f: meta[f] for f in keys}, indent=1, default=str))
            for _, old in list_checkpoints(self.dir)[:-2]:
                shutil.rmtree(old, ignore_errors=True)
        self.last_saved = (n, steps)
        self.pending = False
        self.seconds.append(time.perf_counter() - t0)
        return final


def _position(st) -> tuple[int, int]:
    """``(epochs done, steps into the next epoch)`` of a loop state."""
    return int(st.next_epoch), int(getattr(st, "next_step", 0) or 0)


# ---------------------------------------------------------------------------------------------- loading
def load_checkpoint(path: str | Path, ex, rank: int, config: TrainConfig, plan_info: dict, world: int,
                    warn: bool = True, require_history: bool = False) -> tuple[dict, dict[str, Tensor] | None]:
    """Load a checkpoint into this rank's executor; returns ``(loop state dict, best weights or None)``.

    Same layout (and world size): everything is restored. Another layout: weights, optimizer state,
    best weights and the loop state only (``warn``: a warning says what restarts), unless
    ``require_history``.

    Raises:
        ConfigError: see :func:`check_resume`; the checkpoint lacks weights of a unit this rank trains;
            ``require_history`` and the checkpoint's layout or chunking differs (history cannot be loaded).
    """
    p = find_checkpoint(path)
    meta = read_meta(p)
    changed = check_resume(config, meta)
    here = layout_of(config, plan_info)
    same = meta["layout"] == here and meta["world"] == world
    if not same and require_history:
        diff = [k for k in here if meta["layout"].get(k) != here[k]] or ["world size"]
        raise ConfigError(f"the history in {p} belongs to another layout or chunking ({', '.join(diff)} differ); "
                          f"history loads only into the same ways, stages, chunks and stage bounds")
    if not same and warn and not changed:  # changed layout fields: gnnpipe.api.train warned already
        warnings.warn(f"resuming {p} in another layout (the chunking or stage bounds changed): "
                      f"weights, optimizer state and the epoch records carry over; history, corrector state and "
                      f"random states restart, so the continuation is not bit-identical to an uninterrupted run",
                      stacklevel=2)
    md = _metadata(p)
    c = compute_of(ex)
    names = _param_names(c)
    want = []
    modules = trained_modules(c)
    for pre, m in modules.items():
        for k in m.state_dict():
            key = f"model.{_name(pre, k)}"
            if key not in md:
                raise ConfigError(f"checkpoint {p} has no weights {key}: it was written by another model")
            want.append(key)
            if f"best.{_name(pre, k)}" in md:
                want.append(f"best.{_name(pre, k)}")
    optim_keys = {}
    for group in c.optimizer.param_groups:
        for prm in group["params"]:
            if id(prm) in names:
                pre = f"optim.{names[id(prm)]}."
                ks = [k for k in md if k.startswith(pre) and "." not in k[len(pre):]]
                optim_keys[prm] = ks
                want.extend(ks)
    if same:
        want.extend(k for k in md if k.startswith(f"rank{rank}.") and k not in (f"rank{rank}.correctors",
                                                                                  f"rank{rank}.stage"))
    tpl = _tensor_template(md, want)
    tpl["loop"] = None
    task_state = callable(getattr(c, "load_task_state", None)) and "task_state" in md
    if task_state:
        tpl["task_state"] = None
    if same:
        tpl[f"rank{rank}.correctors"] = None
        tpl[f"rank{rank}.stage"] = None
    _load(p, tpl)
    with torch.no_grad():
        for pre, m in modules.items():
            m.load_state_dict({k: tpl[f"model.{_name(pre, k)}"] for k in m.state_dict()})
    if task_state:
        c.load_task_state(pickle.loads(tpl["task_state"]))
    for prm, ks in optim_keys.items():
        if ks:
            pre = f"optim.{names[id(prm)]}."
            c.optimizer.state[prm] = {k[len(pre):]: tpl[k].to(prm.device) if tpl[k].dim() else tpl[k] for k in ks}
    best = {k[len("best."):]: v for k, v in tpl.items() if k.startswith("best.")} or None
    if same:
        dev = _device(ex)
        for (i, j), h in getattr(c, "histories", {}).items():
            key = f"rank{rank}.history.unit{i}.op{j}."
            h.load_state_tensors({k[len(key):]: v for k, v in tpl.items() if k.startswith(key)})
        states = pickle.loads(tpl[f"rank{rank}.correctors"])
        for k, s in zip(getattr(ex, "correctors", []), states):
            k.load_state_dict(s)
        torch.set_rng_state(tpl[f"rank{rank}.rng.cpu"])
        if dev.type == "cuda" and f"rank{rank}.rng.cuda" in tpl:
            torch.cuda.set_rng_state(tpl[f"rank{rank}.rng.cuda"], dev)
        if hasattr(c, "version"):
            c.version = pickle.loads(tpl[f"rank{rank}.stage"])["version"]
    return pickle.loads(tpl["loop"]), best


__all__ = [
    "FORMAT_VERSION",
    "Checkpointer",
    "checkpoint_name",
    "checkpoint_position",
    "check_resume",
    "find_checkpoint",
    "layout_of",
    "load_checkpoint",
    "read_meta",
    "read_weights",
]
