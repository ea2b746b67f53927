"""The shape of the README and the results page: a landing page, and a results page whose every section gives
the command behind its figures."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "RESULTS.md"


def sections(text: str, level: str = "## ") -> dict[str, str]:
    parts = re.split(rf"^{level}(.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_readme_is_a_landing_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for guide in sorted((REPO / "docs" / "guides").glob("*.md")):
        assert f"docs/guides/{guide.name}" in text, f"the README does not link {guide.name}"


def test_results_page_is_short_and_every_section_has_its_command():
    text = RESULTS.read_text()
    assert len(text.splitlines()) <= 700  # two kinds of work, each section its figures and command
    found = sections(text)
    assert next(iter(found)) == "Headline", "the headline table comes first"
    for title, body in found.items():
        if title == "Headline":
            continue
        assert "```bash" in body, f"RESULTS section {title!r} gives no command"


def test_headline_links_point_at_sections():
    text = RESULTS.read_text()
    anchors = {re.sub(r"[^\w\- ]", "", t).strip().lower().replace(" ", "-")
               for t in re.findall(r"^#{2,3} (.+)$", text, flags=re.MULTILINE)}
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, f"RESULTS links to #{target}, which is no heading"


def test_no_page_narrates_how_the_work_went():
    pages = [REPO / "README.md", RESULTS, *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        for pattern in (r"\bsession \d", r"\bissue #?\d", r"\bthis round\b"):
            assert not re.search(pattern, text, flags=re.IGNORECASE), f"{page.name}: {pattern!r}"
