"""The single-process run the memory model says cannot fit is refused up front (issue #12), never killed by
the kernel's out-of-memory killer; ``--no-memory-check`` / ``memory_check=False`` tries anyway."""

import pytest

from gnnpipe import api
from gnnpipe.core.config import TrainConfig
from gnnpipe.core.trainer import resolve_config
from gnnpipe.costmodel.predict import check_single_process_memory, single_process_memory
from gnnpipe.errors import ConfigError


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
    need = single_process_memory(cfg, data).peak
    with pytest.raises(ConfigError, match=r"GiB are available here.*--no-memory-check"):
        check_single_process_memory(cfg, data, available=need // 4)
    fits = check_single_process_memory(cfg, data, available=need)  # the loaded graph counts as available
    assert fits is not None and fits.peak == need
    assert check_single_process_memory(cfg, data, available=10**12) is None  # far below: no profile taken


def test_api_refuses_before_training_and_trains_with_the_check_off(monkeypatch):
    import gnnpipe.costmodel.predict as predict

    monkeypatch.setattr(predict, "available_memory_bytes", lambda: 1)  # a machine with no memory left
    with pytest.raises(ConfigError, match="single process would need"):
        api.train(model="gcnii", layers=4, hidden=16, num_nodes=3000, avg_degree=6, epochs=1, progress=False)
    r = api.train(model="gcnii", layers=4, hidden=16, num_nodes=3000, avg_degree=6, epochs=1, progress=False,
                  memory_check=False)
    assert len(r.epochs) == 1
