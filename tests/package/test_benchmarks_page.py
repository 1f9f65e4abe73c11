"""BENCHMARKS.md stays a page of current tables: one section per benchmark, each naming the
command that prints it and when its figures were measured; no lab notebook.

The expectations are read from the repository, not from the page: the benchmark scripts are the
files of benchmarks/ that run as a program (`if __name__ == "__main__"`).
"""

from __future__ import annotations

import re

from conftest import REPO

PAGE = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
SECTIONS = re.split(r"^## ", PAGE, flags=re.M)[1:]
SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py")
                 if '__name__ == "__main__"' in p.read_text(encoding="utf-8"))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_page_is_short_and_says_nothing_of_rounds_or_sessions():
    assert len(PAGE.splitlines()) < 450  # about 30 lines for each of the 14 benchmark scripts
    found = re.findall(r"\b(rounds?|sessions?)\b", PAGE, flags=re.I)
    assert not found, found


def test_every_benchmark_script_has_a_section_with_its_command():
    assert len(SCRIPTS) >= 10, SCRIPTS
    for script in SCRIPTS:
        holders = [s.splitlines()[0] for s in SECTIONS if f"benchmarks/{script}" in s]
        assert holders, f"benchmarks/{script} is named by no section of BENCHMARKS.md"


def test_every_section_says_its_command_and_when_it_was_measured():
    for section in SECTIONS:
        title = section.splitlines()[0]
        assert re.search(r"^```sh\n.*(benchmarks/|pytest)", section, flags=re.M | re.S), title
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", section) or "Not measured" in section, title
        assert re.search(r"^Goal|Goals?: ", section, flags=re.M), title


def test_the_summary_links_every_section():
    anchors = {_anchor(s.splitlines()[0]) for s in SECTIONS}
    links = re.findall(r"^\| \[[^\]]+\]\(#([^)]+)\)", PAGE, flags=re.M)
    assert sorted(links) == sorted(anchors)
