"""The S2EF pipeline (``--stages S --chunks C``, with ``--gp-size G`` and ``--replicas D``) is exact (float64): every
step's energies, forces and every parameter's gradient (what the optimizer sees), the weights after the epoch, the
epoch's loss and metrics and the evaluation equal the single process on the same batches within 1e-9 relative, for
gpipe and 1f1b, direct and conservative forces (the ``G``/``D`` schedule actions). Bad configurations are refused
before any process starts."""

from __future__ import annotations

import pytest
import torch

from gnnpipe import schedulers
from gnnpipe.core.run.launch import spawn
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.s2ef import layout as P
from gnnpipe.tasks.s2ef import trainer as T

from .test_graph_parallel import MODELS, _data

pytestmark = pytest.mark.dist

#: the global batches of the epoch (indices into the training split; 0 is the dimer, alone in a micro-batch
#: with C = 2 of a 3-structure batch)
BATCHES = [[1, 0, 2], [3, 4, 0], [2]]


def _config(model: str, S: int, C: int, scheduler: str, direct: bool, G: int = 1, D: int = 1,
            mode: str = "allgather", method: str = "edge-chunk") -> TrainConfig:
    return TrainConfig(task="s2ef", model=model, layers=3, hidden=8, dtype="float64", dropout=0.0, lr=1e-2,
                       weight_decay=0.01, epochs=1, batch_size=3, ema_decay=0.5, warmup_steps=0,
                       lr_schedule="constant", clip_grad_norm=5.0, force_coef=10.0, loss_fn="mse", cutoff=3.0,
                       max_neighbors=8, direct_forces=direct, model_args=MODELS[model], stages=S, chunks=C,
                       scheduler=scheduler, graph_parallel_group_size=G, replicas=D, graph_parallel_mode=mode,
                       graph_parallel_partitioner=method)


def _patched_batches(batches):
    def fake(n, gb, seed, epoch):
        return [torch.tensor(b) for b in batches]

    return fake


def _reference(cfg: TrainConfig) -> dict:
    """The single process on the same batches: predictions, gradients before each step, weights, records."""
    torch.set_num_threads(1)
    structures, splits, norm = _data()
    tr = T.S2EFTrainer(attrs_evolve(cfg, stages=1, chunks=None, graph_parallel_group_size=1, replicas=1), structures,
                       splits, norm)
    seen = {"energy": [], "forces": [], "grads": []}
    forward, step = tr.forward, tr.optimizer.step

    def rec_forward(structs, *step):
        e, f, b, s = forward(structs, *step)
        seen["energy"].append(e.detach().clone())
        seen["forces"].append(f.detach().clone())
        return e, f, b, s

    def rec_step(*a, **k):
        seen["grads"].append({n: p.grad.clone() for n, p in tr.model.named_parameters()})
        return step(*a, **k)

    tr.forward, tr.optimizer.step = rec_forward, rec_step
    original = T.epoch_batches
    T.epoch_batches = _patched_batches(BATCHES)
    try:
        rec = tr.train_epoch(0)
    finally:
        T.epoch_batches = original
    train = {k: list(v) for k, v in seen.items()}  # the training steps only
    return {**train, "rec": rec, "eval": tr.evaluate(),
            "weights": {k: v.clone() for k, v in tr.model.state_dict().items()}}


def attrs_evolve(cfg, **kw):
    import attrs

    return attrs.evolve(cfg, **kw)


