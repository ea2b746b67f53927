"""Simulate-only studies: evaluate a grid of (scheduler, S, C, costs) with the schedule simulator.

``gnnpipe ablate STUDY.toml --simulate`` trains nothing: for each variant of the study (first seed) it
builds the schedule of ``scheduler`` for ``S = stages`` and ``C = chunks / ways`` chunks per pipeline
(``chunks`` unset: the runtime's default ``4·S``, 1 when ``S = 1``) over ``epochs`` epochs and runs
:func:`gnnpipe.schedulers.simulate` on it. Settings the schedule does not depend on (model, correctors,
…) do not change the numbers.

Cost settings come from the study's ``[simulate]`` table; a list there is varied like ``[grid]``:

=================  =======  ==================================================================
key                default  meaning
=================  =======  ==================================================================
forward            1.0      duration of one chunk's forward through one stage (time units)
backward           1.0      duration of one chunk's backward (the paper's runs: about 2× forward)
step               0.0      duration of the optimizer step
latency            0.0      time added to every boundary send (time units)
bandwidth          inf      bytes per time unit of the link between neighbouring stages
bytes_per_chunk    0.0      bytes of one chunk's boundary tensor (or its gradient)
overlap            true     sends run beside compute (false: the sender waits for its send)
epochs             3        epochs simulated (>= 2·ceil(S/C)+1 also gives the steady-state bubble)
order              "fixed"  chunk order: "fixed" or "shuffle" (seeded with the run's seed)
=================  =======  ==================================================================

Makespan is in the costs' time units; bubble is the fraction of the makespan a stage does not
compute, averaged over stages.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from .. import schedulers as gs
from ..errors import ConfigError, GnnpipeError

#: ``[simulate]`` keys with their defaults
SIM_DEFAULTS: dict[str, Any] = {
    "forward": 1.0, "backward": 1.0, "step": 0.0, "latency": 0.0, "bandwidth": math.inf,
    "bytes_per_chunk": 0.0, "overlap": True, "epochs": 3, "order": "fixed",
}


def fmt_value(v: Any) -> str:
    """Short display form of a setting's value (variant names, tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _check_one(key: str, v: Any, where: str) -> None:
    if key == "overlap":
        ok = isinstance(v, bool)
        want = "true or false"
    elif key == "order":
        ok = v in ("fixed", "shuffle")
        want = '"fixed" or "shuffle"'
    elif key == "epochs":
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
        want = "an integer >= 1"
    elif key == "bandwidth":
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        want = "a positive number (inf for free links)"
    else:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
        want = "a non-negative number"
    if not ok:
        raise ConfigError(f"{where}: [simulate] {key} must be {want}, got {v!r}")


def check_sim_settings(table: dict, where: str = "study") -> None:
    """Validate a ``[simulate]`` table (values or non-empty lists of values).

    Raises:
        ConfigError: unknown key (lists the known ones) or a bad value (names the key).
    """
    for k, v in table.items():
        if k not in SIM_DEFAULTS:
            raise ConfigError(f"{where}: unknown [simulate] key {k!r}; allowed: {', '.join(SIM_DEFAULTS)}")
        vals = v if isinstance(v, list) else [v]
        if not vals:
            raise ConfigError(f"{where}: [simulate] {k} is an empty list; give at least one value")
        for x in vals:
            _check_one(k, x, where)


@dataclass
class SimRow:
    """One simulated variant.

    Attributes:
        variant: the study variant's name plus the varied ``[simulate]`` values.
        scheduler, stages, chunks: what was simulated (``chunks`` per pipeline).
        epochs: epochs simulated. costs: the ``[simulate]`` settings used.
        makespan: total simulated time (costs' units). bubble: mean over stages of the idle fraction.
        steady_bubble: the same once the pipeline is full (the simulator's ``steady_state_bubble()``: the
            middle epochs); ``None`` when too few epochs were simulated (needs ``2·ceil(S/C) + 1``).
        peak_inflight: most chunks alive at once on any stage (activation memory, in chunks).
        error: why the simulation failed (``None`` when it ran).
    """

    variant: str
    scheduler: str
    stages: int
    chunks: int
    epochs: int
    costs: dict
    makespan: float = math.nan
    bubble: float = math.nan
    steady_bubble: float | None = None
    peak_inflight: int = 0
    error: str | None = None

    @property
    def makespan_per_epoch(self) -> float:
        return self.makespan / self.epochs


