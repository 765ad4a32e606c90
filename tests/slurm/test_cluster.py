"""The test cluster behaves like the Slurm clusters the workflow runs on."""

from __future__ import annotations

import subprocess
import sys
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


def _task_of_rank(spec: Path, rank: int) -> int | None:
    """The PID of the srun task of ``codl run spec`` that is rank ``rank``, if it is up."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        mine = str(spec).encode() in cmd and f"SLURM_PROCID={rank}".encode() in env
        if mine and b"srun" not in cmd.split(b"\0")[0]:
            return int(proc.name)
    return None


@pytest.mark.slow
def test_killing_one_rank_of_an_srun_step_keeps_the_survivors_data(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """A 2-rank run started as an srun step (`codl run` inside an allocation), rank 1
    SIGKILLed: srun (--kill-on-bad-exit) sends the survivor SIGTERM, it writes what it
    measured, and the process that started srun merges it into the run's one
    trace.incomplete.h5 (it used to leave trace.rank0.incomplete.h5 alone, unmerged)."""
    import os
    import signal

    from codl.harness.runner import write_spec_json
    from codl.spec import RunSpec
    from codl.trace.store import open_trace

    spec = RunSpec.from_dict(
        {
            "mode": "compute+comm",
            "workload": {"batch_size": 2, "image_size": 16},
            "layout": {"ranks_per_node": 2},
            "steps": {"warmup": 1, "measured": 100_000},
        }
    )
    run = tmp_path / "run"
    write_spec_json(spec, run / "spec.json")
    env = {**slurm_env, "PYTHONPATH": str(REPO / "src"), "CODL_LOG_LEVEL": "WARNING"}
    # The interpreter of this test, not a `python` the PATH happens to hold.
    cmd = ["salloc", "-n", "2", "-c", "1", sys.executable, "-m", "codl.cli", "run"]
    proc = subprocess.Popen(
        [*cmd, str(run / "spec.json"), "--trace", str(run / "trace.h5")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while (victim := _task_of_rank(run / "spec.json", 1)) is None or not list(
            run.glob("trace.rank1.h5.*.partial")
        ):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the srun tasks never started measuring"
            time.sleep(0.5)
        time.sleep(10)  # some steps of a tiny model
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-3000:]
    # salloc's own lines come after codl's (and "allocation ... has been revoked" only when
    # salloc races the step's end): codl's error is the last line that is not salloc's.
    last = [ln for ln in err.strip().splitlines() if not ln.startswith("salloc:")][-2:]
    assert any(line.startswith("codl run: error: srun exited with") for line in last), err
    kept = run / "trace.incomplete.h5"
    with open_trace(kept, allow_incomplete=True) as t:
        assert [r["rank"] for r in t.attrs["ranks"]] == [0]
        assert t.attrs["incomplete_reason"].startswith("srun exited with")
        assert "rank 0: " in t.attrs["incomplete_reason"]
        app = t.table("events/app")
        assert (app["phase"].astype(str) == "step").sum() >= 1
    names = sorted(p.name for p in run.iterdir() if not p.name.startswith("."))
    assert [n for n in names if not n.endswith(".partial")] == ["spec.json", "trace.incomplete.h5"]
