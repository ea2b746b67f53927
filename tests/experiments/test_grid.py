"""Study files: parsing, expansion, stable run ids, flag mapping, errors that name the key."""

from __future__ import annotations

import pytest
import tomllib

from gnnpipe.cli.train import add_train_arguments, config_from_args
from gnnpipe.errors import ConfigError
from gnnpipe.experiments.grid import load_study, parse_study, to_flags, train_flag_specs


def study(text: str, path=None, **kw):
    return parse_study(tomllib.loads(text), path, **kw)


BASIC = """
name = "s"
seeds = [0, 1]
[fixed]
model = "gcn"
layers = 4
correctors = ["t1", "t2", "t3"]
[grid]
hidden = [8, 16]
[[variants]]
name = "all"
[[variants]]
name = "no T1"
correctors = "t2,t3"
[[variants]]
stages = 2
recompute = true
"""


def test_expansion_order_names_and_overrides():
    s = study(BASIC)
    assert len(s.runs) == 2 * 2 * 3
    assert [r.seed for r in s.runs] == [0] * 6 + [1] * 6  # seeds outermost
    names = [r.variant for r in s.runs[:6]]
    assert names == ["all, hidden=8", "no T1, hidden=8", "hidden=8, stages=2, recompute=true",
                     "all, hidden=16", "no T1, hidden=16", "hidden=16, stages=2, recompute=true"]
    r = s.runs[1]
    assert r.overrides == {"hidden": 8, "correctors": "t2,t3"}
    assert r.settings["correctors"] == "t2,t3" and r.settings["seed"] == 0
    assert s.variant_names()[:3] == names[:3]


def test_run_ids_are_stable_and_ignore_names_and_spelling():
    a = study(BASIC)
    b = study(BASIC.replace('name = "all"', 'name = "everything"')
              .replace('correctors = ["t1", "t2", "t3"]', 'correctors = "t1, t2,t3"'))
    assert [r.run_id for r in a.runs] == [r.run_id for r in b.runs]
    assert len({r.run_id for r in a.runs}) == len(a.runs)
    c = study(BASIC.replace("layers = 4", "layers = 5"))
    assert not {r.run_id for r in a.runs} & {r.run_id for r in c.runs}


def test_flags_round_trip_through_train_parser():
    """Every setting reaches TrainConfig exactly as written (the same parser `gnnpipe train` uses)."""
    import argparse

    s = study(BASIC + "\n[[variants]]\nname='x'\nbias = true\nundirected = false\nweight-decay = 0.001\n"
              "timeout = 5.5\nlayer_split = 'profiled'\n")
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    for r in s.runs:
        cfg = config_from_args(p.parse_args(r.argv))
        for k, v in r.settings.items():
            got = getattr(cfg, k)
            if k == "correctors":
                assert got == ([] if v == "none" else v.split(","))
            else:
                assert got == v, (k, got, v)


def test_switches_and_none_correctors():
    specs = train_flag_specs()
    assert specs["recompute"].kind == "bool" and specs["undirected"].kind == "false"
    assert to_flags({"recompute": "auto", "undirected": True}) == []
    assert to_flags({"recompute": False}) == ["--no-recompute"]  # auto by default: false is a choice too
    assert specs["bias"].kind == "bool"  # --bias / --no-bias (issue #17 item 12; was --bias true|false)
    assert to_flags({"recompute": True, "undirected": False, "bias": False}) == ["--recompute", "--no-undirected"]
    assert to_flags({"bias": True}) == ["--bias"]
    s = study('[fixed]\ncorrectors = "none"\n[grid]\nlayers=[2]\n')
    argv = s.runs[0].argv
    assert argv[argv.index("--correctors") + 1] == "none"


def test_seeds_default_and_grid_seed():
    assert [r.seed for r in study("[fixed]\nseed = 7\n").runs] == [7]
    assert [r.seed for r in study("[grid]\nseed = [3, 4]\n").runs] == [3, 4]
    only = study("")
    assert len(only.runs) == 1 and only.runs[0].variant == "fixed"


def test_root_resolved_against_study_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "g.pt").write_bytes(b"")
    f = tmp_path / "sub" / "s.toml"
    f.write_text('[fixed]\nroot = "../data"\ndataset = "g.pt"\n')
    r = load_study(f, check=False).runs[0]
    argv = dict(zip(r.argv[::2], r.argv[1::2]))
    assert argv["--root"] == str((tmp_path / "data").resolve())
    assert argv["--dataset"] == str((tmp_path / "sub" / "g.pt").resolve())
    assert r.settings["root"] == "../data"  # ids use the text as written


@pytest.mark.parametrize("text, needle", [
    ("[fixed]\nlayer = 3\n", "'layer'; did you mean 'layers'"),
    ("[grid]\nlayers = 3\n", "[grid] layers must be a non-empty list"),
    ("[fixed]\nlayers = 3\n[grid]\nlayers = [2]\n", "'layers' is in both [fixed] and [grid]"),
    ("[grid]\nlayers = [2]\n[[variants]]\nlayers = 4\n", "sets 'layers', which [grid] varies"),
    ("layers = 3\n", "put it under [fixed]"),
    ("seeds = 3\n", "seeds must be a non-empty list of integers"),
    ("[fixed]\nrecompute = 1\n", "recompute is a switch"),
    ("[fixed]\ndedupe = false\n", "has no `gnnpipe train` flag"),
    ("[fixed]\nlayers = [2, 3]\n", "put lists of values to try under [grid]"),
    ("[fixed]\nlayers = 0\n", "layers must be >= 1"),
    ("[fixed]\nlayers = 'two'\n", "invalid int value"),
    ("[fixed]\nscheduler = 'gpipe2'\n", "unknown scheduler 'gpipe2'"),
    ("[fixed]\ncorrectors = 't9'\n", "t9"),
    ("[[variants]]\nname = 'a'\n[[variants]]\nname = 'a'\n", "named 'a'"),
    ("[simulate]\nforwards = 1\n", "unknown [simulate] key 'forwards'"),
    ("[simulate]\nepochs = 0\n", "[simulate] epochs must be an integer >= 1"),
    ("run_timeout_s = -1\n", "run_timeout_s must be a positive number"),
])
def test_bad_study_names_the_key(text, needle):
    with pytest.raises(ConfigError) as info:
        study(text)
    assert needle in str(info.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_study(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[fixed\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_study(bad)


def test_shipped_studies_parse():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "experiments"
    files = sorted(folder.glob("*.toml"))
    assert files, "experiments/*.toml missing"
    for f in files:
        s = load_study(f)
        assert s.runs, f
