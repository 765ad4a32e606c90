"""Functions fit on a screen: none in src/ is longer than MAX_LINES (issue 19).

A long function hides the order of the steps it takes; this check keeps new ones from growing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 80


def function_lengths(root: Path) -> dict[str, int]:
    """Qualified name (module.Class.function, nested functions included) -> lines, def to end."""
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}.{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        end = child.end_lineno or child.lineno
                        out[name] = end - child.lineno + 1
                    visit(child, name)
                else:
                    visit(child, prefix)

        visit(tree, module)
    return out


def test_no_function_in_src_is_longer_than_the_limit() -> None:
    lengths = function_lengths(SRC)
    assert "codl.harness.runner.execute" in lengths  # the walk reached the package
    long = {n: k for n, k in lengths.items() if k > MAX_LINES}
    assert not long, f"functions over {MAX_LINES} lines (split them): {long}"


@pytest.mark.parametrize(("body", "long"), [(MAX_LINES - 1, False), (MAX_LINES, True)])
def test_the_check_counts_def_to_last_line(tmp_path: Path, body: int, long: bool) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    lines = "\n".join(["class C:", "    def f(self) -> None:"] + ["        pass"] * body)
    (pkg / "m.py").write_text(lines + "\n")
    assert (function_lengths(tmp_path)["pkg.m.C.f"] > MAX_LINES) is long
