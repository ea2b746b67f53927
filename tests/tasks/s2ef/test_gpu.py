"""S2EF on a GPU, skipped without CUDA; run by ``benchmarks/gpu_check.sh`` on a GPU machine: a float64 run on the
GPU equals the CPU run step for step (schnet, dimenet++, gemnet-t with conservative and direct forces: every step's
loss within 1e-9 relative, and the final weights); ``--gp-size 2``, ``--stages 2``, ``--replicas 2`` and
``--stages 2 --gp-size 2`` with every rank on the one GPU (gloo) equal the single-GPU run within 1e-9 (float64,
dropout 0); ``--amp`` trains with the validation force MAE falling; a GPU checkpoint resumes on the CPU and a CPU
checkpoint on the GPU; the memory model's per-rank peak within 15 % of ``torch.cuda.max_memory_allocated`` of every
rank of a single-process, graph-parallel and pipelined run.

``GNNPIPE_TEST_DEVICE=cpu`` runs the same bodies with the CPU in the GPU's place (tiny sizes; ~2 minutes on two
cores), which checks the tests themselves on a machine without a GPU::

    GNNPIPE_TEST_DEVICE=cpu python -m pytest -q -m gpu tests/tasks/s2ef/test_gpu.py
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

from gnnpipe import api
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.tasks.s2ef import S2EF
from gnnpipe.tasks.s2ef import cost as A

from .toy import emt_clusters

#: where the "GPU" side of each test computes: ``cuda``, or ``cpu`` to check the tests without a GPU
DEVICE = os.environ.get("GNNPIPE_TEST_DEVICE", "cuda")
ON_GPU = DEVICE.startswith("cuda")

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600),
              pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY = {
    "schnet": dict(num_filters=8, num_gaussians=8),
    "dimenet++": dict(int_emb_size=4, basis_emb_size=3, out_emb_channels=6, num_spherical=3, num_radial=3),
    "gemnet-t": dict(emb_size_trip=4, emb_size_rbf=3, emb_size_cbf=3, emb_size_bil_trip=5, num_spherical=3,
                     num_radial=4, num_atom=1),
}
#: float64, dropout 0, a constant learning rate after one warm-up step, EMA on: what every layout must reproduce
EXACT = dict(layers=2, hidden=8, cutoff=3.0, max_neighbors=8, dtype="float64", dropout=0.0, lr=1e-2,
             weight_decay=0.01, warmup_steps=1, lr_schedule="constant", ema_decay=0.5, force_coef=10.0, loss_fn="mse",
             log_every=0, log_every_steps=1, progress=False, keep="last", seed=0)


def _clusters(n: int = 12, seed: int = 1):
    return emt_clusters(n, seed=seed, dtype=torch.float64)


def _step_losses(result) -> list[float]:
    losses = [s["loss"] for s in result.steps]
    assert losses and all(torch.isfinite(torch.tensor(losses))), losses
    return losses


def _same_run(a, b, what: str) -> None:
    """Every step's loss of ``a`` and ``b`` within 1e-9 relative, and the final weights."""
    la, lb = _step_losses(a), _step_losses(b)
    assert len(la) == len(lb), what
    assert la == pytest.approx(lb, rel=1e-9, abs=1e-12), what
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert set(sa) == set(sb)
    for k, v in sa.items():
        torch.testing.assert_close(sb[k].cpu(), v.cpu(), rtol=1e-9, atol=1e-12, msg=lambda m, k=k: f"{what}, {k}: {m}")


def _fresh_peak() -> None:
    """Start counting this process's peak on the device from what is allocated now."""
    gc.collect()
    if ON_GPU:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ---------------------------------------------------------------------------------------------- the device
@pytest.mark.parametrize("model,direct", [("schnet", False), ("dimenet++", False), ("gemnet-t", False),
                                          ("gemnet-t", True)])
def test_a_float64_run_on_the_device_equals_the_cpu_run_step_for_step(model, direct):
    kw = dict(data=_clusters(), model=model, model_args=TINY[model], direct_forces=direct, batch_size=3, epochs=2,
              **EXACT)
    cpu = api.train(device="cpu", **kw)
    dev = api.train(device=DEVICE, **kw)
    assert dev.config["device"] == DEVICE and cpu.config["device"] == "cpu"
    assert len(dev.steps) == 8  # 10 training structures of 12, batches of 3: 4 steps an epoch
    _same_run(cpu, dev, f"{model} on {DEVICE} against the CPU")
    for k in ("val_force_mae", "val_energy_mae", "test_force_mae"):
        assert dev.best_metrics[k] == pytest.approx(cpu.best_metrics[k], rel=1e-9), k


@pytest.mark.dist
@pytest.mark.parametrize("layout", [dict(graph_parallel_group_size=2), dict(stages=2, chunks=2),
                                    dict(replicas=2), dict(stages=2, chunks=2, graph_parallel_group_size=2)],
                         ids=["G2", "S2", "D2", "S2xG2"])
def test_every_layout_with_its_ranks_on_one_device_equals_the_single_device_run(layout):
    """dimenet++ (triplets, so graph parallelism exchanges edge rows); ``D`` replicas of ``b`` structures equal one
    process of ``D·b``."""
    kw = dict(data=_clusters(), model="dimenet++", model_args=TINY["dimenet++"], epochs=2, device=DEVICE, **EXACT)
    D = layout.get("replicas", 1)
    single = api.train(batch_size=2 * D, **kw)
    ranks = api.train(batch_size=2, **layout, **kw)
    plan = ranks.extra["plan"]
    assert plan["world_size"] == D * layout.get("stages", 1) * layout.get("graph_parallel_group_size", 1)
    assert len(ranks.extra["peak_mem_bytes"]) == plan["world_size"]
    _same_run(single, ranks, f"{layout} on {DEVICE}")


