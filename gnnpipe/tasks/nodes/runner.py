"""Composes data, plan and executors into a run: plan building, the per-rank worker, result assembly."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import attrs
import torch
import torch.distributed as dist

from ... import correctors, partitioners, schedulers
from ... import correctors as corr
from ...core.comm import Comm, collective_device
from ...core.grid import RankGrid
from ...core.run import stopping
from ...core.run.launch import format_wait_limit, plan_backend, rank_device
from ...core.run.loop import epoch_loop
from ...core.run.session import RunSession
from ...core.run.state import gather_state
from ...core.runtime.execute import build_validated
from ...core.runtime.memory import peak_memory_bytes, return_free_memory
from ...core.settings.config import TrainConfig, ignored_options
from ...errors import ConfigError
from ...partitioners import ChunkPlan, partition_metrics, split_layers
from ...schedulers import FixedOrder
from .graphfile import GraphFile, release_edge_pages
from .parallel import make_graph_parallel_way, make_hybrid_member
from .pipeline import make_pipeline_stage
from .profile import profiled_split
from .trainer import make_model


@attrs.define
class RunPlan:
    """The layout of a distributed run, computed once (in the launcher) and shipped to every rank.

    Attributes:
        data: the relabelled graph (chunks are contiguous id ranges).
        chunk_ptr: ``LongTensor[C+1]``. way_ptr: ``LongTensor[W+1]`` (chunk index bounds per way).
        bounds: unit boundaries of the ``S`` stages (``S+1`` ints).
        num_features, num_classes: model input / output widths.
        info: a JSON-able description (printed at start, stored in the result).
    """

    data: Any
    chunk_ptr: torch.Tensor
    way_ptr: torch.Tensor
    bounds: list[int]
    num_features: int
    num_classes: int
    info: dict = attrs.field(factory=dict)


def num_classes_of(data) -> int:
    m = data.train_mask | data.val_mask | data.test_mask
    return int(data.y[m].max()) + 1


def default_chunks(config: TrainConfig) -> int:
    """``C`` default: 4 chunks per pipeline rank and way (GNNPipe paper §5: C = 4·S), 1 per way when S = 1.
    Graph parallelism (``W > 1``, ``S = 1``) always has one part per way: a ``--chunks`` there is ignored (with a
    warning, :func:`gnnpipe.core.settings.config.ignored_options`), and the partition is the ways' alone."""
    if config.stages == 1 and config.ways > 1:
        return config.ways
    if config.chunks is not None:
        return config.chunks
    return config.ways * (4 * config.stages if config.stages > 1 else 1)


def check_parallel_config(config: TrainConfig, num_chunks: int) -> None:
    """Reject W × S layouts the executors cannot run.

    Raises:
        ConfigError: hybrid (``W > 1`` and ``S > 1``) with ``C`` not divisible by ``W``.
    """
    if config.ways > 1 and config.stages > 1 and num_chunks % config.ways:
        raise ConfigError(f"the hybrid mode needs the same number of chunks on every way: {num_chunks} chunks "
                          f"cannot be split evenly over {config.ways} ways; use a multiple of {config.ways}")


def check_config(config: TrainConfig, num_nodes: int, num_units: int) -> None:
    """Reject configurations that cannot run, before any process starts.

    Raises:
        ConfigError, UnknownComponentError: unknown component names, ``S`` > units, ``C`` > ``N``,
            ``C`` < ``W``.
    """
    schedulers.get(config.scheduler)
    _ = config.torch_history_dtype  # an unknown --history-dtype fails here
    if config.stash_weights and schedulers.get(config.scheduler).flush:
        raise ConfigError(f"--stash-weights needs a scheduler that does not flush (e.g. async-stale); "
                          f"{config.scheduler!r} flushes every epoch, so its weights are never stale")
    partitioners.get(config.partitioner)
    partitioners.get_layer_partitioner(config.layer_split)
    correctors.build_correctors(config.correctors)
    if config.stages > num_units:
        raise ConfigError(f"{config.stages} stages but the model has only {num_units} layer units "
                          f"(encoder + {num_units - 2} layers + head); use at most {num_units} stages or more layers")
    C = default_chunks(config)
    if C > num_nodes:
        if config.stages == 1 and config.ways > 1:
            raise ConfigError(f"{config.ways} ways (one part of the graph each) but the graph has only {num_nodes} "
                              f"vertices; use fewer ways")
        raise ConfigError(f"{C} chunks but the graph has only {num_nodes} vertices; use fewer chunks")
    if C < config.ways:
        raise ConfigError(f"{C} chunks cannot be split over {config.ways} ways; use at least one chunk per way")
    check_parallel_config(config, C)
    plan_backend(config)  # raises on an unknown backend or device, nccl without one GPU per rank, cuda without GPU
    ignored = ignored_options(config)
    if ignored:
        warnings.warn("ignored: " + "; ".join(ignored), stacklevel=2)


