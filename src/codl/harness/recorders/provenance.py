"""The trace's provenance attributes: which code, which software stack and which kernel made it
(the runner adds them to the root attributes as the run ends)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from codl import __version__


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _torchvision_version() -> str:
    """Without importing torchvision: this runs in the `finally` that writes the trace, and a
    signal that interrupted a lazy import inside torch (DDP's first backward imports dynamo and
    triton) leaves modules half-initialised; importing torchvision there then failed and lost
    the trace. A run that never imported it gets the installed distribution's version."""
    version = getattr(sys.modules.get("torchvision"), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    v = {
        "codl": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": _torchvision_version(),
        "numpy": np.__version__,
        "kernel": platform.release(),
    }
    if torch.cuda.is_available():
        v["cuda"] = str(torch.version.cuda)
        v["gpu"] = torch.cuda.get_device_name(0)
        with contextlib.suppress(Exception):
            v["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    return v
