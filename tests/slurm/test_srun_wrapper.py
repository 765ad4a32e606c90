"""A one-rank run job under the Slurm jobstep plugin's srun wrapper.

The plugin runs a job's command as `srun -n1 --cpu-bind=q --cpus-per-task=N ...` unless the
job declares the `mpi` resource at all (it checks the key, not its value); a multi-rank run
declares it and starts its ranks with one srun itself. Here a one-rank run goes through
`profiles/slurm` and must have run as an srun step of one task (sacct), bound by Slurm to its
`cpus_per_rank` CPUs: the trace records the binding (`cpus_split` 1: SLURM_CPU_BIND_TYPE was a
CPU-level binding) and the CPU set it ran on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_slurm_workflow import _sacct, _snakemake, _states

from codl.config import build_plan
from codl.pinning import parse_cpulist
from codl.trace.store import open_trace

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CPUS = 1
CONFIG = {
    "defaults": {
        "device": "cpu",
        "workload": {"model": "resnet_tiny", "batch_size": 4, "image_size": 32},
        "steps": {"warmup": 1, "measured": 2},
    },
    "slurm": {"cpus_per_rank": CPUS, "mem_mb_per_rank": 1500, "runtime_min": 10},
    # `compute` reads no data set: the run job is the only Slurm job.
    "experiments": [{"name": "one", "factors": {"mode": ["compute"]}}],
}


def test_a_one_rank_run_ran_under_srun_with_its_cpu_binding(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    (run_id,) = build_plan(CONFIG).specs
    workdir = tmp_path / "work"
    wf = _snakemake(slurm_env, workdir, config)
    assert wf.returncode == 0, wf.tail()
    (job,) = [s.job_id for s in wf.jobs("run")]
    assert _states(slurm_env, [job]) == {job: "COMPLETED"}
    steps = _sacct(slurm_env, [job], "JobID,NTasks,AllocCPUS,State", allocations=False)
    # The wrapper's srun is the job's first numbered step, one task on the job's CPUs; without
    # it (a declared `mpi`) the command runs in the batch step and there is no numbered step.
    numbered = [r for r in steps if r["JobID"].split(".")[-1].isdigit() and "." in r["JobID"]]
    assert len(numbered) == 1, steps
    assert numbered[0]["NTasks"] == "1" and numbered[0]["State"] == "COMPLETED", steps
    assert int(numbered[0]["AllocCPUS"]) == CPUS, steps
    with open_trace(workdir / "results" / "runs" / run_id / "trace.h5") as t:
        attrs = t.attrs
    # The run saw SLURM_CPU_BIND_TYPE name a CPU-level binding (codl.harness: cpus_split 1) and
    # its CPU set is the task's own cpus_per_rank CPUs.
    assert int(attrs["cpus_split"]) == 1, attrs.get("cpus_split")
    assert len(parse_cpulist(attrs["allowed_cpus"])) == CPUS, attrs["allowed_cpus"]
    assert attrs["slurm_job_id"] == job
