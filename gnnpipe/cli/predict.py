"""``gnnpipe predict``: class scores of every vertex by a trained model, and its accuracy on each mask; for an
atomistic (S2EF) model, the energy and forces of every structure, and the MAEs on each split.

The model comes from a checkpoint folder (``--checkpoint-dir`` of ``gnnpipe train``) or a model file
(``gnnpipe export``). The graph is the model's training dataset unless ``--dataset`` (and ``--root``,
``--split``) name another; it is preprocessed as at training. ``--out`` gets ``{"scores": [N, C] float,
"pred": [N] long}`` in the dataset's own vertex order. An S2EF model predicts the structures of ``--dataset``
(a structure file: all of them; default: the training run's data set, by split); ``--out`` ending in ``.extxyz``
or ``.xyz`` gets the structures with the predicted ``energy`` and ``forces`` (ASE's extended XYZ, readable by
``ase.io.read``); ending in ``.npz``, fairchem's S2EF prediction layout (below); any other name
``{"energy": [S] eV, "forces": [[n, 3] eV/Å per structure]}`` (``torch.save``).

The ``.npz`` is what fairchem's ``predict`` writes (``s2ef_predictions.npz``) and what its submission scripts and
OC20 tooling read: ``ids`` [S] str — each structure's ``"sid_fid"`` where the file records both (OC20 S2EF), its
``sid`` where only that, else its index in the file —, ``energy`` [S] eV, ``forces`` [ΣF, 3] eV/Å of the free
atoms (fixed atoms left out, as fairchem writes them; ``--npz-atoms all``: every atom) of all structures
concatenated, ``chunk_idx`` [S − 1] where ``np.split(forces, chunk_idx)`` gives each structure's rows (the
cumulative counts, fairchem's ``np.cumsum(counts)[:-1]``), and ``natoms`` [S] (every atom, free or fixed). The
structures keep the file's order (fairchem sorts by id; the ids say which is which). Floats are float32 (fairchem's
``prediction_dtype: float32``; ``--npz-dtype float16`` is its default, ``float64`` keeps every digit).

The training run's ``--root`` (and a ``--dataset`` file) is looked up where the run recorded it (its absolute
path, in checkpoints and model files written since it is recorded), then, when it was relative, against the
folder holding the model file (or the checkpoint folder), then against the current directory.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import attrs
import numpy as np
import torch
from ase.calculators.singlepoint import SinglePointCalculator

from ..api import load_data
from ..core.run.checkpoint import model_from_checkpoint
from ..core.settings.config import TrainConfig
from ..data.atoms import to_atoms
from ..data.datasets import DATASET_FILE_SUFFIXES
from ..errors import ConfigError
from ..models import load
from ..tasks.s2ef import S2EF
from ..tasks.s2ef.data import dataset_path, is_structure_dataset, load_structures
from ..tasks.s2ef.predict import has_label, predict_structures, structure_ids
from .main import HelpFormatter


def register(sub) -> None:
    p = sub.add_parser("predict", help="predict with a trained model (checkpoint folder or model file)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("model", help="a checkpoint folder or a model file written by gnnpipe export")
    p.add_argument("--dataset", default=None, help="dataset name or file (default: the one the model was trained on)")
    p.add_argument("--root", default=None, help="folder holding the dataset (default: the training run's)")
    p.add_argument("--split", type=int, default=None, help="split index (default: the training run's)")
    p.add_argument("--keep", choices=["best", "last"], default=None,
                   help="checkpoint folders: which weights (default: best; a model file holds the one set "
                        "gnnpipe export --keep chose)")
    p.add_argument("--out", default=None, help="write {'scores', 'pred'} here with torch.save (an S2EF model: the "
                   "structures with predicted energy and forces as .extxyz/.xyz, fairchem's prediction layout as "
                   ".npz, or {'energy', 'forces'} with torch.save)")
    p.add_argument("--npz-atoms", choices=["free", "all"], default="free",
                   help="S2EF .npz: the forces of the free atoms only (fairchem's layout) or of every atom")
    p.add_argument("--npz-dtype", choices=["float16", "float32", "float64"], default="float32",
                   help="S2EF .npz: the floats' dtype (fairchem writes float16 unless its prediction_dtype asks "
                        "for float32)")
    p.add_argument("--unseen-elements", choices=["warn", "error", "ignore"], default="warn",
                   help="S2EF models: elements absent from the model's training split (its file records them; files "
                        "written before that carry no record): warn naming them, refuse, or say nothing")
    p.set_defaults(func=run)


def load_model(src: str, keep: str = "best"):
    """A model from a checkpoint folder or a model file (with ``meta["config"]`` when known)."""
    return model_from_checkpoint(src, keep) if Path(src).expanduser().is_dir() else load(src)


def _unique(paths) -> list[Path]:
    out = []
    for p in paths:
        if p not in out:
            out.append(p)
    return out


def resolve_data_paths(cfg: dict, meta: dict, base: Path, *, root_given: bool = False,
                       dataset_given: bool = False) -> dict:
    """``cfg`` (the training run's data fields) with its ``root`` and a ``dataset`` file path replaced by places
    that exist here: the absolute path the run recorded (``meta["data_paths"]``,
    :func:`gnnpipe.core.run.checkpoint.data_paths`), else a relative path resolved against ``base`` (the folder
    holding the model file or the checkpoint folder), then against the current directory. Values the user gave
    (``root_given``, ``dataset_given``: ``--root``, ``--dataset``) are left as given (relative to the current
    directory).

    Raises:
        ConfigError: the run's root folder or dataset file is in none of those places (the message names each).
    """
    cfg = dict(cfg)
    recorded = meta.get("data_paths") or {}
    ds, root = cfg.get("dataset"), cfg.get("root")

    def places(value, recorded_value):
        p = Path(value).expanduser()
        return _unique(([Path(recorded_value)] if recorded_value else [])
                       + ([p] if p.is_absolute() else [base / p, Path.cwd() / p]))

    roots = places(root, recorded.get("root")) if root is not None and not root_given else []
    if isinstance(ds, str) and ds.lower().endswith(DATASET_FILE_SUFFIXES):
        if dataset_given:
            return cfg
        looked = places(ds, recorded.get("dataset"))
        if not Path(ds).expanduser().is_absolute():
            looked = _unique(looked + [r / ds for r in roots])
        found = next((p for p in looked if p.is_file()), None)
        if found is not None:
            cfg["dataset"] = str(found)
            return cfg
        if root_given:  # gnnpipe.data.load_dataset also looks under the --root given
            return cfg
        raise ConfigError(f"the dataset file {ds!r} of the model's training run is in none of the places looked at "
                          f"({', '.join(map(str, looked))}); give --dataset FILE")
    if roots and ds is not None and str(ds).strip().lower() != "synthetic":
        found = next((p for p in roots if p.is_dir()), None)
        if found is None:
            raise ConfigError(f"the data root {root!r} of the model's training run is in none of the places looked "
                              f"at ({', '.join(map(str, roots))}); give --root (the folder holding {ds})")
        cfg["root"] = str(found)
    return cfg


def run(args: argparse.Namespace) -> int:
    src = Path(args.model).expanduser()
    model = load_model(args.model, args.keep or "best")
    meta = dict(getattr(model, "meta", None) or {})
    if args.keep is not None and not src.is_dir() and meta.get("weights") != args.keep:
        held = f"the {meta['weights']} weights of its run" if meta.get("weights") else "the weights it was saved with"
        warnings.warn(f"--keep {args.keep} has no effect on a model file: {args.model} holds one set of weights only "
                      f"({held}); predict from the checkpoint folder to choose, or export it again with "
                      f"--keep {args.keep}", stacklevel=2)
    trained = dict(meta.get("config") or {})
    if (meta.get("task_meta") or {}).get("task") == "s2ef":
        return _predict_s2ef(args, model, trained, meta, src)
    if meta.get("data_given") and args.dataset is None:
        raise ConfigError(f"{args.model} was trained on a graph passed from Python (api.train(data=...)), which it "
                          "does not record; give that graph as a file: --dataset FILE (.pt or .npz; --root DIR)")
    fields = attrs.fields_dict(TrainConfig)
    cfg = {k: v for k, v in trained.items() if k in fields}
    base = Path(meta["checkpoint"]).resolve().parent.parent if src.is_dir() and meta.get("checkpoint") \
        else src.resolve().parent  # the folder holding the checkpoint folder / the model file
    for k in ("dataset", "root", "split"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if args.dataset is not None and args.dataset != trained.get("dataset") and args.root is None:
        cfg["root"] = None
    cfg = resolve_data_paths(cfg, meta, base, root_given=args.root is not None, dataset_given=args.dataset is not None)
    data = load_data(TrainConfig(**cfg))
    scores = model.predict(data)
    pred = scores.argmax(-1)
    print(f"{'mask':<6} {'vertices':>9} {'accuracy':>9}")
    for split in ("train", "val", "test"):
        m = getattr(data, f"{split}_mask", None)
        n = int(m.sum()) if m is not None else 0
        acc = float((pred[m] == data.y[m]).double().mean()) if n else math.nan
        print(f"{split:<6} {n:>9,} {'n/a' if math.isnan(acc) else f'{100 * acc:.2f} %':>9}")
    if args.out:
        Path(args.out).expanduser().parent.mkdir(parents=True, exist_ok=True)
        torch.save({"scores": scores.detach().cpu(), "pred": pred.cpu()}, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _predict_s2ef(args, model, trained: dict, meta: dict, src: Path) -> int:
    """``gnnpipe predict`` of an S2EF model (see the module docstring)."""
    fields = attrs.fields_dict(TrainConfig)
    cfg = {k: v for k, v in trained.items() if k in fields}
    if args.dataset is not None:
        cfg.update(dataset=args.dataset, root=args.root)
        if not is_structure_dataset(cfg["dataset"]):
            raise ConfigError(f"--dataset {args.dataset!r} is not a structure file or folder (.extxyz, .xyz, .traj, "
                              f".db, .aselmdb, .lmdb) or a generated set (oc20-like, md17-like, bulk-like)")
        structures = load_structures(TrainConfig(**cfg), labelled=False)
        groups = {"all": torch.arange(len(structures))}
    else:
        if meta.get("data_given"):
            raise ConfigError(f"{args.model} was trained on structures passed from Python, which it does not record; "
                              "give them as a file: --dataset FILE.extxyz")
        base = Path(meta["checkpoint"]).resolve().parent.parent if src.is_dir() and meta.get("checkpoint") \
            else src.resolve().parent
        cfg = resolve_data_paths(cfg, meta, base)
        data = S2EF().load(TrainConfig(**cfg))
        structures, groups = data.structures, data.splits
    source = f"{Path(args.dataset).name}: structure" if args.dataset is not None else "structure"
    energy, forces = predict_structures(model, structures, unseen_elements=args.unseen_elements, source=source)
    labelled = all(has_label(d, "energy") and has_label(d, "forces") for d in structures)
    print(f"{'split':<6} {'structures':>10} {'E-MAE eV':>10} {'meV/atom':>9} {'F-MAE eV/Å':>11}")
    for name, ids in groups.items():
        ids = ids.tolist()
        if not labelled or not ids:
            print(f"{name:<6} {len(ids):>10,} {'n/a':>10} {'n/a':>9} {'n/a':>11}")
            continue
        de = [abs(float(energy[i]) - float(structures[i].energy.reshape(-1)[0])) for i in ids]
        pa = [d / int(structures[i].z.numel()) for d, i in zip(de, ids)]
        ferr = torch.cat([(forces[i] - structures[i].forces.double())[~structures[i].fixed].abs().reshape(-1)
                          for i in ids])
        print(f"{name:<6} {len(ids):>10,} {sum(de) / len(de):>10.4f} {1000 * sum(pa) / len(pa):>9.2f} "
              f"{float(ferr.mean()) if ferr.numel() else math.nan:>11.4f}")
    if args.out:
        out = Path(args.out).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix.lower() in (".extxyz", ".xyz"):
            import ase.io

            frames = []
            for i, d in enumerate(structures):
                a = to_atoms(d)
                a.calc = SinglePointCalculator(a, energy=float(energy[i]), forces=forces[i].numpy())
                frames.append(a)
            ase.io.write(str(out), frames, format="extxyz")
        elif out.suffix.lower() == ".npz":
            write_npz(out, structure_ids(_structure_path(cfg), len(structures)), energy, forces, structures,
                      atoms=args.npz_atoms, dtype=args.npz_dtype)
        else:
            torch.save({"energy": energy, "forces": forces}, out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def write_npz(path, ids, energy, forces, structures, *, atoms: str = "free", dtype: str = "float32") -> None:
    """Write predictions in fairchem's S2EF layout (the module docstring): ``ids``, ``energy``, ``forces`` of the
    free atoms (``atoms="all"``: of every atom) concatenated, ``chunk_idx`` (``np.cumsum(counts)[:-1]``) and
    ``natoms``, compressed as fairchem writes it (``np.savez_compressed``)."""
    rows, natoms = [], []
    for d, f in zip(structures, forces):
        f = f.detach().double().cpu().numpy().reshape(-1, 3)
        fixed = getattr(d, "fixed", None)
        if atoms == "free" and fixed is not None:
            f = f[~fixed.bool().cpu().numpy()]
        rows.append(f)
        natoms.append(int(d.z.numel()))
    counts = np.array([len(r) for r in rows], dtype=np.int64)
    with open(path, "wb") as fh:  # a handle: numpy would append ".npz" to a name ending otherwise (".NPZ")
        np.savez_compressed(fh, ids=np.array([str(i) for i in ids]),
                            energy=np.asarray(energy.detach().double().cpu().numpy(), dtype=dtype).reshape(-1),
                            forces=(np.concatenate(rows) if rows else np.zeros((0, 3))).astype(dtype),
                            chunk_idx=np.cumsum(counts)[:-1], natoms=np.array(natoms, dtype=np.int64))


def _structure_path(cfg: dict) -> str:
    """The structure file or folder a prediction read (``cfg``: the run's data fields, ``--dataset`` / ``--root``
    applied), or ``""`` for a generated set (its structures are then named by index)."""
    try:
        return str(dataset_path(TrainConfig(**cfg), "the structures"))
    except (ConfigError, TypeError, ValueError):
        return ""