def _run(rank: int, world: int, cfg: TrainConfig) -> dict:
    torch.set_num_threads(1)
    structures, splits, norm = _data()
    tr = T.S2EFTrainer(cfg, structures, splits, norm, rank=rank, world=world)
    st = tr.pipe_stage
    seen = {"energy": [], "forces": [], "grads": []}
    backward, step = st.backward_chunk, tr.optimizer.step

    def rec_backward(c, g, e):
        ctx = st.ctx.get(c, {})
        for k in ("energy", "forces"):
            if k in ctx:
                seen[k].append((e, c, ctx[k].detach().clone()))
        return backward(c, g, e)

    def rec_step(*a, **k):
        seen["grads"].append({n: p.grad.clone() for n, p in tr.trained.named_parameters()})
        return step(*a, **k)

    st.backward_chunk, tr.optimizer.step = rec_backward, rec_step
    original = T.epoch_batches  # every layout's step loop is the trainer's (S2EFTrainer.epoch_steps)
    T.epoch_batches = _patched_batches(BATCHES)
    try:
        rec = tr.train_epoch(0)
    finally:
        T.epoch_batches = original
    train = {k: list(v) for k, v in seen.items()}
    ev = tr.evaluate()
    merged, task = tr.weights(), tr.task_state()  # collective: merged on rank 0 only
    return {**train, "rec": rec, "eval": ev, "stage": tr.stage, "replica": tr.replica,
            "weights": {k: v.clone() for k, v in tr.trained.state_dict().items()}, "merged": sorted(merged),
            "task_state": None if task is None else sorted(task["weights"])}


def _close(a, b, what):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), (what, float((a - b).abs().max()))


def _by_step(records) -> list[torch.Tensor]:
    steps: dict = {}
    for e, c, t in records:
        steps.setdefault(e, []).append((c, t))
    return [torch.cat([t for _, t in sorted(steps[e], key=lambda x: x[0])]) for e in sorted(steps)]


