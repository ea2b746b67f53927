"""The unit structure a pipeline and graph parallelism rely on: slices of units give the whole model's result,
every graph-parallel hook is called, weights are seeded per unit, and the models are in the zoo registry."""

from __future__ import annotations

import pytest
import torch

from gnnpipe import models
from gnnpipe.errors import ConfigError, DataValidationError
from gnnpipe.models import build_model
from gnnpipe.models.atomistic import AtomisticModel, LocalHooks

from .conftest import DIMENET_SMALL, GEMNET_SMALL, NAMES, SCHNET_SMALL, SMALL, make_graph

OPTIONS = SMALL


class RecordingComm(LocalHooks):
    """The identity hooks, recording each call's name and shape."""

    def __init__(self):
        self.calls = []

    def _rec(self, name, x):
        self.calls.append((name, tuple(x.shape)))
        return x

    def atoms_gather(self, h):
        return self._rec("atoms_gather", h)

    def atoms_reduce(self, h):
        return self._rec("atoms_reduce", h)

    def edges_gather(self, x):
        return self._rec("edges_gather", x)

    def sum(self, x):
        return self._rec("sum", x)

    def replicated_grad(self, g):
        return self._rec("replicated_grad", g)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("cut", [1, 2])
def test_units_run_in_slices_equal_the_whole(batch, name, cut):
    torch.manual_seed(0)
    model = build_model(name, 0, 1, **OPTIONS[name]).double()
    graph = make_graph(batch, OPTIONS[name]["cutoff"])
    whole = model(batch, graph)["energy"]
    state = model.initial_state(batch, graph)
    state = model.run_units(0, cut, state, graph)
    # a stage boundary: the state's tensors leave one stage and enter the next
    state = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in state.items()}
    state = model.run_units(cut, model.num_units, state, graph)
    torch.testing.assert_close(model.readout(state, graph)["energy"], whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,hooks", [
    ("dimenet++", {"atoms_gather", "atoms_reduce", "edges_gather", "sum", "replicated_grad"}),
    ("schnet", {"atoms_gather", "atoms_reduce", "sum", "replicated_grad"}),
    ("gemnet-t", {"atoms_gather", "atoms_reduce", "edges_gather", "sum", "replicated_grad"}),
])
def test_every_hook_is_called(batch, name, hooks):
    torch.manual_seed(0)
    model = build_model(name, 0, 1, **OPTIONS[name]).double()
    graph = make_graph(batch, OPTIONS[name]["cutoff"])
    comm = RecordingComm()
    model(batch, graph, comm, forces=True)
    called = {c for c, _ in comm.calls}
    assert called == hooks
    N, E = batch.num_nodes, graph.num_edges
    assert ("sum", (2,)) in comm.calls and ("replicated_grad", (N, 3)) in comm.calls
    if name == "dimenet++":
        L = DIMENET_SMALL["num_layers"]
        assert comm.calls.count(("edges_gather", (E, DIMENET_SMALL["int_emb_size"]))) == L
        assert ("edges_gather", (E, 3)) in comm.calls  # the triplets' second edge vector
        assert sum(c == "atoms_reduce" for c, _ in comm.calls) == L + 1  # one per output block
    elif name == "gemnet-t":
        L, o = GEMNET_SMALL["num_layers"], GEMNET_SMALL
        assert comm.calls.count(("edges_gather", (E, o["emb_size_trip"]))) == L  # the triplets' in-edges
        assert comm.calls.count(("edges_gather", (E, o["emb_size_bil_trip"]))) == L  # the reverse edges
        assert sum(c == "atoms_reduce" for c, _ in comm.calls) == 2 * L + 1  # atom updates, output blocks
    else:
        assert sum(c == "atoms_reduce" for c, _ in comm.calls) == SCHNET_SMALL["num_layers"]


def test_direct_force_head_reduces_onto_owned_atoms(batch):
    model = build_model("schnet", 0, 1, direct_forces=True, **SCHNET_SMALL).double()
    graph = make_graph(batch, SCHNET_SMALL["cutoff"])
    comm = RecordingComm()
    model(batch, graph, comm)
    assert ("atoms_reduce", (batch.num_nodes, 3)) in comm.calls
    assert "replicated_grad" not in {c for c, _ in comm.calls}


