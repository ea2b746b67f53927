"""``load_dataset``: one entry point for the real benchmarks, the synthetic graph and a user's own file.

Where a PyG dataset class exists it is used as is (its ``process()`` is the reference loader). Two
things are added around it:

* **Forgiving roots.** ``root`` may be the folder PyG expects (``.../planetoid`` for Cora), the parent
  of the family folders (``.../data``: the family sub-folder is found), or the dataset folder itself
  (``.../planetoid/Cora``). Folder names are matched case-insensitively.
* **Read-only roots.** PyG writes ``processed/`` beside ``raw/``. If that folder is not writable (no
  write permission, or no write bit at all — so that CI copies without write bits are respected even
  when running as root) the dataset is loaded through a writable cache: ``<cache_dir>/readonly/<key>/``
  holds a symlink to the read-only ``raw/`` folder and PyG's ``processed/`` next to it. ``key`` hashes
  the raw folder's real path and its files' sizes and mtimes, so a changed raw folder gets a fresh cache.
  Nothing is ever written under a root that is not writable. If the raw files are missing, a writable
  root is handed to the PyG class so that its normal download runs.

Every loader returns the canonical form (see :mod:`gnnpipe.data.preprocess`) without preprocessing:
counts are those of the PyG loader (``data.num_edges`` counts each undirected edge twice).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch_geometric.datasets as D
from torch_geometric.data import Data, download_url

from ..errors import ConfigError
from .files import read_musae_facebook, read_npz_graph, read_pt_graph
from .preprocess import canonicalize, select_masks
from .splits import random_split, split_seed
from .synthetic import synthetic_graph
from .validation import DataWarning, validate

#: the endings of a dataset name that is a graph file (read by :func:`load_dataset`) rather than a dataset name
DATASET_FILE_SUFFIXES = (".pt", ".pth", ".npz")

_PLATONOV_URL = "https://github.com/yandex-research/heterophilous-graphs/raw/main/data"


@dataclass(frozen=True)
class DatasetSpec:
    """How to find and load one named dataset.

    Attributes:
        name: canonical display name (``data.name``).
        family: family key, also the default family folder name.
        folders: family folder names looked for under a parent root.
        subdir: folder under the family root that holds ``raw/`` the way the loader expects
            (``""``: ``raw/`` directly under the family root, as for ``Actor``).
        kind: ``"pyg"`` (a PyG dataset class), ``"platonov"`` (npz, see ``gnnpipe.data.files``) or
            ``"musae"``.
        factory: for ``kind == "pyg"``, ``root -> dataset``.
        source: the paper the data comes from.
    """

    name: str
    family: str
    folders: tuple[str, ...]
    subdir: str
    kind: str
    factory: Callable[[str], Any] | None
    source: str


def _pyg(cls_name: str, *args: Any) -> Callable[[str], Any]:
    def make(root: str) -> Any:
        return getattr(D, cls_name)(root, *args)

    return make


_SHCHUR = "Shchur et al., Pitfalls of GNN Evaluation, arXiv:1811.05868"
_PLANETOID = "Yang et al., Revisiting Semi-Supervised Learning with Graph Embeddings, ICML 2016"
_G2G = "Bojchevski & Günnemann, Deep Gaussian Embedding of Graphs, ICLR 2018"
_PLATONOV = "Platonov et al., A critical look at the evaluation of GNNs under heterophily, ICLR 2023"
_GEOM = "Pei et al., Geom-GCN, ICLR 2020"

_SPECS: list[DatasetSpec] = []
_ALIASES: dict[str, str] = {}


def _add(spec: DatasetSpec, *aliases: str) -> None:
    _SPECS.append(spec)
    for a in (spec.name, *aliases):
        _ALIASES[_norm(a)] = spec.name


def _norm(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(" ", "_")


for _n in ("Cora", "CiteSeer", "PubMed"):
    _add(DatasetSpec(_n, "planetoid", ("planetoid",), _n, "pyg", _pyg("Planetoid", _n), _PLANETOID),
         f"planetoid_{_n}")
for _n in ("Computers", "Photo"):
    _add(DatasetSpec(_n, "amazon", ("amazon",), _n, "pyg", _pyg("Amazon", _n), _SHCHUR), f"amazon_{_n}")
_add(DatasetSpec("CS", "coauthor", ("coauthor",), "CS", "pyg", _pyg("Coauthor", "CS"), _SHCHUR), "coauthor_cs")
_add(DatasetSpec("Physics", "coauthor", ("coauthor",), "Physics", "pyg", _pyg("Coauthor", "Physics"), _SHCHUR),
     "coauthor_physics", "coauthor_phy")
for _n, _pyg_name, _al in (
    ("Cora_ML", "Cora_ML", ("citationfull_cora_ml",)),
    ("CiteSeer_full", "CiteSeer", ("citationfull_citeseer", "citation_full_citeseer")),
    ("DBLP", "DBLP", ("citationfull_dblp",)),
    ("Cora_full", "Cora", ("citationfull_cora", "citation_full_cora", "corafull")),
    ("PubMed_full", "PubMed", ("citationfull_pubmed", "citation_full_pubmed")),
):
    _add(DatasetSpec(_n, "citation_full", ("citation_full", "citationfull"), _pyg_name.lower(), "pyg",
                     _pyg("CitationFull", _pyg_name), _G2G), *_al)
for _n in ("Roman_empire", "Amazon_ratings", "Minesweeper", "Tolokers", "Questions"):
    _add(DatasetSpec(_n, "heterophilous", ("heterophilous", "heterophilousgraphdataset"), _n.lower(), "pyg",
                     _pyg("HeterophilousGraphDataset", _n), _PLATONOV))
for _n in ("chameleon", "squirrel", "chameleon_filtered", "squirrel_filtered"):
    _add(DatasetSpec(_n, "heterophilous", ("heterophilous",), _n, "platonov", None, _PLATONOV))
_add(DatasetSpec("Actor", "actor", ("actor", "film"), "", "pyg", _pyg("Actor"), _GEOM), "film")
for _n in ("Cornell", "Texas", "Wisconsin"):
    _add(DatasetSpec(_n, "webkb", ("webkb",), _n.lower(), "pyg", _pyg("WebKB", _n), _GEOM), f"webkb_{_n}")
_add(DatasetSpec("facebook", "musae", ("musae",), "facebook", "musae", None,
                 "Rozemberczki et al., Multi-scale Attributed Node Embedding, J. Complex Networks 2021"),
     "musae_facebook")

SYNTHETIC_NAMES = ("synthetic",)


def available_datasets() -> list[str]:
    """Canonical names accepted by :func:`load_dataset` (plus ``"synthetic"`` and ``.pt``/``.npz`` paths)."""
    return [s.name for s in _SPECS]


def dataset_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of a dataset name (case-insensitive, ``-``/space = ``_``).

    Raises:
        ConfigError: unknown name; the message lists the known ones.
    """
    canon = _ALIASES.get(_norm(name))
    if canon is None:
        lowered = str(name).lower()
        atomistic = ("; it is a structure set: train or predict with an atomistic model (--model schnet or "
                     "dimenet++, or a model file exported from one)"
                     if lowered.endswith((".xyz", ".extxyz", ".traj", ".db"))
                     or lowered in ("oc20-like", "md17-like", "bulk-like")
                     else "")
        raise ConfigError(
            f"unknown dataset {name!r}; known datasets: synthetic, {', '.join(available_datasets())} "
            f"(case-insensitive), or a path to your own .pt / .npz file{atomistic}"
        )
    return next(s for s in _SPECS if s.name == canon)


