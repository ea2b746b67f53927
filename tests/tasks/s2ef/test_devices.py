"""S2EF on any device, the parts a CPU can check: ``--device`` and ``--amp`` resolved and refused as they should be,
the run header's device line, ``--amp`` (bfloat16 autocast) training on the CPU as float32 does, the neighbour graph
built where the positions are (``method="device"``) equal to the CPU build, a large structure's graph built by the
trainer instead of a loader worker, checkpoints that move between devices (CPU copies of the moving average,
``--device`` free to change on resume), the memory model's device profile and the check that refuses a layout a
GPU cannot hold. The same paths on a GPU: ``test_gpu.py`` (gpu-marked)."""

from __future__ import annotations

import attrs
import pytest
import torch
from torch_geometric.data import Batch

from gnnpipe import api
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.data.atoms import build_graph, generated_structures
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.s2ef import S2EF, S2EFData, device_line
from gnnpipe.tasks.s2ef import cost as A
from gnnpipe.tasks.s2ef.data import StructureLoader, move_to
from gnnpipe.tasks.s2ef.trainer import S2EFTrainer

from .toy import emt_clusters

SMALL = dict(model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=12, batch_size=4, warmup_steps=2,
             model_args={"num_filters": 8, "num_gaussians": 8})
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")


# ---------------------------------------------------------------------------------------------- flags
def test_device_cpu_is_accepted_and_the_header_names_it():
    cfg = S2EF().resolve(TrainConfig(device="cpu", **SMALL))
    assert cfg.device == "cpu"
    line = device_line(cfg)
    assert line.startswith("device: cpu") and "float32 throughout" in line and "backend" not in line
    line = device_line(attrs.evolve(cfg, amp=True, replicas=2))
    assert "--amp: the forward in bfloat16 autocast" in line and "backend gloo" in line


@no_gpu
def test_device_cuda_without_a_gpu_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match="--device cuda needs a CUDA GPU.*use --device cpu"):
        S2EF().resolve(TrainConfig(device="cuda", **SMALL))
    with pytest.raises(ConfigError, match="--device cuda needs a CUDA GPU"):
        api.train(data=emt_clusters(6, seed=1, dtype=torch.float32), device="cuda", epochs=1, log_every=0, **SMALL)


def test_amp_needs_float32_and_node_classification_refuses_it():
    with pytest.raises(ConfigError, match="--amp .* use --dtype float32"):
        S2EF().resolve(TrainConfig(amp=True, dtype="float64", **SMALL))
    with pytest.raises(ConfigError, match="--amp sets the precision of atomistic S2EF training"):
        api.train(model="gcn", amp=True, epochs=1, log_every=0, progress=False)
    with pytest.raises(ConfigError, match="--no-tf32 sets the precision"):
        api.train(model="gcn", tf32=False, epochs=1, log_every=0, progress=False)


def test_the_header_of_a_gpu_run_names_the_gpu_tf32_and_the_backend(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    cfg = TrainConfig(device="cuda", **SMALL)
    line = device_line(cfg)
    assert "device: cuda (Fake GPU)" in line and "TF32 matmuls allowed" in line
    assert "TF32 off (--no-tf32)" in device_line(attrs.evolve(cfg, tf32=False))
    assert "TF32" not in device_line(attrs.evolve(cfg, dtype="float64"))
    shared = device_line(attrs.evolve(cfg, graph_parallel_group_size=2))  # two ranks on one GPU: gloo, staged
    assert "backend gloo" in shared and "pinned CPU buffers" in shared


def test_the_choice_of_device_and_backend_is_one_for_both_tasks():
    from gnnpipe.core.run import launch
    from gnnpipe.tasks.nodes import runner

    assert runner.plan_backend is launch.plan_backend and runner.rank_device is launch.rank_device
    assert launch.rank_device(TrainConfig(device="cpu")) == torch.device("cpu")


# ---------------------------------------------------------------------------------------------- --amp on the CPU
def test_amp_trains_and_its_loss_curve_stays_within_the_noise_of_two_seeds():
    kw = dict(dataset="md17-like", frames=40, model="schnet", layers=2, hidden=16, cutoff=4.0, max_neighbors=12,
              batch_size=4, warmup_steps=2, model_args={"num_filters": 16, "num_gaussians": 16}, lr=3e-3, epochs=4,
              log_every=0, progress=False)
    f32, other, amp = (api.train(seed=s, amp=a, **kw) for s, a in ((0, False), (1, False), (0, True)))
    assert amp.to_dict()["config"]["amp"] is True
    mae = [e["val_force_mae"] for e in amp.epochs]
    assert mae[-1] < mae[0]  # it trains
    curve = [e["loss"] for e in f32.epochs]
    seeds = max(abs(a - b) for a, b in zip(curve, [e["loss"] for e in other.epochs]))
    mixed = max(abs(a - b) for a, b in zip(curve, [e["loss"] for e in amp.epochs]))
    assert 0 < mixed < seeds  # bfloat16 moved the curve, by less than another seed does


def test_amp_runs_the_forward_in_bfloat16_and_keeps_energies_forces_and_state_in_float32():
    structures = emt_clusters(6, seed=3, dtype=torch.float32)
    splits = {"train": torch.arange(4), "val": torch.arange(4, 5), "test": torch.arange(5, 6)}
    cfg = S2EF().resolve(TrainConfig(amp=True, **SMALL))
    from gnnpipe.tasks.s2ef import EnergyNormalizer

    tr = S2EFTrainer(cfg, structures, splits, EnergyNormalizer.fit(structures[:4]))
    seen = set()
    hook = tr.model.units[1].register_forward_hook(lambda m, i, o: seen.add(torch.is_autocast_cpu_enabled()))
    e, f, _, _ = tr.forward(structures[:3])
    hook.remove()
    assert seen == {True} and e.dtype == f.dtype == torch.float32
    tr.train_epoch(0)
    assert {p.dtype for p in tr.model.parameters()} == {torch.float32}
    assert all(v.dtype == torch.float32 for st in tr.optimizer.state.values() for v in st.values() if v.dim())


# ---------------------------------------------------------------------------------------------- the graph
def _same_graph(a, b) -> None:
    for k in ("edge_index", "cell_offsets", "batch", "idx_kj", "idx_ji", "id_swap"):
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None), k
        if x is not None:
            assert torch.equal(x, y), k


