"""The cost model of atomistic (S2EF) jobs: bytes, memory and step time of ``S × G × D`` layouts.

Graph parallelism (Sriram et al., ICLR 2022, arXiv 2203.09697) shards one batch's edges and triplets over the
``G`` ranks of a group; ``D`` data-parallel replicas split the batch's structures; ``S`` pipeline stages split the
interaction blocks (and so the parameters and their optimizer state). This module predicts, from a
:class:`~gnnpipe.partitioners.GraphParallelPlan` and the model's sizes, what one training step costs each rank.

**Bytes per interaction block** (kind ``"gp"``, exact). Each unit of a model calls the graph-parallel hooks
(:mod:`gnnpipe.models.atomistic.comm`) a fixed number of times on rows of known widths (:func:`hook_calls`). A
hook's forward sends :func:`~gnnpipe.tasks.s2ef.graph_parallel.plan_hook_bytes` ``(forward)`` and its backward
``(backward)``. In a step with conservative forces (``F = −∂E/∂pos`` with ``create_graph``, then the loss's
backward) a call whose input depends on the positions runs four times: its forward, its backward inside
``∂E/∂pos``, and in the loss's backward both the backward of the forward node and the backward of that backward
node (a forward-type collective): ``2·(fwd + bwd)``. A call whose input depends only on the parameters (the
embedding of ``z``, SchNet's first gather) is not on a path to ``pos``: ``fwd + bwd``. The energies' ``sum``
(``B`` values) and the forces' ``replicated_grad`` (``3N`` values) are all-reduces whose backward is the identity:
``fwd`` once. Direct forces: every call whose input needs a gradient ``fwd + bwd``, the positions' own gathers
``fwd``, and the direct head's gathers. Tested equal to the measured counters (tests/costmodel/test_atomistic.py).

**Memory of a rank** (bytes above the runtime floor; :func:`rank_memory`): ``parameters`` ``P_s·b`` (``P_s = P/S``
for stage ``s``), ``gradients`` ``P_s·b``, ``optimizer`` ``2·P_s·b`` (Adam's moments; the trainer keeps them in the
training dtype), the flattened gradient all-reduce buffer when ``D·G > 1`` (``P_s·b`` on a pipeline stage; the
single process's and graph parallelism's holds the loss too, in float64), and ``activations``: what a
step keeps alive at its peak, ``κ·b·(w_E·E_r + w_T·T_r + w_N·N + w_A·N_r)`` with the rank's edges ``E_r``, triplets
``T_r``, the batch's atoms ``N`` (gathered atom rows are replicated) and its owned atoms ``N_r``; the widths
``w_*`` count the values autograd saves per edge, triplet and atom in the forward (:func:`activation_widths`,
written from the models' code) and ``κ`` is the double-backward factor: the step's peak of live bytes over the
forward's saved bytes (measured by :func:`profile_step` on a sample of the job; :data:`DEFAULT_KAPPA` without a
profile). Gathered edge rows (``allgather``: all ``E`` rows of the gathered width; ``halo``: the halo rows) add
``κ·b·Σ width·rows`` to the rank's edges' share. A pipeline stage counts its own units, the parameter-free geometry
once where it runs an interaction block, in the force mode's widths (:func:`stage_widths`), and, outside ``κ``, the
boundary tensors it receives and sends; a gpipe stage holds all ``C`` micro-batches until the flush, a 1f1b stage
``s`` at most ``S − s``. With conservative forces a stage's ``D`` pass back-propagates the force loss with the graph
retained for ``B``, so one micro-batch peaks at ``κ_D`` (the profiled step run as ``G``, ``D``, ``B``) where the single
process's combined backward frees as it goes; the others hold ``κ`` (gpipe: every ``G`` has run) or their forward
alone (1f1b: ``G`` runs only in the micro-batch's ``G``, ``D``, ``B`` block), each the largest micro-batch's share
(:func:`micro_batch_sizes`); with direct forces a 1f1b stage holds ``k`` of the largest at ``κ``. ``graph``: the step's graph, ``40·E + 8·N`` bytes (int64 edge index and cell offsets,
batch) and ``16·T`` when triplets are built (the model reads them, or graph parallelism balances by them), plus a
graph-parallel rank's local view.

**Step time** (:func:`predict_step`): the profiled single-process seconds of a step on this machine (a short
profile: :func:`profile_step`) split by work: a rank computes ``t₁ · work(E_r, T_r, N_r) / work(E, T, N)`` with the
analytic multiply-add counts per edge, triplet and atom (:func:`work_weights`), slowed by ``ranks / cores`` when
more ranks than cores share a CPU node and divided by the hardware's speed; plus the collectives' bytes over the
group's link (latency per message) and the gradient all-reduce (``2(R−1)/R·P_s·b`` over the ``D·G`` ranks of a
stage). Pipelining: the stage's share ``1/S`` of the blocks, the gpipe bubble ``(S−1)/(C+S−1)``
(``step = (C+S−1)·t_stage/C``), and the boundary tensors (per micro-batch and boundary the edge messages
``E·H``, the radial basis ``E·R``, the running per-atom output ``N``, forward and back; with conservative forces
again in ``G`` and ``D`` with the position gradients' ``3N``) over the link.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ...models.atomistic.cost import HookCall, UnitWidths
from .graph_parallel import plan_hook_bytes, reduces_locally

__all__ = [
    "AtomJob",
    "AtomLayout",
    "AtomPrediction",
    "AtomProfile",
    "AtomRankMemory",
    "HookCall",
    "PeakMeter",
    "UnitWidths",
    "activation_widths",
    "bubble",
    "check_device_memory",
    "enumerate_atom_layouts",
    "format_atom_ranking",
    "geometry_widths",
    "hook_calls",
    "job_graph",
    "layout_memory",
    "local_gpu_hardware",
    "num_parameters",
    "oc20_sized_structures",
    "padded_slots",
    "plan_atomistic",
    "predict_layout",
    "profile_step",
    "rank_memory",
    "read_edges",
    "size_for_params",
    "stage_bounds",
    "stage_widths",
    "step_bytes",
    "step_collectives",
    "unit_parameters",
    "work_weights",
]


def hook_calls(model: Any, num_atoms: int, num_structures: int) -> list[HookCall]:
    """The hook calls of one forward of ``model`` on a batch of ``num_atoms`` atoms and ``num_structures`` structures,
    in call order: what the model says of itself (:meth:`~gnnpipe.models.atomistic.AtomisticModel.hook_calls`).

    Raises:
        ModelDescriptionError: a model that does not describe them.
    """
    return model.hook_calls(num_atoms, num_structures)


def _step(model: Any, plan: Any, num_structures: int, mode: str, element_size: int, backend: str, atoms_reduce: str,
          training: bool) -> list[tuple[dict[int, float], int]]:
    local = reduces_locally(plan, atoms_reduce)
    direct = bool(getattr(model, "direct_forces", False))
    calls = hook_calls(model, plan.num_nodes, num_structures)
    out = []
    for r in range(plan.num_ranks):
        per: dict[int, float] = {}
        n_coll = 0
        for call in calls:
            def b(backward: bool, call=call, r=r) -> float:
                return plan_hook_bytes(plan, r, call.hook, call.width, element_size, mode=mode, backend=backend,
                                       backward=backward, local_atoms_reduce=local)

            fwd = b(False)
            bwd = 0.0 if call.hook in ("sum", "replicated_grad") else b(True)
            if call.forward_only:
                k_f, k_b = 1, 0
            elif call.pos and not direct:
                k_f, k_b = (2, 2) if training else (1, 1)
            else:
                k_f, k_b = 1, (1 if call.grad and training and bwd else 0)
            per[call.unit] = per.get(call.unit, 0.0) + k_f * fwd + k_b * bwd
            n_coll += k_f * (fwd > 0) + k_b * (bwd > 0)
        out.append((per, n_coll))
    return out


def step_bytes(model: Any, plan: Any, *, num_structures: int, mode: str = "allgather", element_size: int = 4,
               backend: str = "gloo", atoms_reduce: str = "auto", training: bool = True) -> list[dict[int, float]]:
    """Bytes each rank of ``plan`` sends (kind ``"gp"``) in one training step of ``model``, per unit.

    Args:
        model: a ``schnet`` or ``dimenet++`` zoo model (its sizes and force kind are read).
        plan: the :class:`~gnnpipe.partitioners.GraphParallelPlan` of the batch.
        num_structures: ``B``, the batch's structures. mode: ``allgather`` or ``halo``.
        element_size: ``b``, bytes per value (4: float32, 8: float64). backend: ``gloo`` or ``nccl`` (the
            reduce-scatter differs). atoms_reduce: as :class:`~gnnpipe.tasks.s2ef.graph_parallel.GraphParallelComm`.
        training: a training step (the multiplicities of the module docstring); ``False``: one forward with
            conservative forces and no second backward (evaluation: ``fwd + bwd`` for position-dependent calls).

    Returns:
        per rank, ``{unit: bytes}`` (unit ``-1``: the readout's energy and force reductions; with direct forces
        also the trainer's gather of the owned forces, :func:`gnnpipe.tasks.s2ef.layout.replicate_owned`).
    """
    return [per for per, _ in _step(model, plan, num_structures, mode, element_size, backend, atoms_reduce,
                                    training)]


def step_collectives(model: Any, plan: Any, *, num_structures: int, mode: str = "allgather", element_size: int = 4,
                     backend: str = "gloo", atoms_reduce: str = "auto") -> list[int]:
    """Per rank, the collectives of one training step that move bytes (for the latency term of the time model)."""
    return [n for _, n in _step(model, plan, num_structures, mode, element_size, backend, atoms_reduce, True)]


# ---------------------------------------------------------------------------------------------- model sizes
def padded_slots(plan: Any) -> list[int]:
    """Per rank of ``plan``, ``E_r · K_r``: the owned edges times the most triplets one of them updates (the
    per-edge padding of GemNet's bilinear layer)."""
    import torch

    out = []
    for e, ji in zip(plan.edge_counts, plan.local_idx_ji):
        k = int(torch.bincount(ji, minlength=e).max()) if e and ji.numel() else 0
        out.append(int(e) * k)
    return out


def activation_widths(model: Any) -> list[UnitWidths]:
    """Per unit, the values its forward keeps for the backward, per owned edge, triplet and atom (the readout's
    atoms added to the last unit), as the model counts them
    (:meth:`~gnnpipe.models.atomistic.AtomisticModel.activation_widths`; κ of the module docstring scales them). A
    pipeline stage's widths: :func:`stage_widths`.

    Raises:
        ModelDescriptionError: a model that does not describe them.
    """
    return model.activation_widths()


def _conservative(model: Any) -> bool:
    return not bool(getattr(model, "direct_forces", False))


def geometry_widths(model: Any, conservative: bool | None = None) -> UnitWidths:
    """The kept values of the parameter-free geometry a stage running an interaction block holds, in the force mode
    ``conservative`` (default: the model's), as the model counts them
    (:meth:`~gnnpipe.models.atomistic.AtomisticModel.geometry_widths`)."""
    return model.geometry_widths(_conservative(model) if conservative is None else bool(conservative))


def stage_widths(model: Any, lo: int, hi: int, conservative: bool | None = None) -> tuple[UnitWidths, UnitWidths]:
    """``(kept, boundary)`` of a stage running units ``[lo, hi)`` (the single process: ``0, len(model.units)``).

    ``kept``: the values autograd keeps (scaled by ``κ`` in :func:`rank_memory`): the units' widths
    (:func:`activation_widths`) with the geometry counted once, in its force mode (:func:`geometry_widths`), where
    the stage runs an interaction block (a later stage recomputes it); a stage holding the embedding alone keeps
    only what the model says it keeps of the geometry there (:meth:`~gnnpipe.models.atomistic.AtomisticModel.embedding_stage_widths`). ``boundary``: the
    stage's received boundary tensor (kept whole: its views are the block's inputs) and its sent one (kept until
    its gradient arrives), each :func:`boundary_widths` per micro-batch; with conservative forces a stage that
    sends forward also keeps the received ``G`` seed (the boundary's gradient and 3 position-gradient values per
    atom) until ``B``; zero for a single stage.
    """
    units = activation_widths(model)
    n = len(units)
    cons = _conservative(model) if conservative is None else bool(conservative)
    kept = UnitWidths()
    for u in range(lo, hi):
        w = units[u]
        if u == 0:  # unit 0's widths hold the conservative geometry: the embedding proper is the rest
            w = w - geometry_widths(model, True)
        kept = kept + w
    if hi > max(lo, 1):
        kept = kept + geometry_widths(model, cons)
    elif lo == 0:  # the embedding alone: what it keeps of the geometry (a radial basis derived from the edges)
        kept = kept + model.embedding_stage_widths(cons)
    bw = boundary_widths(model)
    sides = (lo > 0) + (hi < n)
    seed = (hi < n) and cons
    return kept, UnitWidths((sides + seed) * bw.edge, 0, (sides + seed) * bw.atom + 3 * seed)


def work_weights(model: Any) -> list[UnitWidths]:
    """Per unit, the forward's multiply-adds per owned edge, triplet and atom: the linear maps' (``in·out``, as the
    model counts them, :meth:`~gnnpipe.models.atomistic.AtomisticModel.work_widths`) and one per kept value
    (element-wise work, :func:`activation_widths`). A training step with conservative forces costs a
    model-independent multiple of it (the profile measures the seconds per unit of work)."""
    return [m + a for m, a in zip(model.work_widths(), activation_widths(model))]


def num_parameters(model: Any) -> int:
    """Trained parameters of ``model``."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def unit_parameters(model: Any) -> list[int]:
    """Trained parameters per unit (the readout's head added to the last unit)."""
    per = [sum(p.numel() for p in u.parameters() if p.requires_grad) for u in model.units]
    per[-1] += sum(p.numel() for p in model.head.parameters() if p.requires_grad)
    return [int(v) for v in per]


# ---------------------------------------------------------------------------------------------- profile
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
        from ...errors import ConfigError

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
    import torch

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
        import torch

        self.device = torch.device(device)
        self._live = None

    def __enter__(self) -> PeakMeter:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = self.peak = int(torch.cuda.memory_allocated(self.device))
            return self
        from ...costmodel.live import LiveBytes

        self._live = LiveBytes().__enter__()
        self.base = self.peak = self._live.base
        return self

    def __exit__(self, *exc) -> None:
        import torch

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
    import contextlib

    import torch

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
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    home = next(model.parameters()).device
    if dev.type != "cpu":
        from .data import move_to

        model.to(dev)
        batch, graph = move_to(batch, dev, non_blocking=False), move_to(graph, dev, non_blocking=False)
    try:
        return _profile(model, batch, graph, steps, warmup, link, name, dev, amp)
    finally:
        if dev.type != "cpu":
            model.to(home)
            torch.cuda.empty_cache()


def _profile(model, batch, graph, steps, warmup, link, name, dev, amp) -> AtomProfile:
    import statistics
    import time

    import torch

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    b = params[0].element_size()
    # the runtime floor: what this process holds less the model's weights and the sample's batch and graph, which
    # the plan counts per rank (``parameters``, ``graph``); garbage and the heap's free memory are not held
    import gc

    from ...core.runtime.memory import return_free_memory

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
    if _conservative(model):
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
        from ...costmodel.link import profile_link

        _, ar, _ = profile_link("gloo", sizes=(4, 1 << 16, 1 << 20), reps=5)
        lk = (ar.latency_s, ar.bandwidth_Bps)
    return AtomProfile(model=name, step_s=statistics.median(times), work=float(work),
                       kappa=max(peak - grads, 0) / max(kept, 1.0), peak_bytes=int(peak), grad_bytes=int(grads),
                       kept_bytes=float(kept), edges=E, triplets=T, atoms=N, structures=int(getattr(batch, "num_graphs", 1)),
                       element_size=b, threads=torch.get_num_threads(), floor_bytes=floor, link=lk,
                       step_cpu_s=statistics.median(cpus), direct_forces=not _conservative(model),
                       kappa_d=None if peak_d is None else max(peak_d - grads, 0) / max(kept, 1.0),
                       device=dev.type, amp=bool(amp))


# ---------------------------------------------------------------------------------------------- layouts
@attrs.frozen
class AtomLayout:
    """``stages × gp × replicas`` ranks (S pipeline stages, G graph-parallel ranks, D data-parallel replicas), ``chunks``
    micro-batches of structures per replica (1 without a pipeline), the pipeline's ``scheduler``."""

    stages: int
    gp: int
    replicas: int
    chunks: int = 1
    scheduler: str = "gpipe"

    @property
    def ranks(self) -> int:
        return self.stages * self.gp * self.replicas

    def label(self) -> str:
        s = f"S{self.stages}xG{self.gp}xD{self.replicas}"
        return s + (f" C{self.chunks} {self.scheduler}" if self.stages > 1 else "")


def enumerate_atom_layouts(ranks: int, num_units: int, num_structures: int, *, chunks_per_stage: Sequence[int] = (1, 4),
                           schedulers: Sequence[str] = ("gpipe", "1f1b"), stages: bool = True) -> list[AtomLayout]:
    """Every ``S × G × D = ranks`` with ``S ≤ num_units`` (a stage runs at least one unit), ``C = k·S`` micro-batches
    for ``k`` in ``chunks_per_stage`` (at most ``num_structures``, the replica's batch; ``S = 1``: ``C = 1``) and each
    scheduler (one when ``C = 1``); ``stages=False``: ``S = 1`` only (D × G).

    Raises:
        ConfigError: ``ranks < 1``.
    """
    from ...errors import ConfigError

    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be an integer >= 1 (--ranks R), got {ranks!r}")
    out = []
    for S in range(1, ranks + 1):
        if ranks % S or S > num_units or (S > 1 and not stages):
            continue
        for G in range(1, ranks // S + 1):
            if (ranks // S) % G:
                continue
            D = ranks // (S * G)
            if S == 1:
                out.append(AtomLayout(1, G, D))
                continue
            cs = sorted({min(k * S, num_structures) for k in chunks_per_stage})
            out += [AtomLayout(S, G, D, C, sch) for C in cs for sch in (schedulers if C > 1 else schedulers[:1])]
    return out


def stage_bounds(num_units: int, stages: int) -> list[tuple[int, int]]:
    """Units ``[lo, hi)`` of each stage: the ``equal`` layer partitioner the S2EF pipeline runs
    (:func:`~gnnpipe.partitioners.split_layers`; the first stages one longer, the embedding is unit 0)."""
    from ...partitioners import split_layers

    b = list(split_layers(int(num_units), int(stages), "equal").bounds)
    return list(zip(b[:-1], b[1:]))


#: relative durations of a micro-batch's passes on a stage, from autograd's usual proportions (a backward costs
#: about two forwards): ``F``, ``B`` with direct forces; ``F``, ``G`` (the forces' gradient with ``create_graph``),
#: ``D`` (its backward into the weights) and ``B`` with conservative forces
PASS_SHARES = {False: {"F": 1.0, "B": 2.0}, True: {"F": 1.0, "G": 2.0, "D": 2.0, "B": 2.0}}


def pipeline_compute(layout: AtomLayout, conservative: bool, work: Sequence[Sequence[float]]
                     ) -> tuple[list[float], float]:
    """``(makespan per graph-parallel rank, idle share)`` of a step's compute on the stages of ``layout``.

    ``work[g][s]``: the seconds stage ``s``'s rank ``g`` computes on the replica's share. With one stage the step is
    that work. With ``S`` stages the run's schedule — ``layout.scheduler`` from the scheduler registry, its
    second-order form with conservative forces — is simulated (:func:`gnnpipe.schedulers.simulate`) with each of
    the ``C`` micro-batches taking ``work[g][s] / C`` on stage ``s``, split over the passes by :data:`PASS_SHARES`:
    the bubbles of the schedule and of unequal stages (for ``S`` equal stages of gpipe or 1f1b the makespan is the
    textbook ``(C + S − 1) / C`` of the work; Huang et al. 2019). The idle share is that of rank 0's stages.
    """
    from ...schedulers import make_scheduler, simulate

    S, C = layout.stages, layout.chunks
    if S == 1:
        return [float(sum(w)) for w in work], 0.0
    shares = PASS_SHARES[bool(conservative)]
    total = sum(shares.values())
    sched = make_scheduler(layout.scheduler, **({"second_order": True} if conservative else {})).build(
        S, list(range(C)))
    out, idle = [], 0.0
    for g, w in enumerate(work):
        def cost(a, w=w) -> float:
            kind = getattr(a.kind, "name", str(a.kind))
            return 0.0 if kind == "STEP" else w[a.stage] / C * shares[kind] / total

        res = simulate(sched, costs=cost)
        out.append(float(res.makespan))
        if g == 0:
            idle = float(sum(res.bubble_fraction) / S)
    return out, idle


def bubble(stages: int, chunks: int) -> float:
    """The idle share of a flushing (gpipe) pipeline: ``(S − 1)/(C + S − 1)`` (Huang et al. 2019)."""
    return (stages - 1) / (chunks + stages - 1)


@attrs.define
class AtomRankMemory:
    """Predicted bytes of one rank above the runtime floor, by kind (module docstring)."""

    rank: int
    stage: int
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    ema: int = 0
    allreduce: int = 0
    activations: int = 0
    graph: int = 0

    @property
    def states(self) -> int:
        """Parameters, gradients and optimizer state (with the EMA copy)."""
        return self.parameters + self.gradients + self.optimizer + self.ema

    @property
    def peak(self) -> int:
        return self.states + self.allreduce + self.activations + self.graph

    def to_dict(self) -> dict:
        return {**attrs.asdict(self), "peak": self.peak}


@attrs.define
class AtomPrediction:
    """Predictions for one layout: ``step_s`` seconds per training step (slowest rank, with the gradient
    all-reduce), ``compute_s``/``comm_s`` per rank, ``bytes`` per step summed over ranks (``gp``: the graph-parallel
    collectives, exact for ``S = 1``; ``grad``: the gradient all-reduce; ``boundary``: pipeline boundaries),
    ``memory`` per rank, ``fits`` the hardware's memory, ``bubble`` (gpipe's idle share), ``work_s`` per rank the
    predicted CPU seconds of its step's compute (from the profile's CPU seconds: compare with a run's CPU time when
    other processes share the cores)."""

    layout: AtomLayout
    step_s: float
    compute_s: list
    comm_s: list
    bytes: dict
    memory: list
    fits: bool
    bubble: float = 0.0
    floor_bytes: int = 0
    structures: int = 0
    work_s: list = attrs.field(factory=list)

    @property
    def throughput(self) -> float:
        """Structures per second: ``D`` replicas' batches per step."""
        return self.layout.replicas * self.structures / self.step_s if self.step_s > 0 else float("inf")

    @property
    def max_rank_bytes(self) -> int:
        return max(m.peak for m in self.memory) + self.floor_bytes

    def to_record(self) -> dict:
        L = self.layout
        return {"layout": L.label(), "stages": L.stages, "gp": L.gp, "replicas": L.replicas, "chunks": L.chunks,
                "scheduler": L.scheduler, "step_s": self.step_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
                "bytes": self.bytes, "bubble": self.bubble, "fits": self.fits, "floor_bytes": self.floor_bytes,
                "max_rank_bytes": self.max_rank_bytes,
                "structures_per_s": self.throughput, "memory": [m.to_dict() for m in self.memory]}


@attrs.frozen
class AtomJob:
    """What the cost model predicts for: a model, the global batch (``structures``: PyG ``Data``), the graph
    settings, the graph-parallel partitioner and mode, dtype size, the optimizer's states.

    Attributes:
        model: the zoo model (may live on the ``meta`` device: only its sizes are read).
        structures: one replica's batch (``--batch-size`` structures: every replica steps on a batch of this
            size, the global batch is ``D`` of them, as the S2EF trainer does).
        element_size: ``b`` of the training dtype. ema: the trainer keeps an EMA copy of the weights.
        allreduce_element_size: bytes per value of the gradient all-reduce (the S2EF trainer's flat buffer is
            float64: 8).
    """

    model: Any
    structures: list
    cutoff: float
    max_neighbors: int | None
    partitioner: str = "edge-chunk"
    mode: str = "allgather"
    element_size: int = 4
    ema: bool = False
    allreduce_element_size: int = 8
    backend: str = "gloo"


def job_graph(job: AtomJob, cache: dict | None = None):
    """``(batch, graph)`` of the job's replica batch (built once per ``cache``)."""
    cache = {} if cache is None else cache
    if "graph" not in cache:
        from torch_geometric.data import Batch

        from ...data.atoms import build_graph

        batch = Batch.from_data_list(job.structures)
        cache["graph"] = (batch, build_graph(batch, job.cutoff, job.max_neighbors,
                                             with_reverse=bool(getattr(job.model, "uses_reverse_edges", False))))
    return cache["graph"]


def _plan(job: AtomJob, G: int, cache: dict):
    if ("plan", G) not in cache:
        from ...partitioners import plan_graph_parallel

        batch, graph = job_graph(job, cache)
        cache[("plan", G)] = plan_graph_parallel(graph, G, job.partitioner, pos=batch.pos)
    return cache[("plan", G)]


def micro_batch_sizes(job: AtomJob, chunks: int, cache: dict | None = None) -> list[tuple[int, int, int]]:
    """``(edges, triplets, atoms)`` of each of the ``chunks`` micro-batches the S2EF pipeline cuts the job's replica
    batch into (``torch.tensor_split`` of its structures: contiguous, as even as possible; an empty one is
    ``(0, 0, 0)``)."""
    import torch

    _, graph = job_graph(job, cache)
    B = len(job.structures)
    of_edge = graph.batch[graph.edge_index[1]]
    e = torch.bincount(of_edge, minlength=B)
    t = (torch.bincount(of_edge[graph.idx_ji], minlength=B) if graph.idx_ji is not None
         else torch.zeros(B, dtype=torch.long))
    n = torch.bincount(graph.batch, minlength=B)
    return [(int(e[part].sum()), int(t[part].sum()), int(n[part].sum()))
            for part in torch.tensor_split(torch.arange(B), chunks)]


def read_edges(plan: Any, mode: str) -> list[int]:
    """Per rank, the edge rows its triplets read: all ``E`` (``allgather``; one rank: its own), or its own and its
    halo rows (``halo``)."""
    if plan.num_ranks == 1:
        return [plan.num_edges]
    if mode == "allgather":
        return [plan.num_edges] * plan.num_ranks
    return [int(e) + int(h.numel()) for e, h in zip(plan.edge_counts, plan.halo)]


def rank_memory(job: AtomJob, layout: AtomLayout, plan: Any, kappa: float, kappa_d: float | None = None, *,
                cache: dict | None = None) -> list[AtomRankMemory]:
    """Per rank of one replica (``S × G`` ranks; the other replicas' are alike or smaller), the predicted bytes
    above the runtime floor (module docstring). Stage ``s`` trains its units' parameters; a gpipe stage keeps
    every micro-batch's activations of its units until the flush, a 1f1b stage ``s`` at most ``k = S − s``
    micro-batches' (``C`` in all). With conservative forces (``S > 1``) one micro-batch peaks in its ``D`` pass at
    ``kappa_d`` (default ``kappa`` × :data:`DEFAULT_KAPPA_D_RATIO`): a gpipe stage holds ``κ·kept + (κ_D − κ)·m``,
    a 1f1b stage ``κ_D·m`` and the forward of ``k − 1`` others (at most ``(k − 1)·m``), ``m`` the largest micro-batch's
    kept bytes (:func:`micro_batch_sizes`); with direct forces a 1f1b stage ``κ·k·m`` (at most ``κ·kept``)."""
    model, b = job.model, job.element_size
    per_unit = unit_parameters(model)
    bounds = stage_bounds(len(model.units), layout.stages)
    edges, triplets, atoms = plan.edge_counts, [int(t.numel()) for t in plan.triplets], plan.atom_counts
    reads = read_edges(plan, job.mode)
    pads = padded_slots(plan)
    # the step's graph (int64): edge_index and cell offsets per edge, batch per atom, idx_kj / idx_ji per triplet
    # (built when the model reads triplets or under graph parallelism), and a graph-parallel rank's local view
    tri = bool(getattr(model, "uses_triplets", True)) or layout.gp > 1
    E, T, N = plan.num_edges, plan.num_triplets, plan.num_nodes

    def allreduce(P: int) -> int:
        # the gradients are summed over the D·G ranks of a stage only: none alone or in a pure pipeline; the
        # single process's and graph parallelism's flat buffer holds the loss too (allreduce_element_size), a
        # pipeline stage's is of the training dtype
        if layout.gp * layout.replicas == 1:
            return 0
        return P * b if layout.stages > 1 else (P + 1) * job.allreduce_element_size

    second = layout.stages > 1 and _conservative(model)  # the pipeline's G, D, B passes
    if layout.stages > 1:
        kappa_d = kappa * DEFAULT_KAPPA_D_RATIO if kappa_d is None else kappa_d
        mbs = micro_batch_sizes(job, layout.chunks, cache)
        K = sum(pads) / E if E else 0.0  # the padded slots per edge
    out = []
    for s, (lo, hi) in enumerate(bounds):
        P = sum(per_unit[lo:hi])
        k = min(layout.stages - s, layout.chunks) if layout.stages > 1 and layout.scheduler == "1f1b" else layout.chunks
        widths, boundary = stage_widths(model, lo, hi)
        factor = kappa
        if layout.stages > 1:  # the largest micro-batch's share of the stage's kept bytes
            whole = widths.total(E, T, N, E, K * E)
            largest = max(widths.total(e, t, n, e, K * e) for e, t, n in mbs) / whole if whole else 0.0
            if second:
                factor = (min((k - 1) * largest, 1.0 - largest) + kappa_d * largest if layout.scheduler == "1f1b"
                          else kappa + (kappa_d - kappa) * largest)
            elif layout.scheduler == "1f1b":
                factor = kappa * min(k * largest, 1.0)
        for g in range(layout.gp):
            gbytes = 40 * E + 8 * N + (16 * T if tri else 0)
            if layout.gp > 1:
                gbytes += 40 * edges[g] + 16 * triplets[g]
            kept = factor * b * widths.total(edges[g], triplets[g], atoms[g], reads[g], pads[g])
            kept += b * boundary.total(edges[g], 0, atoms[g]) * k / layout.chunks
            out.append(AtomRankMemory(
                rank=s * layout.gp + g, stage=s, parameters=P * b, gradients=P * b, optimizer=2 * P * b,
                ema=P * b if job.ema else 0, allreduce=allreduce(P),
                activations=int(kept), graph=int(gbytes)))
    return out


#: a link for a prediction without a measured one or a hardware description's (loopback gloo, order of magnitude)
FALLBACK_LINK = (50e-6, 1e9)
#: the runtime floor per GPU rank assumed for projections (CUDA context, allocator reserve, NCCL buffers)
GPU_FLOOR_BYTES = 2 * 2 ** 30


def boundary_widths(model: Any) -> UnitWidths:
    """Values per owned edge and atom crossing a stage boundary (forward; its gradient goes back), as the model counts
    them (:meth:`~gnnpipe.models.atomistic.AtomisticModel.boundary_widths`); the geometry and the parameter-free
    bases are recomputed by each stage."""
    return model.boundary_widths()


def predict_layout(job: AtomJob, layout: AtomLayout, profile: AtomProfile, hardware: Any = None, *,
                   cache: dict | None = None, floor_bytes: int | None = None) -> AtomPrediction:
    """Predict one layout (module docstring): step time, bytes, per-rank memory and whether it fits."""
    from ...costmodel.hardware import Link, local_hardware

    hw = hardware if hardware is not None else local_hardware()
    cache = {} if cache is None else cache
    S, G, D, C = layout.stages, layout.gp, layout.replicas, layout.chunks
    R = layout.ranks
    model, b = job.model, job.element_size
    plan = _plan(job, G, cache)
    B = len(job.structures)
    conservative = not bool(getattr(model, "direct_forces", False))
    per_unit_bytes = step_bytes(model, plan, num_structures=B, mode=job.mode, element_size=b, backend=job.backend)
    colls = step_collectives(model, plan, num_structures=B, mode=job.mode, element_size=b, backend=job.backend)
    bounds = stage_bounds(len(model.units), S)
    works = work_weights(model)
    per_unit_p = unit_parameters(model)
    edges, triplets, atoms = plan.edge_counts, [int(t.numel()) for t in plan.triplets], plan.atom_counts
    reads = read_edges(plan, job.mode)
    pads = padded_slots(plan)
    measured = Link(*(profile.link or FALLBACK_LINK))
    members = list(range(G))  # one GP group of the first replica (block placement: the tightest group)
    gp_link = hw.group_link(members, R, measured)
    grad_link = hw.group_link(list(range(0, R, S)) if S > 1 else list(range(R)), R, measured)
    stage_link = hw.link(0, G, R, measured) if S > 1 else measured
    slow = max(1.0, hw.oversubscription(R)) if hw.kind == "cpu" else 1.0
    spw = profile.seconds_per_work / hw.speed
    bw_unit = boundary_widths(model)
    work_s: dict[tuple[int, int], float] = {}  # (stage, gp rank) -> seconds of the stage's compute on the share
    comm_s: dict[tuple[int, int], float] = {}  # (stage, gp rank) -> seconds of its communication outside compute
    cpu = []
    gp_total = bnd_total = grad_total = 0.0
    for s, (lo, hi) in enumerate(bounds):
        P = sum(per_unit_p[lo:hi])
        units = set(range(lo, hi)) | ({-1} if hi == len(model.units) else set())
        # a pipeline stage's flat gradient is of the training dtype; one stage's also holds the loss (float64)
        ar_bytes = P * b if S > 1 else (P + 1) * job.allreduce_element_size
        ar_s = grad_link.allreduce_time(ar_bytes, D * G)
        grad_total += D * G * (2.0 * (D * G - 1) * ar_bytes / (D * G) if D * G > 1 else 0.0)
        for g in range(G):
            work = sum(w.total(edges[g], triplets[g], atoms[g], reads[g], pads[g]) for w in works[lo:hi])
            work_s[s, g] = spw * work * slow
            gb = sum(v for u, v in per_unit_bytes[g].items() if u in units)
            share = (hi - lo) / len(model.units)
            n_coll = colls[g] * share * (C if S > 1 else 1)
            t_gp = gb / gp_link.bandwidth_Bps + n_coll * 2 * max(G - 1, 0) * gp_link.latency_s if G > 1 else 0.0
            nb = 0.0
            if S > 1:
                sides = (s > 0) + (s < S - 1)
                # per side: F (or B) carries the boundary; with conservative forces G and D carry it again with
                # the running position gradient (3 per atom)
                nb = sides * b * (bw_unit.total(edges[g], 0, atoms[g]) * (2 if conservative else 1)
                                  + (3 * atoms[g] if conservative else 0))
            t_b = nb / stage_link.bandwidth_Bps + (C * (2 if conservative else 1) * sides * stage_link.latency_s
                                                   if S > 1 else 0.0)
            gp_total += D * gb
            bnd_total += D * nb
            cpu.append(profile.step_cpu_s / max(profile.work, 1.0) * work / hw.speed)
            comm_s[s, g] = t_gp + t_b + ar_s
    # the stages' compute through the run's own schedule (its bubbles, unequal stages), per graph-parallel rank
    makespan, idle = pipeline_compute(layout, conservative, [[work_s[s, g] for s in range(S)] for g in range(G)])
    compute = [makespan[g] for s in range(S) for g in range(G)]
    comm = [comm_s[s, g] for s in range(S) for g in range(G)]
    step = max(makespan[g] + comm_s[s, g] for s in range(S) for g in range(G))
    mem = rank_memory(job, layout, plan, profile.kappa, profile.retained_kappa, cache=cache)
    if floor_bytes is None:
        floor_bytes = GPU_FLOOR_BYTES if hw.kind == "gpu" else profile.floor_bytes
    fits = hw.fits([m.peak + floor_bytes for m in mem] * D)
    return AtomPrediction(layout=layout, step_s=step, compute_s=compute, comm_s=comm,
                          bytes={"gp": gp_total, "grad": grad_total, "boundary": bnd_total}, memory=mem, fits=fits,
                          bubble=idle, floor_bytes=int(floor_bytes), structures=B,
                          work_s=cpu)


def local_gpu_hardware() -> Any:
    """This machine's GPUs as a :class:`~gnnpipe.costmodel.hardware.Hardware` of kind ``"gpu"`` (one node, a device
    per GPU, each GPU's total memory as the device limit; links: the profile's), for plans profiled on CUDA.

    Raises:
        ConfigError: no CUDA GPU here.
    """
    import torch

    from ...costmodel.hardware import Hardware
    from ...errors import ConfigError

    if not torch.cuda.is_available():
        raise ConfigError("--device cuda needs a CUDA GPU, and none is available; use --device cpu")
    n = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    return Hardware(name=f"this machine's {n} x {props.name}", nodes=1, devices_per_node=n, kind="gpu", speed=1.0,
                    device_memory_bytes=int(props.total_memory))


def layout_memory(job: AtomJob, layout: AtomLayout, profile: AtomProfile, *, floor_bytes: int | None = None
                  ) -> list[int]:
    """Per rank of ``layout`` (``D × S × G`` ranks in rank order, rank ``(d·S + s)·G + g``), the predicted peak
    in bytes: :func:`rank_memory` of the first replica (the others' are alike) plus the runtime floor
    (``floor_bytes``; default the profile's on the CPU, :data:`GPU_FLOOR_BYTES` for a profile taken on a GPU).

    Raises:
        ModelDescriptionError: a model that does not describe its widths.
    """
    cache: dict = {}
    plan = _plan(job, layout.gp, cache)
    mem = rank_memory(job, layout, plan, profile.kappa, profile.retained_kappa, cache=cache)
    if floor_bytes is None:
        floor_bytes = GPU_FLOOR_BYTES if profile.device == "cuda" else profile.floor_bytes
    return [m.peak + int(floor_bytes) for m in mem] * layout.replicas


def check_device_memory(per_rank: Sequence[int], free: Sequence[int], *, names: Sequence[str] | None = None,
                        what: str = "") -> None:
    """Refuse, before any rank starts, ranks whose predicted peaks do not fit their GPUs: local rank ``r`` computes
    on GPU ``r mod len(free)`` (round robin, as the ranks place themselves), so each GPU must hold the sum of its
    ranks' predictions.

    Args:
        per_rank: predicted bytes of each local rank (:func:`layout_memory`). free: free bytes of each GPU
            (``torch.cuda.mem_get_info``). names: the GPUs' names for the message. what: the layout, for the message.

    Raises:
        ConfigError: a GPU whose ranks need more than it has free; the message gives the prediction, the free
            memory and the ways out.
    """
    from ...errors import ConfigError

    if not free:
        return
    need = [0] * len(free)
    ranks: list[list[int]] = [[] for _ in free]
    for r, b in enumerate(per_rank):
        need[r % len(free)] += int(b)
        ranks[r % len(free)].append(r)
    for g, (n, f) in enumerate(zip(need, free)):
        if n > f:
            name = f" ({names[g]})" if names else ""
            who = f"rank {ranks[g][0]}" if len(ranks[g]) == 1 else f"ranks {', '.join(map(str, ranks[g]))}"
            raise ConfigError(
                f"the memory model predicts {_gib(n)} GiB on GPU {g}{name} for {who}{what} (the largest "
                f"{_gib(max(per_rank[r] for r in ranks[g]))} GiB), but {_gib(f)} GiB are free there; spread the "
                f"structures' graphs over more ranks (--gp-size), the blocks over --stages, use a smaller "
                f"--batch-size or --amp, or pass --no-memory-check to try anyway")


def plan_atomistic(job: AtomJob, ranks: int, profile: AtomProfile, hardware: Any = None, *,
                   chunks_per_stage: Sequence[int] = (1, 4), schedulers: Sequence[str] = ("gpipe", "1f1b"),
                   stages: bool = True, floor_bytes: int | None = None) -> list[AtomPrediction]:
    """Predict every ``S × G × D`` layout of ``ranks`` (:func:`enumerate_atom_layouts`); those that fit first, then by
    step time.

    Sorted by throughput (structures per second: ``D·B / step``), those that fit first.

    Raises:
        ConfigError: bad ``ranks``.
    """
    layouts = enumerate_atom_layouts(ranks, len(job.model.units), len(job.structures),
                                     chunks_per_stage=chunks_per_stage, schedulers=schedulers, stages=stages)
    cache: dict = {}
    preds = [predict_layout(job, lay, profile, hardware, cache=cache, floor_bytes=floor_bytes) for lay in layouts]
    return sorted(preds, key=lambda p: (not p.fits, p.step_s / p.layout.replicas))


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f}"


def format_atom_ranking(preds: Sequence[AtomPrediction], hardware: Any = None, *, params: int | None = None) -> str:
    """The ranking as a table: layout, step seconds, structures per second, MB per step (gp, gradient, boundary), the largest rank's
    parameters+gradients+Adam (GiB), its activations (GiB), its total with the floor (GiB), fits."""
    head = f"{'layout':<22} {'step s':>9} {'struct/s':>9} {'gp MB':>9} {'grad MB':>9} {'bnd MB':>8} {'states GiB':>10} " \
           f"{'act GiB':>8} {'rank GiB':>9} {'bubble':>6}  fits"
    lines = []
    if hardware is not None:
        lines.append(f"hardware: {hardware.name}" + (f"; {params:.3g} parameters" if params else ""))
    lines.append(head)
    for p in preds:
        top = max(p.memory, key=lambda m: m.peak)
        lines.append(f"{p.layout.label():<22} {p.step_s:>9.3g} {p.throughput:>9.3g} {p.bytes['gp'] / 1e6:>9.2f} {p.bytes['grad'] / 1e6:>9.1f} "
                     f"{p.bytes['boundary'] / 1e6:>8.2f} {_gib(top.states + top.allreduce):>10} {_gib(top.activations):>8} "
                     f"{_gib(p.max_rank_bytes):>9} {p.bubble:>6.2f}  {'yes' if p.fits else 'NO'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- projections
#: hidden widths by parameter count when a projection does not fix one: DimeNet++ with ``I = H/2``, ``O = H``
PROJECTION_WIDTHS = ((3e8, 1024), (float("inf"), 2048))


def size_for_params(name: str, params: float, *, hidden: int | None = None, **options: Any) -> tuple[Any, dict]:
    """A ``name`` model (on the ``meta`` device: no memory) of about ``params`` trained parameters: the width
    ``hidden`` (default :data:`PROJECTION_WIDTHS`; DimeNet++ also ``int_emb_size = H/2``, ``out_emb_channels = H``
    unless given) and the number of interaction blocks that comes closest. Returns ``(model, build arguments)``.

    Raises:
        ConfigError: ``params`` not positive, or not reachable with at least one block.
    """
    import torch

    from ...errors import ConfigError
    from ...models import build_model

    if not params or params <= 0:
        raise ConfigError(f"--params must be a positive number of parameters, got {params!r}")
    if hidden is None:
        hidden = next(h for limit, h in PROJECTION_WIDTHS if params <= limit)
    kw = dict(options)
    if name == "dimenet++":
        kw.setdefault("int_emb_size", max(hidden // 2, 1))
        kw.setdefault("out_emb_channels", hidden)
    with torch.device("meta"):
        p1 = num_parameters(build_model(name, 0, 1, num_layers=1, hidden=hidden, **kw))
        p2 = num_parameters(build_model(name, 0, 1, num_layers=2, hidden=hidden, **kw))
        blocks = max(1, round((params - p1) / (p2 - p1)) + 1)
        model = build_model(name, 0, 1, num_layers=blocks, hidden=hidden, **kw)
    args = {"num_layers": blocks, "hidden": hidden, **kw}
    return model, args


def oc20_sized_structures(n: int, seed: int = 0, dtype=None) -> list:
    """``n`` structures of OC20's size (no labels: costs only): a periodic (x, y) ``fcc111`` slab of 4 × 4 × 4
    atoms of a metal (Cu, Ag, Au, Ni, Pd, Pt, Al) with an adsorbate (O, H, N, C, CO, OH) on the top layer, 8 Å
    of vacuum: 65–66 atoms (OC20's S2EF structures: ~73 atoms on average, Chanussot et al. 2021)."""
    import numpy as np
    import torch
    from ase import Atoms
    from ase.build import add_adsorbate, fcc111, molecule
    from torch_geometric.data import Data

    rng = np.random.default_rng(seed)
    dtype = dtype or torch.float32
    out = []
    for _ in range(int(n)):
        metal = str(rng.choice(["Cu", "Ag", "Au", "Ni", "Pd", "Pt", "Al"]))
        ads = str(rng.choice(["O", "H", "N", "C", "CO", "OH"]))
        slab = fcc111(metal, size=(4, 4, 4), vacuum=8.0)
        mol = molecule(ads) if len(ads) > 1 else Atoms(ads)
        add_adsorbate(slab, mol, 1.8, str(rng.choice(["ontop", "fcc", "hcp"])))
        slab.rattle(0.05, seed=int(rng.integers(1 << 30)))
        k = len(slab)
        out.append(Data(z=torch.as_tensor(slab.numbers, dtype=torch.long), pos=torch.as_tensor(slab.positions, dtype=dtype),
                        cell=torch.as_tensor(np.array(slab.cell), dtype=dtype).reshape(1, 3, 3),
                        pbc=torch.tensor([[True, True, False]]), energy=torch.zeros(1, dtype=dtype),
                        forces=torch.zeros(k, 3, dtype=dtype), natoms=torch.tensor([k])))
    return out