# ---------------------------------------------------------------------------------------------- --amp
def test_amp_trains_on_the_device_with_the_validation_force_mae_falling():
    kw = dict(dataset="md17-like", frames=40, model="schnet", layers=2, hidden=16, cutoff=4.0, max_neighbors=12,
              batch_size=4, warmup_steps=2, model_args={"num_filters": 16, "num_gaussians": 16}, lr=3e-3, epochs=4,
              log_every=0, progress=False, seed=0, device=DEVICE)
    amp = api.train(amp=True, **kw)
    assert amp.config["amp"] is True and amp.config["dtype"] == "float32"
    assert {p.dtype for p in amp.model.parameters()} == {torch.float32}
    mae = [e["val_force_mae"] for e in amp.epochs]
    assert all(torch.isfinite(torch.tensor(mae))) and mae[-1] < mae[0], mae
    f32 = api.train(**kw)
    assert [e["loss"] for e in f32.epochs] != [e["loss"] for e in amp.epochs]  # bfloat16 did run


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("first,then", [(DEVICE, "cpu"), ("cpu", DEVICE)], ids=["device-to-cpu", "cpu-to-device"])
def test_a_checkpoint_written_on_one_device_resumes_on_the_other(tmp_path, first, then):
    from gnnpipe.core.run.checkpoint import read_weights

    kw = dict(data=_clusters(), model="schnet", model_args=TINY["schnet"], batch_size=3, **EXACT)
    full = api.train(epochs=4, device=first, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2, **kw)
    written = read_weights(tmp_path / "ck", "last")
    assert all(v.device.type == "cpu" for v in written.values())  # a checkpoint holds CPU tensors
    resumed = api.train(epochs=4, device=then, resume=str(tmp_path / "ck" / "ckpt-000002"), **kw)
    assert resumed.config["device"] == then and len(resumed.steps) == len(full.steps) == 16  # 4 steps an epoch
    assert _step_losses(resumed)[8:] == pytest.approx(_step_losses(full)[8:], rel=1e-9, abs=1e-12)  # epochs 3, 4
    for k, v in full.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[k].cpu(), v.cpu(), rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------- memory
#: the measured layouts: (stages, gp, replicas)
MEASURED = [(1, 1, 1), (1, 2, 1), (2, 1, 1)]


@pytest.mark.parametrize("S,G,D", MEASURED, ids=["single", "G2", "S2"])
def test_the_memory_model_predicts_every_ranks_peak_within_15_percent(S, G, D):
    """The prediction a GPU run is checked against (:func:`gnnpipe.tasks.s2ef.cost.layout_memory` from a profile
    of one training step taken on the device; no runtime floor on a GPU, where ``max_memory_allocated`` holds none)
    against every rank's ``peak_mem_bytes`` (``torch.cuda.max_memory_allocated`` on a GPU; on the CPU the peak
    resident size, so the single process, which shares pytest's, is not measured there). Sizes: DimeNet++ of
    hidden 128 on eight 65-atom OC20-sized slabs per step (about 1 GiB of activations) on a GPU; hidden 16 on two
    on the CPU."""
    if not ON_GPU and S * G * D == 1:
        pytest.skip("on the CPU the single process's peak resident size is pytest's")
    from gnnpipe.tasks.s2ef.build import make_model

    big = ON_GPU
    hidden, batch = (128, 8) if big else (16, 2)
    margs = (dict(int_emb_size=64, basis_emb_size=8, out_emb_channels=256, num_spherical=7, num_radial=6) if big
             else dict(int_emb_size=8, basis_emb_size=4, out_emb_channels=16, num_spherical=3, num_radial=3))
    data = A.oc20_sized_structures(3 * batch, seed=0)
    kw = dict(model="dimenet++", layers=3 if big else 2, hidden=hidden, cutoff=6.0, max_neighbors=50,
              batch_size=batch, epochs=1, dtype="float32", model_args=margs, ema_decay=0.999, dropout=0.0,
              tf32=False, seed=0)
    layout = dict(stages=S, graph_parallel_group_size=G, replicas=D, chunks=2 if S > 1 else None)
    cfg = S2EF().resolve(TrainConfig(device=DEVICE, **kw, **layout))
    # the prediction, as the run's memory check makes it: one replica batch, a profile taken on the device
    job = A.AtomJob(make_model(cfg), data[:batch], cfg.cutoff, cfg.max_neighbors,
                    partitioner=cfg.graph_parallel_partitioner, mode=cfg.graph_parallel_mode, element_size=4,
                    ema=True, backend="gloo")
    b, g = A.job_graph(job)
    prof = A.profile_step(job.model, b, g, steps=1, warmup=1, name="dimenet++", device=DEVICE)
    assert prof.device == torch.device(DEVICE).type
    predicted = A.layout_memory(job, A.AtomLayout(S, G, D, chunks=cfg.chunks or 1, scheduler=cfg.scheduler),
                                prof, floor_bytes=0 if ON_GPU else None)
    del b, g, job
    _fresh_peak()
    base = int(torch.cuda.memory_allocated()) if ON_GPU and S * G * D == 1 else 0
    res = api.train(data=data, log_every=0, progress=False, memory_check=False, **kw, **layout)
    measured = [m - base for m in res.extra["peak_mem_bytes"]]
    assert len(measured) == len(predicted) == S * G * D
    errors = [p / m - 1 for p, m in zip(predicted, measured)]
    print(f"S{S} G{G} D{D} on {DEVICE}: predicted {[round(p / 2**20) for p in predicted]} MiB, measured "
          f"{[round(m / 2**20) for m in measured]} MiB, errors {[f'{e:+.1%}' for e in errors]}")
    assert all(abs(e) <= 0.15 for e in errors), errors
