"""A short profile of one training step on a sample of the job (:func:`profile_step`): its seconds, the work it
did, the double-backward factor ``κ`` (the step's peak of live bytes over the forward's saved bytes; ``κ_D``
for a pipeline stage's ``D`` pass), where it was taken (CPU or GPU, ``--amp``), saved and read as JSON
(:class:`AtomProfile`); :class:`PeakMeter` measures the peak of live bytes on either device.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from typing import Any

import attrs
import torch

from ....core.runtime.memory import return_free_memory
from ....costmodel.link import profile_link
from ....costmodel.live import LiveBytes
from ....errors import ConfigError
from ..data import move_to
from .widths import conservative_forces, stage_widths, work_weights

#: the double-backward factor κ (peak live bytes of a conservative-force step / the forward's counted kept bytes)
#: when no profile measured it: measured 2.66 for dimenet++ (hidden 64, 3 blocks, a 75-atom Pt slab, float32) on this
#: project's machine (docs/guides/atomistic-cost.md)
DEFAULT_KAPPA = 2.7


#: ``κ_D / κ`` when no profile measured ``κ_D`` (a conservative pipeline stage's ``D`` pass retains the graph):
#: measured 2.40 / 1.86 = 1.29 for gemnet-t (4 blocks × 128, 8 OC20-like structures, float32;
#: docs/guides/atomistic-cost.md)
DEFAULT_KAPPA_D_RATIO = 1.3


#: the version of :func:`activation_widths` / :func:`stage_widths` a profile's κ was fitted against (2: the geometry in
#: the force mode's widths, 10·S·R per read edge); a saved profile of another version is refused on load
WIDTHS_VERSION = 2


#: the fields of an :class:`AtomProfile` that are measured quantities (numbers >= 0)
_PROFILE_NUMBERS = ("step_s", "work", "kappa", "peak_bytes", "grad_bytes", "kept_bytes", "edges", "triplets", "atoms",
                    "structures", "element_size", "threads", "floor_bytes", "step_cpu_s")



@attrs.define
class AtomProfile:
    """A short profile of an atomistic model's training step on this machine (:func:`profile_step`).

    Attributes:
        model: the zoo name. step_s: median seconds of a single-process step (energy + forces, the loss, its
        backward) with ``threads`` torch threads. work: its multiply-adds (:func:`work_weights` on the sample).
        kappa: the double-backward factor. kappa_d: a conservative pipeline stage's factor: the peak of the step
        run as the pipeline's passes (the forces with ``create_graph``, the force loss's backward retaining the graph,
        then the energy loss's) less the gradients, over the counted kept bytes (``None``: direct forces, or a profile
        written before it was measured: ``kappa`` × :data:`DEFAULT_KAPPA_D_RATIO`).
        peak_bytes: the step's peak live bytes above the state before it.
        grad_bytes: the gradients' bytes. kept_bytes: the counted kept bytes (:func:`activation_widths`).
        edges, triplets, atoms, structures: the sample. element_size: ``b``. floor_bytes: resident bytes of this
        process before the step less the model's weights and the sample's batch and graph (the runtime, the data
        set), which a rank counts per layout. link: ``(latency_s, bandwidth_Bps)`` of an all-reduce
        hop measured between two local ranks, or ``None``. step_cpu_s: the median step's CPU seconds of the main
        thread (``step_s`` less the time other processes took the core). widths_version: :data:`WIDTHS_VERSION`
        of the widths κ was fitted against. direct_forces: the force mode profiled (``None``: a profile written
        before it was recorded). device: where the step was profiled, ``"cpu"`` (live bytes,
        :class:`~gnnpipe.costmodel.live.LiveBytes`) or ``"cuda"`` (``torch.cuda.max_memory_allocated``; the floor is
        then not measured: :data:`GPU_FLOOR_BYTES`). amp: profiled in bfloat16 autocast (``--amp``).
    """

    model: str
    step_s: float
    work: float
    kappa: float
    peak_bytes: int
    grad_bytes: int
    kept_bytes: float
    edges: int
    triplets: int
    atoms: int
    structures: int
    element_size: int
    threads: int = 1
    floor_bytes: int = 0
    link: tuple | None = None
    step_cpu_s: float = 0.0
    widths_version: int = WIDTHS_VERSION
    direct_forces: bool | None = None
    kappa_d: float | None = None
    device: str = "cpu"
    amp: bool = False

    @property
    def retained_kappa(self) -> float:
        """``κ_D``: :attr:`kappa_d`, or ``κ`` × :data:`DEFAULT_KAPPA_D_RATIO` where it was not measured."""
        return self.kappa_d if self.kappa_d is not None else self.kappa * DEFAULT_KAPPA_D_RATIO

    @property
    def seconds_per_work(self) -> float:
        return self.step_s / max(self.work, 1.0)

    def to_dict(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AtomProfile:
        """The profile :meth:`to_dict` wrote (a saved ``--profile-out``).

        Raises:
            ConfigError: not a JSON object, unknown or missing fields, a measured field that is not a number
                >= 0, or κ fitted against older activation widths (the message says to profile again).
        """

        if isinstance(d, dict) and "kappa" in d and d.get("widths_version", 1) != WIDTHS_VERSION:
            raise ConfigError(f"this atomistic profile's kappa was fitted against the activation widths of an older "
                              f"gnnpipe (version {d.get('widths_version', 1)}, now {WIDTHS_VERSION}); profile again "
                              f"with gnnpipe plan --task s2ef --profile-out (seconds)")
        if not isinstance(d, dict):
            raise ConfigError(f"not an atomistic profile (a JSON {type(d).__name__}, not an object); write one with "
                              f"gnnpipe plan --profile-out")
        try:
            prof = cls(**{k: (tuple(v) if k == "link" and v is not None else v) for k, v in d.items()})
        except TypeError as exc:
            raise ConfigError(f"not an atomistic profile ({exc}); write one with gnnpipe plan --profile-out") from None
        numbers = _PROFILE_NUMBERS + (("kappa_d",) if prof.kappa_d is not None else ())
        bad = [f for f in numbers if isinstance(getattr(prof, f), bool)
               or not isinstance(getattr(prof, f), (int, float)) or not getattr(prof, f) >= 0]
        if bad:
            raise ConfigError(f"not an atomistic profile: {', '.join(f'{f}={getattr(prof, f)!r}' for f in bad)} must "
                              f"be numbers >= 0; write one with gnnpipe plan --profile-out")
        return prof



def _rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0



def _held_bytes(*objs) -> int:
    """Bytes of the distinct tensor storages held by ``objs``: modules (parameters and buffers), PyG data (its
    tensors) and objects whose attributes are tensors (an :class:`~gnnpipe.data.atoms.AtomGraph`)."""

    seen: dict[int, int] = {}
    for obj in objs:
        if isinstance(obj, torch.nn.Module):
            tensors = [*obj.parameters(), *obj.buffers()]
        elif hasattr(obj, "to_dict"):
            tensors = list(obj.to_dict().values())
        else:
            tensors = list(vars(obj).values())
        for t in tensors:
            if torch.is_tensor(t) and t.device.type == "cpu" and not t.is_meta:
                st = t.untyped_storage()
                seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
    return sum(seen.values())



class PeakMeter:
    """The peak of the bytes a block allocates above what was allocated when it began, on ``device``: live bytes
    sampled after every operation on the CPU (:class:`~gnnpipe.costmodel.live.LiveBytes`), the CUDA caching
    allocator's ``max_memory_allocated`` on a GPU (what ``peak_mem_bytes`` of a GPU run reports).

    Attributes (after the block): base: bytes allocated when it began. peak: the largest allocation seen.
    """

    def __init__(self, device="cpu"):

        self.device = torch.device(device)
        self._live = None

    def __enter__(self) -> PeakMeter:

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = self.peak = int(torch.cuda.memory_allocated(self.device))
            return self

        self._live = LiveBytes().__enter__()
        self.base = self.peak = self._live.base
        return self

    def __exit__(self, *exc) -> None:

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
            return
        self._live.__exit__(*exc)
        self.base, self.peak = self._live.base, self._live.peak



def _train_step(model, batch, graph, comm=None, passes: bool = False, amp: bool = False):
    """One training step's compute; ``passes``: as a conservative pipeline runs it, the force loss's backward
    retaining the graph (``D``), then the energy loss's (``B``), where the single process runs one backward;
    ``amp``: the forward in bfloat16 autocast (``--amp``)."""


    dev = batch.pos.device.type
    with torch.autocast(dev, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
        out = model(batch, graph, comm, forces=True)
    e, f = batch.energy.reshape(-1), batch.forces
    le = ((out["energy"] - e.to(out["energy"].dtype)) ** 2).sum()
    lf = 100.0 * ((out["forces"] - f.to(out["forces"].dtype)) ** 2).mean()
    if passes:
        lf.backward(retain_graph=True)
        le.backward()
    else:
        (le + lf).backward()



def profile_step(model: Any, batch: Any, graph: Any, *, steps: int = 2, warmup: int = 1, link: bool = False,
                 name: str = "?", device=None, amp: bool = False) -> AtomProfile:
    """Time ``steps`` single-process training steps of ``model`` on ``batch`` (after ``warmup``), measure one step's
    peak of allocated bytes (:class:`PeakMeter`: live bytes on the CPU, ``torch.cuda.max_memory_allocated`` on a
    GPU), with conservative forces also one step's run as the pipeline's ``G``, ``D``, ``B`` passes (``κ_D``), and,
    with ``link``, the all-reduce link between two local ranks (:func:`~gnnpipe.costmodel.link.profile_link`, a few
    seconds).

    ``batch`` needs ``energy`` and ``forces`` (zeros do: only the cost is measured). Threads: torch's current
    setting (the ranks of a run use ``--threads``). ``device``: where to profile (``None``: the CPU; ``"cuda"``:
    the model, batch and graph are moved to the current GPU, and the model is moved back afterwards); ``amp``:
    the forward in bfloat16 autocast, as ``--amp`` trains.
    """

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    home = next(model.parameters()).device
    if dev.type != "cpu":

        model.to(dev)
        batch, graph = move_to(batch, dev, non_blocking=False), move_to(graph, dev, non_blocking=False)
    try:
        return _profile(model, batch, graph, steps, warmup, link, name, dev, amp)
    finally:
        if dev.type != "cpu":
            model.to(home)
            torch.cuda.empty_cache()



def _profile(model, batch, graph, steps, warmup, link, name, dev, amp) -> AtomProfile:


    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    b = params[0].element_size()
    # the runtime floor: what this process holds less the model's weights and the sample's batch and graph, which
    # the plan counts per rank (``parameters``, ``graph``); garbage and the heap's free memory are not held


    gc.collect()
    return_free_memory()
    floor = max(_rss() - _held_bytes(model, batch, graph), 0) if dev.type == "cpu" else 0
    gpu = dev.type == "cuda"
    times, cpus = [], []
    for i in range(warmup + steps):
        for p in params:
            p.grad = None
        t0, c0 = time.perf_counter(), time.thread_time()
        _train_step(model, batch, graph, amp=amp)
        if gpu:
            torch.cuda.synchronize(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpus.append(time.thread_time() - c0)
    for p in params:
        p.grad = None
    with PeakMeter(dev) as lb:
        _train_step(model, batch, graph, amp=amp)
    peak = lb.peak - lb.base
    peak_d = None
    if conservative_forces(model):
        for p in params:
            p.grad = None
        with PeakMeter(dev) as lb:
            _train_step(model, batch, graph, passes=True, amp=amp)
        peak_d = lb.peak - lb.base
    grads = sum(p.numel() for p in params) * b
    E, T, N = int(graph.num_edges), int(graph.num_triplets), int(batch.num_nodes)
    K = int(torch.bincount(graph.idx_ji, minlength=E).max()) if E and T else 0
    kept = b * stage_widths(model, 0, len(model.units))[0].total(E, T, N, None, E * K)
    work = sum(w.total(E, T, N, None, E * K) for w in work_weights(model))
    for p in params:
        p.grad = None
    lk = None
    if link:

        _, ar, _ = profile_link("gloo", sizes=(4, 1 << 16, 1 << 20), reps=5)
        lk = (ar.latency_s, ar.bandwidth_Bps)
    return AtomProfile(model=name, step_s=statistics.median(times), work=float(work),
                       kappa=max(peak - grads, 0) / max(kept, 1.0), peak_bytes=int(peak), grad_bytes=int(grads),
                       kept_bytes=float(kept), edges=E, triplets=T, atoms=N,
                       structures=int(getattr(batch, "num_graphs", 1)),
                       element_size=b, threads=torch.get_num_threads(), floor_bytes=floor, link=lk,
                       step_cpu_s=statistics.median(cpus), direct_forces=not conservative_forces(model),
                       kappa_d=None if peak_d is None else max(peak_d - grads, 0) / max(kept, 1.0),
                       device=dev.type, amp=bool(amp))
