"""The rules run the codl of the interpreter that runs Snakemake, and their scripts import.

Two ways the documented commands broke for users (issue: every documented command works as
written): rules that shelled out to whatever `codl` the caller's PATH held, and a rule script
importing a name that had moved. Both are checked here without running the workflow; the
workflow tests (tests/test_workflow.py, tests/slurm/) run Snakemake from a PATH without the venv.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from codl.steps.workflow import CODL_PYTHON, codl_python
from shellenv import without_venv

REPO = Path(__file__).resolve().parents[1]
RULES = sorted((REPO / "workflow" / "rules").glob("*.smk"))
SCRIPTS = sorted((REPO / "workflow" / "scripts").glob("*.py"))


# What every rule's shell command starts with.
RULE_CODL = f'"${CODL_PYTHON}" -m codl.cli'


def test_the_rule_command_runs_codl_from_a_shell_without_the_venv(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", "-c", f"{RULE_CODL} --version"],
        env={**without_venv(), CODL_PYTHON: codl_python(sys.executable, conda=False)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("codl "), proc.stdout


@pytest.mark.parametrize("name", ["py thon", "pyth'on", "pythön"])
def test_an_interpreter_path_with_awkward_characters_is_quoted(tmp_path: Path, name: str) -> None:
    link = tmp_path / "bin dir" / name
    link.parent.mkdir()
    link.symlink_to(sys.executable)
    # A link outside the venv does not find the venv's packages by itself: name them.
    packages = [str(REPO / "src"), *(p for p in sys.path if p.endswith("site-packages"))]
    proc = subprocess.run(
        ["bash", "-c", f"{RULE_CODL} --version"],
        env={
            **without_venv(),
            "PYTHONPATH": ":".join(packages),
            CODL_PYTHON: codl_python(str(link), conda=False),
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, (str(link), proc.stderr)


def test_under_conda_the_environments_own_python_runs_codl() -> None:
    # The rule's conda environment (workflow/envs/codl.yaml) installs codl into its python.
    assert codl_python(sys.executable, conda=True) == "python"


@pytest.mark.parametrize("smk", RULES, ids=lambda p: p.name)
def test_no_rule_shells_out_to_a_codl_from_path(smk: Path) -> None:
    bare = [
        n
        for n, line in enumerate(smk.read_text().splitlines(), 1)
        if re.search(r"""^\s*(shell:\s*)?["']codl\s""", line)
    ]
    assert not bare, f"{smk.name}: lines {bare} run `codl` from PATH; use {RULE_CODL}"


def _codl_imports(script: Path) -> list[tuple[str, str]]:
    tree = ast.parse(script.read_text())
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("codl")
        for alias in node.names
    ]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_name_a_rule_script_imports_exists(script: Path) -> None:
    imports = _codl_imports(script)
    assert imports, f"{script.name} calls nothing in codl"
    missing = [
        f"{module}.{name}"
        for module, name in imports
        if not hasattr(importlib.import_module(module), name)
    ]
    assert not missing, f"{script.name} imports names that do not exist: {missing}"


def test_the_import_check_finds_a_moved_name(tmp_path: Path) -> None:
    # The script that broke `make demo-advise`, as it was.
    old = tmp_path / "interference_map.py"
    old.write_text("from codl.advisor.verify import map_to\n")
    ((module, name),) = _codl_imports(old)
    assert not hasattr(importlib.import_module(module), name)