def _lattice(kind: str):
    """Structures whose neighbours tie (perfect crystals), a cell small enough that images beyond ±2 are neighbours,
    and one large enough that the CPU build takes ASE's cell lists."""
    from ase.build import bulk, fcc111
    from torch_geometric.data import Data

    atoms = {"fcc": bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2)),
             "tiny": bulk("Cu", "fcc", a=3.6),
             "large": fcc111("Pt", size=(8, 8, 6), vacuum=8.0),
             "rattled": bulk("Ni", "fcc", a=3.52, cubic=True).repeat((2, 2, 2))}[kind]
    if kind == "rattled":
        atoms.rattle(0.05, seed=3)
    return Data(z=torch.as_tensor(atoms.numbers), pos=torch.as_tensor(atoms.positions, dtype=torch.float32),
                cell=torch.as_tensor(atoms.cell.array, dtype=torch.float32).reshape(1, 3, 3),
                pbc=torch.as_tensor(atoms.pbc).reshape(1, 3), natoms=torch.tensor([len(atoms)]))


@pytest.mark.parametrize("kind", ["oc20", "bulk", "md17"])
@pytest.mark.parametrize("cutoff,cap,ties", [(6.0, 50, False), (4.0, 8, True), (5.0, None, False)])
def test_the_device_build_finds_the_same_edges_as_the_cpu_build(kind, cutoff, cap, ties):
    batch = Batch.from_data_list(generated_structures(kind, 4, 1, dtype=torch.float32))
    cpu = build_graph(batch, cutoff, cap, keep_ties=ties, with_reverse=True)
    dev = build_graph(batch, cutoff, cap, keep_ties=ties, with_reverse=True, method="device")
    assert cpu.num_edges > 0
    _same_graph(cpu, dev)


@pytest.mark.parametrize("kind", ["fcc", "tiny", "large", "rattled"])
def test_the_device_build_breaks_ties_and_caps_as_the_cpu_build(kind):
    batch = Batch.from_data_list([_lattice(kind), _lattice("rattled")])
    for cap in (12, 7, None):
        _same_graph(build_graph(batch, 5.0, cap, with_reverse=True),
                    build_graph(batch, 5.0, cap, with_reverse=True, method="device"))


def test_the_device_build_holds_a_block_of_targets_at_a_time():
    from gnnpipe.data.atoms.graph import device_neighbor_pairs

    batch = Batch.from_data_list([_lattice("large")])
    counts = [int(batch.num_nodes)]
    whole = device_neighbor_pairs(batch.pos, batch.cell, batch.pbc, counts, 5.0)
    small = device_neighbor_pairs(batch.pos, batch.cell, batch.pbc, counts, 5.0, budget=5000)  # a few targets each
    key = lambda t: sorted(zip(t[0].tolist(), t[1].tolist(), map(tuple, t[2].tolist())))  # noqa: E731
    assert len(whole[0]) > 1000 and key(whole) == key(small)
    with pytest.raises(ValueError, match="unknown neighbour method"):
        build_graph(batch, 5.0, method="gpu")