# --------------------------------------------------------------------------------------------- paths


def default_cache_dir() -> Path:
    """``$GNNPIPE_CACHE`` if set, else ``~/.cache/gnnpipe/datasets``."""
    env = os.environ.get("GNNPIPE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gnnpipe" / "datasets"


def _default_root() -> Path:
    env = os.environ.get("GNNPIPE_DATA")
    return Path(env).expanduser() if env else default_cache_dir()


def is_writable(path: str | Path) -> bool:
    """Whether files can be created in ``path`` (or, if it does not exist, in its nearest existing parent).

    A folder without any write bit counts as read-only even for root, so that read-only copies of
    shared data are respected whoever runs the code.
    """
    p = Path(path).absolute()
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    try:
        mode = p.stat().st_mode
    except OSError:
        return False
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK) and bool(mode & 0o222)


def _child(folder: Path, name: str) -> Path | None:
    """``folder/name`` matched case-insensitively, or ``None``."""
    exact = folder / name
    if exact.is_dir():
        return exact
    try:
        for entry in folder.iterdir():
            if entry.name.lower() == name.lower() and entry.is_dir():
                return entry
    except OSError:
        return None
    return None


def _locate(spec: DatasetSpec, root: Path) -> tuple[Path | None, Path | None, list[Path]]:
    """Find ``(family_root, raw_dir)`` for ``spec`` under ``root``; also return the paths looked at."""
    looked: list[Path] = []
    bases: list[Path] = [root]
    for fam in spec.folders:
        c = _child(root, fam)
        if c is not None and c not in bases:
            bases.append(c)
    if spec.subdir and root.name.lower() == spec.subdir.lower():
        bases.append(root.parent)  # root is the dataset folder itself
    for base in bases:
        ds = _child(base, spec.subdir) if spec.subdir else base
        looked.append((base / spec.subdir / "raw") if spec.subdir else base / "raw")
        if ds is None:
            continue
        raw = _child(ds, "raw")
        if raw is not None and any(raw.iterdir()):
            return base, raw, looked
    if spec.folders and _child(root, spec.folders[0]) is None:
        looked.append(root / spec.folders[0] / spec.subdir / "raw" if spec.subdir else root / spec.folders[0] / "raw")
    return None, None, looked


