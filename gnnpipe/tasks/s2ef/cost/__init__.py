"""The cost model of atomistic (S2EF) jobs: bytes, memory and step time of ``S × G × D`` layouts.

Graph parallelism (Sriram et al., ICLR 2022, arXiv 2203.09697) shards one batch's edges and triplets over the
``G`` ranks of a group; ``D`` data-parallel replicas split the batch's structures; ``S`` pipeline stages split the
interaction blocks (and so the parameters and their optimizer state). The package predicts, from a
:class:`~gnnpipe.partitioners.GraphParallelPlan` and the model's sizes, what one training step costs each rank.

One idea per module:

* :mod:`.widths` — what each model declares (saved values per edge, triplet and atom; work; parameters; boundaries);
* :mod:`.bytes` — the graph-parallel collectives' bytes per step (exact);
* :mod:`.profile` — a short profile of one step (seconds, work, ``κ``; on the CPU or a GPU);
* :mod:`.layouts` — ``S × G × D`` layouts, the job and its graphs;
* :mod:`.schedule` — a pipelined step's compute from the simulated schedule;
* :mod:`.memory` — per-rank memory and the GPU check;
* :mod:`.predict` — one layout's prediction and the ranking;
* :mod:`.projection` — models and structures at sizes no machine here holds.
"""

from ....models.atomistic.cost import HookCall, UnitWidths
from .bytes import hook_calls, padded_slots, step_bytes, step_collectives
from .layouts import AtomJob, AtomLayout, enumerate_atom_layouts, job_graph, job_plan, micro_batch_sizes, stage_bounds
from .memory import (
    GPU_FLOOR_BYTES,
    AtomRankMemory,
    check_device_memory,
    format_gib,
    layout_memory,
    rank_memory,
    read_edges,
)
from .predict import (
    FALLBACK_LINK,
    AtomPrediction,
    format_atom_ranking,
    local_gpu_hardware,
    plan_atomistic,
    predict_layout,
)
from .profile import (
    DEFAULT_KAPPA,
    DEFAULT_KAPPA_D_RATIO,
    WIDTHS_VERSION,
    AtomProfile,
    PeakMeter,
    profile_step,
)
from .projection import PROJECTION_WIDTHS, oc20_sized_structures, size_for_params
from .schedule import PASS_SHARES, bubble, pipeline_compute
from .widths import (
    activation_widths,
    boundary_widths,
    conservative_forces,
    geometry_widths,
    num_parameters,
    stage_widths,
    unit_parameters,
    work_weights,
)

__all__ = [
    "activation_widths",
    "AtomJob",
    "AtomLayout",
    "AtomPrediction",
    "AtomProfile",
    "AtomRankMemory",
    "boundary_widths",
    "bubble",
    "check_device_memory",
    "conservative_forces",
    "DEFAULT_KAPPA",
    "DEFAULT_KAPPA_D_RATIO",
    "enumerate_atom_layouts",
    "FALLBACK_LINK",
    "format_atom_ranking",
    "format_gib",
    "geometry_widths",
    "GPU_FLOOR_BYTES",
    "hook_calls",
    "HookCall",
    "job_graph",
    "job_plan",
    "layout_memory",
    "local_gpu_hardware",
    "micro_batch_sizes",
    "num_parameters",
    "oc20_sized_structures",
    "padded_slots",
    "PASS_SHARES",
    "PeakMeter",
    "pipeline_compute",
    "plan_atomistic",
    "predict_layout",
    "profile_step",
    "PROJECTION_WIDTHS",
    "rank_memory",
    "read_edges",
    "size_for_params",
    "stage_bounds",
    "stage_widths",
    "step_bytes",
    "step_collectives",
    "unit_parameters",
    "UnitWidths",
    "WIDTHS_VERSION",
    "work_weights",
]
