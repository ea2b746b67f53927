"""Relaxations with a trained S2EF model and their metrics (the OC20 IS2RS and IS2RE tasks).

Public API::

    relax(model, structures, *, optimizer="fire", fmax=0.05, steps=200, device="cpu", batch_size=None,
          trajectories=False, progress=False, gp_size=1, gp_partitioner="edge-chunk", gp_mode="allgather",
          threads=None, **optimizer_options) -> RelaxResult     # gp_size > 1: graph-parallel ranks
    relax_file(model, dataset, out, **kwargs) -> RelaxResult        # read, relax, write extended XYZ
    write_trajectories(result, folder) -> list[Path]
    FIRE, LBFGS                                                    # batched optimizers (ASE's update rules)
    evaluate_is2rs(relaxed, reference, *, oracle="emt", ...) -> dict   # ADwT, FbT, AFbT, IS2RE MAE, EwT
"""

from .metrics import (
    ADWT_THRESHOLDS,
    AFBT_THRESHOLDS,
    adwt,
    afbt,
    evaluate_is2rs,
    fbt,
    get_oracle,
    mean_distances,
    oracle_max_forces,
)
from .optimizers import FIRE, LBFGS, OPTIMIZERS, BatchOptimizer
from .relaxer import RelaxResult, relax, relax_file, write_trajectories

__all__ = [
    "ADWT_THRESHOLDS",
    "AFBT_THRESHOLDS",
    "BatchOptimizer",
    "FIRE",
    "LBFGS",
    "OPTIMIZERS",
    "RelaxResult",
    "adwt",
    "afbt",
    "evaluate_is2rs",
    "fbt",
    "get_oracle",
    "mean_distances",
    "oracle_max_forces",
    "relax",
    "relax_file",
    "write_trajectories",
]
