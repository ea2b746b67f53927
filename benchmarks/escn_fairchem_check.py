"""gnnpipe's ``escn-md`` against fairchem's own eSCN-MD: the same weights, the same neighbour lists, energies and
forces.

Run from a virtual environment that holds fairchem-core (never a gnnpipe dependency) with gnnpipe importable::

    python3 -m venv /work/venvs/fairchem && /work/venvs/fairchem/bin/pip install torch==2.13.0 fairchem-core==2.24.0
    /work/venvs/fairchem/bin/pip install -e . --no-deps && \\
        /work/venvs/fairchem/bin/pip install torch-geometric attrs pymetis
    /work/venvs/fairchem/bin/python benchmarks/escn_fairchem_check.py

For each dtype and force kind (direct: fairchem's ``Linear_Force_Head``; conservative: its ``MLP_EFS_Head``,
``F = −∂E/∂pos``) the script builds fairchem's ``eSCNMDBackbone`` (no dataset embedding, neutral structures of
unspecified spin: ``charge = 0``, ``spin = 0``) with its heads from a seed (every weight then perturbed, so that
zero-initialised ones count too), loads the state dict into gnnpipe's model with
:func:`gnnpipe.models.atomistic.escn.import_fairchem_state_dict`, and compares on

* OC20-like slabs (``gnnpipe.data.atoms.generate_oc20_like``: adsorbates on fcc(111), periodic in x and y),
* bulk cells (``ase.build.bulk``, 2×2×2 supercells, rattled; Cu fcc and NaCl rock salt),
* molecules (``ase.build.molecule``, no cell),

each structure alone, each set as one batch and all of them as one batch. It then exports gnnpipe's weights back
(:func:`~gnnpipe.models.atomistic.escn.export_fairchem_state_dict`) into a fresh fairchem model of another seed and
compares again. Printed: a table of the largest relative differences ``max |a − b| / max |b|`` (per batch; the
largest over a set's batches); the exit status is 1 when one misses its tolerance:

* float64: gnnpipe against fairchem within ``--tol64`` (default 1e-8);
* float32: gnnpipe against fairchem (both float32) is printed, but two float32 computations of forces that sum many
  cancelling edge terms differ by their rounding (1e-6 … 1e-5 here, fairchem's own float32 run differs from its
  float64 run by as much). So each float32 run is also compared with fairchem in float64 (same float32-rounded
  weights and inputs): gnnpipe's float32 result must lie within ``--tol32`` (default 1e-5) of it, or no farther
  than twice fairchem's own float32 result ("as fc32").

Same inputs in both:

* the neighbour list is gnnpipe's (``gnnpipe.data.atoms.build_graph`` with the model's cutoff and neighbour cap),
  fed to fairchem as ``edge_index`` / ``cell_offsets`` (``otf_graph=False``): both then read the same edges;
* fairchem draws a random roll angle of every edge frame on every call (``axis_angle_wigner_hybrid`` with
  ``gamma=None``); the script passes ``gamma = 0`` (deterministic frames; the results do not depend on it up to
  rounding, which the random-roll row measures);
* constants: fairchem computes its S² grid matrices (e3nn), Gaussian centres and norm weights in the default dtype
  when built; the script builds it under ``torch.set_default_dtype(torch.float64)``, so they are exact like
  gnnpipe's (float64, cast to the model's dtype when used). Built under float32 they differ from the exact values
  by float32 rounding: the ``fairchem float32 constants`` rows show what that changes (~1e-7 relative).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

CONFIG = {"lmax": 2, "mmax": 2, "sphere_channels": 16, "hidden_channels": 24, "edge_channels": 12,
          "num_distance_basis": 32, "num_layers": 2, "cutoff": 5.0, "max_neighbors": 40}


def structures(seed: int = 0) -> dict[str, list]:
    """``{set name: [ase.Atoms]}``: slabs, bulk cells, molecules."""
    from ase.build import bulk, molecule

    from gnnpipe.data.atoms.generate import generate_oc20_like

    rng = np.random.default_rng(seed)
    slabs = generate_oc20_like(3, seed=seed)
    cells = []
    for atoms in (bulk("Cu", "fcc", a=3.6) * (2, 2, 2), bulk("NaCl", "rocksalt", a=5.64) * (2, 2, 2)):
        atoms = atoms.copy()
        atoms.positions += rng.normal(0, 0.15, atoms.positions.shape)
        cells.append(atoms)
    mols = []
    for name in ("CH3CH2OH", "C6H6", "H2O"):
        atoms = molecule(name)
        atoms.positions += rng.normal(0, 0.03, atoms.positions.shape)
        mols.append(atoms)
    return {"slabs": slabs, "bulk": cells, "molecules": mols}


def _fairchem(direct: bool, seed: int, cfg: dict):
    """fairchem's backbone and heads (eval mode) and their merged state dict (HydraModel key names)."""
    from fairchem.core.models.uma.escn_md import Linear_Force_Head, MLP_EFS_Head, MLP_Energy_Head, eSCNMDBackbone

    torch.manual_seed(seed)
    backbone = eSCNMDBackbone(max_num_elements=100, sphere_channels=cfg["sphere_channels"], lmax=cfg["lmax"],
                              mmax=cfg["mmax"], otf_graph=False, max_neighbors=cfg["max_neighbors"],
                              cutoff=cfg["cutoff"], edge_channels=cfg["edge_channels"],
                              num_distance_basis=cfg["num_distance_basis"], direct_forces=direct, regress_forces=True,
                              num_layers=cfg["num_layers"], hidden_channels=cfg["hidden_channels"],
                              norm_type="rms_norm_sh", act_type="gate", ff_type="grid", use_dataset_embedding=False)
    heads = {"energy": (MLP_Energy_Head if direct else MLP_EFS_Head)(backbone)}
    if direct:
        heads["forces"] = Linear_Force_Head(backbone)
    for mod in (backbone, *heads.values()):
        mod.eval()
        with torch.no_grad():  # fairchem zero-initialises some weights (norm biases): make every one count
            for p in mod.parameters():
                p.add_(0.05 * torch.randn_like(p))
    sd = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    for name, head in heads.items():
        sd.update({f"output_heads.{name}.{k}": v for k, v in head.state_dict().items()})
    return backbone, heads, sd