def build_plan(config: TrainConfig, data) -> RunPlan:
    """Chunk/partition the graph and split the layers into stages."""
    F, Cls = int(data.x.size(1)), num_classes_of(data)
    model = make_model(config, F, Cls)
    check_config(config, data.num_nodes, model.num_units)
    C = default_chunks(config)
    t0 = time.perf_counter()
    over = config.over_partition if config.stages > 1 else 1
    if C == 1:
        parts = torch.zeros(data.num_nodes, dtype=torch.long)
        plan = ChunkPlan.from_parts(data, parts, num_ways=1)
    else:
        plan = ChunkPlan.build(data, C, config.partitioner, over=over, seed=config.seed, num_ways=config.ways)
    t_part = time.perf_counter() - t0
    rdata = plan.data
    if config.layer_split == "profiled" and config.stages > 1:
        # time every unit as the pipeline runs it: chunk by chunk with the history-backed op (a chunk's
        # aggregation also reads its halo from cold history, which a whole-graph profile misses), then
        # refine the split for this schedule's simulated makespan with separate forward/backward costs
        # (one way only: a hybrid way runs C/W of the chunks, a schedule the profile does not cover)

        split = profiled_split(model, config.stages, data=rdata, repeats=2, chunk_ptr=plan.chunk_ptr,
                               scheduler=_scheduler(config) if config.ways == 1 else None)
    else:
        split = split_layers(model, config.stages, config.layer_split)
    bounds = [int(b) for b in split.bounds]
    phase_costs = split.stage_phase_costs() or (None, None)
    backend, backend_reason = plan_backend(config)
    info = {
        "backend": backend, "backend_reason": backend_reason,
        "ways": config.ways, "stages": config.stages, "chunks": C, "world_size": config.world_size,
        "layout": "rank = way * stages + stage",
        "scheduler": config.scheduler if config.stages > 1 else None,
        "num_nodes": int(data.num_nodes), "num_edges": int(data.edge_index.size(1)),
        "num_units": model.num_units, "stage_bounds": bounds,
        "stage_costs": [float(c) for c in split.stage_costs],
        # measured seconds of each stage on each chunk (profiled split only): S × C lists
        "stage_chunk_forward_s": phase_costs[0],
        "stage_chunk_backward_s": phase_costs[1],
        "chunk_sizes": [int(b - a) for a, b in zip(plan.chunk_ptr[:-1].tolist(), plan.chunk_ptr[1:].tolist())],
        "chunk_order": "locality",  # vertex order inside chunks (ChunkPlan.build's default)
        "way_ptr": [int(w) for w in plan.way_ptr.tolist()],
        "partition_time_s": t_part,
    }
    info["rank_holds"] = rank_holdings(config, model, bounds, plan.chunk_ptr, plan.way_ptr)
    if config.ways > 1:
        way_of = torch.zeros(data.num_nodes, dtype=torch.long)
        for w in range(config.ways):
            a, b = plan.way_rows(w)
            way_of[a:b] = w
        m = partition_metrics(rdata.edge_index, rdata.num_nodes, way_of)
        info["mirror_count"] = int(m.mirror_count)
        info["edge_cut"] = int(m.edge_cut)
    return RunPlan(data=rdata, chunk_ptr=plan.chunk_ptr.clone(), way_ptr=plan.way_ptr.clone(), bounds=bounds,
                   num_features=F, num_classes=Cls, info=info)


def file_backed(plan: RunPlan, folder: str) -> RunPlan:
    """A copy of ``plan`` whose graph is a :class:`~gnnpipe.tasks.nodes.graphfile.GraphFile` written into ``folder``
    (``graph.pt``): shipping the plan to a rank then pickles a path, not the graph, and each rank memory-maps the
    file and reads only the slices its role needs."""
    gf = GraphFile.write(plan.data, os.path.join(folder, "graph.pt"))
    return attrs.evolve(plan, data=gf)


