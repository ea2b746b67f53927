"""Atomistic structures for S2EF training: structures as PyG data, readers, validation, splits, generated
data sets labelled by ASE's EMT calculator, and the neighbour graph with triplets.

Public API::

    from_atoms(atoms_list, *, energy_key="energy", forces_key="forces", stress_key="stress", virial_key="virial",
               dtype=float32, require_labels=False) -> list[Data]
    read_structures(path, *, energy_key="energy", forces_key="forces", index=":", dtype=float32,
                    require_labels=False, stress_key="stress", virial_key="virial") -> list[Data]
                                                                    # .xyz/.extxyz, .traj, ASE .db
    to_atoms(data) -> ase.Atoms
    stress_label(data) -> Tensor [3, 3] | None                      # eV/Å³, ASE's sign
    with_stress_slot(data, dtype=None) -> Data                      # has_stress, zero stress where unlabelled
    validate_structures(structures, dtype=float32, *, max_z=None, cutoff=None, min_distance=0.1,
                        require_labels=False) -> None               # raises DataValidationError
    split_structures(n, fractions=(0.8, 0.1, 0.1), seed=0, *, given=None) -> (train, val, test)
    generate_oc20_like(frames, seed=0, ...) -> list[ase.Atoms]; generate_md17_like(frames, seed=0, ...)
    generate_bulk_like(frames, seed=0, ...) -> list[ase.Atoms]     # strained bulk crystals, with EMT's stress
    generated_file(kind="oc20", frames=200, seed=0, *, out=None, **kwargs) -> Path   # cached extxyz
    generated_structures(kind="oc20", frames=200, seed=0, *, dtype=None, **kwargs) -> list[Data]
    build_graph(data, cutoff, max_neighbors=None, *, with_triplets=True, method="auto", keep_ties=False)
        -> AtomGraph
    concat_graphs(graphs) -> AtomGraph                              # per-structure graphs → the batch's
    split_graph(graph, sizes) -> list[AtomGraph]                    # the batch's graph → consecutive groups'
    triplets(edge_index, cell_offsets, num_nodes) -> (idx_kj, idx_ji)
    open_structures(path, *, energy_key=None, forces_key=None, stress_key=None, virial_key=None)
        -> StructureSet                                             # lazy: .extxyz/.xyz, .db,
                                                    # .aselmdb, fairchem .lmdb, or a folder of one of them
    write_structures(out, structures, *, overwrite=False) -> int    # the format of out's suffix
    PreparedSet(set, dtype, cutoff=None, skip_invalid=False)        # cast and validated when indexed
    neighbor_pairs(pos, cell, pbc, cutoff, method="ase") -> (i, j, offsets, dist)
    estimate_graph(structures, cutoff, max_neighbors=None, *, with_triplets=False, batch_size=1) -> GraphEstimate
    check_graph_size(structures, cutoff, max_neighbors=None, ..., available=None) -> GraphEstimate   # or raises
"""

from .estimate import GraphEstimate, check_graph_size, estimate_graph
from .generate import (
                       BULK_LATTICES,
                       EMT_METALS,
                       MD17_MOLECULES,
                       OC20_ADSORBATES,
                       OC20_SITES,
                       generate_bulk_like,
                       generate_md17_like,
                       generate_oc20_like,
                       generate_oc20_paths,
                       generated_file,
                       generated_structures,
)
from .graph import AtomGraph, build_graph, concat_graphs, neighbor_pairs, reverse_edges, split_graph, triplets
from .sets import FORMATS, PreparedSet, StructureSet, open_structures, read_structures, write_structures
from .structures import STRUCTURE_SUFFIXES, from_atoms, split_structures, stress_label, to_atoms, with_stress_slot
from .validate import validate_structures

__all__ = [
                       "BULK_LATTICES",
                       "EMT_METALS",
                       "FORMATS",
                       "MD17_MOLECULES",
                       "OC20_ADSORBATES",
                       "OC20_SITES",
                       "STRUCTURE_SUFFIXES",
                       "AtomGraph",
                       "GraphEstimate",
                       "PreparedSet",
                       "StructureSet",
                       "build_graph",
                       "check_graph_size",
                       "concat_graphs",
                       "estimate_graph",
                       "from_atoms",
                       "generate_bulk_like",
                       "generate_md17_like",
                       "generate_oc20_like",
                       "generate_oc20_paths",
                       "generated_file",
                       "generated_structures",
                       "neighbor_pairs",
                       "open_structures",
                       "read_structures",
                       "reverse_edges",
                       "split_graph",
                       "split_structures",
                       "stress_label",
                       "to_atoms",
                       "triplets",
                       "validate_structures",
                       "with_stress_slot",
                       "write_structures",
]
