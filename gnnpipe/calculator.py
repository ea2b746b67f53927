"""An ASE calculator from a trained S2EF model: relax structures with ``ase.optimize`` and run molecular dynamics
with ``ase.md`` (as SchNetPack's ``SpkCalculator`` and fairchem's ``OCPCalculator``).

>>> from ase.optimize import BFGS
>>> from gnnpipe.calculator import Calculator
>>> atoms.calc = Calculator("model.pt")          # a file written by gnnpipe export  # doctest: +SKIP
>>> BFGS(atoms).run(fmax=0.05)                                                       # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

import torch
from ase.calculators.calculator import Calculator as _AseCalculator
from ase.calculators.calculator import PropertyNotImplementedError, all_changes

from .core.run.checkpoint import model_from_checkpoint
from .data.atoms import from_atoms
from .data.atoms.structures import voigt_of
from .errors import ConfigError
from .models import load
from .tasks.s2ef.predict import UNSEEN_ELEMENTS, predict_structures, resolve_device, task_meta


class Calculator(_AseCalculator):
    """``get_potential_energy`` (eV), ``get_forces`` (eV/Å) and ``get_stress`` (eV/Å³, ASE's Voigt order ``xx yy zz
    yz xz xy`` and sign: ``σ = (1/V) ∂E/∂ε``) by a trained S2EF model, so ASE's optimizers relax positions, with
    ``FrechetCellFilter`` cells too, and its MD integrators (NPT included) run on it.

    The stress is the derivative of the energy under a homogeneous strain of positions and cell (Nielsen and
    Martin, *Quantum-mechanical theory of stress and force*, PRB 32, 3780 (1985)), taken by autograd through a
    symmetric strain as SchNetPack, MACE and fairchem do (:meth:`gnnpipe.models.atomistic.base.AtomisticModel.forward`);
    it is computed only when asked for, on structures periodic in all three directions. A model with direct forces has
    no stress (``implemented_properties`` lacks it).

    Args:
        model: a model file (``gnnpipe export`` / :func:`gnnpipe.models.save` of a training result's model), a
            checkpoint folder of a training run (``--checkpoint-dir``: its best weights, as ``gnnpipe relax``
            reads it) or the model itself (``result.model``). The file carries the energy reference and normalisation,
            the cutoff and the neighbour cap of its training run.
        unseen_elements: elements absent from the model's training split (its file records them): ``"warn"``
            (default: one warning naming them, the first time a structure has them), ``"error"`` (the calculation
            raises :class:`~gnnpipe.errors.DataValidationError`), ``"ignore"``. Model files written before the
            elements were recorded carry no record: nothing is said. Atomic numbers beyond the model's ``max_z``
            are always refused, and a structure whose graph at the model's cutoff cannot be built here too
            (:func:`gnnpipe.tasks.s2ef.predict.predict_structures`).
        device: where the model runs (``"cpu"``, the default; ``"cuda"``, ``"cuda:1"``); positions are sent there
            and energies and forces come back to the CPU (NumPy, as ASE expects).

    Raises:
        ConfigError: the file is not a gnnpipe model file, or its model was not trained for S2EF; an unknown
            ``unseen_elements``; a ``device`` torch does not know, or ``"cuda"`` where no CUDA GPU is visible.
        PropertyNotImplementedError: (ASE's, from ``get_stress``) a structure not periodic in 3D, or a model with
            direct forces.
    """

    implemented_properties = ["energy", "free_energy", "forces", "stress"]

    def __init__(self, model, unseen_elements: str = "warn", device="cpu", **kwargs):
        super().__init__(**kwargs)

        device = resolve_device(device)

        if unseen_elements not in UNSEEN_ELEMENTS:
            raise ConfigError(f"unseen_elements must be one of {', '.join(UNSEEN_ELEMENTS)}, got {unseen_elements!r}")
        self.unseen_elements = unseen_elements
        if isinstance(model, (str, Path)):
            if Path(model).expanduser().is_dir():  # a checkpoint folder: its best weights, as gnnpipe relax reads it
                model = model_from_checkpoint(str(model), "best")
            else:
                model = load(model)

        task_meta(model)  # refuse a node-classification model now, not at the first call
        self.model = model.to(device).eval()
        if getattr(model, "direct_forces", False):  # its forces are not −∂E/∂pos: no consistent stress
            self.implemented_properties = ["energy", "free_energy", "forces"]

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        stress = "stress" in properties
        if stress and ("stress" not in self.implemented_properties or self.atoms.cell.rank < 3
                       or not self.atoms.pbc.all()):
            why = ("its model has direct forces (train it with conservative forces for stresses)"
                   if "stress" not in self.implemented_properties else "the structure is not periodic in 3D")
            raise PropertyNotImplementedError(f"no stress: {why}")
        # positions read in float64 (ASE's), then cast to the model's dtype: no float32 rounding on the way
        energy, forces, *s = predict_structures(self.model, from_atoms([self.atoms], dtype=torch.float64),
                                                unseen_elements=self.unseen_elements, stress=stress)
        e = float(energy[0])
        self.results = {"energy": e, "free_energy": e, "forces": forces[0].numpy()}
        if stress:
            self.results["stress"] = voigt_of(s[0][0].numpy())
