"""The graph-parallel S2EF executor is exact (float64, dropout off): for G ranks per replica, both partitioners, both
edge-gather modes, schnet, dimenet++ and gemnet-t with conservative (and direct) forces in the loss, every step's
energies, forces and every parameter's gradient (after the all-reduce the optimizer sees) equal the single process
within 1e-9 relative, and so do the weights, losses and metrics of the epoch; D × G = 2 × 2 equals D = 2. One step's
batch is a dimer alone (2 edges: with G = 4 some ranks own nothing). Bad configurations are refused before any process
starts; a rank that dies ends every rank with a message naming it."""

from __future__ import annotations

import os

import pytest
import torch

from gnnpipe import api
from gnnpipe.core.run.launch import spawn
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.errors import ConfigError, DistributedError, UnknownComponentError
from gnnpipe.tasks.s2ef import trainer as T
from gnnpipe.tasks.s2ef.layout import check_graph_parallel, rank_grid
from gnnpipe.tasks.s2ef.normalizer import EnergyNormalizer

from .toy import emt_clusters

pytestmark = pytest.mark.dist

MODELS = {
    "schnet": dict(num_filters=6, num_gaussians=6),
    "dimenet++": dict(int_emb_size=4, basis_emb_size=3, out_emb_channels=6, num_spherical=3, num_radial=3),
    "gemnet-t": dict(emb_size_trip=4, emb_size_rbf=3, emb_size_cbf=3, emb_size_bil_trip=5, num_spherical=3,
                     num_radial=4, num_atom=1),
}
LAYOUTS = [(m, mode) for m in ("edge-chunk", "atom-owner") for mode in ("allgather", "halo")]
#: the global batches of every epoch (indices into the training split; 0 is the dimer)
BATCHES = [[0], [1, 0, 2], [3, 4]]


def _data():
    from ase import Atoms
    from ase.calculators.emt import EMT
    from torch_geometric.data import Data

    dimer = Atoms("Cu2", positions=[[0, 0, 0], [0.3, 0.2, 2.4]])
    dimer.calc = EMT()
    d = Data(z=torch.tensor([29, 29]), pos=torch.as_tensor(dimer.positions, dtype=torch.float64),
             cell=torch.zeros(1, 3, 3, dtype=torch.float64), pbc=torch.zeros(1, 3, dtype=torch.bool),
             energy=torch.tensor([dimer.get_potential_energy()], dtype=torch.float64),
             forces=torch.as_tensor(dimer.get_forces(), dtype=torch.float64), fixed=torch.zeros(2, dtype=torch.bool),
             tags=torch.zeros(2, dtype=torch.long), natoms=torch.tensor([2]))
    structures = [d, *emt_clusters(6, seed=5)]
    splits = {"train": torch.arange(5), "val": torch.tensor([5, 0]), "test": torch.tensor([6])}
    return structures, splits, EnergyNormalizer.fit(structures[:5])


def _config(model: str, G: int = 1, method: str = "edge-chunk", mode: str = "allgather", direct: bool = False,
            batch_size: int = 3) -> TrainConfig:
    return TrainConfig(task="s2ef", model=model, layers=2, hidden=8, dtype="float64", dropout=0.0, lr=1e-2,
                       weight_decay=0.01, epochs=1, batch_size=batch_size, ema_decay=0.5, warmup_steps=0,
                       lr_schedule="constant", clip_grad_norm=None, force_coef=10.0, loss_fn="mse", cutoff=3.0,
                       max_neighbors=8, direct_forces=direct, model_args=MODELS[model],
                       graph_parallel_group_size=G, graph_parallel_partitioner=method, graph_parallel_mode=mode)