def rank_holdings(config: TrainConfig, model, bounds: list[int], chunk_ptr: torch.Tensor,
                  way_ptr: torch.Tensor) -> list[str]:
    """What each rank materialises (lean ranks), one line per rank: the rows of ``x`` (first stage of
    each way only), of the labels and masks (last stage only), its units' parameters and optimizer state, the
    rows of ``Â``/``Âᵀ`` it builds and its history buffers."""
    W, S = config.ways, config.stages
    N = int(chunk_ptr[-1])
    out = []
    for rank in range(W * S):
        w, s = divmod(rank, S)
        c0, c1 = int(way_ptr[w]), int(way_ptr[w + 1])
        lo, hi = int(chunk_ptr[c0]), int(chunk_ptr[c1])
        units = range(int(bounds[s]), int(bounds[s + 1]))
        parts = [f"x rows {lo}:{hi}" if s == 0 else "no x"]
        parts.append(f"labels+masks rows {lo}:{hi}" if s == S - 1 else "no labels")
        parts.append(f"params+Adam of units {units.start}-{units.stop - 1}")
        n_ops = sum(len(model.units[i].aggregations) for i in units)
        if S == 1 and W > 1:
            parts.append(f"Â/Âᵀ rows {lo}:{hi} (+ halo columns)")
        else:
            push = any(getattr(model.units[i], "message_passing", False) for i in units)
            what = "Â/Âᵀ rows (message-passing units: in-edges)" if push else "Â/Âᵀ rows"
            parts.append(f"{what} of its {c1 - c0} chunk(s) ({hi - lo} rows)")
            parts.append(f"{n_ops} history op(s) of N={N} rows in {config.history_dtype or config.dtype}"
                         + (f" (pushed gradients in {config.dtype})" if push and config.history_dtype else ""))
        out.append(f"rank {rank} (way {w}, stage {s}): " + ", ".join(parts))
    return out


def share_profiled_split(config: TrainConfig, plan: RunPlan) -> None:
    """Make every rank run rank 0's layer split (in place; call after the process group is up).

    A profiled split comes from timings: ranks that built their plans themselves (``torchrun``: each rank
    runs :func:`build_plan`) may have measured differently and chosen different stage boundaries, which
    would pair mismatched stages. The chunking is deterministic (seeded) and is not exchanged.
    No-op unless ``layer_split == "profiled"`` and ``stages > 1``.
    """
    if config.layer_split != "profiled" or config.stages <= 1:
        return
    shared = [plan.bounds, plan.info]
    dist.broadcast_object_list(shared, src=0)
    plan.bounds, plan.info = shared[0], shared[1]


def format_plan(info: dict) -> str:
    """A one-paragraph description of a plan for the start of a run."""
    s = (f"plan: {info['ways']} way(s) x {info['stages']} stage(s) = {info['world_size']} rank(s), "
         f"{info['chunks']} chunk(s) (sizes {min(info['chunk_sizes'])}–{max(info['chunk_sizes'])}), "
         f"N={info['num_nodes']}, E={info['num_edges']}; stage unit bounds {info['stage_bounds']}")
    if "mirror_count" in info:
        s += f"; mirrors M={info['mirror_count']}"
    if info["world_size"] > 1:
        s += f"; layout: {info['layout']}"
    if info.get("scheduler") and info["stages"] > 1:
        s += f"; scheduler {info['scheduler']}"
    if "backend" in info:
        s += f"; backend {info['backend']} ({info['backend_reason']})"
    if info.get("wait_limit"):
        s += "\n  " + format_wait_limit(info["wait_limit"]["seconds"], info["wait_limit"]["why"])
    if info.get("recompute"):
        s += f"\n  recompute: {'on' if info['recompute']['on'] else 'off'} ({info['recompute']['why']})"
    if info.get("rank_holds"):
        s += "\n" + "\n".join("  " + line for line in info["rank_holds"])
    if info.get("predicted_mem_bytes"):
        s += ("\n  predicted peak memory per rank above the runtime floor (memory model): "
              + ", ".join(f"{m / 2**20:,.0f}" for m in info["predicted_mem_bytes"]) + " MiB")
    return s


# ---------------------------------------------------------------------------------------------- worker
def _order_policy(config: TrainConfig, correctors):
    for k in correctors:
        pol = k.order_policy(config.seed)
        if pol is not None:
            return pol
    return FixedOrder()


def _scheduler(config: TrainConfig):
    """The configured scheduler, from the one factory :func:`gnnpipe.schedulers.make_scheduler` (the
    ``stash_weights`` option passed only when asked, so schedulers without that option work)."""
    options = {"stash_weights": True} if config.stash_weights else {}
    return schedulers.make_scheduler(config.scheduler, **options)