def test_a_large_structures_graph_is_built_by_the_trainer_with_the_same_result():
    """A loader told to leave a large structure's graph to the device (``device_graph_atoms``) hands over the batch
    alone; the trainer builds it with ``method="device"``: the same losses, bit for bit."""
    from gnnpipe.tasks.s2ef import EnergyNormalizer

    structures = emt_clusters(12, seed=4, dtype=torch.float64)
    splits = {"train": torch.arange(8), "val": torch.arange(8, 10), "test": torch.arange(10, 12)}
    cfg = S2EF().resolve(TrainConfig(dtype="float64", epochs=2, **SMALL))
    norm = EnergyNormalizer.fit(structures[:8])
    ref = S2EFTrainer(cfg, structures, splits, norm)
    dev = S2EFTrainer(cfg, structures, splits, norm)
    dev.loader.device_graph_atoms = 1
    steps = list(dev.loader.iterate([torch.arange(4)]))
    assert steps[0].batch is not None and steps[0].graph is None
    calls = []
    build = dev.device_graph_fn
    dev.device_graph_fn = lambda b: calls.append(1) or build(b)
    for e in range(2):
        ref.train_epoch(e)
        dev.train_epoch(e)
        assert dev.epoch_losses == ref.epoch_losses
    assert calls and dev.evaluate() == ref.evaluate()


def test_moving_to_the_cpu_keeps_the_objects_and_the_loader_is_unchanged_there():
    structures = emt_clusters(4, seed=2, dtype=torch.float32)
    batch = Batch.from_data_list(structures)
    graph = build_graph(batch, 4.0, 12)
    assert move_to(batch, torch.device("cpu")) is batch and move_to(graph, "cpu") is graph
    assert move_to(None, "cpu") is None
    fn = lambda b: build_graph(b, 4.0, 12)  # noqa: E731
    a = list(StructureLoader(structures, 0, fn).iterate([torch.arange(4)]))
    b = list(StructureLoader(structures, 0, fn, device="cpu").iterate([torch.arange(4)]))
    _same_graph(a[0].graph, b[0].graph)
    assert torch.equal(a[0].batch.pos, b[0].batch.pos)
    moved = graph.to("cpu")
    _same_graph(moved, graph)


# ---------------------------------------------------------------------------------------------- checkpoints
def test_the_moving_average_is_checkpointed_as_cpu_copies():
    from gnnpipe.tasks.s2ef.optim import ExponentialMovingAverage

    model = torch.nn.Linear(3, 2)
    ema = ExponentialMovingAverage(model, 0.9)
    state = ema.state_dict()
    assert all(v.device.type == "cpu" for v in state["shadow"].values())
    assert all(v.data_ptr() != ema.shadow[k].data_ptr() for k, v in state["shadow"].items())  # copies
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    other = ExponentialMovingAverage(torch.nn.Linear(3, 2), 0.9)
    other.load_state_dict(ema.state_dict())
    assert other.updates == 1 and all(torch.equal(other.shadow[k], v) for k, v in ema.shadow.items())


def test_a_run_resumes_on_another_device_but_not_in_another_precision():
    from gnnpipe.core.run.checkpoint import FORMAT_VERSION, check_resume

    cfg = S2EF().resolve(TrainConfig(device="cpu", **SMALL))
    meta = {"format": FORMAT_VERSION, "config": attrs.evolve(cfg, device="cuda").to_dict()}
    assert check_resume(cfg, meta) == []  # written on a GPU, resumed on the CPU
    assert check_resume(attrs.evolve(cfg, device=None), meta) == []
    with pytest.raises(ConfigError, match="amp: checkpoint False, now True"):
        check_resume(attrs.evolve(cfg, amp=True), meta)
    old = {k: v for k, v in meta["config"].items() if k not in ("amp", "tf32")}  # a checkpoint of an older version
    assert check_resume(cfg, {"format": FORMAT_VERSION, "config": old}) == []


def test_resuming_with_another_device_flag_continues_exactly(tmp_path):
    data = emt_clusters(16, seed=1, dtype=torch.float64)
    kw = dict(data=data, dtype="float64", ema_decay=0.9, keep="last", log_every=0, progress=False, **SMALL)
    full = api.train(epochs=4, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2, **kw)
    resumed = api.train(epochs=4, device="cpu", resume=str(tmp_path / "ck" / "ckpt-000002"), **kw)
    for k, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k