def _fairchem_data(batch, graph, dtype):
    """fairchem's ``AtomicData`` of a gnnpipe batch with gnnpipe's edges."""
    from fairchem.core.datasets.atomic_data import AtomicData

    B = int(batch.num_graphs)
    counts = torch.bincount(batch.batch, minlength=B)
    nedges = torch.bincount(batch.batch[graph.edge_index[1]], minlength=B)
    data = AtomicData(pos=batch.pos.detach().clone().to(dtype), atomic_numbers=batch.z.clone(),
                      cell=batch.cell.reshape(B, 3, 3).to(dtype), pbc=batch.pbc.reshape(B, 3), natoms=counts,
                      edge_index=graph.edge_index.clone(), cell_offsets=graph.cell_offsets.to(dtype), nedges=nedges,
                      charge=torch.zeros(B, dtype=torch.long), spin=torch.zeros(B, dtype=torch.long),
                      fixed=torch.zeros(batch.num_nodes, dtype=torch.long),
                      tags=torch.zeros(batch.num_nodes, dtype=torch.long), batch=batch.batch.clone(),
                      sid=[str(k) for k in range(B)], dataset=["omat"] * B)
    return data


def _run_fairchem(backbone, heads, data, direct: bool):
    if not direct:
        data.pos.requires_grad_(True)
    emb = backbone(data)
    out = heads["energy"](data, emb)
    energy = out["energy"]["energy"] if isinstance(out["energy"], dict) else out["energy"]
    if direct:
        forces = heads["forces"](data, emb)["forces"]
    else:
        forces = out["forces"]["forces"] if isinstance(out["forces"], dict) else out["forces"]
    return energy.detach().reshape(-1), forces.detach()


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _build_fairchem(direct, seed, cfg, default_dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype)
    try:
        return _fairchem(direct, seed, cfg)
    finally:
        torch.set_default_dtype(old)


