"""Energies and forces of structures by a trained S2EF model (a training result's model, or a model file written by
``gnnpipe export`` / :func:`gnnpipe.models.save`): what ``gnnpipe predict`` and the ASE calculator use.

The model's ``meta["task_meta"]`` (written by training) carries what the model needs besides its weights: the
energy reference and normalisation (:class:`~.normalizer.EnergyNormalizer`), the graph's cutoff and neighbour cap.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from ase.data import chemical_symbols
from torch import Tensor
from torch_geometric.data import Batch

from ...costmodel.hardware import available_memory_bytes
from ...data.atoms.estimate import check_graph_size
from ...data.atoms.sets import FORMATS, AseDbSet, ExtxyzSet, FairchemLmdbSet, _Record, _Unpickler, format_of
from ...data.atoms.validate import check_max_z
from ...data.validation import DataWarning
from ...errors import ConfigError, DataValidationError
from .build import graph_builder
from .data import prepare_structures
from .normalizer import EnergyNormalizer


def task_meta(model) -> dict:
    """The S2EF ``task_meta`` of a trained model.

    Raises:
        ConfigError: the model was not trained for S2EF (no energy normalisation recorded).
    """
    meta = (getattr(model, "meta", None) or {}).get("task_meta") or {}
    if meta.get("task") != "s2ef":
        raise ConfigError("this model was not trained on energies and forces (its file records no S2EF "
                          "normalisation); train one with gnnpipe train --model schnet|dimenet++|gemnet-t and "
                          "export it")
    return meta


#: what :func:`predict_structures` does with elements the model was not trained on (``unseen_elements``)
UNSEEN_ELEMENTS = ("warn", "error", "ignore")


def check_elements(model, structures: Sequence, unseen_elements: str = "warn", source: str = "structure") -> None:
    """Check ``structures`` against what ``model`` can read: atomic numbers beyond its embedding (``max_z``) are
    refused; elements absent from its training split (its file records them:
    ``task_meta["normalizer"]["elements"]``) are warned about once, naming them, or refused with
    ``unseen_elements="error"`` (``"ignore"``: neither). A model file written before the elements were recorded
    carries no record: nothing can be said of them.

    Raises:
        DataValidationError: an atomic number beyond ``max_z``; an unseen element with ``"error"``.
        ConfigError: an unknown ``unseen_elements``.
    """
    if unseen_elements not in UNSEEN_ELEMENTS:
        raise ConfigError(f"unseen_elements must be one of {', '.join(UNSEEN_ELEMENTS)}, got {unseen_elements!r}")
    max_z = getattr(model, "max_z", None)
    if max_z is not None:
        check_max_z(structures, max_z, source=source)
    seen = (task_meta(model).get("normalizer") or {}).get("elements")
    if seen is None or unseen_elements == "ignore":
        return
    seen = {int(z) for z in seen}
    where: dict[int, list[int]] = {}
    for k, d in enumerate(structures):
        for z in set(d.z.tolist()) - seen:
            where.setdefault(int(z), []).append(k)
    if not where:
        return
    names = ", ".join(f"{chemical_symbols[z] if z < len(chemical_symbols) else z} (Z = {z}; {len(where[z])} "
                      f"structure{'s' if len(where[z]) != 1 else ''}, first {where[z][0]})" for z in sorted(where))
    trained = ", ".join(chemical_symbols[z] if z < len(chemical_symbols) else str(z) for z in sorted(seen))
    its = "its" if len(where) == 1 else "their"
    text = (f"the model was not trained on {names}: {its} energy reference was never fitted and {its} embedding "
            f"never trained, so predictions for these structures are not meaningful (trained on {trained})")
    if unseen_elements == "error":
        raise DataValidationError(text + "; remove them, or train on data that has these elements")
    warnings.warn(text, DataWarning, stacklevel=4)  # the caller of predict_structures (through torch.no_grad)


@torch.no_grad()
def resolve_device(device) -> torch.device:
    """``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``) checked: a clear error instead of torch's
    at the first calculation.

    Raises:
        ConfigError: a device torch does not know; a CUDA device where no CUDA GPU (or not that many) is visible.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {str(device)!r} but no CUDA GPU is visible here; use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device {str(device)!r} but {torch.cuda.device_count()} CUDA GPU(s) are visible")
    return device


