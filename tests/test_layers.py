"""The package in rooms on floors (docs/design.md, "Layers"): every import points down or
sideways within a room, no module imports itself back through others, no room outgrows a quarter
of the package, and docs/design.md lists exactly the modules there are.

Late imports (inside functions) count: they are arrows all the same, only taken later.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
DESIGN = REPO / "docs" / "design.md"

#: Floors, bottom first; a module may import its own floor and the floors below. A floor lists
#: rooms: a sub-package (every module in it) or a module.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "codl",
            "codl._version",
            "codl.errors",
            "codl.log",
            "codl.blas",
            "codl.paths",
            "codl.files",
            "codl.outputs",
            "codl.measure",
        ),
    ),
    ("spec", ("codl.spec",)),
    ("trace", ("codl.trace",)),
    ("loader", ("codl.loader",)),
    ("harness", ("codl.pinning", "codl.datasets", "codl.harness")),
    ("plan", ("codl.config",)),
    ("analysis", ("codl.analysis",)),
    ("advisor", ("codl.advisor",)),
    ("figures", ("codl.figures",)),
    ("steps", ("codl.steps", "codl.plan_registry")),
    ("claims", ("codl.claims",)),
    ("cli", ("codl.cli",)),
)
MAX_ROOM_SHARE = 0.25


def modules(root: Path = SRC) -> dict[str, Path]:
    out = {}
    for path in sorted((root / "codl").rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        out[name] = path
    return out


def _targets(node: ast.AST, name: str, is_package: bool, known: set[str]) -> Iterable[str]:
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name.split(".")[0] == "codl")
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            module = ".".join([*base, node.module] if node.module else base)
        else:
            module = node.module or ""
        if module.split(".")[0] != "codl":
            return
        for alias in node.names:
            sub = f"{module}.{alias.name}"
            yield sub if sub in known else module


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the codl modules it imports (anywhere in its body)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {
            t
            for node in ast.walk(tree)
            for t in _targets(node, name, is_package, set(mods))
            if t != name
        }
    return graph


def room_of(module: str) -> str:
    """The longest room of :data:`LAYERS` that holds ``module``."""
    rooms = [r for _, floor in LAYERS for r in floor]
    holding = [r for r in rooms if module == r or (module.startswith(r + ".") and r != "codl")]
    if not holding and module == "codl":
        return "codl"
    if not holding:
        raise KeyError(f"{module}: in no room of LAYERS; add it to a floor")
    return max(holding, key=len)


def floor_of(module: str) -> int:
    room = room_of(module)
    return next(i for i, (_, floor) in enumerate(LAYERS) if room in floor)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} ({LAYERS[floor_of(m)][0]}) -> {t} ({LAYERS[floor_of(t)][0]})"
        for m, targets in graph.items()
        for t in targets
        if floor_of(t) > floor_of(m)
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def room_lines(root: Path = SRC) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, path in modules(root).items():
        room = room_of(name)
        out[room] = out.get(room, 0) + len(path.read_text(encoding="utf-8").splitlines())
    return out


def test_every_module_has_a_room() -> None:
    for name in modules():
        room_of(name)


def test_no_import_points_up_the_floors() -> None:
    assert upward_imports(import_graph()) == []


def test_no_module_imports_itself_back() -> None:
    assert cycles(import_graph()) == []


def test_no_room_holds_more_than_a_quarter_of_the_package() -> None:
    lines = room_lines()
    total = sum(lines.values())
    big = {r: round(n / total, 3) for r, n in lines.items() if n > MAX_ROOM_SHARE * total}
    assert not big, f"rooms over {MAX_ROOM_SHARE:.0%} of {total} lines: {big}"


def test_design_md_lists_every_module_and_no_other() -> None:
    listed = set(re.findall(r"`(codl(?:\.[a-z_0-9]+)*)`", DESIGN.read_text(encoding="utf-8")))
    mods = set(modules())
    assert sorted(mods - listed) == [], "modules missing from docs/design.md"
    assert sorted(m for m in listed - mods if m not in {r for _, f in LAYERS for r in f}) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "codl" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "up", "circles"),
    [
        # analysis importing the advisor (above it), even late, points up
        (
            {
                "__init__.py": "",
                "analysis/__init__.py": "",
                "analysis/a.py": "def f():\n    from codl.advisor import m\n",
                "advisor/__init__.py": "",
                "advisor/m.py": "from codl.analysis import a\n",
            },
            1,
            1,
        ),
        # relative imports resolve; sideways within a room is fine
        (
            {
                "__init__.py": "",
                "analysis/__init__.py": "",
                "analysis/a.py": "from . import b\n",
                "analysis/b.py": "from .c import x\n",
                "analysis/c.py": "x = 1\n",
            },
            0,
            0,
        ),
    ],
)
def test_the_checks_find_what_they_look_for(
    tmp_path: Path, files: dict[str, str], up: int, circles: int
) -> None:
    graph = import_graph(_package(tmp_path, files))
    assert len(upward_imports(graph)) == up
    assert len(cycles(graph)) == circles
