"""Data parallelism is exact: D ranks with ``batch_size`` structures each equal one process with ``D × batch_size``
(float64, within 1e-9 relative), weights, moving average and metrics, also with an uneven last batch."""

from __future__ import annotations

import pytest
import torch

from gnnpipe.core.run.launch import spawn
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.tasks.s2ef.normalizer import EnergyNormalizer
from gnnpipe.tasks.s2ef.trainer import S2EFTrainer, graph_builder

from .toy import PairPotential, emt_clusters

EPOCHS = 2


def _config(batch_size: int) -> TrainConfig:
    return TrainConfig(task="s2ef", dtype="float64", lr=5e-3, weight_decay=0.01, epochs=EPOCHS,
                       batch_size=batch_size, ema_decay=0.9, warmup_steps=2, warmup_factor=0.5,
                       lr_schedule="cosine", clip_grad_norm=0.5, force_coef=10.0, loss_fn="l1")


def _data():
    structures = emt_clusters(17, seed=3)
    splits = {"train": torch.arange(13), "val": torch.arange(13, 15), "test": torch.arange(15, 17)}
    norm = EnergyNormalizer.fit([structures[i] for i in range(13)])
    return structures, splits, norm


def _train(rank: int, world: int, batch_size: int, epochs: int = EPOCHS):
    previous = torch.get_default_dtype()  # the single-process reference runs in pytest's process: restore it
    torch.set_default_dtype(torch.float64)
    try:
        structures, splits, norm = _data()
        tr = S2EFTrainer(_config(batch_size), structures, splits, norm, rank=rank, world=world,
                         model=PairPotential(seed=1).double(), graph_fn=graph_builder(4.0, 20))
        recs = [tr.train_epoch(e) for e in range(epochs)]
    finally:
        torch.set_default_dtype(previous)
    return {"weights": {k: v.clone() for k, v in tr.model.state_dict().items()}, "ema": tr.weights(),
            "eval": tr.evaluate(), "losses": [r["loss"] for r in recs], "records": recs,
            "params": sum(p.numel() for p in tr.params), "steps": tr.steps_per_epoch}


@pytest.mark.slow  # ~15 s per case alone (spawned gloo ranks), a minute under load
@pytest.mark.parametrize("world", [2, 3])
def test_d_ranks_equal_one_process_on_the_d_times_batch(world):
    b = 2  # 13 training structures: global batches of 4 (last 1: a rank gets none) or 6 (last 1)
    single = _train(0, 1, b * world)
    outs = spawn(_train, world, (b,), backend="gloo", timeout_s=120, max_runtime_s=300)
    init = PairPotential(seed=1).double().state_dict()
    assert any(not torch.allclose(init[k], single["weights"][k]) for k in init)  # it trained
    for out in outs:
        for key in ("weights", "ema"):
            for k, v in single[key].items():
                torch.testing.assert_close(out[key][k], v, rtol=1e-9, atol=1e-12)
        assert out["losses"] == pytest.approx(single["losses"], rel=1e-9)
        for k, v in single["eval"].items():
            assert out["eval"][k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


def test_the_uneven_last_batch_leaves_a_rank_empty():
    from gnnpipe.tasks.s2ef.data import epoch_batches, share

    last = epoch_batches(13, 6, seed=0, epoch=0)[-1]
    assert len(last) == 1 and [len(share(last, r, 3)) for r in range(3)] == [1, 0, 0]


def test_a_wrong_gradient_sum_would_be_caught():
    """The comparison has teeth: one process on the plain batch (not D times) differs."""
    a, b = _train(0, 1, 4), _train(0, 1, 2)
    assert any(not torch.allclose(a["weights"][k], b["weights"][k], rtol=1e-6) for k in a["weights"])


def test_the_gradient_all_reduce_is_counted_as_the_ring_and_the_cost_model_count_it():
    """The epoch record's ``bytes_weight`` is the gradient all-reduce's, summed over the ranks: per step the ring's
    ``2 (D − 1) / D`` of the flat float64 buffer (every gradient and the loss: ``(P + 1) · 8`` bytes) on each of
    the ``D`` ranks — what the atomistic cost model's ``grad`` bytes are per step
    (``gnnpipe.tasks.s2ef.cost.predict_layout``); one process sends nothing."""
    world = 2
    outs = spawn(_train, world, (2, 1), backend="gloo", timeout_s=120, max_runtime_s=300)
    P, steps = outs[0]["params"], outs[0]["steps"]
    assert P > 0 and steps == 4  # 13 structures, global batches of 4
    ring = 2.0 * (world - 1) * (P + 1) * 8 / world
    for out in outs:
        assert out["records"][0]["bytes_weight"] == round(steps * world * ring)
    assert _train(0, 1, 4, epochs=1)["records"][0]["bytes_weight"] == 0
