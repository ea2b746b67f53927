"""The commands of the guides (docs/guides/*.md) and of the README run as written.

Every fenced ``bash`` block of a page, and every ``python`` block of a guide (the README's Python blocks are
run by tests/test_readme.py), is run in page order in one scratch folder, so a later block may use the files
an earlier one wrote (a checkpoint, a profile, a study file). The folder holds a copy of ``experiments/``
and, where the repository has one beside it, a link to ``../shared`` (the datasets), so relative paths mean
what they mean in a checkout. A comment line right before a block changes how it is run:

* ``<!-- docs-test: slow -->``: only in the slow test of the page (``python -m pytest -m slow tests/docs``);
* ``<!-- docs-test: skip (reason) -->``: never (it needs a GPU, several machines, or installs packages).

A block that reads ``../shared/data`` is skipped, with the rest of its page, when the datasets are absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
GUIDES = sorted((REPO / "docs" / "guides").glob("*.md"))
PAGES = GUIDES + [REPO / "README.md"]
BLOCK = re.compile(r"(?:<!--\s*docs-test:\s*(?P<mark>\w+)[^>]*-->\s*\n)?"
                   r"```(?P<lang>bash|python)\n(?P<code>.*?)```", re.DOTALL)


def blocks(page: Path) -> list[dict]:
    """The page's runnable blocks in order: ``{"lang", "code", "mark"}`` (mark: None, "slow" or "skip")."""
    out = []
    for m in BLOCK.finditer(page.read_text()):
        if m["lang"] == "python" and page.name == "README.md":
            continue
        out.append({"lang": m["lang"], "code": m["code"], "mark": m["mark"]})
    return out


def _run_page(page: Path, tmp_path: Path, include_slow: bool) -> int:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(REPO / "experiments", work / "experiments",
                    ignore=shutil.ignore_patterns("*.results.jsonl", "*.report"))
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("GNNPIPE_CACHE", str(tmp_path / "cache"))
    ran = 0
    for i, block in enumerate(blocks(page)):
        if block["mark"] == "skip" or (block["mark"] == "slow" and not include_slow):
            continue
        if "../shared/data" in block["code"] and not (SHARED / "data").is_dir():
            pytest.skip(f"{page.name} block {i} needs ../shared/data")
        if block["lang"] == "bash":
            cmd = ["bash", "-e", "-o", "pipefail", "-c", block["code"]]
        else:
            script = work / f"_{page.stem}_block{i}.py"
            script.write_text(block["code"])
            cmd = [sys.executable, script.name]
        r = subprocess.run(cmd, check=False, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, (f"{page.name} block {i}:\n{block['code']}\n"
                                   f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        ran += 1
    return ran


def test_every_page_has_runnable_commands():
    assert GUIDES, "docs/guides has no page"
    for page in PAGES:
        assert blocks(page), f"{page.name} has no bash or python block"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_commands_run(page, tmp_path):
    if all(b["mark"] in ("slow", "skip") for b in blocks(page)):
        pytest.skip(f"{page.name}: every block is slow or skipped (the slow test runs them)")
    assert _run_page(page, tmp_path, include_slow=False) > 0


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_commands_run_all(page, tmp_path):
    if all(b["mark"] == "skip" for b in blocks(page)):
        pytest.skip(f"{page.name}: every block is skipped")
    assert _run_page(page, tmp_path, include_slow=True) > 0


def test_ci_runs_the_readme_test_command():
    """.ci/run runs exactly the README's second set-up command."""
    setup = [b["code"].strip() for b in blocks(REPO / "README.md")
             if "pytest" in b["code"] and "venv" in b["code"]]
    assert len(setup) == 1, setup
    assert setup[0] in (REPO / ".ci" / "run").read_text().splitlines()


def test_readme_links_resolve():
    """Every relative link of the README and the guides points at a file or folder that exists."""
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"
