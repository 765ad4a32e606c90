"""The checkout's claims as a whole: every citation, the catalogue, claims no page cites."""

from __future__ import annotations

from pathlib import Path

from codl.claims.registry import REGISTRY, load_registry
from codl.claims.text import (
    CATALOGUE,
    Values,
    catalogue,
    check_pages,
    citations,
    pages_of,
    render_pages,
)


def check(root: Path) -> list[str]:
    """Everything out of date under checkout ``root``, one line each: stale citations (file,
    line, claim, sentence), claims no page cites, and a stale catalogue."""
    values = Values(load_registry(root / REGISTRY), root)
    pages = [p for p in pages_of(root) if p.is_file() and p != root / CATALOGUE]
    problems = [s.message(root) for s in check_pages(pages, values)]
    cited = {c.claim for p in pages for c in citations(p)}
    problems += [
        f"{REGISTRY}: claim {cid} is cited by no page" for cid in values.claims if cid not in cited
    ]
    cat = root / CATALOGUE
    if not cat.is_file() or cat.read_text(encoding="utf-8") != catalogue(values):
        problems.append(f"{CATALOGUE}: not what `codl claims render` writes from {REGISTRY}")
    return problems


def render_all(root: Path) -> list[Path]:
    """Rewrites every citation and the catalogue under ``root``; returns the files changed."""
    values = Values(load_registry(root / REGISTRY), root)
    pages = [p for p in pages_of(root) if p.is_file() and p != root / CATALOGUE]
    changed = render_pages(pages, values)
    cat = root / CATALOGUE
    text = catalogue(values)
    if not cat.is_file() or cat.read_text(encoding="utf-8") != text:
        cat.write_text(text, encoding="utf-8")
        changed.append(cat)
    return changed
