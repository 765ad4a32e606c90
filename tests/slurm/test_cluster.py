"""The test cluster behaves like the Slurm clusters the workflow runs on."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


def _run(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        args, env=env, cwd=cwd, check=True, capture_output=True, text=True, timeout=120
    ).stdout.strip()


def _final_state(env: dict[str, str], job_id: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _run(env, "sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State")
        if state in FINAL:
            return state
        time.sleep(1)
    raise AssertionError(f"job {job_id} not finished after {timeout_s} s (last: {state!r})")


@pytest.mark.parametrize(
    ("command", "expected"),
    [("srun hostname", "COMPLETED"), ("exit 3", "FAILED")],
    ids=["completes", "fails"],
)
def test_sacct_reports_final_state(
    slurm_env: dict[str, str], tmp_path: Path, command: str, expected: str
) -> None:
    job_id = _run(slurm_env, "sbatch", "--parsable", "--wrap", command, cwd=tmp_path)
    assert _final_state(slurm_env, job_id) == expected


def test_srun_starts_one_process_per_task(slurm_env: dict[str, str]) -> None:
    out = _run(slurm_env, "srun", "-n", "2", "--cpus-per-task=1", "printenv", "SLURM_PROCID")
    assert sorted(out.split()) == ["0", "1"]


@pytest.mark.slow
def test_profile_runs_a_workflow(slurm_env: dict[str, str]) -> None:
    out = subprocess.run(
        [str(REPO / "tests" / "slurm" / "smoke_job.sh")],
        check=False,
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
