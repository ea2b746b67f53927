"""Pictures of a timed run: a chrome-trace JSON and a PNG timeline (matplotlib).

:func:`to_chrome_trace` and :func:`plot_timeline` draw a :class:`~gnnpipe.schedulers.SimulationResult`,
or a schedule that they simulate with unit costs first.
"""

from __future__ import annotations

import json
import os

from ..errors import ConfigError
from .ir import ActionKind, Schedule
from .simulate import SimulationResult, simulate


def _as_result(obj) -> SimulationResult:
    if isinstance(obj, SimulationResult):
        return obj
    if isinstance(obj, Schedule):
        return simulate(obj)
    raise ConfigError(f"expected a Schedule or a SimulationResult, got {type(obj).__name__}")


def to_chrome_trace(obj, path: str | os.PathLike | None = None, *, time_scale: float = 1000.0) -> dict:
    """Chrome-trace (``chrome://tracing`` / Perfetto) events of a timed run.

    One process "stages" with a thread per stage (compute), one process "links" with a thread per
    directed link (sends). Event names are the action strings (``"2F0"``).

    Args:
        obj: a :class:`~gnnpipe.schedulers.SimulationResult`, or a :class:`Schedule` (simulated with
            unit costs).
        path: if given, the JSON is written there too.
        time_scale: microseconds per simulation time unit (default 1000: one unit shows as 1 ms).

    Returns: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
    """
    res = _as_result(obj)
    sch = res.schedule
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{sch.name}: stages"}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "links"}},
    ]
    for s in range(sch.num_stages):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": f"stage {s}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": s, "args": {"sort_index": s}})
    for row in res.intervals:
        for iv in row:
            a = iv.action
            events.append({
                "name": str(a), "cat": a.kind.name, "ph": "X", "pid": 0, "tid": iv.stage,
                "ts": iv.start * time_scale, "dur": (iv.end - iv.start) * time_scale,
                "args": {"stage": a.stage, "kind": a.kind.name, "chunk": a.chunk, "epoch": a.epoch,
                         "slot": iv.slot},
            })
    links = sorted({(tr.src, tr.dst) for tr in res.transfers})
    for i, (u, v) in enumerate(links):
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": f"{u}->{v}"}})
    lid = {l: i for i, l in enumerate(links)}
    for tr in res.transfers:
        events.append({
            "name": f"send {tr.action}", "cat": "comm", "ph": "X", "pid": 1, "tid": lid[(tr.src, tr.dst)],
            "ts": tr.start * time_scale, "dur": (tr.end - tr.start) * time_scale,
            "args": {"src": tr.src, "dst": tr.dst, "chunk": tr.action.chunk, "epoch": tr.action.epoch},
        })
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schedule": sch.name, "num_stages": sch.num_stages, "num_chunks": sch.num_chunks,
                      "epochs": sch.epochs, "makespan": res.makespan,
                      "bubble_fraction": list(res.bubble_fraction)},
    }
    if path is not None:
        with open(path, "w") as fh:
            json.dump(trace, fh)
    return trace


_COLORS = {ActionKind.F: ("#4C72B0", "#8FA9D6"), ActionKind.B: ("#DD8452", "#EDB795"),
           ActionKind.STEP: ("#55A868", "#55A868"), ActionKind.G: ("#8172B3", "#B3A9D6"),
           ActionKind.D: ("#C44E52", "#DC9497")}


