"""``recompute="auto"`` (issue #32 item 3): the memory model decides for a pipeline when it starts."""

import argparse

import pytest

from gnnpipe.api import TrainConfig, load_data
from gnnpipe.core.settings.arguments import add_train_arguments
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.nodes.cost.memory_check import choose_recompute
from gnnpipe.tasks.nodes.cost.profile import memory_profile
from gnnpipe.tasks.nodes.runner import build_plan, format_plan
from gnnpipe.tasks.nodes.trainer import make_model, resolve_config


def _choice(**kw):
    cfg = resolve_config(TrainConfig(num_nodes=600, layers=4, hidden=16, stages=2, epochs=2, **kw))
    plan = build_plan(cfg, load_data(cfg))
    return cfg, plan, choose_recompute(cfg, plan, make_model(cfg, plan.num_features, plan.num_classes),
                                       memory_profile(cfg, plan.data))


def test_gpipe_with_every_chunk_in_flight_recomputes_and_says_why():
    cfg, plan, c = _choice(chunks=12, scheduler="gpipe")
    assert cfg.recompute is None  # auto until the pipeline starts
    assert c.on and c.without > c.graph_parallel and c.with_ < c.without
    assert "more than graph parallelism over the same 2 ranks" in c.why and "--no-recompute" in c.why
    plan.info["recompute"] = dict(c.to_dict(), why="auto: " + c.why)
    assert "recompute: on (auto: the memory model predicts" in format_plan(plan.info)


def test_the_choice_is_the_stated_rule():
    for sch, chunks in (("1f1b", 4), ("gpipe", 4)):
        _, _, c = _choice(chunks=chunks, scheduler=sch)
        assert c.on == (c.without > c.graph_parallel and c.with_ < c.without)


def test_auto_is_the_default_and_resolves_off_without_a_pipeline():
    assert TrainConfig().recompute is None and TrainConfig().scheduler == "1f1b"
    assert resolve_config(TrainConfig(ways=2)).recompute is False
    assert resolve_config(TrainConfig(stages=2)).recompute is None
    assert TrainConfig(recompute="auto").recompute is None and TrainConfig(recompute="true").recompute is True
    with pytest.raises(ConfigError, match="true, false or 'auto'"):
        TrainConfig(recompute="sometimes")


def test_cli_flags_are_three_states():
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    assert p.parse_args([]).recompute is None
    assert p.parse_args(["--recompute"]).recompute is True
    assert p.parse_args(["--no-recompute"]).recompute is False