def check_schedule(config: TrainConfig, plan: RunPlan) -> None:
    """Build and validate the schedule of the first epoch (window) before any rank starts, with the chunk
    order policy the ranks will use, so that an invalid custom scheduler fails here with its problems and
    picture instead of in every rank (which validate it again before running it). No-op for graph
    parallelism (no pipeline schedule).

    Raises:
        ScheduleError: the schedule is invalid (message: the problems and the ASCII picture).
    """
    if config.stages == 1 and config.ways > 1:
        return
    C = (len(plan.chunk_ptr) - 1) // config.ways
    scheduler = _scheduler(config)
    policy = _order_policy(config, corr.build_correctors(config.correctors))
    if getattr(scheduler, "flush", True):
        window = 1
    else:
        window = min(config.eval_every, config.epochs)
    build_validated(scheduler, config.stages, [list(policy.order(e, C)) for e in range(window)])


def make_executor(config: TrainConfig, plan: RunPlan, rank: int, world: int):
    """Build this rank's executor (:class:`~gnnpipe.tasks.nodes.executor.NodeExecutor`): a pipeline stage (``W = 1``), a
    graph-parallel way (``S = 1``) or a hybrid member. Creates the process groups of a hybrid (every rank
    creates every group, in the same order).

    Raises:
        ConfigError: the world size or the plan does not match the configuration.
    """
    if world != config.world_size:
        raise ConfigError(f"world size {world} does not match ways x stages = {config.world_size}")
    stage = rank % config.stages
    # lean rank: only this stage's units are materialised (unit-seeded: the single-process weights)
    model = make_model(config, plan.num_features, plan.num_classes,
                       units=range(int(plan.bounds[stage]), int(plan.bounds[stage + 1])))
    torch.manual_seed(config.seed + 1 + 1000 * rank)
    correctors = corr.build_correctors(config.correctors)
    device = rank_device(config)
    comm = Comm(device)
    W, S = config.ways, config.stages
    if W == 1:
        ex = make_pipeline_stage(config, model, plan.data, plan.chunk_ptr, plan.bounds, rank, list(range(S)),
                                 _scheduler(config), _order_policy(config, correctors), correctors, comm, device=device)
    else:
        if len(plan.way_ptr) - 1 != W:
            raise ConfigError(f"the plan has {len(plan.way_ptr) - 1} ways, the configuration {W}")
        check_parallel_config(config, len(plan.chunk_ptr) - 1)
        if S == 1:  # correctors are unused in GP (exact: no history)
            ex = make_graph_parallel_way(config, model, plan, rank, comm, group=None, ranks=list(range(W)),
                                         device=device)
        else:
            grid = RankGrid.of(way=W, stage=S)  # every rank creates every group, in one order
            peer_group = grid.new_group(("way",), rank)
            pipe_group = grid.new_group(("stage",), rank)
            at = grid.coords(rank)
            ex = make_hybrid_member(config, model, plan, at["way"], at["stage"], _scheduler(config),
                                    _order_policy(config, correctors), correctors, comm, peer_group, pipe_group,
                                    device=device)
    release_edge_pages(plan.data)  # the rows of Â are built: the edge list is not read again
    return ex


def _gather_epoch(stage, wall: float, loss: float, cpu: float = 0.0) -> dict:
    c = stage.comm.counters()
    vec = torch.tensor([loss, c["bytes_layer"], c["bytes_graph"], c["bytes_weight"], c["bytes_eval"],
                        wall, c["comm_s"], c["idle_s"], cpu], dtype=torch.float64,
                       device=collective_device(stage.device))
    out = [torch.zeros_like(vec) for _ in range(dist.get_world_size())]
    dist.all_gather(out, vec)
    m = torch.stack(out).cpu()
    walls, comms, idles = m[:, 5].tolist(), m[:, 6].tolist(), m[:, 7].tolist()
    return {
        "loss": float(m[:, 0].sum()),
        "time_s": max(walls),
        "bytes_layer": int(round(float(m[:, 1].sum()))),
        "bytes_graph": int(round(float(m[:, 2].sum()))),
        "bytes_weight": int(round(float(m[:, 3].sum()))),
        "compute_s": [w - c_ - i for w, c_, i in zip(walls, comms, idles)],
        # CPU time of each rank's main thread over the epoch (time.thread_time): its compute, whatever else
        # shares its core (transport threads, other ranks, other processes) — wall-based compute_s counts those
        "cpu_s": m[:, 8].tolist(),
        "comm_s": comms,
        "idle_s": idles,
    }


