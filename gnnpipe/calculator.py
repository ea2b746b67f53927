"""An ASE calculator from a trained S2EF model: relax structures with ``ase.optimize`` and run molecular dynamics
with ``ase.md`` (as SchNetPack's ``SpkCalculator`` and fairchem's ``OCPCalculator``).

>>> from ase.optimize import BFGS
>>> from gnnpipe.calculator import Calculator
>>> atoms.calc = Calculator("model.pt")          # a file written by gnnpipe export  # doctest: +SKIP
>>> BFGS(atoms).run(fmax=0.05)                                                       # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from ase.calculators.calculator import Calculator as _AseCalculator
from ase.calculators.calculator import all_changes


class Calculator(_AseCalculator):
    """``get_potential_energy`` (eV) and ``get_forces`` (eV/Å) by a trained S2EF model.

    Args:
        model: a model file (``gnnpipe export`` / :func:`gnnpipe.models.save` of a training result's model) or the
            model itself (``result.model``). The file carries the energy reference and normalisation, the
            cutoff and the neighbour cap of its training run.

    Raises:
        ConfigError: the file is not a gnnpipe model file, or its model was not trained for S2EF.
    """

    implemented_properties = ["energy", "free_energy", "forces"]

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        if isinstance(model, (str, Path)):
            from .models import load

            model = load(model)
        from .tasks.s2ef.predict import task_meta

        task_meta(model)  # refuse a node-classification model now, not at the first call
        self.model = model.eval()

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        from .data.atoms import from_atoms
        from .tasks.s2ef.predict import predict_structures

        import torch

        super().calculate(atoms, properties, system_changes)
        # positions read in float64 (ASE's), then cast to the model's dtype: no float32 rounding on the way
        energy, forces = predict_structures(self.model, from_atoms([self.atoms], dtype=torch.float64))
        e = float(energy[0])
        self.results = {"energy": e, "free_energy": e, "forces": forces[0].numpy()}
