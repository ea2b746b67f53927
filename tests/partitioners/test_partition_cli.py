"""``gnnpipe partition``: table, JSON, errors."""

from __future__ import annotations

import json

import pytest
import torch

from gnnpipe.cli.main import main


def test_partition_cli_table_and_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    saved = tmp_path / "parts.pt"
    rc = main(["partition", "--num-nodes", "300", "--avg-degree", "8", "--parts", "4", "--method", "metis,random",
               "--over", "2", "--layers", "8", "--hidden", "16", "--stages", "4", "--out", str(out),
               "--save-parts", str(saved)])
    assert rc == 0
    text = capsys.readouterr().out
    for label in ("mirror count M", "edge cut (directed)", "vertex imbalance", "GP bytes/epoch (L=8, d=16)",
                  "pipeline bytes/epoch (S=4, d=16)", "metis", "random"):
        assert label in text
    report = json.loads(out.read_text())
    assert report["parts"] == 4 and set(report["results"]) == {"metis", "random"}
    r = report["results"]["metis"]
    assert r["options"]["over"] == 2
    assert r["predicted_gp_bytes"] == 2 * 4 * r["metrics"]["mirror_count"] * 8 * 16
    assert r["predicted_pipeline_bytes"] == 2 * 4 * 3 * report["num_nodes"] * 16
    assert sum(r["metrics"]["vertices_per_part"]) == report["num_nodes"]
    parts = torch.load(saved)
    assert parts["random"].shape == (report["num_nodes"],)


def test_partition_cli_unknown_method(capsys):
    rc = main(["partition", "--num-nodes", "50", "--parts", "2", "--method", "metis,nope"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown vertex partitioner 'nope'" in err and "contiguous" in err


def test_partition_cli_too_many_parts(capsys):
    assert main(["partition", "--num-nodes", "50", "--parts", "5000", "--method", "random"]) == 2
    assert "at most" in capsys.readouterr().err


def test_partition_help_lists_flags(capsys):
    with pytest.raises(SystemExit):
        main(["partition", "--help"])
    text = capsys.readouterr().out
    for flag in ("--dataset", "--root", "--parts", "--method", "--over", "--seed", "--out"):
        assert flag in text
