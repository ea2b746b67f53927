"""Stress of the conservative atomistic models: ``σ = (1/V) ∂E/∂ε`` (eV/Å³, ASE's sign) equals central finite
differences of the energy under a symmetric strain within 1e-6 relative, is intensive (a supercell has the same
stress within 1e-10) and rotates as a tensor (``R σ Rᵀ`` within 1e-10); graph parallelism (G = 2), the pipeline
(S = 2) and S = 2 × G = 2 train the stress loss exactly as the single process (every gradient, weight, loss and
metric within 1e-9, float64); training on the bulk set brings the stress error below predicting zero; a model with
direct forces or a non-periodic structure is refused or reported without a stress."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from gnnpipe import models
from gnnpipe.core.run.launch import spawn
from gnnpipe.core.settings.config import TrainConfig
from gnnpipe.data.atoms.generate import generate_bulk_like
from gnnpipe.data.atoms.structures import from_atoms
from gnnpipe.errors import ConfigError
from gnnpipe.tasks.s2ef import trainer as T
from gnnpipe.tasks.s2ef.normalizer import EnergyNormalizer
from gnnpipe.tasks.s2ef.trainer import graph_builder

from .test_graph_parallel import MODELS

ZOO = {**MODELS, "escn-md": dict(lmax=2, mmax=1, edge_channels=8, num_distance_basis=8)}


def _bulk(n: int = 3, seed: int = 0, **kw) -> list:
    return from_atoms(generate_bulk_like(n, seed=seed, max_repeat=1, **kw), dtype=torch.float64)


def _model(name: str, cutoff: float = 3.2):
    torch.manual_seed(0)
    cfg = TrainConfig(task="s2ef", model=name, layers=2, hidden=8, dtype="float64", cutoff=cutoff,
                      max_neighbors=50, model_args=ZOO[name])
    model = T.make_model(cfg).eval()
    with torch.no_grad():  # some output layers start at zero (a constant energy): move every weight
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model, graph_builder(cutoff, 50, models.get(name).uses_triplets)


def _predict(model, graph_fn, structures: list, stress: bool = True) -> dict:
    from torch_geometric.data import Batch, Data

    keep = ("z", "pos", "cell", "pbc", "natoms", "fixed", "tags")  # the inputs (labelled or not)
    batch = Batch.from_data_list([Data(**{k: d[k] for k in keep if k in d}) for d in structures])
    return model(batch, graph_fn(batch), forces=True, stress=stress)


def _strained(data, eps: np.ndarray):
    d = data.clone()
    m = torch.as_tensor(np.eye(3) + eps, dtype=torch.float64)
    d.pos, d.cell = d.pos @ m, d.cell @ m  # rows are vectors: x → x·(1 + ε)
    return d


@pytest.mark.parametrize("name", sorted(ZOO))
def test_stress_is_the_strain_derivative_of_the_energy(name):
    model, graph_fn = _model(name)
    data = _bulk(1, seed=1)[0]
    sigma = _predict(model, graph_fn, [data])["stress"][0].detach()
    volume = float(torch.linalg.det(data.cell[0]).abs())
    h = 1e-5
    fd = np.zeros((3, 3))
    for a in range(3):
        for b in range(3):
            eps = np.zeros((3, 3))
            eps[a, b] += h / 2
            eps[b, a] += h / 2
            e = [float(_predict(model, graph_fn, [_strained(data, s * eps)], stress=False)["energy"].sum())
                 for s in (1, -1)]
            fd[a, b] = (e[0] - e[1]) / (2 * h) / volume
    assert np.abs(fd).max() > 1e-4  # a strained, rattled crystal: a stress to get right
    assert np.allclose(sigma.numpy(), fd, rtol=1e-6, atol=1e-6 * np.abs(fd).max()), (sigma, fd)
    assert torch.allclose(sigma, sigma.T, atol=1e-12)


@pytest.mark.parametrize("name", ["schnet", "escn-md"])
def test_stress_is_intensive_and_rotates_as_a_tensor(name):
    from ase.build import make_supercell

    from gnnpipe.data.atoms.structures import to_atoms

    model, graph_fn = _model(name)
    data = _bulk(1, seed=2)[0]
    atoms = to_atoms(data)
    big = from_atoms([make_supercell(atoms, np.diag([2, 1, 2]))], dtype=torch.float64)[0]
    # a generic rotation; for escn-md one that maps its feed-forward's S² grid onto itself (about y by 2π/7: a
    # pointwise nonlinearity on a finite grid is equivariant only up to the grid's aliasing otherwise)
    c, s = np.cos(0.7), np.sin(0.7)
    rot = torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64) @ torch.tensor(
        [[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]], dtype=torch.float64)
    if name == "escn-md":
        c, s = np.cos(2 * np.pi / 7), np.sin(2 * np.pi / 7)
        rot = torch.tensor([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]], dtype=torch.float64)
    turned = data.clone()
    turned.pos, turned.cell = data.pos @ rot.T, data.cell @ rot.T
    out = _predict(model, graph_fn, [data, big, turned])
    sigma, sigma_big, sigma_turned = out["stress"].detach()
    assert torch.allclose(sigma_big, sigma, rtol=1e-10, atol=1e-12), (sigma_big - sigma).abs().max()
    assert torch.allclose(sigma_turned, rot @ sigma @ rot.T, rtol=1e-10, atol=1e-12)


def test_direct_forces_and_molecules_have_no_stress():
    torch.manual_seed(0)
    cfg = TrainConfig(task="s2ef", model="schnet", layers=1, hidden=8, dtype="float64", cutoff=3.0,
                      direct_forces=True, model_args=ZOO["schnet"])
    model, graph_fn = T.make_model(cfg), graph_builder(3.0, 50, False)
    with pytest.raises(ConfigError, match="conservative forces"):
        _predict(model, graph_fn, _bulk(1))
    from .toy import emt_clusters

    conservative, graph_fn = _model("schnet")
    out = _predict(conservative, graph_fn, [*_bulk(1), emt_clusters(1, seed=0, dtype=torch.float64)[0]])
    assert out["stress"][0].isfinite().all() and out["stress"][1].isnan().all()  # a cluster has no volume


# --- the stress loss trained by every layout -----------------------------------------------------------------

BATCHES = [[1, 0, 2], [3, 4, 0], [2]]


def _data():
    structures = _bulk(7, seed=4)
    splits = {"train": torch.arange(5), "val": torch.tensor([5, 0]), "test": torch.tensor([6])}
    return structures, splits, EnergyNormalizer.fit(structures[:5])


def _config(S: int = 1, G: int = 1, C: int | None = None) -> TrainConfig:
    return TrainConfig(task="s2ef", model="schnet", layers=3, hidden=8, dtype="float64", dropout=0.0, lr=1e-2,
                       weight_decay=0.01, epochs=1, batch_size=3, ema_decay=0.5, warmup_steps=0,
                       lr_schedule="constant", clip_grad_norm=5.0, force_coef=10.0, stress_coef=100.0,
                       loss_fn="mse", cutoff=3.0, max_neighbors=12, model_args=ZOO["schnet"], stages=S, chunks=C,
                       scheduler="1f1b", graph_parallel_group_size=G, graph_parallel_partitioner="edge-chunk",
                       graph_parallel_mode="halo")


def _epoch(rank: int, world: int, cfg: TrainConfig) -> dict:
    torch.set_num_threads(1)
    structures, splits, norm = _data()
    tr = T.S2EFTrainer(cfg, structures, splits, norm, rank=rank, world=world)
    grads, step = [], tr.optimizer.step

    def rec_step(*a, **k):
        grads.append({n: p.grad.clone() for n, p in tr.trained.named_parameters()})
        return step(*a, **k)

    tr.optimizer.step = rec_step
    original = T.epoch_batches
    T.epoch_batches = lambda n, gb, seed, epoch: [torch.tensor(b) for b in BATCHES]
    try:
        rec = tr.train_epoch(0)
    finally:
        T.epoch_batches = original
    return {"grads": grads, "rec": rec, "eval": tr.evaluate(),
            "weights": {k: v.clone() for k, v in tr.trained.state_dict().items()}}


def _close(a, b, what):
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), (what, float((a - b).abs().max()))


@pytest.mark.dist
@pytest.mark.timeout(600)
@pytest.mark.parametrize("S,G", [(1, 2), (2, 1), (2, 2)])
def test_every_layout_trains_the_stress_like_the_single_process(S, G):
    ref = _epoch(0, 1, _config())
    assert ref["rec"]["train_stress_mae"] > 0 and np.isfinite(ref["eval"]["val_stress_mae"])
    cfg = _config(S, G, C=2 if S > 1 else None)
    outs = spawn(_epoch, S * G, (cfg,), backend="gloo", timeout_s=120, threads=1, max_runtime_s=560)
    seen = set()
    for out in outs:
        for s, (g, g0) in enumerate(zip(out["grads"], ref["grads"], strict=True)):
            for k, v in g.items():
                _close(v, g0[k], f"gradient of {k} step {s}")
                seen.add(k)
        for k, v in out["weights"].items():
            _close(v, ref["weights"][k], f"weight {k}")
        for k in ("loss", "train_energy_mae", "train_force_mae", "train_stress_mae"):
            assert out["rec"][k] == pytest.approx(ref["rec"][k], rel=1e-9, abs=1e-12), k
        for k, v in ref["eval"].items():
            assert out["eval"][k] == pytest.approx(v, rel=1e-9, abs=1e-12, nan_ok=True), k
    assert seen == set(ref["grads"][0])


def test_the_stress_term_changes_the_gradient():
    with_stress = _epoch(0, 1, _config())
    without = _epoch(0, 1, attrs.evolve(_config(), stress_coef=0.0))
    assert "train_stress_mae" not in without["rec"] or not np.isfinite(without["rec"]["train_stress_mae"])
    g, g0 = with_stress["grads"][0], without["grads"][0]
    assert max(float((g[k] - g0[k]).abs().max()) for k in g) > 1e-6


@pytest.mark.slow
def test_training_on_the_bulk_set_learns_the_stress(tmp_path, capsys):
    from gnnpipe.cli.main import main

    result = tmp_path / "run.json"
    main(["train", "--dataset", "bulk-like", "--frames", "60", "--model", "schnet",
          "--epochs", "15", "--stress-coef", "100", "--lr", "3e-3", "--batch-size", "4", "--out", str(result),
          "--no-progress"])
    import json

    best = json.loads(result.read_text())["best_metrics"]
    zero = float(torch.cat([d.stress.reshape(-1) for d in from_atoms(generate_bulk_like(60))]).abs().mean())
    assert best["test_stress_mae"] < 0.5 * zero, (best, zero)  # well below predicting zero stress
    assert best["test_stress_mae_gpa"] == pytest.approx(160.21766 * best["test_stress_mae"], rel=1e-5)
    assert "σ-MAE" in capsys.readouterr().out


def test_a_set_with_molecules_beside_crystals_trains_the_stress_with_finite_gradients():
    """Molecules (no cell) and crystals in one batch with ``--stress-coef``: the molecules are left out of the stress
    term, and their NaN stresses do not reach the gradients (the division runs on a safe volume)."""
    from gnnpipe import api

    from .toy import emt_clusters

    data = [*_bulk(6, seed=2), *emt_clusters(6, seed=1, dtype=torch.float64)]
    res = api.train(data=data, model="schnet", layers=1, hidden=8, dtype="float64", cutoff=3.0, max_neighbors=12,
                    model_args=ZOO["schnet"], stress_coef=10.0, batch_size=4, epochs=2, warmup_steps=0,
                    log_every=0, progress=False)
    assert all(np.isfinite(e["loss"]) for e in res.epochs)
    assert all(np.isfinite(e["val_force_mae"]) for e in res.epochs)
    assert all(torch.isfinite(p).all() for p in res.model.parameters())


def test_a_stress_loss_without_stresses_or_with_direct_forces_is_refused(tmp_path, capsys):
    from gnnpipe import api
    from gnnpipe.cli.main import main

    from .toy import emt_clusters

    kw = dict(model="schnet", layers=1, hidden=8, cutoff=3.0, max_neighbors=12, model_args=ZOO["schnet"], epochs=1,
              log_every=0, progress=False)
    with pytest.raises(ConfigError, match="--stress-coef 10: no structure of .* has a stress label"):
        api.train(data=emt_clusters(6, seed=1, dtype=torch.float64), stress_coef=10.0, **kw)
    with pytest.raises(ConfigError, match="--stress-coef 10 with --direct-forces: a direct force head has no stress"):
        api.train(data=_bulk(6), stress_coef=10.0, direct_forces=True, **kw)
    assert main(["train", "--model", "gcnii", "--stress-coef", "1", "--epochs", "1"]) == 2
    assert "--stress-coef trains the stresses of atomistic S2EF models" in capsys.readouterr().err
    stress_only = api.train(data=_bulk(6), stress_coef=1.0, energy_coef=0.0, force_coef=0.0, **kw)
    assert np.isfinite(stress_only.epochs[0]["loss"])