# ---------------------------------------------------------------------------------------------- memory on a device
def test_the_profile_says_where_it_was_taken_and_an_old_profile_was_taken_on_the_cpu():
    structures = generated_structures("oc20", 2, 0, dtype=torch.float32)
    cfg = S2EF().resolve(TrainConfig(model="schnet", layers=1, hidden=8, cutoff=4.0, max_neighbors=12,
                                     model_args={"num_filters": 8, "num_gaussians": 8}))
    from gnnpipe.tasks.s2ef.build import make_model

    model = make_model(cfg)
    batch = Batch.from_data_list(structures)
    graph = build_graph(batch, 4.0, 12)
    prof = A.profile_step(model, batch, graph, steps=1, warmup=0, name="schnet")
    assert prof.device == "cpu" and not prof.amp and prof.peak_bytes > 0
    amp = A.profile_step(model, batch, graph, steps=1, warmup=0, name="schnet", amp=True)
    assert amp.amp and amp.peak_bytes > 0
    old = {k: v for k, v in prof.to_dict().items() if k not in ("device", "amp")}
    assert A.AtomProfile.from_dict(old).device == "cpu"
    with A.PeakMeter("cpu") as m:
        x = torch.zeros(1 << 20)
        del x
    assert m.peak - m.base >= 4 << 20


def test_a_cpu_profile_is_refused_for_a_gpu_plan_and_the_reverse(tmp_path, monkeypatch):
    import json

    from gnnpipe.tasks.s2ef.build import make_model

    cfg = S2EF().resolve(TrainConfig(device="cpu", frames=8, **{**SMALL, "batch_size": 2}))
    structures = generated_structures("oc20", 2, 0, dtype=torch.float32)
    batch = Batch.from_data_list(structures)
    prof = A.profile_step(make_model(cfg), batch, build_graph(batch, 4.0, 12), steps=1, warmup=0, name="schnet")
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({**prof.to_dict(), "device": "cuda"}))
    with pytest.raises(ConfigError, match="was taken on the CUDA, and this plan is for --device cpu"):
        api.plan_s2ef(cfg, ranks=1, profile_in=str(path), progress=False)


def test_layout_memory_gives_every_rank_and_the_device_check_sums_the_ranks_of_each_gpu():
    from gnnpipe.tasks.s2ef.build import make_model

    cfg = S2EF().resolve(TrainConfig(model="dimenet++", layers=2, hidden=8, cutoff=4.0, max_neighbors=12,
                                     model_args={"int_emb_size": 4, "basis_emb_size": 3, "out_emb_channels": 6,
                                                 "num_spherical": 3, "num_radial": 3}))
    model = make_model(cfg)
    structures = generated_structures("oc20", 4, 0, dtype=torch.float32)
    job = A.AtomJob(model, structures, 4.0, 12)
    batch, graph = A.job_graph(job)
    prof = A.profile_step(model, batch, graph, steps=1, warmup=0, name="dimenet++")
    one = A.layout_memory(job, A.AtomLayout(1, 1, 1), prof, floor_bytes=0)
    four = A.layout_memory(job, A.AtomLayout(2, 2, 1, 2, "gpipe"), prof, floor_bytes=0)
    assert len(one) == 1 and len(four) == 4 and all(b > 0 for b in four) and max(four) < one[0]
    gpu = attrs.evolve(prof, device="cuda")
    two = A.layout_memory(job, A.AtomLayout(1, 1, 2), prof, floor_bytes=0)  # D = 2: the gradient all-reduce's buffer
    assert len(two) == 2 and two[0] > one[0]
    assert A.layout_memory(job, A.AtomLayout(1, 1, 2), gpu) == [b + A.GPU_FLOOR_BYTES for b in two]
    A.check_device_memory([3, 3, 3], [6, 3])  # GPU 0 holds ranks 0 and 2, GPU 1 rank 1
    with pytest.raises(ConfigError, match=r"GPU 0 \(H\) for ranks 0, 2.*--gp-size.*--no-memory-check"):
        A.check_device_memory([3, 3, 4], [6, 9], names=["H", "H"])
    with pytest.raises(ConfigError, match="GPU 1 for rank 1"):
        A.check_device_memory([1 << 30, 5 << 30], [2 << 30, 4 << 30])
    A.check_device_memory([1 << 40], [])  # no GPU: nothing to check


def test_the_gpu_memory_check_runs_only_for_a_gpu_run_that_asks_for_it(monkeypatch):
    import gnnpipe.tasks.s2ef as task_module
    from gnnpipe.core.settings.options import RunOptions

    calls = []
    monkeypatch.setattr(task_module, "check_gpu_memory", lambda config, data: calls.append(config.device) or [1])
    data = S2EFData(structures=emt_clusters(6, seed=0, dtype=torch.float32),
                    splits={"train": torch.arange(4), "val": torch.arange(4, 5), "test": torch.arange(5, 6)},
                    normalizer=None, name="x")
    task = S2EF()
    cfg = task.resolve(TrainConfig(device="cpu", **SMALL))
    task.check(cfg, task.plan(cfg, data), RunOptions())
    assert calls == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpu = attrs.evolve(cfg, device="cuda")
    plan = task.plan(gpu, data)
    task.check(gpu, plan, RunOptions(memory_check=False))
    assert calls == []
    task.check(gpu, plan, RunOptions())
    assert calls == ["cuda"] and plan.info["predicted_mem_bytes"] == [1]