def _check(outs: list[dict], ref: dict, cfg: TrainConfig) -> None:
    D = cfg.replicas
    if D == 1:  # predictions of the same batches (with D > 1 each replica predicts its share)
        for key in ("energy", "forces"):
            mine = [t for o in outs for t in o[key]]
            got = _by_step([r for o in outs if o["rank_g"] == 0 for r in o[key]])
            assert mine, key
            for s, (a, b) in enumerate(zip(got, ref[key], strict=True)):
                _close(a, b, f"{key} of step {s}")
    names = set()
    for o in outs:
        for s, (g, g0) in enumerate(zip(o["grads"], ref["grads"], strict=True)):
            for k, v in g.items():
                _close(v, g0[k], f"gradient of {k} step {s} (stage {o['stage']})")
                names.add(k)
        for k, v in o["weights"].items():
            _close(v, ref["weights"][k], f"weight {k}")
    assert names == set(ref["grads"][0]), set(ref["grads"][0]) ^ names  # every parameter is on some stage
    for o in outs:
        for k in ("loss", "train_energy_mae", "train_force_mae"):
            assert o["rec"][k] == pytest.approx(ref["rec"][k], rel=1e-9, abs=1e-12), k
        for k, v in ref["eval"].items():
            assert o["eval"][k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    if cfg.stages > 1:
        assert outs[0]["rec"]["bytes_layer"] > 0
        # the whole model's weights are gathered on rank 0 only (checkpoints, the exported model); every other
        # rank keeps its stage's, not a copy of every stage's
        assert outs[0]["merged"] == outs[0]["task_state"] == sorted(ref["weights"])
        for o in outs[1:]:
            assert o["merged"] == sorted(o["weights"]) and o["task_state"] is None
    if cfg.stages > 1 and cfg.graph_parallel_group_size == 1 and D == 1:  # the cost model's boundary bytes
        assert outs[0]["rec"]["bytes_layer"] == _predicted_boundary_bytes(cfg)
    if cfg.stages > 1:  # each stage's gradient all-reduce over its D·G ranks: the ring, per step, summed over ranks
        R = D * cfg.graph_parallel_group_size
        P = sum(v.numel() for v in ref["grads"][0].values())
        assert outs[0]["rec"]["bytes_weight"] == round(len(BATCHES) * 2 * (R - 1) * P * 8)


def _predicted_boundary_bytes(cfg: TrainConfig) -> int:
    """:func:`gnnpipe.tasks.s2ef.cost.predict_layout`'s boundary bytes of the epoch's batches."""
    from gnnpipe.tasks.s2ef.cost import AtomJob, AtomLayout, AtomProfile, predict_layout

    structures, splits, _ = _data()
    model = T.make_model(cfg)
    prof = AtomProfile(model=cfg.model, step_s=1.0, work=1.0, kappa=1.0, peak_bytes=0, grad_bytes=0, kept_bytes=1.0,
                       edges=1, triplets=1, atoms=1, structures=1, element_size=8)
    total = 0.0
    for b in BATCHES:
        job = AtomJob(model, [structures[i] for i in splits["train"][torch.tensor(b)].tolist()], cfg.cutoff,
                      cfg.max_neighbors, element_size=8)
        layout = AtomLayout(cfg.stages, 1, 1, cfg.chunks, cfg.scheduler)
        total += predict_layout(job, layout, prof).bytes["boundary"]
    return round(total)


def _ranks(rank: int, world: int, cases: list) -> dict:
    out = {}
    for case in cases:
        cfg = _config(*case)
        o = _run(rank, world, cfg)
        o["rank_g"] = P.rank_grid(cfg, world).coords(rank)["gp"]
        out[case] = o
    return out


def _check_cases(cases: list, world: int) -> None:
    refs = {c: _reference(_config(*c)) for c in cases}
    outs = spawn(_ranks, world, (cases,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=560)
    for case in cases:
        _check([outs[r][case] for r in range(world)], refs[case], _config(*case))


@pytest.mark.timeout(600)
def test_two_stages_equal_the_single_process():
    """(S, G, D) = (2, 1, 1): dimenet++ conservative under gpipe, schnet direct and gemnet-t conservative under
    1f1b."""
    _check_cases([("dimenet++", 2, 2, "gpipe", False), ("schnet", 2, 3, "1f1b", True),
                  ("gemnet-t", 2, 2, "1f1b", False)], 2)


#: (S, G, D) layouts of issue #30 beyond (2, 1, 1)
LAYOUTS = [(3, 1, 1), (2, 2, 1), (2, 1, 2), (2, 2, 2)]


@pytest.mark.slow  # a minute or more per layout on a loaded machine
@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "S{}G{}D{}".format(*t))
def test_every_layout_equals_the_single_process(layout):
    S, G, D = layout
    cases = [(m, S, 2, sch, direct, G, D) for m in MODELS for sch in ("gpipe", "1f1b") for direct in (False, True)]
    if G > 1:  # the other graph-parallel layouts too
        cases += [(m, S, 2, "1f1b", False, G, D, "halo", "atom-owner") for m in MODELS]
    _check_cases(cases, S * G * D)


# ---------------------------------------------------------------------------------------------- end to end
SMALL = dict(model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=12, batch_size=4, warmup_steps=2,
             model_args={"num_filters": 8, "num_gaussians": 8}, log_every=0, progress=False, dtype="float64",
             ema_decay=0.9, keep="last")


@pytest.fixture(scope="module")
def xyz(tmp_path_factory):
    from .toy import write_extxyz

    return write_extxyz(tmp_path_factory.mktemp("s2efpipe") / "clusters.extxyz", 12, seed=1)


@pytest.mark.slow  # ~30 s on a loaded machine: four runs, two of them with two ranks
@pytest.mark.timeout(300)
def test_a_pipelined_run_checkpoints_exports_and_resumes_into_one_process(tmp_path, xyz):
    """``api.train(stages=2)`` through the launcher equals the single process; its checkpoint's weights are the
    single-process model's; a single process resumes from it exactly; the model file runs in the calculator."""
    from gnnpipe import api
    from gnnpipe.calculator import Calculator
    from gnnpipe.cli.main import main
    from gnnpipe.core.run.checkpoint import read_weights

    single = api.train(dataset=xyz, epochs=2, **SMALL)
    ck = tmp_path / "ck"
    pipe = api.train(dataset=xyz, epochs=2, stages=2, chunks=2, checkpoint_dir=str(ck), checkpoint_every=1, **SMALL)
    ref = single.model.state_dict()
    for k, v in ref.items():
        _close(pipe.model.state_dict()[k], v, k)
    assert [e["loss"] for e in pipe.epochs] == pytest.approx([e["loss"] for e in single.epochs], rel=1e-9)
    assert pipe.epochs[0]["bytes_layer"] > 0 and pipe.extra["plan"]["bounds"] == [0, 1, 2]
    last = read_weights(ck, "last")
    assert set(last) == set(ref)
    for k, v in ref.items():
        _close(last[k], v, f"checkpointed {k}")
    resumed = api.train(dataset=xyz, epochs=2, resume=str(ck / "ckpt-000001"), **SMALL)  # 1 process from 2 stages
    for k, v in ref.items():
        _close(resumed.model.state_dict()[k], v, f"resumed {k}")
    model_file = tmp_path / "m.pt"
    assert main(["export", str(ck), "--out", str(model_file)]) == 0
    import ase.io

    a = ase.io.read(xyz, index=0)
    a.calc = Calculator(str(model_file))
    assert abs(a.get_forces()).max() > 0


# ---------------------------------------------------------------------------------------------- refusals
def test_configurations_that_cannot_be_pipelined_are_refused_before_any_process_starts(xyz):
    from gnnpipe import api

    small = {k: v for k, v in SMALL.items() if k != "keep"}
    with pytest.raises(ConfigError, match="exceeds the 2 units"):
        api.train(dataset=xyz, stages=3, epochs=1, **small)
    with pytest.raises(ConfigError, match="--chunks 5 exceeds the 4 structures"):
        api.train(dataset=xyz, stages=2, chunks=5, epochs=1, **small)
    with pytest.raises(ConfigError, match="does not flush"):
        api.train(dataset=xyz, stages=2, chunks=2, scheduler="async-stale", epochs=1, **small)
    with pytest.raises(ConfigError, match="layer-split"):
        api.train(dataset=xyz, stages=2, chunks=2, layer_split="profiled", epochs=1, **small)

    @schedulers.register("fifo-first-order-test")
    class Fifo(schedulers.ChunkScheduler):
        """All forwards, then all backwards in forward order (no G/D passes)."""

        def __init__(self, *, stash_weights: bool = False):
            super().__init__(stash_weights=stash_weights)

        def build(self, num_stages, chunk_order):
            order = schedulers.check_chunk_order(num_stages, chunk_order)
            rows = [[schedulers.F(s, c) for c in order] + [schedulers.B(s, c) for c in order]
                    + [schedulers.STEP(s)] for s in range(num_stages)]
            return self.schedule_from_orders(num_stages, len(order), rows)

    try:
        with pytest.raises(ConfigError, match="no G/D passes"):
            api.train(dataset=xyz, stages=2, chunks=2, scheduler="fifo-first-order-test", epochs=1, **small)
    finally:
        schedulers.SCHEDULERS._items.pop("fifo-first-order-test", None)


def test_second_order_schedules_are_validated_and_simulated():
    """The G/D passes: every chunk on every stage, F < G < D < B on a stage, G runs S→1 and D 1→S."""
    from gnnpipe.errors import ScheduleError

    for name in ("gpipe", "1f1b"):
        sch = schedulers.build_schedule(name, 3, 4, second_order=True)
        assert sch.second_order and {str(a)[1] for s in range(3) for a in sch.actions(s)} == set("FGDBS")
        res = schedulers.simulate(sch, schedulers.CostModel(forward=1, backward=2, force=2, second=3))
        assert res.compute_time == [4 * (1 + 2 + 2 + 3)] * 3
        assert schedulers.Action.parse("2G3") == schedulers.G(2, 3) and str(schedulers.D(0, 1, 2)) == "0D1@2"
    rows = [list(r) for r in schedulers.build_schedule("gpipe", 2, 1, second_order=True).stages]
    bad = schedulers.Schedule(2, 1, [[a for a in rows[0] if a is None or a.kind.name != "D"], rows[1]])
    with pytest.raises(ScheduleError, match="has no second-order pass D"):
        schedulers.validate(bad)
    swapped = [[a for a in r if a is not None] for r in rows]
    swapped[1] = [swapped[1][0], swapped[1][2], swapped[1][1], *swapped[1][3:]]  # 1D0 before 1G0
    with pytest.raises(ScheduleError, match="F, G, D, B"):
        schedulers.validate(schedulers.Schedule(2, 1, swapped))


@pytest.mark.slow  # torchrun starts two fresh interpreters
@pytest.mark.timeout(600)
def test_torchrun_ranks_train_a_pipeline(tmp_path, xyz):
    """``torchrun -m gnnpipe train --stages 2`` runs the pipeline's ranks; a world other than D·S·G is refused."""
    import json
    import shutil
    import subprocess

    torchrun = shutil.which("torchrun") or pytest.skip("no torchrun")
    flags = ["--dataset", xyz, "--model", "schnet", "--layers", "1", "--hidden", "8", "--cutoff", "4",
             "--max-neighbors", "12", "--batch-size", "4", "--model-arg", "num_filters=8", "--model-arg",
             "num_gaussians=8", "--no-progress", "--epochs", "1", "--stages", "2", "--chunks", "2"]
    out = tmp_path / "r.json"
    p = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "gnnpipe", "train", *flags, "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["status"] == "completed" and rec["plan"]["stages"] == 2 and len(rec["peak_mem_bytes"]) == 2
    p = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "gnnpipe", "train", *flags, "--replicas", "2"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert p.returncode != 0 and "needs 4" in p.stderr


def test_no_triplet_sized_tensor_crosses_a_stage():
    """The boundary is O(E + N): the geometry (and DimeNet++'s spherical basis) is recomputed on every stage,
    equal to what the embedding unit computes."""
    cfg = _config("dimenet++", 2, 2, "gpipe", False)
    model = T.make_model(cfg)
    assert all(rows != "triplets" for rows, _ in model.pipeline_boundary().values())
    structures, _, _ = _data()
    from torch_geometric.data import Batch

    batch = Batch.from_data_list(structures[1:3])
    graph = T.graph_builder(cfg.cutoff, cfg.max_neighbors)(batch)
    state = model.initial_state(batch, graph)
    full = model.run_units(0, 1, state, graph)
    again = model.stage_geometry(state, graph)
    for k in ("vec", "dist", "sbf"):
        assert torch.equal(again[k], full[k]), k
    sizes = model.boundary_shapes(graph)
    assert set(sizes) == {"rbf", "x", "P"} and sizes["x"][0] == graph.edge_index.size(1)


def test_a_step_builds_one_graph_and_splits_it_by_micro_batch():
    """One ``graph_fn`` call per step on each stage (the single process's count), split by micro-batch; a
    ``graph_fn`` whose graphs cannot be split gets one call per micro-batch from then on, with the same losses."""
    import dataclasses

    from gnnpipe.data.atoms.graph import AtomGraph

    torch.set_num_threads(1)
    cfg = _config("dimenet++", 1, 3, "gpipe", True)
    structures, splits, norm = _data()
    build = T.graph_builder(cfg.cutoff, cfg.max_neighbors, True)
    calls: list[int] = []

    class Unsplittable(AtomGraph):
        pass

    def counting(batch, wrap=False):
        calls.append(int(batch.num_graphs))
        g = build(batch)
        return Unsplittable(**{f.name: getattr(g, f.name) for f in dataclasses.fields(AtomGraph)}) if wrap else g

    losses = []
    for wrap in (False, True):
        calls.clear()
        tr = T.S2EFTrainer(cfg, structures, splits, norm, graph_fn=lambda b, w=wrap: counting(b, w))
        original = T.epoch_batches
        T.epoch_batches = _patched_batches(BATCHES[:2])
        try:
            losses.append(tr.train_epoch(0)["loss"])
        finally:
            T.epoch_batches = original
        assert calls == ([3, 3] if not wrap else [3, 1, 1, 1, 1, 1, 1]), calls
    assert losses[0] == pytest.approx(losses[1], rel=1e-12)
