"""--device and the backend choice (issue #12), on CPU: config errors, which backend a layout gets, and the
communication wrapper's staging path (receives through host buffers) in a real gloo run."""

import pytest
import torch
import torch.distributed as dist

from gnnpipe.core.comm import Comm
from gnnpipe.core.run import launch
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.nodes.runner import plan_backend, rank_device


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_device_cuda_without_gpu_is_refused_up_front():
    with pytest.raises(ConfigError, match="--device cuda needs a CUDA GPU"):
        _ = TrainConfig(device="cuda").device_type
    with pytest.raises(ConfigError, match="unknown device"):
        _ = TrainConfig(device="tpu").device_type
    assert TrainConfig().device_type == "cpu"
    assert rank_device(TrainConfig()) == torch.device("cpu")


def test_backend_choice(monkeypatch):
    """CPU ranks: gloo; CUDA ranks with a GPU each: nccl; more ranks than GPUs: gloo (nccl refuses two ranks
    on one GPU); an explicit --backend wins."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert plan_backend(TrainConfig(device="cpu", stages=2))[0] == "gloo"
    assert plan_backend(TrainConfig(device="cuda", stages=2))[0] == "nccl"
    assert plan_backend(TrainConfig(stages=2))[0] == "nccl"  # default device: cuda when available
    assert plan_backend(TrainConfig(device="cuda", stages=4))[0] == "gloo"
    assert plan_backend(TrainConfig(device="cuda", ways=2, stages=2))[0] == "gloo"
    assert plan_backend(TrainConfig(device="cuda", stages=2, backend="gloo"))[0] == "gloo"
    backend, why = plan_backend(TrainConfig(device="cuda", stages=4))
    assert "4 ranks but 2 GPU(s)" in why and "pinned CPU buffers" in why
    assert plan_backend(TrainConfig(device="cpu", stages=2))[1] == "--device cpu: gloo on the CPU"
    with pytest.raises(ConfigError, match="--device cpu computes on the CPU"):
        plan_backend(TrainConfig(device="cpu", stages=2, backend="nccl"))


def _staged(rank, world):
    comm = Comm("cpu", stage=True)  # the host-buffer path of ranks sharing a GPU, exercised with CPU tensors
    other = 1 - rank
    t = torch.full((3, 2), float(rank + 1))
    comm.isend(t, other, tag=5)
    got = comm.recv((3, 2), torch.float32, other, tag=5)
    comm.isend(t * 10, other, tag=6)
    posted = comm.irecv((3, 2), torch.float32, other, tag=6)
    got2 = comm.wait_recv(posted)
    comm.wait_sends()
    buf = torch.zeros(2, 2)
    comm.exchange([(torch.full((2, 2), float(rank + 7)), other)], [(buf, other)], tag=9, kind="graph")
    red = comm.all_reduce(torch.full((4,), float(rank + 1)))
    return {"recv": got.tolist(), "irecv": got2.tolist(), "exchange": buf.tolist(), "all_reduce": red.tolist(),
            "bytes": dict(comm.bytes)}


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_staged_comm_moves_the_same_values_and_counts_the_same_bytes():
    outs = launch.spawn(_staged, 2, timeout_s=60, max_runtime_s=100)
    for rank, o in enumerate(outs):
        other = 1 - rank
        assert o["recv"] == [[float(other + 1)] * 2] * 3
        assert o["irecv"] == [[float(10 * (other + 1))] * 2] * 3
        assert o["exchange"] == [[float(other + 7)] * 2] * 2
        assert o["all_reduce"] == [3.0] * 4
        assert o["bytes"]["layer"] == 2 * 3 * 2 * 4 and o["bytes"]["graph"] == 2 * 2 * 4