def _run(rank: int, world: int, cfg: TrainConfig, batches=BATCHES) -> dict:
    """One epoch of the executor of ``rank`` on the fixed ``batches``: each step's predictions and gradients, then
    the weights, the epoch record and the evaluation."""
    torch.set_num_threads(1)
    structures, splits, norm = _data()
    cls = T.S2EFTrainer
    tr = cls(cfg, structures, splits, norm, rank=rank, world=world)
    seen = {"pred": [], "grads": []}
    forward, step = tr.forward, tr.optimizer.step

    def recording_forward(structs, *step):
        e, f, b, s = forward(structs, *step)
        seen["pred"].append((e.detach().clone(), f.detach().clone()))
        return e, f, b, s

    def recording_step(*a, **k):
        seen["grads"].append({n: p.grad.clone() for n, p in tr.model.named_parameters()})
        return step(*a, **k)

    tr.forward, tr.optimizer.step = recording_forward, recording_step
    original = T.epoch_batches
    T.epoch_batches = lambda n, gb, seed, epoch: [torch.tensor(b) for b in batches]
    try:
        rec = tr.train_epoch(0)
    finally:
        T.epoch_batches = original
    ev = tr.evaluate()
    return {**seen, "rec": rec, "eval": ev, "weights": {k: v.clone() for k, v in tr.model.state_dict().items()}}


def _replica(rank: int, G: int) -> int:
    return rank // G


def _close(a, b, what):
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), (what, float((a - b).abs().max()))