def plot_timeline(obj, path: str | os.PathLike | None = None, *, ax=None, title: str | None = None,
                  show_comm: bool = True, dpi: int = 150):
    """Draw a timed run as a Gantt chart: one lane per stage (stage 0 on top), forwards blue,
    backwards orange, optimizer steps green (a thin tick when they cost nothing), sends as thin grey
    bars under the sender's lane; every bar is labelled with its chunk id, and odd epochs are drawn
    lighter.

    Args:
        obj: a :class:`~gnnpipe.schedulers.SimulationResult` or a :class:`Schedule` (unit costs).
        path: write a PNG (or any format matplotlib knows from the suffix) there; a figure made here
            is then closed in pyplot (the returned object can still be saved again).
        ax: draw into this matplotlib axes instead of a new figure.

    Returns: the matplotlib ``Figure``.

    Raises:
        ConfigError: matplotlib is not installed (install the ``plot`` extra: ``pip install 'gnnpipe[plot]'``).
    """
    try:
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "plot_timeline needs matplotlib; install the 'plot' extra: pip install 'gnnpipe[plot]'"
        ) from exc

    res = _as_result(obj)
    sch = res.schedule
    S = sch.num_stages
    span = res.makespan if res.makespan > 0 else 1.0
    own_fig = ax is None
    if own_fig:
        width = min(24.0, max(8.0, 0.35 * sum(len(r) for r in res.intervals) / max(S, 1) + 3))
        fig, ax = plt.subplots(figsize=(width, 1.0 + 0.7 * S), dpi=dpi)
    else:
        fig = ax.figure
    tick = span / 400.0
    for s, row in enumerate(res.intervals):
        y = S - 1 - s
        for iv in row:
            a = iv.action
            w = iv.end - iv.start
            color = _COLORS[a.kind][a.epoch % 2]
            if a.kind is ActionKind.STEP:
                if w < 3 * tick:  # a free (or nearly free) step: a bold line on top of the bars
                    ax.plot([iv.start + w / 2] * 2, [y - 0.47, y + 0.47], color=color, lw=3.5, zorder=4,
                            solid_capstyle="butt")
                else:
                    ax.add_patch(plt.Rectangle((iv.start, y - 0.4), w, 0.8, color=color, lw=0, zorder=3))
                continue
            ax.add_patch(plt.Rectangle((iv.start, y - 0.35), w, 0.7, facecolor=color,
                                       edgecolor="white", lw=0.8))
            label = str(a.chunk)
            fs = 8 if w >= span / 60 else 6
            if w >= span / 150:
                ax.text(iv.start + w / 2, y, label, ha="center", va="center", fontsize=fs, color="white",
                        fontweight="bold", clip_on=True)
    if show_comm:
        for tr in res.transfers:
            y = S - 1 - tr.src
            ax.add_patch(plt.Rectangle((tr.start, y - 0.48), tr.end - tr.start, 0.1, color="#999999", lw=0))
    ax.set_xlim(0, span * 1.005 + 2 * tick)
    ax.set_ylim(-0.6, S - 0.4)
    ax.set_yticks(range(S))
    ax.set_yticklabels([f"stage {S - 1 - i}" for i in range(S)])
    ax.set_xlabel("time (cost units)")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=float(span).is_integer()))
    for x in range(1, int(span) + 1) if span <= 200 and float(span).is_integer() else []:
        ax.axvline(x, color="#eeeeee", lw=0.5, zorder=0)
    bub = sum(res.bubble_fraction) / S
    ax.set_title(title or f"{sch.name}: {S} stages, {sch.num_chunks} chunks"
                 + (f", {sch.epochs} epochs" if sch.epochs > 1 else "")
                 + f" — makespan {res.makespan:g}, mean bubble {bub:.1%}")
    handles = [Patch(color=_COLORS[ActionKind.F][0], label="forward"),
               Patch(color=_COLORS[ActionKind.B][0], label="backward"),
               Patch(color=_COLORS[ActionKind.STEP][0], label="optimizer step")]
    if sch.second_order:
        handles[2:2] = [Patch(color=_COLORS[ActionKind.G][0], label="force pass G"),
                        Patch(color=_COLORS[ActionKind.D][0], label="second-order pass D")]
    if sch.epochs > 1:
        handles.append(Patch(color=_COLORS[ActionKind.F][1], label="(lighter: odd epochs)"))
    if show_comm and res.transfers:
        handles.append(Patch(color="#999999", label="send"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18 if S > 2 else -0.3),
              ncol=len(handles), frameon=False, fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path)
        if own_fig:
            plt.close(fig)  # saved; do not keep it in pyplot's figure list
    return fig