def compare(dtype, direct: bool, seed: int, cfg: dict, sets: dict, *, default_dtype=torch.float64, gamma_zero=True,
            export_round_trip=False, quick=False) -> dict[str, dict[str, float]]:
    """Per set, the largest relative differences of gnnpipe against fairchem in ``dtype`` for one force kind: each
    structure alone and each set as a batch, then every structure in one batch (``quick``: that batch only).

    Returns ``{set: {"energy", "forces"}}`` (ours against fairchem, both in ``dtype``); in float32 also
    ``"energy_ours"``, ``"forces_ours"``, ``"energy_fairchem"``, ``"forces_fairchem"``: each float32 run against
    fairchem in float64 with the same (float32-rounded) weights and inputs.

    ``default_dtype``: the default dtype fairchem's model is built under (its constants: S² grid, Gaussian centres,
    norm weights); ``gamma_zero``: fix fairchem's roll angles at 0; ``export_round_trip``: run fairchem with
    gnnpipe's exported weights (a fresh fairchem model of another seed loads them)."""
    import copy

    from fairchem.core.models.uma import escn_md

    from gnnpipe.data.atoms import from_atoms
    from gnnpipe.models import build_model
    from gnnpipe.models.atomistic.escn import export_fairchem_state_dict, import_fairchem_state_dict

    original = escn_md.axis_angle_wigner_hybrid
    if gamma_zero:
        def fixed_roll(vec, lmax, *args, **kwargs):
            kwargs["gamma"] = vec.new_zeros(vec.shape[0])
            return original(vec, lmax, *args, **kwargs)
        escn_md.axis_angle_wigner_hybrid = fixed_roll
    backbone, heads, sd = _build_fairchem(direct, seed, cfg, default_dtype)
    model = build_model("escn-md", 0, 1, num_layers=cfg["num_layers"], hidden=cfg["sphere_channels"],
                        lmax=cfg["lmax"], mmax=cfg["mmax"], sphere_channels=cfg["sphere_channels"],
                        hidden_channels=cfg["hidden_channels"], edge_channels=cfg["edge_channels"],
                        num_distance_basis=cfg["num_distance_basis"], cutoff=cfg["cutoff"],
                        max_neighbors=cfg["max_neighbors"], direct_forces=direct).to(dtype).eval()
    import_fairchem_state_dict(model, sd)
    if export_round_trip:  # our weights back into a fresh fairchem model of another seed
        backbone, heads, _ = _build_fairchem(direct, seed + 1, cfg, default_dtype)
        exported = export_fairchem_state_dict(model)
        for prefix, mod in (("backbone.", backbone), *((f"output_heads.{k}.", h) for k, h in heads.items())):
            part = {k[len(prefix):]: v for k, v in exported.items() if k.startswith(prefix)}
            missing, unexpected = mod.load_state_dict(part, strict=False)
            if unexpected or any(not (k.startswith("Jd_") or k.endswith("_embedding.W")) for k in missing):
                raise RuntimeError(f"export does not fit fairchem's {prefix}: missing {missing}, unexpected "
                                   f"{unexpected}")
    fc = (backbone.to(dtype), {k: h.to(dtype) for k, h in heads.items()})
    ref = None
    if dtype != torch.float64:  # fairchem in float64 with the same rounded weights: the reference
        ref = (copy.deepcopy(fc[0]).double(), {k: copy.deepcopy(h).double() for k, h in fc[1].items()})
    results = {}
    try:
        everything = []
        for name, atoms_list in sets.items():
            data = from_atoms(atoms_list, dtype=torch.float64)
            everything += data
            if not quick:  # each structure alone, then the set as one batch
                results[name] = _compare_groups(model, fc, ref, [[d] for d in data] + [data], dtype, direct, cfg)
        results["all, one batch"] = _compare_groups(model, fc, ref, [everything], dtype, direct, cfg)
    finally:
        escn_md.axis_angle_wigner_hybrid = original
    return results


