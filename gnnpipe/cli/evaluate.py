"""``gnnpipe evaluate``: score a trained S2EF model on held-out structures, as OC20 scores its tasks (Chanussot et al.,
ACS Catal. 2021).

``--task s2ef`` (structure to energy and forces): the model's energies and forces of the structures of
``--dataset`` (any format ``gnnpipe train`` reads) against their labels — the metrics training reports, computed
by the same code (``gnnpipe.tasks.s2ef.loss.S2EFMetrics``) with the labels in the model's dtype, as training
compares them: **energy MAE** (eV), **per-atom energy MAE** (``|ΔE| / atoms``, eV/atom), **force MAE** (eV/Å, over
the force components of free atoms: ``FixAtoms`` / fairchem's ``fixed`` atoms are left out, as in training),
**force cosine** (mean over free atoms) and **EFwT** (the share of structures whose energy is within 0.02 eV and
every free atom's force components within 0.03 eV/Å); then the force MAE and cosine of the free atoms of each
element, and the metrics per structure size (atoms per structure, in up to 5 bins) where the sizes differ. Each
metric is taken over the structures that have its labels (EFwT: both): a force-only set claims no energy metric.

``--task is2re`` (initial structure to relaxed energy): the initial structures of ``--dataset`` are relaxed with the
model (the flags of ``gnnpipe relax``), and the model's energy at the end of each relaxation is scored against the
reference relaxed energy (``--reference``: the relaxed structures with their energies, same order, as for
``is2rs``): the **energy MAE** (eV) and **EwT** (the share within 0.02 eV).

``--task is2rs`` (initial structure to relaxed structure): the relaxed structures are scored against the reference
ones (definitions: gnnpipe.relax.metrics and docs/guides/relaxations.md): **ADwT** (fraction of structures whose
mean free-atom minimum-image distance to the reference is below a threshold, averaged over 0.01…0.5 Å), **FbT**
(fraction whose largest oracle force on a free atom, at the model's relaxed structure, is below 0.05 eV/Å) and
**AFbT** (FbT averaged over 0.01…0.4 eV/Å), with the IS2RE energy MAE and EwT. The oracle is any ASE calculator
(``emt``, ``lj`` or ``module:Class``).

``--out`` gets the metrics as JSON (``is2rs``: with the curves over thresholds, which ``gnnpipe report`` draws).

examples:
  gnnpipe evaluate --task s2ef model.pt --dataset test.extxyz --out s2ef.json
  gnnpipe atoms generate --kind oc20-is2rs --frames 32 --out is2rs.extxyz     # + is2rs.relaxed.extxyz
  gnnpipe evaluate --task is2re model.pt --dataset is2rs.extxyz --reference is2rs.relaxed.extxyz --out is2re.json
  gnnpipe evaluate --task is2rs model.pt --dataset is2rs.extxyz --reference is2rs.relaxed.extxyz --out is2rs.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from ase.data import chemical_symbols

from ..core.run.results import json_safe
from ..data.atoms import read_structures
from ..data.atoms.structures import stress_label
from ..errors import ConfigError, DataValidationError
from ..relax import evaluate_is2rs, get_oracle, relax
from ..relax.metrics import check_pairs, energy_metrics, structure_energies
from ..tasks.s2ef.loss import EFWT_ENERGY, EFWT_FORCE, S2EFMetrics
from ..tasks.s2ef.predict import has_label, predict_structures, resolve_device, task_meta
from .main import HelpFormatter
from .predict import load_model
from .relax import add_relax_arguments, check_relax_arguments, relax_options, summary

#: the most structure-size bins ``--task s2ef`` reports
SIZE_BINS = 5
#: structures per batch of ``--task s2ef`` without ``--batch-size``
S2EF_BATCH = 16


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="S2EF, IS2RE and IS2RS metrics of a trained S2EF model (energy / force MAE, "
                       "EFwT; relaxed-energy MAE, EwT; ADwT, FbT, AFbT)",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("model", metavar="MODEL", help="a model file (gnnpipe export) or a checkpoint folder")
    p.add_argument("--task", choices=["s2ef", "is2re", "is2rs"], required=True,
                   help="s2ef: energies and forces against the dataset's labels; is2re: relaxed energies; is2rs: "
                        "relaxed structures (with their IS2RE energy metrics)")
    p.add_argument("--dataset", required=True, help="s2ef: the labelled structures; is2re / is2rs: the initial "
                   "structures (.extxyz/.xyz, .traj, .db, .aselmdb, .lmdb, or a folder of such files)")
    p.add_argument("--reference", default=None, help="is2re / is2rs: the reference relaxed structures with "
                   "energies, same order")
    p.add_argument("--energy-key", default="energy", help="the energy label's key in the files (eV)")
    p.add_argument("--forces-key", default="forces", help="the forces label's key in the files (eV/Å)")
    p.add_argument("--unseen-elements", choices=["warn", "error", "ignore"], default="warn",
                   help="s2ef: elements absent from the model's training split: warn naming them, refuse, or say "
                        "nothing")
    p.add_argument("--oracle", default="emt", help="is2rs: ASE calculator for FbT / AFbT: emt, lj or module:Class")
    p.add_argument("--relaxed", default=None, help="is2re / is2rs: score these model-relaxed structures (a gnnpipe "
                   "relax --out) instead of relaxing here")
    p.add_argument("--save-relaxed", default=None, help="is2re / is2rs: also write the model's relaxed structures "
                   "(.extxyz)")
    p.add_argument("--out", default=None, help="write the metrics as JSON here")
    add_relax_arguments(p)  # --batch-size, --device, --threads also serve s2ef
    for action in p._actions:
        if "--batch-size" in action.option_strings:
            action.help = (f"at most this many structures per batch (default: s2ef {S2EF_BATCH}, is2re / is2rs all "
                           "at once)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.task == "s2ef":
        given = [f for f, v in (("--reference", args.reference), ("--relaxed", args.relaxed),
                                ("--save-relaxed", args.save_relaxed)) if v is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: for --task is2re / is2rs only; --task s2ef scores the labels of "
                              "--dataset")
    elif args.reference is None:
        raise ConfigError(f"--task {args.task} needs --reference: the reference relaxed structures with energies "
                          "(gnnpipe atoms generate --kind oc20-is2rs writes them beside the initial ones)")
    check_relax_arguments(args)
    if args.task == "s2ef":
        return _run_s2ef(args)
    return _run_relaxed(args)


# --------------------------------------------------------------------------------------------------------- S2EF


def _accumulate(idx: list[int], labels: dict) -> dict:
    """The S2EF metrics of the structures ``idx`` (over the labels each has; ``labels``: :func:`s2ef_metrics`'s
    arrays) by ``S2EFMetrics``: an accumulator for the energies and the forces, one for EFwT over the structures with
    both."""
    has_e, has_f = labels["has_energy"], labels["has_forces"]
    e_idx = [i for i in idx if has_e[i]]
    f_idx = [i for i in idx if has_f[i]]
    b_idx = [i for i in idx if has_e[i] and has_f[i]]
    m, both = S2EFMetrics(), S2EFMetrics()
    if e_idx:
        m.update_energy(labels["energy"][e_idx], labels["energy_target"][e_idx], labels["natoms"][e_idx])
    if f_idx:
        m.update_forces(torch.cat([labels["forces"][i] for i in f_idx]),
                        torch.cat([labels["forces_target"][i] for i in f_idx]),
                        torch.cat([labels["free"][i] for i in f_idx]))
    if b_idx:
        n = labels["natoms"][b_idx]
        both.update(labels["energy"][b_idx], labels["energy_target"][b_idx],
                    torch.cat([labels["forces"][i] for i in b_idx]),
                    torch.cat([labels["forces_target"][i] for i in b_idx]),
                    torch.cat([labels["free"][i] for i in b_idx]), n,
                    torch.repeat_interleave(torch.arange(len(b_idx)), n))
    sums = dict(zip(S2EFMetrics.FIELDS, m.totals().tolist()))
    means = m.compute()
    out = {"structures": len(idx), "energy_structures": len(e_idx), "force_structures": len(f_idx),
           "free_atoms": int(sums["n_free"])}
    if e_idx:
        out.update(energy_mae=means["energy_mae"], energy_mae_per_atom=means["energy_mae_per_atom"])
    if sums["n_free"] > 0:
        out.update(force_mae=means["force_mae"], force_cos=means["force_cos"])
    if b_idx and sums["n_free"] > 0:
        out.update(efwt=both.compute()["efwt"], efwt_structures=len(b_idx))
    return out


def _size_bins(natoms: np.ndarray) -> list[tuple[int, int]]:
    """Up to :data:`SIZE_BINS` ranges ``(lo, hi)`` of atoms per structure, inclusive: one per size when there are
    that few sizes, else split at the quantiles; ``[]`` when every structure has the same size."""
    sizes = np.unique(natoms)
    if len(sizes) < 2:
        return []
    if len(sizes) <= SIZE_BINS:
        return [(int(s), int(s)) for s in sizes]
    edges = np.unique(np.quantile(natoms, np.linspace(0, 1, SIZE_BINS + 1), method="lower").astype(int))
    bins, lo = [], int(sizes[0])
    for hi in edges[1:-1].tolist() + [int(sizes[-1])]:
        if hi >= lo:
            bins.append((lo, int(hi)))
            lo = int(hi) + 1
    return bins


def s2ef_metrics(structures, energy, forces, dtype=None, stress=None) -> dict:
    """The S2EF metrics of predicted ``energy`` (``[S]`` eV) and ``forces`` (``[n_s, 3]`` eV/Å per structure)
    against the labels of ``structures`` (PyG ``Data`` as :func:`gnnpipe.data.atoms.read_structures` gives them), by
    ``gnnpipe.tasks.s2ef.loss.S2EFMetrics`` as training computes them, each over the structures that have its
    labels (EFwT: both; force metrics over free atoms).

    Args:
        dtype: the labels are cast to it first (the model's dtype: what training compares against); ``None``:
            as given.
        stress: predicted stresses ``[S, 3, 3]`` eV/Å³ (a conservative model's), or ``None``: then also
            ``stress_structures``, ``stress_mae`` (eV/Å³, over the 9 components of the structures with a stress
            label) and ``stress_mae_gpa``, as training reports them.

    Returns:
        dict (JSON-ready): ``structures``, ``energy_structures`` / ``force_structures`` (with each label),
        ``free_atoms``, and where some structure has the labels: ``energy_mae`` (eV), ``energy_mae_per_atom``
        (eV/atom), ``force_mae`` (eV/Å), ``force_cos``, ``efwt`` (fraction) with ``efwt_structures``;
        ``per_element`` (symbol → ``free_atoms``, ``force_mae``, ``force_cos``, over the free atoms of that element
        in structures with forces), ``per_size`` (``[{"natoms": [lo, hi], …the same metrics}]``, where sizes
        differ), ``efwt_thresholds`` (eV, eV/Å).
    """
    def cast(t):
        return (t.to(dtype) if dtype is not None else t).double()

    n = len(structures)
    has_e = [has_label(d, "energy") for d in structures]
    has_f = [has_label(d, "forces") for d in structures]
    natoms = torch.tensor([int(d.z.numel()) for d in structures], dtype=torch.long)
    labels = {
        "has_energy": has_e, "has_forces": has_f, "natoms": natoms,
        "energy": torch.as_tensor(energy, dtype=torch.float64).reshape(-1),
        "energy_target": torch.tensor([float(cast(d.energy.reshape(-1))[0]) if has_e[i] else math.nan
                                       for i, d in enumerate(structures)], dtype=torch.float64),
        "forces": [torch.as_tensor(f, dtype=torch.float64).reshape(-1, 3) for f in forces],
        "forces_target": [cast(d.forces).reshape(-1, 3) if has_f[i] else None for i, d in enumerate(structures)],
        "free": [~d.fixed.bool() if getattr(d, "fixed", None) is not None
                 else torch.ones(int(d.z.numel()), dtype=torch.bool) for d in structures],
    }
    out = _accumulate(list(range(n)), labels)
    targets = [stress_label(d) for d in structures]
    s_idx = [i for i in range(n) if targets[i] is not None]
    if stress is not None and s_idx:
        m = S2EFMetrics()
        pred = torch.as_tensor(stress, dtype=torch.float64).reshape(-1, 3, 3)
        m.update_stress(pred[s_idx], torch.stack([cast(targets[i]) for i in s_idx]),
                        torch.ones(len(s_idx), dtype=torch.bool))
        r = m.compute()
        out.update(stress_structures=len(s_idx), stress_mae=r["stress_mae"], stress_mae_gpa=r["stress_mae_gpa"])
    f_idx = [i for i in range(n) if has_f[i]]
    if f_idx:
        z = torch.cat([structures[i].z.reshape(-1) for i in f_idx])
        free = torch.cat([labels["free"][i] for i in f_idx])
        pred = torch.cat([labels["forces"][i] for i in f_idx])
        target = torch.cat([labels["forces_target"][i] for i in f_idx])
        per_element = {}
        for zz in sorted(set(z[free].tolist())):
            m = S2EFMetrics()
            sel = free & (z == zz)
            m.update_forces(pred, target, sel)
            r = m.compute()
            name = chemical_symbols[zz] if 0 < zz < len(chemical_symbols) else str(zz)
            per_element[name] = {"z": int(zz), "free_atoms": int(sel.sum()), "force_mae": r["force_mae"],
                                 "force_cos": r["force_cos"]}
        out["per_element"] = per_element
    bins = _size_bins(natoms.numpy())
    if bins:
        out["per_size"] = [{"natoms": [lo, hi],
                            **_accumulate([i for i in range(n) if lo <= int(natoms[i]) <= hi], labels)}
                           for lo, hi in bins]
    out["efwt_thresholds"] = {"energy": EFWT_ENERGY, "force": EFWT_FORCE}
    return out


def _fmt(v, scale: float = 1.0, digits: int = 4) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{scale * v:.{digits}f}"


def s2ef_table(m: dict) -> str:
    """The metrics of :func:`s2ef_metrics` as text tables: the set, each element, each size bin."""
    lines = [(f"S2EF on {m['structures']:,} structures ({m['energy_structures']:,} with an energy, "
             f"{m['force_structures']:,} with forces; {m['free_atoms']:,} free atoms)")]
    rows = [("energy MAE", "energy_mae", "eV", 1.0, 4),
            ("energy MAE per atom", "energy_mae_per_atom", "meV/atom", 1000.0, 2),
            ("force MAE", "force_mae", "eV/Å", 1.0, 4),
            ("force cosine", "force_cos", "", 1.0, 4),
            ("EFwT", "efwt", "%", 100.0, 1)]
    if "stress_mae" in m:
        rows.append(("stress MAE", "stress_mae", "meV/Å³", 1000.0, 3))
    for label, key, unit, scale, digits in rows:
        if key in m:
            lines.append(f"  {label:<22} {_fmt(m[key], scale, digits):>10} {unit}")
        else:
            lines.append(f"  {label:<22} {'–':>10}   (no structure has the labels)")
    if m.get("per_element"):
        lines += ["", f"{'element':<8} {'free atoms':>10} {'F-MAE eV/Å':>11} {'F-cos':>7}"]
        for name, r in m["per_element"].items():
            lines.append(f"{name:<8} {r['free_atoms']:>10,} {_fmt(r['force_mae']):>11} {_fmt(r['force_cos']):>7}")
    if m.get("per_size"):
        lines += ["", (f"{'atoms':<9} {'structures':>10} {'E-MAE eV':>10} {'meV/atom':>9} {'F-MAE eV/Å':>11} "
                      f"{'EFwT %':>7}")]
        for r in m["per_size"]:
            lo, hi = r["natoms"]
            size = f"{lo}" if lo == hi else f"{lo}–{hi}"
            lines.append(f"{size:<9} {r['structures']:>10,} {_fmt(r.get('energy_mae')):>10} "
                         f"{_fmt(r.get('energy_mae_per_atom'), 1000.0, 2):>9} {_fmt(r.get('force_mae')):>11} "
                         f"{_fmt(r.get('efwt'), 100.0, 1):>7}")
    return "\n".join(lines)


def _run_s2ef(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    meta = task_meta(model)
    model.to(resolve_device(args.device))
    structures = read_structures(args.dataset, energy_key=args.energy_key, forces_key=args.forces_key,
                                 dtype=torch.float64)
    if not any(has_label(d, "energy") or has_label(d, "forces") for d in structures):
        raise DataValidationError(f"{args.dataset}: no structure has an energy or forces label (looked for "
                                  f"{args.energy_key!r} / {args.forces_key!r}); name them with --energy-key / "
                                  f"--forces-key, or predict without labels with gnnpipe predict")
    # the stress where the set has stress labels and the model has one (conservative forces)
    with_stress = not getattr(model, "direct_forces", False) and any(stress_label(d) is not None
                                                                      for d in structures)
    start = time.perf_counter()
    energy, forces, *stress = predict_structures(model, structures, batch_size=args.batch_size or S2EF_BATCH,
                                                 unseen_elements=args.unseen_elements,
                                                 source=f"{Path(args.dataset).name}: structure", stress=with_stress)
    seconds = time.perf_counter() - start
    dtype = next(model.parameters()).dtype
    metrics = s2ef_metrics(structures, energy, forces, dtype=dtype, stress=stress[0] if stress else None)
    print(s2ef_table(metrics))
    print(f"predicted {len(structures):,} structures in {seconds:.1f} s", file=sys.stderr)
    record = {"task": "s2ef", "model": str(args.model), "dataset": str(args.dataset),
              "model_name": (getattr(model, "spec", None) or {}).get("name"), "cutoff": meta.get("cutoff"),
              "dtype": str(dtype).replace("torch.", ""), "seconds": seconds, **metrics}
    _write(args.out, record)
    return 0


# --------------------------------------------------------------------------------------------- IS2RE and IS2RS


def _write(out, record: dict) -> None:
    if not out:
        return

    path = Path(out).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(record), indent=1))
    print(f"wrote {path}", file=sys.stderr)


def _run_relaxed(args: argparse.Namespace) -> int:
    if args.task == "is2rs":
        get_oracle(args.oracle)                     # an unknown oracle fails before any work
    model = load_model(args.model)
    meta = task_meta(model)
    keys = {"energy_key": args.energy_key, "forces_key": args.forces_key}
    initial = read_structures(args.dataset, dtype=torch.float64, **keys)
    reference = read_structures(args.reference, dtype=torch.float64, **keys)
    check_pairs(initial, reference, what="initial")
    start = time.perf_counter()
    relax_info = {}
    if args.relaxed is not None:
        relaxed = read_structures(args.relaxed, dtype=torch.float64)
    else:
        res = relax(model, initial, **relax_options(args))
        if res.interrupted:
            print("gnnpipe: interrupted while relaxing; nothing evaluated", file=sys.stderr)
            return 130
        print(summary(res, time.perf_counter() - start), file=sys.stderr)
        relaxed = res.structures
        relax_info = {"converged": int(res.converged.sum()), "steps_max": int(res.steps.max()) if len(relaxed) else 0,
                      "steps_mean": float(res.steps.double().mean()) if len(relaxed) else 0.0,
                      "seconds": time.perf_counter() - start}
        if args.save_relaxed:
            import ase.io

            ase.io.write(args.save_relaxed, res.to_atoms(), format="extxyz")
    head = {"task": args.task, "model": str(args.model), "dataset": str(args.dataset),
            "reference": str(args.reference), "model_name": (getattr(model, "spec", None) or {}).get("name"),
            "cutoff": meta.get("cutoff"), "relax": {**{k: getattr(args, k) for k in
                                                       ("optimizer", "fmax", "steps", "maxstep")}, **relax_info}}
    if args.task == "is2re":
        check_pairs(relaxed, reference)
        e_pred, e_ref = structure_energies(relaxed), structure_energies(reference)
        metrics = {"structures": len(relaxed), **energy_metrics(e_pred, e_ref), "energies": e_pred,
                   "reference_energies": e_ref}
        print(f"IS2RE on {metrics['structures']} structures (relaxed energies): "
              + (f"energy MAE {1000 * metrics['energy_mae']:.1f} meV, EwT {100 * metrics['ewt']:.1f} % "
                 f"(within {1000 * metrics['ewt_threshold']:.0f} meV)" if "energy_mae" in metrics else "none"))
        _write(args.out, {**head, **metrics})
        return 0
    metrics = evaluate_is2rs(relaxed, reference, oracle=args.oracle)
    print(f"IS2RS on {metrics['structures']} structures: ADwT {100 * metrics['adwt']:.1f} %, "
          f"FbT {100 * metrics['fbt']:.1f} %, AFbT {100 * metrics['afbt']:.1f} % ({metrics['oracle']} forces), "
          f"mean distance {metrics['mean_distance']:.3f} Å"
          + (f"; IS2RE energy MAE {1000 * metrics['energy_mae']:.1f} meV, EwT {100 * metrics['ewt']:.1f} %"
             if "energy_mae" in metrics else ""))
    _write(args.out, {**head, **metrics})
    return 0
