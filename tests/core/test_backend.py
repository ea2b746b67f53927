"""The default torch.distributed backend fits the layout: nccl only with one GPU per rank (issue #18)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gnnpipe.core.run import launch
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.nodes.runner import format_plan, plan_backend


def _fake_cuda(monkeypatch, gpus: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)


def test_no_cuda_gives_gloo(monkeypatch):
    _fake_cuda(monkeypatch, 0)
    for ranks in (1, 2, 8):
        backend, why = launch.choose_backend(None, ranks)
        assert backend == "gloo" and "no CUDA" in why
    with pytest.raises(ConfigError, match="one CUDA GPU per rank"):
        launch.choose_backend("nccl", 2)


def test_one_gpu_never_nccl_for_two_ranks(monkeypatch):
    _fake_cuda(monkeypatch, 1)
    assert launch.choose_backend(None, 1)[0] == "nccl"  # one rank on one GPU fits
    backend, why = launch.choose_backend(None, 2)
    assert backend == "gloo" and "2 ranks but 1 GPU" in why
    assert launch.default_backend(2) == "gloo"
    # what gnnpipe train / api.train / the benchmarks use: the plan's backend for the config's layout
    cfg = TrainConfig(stages=2, chunks=4)
    assert plan_backend(cfg)[0] == "gloo"
    assert plan_backend(TrainConfig(ways=2, stages=2))[0] == "gloo"
    with pytest.raises(ConfigError, match="2 rank\\(s\\) would share 1 GPU"):
        plan_backend(TrainConfig(stages=2, chunks=4, backend="nccl"))


def test_enough_gpus_gives_nccl(monkeypatch):
    _fake_cuda(monkeypatch, 2)
    assert launch.choose_backend(None, 2)[0] == "nccl"
    assert launch.choose_backend("gloo", 2)[0] == "gloo"


def test_torchrun_counts_local_ranks_only(monkeypatch):
    _fake_cuda(monkeypatch, 2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two machines with two ranks (and two GPUs) each
    assert plan_backend(TrainConfig(stages=4, chunks=4))[0] == "nccl"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert plan_backend(TrainConfig(stages=4, chunks=4))[0] == "gloo"


def test_unknown_backend():
    with pytest.raises(ConfigError, match="unknown backend"):
        launch.choose_backend("mpi", 1)


def test_plan_prints_backend(monkeypatch):
    from gnnpipe.tasks.nodes.runner import build_plan

    from .distutil import base_config, small_graph

    _fake_cuda(monkeypatch, 1)
    plan = build_plan(base_config(stages=2, chunks=2), small_graph())
    assert plan.info["backend"] == "gloo"
    # issue #12: the ranks compute on the GPU by default (--device), so they share it over gloo
    assert "backend gloo (2 ranks but 1 GPU(s): gloo, the ranks share the GPU(s) through pinned CPU buffers)" \
        in format_plan(plan.info)
    plan = build_plan(base_config(stages=2, chunks=2, device="cpu"), small_graph())
    assert "backend gloo (--device cpu: gloo on the CPU)" in format_plan(plan.info)


def test_spawn_defaults_to_gloo_with_one_gpu(monkeypatch):
    _fake_cuda(monkeypatch, 1)
    seen = {}

    class _Stop(Exception):
        pass

    def fake_get_context(method):
        raise _Stop

    monkeypatch.setattr(launch.mp, "get_context", fake_get_context)
    monkeypatch.setattr(launch, "default_backend",
                        lambda n: seen.setdefault("backend", launch.choose_backend(None, n)[0]))
    with pytest.raises(_Stop):
        launch.spawn(print, 2)
    assert seen["backend"] == "gloo"