def simulate_one(scheduler: str, stages: int, chunks: int, settings: dict, seed: int = 0):
    """Build and simulate one schedule; returns :class:`gnnpipe.schedulers.SimulationResult`.

    Args:
        settings: ``[simulate]`` values (missing keys take :data:`SIM_DEFAULTS`).

    Raises:
        ConfigError, ScheduleError, UnknownComponentError: from the schedulers package.
    """
    s = {**SIM_DEFAULTS, **settings}
    sch = gs.build_schedule(scheduler, stages, chunks, order=s["order"], seed=seed, epochs=int(s["epochs"]))
    costs = gs.CostModel(forward=float(s["forward"]), backward=float(s["backward"]), step=float(s["step"]))
    comm = None
    if s["latency"] or s["bytes_per_chunk"]:
        comm = gs.CommModel(bytes_per_chunk=float(s["bytes_per_chunk"]), bandwidth=float(s["bandwidth"]),
                            latency=float(s["latency"]), overlap=bool(s["overlap"]))
    return gs.simulate(sch, costs, comm)


def simulate_study(study) -> list[SimRow]:
    """Simulate every variant of ``study`` (a :class:`~gnnpipe.experiments.grid.Study`) × every combination
    of its ``[simulate]`` lists. A variant whose schedule cannot be built or deadlocks gets ``error`` set."""

    sim = study.simulate
    vary = [k for k, v in sim.items() if isinstance(v, list)]
    fixed_sim = {k: v for k, v in sim.items() if not isinstance(v, list)}
    combos = list(itertools.product(*(sim[k] for k in vary))) if vary else [()]
    first = study.seeds[0]
    rows: list[SimRow] = []
    for run in study.runs:
        if run.seed != first:
            continue
        st = run.settings
        S = int(st.get("stages", 1))
        W = int(st.get("ways", 1))
        C_total = st.get("chunks")
        C = int(C_total) // W if C_total is not None else (4 * S if S > 1 else 1)
        sched = str(st.get("scheduler", "gpipe"))
        for combo in combos:
            settings = {**fixed_sim, **dict(zip(vary, combo))}
            label = run.variant
            if vary:
                extra = ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(vary, combo))
                label = extra if label == "fixed" else f"{label}, {extra}"
            full = {**SIM_DEFAULTS, **settings}
            row = SimRow(label, sched, S, C, int(full["epochs"]), full)
            if C < 1:
                row.error = f"{C_total} chunks over {W} ways leaves {C} per pipeline; use at least one chunk per way"
                rows.append(row)
                continue
            try:
                res = simulate_one(sched, S, C, settings, seed=run.seed)
            except GnnpipeError as exc:
                row.error = str(exc).splitlines()[0]
            else:
                row.makespan = float(res.makespan)
                row.bubble = float(res.mean_bubble)
                try:
                    sb = res.steady_state_bubble()
                    row.steady_bubble = float(sum(sb) / len(sb))
                except GnnpipeError:  # too few epochs for a steady state at this S and C
                    row.steady_bubble = None
                row.peak_inflight = int(max(res.peak_inflight))
            rows.append(row)
    return rows


def format_sim_table(rows: list[SimRow]) -> str:
    """A markdown table: variant, scheduler, S, C, makespan, per epoch, bubble, steady bubble, in-flight."""
    head = ["variant", "scheduler", "S", "C", "epochs", "makespan", "per epoch", "bubble", "steady bubble",
            "peak in-flight"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["--:"] * (len(head) - 2)) + "|"]
    for r in rows:
        if r.error:
            cells = [r.variant, r.scheduler, str(r.stages), str(r.chunks), str(r.epochs),
                     f"error: {r.error}", "", "", "", ""]
        else:
            cells = [r.variant, r.scheduler, str(r.stages), str(r.chunks), str(r.epochs), f"{r.makespan:g}",
                     f"{r.makespan_per_epoch:g}", f"{r.bubble:.1%}",
                     f"{r.steady_bubble:.1%}" if r.steady_bubble is not None else "–", str(r.peak_inflight)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