def _fingerprint(raw: Path) -> str:
    real = raw.resolve()
    h = hashlib.sha1(str(real).encode())
    for f in sorted(real.iterdir()):
        try:
            st = f.stat()
        except OSError:
            continue
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _lock(cache_dir: Path, key: str) -> Iterator[None]:
    """An exclusive inter-process lock (``fcntl.flock``) so that concurrent ranks process a dataset once."""
    try:
        import fcntl

        lock_dir = cache_dir / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        fh = open(lock_dir / f"{key}.lock", "w")
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def _proxy_root(spec: DatasetSpec, raw: Path, cache_dir: Path) -> Path:
    """A writable PyG root under ``cache_dir`` whose ``<subdir>/raw`` is a symlink to ``raw``."""
    if not is_writable(cache_dir):
        raise ConfigError(
            f"{raw} is read-only and the cache folder {cache_dir} is not writable; pass a writable "
            "cache_dir=... (or set $GNNPIPE_CACHE) so that PyG's processed/ files can be written there"
        )
    key = f"{spec.family}-{_norm(spec.name)}-{_fingerprint(raw)}"
    proxy = cache_dir / "readonly" / key
    ds = proxy / spec.subdir if spec.subdir else proxy
    ds.mkdir(parents=True, exist_ok=True)
    link = ds / "raw"
    target = raw.resolve()
    if link.is_symlink() and Path(os.readlink(link)) != target:
        link.unlink()
    if not link.exists():
        with contextlib.suppress(FileExistsError):
            link.symlink_to(target, target_is_directory=True)
    return proxy


def _run_pyg(spec: DatasetSpec, root: Path, raw: Path | None, looked: list[Path], cache_dir: Path) -> Data:
    assert spec.factory is not None
    try:
        with _lock(cache_dir, hashlib.sha1(f"{root.absolute()}:{spec.name}".encode()).hexdigest()[:16]):
            ds = spec.factory(str(root))
    except ConfigError:
        raise
    except Exception as e:
        where = f"raw folder {raw}" if raw is not None else "looked at " + ", ".join(map(str, looked))
        raise ConfigError(
            f"loading {spec.name} with PyG under root {root} failed ({where}): {type(e).__name__}: {e}. "
            f"Check that {raw if raw is not None else 'the raw folder under ' + str(root)} holds every file of "
            f"{spec.name} that its PyG loader downloads (the release of {spec.source}), or pass a writable root with "
            "network access so PyG can download them"
        ) from e
    return ds[0]


