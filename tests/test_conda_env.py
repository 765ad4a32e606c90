"""The rules' conda environment file (workflow/envs/codl.yaml): its pip section installs this
checkout, through pip's own ${VAR} expansion of CODL_ROOT (conda hands pip the lines as a
requirements file). Conda itself is not available to the test suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
ENV_FILE = REPO / "workflow" / "envs" / "codl.yaml"


def _pip_lines() -> list[str]:
    env = yaml.safe_load(ENV_FILE.read_text())
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pips) == 1
    assert "pip" in env["dependencies"]  # conda must install pip before it can use it
    return [str(line) for line in pips[0]]


def test_the_env_file_installs_this_checkout_from_codl_root(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(_pip_lines()) + "\n")
    env = {**os.environ, "CODL_ROOT": str(REPO), "PIP_NO_INPUT": "1"}
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index"]
    out = subprocess.run(
        [*pip, "--no-build-isolation", "-r", str(requirements)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Would install codl-" in out.stdout


def test_the_rules_name_the_env_file_and_the_workflow_sets_codl_root() -> None:
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert 'CONDA_ENV = "../envs/codl.yaml"' in common
    assert (REPO / "workflow" / "rules" / "../envs/codl.yaml").resolve() == ENV_FILE
    assert 'os.environ.setdefault("CODL_ROOT", str(CHECKOUT))' in common
