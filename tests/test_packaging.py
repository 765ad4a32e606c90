"""Packaging: ranges in pyproject.toml for library users, the exact lock (constraints.txt) that
`make venv` installs, and no runtime dependency that nothing uses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

# What uses each runtime dependency: a module codl or its workflow imports, or (for those used
# through another package) the file and text that need it.
USED_BY: dict[str, tuple[str, ...]] = {
    "torch": ("import torch",),
    "torchvision": ("import torchvision", "from torchvision"),
    "numpy": ("import numpy",),
    "h5py": ("import h5py",),
    "hdf5plugin": ("import hdf5plugin",),
    "pandas": ("import pandas",),
    "pyarrow": ("to_parquet(", "read_parquet("),  # pandas' Parquet engine
    "matplotlib": ("import matplotlib",),
    "pillow": ("from PIL import",),
    "pyyaml": ("import yaml",),
    "jsonschema": ("import jsonschema", "from jsonschema"),
    "snakemake": ("from snakemake",),
    "snakemake-executor-plugin-slurm": ("executor: slurm",),  # profiles/slurm
    "submitit": ("from submitit",),
    "scipy": ("from scipy",),
    "tokenizers": ("from tokenizers import",),  # the LM workload's BPE (codl.harness.text)
    "nvidia-ml-py": ("import pynvml",),
}


def lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+!-]+)", line.strip())
        assert m, f"constraints.txt: {line!r} is not an exact pin"
        pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def requirements() -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in PROJECT["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


# Installed by `make venv` with --no-deps, after the resolved '.[dev]' install.
NO_DEPS = ("HolisticTraceAnalysis", "plotly", "narwhals")


def test_the_lock_pins_every_requirement_inside_its_range() -> None:
    pins = lock()
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (str(req), pins[name])


def test_runtime_dependencies_are_ranges_a_library_user_can_meet() -> None:
    for text in PROJECT["dependencies"]:
        req = Requirement(text)
        ops = {s.operator for s in req.specifier}
        # A lower bound, never an exact pin: CoDL installs next to the user's own torch.
        assert ops and "==" not in ops and "===" not in ops, text
        assert ">=" in ops, text
    # A 2.14.1+cpu wheel (PyTorch's CPU index) meets the torch range, so a CPU-only install
    # keeps it instead of pulling the CUDA build.
    torch = next(Requirement(r) for r in PROJECT["dependencies"] if r.startswith("torch>"))
    assert torch.specifier.contains("2.14.1+cpu")


def test_every_runtime_dependency_is_used() -> None:
    sources = [
        *(REPO / "src" / "codl").rglob("*.py"),
        *(REPO / "workflow").rglob("*.py"),
        *(REPO / "workflow").rglob("*.smk"),
        REPO / "workflow" / "Snakefile",
        *(REPO / "profiles").rglob("*.yaml"),
    ]
    text = "\n".join(p.read_text() for p in sources)
    runtime = [Requirement(r) for r in PROJECT["dependencies"]]
    runtime += [Requirement(r) for r in PROJECT["optional-dependencies"]["gpu"]]
    for req in runtime:
        name = canonicalize_name(req.name)
        assert name in USED_BY, f"{name}: say in USED_BY what needs it, or drop it"
        assert any(use in text for use in USED_BY[name]), f"{name}: nothing uses it"
    # psutil is no runtime dependency: codl reads /proc itself (benchmarks/proc_stat_cost.py).
    assert "psutil" not in {canonicalize_name(r.name) for r in runtime}
    assert not re.search(r"^\s*(import|from) psutil", text, re.M)


def test_make_venv_installs_the_lock() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert recipe.splitlines()[0].split() == ["pyproject.toml", "constraints.txt"]
    torch_line, codl_line, hta_line = (line for line in installs if "--upgrade pip" not in line)
    assert "-c constraints.txt" in torch_line and "torch torchvision" in torch_line
    assert "-c constraints.txt" in codl_line and "-e '.[dev]'" in codl_line
    # HTA without its declared dependencies (jupyterlab...), at the lock's versions too.
    assert "-c constraints.txt" in hta_line and "--no-deps" in hta_line
    assert set(hta_line.split()) >= set(NO_DEPS)


@pytest.mark.slow
def test_a_fresh_dev_install_resolves_to_exactly_the_lock(tmp_path: Path) -> None:
    """pip's resolver, from the package index, for a new venv: every package it would install
    is pinned in constraints.txt at that version (nothing floats), and every pin is used."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "-c",
            str(REPO / "constraints.txt"),
            "-e",
            f"{REPO}[dev]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    got.pop("codl")
    got.pop("pip", None)
    assert got == {k: v for k, v in lock().items() if k not in map(canonicalize_name, NO_DEPS)}
