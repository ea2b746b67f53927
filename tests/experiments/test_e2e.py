"""Acceptance: a tiny study end to end through real `gnnpipe train` subprocesses — killed midway, resumed —
then every run appears exactly once with its result and the report and plots are produced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gnnpipe.cli.main import main
from gnnpipe.experiments import load_study

STUDY = """
name = "tiny"
description = "two variants and one that fails at run time, two seeds"
seeds = [0, 1]
run_timeout_s = 120

[fixed]
dataset = "tiny.pt"      # relative to this file's folder
model = "gcn"
layers = 2
hidden = 8
epochs = 3

[[variants]]
name = "base"

[[variants]]
name = "wide"
hidden = 12

[[variants]]
name = "too deep"        # 9 stages > 4 layer units: gnnpipe train rejects it (a recorded failure)
stages = 9
"""


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _orphans(tmp_path) -> list[int]:
    """Pids of `gnnpipe train` processes working on this test's files (Linux /proc; [] elsewhere)."""
    if not os.path.isdir("/proc"):
        return []
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "train" in cmd and str(tmp_path) in cmd and state != "Z":
            out.append(int(pid))
    return out


@pytest.mark.timeout(240)
def test_study_kill_resume_report(tmp_path, capsys):
    from gnnpipe.data.synthetic import synthetic_graph

    torch.save(synthetic_graph(num_nodes=200, avg_degree=6, num_classes=3, num_features=8, seed=0),
               tmp_path / "tiny.pt")
    study_file = tmp_path / "tiny.toml"
    study_file.write_text(STUDY)
    results = tmp_path / "tiny.results.jsonl"
    runs = load_study(study_file).runs
    assert len(runs) == 6

    # 1. start the study and kill the runner (SIGKILL: no cleanup at all) after two runs are recorded
    proc = subprocess.Popen([sys.executable, "-m", "gnnpipe", "ablate", str(study_file), "--no-progress"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 150
    while len(_lines(results)) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "the study recorded no runs in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    # the run that was in flight dies with the runner (Linux: parent-death signal), leaving no orphan
    deadline = time.monotonic() + 20
    while _orphans(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _orphans(tmp_path)
    before = results.read_text()
    done_before = [r["run_id"] for r in _lines(results)]
    assert 2 <= len(done_before) < 6, [r["error"] for r in _lines(results)]
    assert done_before == [r.run_id for r in runs[: len(done_before)]]

    # 2. resume: only the missing runs run; what was recorded stays as it was
    rc = main(["ablate", str(study_file), "--no-progress"])
    assert rc == 1, capsys.readouterr().err  # 1: some runs failed
    after = results.read_text()
    assert after.startswith(before)
    recs = _lines(results)
    assert sorted(r["run_id"] for r in recs) == sorted(r.run_id for r in runs)  # each run exactly once
    by_variant = {}
    for r in recs:
        by_variant.setdefault(r["variant"], []).append(r)
        assert r["seed"] in (0, 1) and r["wall_s"] > 0
    assert set(by_variant) == {"base", "wide", "too deep"}
    for name in ("base", "wide"):
        for r in by_variant[name]:
            assert r["status"] == "ok" and r["error"] is None, r["error"]
            res = r["result"]
            assert len(res["epochs"]) == 3 and res["config"]["hidden"] == (12 if name == "wide" else 8)
            assert res["config"]["seed"] == r["seed"] and 0 <= res["test_acc_at_best_val"] <= 1
    for r in by_variant["too deep"]:
        assert r["status"] == "failed" and r["result"] is None
        assert "9 stages" in r["error"] and "exit status 2" in r["error"]
        assert os.path.isfile(r["log"])

    # 3. a third run has nothing left to do; --list says so
    assert main(["ablate", str(study_file), "--no-progress"]) == 0
    assert results.read_text() == after
    capsys.readouterr()
    assert main(["ablate", str(study_file), "--list"]) == 0
    assert "6 runs, 6 done, 0 left" in capsys.readouterr().out

    # 4. the report: table on stdout and in report.md, three plots
    assert main(["report", str(results)]) == 0
    out = capsys.readouterr().out
    assert "| base | 2 |" in out and "| wide | 2 |" in out and "| too deep | 0 (+2 failed) |" in out
    assert "±" in out and "Fixed settings:" in out and "`model=gcn`" in out
    folder = tmp_path / "tiny.report"
    assert (folder / "report.md").read_text().strip() == out.strip()
    for name in ("val_acc.png", "time.png", "bytes.png"):
        assert (folder / name).read_bytes()[:4] == b"\x89PNG"
