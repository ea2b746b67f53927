"""Studies of S2EF (atomistic) runs: study files with the S2EF settings, the report's S2EF table and plots (the
force MAE against the parameter count), resume after an interruption, and the shipped atomistic study files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from gnnpipe.errors import ConfigError
from gnnpipe.experiments import Outcome, load_study, parse_study, run_study
from gnnpipe.experiments.report import collect, make_report, steps_per_epoch

from .helpers import fake_s2ef_result

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"

SCALING = """
name = "scaling"
seeds = [0, 1]
[fixed]
model = "dimenet++"
frames = 12
epochs = 1
batch_size = 4
[[variants]]
name = "small"
layers = 1
hidden = 8
model_args = { int_emb_size = 4, out_emb_channels = 8 }
[[variants]]
name = "large"
layers = 2
hidden = 32
model_args = { int_emb_size = 16, out_emb_channels = 32 }
[[variants]]
name = "G2"
layers = 1
hidden = 8
gp_size = 2
model_args = { int_emb_size = 4, out_emb_channels = 8 }
[report]
x = "params"
y = "force_mae"
"""

PARAMS = {"small": 3_000, "large": 42_000, "G2": 3_000}


class FakeS2EF:
    """An S2EF run's result without training (larger models: lower force MAE); KeyboardInterrupt at call
    ``stop_at``."""

    def __init__(self, stop_at=None):
        self.calls, self.stop_at = [], stop_at

    def __call__(self, run):
        if self.stop_at is not None and len(self.calls) == self.stop_at:
            raise KeyboardInterrupt
        self.calls.append(run.run_id)
        name = run.variant
        ranks = 2 if run.settings.get("graph_parallel_group_size", 1) == 2 else 1
        return Outcome("ok", None, fake_s2ef_result(run.seed, params=PARAMS[name], ranks=ranks,
                                                    force_mae=0.4 if name != "large" else 0.3,
                                                    gp_bytes=5_000_000 if ranks == 2 else 0))


def test_s2ef_study_file_maps_the_atomistic_flags():
    st = parse_study(tomllib.loads(SCALING), None)
    assert len(st.runs) == 6 and st.report == {"x": "params", "y": "force_mae"}
    g2 = next(r for r in st.runs if r.variant == "G2")
    assert g2.settings["graph_parallel_group_size"] == 2  # gp_size: the --gp-size flag's setting
    assert ["--gp-size", "2"] == g2.argv[g2.argv.index("--gp-size"):][:2]
    assert "--model-arg" in g2.argv and "int_emb_size=4" in g2.argv
    with pytest.raises(ConfigError, match=r"\[report\] y must be one of"):
        parse_study(tomllib.loads(SCALING.replace('y = "force_mae"', 'y = "force"')), None)
    with pytest.raises(ConfigError, match=r"\[report\] has no key 'logx'"):
        parse_study(tomllib.loads(SCALING + "logx = true\n"), None)


def test_s2ef_study_interrupted_resumes_and_reports(tmp_path):
    st = parse_study(tomllib.loads(SCALING), None)
    res = tmp_path / "scaling.results.jsonl"
    first = FakeS2EF(stop_at=2)
    p1 = run_study(st, res, execute=first, progress=False, log=lambda m: None)
    assert p1.interrupted and p1.ran == 2
    second = FakeS2EF()
    p2 = run_study(st, res, execute=second, progress=False, log=lambda m: None)
    assert p2.skipped == 2 and p2.ran == 4 and not set(first.calls) & set(second.calls)
    recs = [json.loads(x) for x in res.read_text().splitlines()]
    assert sorted(r["run_id"] for r in recs) == sorted(r.run_id for r in st.runs)  # each run exactly once

    rep = make_report(res, tmp_path / "rep", order=st.variant_names(), sweep=st.report)
    md = rep.markdown
    for col in ("params", "energy MAE (meV)", "force MAE (eV/Å)", "force cos", "EFwT (%)", "best epoch",
                "step time (ms)", "gp MB/epoch", "peak mem per rank (MiB)"):
        assert col in md, col
    assert "test acc" not in md
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in md.splitlines()
            if ln.startswith("| ") and not ln.startswith("| variant")}
    assert rows["G2"][-1] == "300 / 310" and rows["small"][-1] == "300"  # every rank's peak, in rank order
    assert rows["large"][1] == "42,000" and rows["G2"][7] == "100.0"  # 400 ms over 4 steps (16 / batch 4)
    names = sorted(p.name for p in rep.plots)
    assert names == ["bytes.png", "sweep.png", "time.png", "val_force_mae.png"]
    for p in rep.plots:
        assert p.read_bytes()[:4] == b"\x89PNG"
    large = next(v for v in rep.variants if v.name == "large")
    small = next(v for v in rep.variants if v.name == "small")
    assert max(large.f_mae) < min(small.f_mae) and len(large.f_mae) == 2


def test_sweep_is_drawn_by_default_only_when_parameters_differ(tmp_path):
    st = parse_study(tomllib.loads(SCALING.split("[report]")[0]), None)
    res = tmp_path / "r.jsonl"
    run_study(st, res, execute=FakeS2EF(), progress=False, log=lambda m: None)
    assert "sweep.png" in [p.name for p in make_report(res, tmp_path / "a").plots]
    same = SCALING.split("[report]")[0].replace("hidden = 32", "hidden = 8").replace("= 16, out_emb_channels = 32",
                                                                                    "= 4, out_emb_channels = 8")
    res2 = tmp_path / "r2.jsonl"
    global PARAMS
    old, PARAMS = PARAMS, {"small": 3_000, "large": 3_000, "G2": 3_000}
    try:
        run_study(parse_study(tomllib.loads(same), None), res2, execute=FakeS2EF(), progress=False,
                  log=lambda m: None)
    finally:
        PARAMS = old
    assert "sweep.png" not in [p.name for p in make_report(res2, tmp_path / "b").plots]


def test_steps_per_epoch_from_the_plan():
    assert steps_per_epoch({"plan": {"global_batch": 4, "structures": {"train": 17}}}) == 5
    assert steps_per_epoch({"plan": {}}) is None
    variants, _ = collect([{"run_id": "a", "variant": "v", "seed": 0, "settings": {"model": "dimenet++", "seed": 0},
                            "overrides": {}, "status": "ok", "result": {**fake_s2ef_result(0), "plan": {}}}])
    assert variants[0].s2ef and variants[0].step_ms == [None]  # no plan: no step time, no error


@pytest.mark.parametrize("name", ["atomistic_layouts.toml", "atomistic_scaling.toml"])
def test_shipped_atomistic_studies_parse(name):
    st = load_study(EXPERIMENTS / name)
    assert all(r.settings["model"] == "dimenet++" for r in st.runs)
    if name == "atomistic_layouts.toml":
        layouts = {(r.settings.get("stages", 1), r.settings.get("graph_parallel_group_size", 1),
                    r.settings.get("replicas", 1)) for r in st.runs}
        assert len(layouts) == len(st.runs) >= 6 and max(s * g * d for s, g, d in layouts) <= 4
    else:
        assert len(st.variant_names()) >= 4 and len(st.seeds) >= 2 and st.report["x"] == "params"
