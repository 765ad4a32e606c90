"""The documentation's relative links resolve (scripts/check_md_links.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_md_links", REPO / "scripts" / "check_md_links.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_relative_link_in_the_docs_resolves(capsys: pytest.CaptureFixture[str]) -> None:
    assert _checker().main([]) == 0, capsys.readouterr().out


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    checker = _checker()
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# A `code` heading, twice\n\n## Twice\n\n## Twice\n")
    page.write_text(
        "[ok](other.md#a-code-heading-twice) [ok](other.md#twice-1) [ok](#top)\n"
        "[gone](missing.md) [bad](other.md#nowhere) `[in code](missing.md)`\n\n# Top\n"
        "```\n[in a block](missing.md)\n```\n"
    )
    checker.ROOT = tmp_path
    problems = checker.check(page)
    assert [p.split(": ", 2)[1] for p in problems] == ["missing.md", "other.md#nowhere"]
