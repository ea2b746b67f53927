"""Fresh-user review fixes (commit a687f0b and after): graph parallelism ignores --chunks as its warning says, the
summary counts the best epoch from 1, ``num_classes`` below 2 is refused, and a resumed run's "nothing to train"
warning can be left to one rank."""

from __future__ import annotations

import warnings

import pytest

from gnnpipe.core.run.loop import epoch_loop
from gnnpipe.core.run.results import LoopState, TrainResult
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.nodes.runner import build_plan, check_config, default_chunks

from .distutil import base_config, small_graph


@pytest.mark.parametrize("chunks", [None, 1, 2, 8])
def test_graph_parallelism_has_one_part_per_way_whatever_chunks_says(chunks):
    """S = 1, W > 1: C = W (the partition is the ways' alone), with --chunks named in the "ignored" warning."""
    assert default_chunks(TrainConfig(ways=3, chunks=chunks)) == 3
    cfg = base_config(ways=2, chunks=chunks, correctors=[])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        plan = build_plan(cfg, small_graph())
    assert plan.info["chunks"] == 2 and len(plan.chunk_ptr) == 3
    ignored = [str(x.message) for x in w if "ignored" in str(x.message)]
    assert ignored == ([] if chunks in (None, 2)
                       else [f"ignored: --chunks {chunks} (graph parallelism has one part per way)"])


def test_pipeline_and_hybrid_chunks_are_unchanged():
    assert default_chunks(TrainConfig(stages=2)) == 8 and default_chunks(TrainConfig(stages=2, chunks=3)) == 3
    assert default_chunks(TrainConfig(ways=2, stages=2)) == 16 and default_chunks(TrainConfig()) == 1


def test_more_ways_than_vertices_names_the_ways():
    with pytest.raises(ConfigError, match="5 ways \\(one part of the graph each\\) but the graph has only 4 vertices; "
                                          "use fewer ways"):
        check_config(TrainConfig(ways=5, model="gcn", layers=2, correctors=[]), num_nodes=4, num_units=4)


def test_the_summary_counts_the_best_epoch_from_1():
    """best_epoch is stored from 0 (as the epoch records); the summary prints it as the epoch lines do, from 1."""
    r = TrainResult(config={}, epochs=[{"epoch": 0, "time_s": 0.1}], best_val_acc=0.5, test_acc_at_best_val=0.4,
                    best_epoch=0, mean_epoch_time_s=0.1)
    first = r.summary().splitlines()[0]
    assert "(epoch 1," in first and "(epoch 0" not in first
    r.best_epoch = 6
    assert "(epoch 7," in r.summary()
    r.best_epoch = -1  # never evaluated
    assert "epoch" not in r.summary().splitlines()[0]


@pytest.mark.parametrize("n", [1, 0, -3])
def test_fewer_than_two_classes_is_refused(n):
    with pytest.raises(ConfigError, match=rf"num_classes must be >= 2 \(a classifier needs at least two classes\), "
                                          rf"got {n}; use --num-classes 2 or more"):
        TrainConfig(num_classes=n)
    with pytest.raises(ConfigError, match="must be an integer"):
        TrainConfig(num_classes=2.0)
    assert TrainConfig(num_classes=2).num_classes == 2


def test_the_nothing_to_train_warning_can_be_left_to_one_rank():
    cfg = TrainConfig(epochs=2)
    state = LoopState(result=TrainResult(config={}))
    state.next_epoch = 2

    def never(*_):
        raise AssertionError("no epoch is left to run")

    with pytest.warns(UserWarning, match="nothing to train: the resumed run has already completed 2 epoch"):
        epoch_loop(cfg, never, never, progress=False, state=state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        epoch_loop(cfg, never, never, progress=False, state=state, warn=False)


def test_the_summary_gives_the_bytes_of_the_last_epochs_layout():
    """A pipeline run resumed as a single process: its last epochs move no layer-level bytes, and the summary says
    none instead of the earlier pipeline epochs' figure."""
    piped = [{"epoch": e, "time_s": 0.1, "bytes_layer": 2_772_992} for e in range(2)]
    r = TrainResult(config={}, epochs=piped + [{"epoch": 2, "time_s": 0.1}])
    assert "layer-level" not in r.summary()
    r = TrainResult(config={}, epochs=[{"epoch": 0, "time_s": 0.1}] + [dict(piped[0], epoch=1, bytes_layer=5)])
    assert "bytes/epoch layer-level 5" in r.summary()