def predict_structures(model, structures: Sequence, batch_size: int = 16, *, unseen_elements: str = "warn",
                       source: str = "structure", stress: bool = False) -> tuple:
    """Energies and forces (and, with ``stress``, stresses) of ``structures`` (PyG ``Data`` as
    :func:`gnnpipe.data.atoms.from_atoms` makes, labels not needed).

    Before any graph is built: atomic numbers beyond the model's ``max_z`` are refused, elements the model was not
    trained on warned about once per call, naming them (``unseen_elements="error"``: refused; ``"ignore"``: not
    checked; :func:`check_elements`), and a cutoff whose graph cannot be built here refused (a large one warned
    about; :func:`gnnpipe.data.atoms.estimate.check_graph_size`). ``source`` names the structures in messages
    (``"FILE: structure"``). The model runs where its parameters are (CPU or a GPU); the results come back on the
    CPU.

    Returns:
        ``(energy [S] float64 eV, [forces [n_s, 3] float64 eV/Å per structure])``; with ``stress`` also
        ``stress [S, 3, 3] float64 eV/Å³`` (:func:`energies_forces`).

    Raises:
        ConfigError: not an S2EF model; a graph too large to build here; ``stress`` of a direct-forces model.
        DataValidationError: a malformed structure; an atomic number beyond ``max_z``; an unseen element with
        ``unseen_elements="error"``.
    """
    meta = task_meta(model)
    norm = EnergyNormalizer.from_dict(meta["normalizer"])
    triplets = bool(getattr(model, "uses_triplets", True))
    graph_fn = graph_builder(meta["cutoff"], meta["max_neighbors"], triplets,
                             bool(getattr(model, "uses_reverse_edges", False)))
    p = next(model.parameters())
    structures = prepare_structures(structures, p.dtype, labelled=False)
    check_elements(model, structures, unseen_elements, source)
    check_graph_size(structures, meta["cutoff"], meta["max_neighbors"], with_triplets=triplets,
                     available=available_memory_bytes(),
                     batch_size=min(batch_size, max(len(structures), 1)), what="the model's cutoff", source=source,
                     when="for each batch predicted",
                     fix="predict smaller structures, or use a model trained with a cutoff of about {cutoff} Å or "
                         "less")
    model.eval()
    energies, forces, stresses = [], [], []
    # the forces need ∂E/∂pos only: parameters that do not require grad spare the backward their weight gradients
    # and the forward the tensors saved for them (as gnnpipe.relax does); given back after
    frozen = [q for q in model.parameters() if q.requires_grad]
    for q in frozen:
        q.requires_grad_(False)
    try:
        for start in range(0, len(structures), batch_size):
            batch = Batch.from_data_list(structures[start:start + batch_size]).to(p.device)
            e, f, *s = energies_forces(model, batch, graph_fn(batch), norm, stress=stress)
            energies.append(e.detach().cpu())
            stresses.extend(x.detach().cpu() for x in s)
            f, ptr = f.detach().cpu(), batch.ptr.cpu()
            forces.extend(f[ptr[i]:ptr[i + 1]] for i in range(batch.num_graphs))
    finally:
        for q in frozen:
            q.requires_grad_(True)
    energy = torch.cat(energies) if energies else torch.zeros(0, dtype=torch.float64)
    if stress:
        return energy, forces, torch.cat(stresses) if stresses else torch.zeros(0, 3, 3, dtype=torch.float64)
    return energy, forces


def energies_forces(model, batch, graph, norm: EnergyNormalizer, comm=None, *, stress: bool = False) -> tuple:
    """Energies and forces (and stresses) of one batch of prepared structures in eV, eV/Å (and eV/Å³): the model's
    outputs denormalised.

    Args:
        model: an S2EF model. batch: a PyG ``Batch`` (``z``, ``pos``, ``cell``, ``pbc``, ``batch``) in the model's
            dtype. graph: its neighbour graph (``graph_builder`` of the model's ``task_meta``).
        norm: the model's energy normalisation.
        comm: the graph-parallel hooks of this rank (:class:`~gnnpipe.tasks.s2ef.graph_parallel.GraphParallelComm`,
            ``graph`` then its ``local_graph``): energies and conservative forces come back replicated on every
            rank of the group; ``None``: one process.

        stress: also the stresses (``σ = (1/V) ∂E/∂ε``, ASE's sign; conservative models only).

    Returns:
        ``(energy [B] float64 eV, forces [N, 3] float64 eV/Å)``, the raw forces (constraints not applied); with
        ``stress`` also ``stress [B, 3, 3] float64 eV/Å³`` (NaN for a structure not periodic in 3D).

    Raises:
        ConfigError: ``stress`` of a model with direct forces.
    """
    kw = {"forces": True, "stress": True} if stress else {"forces": True}
    out = model(batch, graph, comm, **kw) if comm is not None else model(batch, graph, **kw)
    forces = out["forces"]
    if comm is not None and getattr(model, "direct_forces", False):  # a direct head gives the owned atoms' rows
        forces = comm.atoms_gather(forces)
    ref = norm.reference(batch.z, batch.batch, batch.num_graphs)
    energy = norm.denormalise(out["energy"].reshape(-1).double(), ref)
    if stress:  # the reference depends on the composition only: the strain derivative is the scaled model's
        return energy, forces.double() * norm.std, out["stress"].double() * norm.std
    return energy, forces.double() * norm.std


