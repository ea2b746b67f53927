"""Studies: grids of ``gnnpipe train`` runs (ablations), their results files, reports and schedule simulations.

* ``gnnpipe.experiments.grid`` — the study (TOML grid) format, expansion into runs with stable ids;
* ``gnnpipe.experiments.runner`` — run a study as ``gnnpipe train`` subprocesses, resumable;
* ``gnnpipe.experiments.results`` — the JSON Lines results file;
* ``gnnpipe.experiments.report`` — markdown table and PNG plots over variants;
* ``gnnpipe.experiments.simulate`` — simulate-only studies (schedule simulator, no training).

Command line: ``gnnpipe ablate STUDY.toml`` (``--simulate``, ``--list``) and ``gnnpipe report RESULTS``.
"""

from .grid import Run, Study, load_study, parse_study
from .report import make_report
from .results import default_results_path, read_records
from .runner import Outcome, run_study
from .simulate import simulate_study

__all__ = ["Run", "Study", "load_study", "parse_study", "run_study", "Outcome", "make_report",
           "default_results_path", "read_records", "simulate_study"]
