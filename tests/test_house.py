"""House rules of the source: ``ruff check gnnpipe tests benchmarks`` passes (pyproject.toml: 120 columns; pycodestyle,
pyflakes, isort, pyupgrade, bugbear; in gnnpipe/, imports at module top); the package's code speaks for itself (no
design-note or issue references); imports sit at the top of a module.

In gnnpipe/ ruff refuses an import inside a function (PLC0415), except of the modules pyproject.toml bans at module
level (``banned-module-level-imports``, enforced by TID253: the optional extras and the heavy modules most commands
never touch); an import kept in a function to break an import cycle says so: ``# noqa: PLC0415 (cycle: …)``. Tests
and benchmarks may import where they use a module.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gnnpipe"
#: what ``ruff check`` reads (the CI runs this test: ruff is in the ``dev`` extra)
LINTED = ("gnnpipe", "tests", "benchmarks")

#: files (or folders, ending in ``/``) whose owners are still wrapping them to 120 columns: their E501 (line too long)
#: is not counted, every other rule is. Take an entry off once it is wrapped (the test warns when one is); empty, the
#: test is exactly ``ruff check gnnpipe tests benchmarks`` exiting 0.
STILL_BEING_WRAPPED: set[str] = set()

#: design notes and issue trackers the package's code must not point at (it explains itself)
REFERENCE_PATTERNS = (
    re.compile(r"DESIGN"),
    re.compile(r"ATOMISTIC\.md"),
    re.compile(r"ATOMISTIC §"),
    re.compile(r"(?i:issue) #?\d"),
    re.compile(r"#\d\d\b"),
)


def _ruff() -> list[str] | None:
    """The command that runs ruff: this interpreter's ``ruff`` module, else one on the PATH; ``None`` without one."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    exe = shutil.which("ruff")
    return [exe] if exe else None


def _still_being_wrapped(path: str) -> str | None:
    """The :data:`STILL_BEING_WRAPPED` entry that covers ``path`` (relative, ``/``-separated), or ``None``."""
    for entry in STILL_BEING_WRAPPED:
        if path == entry or (entry.endswith("/") and path.startswith(entry)):
            return entry
    return None