def _compare_groups(model, fc, ref, groups, dtype, direct, cfg) -> dict[str, float]:
    """The largest relative differences over batches of the structures ``groups`` (see :func:`compare`)."""
    from torch_geometric.data import Batch, Data

    from gnnpipe.data.atoms import build_graph

    out: dict[str, float] = {}

    def worst(key, value):
        out[key] = max(out.get(key, 0.0), value)

    for group in groups:
        batch = Batch.from_data_list([Data(z=d.z, pos=d.pos.to(dtype), cell=d.cell.to(dtype), pbc=d.pbc,
                                           natoms=d.natoms) for d in group])
        graph = build_graph(batch, cfg["cutoff"], cfg["max_neighbors"], with_triplets=False)
        ours = model(batch, graph, forces=True)
        e, f = ours["energy"].detach(), ours["forces"].detach()
        e_fc, f_fc = _run_fairchem(*fc, _fairchem_data(batch, graph, dtype), direct)
        worst("energy", _rel(e, e_fc))
        worst("forces", _rel(f, f_fc))
        if ref is not None:
            e64, f64 = _run_fairchem(*ref, _fairchem_data(batch, graph, torch.float64), direct)
            worst("energy_ours", _rel(e, e64))
            worst("forces_ours", _rel(f, f64))
            worst("energy_fairchem", _rel(e_fc, e64))
            worst("forces_fairchem", _rel(f_fc, f64))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol64", type=float, default=1e-8)
    ap.add_argument("--tol32", type=float, default=1e-5)
    ap.add_argument("--lmax", type=int, default=CONFIG["lmax"])
    ap.add_argument("--mmax", type=int, default=CONFIG["mmax"])
    ap.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    ap.add_argument("--no-info", action="store_true", help="skip the informational rows")
    args = ap.parse_args(argv)
    cfg = {**CONFIG, "lmax": args.lmax, "mmax": args.mmax}
    sets = structures(args.seed)
    rows = []  # (dtype, forces, variant, set, energy, forces, float32 columns or None, ok)
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).replace("torch.", "")
        if name not in args.dtypes:
            continue
        for direct in (True, False):
            kind = "direct" if direct else "conservative"
            for variant, kw in (("imported", {}), ("exported", {"export_round_trip": True, "quick": True})):
                for s, r in compare(dtype, direct, args.seed, cfg, sets, **kw).items():
                    if dtype == torch.float64:
                        ok = "yes" if max(r["energy"], r["forces"]) <= args.tol64 else "NO"
                        rows.append((name, kind, variant, s, r["energy"], r["forces"], None, ok))
                    else:  # within tol32 of fairchem's float64 result, or no farther than fairchem's own float32 run
                        ours = max(r["energy_ours"], r["forces_ours"])
                        theirs = max(r["energy_fairchem"], r["forces_fairchem"])
                        ok = "yes" if ours <= args.tol32 else "as fc32" if ours <= 2 * theirs else "NO"
                        rows.append((name, kind, variant, s, r["energy"], r["forces"],
                                     (r["energy_ours"], r["forces_ours"], r["energy_fairchem"], r["forces_fairchem"]),
                                     ok))
    for direct in () if args.no_info else (True, False):  # informational: fairchem's float32 constants, random rolls
        kind = "direct" if direct else "conservative"
        for variant, kw in (("fairchem float32 constants", {"default_dtype": torch.float32}),
                            ("fairchem random roll", {"gamma_zero": False})):
            for s, r in compare(torch.float64, direct, args.seed, cfg, sets, quick=True, **kw).items():
                rows.append(("float64", kind, variant, s, r["energy"], r["forces"], None, "info"))
    print(f"escn-md (gnnpipe) against eSCN-MD (fairchem-core) with the same weights and edges; "
          f"{', '.join(f'{k}={v}' for k, v in cfg.items())}")
    print("max |a - b| / max |b| per batch, the largest over the set's batches (each structure alone, the set as one)")
    print(f"float64: ours vs fairchem within {args.tol64:.0e}; float32: ours vs fairchem (both float32), and each "
          f"float32 run vs fairchem in float64 (same rounded weights and inputs): ok when ours is within "
          f"{args.tol32:.0e} of it ('as fc32': no more than twice fairchem's own float32 deviation)")
    head = (f"{'dtype':8} {'forces':13} {'variant':27} {'set':15} {'E ours-fc':>10} {'F ours-fc':>10} "
            f"{'E ours-64':>10} {'F ours-64':>10} {'E fc32-64':>10} {'F fc32-64':>10}  ok")
    print(head)
    print("-" * len(head))
    failed = False
    for dt, kind, variant, s, e, f, f32, ok in rows:
        failed |= ok == "NO"
        extra = " ".join(f"{v:10.2e}" for v in f32) if f32 else " ".join(f"{'-':>10}" for _ in range(4))
        print(f"{dt:8} {kind:13} {variant:27} {s:15} {e:10.2e} {f:10.2e} {extra}  {ok}")
    print("FAILED" if failed else "all within tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
