"""The single-process run the memory model says cannot fit is refused up front (issue #12), never killed by
the kernel's out-of-memory killer; ``--no-memory-check`` / ``memory_check=False`` tries anyway."""

import pytest

from gnnpipe import api
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.nodes.cost.memory_check import check_single_process_memory, single_process_memory
from gnnpipe.tasks.nodes.trainer import resolve_config


def _job(**kw):
    cfg = resolve_config(TrainConfig(**dict(dict(model="gcnii", layers=4, hidden=16, num_nodes=3000, avg_degree=6,
                                                 epochs=1), **kw)))
    return cfg, api.load_data(cfg)


def test_prediction_grows_with_the_graph_and_the_depth():
    cfg, data = _job()
    small = single_process_memory(cfg, data)
    cfg2, data2 = _job(num_nodes=6000)
    cfg3, data3 = _job(layers=8)
    assert small.activations > 0
    assert single_process_memory(cfg2, data2).activations == pytest.approx(2 * small.activations, rel=0.05)
    assert single_process_memory(cfg3, data3).activations > 1.5 * small.activations


def test_refused_with_the_prediction_and_the_available_memory():
    cfg, data = _job()
    pred = single_process_memory(cfg, data)
    need = pred.peak
    with pytest.raises(ConfigError, match=r"would need about \d+ MiB .* MiB are available here.*--no-memory-check"):
        check_single_process_memory(cfg, data, available=need // 4)
    # the loaded graph counts as available: the need less half the graph fits (a prediction measures the role's
    # bytes per row anew, which differ between calls by a few hundred bytes, far less than half the graph)
    fits = check_single_process_memory(cfg, data, available=need - pred.graph // 2)
    assert fits is not None and fits.peak == pytest.approx(need, rel=0.01)
    assert check_single_process_memory(cfg, data, available=10**12) is None  # far below: no profile taken


def test_api_refuses_before_training_and_trains_with_the_check_off(monkeypatch):
    import gnnpipe.tasks.nodes.cost.memory_check as memory_check

    monkeypatch.setattr(memory_check, "available_memory_bytes", lambda: 1)  # a machine with no memory left
    with pytest.raises(ConfigError, match="single process would need"):
        api.train(model="gcnii", layers=4, hidden=16, num_nodes=3000, avg_degree=6, epochs=1, progress=False)
    r = api.train(model="gcnii", layers=4, hidden=16, num_nodes=3000, avg_degree=6, epochs=1, progress=False,
                  memory_check=False)
    assert len(r.epochs) == 1


def test_local_ranks_are_refused_together_and_small_sizes_print_in_mib():
    from gnnpipe.tasks.nodes.cost.memory_check import RANK_FLOOR_BYTES, check_ranks_memory, format_bytes

    pred = [100 * 2**20, 300 * 2**20]
    check_ranks_memory(pred, available=sum(pred) + 2 * RANK_FLOOR_BYTES)  # fits exactly: no error
    with pytest.raises(ConfigError, match=r"the 2 ranks would need about 1.1 GiB together .*--no-memory-check"):
        check_ranks_memory(pred, available=sum(pred))
    assert format_bytes(10 * 2**20) == "10 MiB" and format_bytes(3 * 2**30) == "3.0 GiB"


def test_api_refuses_local_ranks_that_cannot_fit(monkeypatch):
    import gnnpipe.tasks.nodes.cost.memory_check as memory_check

    monkeypatch.setattr(memory_check, "available_memory_bytes", lambda: 2**20)
    with pytest.raises(ConfigError, match="ranks would need"):  # refused before any rank starts
        api.train(model="gcnii", layers=4, hidden=16, num_nodes=3000, avg_degree=6, epochs=1, progress=False,
                  stages=2, chunks=4)
