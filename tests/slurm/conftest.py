"""A real single-node Slurm cluster for the `slurm` tests, started by cluster.sh (root only)."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _read_env(env_file: Path) -> dict[str, str]:
    """The variables env.sh exports, as the environment Slurm clients and Snakemake need."""
    script = f"set -a; source {shlex.quote(str(env_file))}; env -0"
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    """Environment for sbatch/sacct/snakemake against the test cluster; skips unless root."""
    if os.geteuid() != 0:
        pytest.skip("Slurm tests start a cluster with tests/slurm/cluster.sh, which needs root")
    state = Path(os.environ.get("CODL_SLURM_STATE", "/tmp/codl-slurm"))
    # `up` is idempotent and leaves the cluster running for the next session: starting it
    # takes seconds, and tests of one session share it.
    subprocess.run([str(HERE / "cluster.sh"), "up"], check=True, timeout=600)
    yield _read_env(state / "env.sh")
