"""Check that every relative link in the project's Markdown resolves.

    python scripts/check_md_links.py [FILE.md ...]

Without arguments it checks README.md, docs/*.md and config/README.md. For each inline link or
image, ``[text](target)`` or ``![alt](target)``, outside code blocks and code spans: a relative
target must name an existing file or directory (relative to the linking file), and a
``#fragment`` on a Markdown file must be the GitHub anchor of one of its headings (lower case,
punctuation dropped, spaces to hyphens, ``-1``, ``-2`` ... for repeats). URLs (``http:``,
``https:``, ``mailto:``) are not fetched. Prints one line per broken link and exits 1 if any.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def check(path: Path) -> list[str]:
    problems = []
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{n}: {target}"
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{fragment} in {dest.name}")
    return problems


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "config" / "README.md",
    ]
    problems = [p for f in files for p in check(f)]
    for p in problems:
        print(p)
    links = sum(
        len(LINK.findall(CODE_SPAN.sub("", line)))
        for f in files
        for _, line in prose_lines(f.read_text(encoding="utf-8"))
    )
    print(f"{len(files)} files, {links} links, {len(problems)} broken", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
