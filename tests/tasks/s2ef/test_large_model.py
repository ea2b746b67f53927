"""A DimeNet++ of more than 10^7 trained parameters trains pipelined over four stages and resumes graph-parallel."""

from __future__ import annotations

import pytest

#: 3 interaction blocks (4 units: one per stage), wide output blocks: ~1.3e7 parameters
LARGE = dict(model="dimenet++", layers=3, hidden=128, cutoff=4.0, max_neighbors=6, batch_size=4,
             model_args={"int_emb_size": 64, "out_emb_channels": 1024, "basis_emb_size": 8}, log_every=0,
             progress=False, lr=1e-4, warmup_steps=0, keep="last")


@pytest.fixture(scope="module")
def xyz(tmp_path_factory):
    from .toy import write_extxyz

    return write_extxyz(tmp_path_factory.mktemp("s2eflarge") / "clusters.extxyz", 10, seed=3)  # 8 train: 2 steps


@pytest.mark.slow  # a minute or more on a loaded machine: 4 + 2 ranks of a 50 MB model
@pytest.mark.timeout(900)
def test_a_1e7_parameter_model_trains_two_steps_over_four_stages_and_resumes_with_two_gp_ranks(tmp_path, xyz):
    from gnnpipe import api

    ck = tmp_path / "ck"
    pipe = api.train(dataset=xyz, epochs=2, stages=4, chunks=4, checkpoint_dir=str(ck), checkpoint_every=1, **LARGE)
    assert pipe.extra["num_params"] >= 10**7
    assert pipe.extra["plan"]["bounds"] == [0, 1, 2, 3, 4] and len(pipe.extra["peak_mem_bytes"]) == 4
    assert pipe.extra["plan"]["structures"]["train"] == 8  # two steps of 4 structures per epoch
    assert all(e["bytes_layer"] > 0 for e in pipe.epochs)
    # epoch 2 from the pipeline's checkpoint of epoch 1, in one replica of two graph-parallel ranks
    resumed = api.train(dataset=xyz, epochs=2, graph_parallel_group_size=2, resume=str(ck / "ckpt-000001"), **LARGE)
    assert resumed.epochs[0]["loss"] == pipe.epochs[0]["loss"]  # the records carried over
    assert resumed.epochs[1]["bytes_gp"] > 0
    assert resumed.epochs[1]["loss"] == pytest.approx(pipe.epochs[1]["loss"], rel=1e-4)
    assert resumed.best_metrics["val_force_mae"] == pytest.approx(pipe.best_metrics["val_force_mae"], rel=1e-3)
