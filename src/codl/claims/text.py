"""Claims cited in Markdown: ``<!-- claim:ID -->+1.6 % [-1.2, +4.5]<!-- /claim -->``.

The text between the markers is what :func:`render` makes of the claim (``claim:ID:PART`` cites
one part: ``value``, ``interval``, ``counts``, ...). :func:`check_pages` recomputes every cited
claim from its committed tables and names each stale citation by file, line, claim and sentence;
:func:`render_pages` rewrites the citations. A marker pair sits on one line, so that the line it
names is the line to edit. The registry's catalogue (``docs/claims.md``) is rendered the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from codl.claims.compute import evaluate
from codl.claims.registry import PARTS, Claim, Value, render, render_interval, render_value
from codl.errors import CodlError

MARKER: Final = re.compile(r"<!-- claim:([A-Za-z0-9_.-]+)(?::(\w+))? -->(.*?)<!-- /claim -->")
#: A marker opened and not closed on its line: the check refuses it rather than skip it.
_OPEN: Final = re.compile(r"<!-- claim:")
#: The catalogue of every claim, rendered from the registry.
CATALOGUE: Final = Path("docs") / "claims.md"
_SENTENCE_CHARS: Final = 160


@dataclass(frozen=True, kw_only=True)
class Citation:
    """One claim cited on a page: where, which part, and the text the page holds."""

    page: Path
    line: int
    claim: str
    part: str
    text: str
    sentence: str

    def where(self, root: Path) -> str:
        rel = self.page.relative_to(root) if self.page.is_relative_to(root) else self.page
        return f"{rel}:{self.line}"


@dataclass(frozen=True, kw_only=True)
class Stale:
    """A citation whose text is not what its claim computes to today."""

    citation: Citation
    expected: str

    def message(self, root: Path) -> str:
        c = self.citation
        return (
            f"{c.where(root)}: claim {c.claim}"
            f"{'' if c.part == 'full' else ':' + c.part} reads {c.text!r}, "
            f"its table says {self.expected!r}, in: {c.sentence}"
        )


def _sentence(line: str) -> str:
    plain = MARKER.sub(lambda m: m.group(3), line).strip()
    return plain if len(plain) <= _SENTENCE_CHARS else plain[: _SENTENCE_CHARS - 3] + "..."


def citations(page: Path) -> list[Citation]:
    """The claims a page cites, in order; a marker left open on its line is refused."""
    out: list[Citation] = []
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        found = list(MARKER.finditer(line))
        if len(_OPEN.findall(line)) != len(found):
            raise CodlError(f"{page}:{n}: a claim marker without its <!-- /claim --> on the line")
        for m in found:
            part = m.group(2) or "full"
            if part not in PARTS:
                raise CodlError(f"{page}:{n}: claim {m.group(1)}: part {part!r} not in {PARTS}")
            out.append(
                Citation(
                    page=page,
                    line=n,
                    claim=m.group(1),
                    part=part,
                    text=m.group(3),
                    sentence=_sentence(line),
                )
            )
    return out


def pages_of(root: Path) -> list[Path]:
    """The pages whose numbers come from the registry: the README and docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


class Values:
    """Claims computed on demand, each once: a page cites some claims several times."""

    def __init__(self, claims: Iterable[Claim], root: Path) -> None:
        self.claims = {c.id: c for c in claims}
        self.root = root
        self._done: dict[str, Value] = {}

    def claim(self, cid: str, *, cited_at: str) -> Claim:
        if cid not in self.claims:
            raise CodlError(f"{cited_at}: claim {cid!r} is not in the registry")
        return self.claims[cid]

    def value(self, cid: str, *, cited_at: str) -> Value:
        claim = self.claim(cid, cited_at=cited_at)
        if cid not in self._done:
            self._done[cid] = evaluate(claim, self.root)
        return self._done[cid]

    def text(self, c: Citation) -> str:
        at = c.where(self.root)
        return render(self.claim(c.claim, cited_at=at), self.value(c.claim, cited_at=at), c.part)


def check_pages(pages: Sequence[Path], values: Values) -> list[Stale]:
    """Every citation whose text differs from its claim computed today."""
    stale = []
    for page in pages:
        for c in citations(page):
            expected = values.text(c)
            if expected != c.text:
                stale.append(Stale(citation=c, expected=expected))
    return stale


def render_pages(pages: Sequence[Path], values: Values) -> list[Path]:
    """Rewrites each page's citations from the claims; returns the pages it changed."""
    changed = []
    for page in pages:
        old = page.read_text(encoding="utf-8")
        lines = old.splitlines(keepends=True)
        for c in citations(page):
            new = values.text(c)
            marker = f"<!-- claim:{c.claim}{'' if c.part == 'full' else ':' + c.part} -->"
            lines[c.line - 1] = lines[c.line - 1].replace(
                f"{marker}{c.text}<!-- /claim -->", f"{marker}{new}<!-- /claim -->", 1
            )
        text = "".join(lines)
        if text != old:
            page.write_text(text, encoding="utf-8")
            changed.append(page)
    return changed


def _cell(v: int | None) -> str:
    return "" if v is None else f"{v:,}"


def expression(claim: Claim) -> str:
    """The claim's expression in one line: ``inflation [inflation_lo, inflation_hi] where
    policy=none, workers=12`` or ``invocation_inflation(sources) where ...``."""
    if claim.function is not None:
        what = f"{claim.function}(sources)"
    else:
        what = str(claim.value)
        if claim.interval:
            what += f" [{claim.interval[0]}, {claim.interval[1]}]"
    where = ", ".join(f"{k}={v}" for k, v in claim.where.items())
    return f"`{what}` where {where}" if where else f"`{what}`"


def catalogue(values: Values) -> str:
    """``docs/claims.md``: every claim of the registry, computed, with what it counts."""
    lines = [
        "# Claims",
        "",
        "<!-- Generated by `codl claims render` from docs/claims.yaml: edit the registry, not",
        "this page. tests/test_claims.py checks that it and every citation are up to date. -->",
        "",
        "Every headline number of the README and the results pages, computed from a committed",
        "table by the expression in [claims.yaml](claims.yaml). A page cites a claim as",
        "`<!-- claim:ID -->...<!-- /claim -->`; `codl claims check` recomputes each one and names",
        "the file, line and claim of any that its table no longer gives; `codl claims render`",
        "rewrites them. Intervals are 95 %; n: runs, blocks (runs made back to back, each paired",
        "with its twin of the same block) and invocations (allocations).",
        "",
        "| claim | what | statistic | value | interval | runs | blocks | invocations | source "
        "| expression |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cid, claim in values.claims.items():
        v = values.value(cid, cited_at=str(CATALOGUE))
        interval = render_interval(claim, v) if v.lo is not None else ""
        sources = "<br>".join(f"`{s}`" for s in claim.sources)
        lines.append(
            f"| `{cid}` | {claim.what} | {claim.statistic} | {render_value(claim, v)} "
            f"| {interval} | {_cell(v.n_runs)} | {_cell(v.n_blocks)} "
            f"| {_cell(v.n_invocations)} | {sources} | {expression(claim)} |"
        )
    return "\n".join(lines) + "\n"
