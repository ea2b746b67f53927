"""The S2EF defaults of each atomistic model (``gnnpipe.tasks.s2ef.defaults``): taken for the flags not given, never
for a flag given (also one equal to the generic default), on the command line and in the API, and named in the run
header."""

from __future__ import annotations

import argparse
import json
import pickle

import attrs
import pytest
import torch

from gnnpipe.core.settings.arguments import add_train_arguments, config_from_args
from gnnpipe.core.settings.config import TrainConfig, is_unset, unset
from gnnpipe.tasks.s2ef import S2EF
from gnnpipe.tasks.s2ef.defaults import FIELDS, MODEL_DEFAULTS


def _cli(*flags: str) -> TrainConfig:
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return config_from_args(p.parse_args(list(flags)))


@pytest.mark.parametrize("model", ["schnet", "dimenet++"])
def test_a_model_s_s2ef_defaults_fill_the_flags_not_given(model):
    task = S2EF()
    cfg = task.resolve(TrainConfig(model=model))
    table = MODEL_DEFAULTS[model]
    assert {k: getattr(cfg, k) for k in FIELDS} == {k: table[k] for k in FIELDS}
    assert task.defaults_chosen == {k: table[k] for k in FIELDS}
    assert not any(is_unset(getattr(cfg, k)) for k in FIELDS)           # plain numbers after resolution
    assert cfg.model_args["cutoff"] == table["cutoff"] and cfg.model_args["max_neighbors"] == table["max_neighbors"]
    # the recipe differs from the generic values it replaces (else this test could not fail)
    generic = TrainConfig()
    assert any(table[k] != getattr(generic, k) for k in FIELDS if k != "lr")


def test_flags_given_are_kept_even_when_equal_to_the_generic_default():
    given = dict(layers=8, hidden=64, cutoff=6.0, max_neighbors=50, batch_size=8, lr=5e-4, energy_coef=1.0,
                 force_coef=100.0)
    for cfg in (S2EF().resolve(TrainConfig(model="dimenet++", **given)),
                S2EF().resolve(_cli("--model", "dimenet++", "--layers", "8", "--hidden", "64", "--cutoff", "6",
                                    "--max-neighbors", "50", "--batch-size", "8", "--lr", "5e-4", "--energy-coef",
                                    "1", "--force-coef", "100"))):
        assert {k: getattr(cfg, k) for k in FIELDS} == given
    task = S2EF()
    cfg = task.resolve(_cli("--model", "schnet", "--layers", "8"))        # one given, the others the model's
    assert cfg.layers == 8 and cfg.hidden == MODEL_DEFAULTS["schnet"]["hidden"]
    assert "layers" not in task.defaults_chosen and "hidden" in task.defaults_chosen


def test_gemnet_num_blocks_is_the_depth():
    from gnnpipe.errors import ConfigError

    cfg = S2EF().resolve(_cli("--model", "gemnet-t", "--model-arg", "num_blocks=5"))
    assert cfg.layers == 5                                     # not the recipe's 3: the run header shows L = 5
    assert S2EF().resolve(_cli("--model", "gemnet-t", "--layers", "5", "--model-arg", "num_blocks=5")).layers == 5
    with pytest.raises(ConfigError, match="two depths"):
        S2EF().resolve(_cli("--model", "gemnet-t", "--layers", "4", "--model-arg", "num_blocks=5"))


def test_unset_values_behave_as_plain_numbers():
    cfg = TrainConfig()
    assert is_unset(cfg.layers) and is_unset(cfg.cutoff) and not is_unset(8) and not is_unset(6.0)
    assert cfg.layers == 8 and cfg.cutoff == 6.0 and repr(cfg.force_coef) == "100.0"
    assert not is_unset(cfg.layers + 0) and not is_unset(attrs.evolve(cfg, layers=8).layers)
    assert json.loads(json.dumps(cfg.to_dict()))["layers"] == 8
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and is_unset(back.hidden)                       # spawned ranks see the same config
    assert isinstance(unset(3), int) and isinstance(unset(3.5), float)


def test_node_classification_keeps_its_defaults():
    from gnnpipe.tasks import for_config

    cfg = TrainConfig(model="gcn", num_nodes=50)
    task = for_config(cfg)
    assert task.name == "node-classification"
    out = task.resolve(cfg)
    assert (out.layers, out.hidden) == (8, 64)


def test_the_run_header_names_the_defaults_chosen():
    from gnnpipe.tasks.s2ef import S2EFData

    task = S2EF()
    cfg = task.resolve(TrainConfig(model="dimenet++", cutoff=4.0, epochs=2))
    data = S2EFData(structures=[], splits={k: torch.arange(0) for k in ("train", "val", "test")}, normalizer=None,
                    name="oc20-like")
    text = task.describe(cfg, data)
    assert "dimenet++'s S2EF defaults for the flags not given" in text
    assert "--layers" in text and "--force-coef" in text and "--cutoff" not in text.split(";")[0]
    assert f"lr {cfg.lr:g}" in text and f"{cfg.energy_coef:g}·E + {cfg.force_coef:g}·F" in text


def test_schnet_trains_without_triplets_and_dimenet_with_them():
    from gnnpipe import models
    from gnnpipe.tasks.s2ef import EnergyNormalizer
    from gnnpipe.tasks.s2ef.trainer import S2EFTrainer, forward, graph_builder

    from .toy import emt_clusters

    structures = emt_clusters(6, seed=3, dtype=torch.float64)
    splits = {"train": torch.arange(4), "val": torch.arange(4, 5), "test": torch.arange(5, 6)}
    cfg = S2EF().resolve(TrainConfig(model="schnet", layers=1, hidden=8, cutoff=4.0, dtype="float64",
                                     model_args={"num_filters": 8, "num_gaussians": 8}))
    tr = S2EFTrainer(cfg, structures, splits, EnergyNormalizer.fit(structures[:4]))
    tr.model.eval()
    e, f, batch, _ = tr.forward(structures[:3])
    assert tr.graph_fn(batch).idx_kj is None
    e2, f2, _ = forward(tr.model, structures[:3], graph_builder(4.0, cfg.max_neighbors, True))
    assert torch.equal(e, e2) and torch.equal(f, f2)  # the same energies and forces as with the triplets built
    assert models.get("dimenet++").uses_triplets and not models.get("schnet").uses_triplets