def _missing(spec: DatasetSpec, root: Path, looked: list[Path], why: str) -> ConfigError:
    hint = ""
    for fam in spec.folders:
        c = _child(root, fam)
        if c is not None:
            with contextlib.suppress(OSError):
                hint = f"; folders present in {c}: {', '.join(sorted(p.name for p in c.iterdir() if p.is_dir()))}"
            break
    return ConfigError(
        f"raw files of dataset {spec.name} not found: looked at {', '.join(map(str, dict.fromkeys(looked)))}"
        f"{hint}. {why}"
    )


def _load_pyg(spec: DatasetSpec, root: Path, cache_dir: Path) -> Data:
    base, raw, looked = _locate(spec, root)
    if raw is None:
        if not is_writable(root):
            raise _missing(spec, root, looked, f"{root} is not writable, so PyG cannot download them there; "
                           "pass the folder that holds them as root, or a writable root to download into")
        return _run_pyg(spec, root, None, looked, cache_dir)
    assert base is not None
    expected = (base / spec.subdir / "raw") if spec.subdir else base / "raw"
    ds_dir = expected.parent
    processed = ds_dir / "processed"
    if raw == expected and is_writable(ds_dir) and (not processed.exists() or is_writable(processed)):
        return _run_pyg(spec, base, raw, looked, cache_dir)
    return _run_pyg(spec, _proxy_root(spec, raw, cache_dir), raw, looked, cache_dir)


def _load_platonov(spec: DatasetSpec, root: Path) -> Data:
    fname = f"{spec.name}.npz"
    cands: list[Path] = []
    bases = [root] + [c for fam in spec.folders if (c := _child(root, fam)) is not None]
    for base in bases:
        ds = _child(base, spec.name)
        cands.append((ds or base / spec.name) / "raw" / fname)
    cands += [root / "raw" / fname, root / fname]
    for c in cands:
        if c.is_file():
            return read_npz_graph(c)
    if not is_writable(root):
        raise _missing(spec, root, cands, f"{root} is not writable, so the file cannot be downloaded there; "
                       "pass the folder that holds it as root")

    raw_dir = root / spec.name / "raw"
    try:
        path = download_url(f"{_PLATONOV_URL}/{fname}", str(raw_dir))
    except Exception as e:
        raise _missing(spec, root, cands,
                       f"download from {_PLATONOV_URL}/{fname} failed: {type(e).__name__}: {e}") from e
    return read_npz_graph(path)


def _load_musae(spec: DatasetSpec, root: Path) -> Data:
    _, raw, looked = _locate(spec, root)
    need = ("edges.csv", "features.json", "target.csv")
    if raw is None or not all((raw / f).is_file() for f in need):
        raise _missing(spec, root, looked if raw is None else [raw],
                       f"the MUSAE raw release ({', '.join(need)}) is needed; it is not downloaded automatically")
    return read_musae_facebook(raw)


def _finish(data: Data, name: str, split: int, seed: int, dtype: torch.dtype = torch.float32) -> Data:
    staged = select_masks(data, split, dataset=name)
    # validate the values as stored, before canonicalize's casts could hide them (a float edge_index with
    # fractions, non-integral labels); its warnings come from prepare() later, on what is trained on
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        validate(staged, require_train_mask=False, dtype=dtype)
    out = canonicalize(staged, dtype=dtype)
    if "train_mask" not in out:
        out.train_mask, out.val_mask, out.test_mask = random_split(out.y, 20, 30, seed=split_seed(seed, split))
    out.name = name
    return out