def _ruff_violations() -> list[dict]:
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the dev extra: pip install -e '.[dev]')")
    r = subprocess.run([*ruff, "check", *LINTED, "--output-format", "json", "--no-cache"], cwd=ROOT,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode in (0, 1), f"ruff check failed to run (exit {r.returncode}):\n{r.stderr}"
    out = json.loads(r.stdout or "[]")
    for v in out:
        v["path"] = Path(v["filename"]).resolve().relative_to(ROOT).as_posix()
    return out


def test_ruff_check_passes():
    """``ruff check gnnpipe tests benchmarks``, less the long lines of :data:`STILL_BEING_WRAPPED`."""
    found = _ruff_violations()
    left = [v for v in found if not (v["code"] == "E501" and _still_being_wrapped(v["path"]))]
    assert not left, f"ruff check finds {len(left)} problem(s):\n" + "\n".join(
        f"{v['path']}:{v['location']['row']}:{v['location']['column']}: {v['code']} {v['message']}" for v in left)
    long_lines = Counter(_still_being_wrapped(v["path"]) for v in found if v["code"] == "E501")
    done = sorted(e for e in STILL_BEING_WRAPPED if not long_lines[e])
    if done:
        warnings.warn(f"within 120 columns now: take {', '.join(done)} off STILL_BEING_WRAPPED in {__file__}",
                      stacklevel=1)


def test_still_being_wrapped_names_existing_paths():
    missing = sorted(e for e in STILL_BEING_WRAPPED if not (ROOT / e).exists())
    assert not missing, f"STILL_BEING_WRAPPED names paths that do not exist: {missing}"


# ---------------------------------------------------------------------------------------------- references
def references(text: str) -> list[str]:
    """The design-note and issue references in ``text`` (:data:`REFERENCE_PATTERNS`): ``"line: match"`` each."""
    return [f"{i}: {m.group(0)}" for i, line in enumerate(text.splitlines(), 1)
            for pattern in REFERENCE_PATTERNS for m in pattern.finditer(line)]


def test_the_reference_check_finds_planted_references():
    """The patterns catch what they are for and leave ordinary text alone."""
    planted = ("# the layering (DESIGN §3)\n"
               '"""See docs/ATOMISTIC.md for the cost model."""\n'
               "x = 1  # ATOMISTIC § 4\n"
               "# the memory model is issue #12's\n"
               "# Issue 7: a rank dies\n"
               "# fixed in #42\n")
    assert sorted({int(r.split(": ", 1)[0]) for r in references(planted)}) == [1, 2, 3, 4, 5, 6]
    clean = ("# a 12-layer model, design choices, 16 issues of the journal, color '#1f77b4' and 3 # 45\n"
             "tissue = 3  # 2 ranks")
    assert references(clean) == []


def test_no_design_note_or_issue_references_in_the_package():
    found = [f"{p.relative_to(ROOT)}:{r}" for p in sorted(PACKAGE.rglob("*.py")) for r in references(p.read_text())]
    assert not found, "the code refers to design notes or issues:\n" + "\n".join(found)


# ---------------------------------------------------------------------------------------------- imports
def _import_after_code(tree: ast.Module) -> list[int]:
    """Lines of module-level imports that follow other module-level code (what ruff's E402 reports): a docstring,
    ``from __future__`` imports, other imports, ``if`` / ``try`` blocks of imports only and dunder assignments
    (``__version__ = …``) may precede an import."""

    def import_only(stmt: ast.stmt) -> bool:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
            return True
        if isinstance(stmt, ast.If):
            return all(import_only(s) for s in stmt.body + stmt.orelse)
        if isinstance(stmt, ast.Try):
            return all(import_only(s) for s in stmt.body + stmt.orelse + stmt.finalbody
                       + [s for h in stmt.handlers for s in h.body])
        return False

    late, code_seen = [], False
    for k, stmt in enumerate(tree.body):
        if k == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        dunder = isinstance(stmt, ast.Assign) and all(
            isinstance(t, ast.Name) and t.id.startswith("__") and t.id.endswith("__") for t in stmt.targets)
        if dunder:
            continue
        if import_only(stmt):
            if code_seen:
                late.append(stmt.lineno)
        else:
            code_seen = True
    return late


def test_the_import_checks_on_planted_modules():
    late = ast.parse('"""doc."""\nfrom __future__ import annotations\n\nimport os\n\nX = 1\nimport sys\n')
    assert _import_after_code(late) == [7]
    assert _import_after_code(ast.parse('__version__ = "1"\nimport os\n')) == []
    fine = ast.parse("import os\ntry:\n    import yaml\nexcept ImportError:\n    pass\nimport re\nX = 1\n")
    assert _import_after_code(fine) == []


def test_module_level_imports_come_first():
    late = []
    for p in sorted(PACKAGE.rglob("*.py")):
        late += [f"{p.relative_to(ROOT)}:{line}" for line in _import_after_code(ast.parse(p.read_text()))]
    assert not late, "module-level imports after other code:\n" + "\n".join(late)


def _lint_settings() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["ruff"]["lint"]


def test_ruff_refuses_imports_inside_the_package_functions():
    """PLC0415 (import outside the top level) and TID253 (banned module-level imports) are selected, some modules are
    banned at module level, and only tests/ and benchmarks/ are exempt from the two rules."""
    lint = _lint_settings()
    assert {"PLC0415", "TID253"} <= set(lint["select"])
    assert lint["flake8-tidy-imports"]["banned-module-level-imports"]
    exempt = sorted(pattern for pattern, codes in lint.get("per-file-ignores", {}).items()
                    if {"PLC0415", "TID253"} & set(codes))
    assert exempt == ["benchmarks/**", "tests/**"], f"exempt from the import rules: {exempt}"


#: a ``noqa`` that lets an import stay inside a function, and what follows it on the line
NOQA_IMPORT = re.compile(r"#\s*noqa:[^#(]*\bPLC0415\b(?P<reason>.*)")


def noqa_without_reason(text: str) -> list[int]:
    """Lines of ``text`` with a ``# noqa: PLC0415`` that gives no reason in parentheses."""
    return [i for i, line in enumerate(text.splitlines(), 1)
            if (m := NOQA_IMPORT.search(line)) and not re.match(r"\s*\(\s*\S", m.group("reason"))]


def test_an_import_kept_inside_a_function_says_why():
    """An import ruff would refuse that stays in a function (it would close an import cycle) says why:
    ``# noqa: PLC0415 (cycle: gnnpipe.api imports this module)``."""
    planted = ("    import a  # noqa: PLC0415 (cycle: b imports this module)\n"
               "    import c  # noqa: PLC0415\n"
               "    import d  # noqa: F401, PLC0415\n"
               "    import e  # noqa: F401\n")
    assert noqa_without_reason(planted) == [2, 3]
    bare = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
            for i in noqa_without_reason(p.read_text())]
    assert not bare, "imports kept in a function with no reason given:\n" + "\n".join(bare)
