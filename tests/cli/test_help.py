"""The help text of every command follows one rule (issue #17 item 12): each default stated once, none
for required arguments, switches or unset (None / empty) defaults; ``--bias/--no-bias``; one flag name
per concept across commands (old spellings still parse); ``gnnpipe --version``."""

import argparse
import re

import pytest

import gnnpipe
from gnnpipe.cli.main import build_parser, main


def _commands():
    """``[(command words, parser)]`` for every (sub-)command, recursively."""
    out = []

    def walk(words, parser):
        out.append((words, parser))
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(words + [name], sub)

    walk([], build_parser())
    return out


COMMANDS = _commands()
IDS = [" ".join(w) or "gnnpipe" for w, _ in COMMANDS]


def _visible(parser):
    return [a for a in parser._actions if a.help is not argparse.SUPPRESS and a.option_strings
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


def _option_help(parser, action) -> str:
    """The rendered help of one action on one line."""
    fmt = parser._get_formatter()
    text = fmt._expand_help(action) if action.help else ""
    return " ".join(text.split())


@pytest.mark.parametrize("words, parser", COMMANDS, ids=IDS)
def test_help_states_each_default_once_and_only_where_it_informs(words, parser, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")
    text = parser.format_help()
    assert "(default: None)" not in text and "(default: )" not in text
    for a in parser._actions:
        if a.help is argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
            continue
        h = _option_help(parser, a)
        where = f"{' '.join(words)} {'/'.join(a.option_strings) or a.dest}: {h!r}"
        assert len(re.findall(r"\bdefault\b", h, re.IGNORECASE)) <= 1, where
        optional_positional = not a.option_strings and a.nargs in ("?", "*")  # argparse marks "*" required
        if a.required and not optional_positional:  # includes positionals that must be given
            assert "default" not in h.lower(), where
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            assert "(default: True)" not in h and "(default: False)" not in h, where
        if a.default is not None and a.default != "" and a.option_strings and a.nargs != 0 and not a.required:
            assert "default" in h.lower(), where  # a real default is always stated


def test_bias_is_a_flag_pair():
    p = dict((" ".join(w), p) for w, p in COMMANDS)["train"]
    assert p.parse_args(["--bias"]).bias is True
    assert p.parse_args(["--no-bias"]).bias is False
    assert p.parse_args([]).bias is False
    bias = next(a for a in p._actions if a.dest == "bias")
    assert bias.option_strings == ["--bias", "--no-bias"]
    assert _option_help(p, bias).endswith("(default: --no-bias)")


def test_one_flag_name_per_concept_across_commands():
    dest_to_flags, flag_to_dests = {}, {}
    for words, p in COMMANDS:
        for a in _visible(p):
            longs = tuple(o for o in a.option_strings if o.startswith("--"))
            dest_to_flags.setdefault(a.dest, set()).add(longs)
            for o in longs:
                flag_to_dests.setdefault(o, set()).add(a.dest)
    assert {d: f for d, f in dest_to_flags.items() if len(f) > 1} == {}
    assert {o: d for o, d in flag_to_dests.items() if len(d) > 1} == {}
    assert dest_to_flags["partitioner"] == {("--partitioner",)}
    assert dest_to_flags["over_partition"] == {("--over-partition",)}


def test_old_spellings_still_parse_and_stay_out_of_the_help():
    cmds = dict((" ".join(w), p) for w, p in COMMANDS)
    part = cmds["partition"]
    a = part.parse_args(["--parts", "4", "--method", "random", "--over", "2"])
    assert (a.partitioner, a.over_partition) == ("random", 2)
    b = part.parse_args(["--parts", "4"])
    assert (b.partitioner, b.over_partition) == ("metis", None)
    options = part.format_help().split("options:", 1)[1]  # the description names the old spellings once
    assert "--method" not in options and "--over " not in options
    assert cmds["ablate"].parse_args(["s.toml", "--timeout", "5"]).run_timeout_s == 5.0


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"gnnpipe {gnnpipe.__version__}"