def worker(rank: int, world: int, config: TrainConfig, plan: RunPlan, progress: bool = True,
           collect: dict | None = None, options=None, records=None) -> dict | None:
    """The function every rank runs: build its executor, train with the shared epoch loop, return results.

    Rank 0 returns ``{"result": TrainResult, "model_state": {name: Tensor}}`` (the single-process model's
    state assembled from all stages, see :mod:`gnnpipe.core.run.state`); other ranks ``None``.
    ``options``: :class:`~gnnpipe.core.settings.options.RunOptions`. ``records``: a connection rank 0 sends each
    epoch record to as it is appended (the launcher keeps them for an interrupted run's result).
    ``collect`` (tests) may ask for ``{"grads_after": [epochs…]}`` (gradients of each rank's parameters
    right after those epochs) and ``{"no_eval": True}``.
    """
    torch.set_num_threads(config.threads)
    stage = make_executor(config, plan, rank, world)
    return_free_memory()  # what building freed stays out of training's resident peak
    session = RunSession(config, options, stage, lead=rank == 0, rank=rank, world=world, plan_info=plan.info)
    hooks = list(session.hooks)
    if records is not None and rank == 0:
        hooks.insert(len(hooks) - 1, lambda epoch, rec, st: records.send(rec))  # before the stop hook
    collect = collect or {}
    grads: dict[int, dict] = {}
    losses: list[float] = []

    def train_epoch(epoch: int) -> dict:
        stage.comm.reset()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = stage.train_epoch(epoch)
        if config.recompute:  # memory before compute: the next epoch faults the returned pages in again
            return_free_memory()
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        rec = _gather_epoch(stage, wall, out["loss"], cpu)
        if epoch + 1 in collect.get("grads_after", ()):
            grads[epoch + 1] = stage.named_grads()
        losses.append(rec["loss"])
        return rec

    def evaluate() -> dict:
        res = stage.evaluate()
        if config.recompute:
            return_free_memory()
        return res

    if collect.get("no_eval"):
        evaluate = lambda: {"train_acc": 0.0, "val_acc": 0.0, "test_acc": 0.0, "val_loss": 0.0}  # noqa: E731

    try:
        state = session.start_state()
        if records is not None and rank == 0:
            for rec in state.result.epochs:  # a resumed run's earlier epochs belong to its result too
                records.send(rec)
        with stopping.installed(announce=rank == 0):
            result = epoch_loop(config, train_epoch, evaluate, progress=progress and rank == 0,
                                desc=f"train {config.ways}x{config.stages}", state=state,
                                on_best=session.on_best, after_epoch=hooks, warn=rank == 0)
        session.finish()
    finally:
        session.close()
    # the weights of every stage to rank 0 (graph-parallel ways are replicas: way 0's)
    model_state = gather_state(session.final_state(), keep=rank // config.stages == 0)  # rank = way·S + stage
    mem = torch.tensor([float(peak_memory_bytes(stage.device)), float(stage.history_bytes())], dtype=torch.float64,
                       device=collective_device(stage.device))
    mems = [torch.zeros_like(mem) for _ in range(world)]
    dist.all_gather(mems, mem)
    mems = [m.cpu() for m in mems]
    result.extra["plan"] = plan.info
    stats = session.checkpoint_stats()
    if stats is not None:  # the same on every rank (options are), so the collective is safe
        per_rank = [None] * world
        dist.all_gather_object(per_rank, stats)
        result.extra["checkpoint"] = {"write_s": [s["write_s"] for s in per_rank],
                                      "read_s": [s["read_s"] for s in per_rank]}
    result.extra["peak_mem_bytes"] = [int(m[0]) for m in mems]
    if plan.info.get("predicted_mem_bytes"):
        result.extra["predicted_mem_bytes"] = list(plan.info["predicted_mem_bytes"])
    result.extra["history_bytes"] = [int(m[1]) for m in mems]
    # a resumed run's records may be of another layout
    ep = [e for e in result.epochs if len(e.get("idle_s", ())) == world]
    if ep:
        tot = [sum(e["time_s"] for e in ep)] * world
        idle = [sum(e["idle_s"][r] for e in ep) for r in range(world)]
        result.extra["idle_fraction"] = [i / t if t else 0.0 for i, t in zip(idle, tot)]
    if collect:
        return {"result": result if rank == 0 else None, "grads": grads, "losses": losses,
                "model_state": model_state}
    return {"result": result, "model_state": model_state} if rank == 0 else None