def _id_part(value):
    """A ``sid`` / ``fid`` value as its text (a one-element tensor or array as its item); ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, Tensor) or hasattr(value, "tolist"):
        value = value.tolist()
        while isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, list):
            return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _id_of(sid, fid, index: int) -> str:
    """fairchem's system id: ``"sid_fid"`` when both are recorded (its S2EF naming), ``"sid"``, else the index."""
    sid, fid = _id_part(sid), _id_part(fid)
    if sid is None:
        return str(index)
    return f"{sid}_{fid}" if fid is not None else sid


def _extxyz_infos(path) -> list[dict]:
    """The ``info`` of every frame of an extended XYZ file, from its comment lines only (the frames' byte offsets of
    :class:`gnnpipe.data.atoms.sets.ExtxyzSet`)."""
    from ase.io.extxyz import key_val_str_to_dict

    offsets = ExtxyzSet(path).offsets
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for begin, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            head, size = b"", 1 << 16
            while head.count(b"\n") < 2 and len(head) < end - begin:
                head = os.pread(fd, min(size, end - begin), begin)
                size *= 4
            lines = head.split(b"\n")
            comment = lines[1].decode(errors="replace") if len(lines) > 1 else ""
            try:
                out.append(key_val_str_to_dict(comment))
            except Exception:  # noqa: BLE001 - a comment that is no key=value list carries no ids
                out.append({})
    finally:
        os.close(fd)
    return out


def _file_ids(path, start: int) -> list[str]:
    """The ids of the structures of one file (indices counted from ``start``)."""
    suffix = path.suffix.lower()
    if suffix in (".extxyz", ".xyz"):
        infos = _extxyz_infos(path)
    elif suffix == ".traj":
        import ase.io

        infos = [a.info for a in ase.io.iread(str(path), format="traj")]
    elif suffix in (".db", ".aselmdb"):
        s = AseDbSet(path)
        db, infos = s._db(), []
        for i in range(len(s)):
            row_id = int(s.ids[i]) if s.ids is not None else i + 1
            row = db._get_row(row_id) if s.lmdb else db.get(id=row_id)
            data = row.data if isinstance(row.data, dict) else {}
            infos.append({**row.key_value_pairs, **data})
    else:  # a fairchem LMDB: the sid / fid fields of its pickled records
        s = FairchemLmdbSet(path)
        infos = []
        with s._env().begin() as txn:
            for i in range(len(s)):
                raw = txn.get(f"{i}".encode("ascii"))
                obj = _Unpickler(io.BytesIO(raw)).load() if raw is not None else None
                infos.append(obj.fields() if isinstance(obj, _Record) else obj if isinstance(obj, dict) else {})
    return [_id_of(info.get("sid"), info.get("fid"), start + k) for k, info in enumerate(infos)]


def structure_ids(path, count: int) -> list[str]:
    """The system id of each of the ``count`` structures of a structure file or folder, as fairchem names them in
    its prediction files: ``"sid_fid"`` where a structure records both (OC20 S2EF: ``atoms.info`` of extended XYZ
    and trajectories, a database row's key-value pairs or ``data``, a fairchem LMDB record's fields), ``"sid"``
    where it records only that, else its index in the file (a folder: in the folder, its files sorted by name).
    Whatever cannot be read as ids (another count than ``count``, a generated set) gives the indices.
    """
    index = [str(i) for i in range(count)]
    if not path:
        return index
    p = Path(str(path)).expanduser()
    if not p.exists():
        return index
    if p.is_dir():
        files = sorted(q for q in p.iterdir() if q.is_file() and format_of(q) and not q.name.endswith("-lock"))
    elif p.suffix.lower() in set(FORMATS) | {".traj"}:
        files = [p]
    else:
        return index
    ids: list[str] = []
    try:
        for f in files:
            ids += _file_ids(f, len(ids))
    except Exception:  # noqa: BLE001 - ids are a courtesy: a file that cannot be read for them keeps the indices
        return index
    return ids if len(ids) == count else index


def has_label(d, name: str) -> bool:
    """Whether structure ``d`` carries the label ``name`` (``"energy"`` or ``"forces"``): its ``has_<name>`` flag
    where it has one (a prepared structure holds zeros in place of a missing label), else whether it has the
    attribute."""
    flag = getattr(d, f"has_{name}", None)
    if flag is not None:
        return bool(flag.reshape(-1)[0])
    return getattr(d, name, None) is not None