def load_dataset(
    name: str | None = None,
    root: str | os.PathLike | None = None,
    *,
    split: int = 0,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    **synthetic_kwargs: Any,
) -> Data:
    """Load a dataset by name (or a ``.pt``/``.npz`` path) in the canonical form.

    Args:
        name: ``None`` or ``"synthetic"`` (→ :func:`synthetic_graph` with ``synthetic_kwargs`` and
            ``seed``); a dataset name from :func:`available_datasets` (case-insensitive; ``-`` or a space
            may replace ``_``); or a path ending in ``.pt`` / ``.pth`` / ``.npz`` (relative paths are
            also looked up under ``root``).
        root: folder holding the dataset as PyG expects (e.g. ``../shared/data/planetoid`` for Cora),
            or its parent (``../shared/data``), or the dataset folder itself. Default ``$GNNPIPE_DATA``,
            else the cache folder (PyG downloads there).
        split: which predefined split to use where a dataset has ``k`` of them (``[N, k]`` masks:
            Actor, WebKB, heterophilous); must be 0 for a single predefined split (Planetoid). For datasets
            without a split (Amazon, Coauthor, CitationFull, facebook, files without masks, synthetic)
            it selects a different random split: seed ``seed + 1000003 * split``.
        seed: seed of the random split (and of the synthetic graph).
        cache_dir: writable folder for processed files of read-only roots (default
            :func:`default_cache_dir`).
        dtype: the floating dtype training uses: stored values are validated in it (a float64 feature
            beyond float32's range is refused for a float32 run) and ``x`` is cast to it.
        **synthetic_kwargs: passed to :func:`synthetic_graph` (``None`` values mean "default"); only
            allowed for the synthetic graph.

    Returns:
        ``Data`` with ``x`` ``[N, F]`` (dense, in ``dtype``), ``y`` int64 ``[N]``, ``edge_index`` int64
        ``[2, E]`` (as the PyG loader returns it: not yet preprocessed), ``train_mask`` / ``val_mask`` /
        ``test_mask`` bool ``[N]``, and ``name`` (str). A random split is Shchur et al. (2018): 20 train
        and 30 validation vertices per class, all other labelled vertices test.

    Raises:
        ConfigError: unknown name (lists the known ones), missing files (names the paths looked at),
            ``split`` out of range (names ``k``), ``synthetic_kwargs`` for a real dataset.
        DataValidationError: the stored graph is malformed (:func:`gnnpipe.data.validate`, checked on the
            values as stored, before any cast; a missing ``train_mask`` is allowed: the random split
            replaces it). Its warnings are left to :func:`gnnpipe.data.prepare`.
    """
    if name is None or _norm(str(name)) in SYNTHETIC_NAMES:
        kwargs = {k: v for k, v in synthetic_kwargs.items() if v is not None}
        kwargs.setdefault("seed", seed)
        data = synthetic_graph(**kwargs)
        if split:
            data.train_mask, data.val_mask, data.test_mask = random_split(
                data.y,
                kwargs.get("train_per_class", 20),
                kwargs.get("val_per_class", 30),
                seed=split_seed(kwargs["seed"], split),
            )
        return data
    if synthetic_kwargs:
        raise ConfigError(
            f"unexpected keyword argument(s) {sorted(synthetic_kwargs)} for dataset {name!r}; they are only "
            "accepted for the synthetic graph (name=None or 'synthetic')"
        )
    if split < 0:
        raise ConfigError(f"split must be >= 0, got {split}")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root_path = Path(root).expanduser() if root is not None else _default_root()

    text = os.fspath(name)
    if text.lower().endswith(DATASET_FILE_SUFFIXES):
        path = Path(text).expanduser()
        looked = [path]
        if not path.is_file() and not path.is_absolute() and root is not None:
            looked.append(root_path / path)
            path = root_path / path
        if not path.is_file():
            raise ConfigError(f"dataset file {text!r} not found (looked at {', '.join(map(str, looked))})")
        data = read_npz_graph(path) if path.suffix.lower() == ".npz" else read_pt_graph(path)
        given = getattr(data, "name", None) if "name" in data else None
        return _finish(data, given if isinstance(given, str) else path.stem, split, seed, dtype)

    spec = dataset_spec(text)
    if root is not None and not root_path.is_dir():
        raise ConfigError(
            f"root folder {os.fspath(root)!r} does not exist; check the path (the real datasets of this project lie "
            f"under ../shared/data), or create the folder (mkdir -p) to let PyG download {spec.name} into it"
        )
    if spec.kind == "pyg":
        data = _load_pyg(spec, root_path, cache)
    elif spec.kind == "platonov":
        data = _load_platonov(spec, root_path)
    else:
        data = _load_musae(spec, root_path)
    return _finish(data, spec.name, split, seed, dtype)
