"""The environment of a user's fresh shell: the venv is not activated.

Tests that run Snakemake (locally and under Slurm) use it, so that a rule which relies on a
`codl` on the caller's PATH fails there as it fails for a user who types
`.venv/bin/snakemake ...` without activating the venv (codl.steps.workflow.codl_python).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def without_venv(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with no PATH entry that holds a ``codl`` or the venv."""
    out = dict(os.environ if env is None else env)
    venv_bin = Path(sys.executable).parent
    kept = [
        d
        for d in out.get("PATH", os.defpath).split(os.pathsep)
        if d and Path(d) != venv_bin and not (Path(d) / "codl").exists()
    ]
    out["PATH"] = os.pathsep.join(kept)
    out.pop("VIRTUAL_ENV", None)
    if shutil.which("codl", path=out["PATH"]) is not None:
        raise RuntimeError(f"a codl is still on PATH: {shutil.which('codl', path=out['PATH'])}")
    return out


def codl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``codl ARGS`` as a user runs it, in its own process, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "codl.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
