"""Report (markdown + PNGs) from fabricated results, and the simulate-only mode."""

from __future__ import annotations

import builtins

import pytest
import tomllib

from gnnpipe.cli.main import main
from gnnpipe.errors import ConfigError
from gnnpipe.experiments import make_report, parse_study, simulate_study
from gnnpipe.experiments.report import collect, mean_std
from gnnpipe.experiments.results import ResultsWriter

from .helpers import ablation_records


def write(path, records):
    with ResultsWriter(path) as w:
        for r in records:
            w.append(r)
    return path


def test_collect_stats():
    variants, fixed = collect(ablation_records())
    assert [v.name for v in variants] == ["T1+T2+T3", "no T1", "no T2", "no T3", "none", "GP (exact)"]
    assert fixed == {"model": "gcnii", "layers": 32, "stages": 4, "chunks": 16, "correctors": "t1,t2,t3"}
    v = variants[2]
    assert len(v.seeds_ok) == 2 and len(v.failed) == 1
    gp = variants[-1]
    assert mean_std(gp.bytes["graph"])[0] == pytest.approx(40.0)
    assert mean_std(gp.bytes["weight"])[0] == pytest.approx(3.0)
    assert mean_std(variants[0].bytes["layer"])[0] == pytest.approx(6.0)
    assert gp.peak_mib[0] == pytest.approx(403.0)
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2 ** 0.5))


def test_report_cli(tmp_path, capsys):
    res = write(tmp_path / "abl.results.jsonl", ablation_records())
    assert main(["report", str(res)]) == 0
    out = capsys.readouterr().out
    assert "| T1+T2+T3 | 3 |" in out and "| no T2 | 2 (+1 failed) |" in out
    assert "layer MB/epoch" in out and "peak mem (MiB)" in out and "## Failed runs" in out
    folder = tmp_path / "abl.report"
    assert (folder / "report.md").read_text().strip() == out.strip()
    for name in ("val_acc.png", "time.png", "bytes.png"):
        data = (folder / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_report_no_plots_and_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="not found"):
        make_report(tmp_path / "missing.jsonl")
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="no finished runs"):
        make_report(empty)
    res = write(tmp_path / "r.jsonl", ablation_records(seeds=(0,)))
    rep = make_report(res, tmp_path / "out", plots=False)
    assert rep.plots == [] and (tmp_path / "out" / "report.md").is_file()
    real_import = builtins.__import__

    def no_mpl(name, *a, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    with pytest.raises(ConfigError, match=r"gnnpipe\[plot\]"):
        make_report(res, tmp_path / "out2")



def test_report_checks_matplotlib_before_creating_its_folder(tmp_path, monkeypatch, capsys):
    """Without matplotlib, report (plots on) fails before it creates its output folder, the default one too."""
    import sys

    res = write(tmp_path / "r.jsonl", ablation_records(seeds=(0,)))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(ConfigError, match=r"the report's plots need matplotlib: install the plot extra"):
        make_report(res, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert main(["report", str(res)]) == 2
    assert "--no-plots" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]  # no r.report folder either


SIM = """
[fixed]
layers = 8
[grid]
scheduler = ["gpipe", "1f1b", "async-stale"]
stages = [2, 4]
chunks = [4, 8]
[simulate]
epochs = [1, 3]
"""


def test_simulate_textbook_numbers():
    rows = simulate_study(parse_study(tomllib.loads(SIM), None))
    assert len(rows) == 3 * 2 * 2 * 2 and not any(r.error for r in rows)
    for r in rows:
        if r.scheduler == "gpipe" and r.epochs == 1:
            S, C = r.stages, r.chunks
            assert r.makespan == 2 * (C + S - 1)
            assert r.bubble == pytest.approx((S - 1) / (C + S - 1))
        if r.epochs == 3:
            assert r.steady_bubble is not None
    names = {r.variant for r in rows}
    assert "scheduler=1f1b, stages=4, chunks=8, epochs=3" in names


def test_simulate_cli_and_bad_variant(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text('[grid]\nscheduler = ["gpipe", "1f1b"]\nstages = [4]\n[simulate]\nbackward = 2.0\n'
                 '[[variants]]\nname = "C=16"\nchunks = 16\n[[variants]]\nname = "too few"\nchunks = 0\n')
    # chunks = 0 is rejected by the configuration check before anything is simulated
    assert main(["ablate", str(f), "--simulate"]) == 2
    assert "chunks must be >= 1" in capsys.readouterr().err
    f.write_text('[grid]\nscheduler = ["gpipe", "1f1b"]\nstages = [4]\n[simulate]\nbackward = 2.0\n'
                 '[[variants]]\nname = "C=16"\nchunks = 16\n')
    assert main(["ablate", str(f), "--simulate"]) == 0
    out = capsys.readouterr().out
    assert "| C=16, scheduler=1f1b, stages=4 | 1f1b | 4 | 16 | 3 | 171 | 57 | 15.8% |" in out
    f.write_text('[grid]\nscheduler = ["gpipe", "1f1b"]\nstages = [4]\n[simulate]\nbackward = 2.0\n'
                 'latency = 0.5\nbytes_per_chunk = 100\nbandwidth = 1000.0\n')
    assert main(["ablate", str(f), "--simulate"]) == 0
    out = capsys.readouterr().out
    assert "| scheduler=gpipe, stages=4 | gpipe | 4 | 16 | 3 |" in out and "bubble" in out