@pytest.mark.parametrize("name", NAMES)
def test_weights_are_seeded_per_unit(name):
    o = OPTIONS[name]
    a = build_model(name, 0, 1, **o)
    b = build_model(name, 0, 1, **{**o, "num_layers": o["num_layers"] + 1})
    a.reset_parameters(seed=7)
    b.reset_parameters(seed=7)
    for u in range(a.num_units):  # unit u draws the same weights whatever units follow
        for (k, p), (k2, q) in zip(a.units[u].state_dict().items(), b.units[u].state_dict().items()):
            assert k == k2 and torch.equal(p, q), k
    c = build_model(name, 0, 1, **o)
    c.reset_parameters(seed=8)
    assert not torch.equal(c.units[1].state_dict()[next(iter(c.units[1].state_dict()))],
                           a.units[1].state_dict()[next(iter(a.units[1].state_dict()))])
    torch.manual_seed(3)
    d = build_model(name, 0, 1, **o)
    torch.manual_seed(3)
    e = build_model(name, 0, 1, **o)
    for (k, p), q in zip(d.state_dict().items(), e.state_dict().values()):
        assert torch.equal(p, q), k


def test_registered_in_the_zoo_with_options():
    for name in ("dimenet++", "schnet"):
        cls = models.get(name)
        assert issubclass(cls, AtomisticModel) and issubclass(cls, models.ZooModel)
        assert cls.task == "s2ef"
    assert models.get("gcn").task == "node-classification"
    opts = models.model_options("dimenet++")
    assert {"cutoff", "num_radial", "num_spherical", "int_emb_size", "basis_emb_size", "out_emb_channels",
            "direct_forces", "max_z"} <= set(opts)
    assert opts["cutoff"].default == 6.0 and opts["int_emb_size"].default == 64
    schnet_opts = set(models.model_options("schnet"))
    assert {"num_filters", "num_gaussians", "cutoff", "direct_forces", "max_z"} <= schnet_opts
    assert models.parse_model_args("schnet", ["direct_forces=true", "cutoff=5"]) == {"direct_forces": True,
                                                                                     "cutoff": 5.0}


def test_cli_lists_the_atomistic_models(capsys):
    from gnnpipe.cli.models import describe

    text = describe("dimenet++")
    assert "int_emb_size=64" in text and "direct_forces=False" in text and "s2ef" in text


@pytest.mark.parametrize("kwargs,match", [
    ({"out_channels": 2}, "out_channels must be 1"), ({"dropout": 0.1}, "no dropout"),
    ({"hidden": 0}, "positive int"), ({"cutoff": -1.0}, "cutoff > 0"),
    ({"activation": "nope"}, "unknown activation"),
])
def test_bad_options_are_refused(kwargs, match):
    common = {k: kwargs.pop(k) for k in list(kwargs) if k in ("out_channels",)}
    with pytest.raises(ConfigError, match=match):
        models.get("schnet")(0, common.get("out_channels", 1), **kwargs)


def test_unknown_atomic_number_is_refused(batch):
    model = build_model("schnet", 0, 1, max_z=7, **SCHNET_SMALL).double()
    with pytest.raises(DataValidationError, match="max_z"):
        model(batch, make_graph(batch, SCHNET_SMALL["cutoff"]))


@pytest.mark.parametrize("name", NAMES)
def test_a_graph_naming_its_owned_atoms_gives_the_same_result(batch, name):
    """A local graph view (``atom_ids``: the owned atoms) owning every atom is the whole graph."""
    import dataclasses

    torch.manual_seed(0)
    model = build_model(name, 0, 1, **OPTIONS[name]).double()
    graph = make_graph(batch, OPTIONS[name]["cutoff"])
    view = dataclasses.replace(graph)
    view.atom_ids = torch.arange(batch.num_nodes)
    a, b = model(batch, graph, forces=True), model(batch, view, forces=True)
    torch.testing.assert_close(b["energy"], a["energy"], rtol=0, atol=1e-12)
    torch.testing.assert_close(b["forces"], a["forces"], rtol=0, atol=1e-12)
