"""S2EF data: structure files or a generated set, validated in the training dtype, split, and batched.

A batch is ``torch_geometric.data.Batch.from_data_list`` of structures (``z``, ``pos``, ``cell``, ``pbc``,
``energy``, ``forces``, ``fixed``, ``natoms``; see :mod:`gnnpipe.data.atoms`). Batches are a pure function of
``(seed, epoch)`` (a permutation of the training split cut into global batches), so a resumed run and every
data-parallel rank see the same ones without any state.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import pickle
import re
import signal
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Batch

from ...data import atoms
from ...data.atoms import generated_structures, read_structures, split_structures, validate_structures
from ...data.atoms.sets import PreparedSet, format_of, open_structures
from ...data.atoms.structures import with_stress_slot
from ...errors import ConfigError, DataValidationError
from .labels import label_counts, with_label_slots

#: the suffixes of structure files (read with ``ase.io`` / ``ase.db``)
STRUCTURE_SUFFIXES = (".extxyz", ".xyz", ".traj", ".db")
#: the suffixes read lazily (:mod:`gnnpipe.data.atoms.sets`): extended XYZ, ASE db, ASE-LMDB, fairchem LMDB
DATA_SUFFIXES = (".extxyz", ".xyz", ".db", ".aselmdb", ".lmdb")
#: generated data sets (ASE + EMT labels; :mod:`gnnpipe.data.atoms`)
GENERATED = ("oc20-like", "md17-like", "bulk-like")


def is_structure_dataset(dataset: str | None) -> bool:
    """Whether ``dataset`` names a structure file (by suffix) or a generated structure set."""
    if not isinstance(dataset, str):
        return False
    d = dataset.lower().rstrip("/")
    return d.endswith(STRUCTURE_SUFFIXES + DATA_SUFFIXES) or d in GENERATED or _structure_folder(dataset)


def _structure_folder(dataset: str) -> bool:
    p = Path(dataset).expanduser()
    try:
        return p.is_dir() and any(format_of(q) for q in p.iterdir())
    except OSError:
        return False


def dataset_path(config, what: str, dataset: str | None = None, flag: str = "--dataset") -> Path:
    """The path of ``dataset`` (default ``config.dataset``; ``config.root`` tried as its parent when it does not
    exist as given).

    Raises:
        ConfigError: neither exists; the message names ``flag`` and asks for ``what``.
    """
    dataset = config.dataset if dataset is None else dataset
    path = Path(dataset).expanduser()
    if not path.exists() and config.root is not None:
        path = Path(config.root).expanduser() / dataset
    if not path.exists():
        raise ConfigError(f"{flag} {dataset!r}: no such structure file; give {what}"
                          + (", or --dataset oc20-like for a generated set" if flag == "--dataset" else ""))
    return path


def label_keys(config) -> dict:
    """The label names given for a structure file (``--energy-key``, ``--forces-key``, ``--stress-key``,
    ``--virial-key``), as the readers take them."""
    return {k: v for k in ("energy_key", "forces_key", "stress_key", "virial_key") if (v := getattr(config, k, None))}


def load_structures(config, labelled: bool = True) -> list:
    """The structures of ``config.dataset`` in memory (``None``: the generated ``oc20-like`` set of ``config.frames``
    frames, seeded by ``config.seed``; a file or folder of any format :func:`gnnpipe.data.atoms.read_structures`
    reads), in ``config.dtype``, validated; ``labelled``: each must have energy and forces.

    Raises:
        ConfigError: a missing file. DataValidationError: a malformed structure (the message names it and the fix).
    """
    ds = config.dataset or "oc20-like"
    if ds.lower() in GENERATED:  # generated once, then read from the cache (gnnpipe.data.atoms.generated_file)
        structures = atoms.generated_structures(ds.lower().split("-")[0], config.frames, config.seed,
                                                dtype=config.torch_dtype)
    else:
        path = dataset_path(config, f"an existing file ({', '.join(STRUCTURE_SUFFIXES + DATA_SUFFIXES[3:])}) or a "
                                    f"folder of such files")
        kw = label_keys(config)
        structures = atoms.read_structures(str(path), dtype=config.torch_dtype, **kw)
        return prepare_structures(structures, config.torch_dtype, cutoff=config.cutoff, labelled=labelled,
                                  source=f"{path.name}: structure")
    return prepare_structures(structures, config.torch_dtype, cutoff=config.cutoff)


def prepare_structures(structures: Sequence, dtype: torch.dtype, labelled: bool = True,
                       cutoff: float | None = None, source: str = "structure") -> list:
    """``structures`` validated (:func:`gnnpipe.data.atoms.validate_structures`) with floats in ``dtype`` and a
    ``fixed`` mask (all free when absent); ``source`` names them in errors (``"FILE: structure"``).

    Raises:
        DataValidationError: a malformed structure; ``labelled`` and one without energy or forces.
    """
    out = []
    for i, d in enumerate(structures):
        d = d.clone()
        for k in ("pos", "cell", "energy", "forces", "stress"):
            if getattr(d, k, None) is not None:
                setattr(d, k, getattr(d, k).to(dtype))
        if getattr(d, "fixed", None) is None:
            d.fixed = torch.zeros(d.z.numel(), dtype=torch.bool)
        with_stress_slot(d, dtype)
        if d.stress.numel() == 9:
            d.stress = d.stress.reshape(1, 3, 3)
        if labelled:  # each structure trains on the labels it has (:mod:`.labels`)
            with_label_slots(d, source, i)
        out.append(d)
    validate_structures(out, dtype, cutoff=cutoff, source=source)
    return out


def split(config, n: int) -> dict[str, Tensor]:
    """``{"train", "val", "test"}`` index tensors: 80/10/10 seeded by ``config.seed``
    (:func:`gnnpipe.data.atoms.split_structures`)."""
    tr, va, te = split_structures(n, seed=config.seed)
    return {"train": torch.as_tensor(tr), "val": torch.as_tensor(va), "test": torch.as_tensor(te)}


def epoch_batches(n: int, global_batch: int, seed: int, epoch: int) -> list[Tensor]:
    """The global batches of an epoch: a permutation of ``range(n)`` drawn from ``(seed, epoch)`` cut into
    ``ceil(n / global_batch)`` batches (the last one shorter)."""
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + 7919 * (int(epoch) + 1)) % (2**63 - 1))
    return list(torch.randperm(n, generator=g).split(global_batch))


def share(indices: Tensor, rank: int, world: int) -> Tensor:
    """Rank ``rank``'s part of ``indices``: contiguous, as even as possible (the first ranks one more; a rank may
    get none)."""
    return torch.tensor_split(indices, world)[rank]


# ------------------------------------------------------------------------------------------------ lazy sets, loader
#: structures drawn (seeded) from the training split to fit the energy reference and normalisation
#: (:func:`reference_sample`); a split this size or smaller is used whole, in order
REFERENCE_SAMPLE = 2_000
#: the fewest steps per epoch for which loader workers are started by default (starting them costs about this)
MIN_STEPS_FOR_WORKERS = 16
#: atoms of a step's largest structure from which a rank on a GPU builds the step's neighbour graph there
#: (``build_graph(method="device")``: all pairs of a structure on the GPU) rather than in a loader worker on the CPU;
#: smaller structures' graphs are built by the workers ahead of the step. Not yet measured on a GPU
#: (``benchmarks/bench_s2ef_gpu.py graph`` times both builds by structure size)
DEVICE_GRAPH_ATOMS = 1000


def open_dataset(config):
    """The lazy training set of ``config.dataset`` (a file of :data:`gnnpipe.data.atoms.sets.FORMATS` or a folder of
    such files, ``config.root`` tried as its parent): a :class:`~gnnpipe.data.atoms.sets.PreparedSet` that reads,
    casts to ``config.dtype`` and validates a structure when it is indexed (in a loader worker).

    Raises:
        ConfigError: no such file or folder. DataValidationError: a file that cannot be opened, a folder mixing
            formats.
    """
    path = dataset_path(config, f"an existing file ({', '.join(DATA_SUFFIXES)}) or a folder of such files")
    base = open_structures(path, **label_keys(config))
    return PreparedSet(base, config.torch_dtype, cutoff=config.cutoff,
                       skip_invalid=bool(getattr(config, "skip_invalid", False)))


class _Concat:
    """Several structure sets (lazy :class:`~gnnpipe.data.atoms.sets.StructureSet` s or in-memory lists) as one,
    each structure named as its own set names it."""

    def __init__(self, parts: list, names: list[str]):
        self.parts, self.names = parts, names
        self.bounds = np.cumsum([0] + [len(p) for p in parts]).tolist()

    def __len__(self) -> int:
        return self.bounds[-1]

    def _locate(self, i: int) -> tuple[int, int]:
        f = bisect_right(self.bounds, int(i)) - 1
        return f, int(i) - self.bounds[f]

    def __getitem__(self, i: int):
        f, k = self._locate(i)
        return self.parts[f][k]

    def where(self, i: int) -> str:
        f, k = self._locate(i)
        part = self.parts[f]
        return part.where(k) if hasattr(part, "where") else f"{self.names[f]}: structure {k}"

    def release(self) -> None:
        for p in self.parts:
            if hasattr(p, "release"):
                p.release()


def split_name(path: str, taken: set) -> str:
    """The name a given validation set is reported under: ``val`` and its file's stem (``val_ood_ads.lmdb`` →
    ``val_ood_ads``; ``A.extxyz`` → ``val_A``), made unique among ``taken``."""
    stem = re.sub(r"\W+", "_", Path(str(path).rstrip("/")).name.split(".")[0]).strip("_") or "set"
    name = stem if stem.lower().startswith("val") else f"val_{stem}"
    out, k = name, 2
    while out in taken or out in ("val", "test", "train"):
        out, k = f"{name}_{k}", k + 1
    return out


def open_given_splits(config):
    """``(structures, splits)`` of a run given its validation and test sets (``--val-dataset``,
    ``--test-dataset``): ``config.dataset`` whole as the training split, each validation set a split of its own —
    the first ``"val"`` (it chooses the best weights), the others under their names (:func:`split_name`) — and the
    test set ``"test"`` (empty without one). One lazy :class:`~gnnpipe.data.atoms.sets.PreparedSet` over them all
    (a generated or ``.traj`` training set in memory).

    Raises:
        ConfigError: a missing file. DataValidationError: a file that cannot be opened.
    """
    what = f"an existing file ({', '.join(DATA_SUFFIXES)}) or a folder of such files"

    def raw(ds: str, flag: str):
        if ds.lower() in GENERATED:
            return generated_structures(ds.lower().split("-")[0], config.frames, config.seed, dtype=torch.float64)
        path = dataset_path(config, what, ds, flag)
        kw = label_keys(config)
        if ds.lower().endswith(".traj"):
            return read_structures(str(path), dtype=torch.float64, **kw)
        return open_structures(path, **label_keys(config))

    ds = config.dataset or "oc20-like"
    parts, names, kinds = [raw(ds, "--dataset")], [Path(ds).name], ["train"]
    taken: set = set()
    for k, v in enumerate(config.val_datasets):
        parts.append(raw(v, "--val-dataset"))
        names.append(Path(v).name)
        kinds.append("val" if k == 0 else split_name(v, taken))
        taken.add(kinds[-1])
    if config.test_dataset:
        parts.append(raw(config.test_dataset, "--test-dataset"))
        names.append(Path(config.test_dataset).name)
        kinds.append("test")
    base = _Concat(parts, names)
    splits: dict[str, Tensor] = {"train": torch.zeros(0, dtype=torch.long), "val": torch.zeros(0, dtype=torch.long)}
    for kind, lo, hi in zip(kinds, base.bounds[:-1], base.bounds[1:]):
        splits[kind] = torch.arange(lo, hi)
    splits.setdefault("test", torch.zeros(0, dtype=torch.long))
    splits = {"train": splits.pop("train"), **{k: v for k, v in splits.items() if k != "test"}, "test": splits["test"]}
    structures = PreparedSet(base, config.torch_dtype, cutoff=config.cutoff,
                             skip_invalid=bool(getattr(config, "skip_invalid", False)))
    return structures, splits


def reference_sample(train: Tensor, seed: int, size: int = REFERENCE_SAMPLE) -> Tensor:
    """The training structures the energy reference is fitted on: all of ``train`` (in order) when it has at most
    ``size``, else ``size`` of them drawn without replacement, seeded by ``seed`` (sorted: files read forward).
    The same in every layout (it depends on the split and the seed only)."""
    if len(train) <= size:
        return train
    g = torch.Generator().manual_seed(int(seed) * 7 + 12345)
    return train[torch.randperm(len(train), generator=g)[:size].sort().values]


def default_num_workers(config) -> int:
    """Loader workers per rank when ``--num-workers`` is not given: the cores left after the ranks'
    (``replicas × stages × gp-size`` ranks of ``threads`` each) shared among the ranks, at most 4 each."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    ranks = config.replicas * config.stages * config.graph_parallel_group_size
    return max(0, min(4, (cores - ranks * config.threads) // ranks))


def steps_per_epoch(config, n_train: int) -> int:
    """Optimizer steps of an epoch over ``n_train`` training structures: global batches of ``batch_size × replicas``."""
    return max(-(-int(n_train) // (config.batch_size * config.replicas)), 1)


def total_steps(config, n_train: int) -> int:
    """Optimizer steps the run takes: ``--max-steps`` when given (at most ``--epochs`` epochs of them), else every
    step of ``--epochs`` epochs. The learning-rate schedule's warm-up and decay span them."""
    steps = config.epochs * steps_per_epoch(config, n_train)
    return min(int(config.max_steps), steps) if config.max_steps else steps


def resolved_num_workers(config, n_train: int) -> int:
    """Loader workers per rank of a run over ``n_train`` training structures: ``--num-workers``, else
    :func:`default_num_workers`, or none for an epoch of fewer than :data:`MIN_STEPS_FOR_WORKERS` steps (starting
    workers costs about what a few steps do). Resolved where the run is launched, so every rank uses one count."""
    if config.num_workers is not None:
        return int(config.num_workers)
    return default_num_workers(config) if steps_per_epoch(config, n_train) >= MIN_STEPS_FOR_WORKERS else 0


@dataclass
class StepData:
    """One step's structures as a loader worker prepared them.

    Attributes:
        structures: this rank's valid structures (``Data``, in the training dtype), in batch order.
        batch, graph: their ``Batch`` and neighbour graph (built in the worker when the loader has a ``graph_fn``;
            else ``None``).
        num_energy: those with an energy label. num_free: free atoms of those with forces. num_stress: those with a
        stress label (:mod:`.labels`).
        skipped: malformed structures left out (``--skip-invalid``).
    """

    structures: list
    batch: object = None
    graph: object = None
    num_free: int = 0
    num_energy: int = 0
    num_stress: int = 0
    skipped: int = 0


@dataclass
class _Failed:
    message: str


class _Packer(pickle.Pickler):
    """Pickles tensors as numpy arrays inside one byte string: a step's few hundred small tensors cross from a
    loader worker to the training process as one buffer (the default transfer gives each tensor a shared-memory
    segment of its own, about 0.5 ms apiece on the receiving side)."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.layout == torch.strided and not obj.requires_grad \
                and obj.dtype in _NUMPY_DTYPES:
            return _tensor_from_numpy, (obj.detach().cpu().numpy(),)
        return NotImplemented      # bfloat16 and the rest: torch's own pickling, still inside the one byte string


#: tensor dtypes NumPy holds as they are
_NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
                           torch.int64, torch.uint8, torch.bool})


def _tensor_from_numpy(a):
    return torch.from_numpy(a)


def pack_step(step) -> bytes:
    """``step`` (any picklable object holding CPU tensors) as one byte string; :func:`pickle.loads` rebuilds it
    with equal tensors (each with storage of its own)."""
    buf = io.BytesIO()
    _Packer(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(step)
    return buf.getvalue()


class _Steps(torch.utils.data.Dataset):
    """Item ``k``: the structures of ``parts[k]`` read (validated), batched and their graph built; ``packed``: as
    one byte string (:func:`pack_step`), for a loader worker to hand over."""

    def __init__(self, structures, parts: list, graph_fn: Callable | None, packed: bool = False,
                 device_graph_atoms: int | None = None):
        self.structures, self.parts, self.graph_fn, self.packed = structures, parts, graph_fn, packed
        self.device_graph_atoms = device_graph_atoms

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, k: int):
        try:
            got = [self.structures[i] for i in self.parts[k].tolist()]
        except DataValidationError as exc:  # carried back whole: the run stops with its one-line message
            return _Failed(str(exc))
        valid = [d for d in got if d is not None]
        counts = [label_counts(d) for d in valid]
        step = StepData(valid, num_free=sum(c[1] for c in counts), num_energy=sum(c[0] for c in counts),
                        num_stress=sum(c[2] for c in counts), skipped=len(got) - len(valid))
        if self.graph_fn is not None and valid:
            step.batch = Batch.from_data_list(valid)
            large = self.device_graph_atoms is not None and max(int(d.z.numel()) for d in valid) >= \
                self.device_graph_atoms
            if not large:  # a large structure's graph is built on the rank's device (``graph`` stays None)
                step.graph = self.graph_fn(step.batch)
        return pack_step(step) if self.packed else step


class StructureLoader:
    """Reads the structures of a rank's batch shares in ``num_workers`` worker processes (a
    ``torch.utils.data.DataLoader``, each worker reading, validating and, with ``graph_fn``, batching and building
    the graph of one step), ``prefetch`` steps ahead per worker, in step order. Which structures a step holds is
    decided here, not by the workers: the same for any number of workers.

    Args:
        structures: a sequence of structures by index (a list of ``Data``, or a
            :class:`~gnnpipe.data.atoms.sets.PreparedSet` that reads ``None`` for a skipped structure).
        num_workers: 0 reads in this process. graph_fn: ``Batch → graph`` run in the workers (``None``: the trainer
            builds the graph).
        device: the rank's device. On a GPU each step's batch and graph are pinned and copied there on a side
            stream (``non_blocking``) one step ahead, while the step before computes; elsewhere they stay on the CPU.
        device_graph_atoms: with ``graph_fn``, a step whose largest structure has at least this many atoms leaves
            its ``graph`` ``None`` (the trainer builds it on the device; :data:`DEVICE_GRAPH_ATOMS`); ``None``: never.

    Raises (while iterating): DataValidationError of a malformed structure (file, index, problem), unless the set
    skips them.
    """

    def __init__(self, structures, num_workers: int = 0, graph_fn: Callable | None = None, prefetch: int = 2, *,
                 device: torch.device | str | None = None, device_graph_atoms: int | None = None):
        self.structures, self.num_workers, self.graph_fn, self.prefetch = structures, num_workers, graph_fn, prefetch
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.device_graph_atoms = device_graph_atoms

    def iterate(self, parts: Sequence[Tensor]) -> Iterator[StepData]:
        """One :class:`StepData` per index tensor of ``parts``, in order (on a GPU its batch and graph already
        there, copied one step ahead)."""
        steps = self._read(parts)
        if self.device.type != "cuda":
            yield from steps
            return
        stream = torch.cuda.Stream(self.device)
        ahead = None
        for step in steps:
            ready = _copy_ahead(step, self.device, stream)
            if ahead is not None:
                yield _arrived(*ahead)
            ahead = (step, ready)
        if ahead is not None:
            yield _arrived(*ahead)

    def _read(self, parts: Sequence[Tensor]) -> Iterator[StepData]:
        workers = self.num_workers > 0 and len(parts) > 0
        steps = _Steps(self.structures, list(parts), self.graph_fn, packed=workers,
                       device_graph_atoms=self.device_graph_atoms)
        if not workers:
            it = (steps[k] for k in range(len(steps)))
        else:
            with _workers_ignore_interrupts():
                it = iter(torch.utils.data.DataLoader(steps, batch_size=None, shuffle=False,
                                                      num_workers=min(self.num_workers, len(steps)),
                                                      prefetch_factor=self.prefetch, collate_fn=_identity,
                                                      worker_init_fn=functools.partial(_init_worker,
                                                                                       parent=os.getpid())))
        for step in it:
            if isinstance(step, bytes):
                step = pickle.loads(step)
            if isinstance(step, _Failed):
                raise DataValidationError(step.message)
            yield step


def _identity(x):
    return x


def _tensors(obj) -> list[Tensor]:
    """The tensors a batch (PyG ``Batch``) or a graph (:class:`~gnnpipe.data.atoms.AtomGraph`) holds."""
    if obj is None:
        return []
    if hasattr(obj, "to_dict"):
        values = obj.to_dict().values()
    else:
        values = vars(obj).values()
    return [v for v in values if isinstance(v, Tensor)]


def move_to(obj, device: torch.device, non_blocking: bool = True):
    """``obj`` (a PyG ``Batch`` / ``Data`` or an :class:`~gnnpipe.data.atoms.AtomGraph`) with its tensors on
    ``device``: on a GPU copied from pinned host memory without blocking the host (the copy is ordered before
    any work queued after it on the stream); the object itself when it is already there or is ``None``.

    Raises:
        TypeError: an object that has neither ``to`` nor tensors as attributes.
    """
    if obj is None:
        return None
    device = torch.device(device)
    tensors = _tensors(obj)
    if all(t.device == device for t in tensors):
        return obj
    pin = device.type == "cuda" and non_blocking
    if hasattr(obj, "apply"):  # PyG Data / Batch: every tensor attribute, in place
        return obj.apply(lambda t: (t.pin_memory() if pin and not t.is_pinned() else t).to(device,
                                                                                           non_blocking=non_blocking))
    if hasattr(obj, "to"):
        if pin and hasattr(obj, "pin_memory"):
            obj = obj.pin_memory()
        return obj.to(device, non_blocking=non_blocking)
    raise TypeError(f"cannot move a {type(obj).__name__} to {device}: give it a to(device) method")


def _copy_ahead(step: StepData, device: torch.device, stream):
    """Start copying ``step``'s batch and graph to ``device`` on the side ``stream``; returns the event that
    marks the copy done (``None`` when there was nothing to copy)."""
    if step.batch is None:
        return None
    with torch.cuda.stream(stream):
        step.batch = move_to(step.batch, device)
        step.graph = move_to(step.graph, device)
        event = torch.cuda.Event()
        event.record(stream)
    return event


def _arrived(step: StepData, event) -> StepData:
    """``step`` once its copy is done as seen from the current stream: the compute stream waits for the copy's
    event, and the copied tensors are marked as used there (the caching allocator then does not hand their memory
    to the copy stream while the step still reads them)."""
    if event is not None:
        current = torch.cuda.current_stream(event.device if hasattr(event, "device") else None)
        current.wait_event(event)
        for t in _tensors(step.batch) + _tensors(step.graph):
            if t.is_cuda:
                t.record_stream(current)
    return step


@contextlib.contextmanager
def _workers_ignore_interrupts():
    """Start loader workers with SIGINT ignored (an ignored signal stays ignored through fork and exec, and Python
    keeps it so): a terminal's Ctrl-C reaches the whole process group, and the rank, not its workers, decides how to
    stop (at the end of the step, :mod:`gnnpipe.core.run.stopping`); a worker still importing would otherwise die of
    it and fail the run. The workers end when the rank closes its loader or dies (:func:`_init_worker`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _init_worker(worker_id: int, parent: int) -> None:
    """A loader worker ends with the process that started it (``parent``).

    torch's own watch compares the worker's parent with the one it had when the worker reached its loop; a rank
    killed while its worker was still starting (importing) would leave the worker orphaned for good. So the worker
    asks the kernel for ``SIGKILL`` when its parent dies (``PR_SET_PDEATHSIG``, Linux) and then checks that its
    parent is still ``parent`` (it may have died before the request)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # pragma: no cover - not Linux: torch's watch remains
        pass
    if os.getppid() != parent:
        os._exit(1)
