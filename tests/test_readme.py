"""The README is a door: short, with the demo and test commands, Slurm, your own workload, the
findings in a few lines each linking its results page, and links to the rest."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
MAX_LINES = 150
MAX_FINDINGS_LINES = 10


def _section(title: str) -> list[str]:
    lines = README.splitlines()
    start = lines.index(f"## {title}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1 : end]


def test_the_readme_is_at_most_150_lines() -> None:
    assert len(README.splitlines()) <= MAX_LINES


def test_the_findings_are_at_most_10_lines_each_linking_a_results_page() -> None:
    findings = [line for line in _section("What it found") if line.startswith("- ")]
    assert 0 < len(findings) <= MAX_FINDINGS_LINES
    # Each finding is one line of the source, and those with numbers link their results page.
    for line in findings:
        if "<!-- claim:" in line:
            assert re.search(r"\(docs/results[\w-]*\.md[#\w-]*\)", line), line


def test_the_entry_points_are_there() -> None:
    for needle in (
        "make demo",
        "make test",
        "--profile profiles/slurm",
        "examples/codl-example-workload",
        "## Use the hand-off in your own training script",
        "docs/loader.md",
        "![",
    ):
        assert needle in README, needle


def test_the_figure_is_a_committed_file() -> None:
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert figures
    for target in figures:
        assert target.startswith("results/"), target
        assert (REPO / target).is_file(), target
