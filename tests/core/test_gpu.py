"""GPU paths (issue #12), skipped without CUDA: the single-process trainer on the GPU, and pipeline, graph
parallelism and hybrid with every rank on one GPU (gloo through pinned host buffers). Run by
``benchmarks/gpu_check.sh`` on a GPU machine."""

import attrs
import pytest
import torch

from gnnpipe import api
from gnnpipe.tasks.nodes.trainer import SingleProcessTrainer

from .distutil import base_config, run_distributed, run_reference, small_graph

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.timeout(300)]


def test_single_process_on_gpu_equals_cpu():
    data = small_graph()
    cfg = base_config(model="gcnii", layers=4, epochs=3)
    cpu = SingleProcessTrainer(data, attrs.evolve(cfg, device="cpu"))
    gpu = SingleProcessTrainer(data, attrs.evolve(cfg, device="cuda"))
    assert gpu.x.is_cuda and next(gpu.model.parameters()).is_cuda
    for e in range(3):
        a, b = cpu.train_epoch(e)["loss"], gpu.train_epoch(e)["loss"]
        assert abs(a - b) < 1e-4


@pytest.mark.dist
@pytest.mark.parametrize("model", ["gcn", "gcnii"])
def test_one_chunk_gpu_pipeline_equals_cpu_single_process(model):
    """Ranks share the GPU over gloo (staged through pinned buffers); C = 1 is exact."""
    data = small_graph()
    cfg = base_config(model=model, stages=2, chunks=1, layers=4, device="cuda", backend="gloo")
    plan, outs, _ = run_distributed(cfg, data, grads_after=())
    _, ref, _ = run_reference(attrs.evolve(cfg, device="cpu", backend=None), plan.data, grads_after=())
    for a, b in zip(outs[0]["losses"], ref):
        assert abs(a - b) < 1e-4


@pytest.mark.dist
@pytest.mark.parametrize("ways,stages,chunks", [(1, 2, 4), (2, 1, None), (2, 2, 4)])
def test_layouts_train_on_one_gpu(ways, stages, chunks):
    data = small_graph()
    cfg = base_config(model="gcnii", ways=ways, stages=stages, chunks=chunks, layers=4, epochs=3, device="cuda",
                      correctors=[] if stages == 1 else ["t1", "t2", "t3"])
    res = api.train(cfg, data=data, progress=False)
    losses = [e["loss"] for e in res.epochs]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