def _assert_equal(out: dict, ref: dict, preds: bool = True) -> None:
    if preds:  # the same batches (not D shares of them)
        assert len(out["pred"]) == len(ref["pred"])
        for s, ((e, f), (e0, f0)) in enumerate(zip(out["pred"], ref["pred"])):
            _close(e, e0, f"energy step {s}")
            _close(f, f0, f"forces step {s}")
    for s, (g, g0) in enumerate(zip(out["grads"], ref["grads"], strict=True)):
        for k in g0:
            _close(g[k], g0[k], f"gradient of {k} step {s}")
    for k, v in ref["weights"].items():
        _close(out["weights"][k], v, f"weight {k}")
    for k in ("loss", "train_energy_mae", "train_force_mae"):
        assert out["rec"][k] == pytest.approx(ref["rec"][k], rel=1e-9, abs=1e-12), k
    for k, v in ref["eval"].items():
        assert out["eval"][k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


def _ranks(rank: int, world: int, cases: list) -> dict:
    return {case: _run(rank, world, _config(*case[:1], world, *case[1:])) for case in cases}


def _check_cases(G: int, cases: list) -> None:
    refs = {c: _run(0, 1, _config(c[0], 1, direct=c[3])) for c in cases}
    outs = spawn(_ranks, G, (cases,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=560)
    for case in cases:
        for r in range(G):
            _assert_equal(outs[r][case], refs[case])
        assert outs[0][case]["rec"]["bytes_gp"] > 0 and len(outs[0][case]["rec"]["gp_comm_s"]) == G


#: (model, partitioner, mode, direct forces): a quick pair of the full matrix
QUICK = [("dimenet++", "edge-chunk", "halo", False), ("schnet", "atom-owner", "allgather", True),
         ("gemnet-t", "edge-chunk", "halo", False)]


@pytest.mark.timeout(600)
def test_two_ranks_equal_the_single_process():
    _check_cases(2, QUICK)


@pytest.mark.slow  # a few minutes per G on a loaded machine (every model, layout and force kind)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("G", [2, 3, 4])
def test_every_layout_equals_the_single_process(G):
    cases = [(name, m, mode, direct) for name in MODELS for m, mode in LAYOUTS for direct in (False, True)]
    if G != 4:
        cases = [c for c in cases if not c[3] or c[0] != "schnet"]
    _check_cases(G, cases)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_rank_per_group_is_the_plain_executor():
    """G = 1 through the graph-parallel executor (a group of one rank) equals the plain executor."""
    cases = [("dimenet++", "atom-owner", "halo", False)]
    out = spawn(_ranks, 1, (cases,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=300)
    _assert_equal(out[0][cases[0]], _run(0, 1, _config("dimenet++")))


def _grid_run(rank: int, world: int, G: int) -> dict:
    return _run(rank, world, _config("dimenet++", G, "atom-owner", "halo", batch_size=2))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_replicas_of_two_ranks_equal_two_replicas():
    """D × G = 2 × 2 equals D = 2 (the data-parallel executor), each replica reading its share."""
    gp = spawn(_grid_run, 4, (2,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=500)
    dp = spawn(_grid_run, 2, (1,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=500)
    for r in range(4):
        _assert_equal(gp[r], dp[_replica(r, 2)], preds=False)
        for (e, f), (e0, f0) in zip(gp[r]["pred"], dp[_replica(r, 2)]["pred"], strict=True):  # the replica's share
            _close(e, e0, "energy")
            _close(f, f0, "forces")


# ------------------------------------------------------------------------------------------ refusals
def test_bad_configurations_are_refused_before_any_process_starts(monkeypatch, tmp_path):
    from gnnpipe.models.atomistic.schnet import SchNet

    from .toy import write_extxyz

    xyz = write_extxyz(tmp_path / "c.extxyz", 6, seed=0)
    kw = dict(dataset=xyz, model="schnet", layers=1, hidden=8, cutoff=3.0, epochs=1, log_every=0, progress=False,
              model_args=MODELS["schnet"])
    with pytest.raises(UnknownComponentError, match="edge-chunk"):
        api.train(graph_parallel_group_size=2, graph_parallel_partitioner="metis-edges", **kw)
    with pytest.raises(ConfigError, match="graph_parallel_mode must be one of allgather, halo"):
        api.train(graph_parallel_group_size=2, graph_parallel_mode="ring", **kw)
    with pytest.raises(ConfigError, match="--model gcn cannot be graph-parallel"):
        api.train(model="gcn", graph_parallel_group_size=2, epochs=1, log_every=0, progress=False)
    monkeypatch.setattr(SchNet, "graph_parallel", False)
    with pytest.raises(ConfigError, match="--model schnet cannot be trained graph-parallel"):
        api.train(graph_parallel_group_size=2, **kw)
    monkeypatch.undo()
    # torchrun: a world that --gp-size does not divide (no process group is started)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "err.json"))
    with pytest.raises(ConfigError, match="--gp-size 2 does not divide the 3 ranks"):
        api.train(graph_parallel_group_size=2, **kw)
    monkeypatch.setenv("WORLD_SIZE", "6")
    with pytest.raises(ConfigError, match="torchrun started 6 rank.* needs 4"):
        api.train(replicas=2, graph_parallel_group_size=2, **kw)


def test_check_accepts_the_grid():
    check_graph_parallel(_config("dimenet++", 2), world=4)
    check_graph_parallel(_config("schnet", 3, "atom-owner", "halo"), world=None)
    grid = rank_grid(_config("schnet", 3), world=6)
    assert [(grid.coords(r)["replica"], grid.coords(r)["gp"]) for r in range(6)] == [(0, 0), (0, 1), (0, 2),
                                                                                     (1, 0), (1, 1), (1, 2)]


def test_the_flags_and_study_keys():
    from gnnpipe.cli.main import build_parser
    from gnnpipe.core.settings.arguments import config_from_args
    from gnnpipe.experiments.grid import normalize_key, train_flag_specs

    args = build_parser().parse_args(["train", "--model", "dimenet++", "--gp-size", "4", "--gp-partitioner",
                                      "atom-owner", "--gp-mode", "halo", "--replicas", "2"])
    cfg = config_from_args(args)
    assert (cfg.graph_parallel_group_size, cfg.graph_parallel_partitioner, cfg.graph_parallel_mode) == \
        (4, "atom-owner", "halo")
    assert cfg.world_size == 8
    assert normalize_key("graph_parallel_group_size", "[grid]") == "graph_parallel_group_size"
    assert train_flag_specs()["graph_parallel_group_size"].option == "--gp-size"


# ------------------------------------------------------------------------------------------ a failing rank
def _dying(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    structures, splits, norm = _data()
    tr = T.S2EFTrainer(_config("schnet", world, "edge-chunk", "halo"), structures, splits, norm,
                                  rank=rank, world=world)
    if rank == world - 1:
        forward = tr.forward

        def failing(structs, calls=[0]):  # noqa: B006 - a counter
            calls[0] += 1
            if calls[0] == 2:
                os._exit(3)
            return forward(structs)

        tr.forward = failing
    tr.train_epoch(0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_dies_ends_every_rank_with_a_message_naming_it():
    with pytest.raises(DistributedError) as err:
        spawn(_dying, 3, (), backend="gloo", timeout_s=30, threads=1, max_runtime_s=200)
    assert "rank 2" in str(err.value)


# ------------------------------------------------------------------------------------------ the whole run
@pytest.mark.slow  # spawns gloo ranks three times
@pytest.mark.timeout(600)
def test_train_checkpoint_resume_and_export_under_graph_parallelism(tmp_path):
    """``api.train`` with ``--gp-size 2`` equals the single process; its records carry ``bytes_gp``, its result
    every rank's peak memory; a run resumed from its checkpoint under ``--gp-size 2`` ends with the same weights,
    and the checkpoint's ``last`` weights (what ``gnnpipe export --keep last`` writes) are the run's."""
    from gnnpipe.core.run.checkpoint import read_weights

    from .toy import write_extxyz

    xyz = write_extxyz(tmp_path / "c.extxyz", 12, seed=4)
    kw = dict(dataset=xyz, model="dimenet++", layers=1, hidden=8, cutoff=3.0, max_neighbors=8, batch_size=3,
              dtype="float64", dropout=0.0, warmup_steps=1, ema_decay=0.5, log_every=0, progress=False,
              model_args=MODELS["dimenet++"], keep="last")
    single = api.train(epochs=2, **kw)
    gp = api.train(epochs=2, graph_parallel_group_size=2, graph_parallel_partitioner="atom-owner",
                   graph_parallel_mode="halo", checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=1, **kw)
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(gp.model.state_dict()[k], v, rtol=1e-9, atol=1e-12)
    assert all(e["bytes_gp"] > 0 for e in gp.epochs) and len(gp.extra["peak_mem_bytes"]) == 2
    assert gp.extra["plan"]["graph_parallel"] == 2 and gp.extra["plan"]["world_size"] == 2
    for k in ("val_force_mae", "val_energy_mae", "test_force_mae"):
        assert gp.best_metrics[k] == pytest.approx(single.best_metrics[k], rel=1e-9)
    resumed = api.train(epochs=2, graph_parallel_group_size=2, resume=str(tmp_path / "ck" / "ckpt-000001"), **kw)
    for k, v in gp.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[k], v, rtol=1e-9, atol=1e-12)
    last = read_weights(tmp_path / "ck", "last")
    assert all(torch.equal(last[k], v) for k, v in gp.model.state_dict().items())


@pytest.mark.slow  # torchrun starts two ranks
@pytest.mark.timeout(600)
def test_torchrun_ranks_train_graph_parallel(tmp_path):
    import json
    import shutil
    import subprocess

    from .toy import write_extxyz

    torchrun = shutil.which("torchrun") or pytest.skip("no torchrun")
    xyz = write_extxyz(tmp_path / "c.extxyz", 8, seed=2)
    out = tmp_path / "r.json"
    p = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "gnnpipe", "train", "--dataset", xyz, "--model",
                        "schnet", "--layers", "1", "--hidden", "8", "--cutoff", "3", "--max-neighbors", "8",
                        "--model-arg", "num_filters=6", "--model-arg", "num_gaussians=6", "--gp-size", "2",
                        "--gp-mode", "halo", "--epochs", "1", "--no-progress", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["status"] == "completed" and rec["plan"]["graph_parallel"] == 2 and len(rec["peak_mem_bytes"]) == 2
    assert rec["epochs"][0]["bytes_gp"] > 0
