"""A run across two nodes through `snakemake --profile profiles/slurm`.

The test cluster's partition `twonode` has two nodes, codl-n1 and codl-n2, each a slurmd in its
own network and UTS namespace (tests/slurm/cluster.sh). The `compute+comm` run of
config/twonode.yaml (`layout.nodes: 2`, one gloo rank per node, CPU) must be one 2-node Slurm
job whose srun step starts a task on each node; the ranks find each other through submitit's
TorchDistributedEnvironment (rank 0's node by name), and the merged trace holds both ranks, each
on its own host, on one clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_slurm_workflow import _sacct, _snakemake, _states

from codl.config import build_plan
from codl.paths import ResultPaths
from codl.trace.store import open_trace

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


CONFIG = Path(__file__).resolve().parents[2] / "config" / "twonode.yaml"


def test_a_two_node_run_is_one_job_with_a_rank_on_each_node(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    partition = slurm_env.get("CODL_SLURM_TWONODE_PARTITION", "")
    if not partition:
        state = Path(slurm_env["SLURM_CONF"]).parents[1] / "twonode"
        why = state.read_text().splitlines()[1:] if state.exists() else ["no record"]
        pytest.skip(f"the test cluster has no two-node partition: {' '.join(why)}")
    cfg = yaml.safe_load(CONFIG.read_text())
    (rid,) = [r for r, spec in build_plan(cfg).specs.items() if spec.mode.value == "compute+comm"]
    workdir = tmp_path / "work"
    paths = ResultPaths(workdir)
    targets = [
        str(paths.trace(rid).relative_to(workdir)),
        str(paths.summary(rid).relative_to(workdir)),
    ]
    env = {**slurm_env, "CODL_SLURM_PARTITION": partition}
    wf = _snakemake(env, workdir, CONFIG, *targets)
    assert wf.returncode == 0, wf.tail()
    (job,) = [s.job_id for s in wf.jobs("run")]
    states = _states(env, [s.job_id for s in wf.submissions])
    assert states == {s.job_id: "COMPLETED" for s in wf.submissions}, wf.tail()
    (alloc,) = _sacct(env, [job], "JobID,NNodes,NodeList,Partition")
    assert alloc["NNodes"] == "2" and alloc["Partition"] == partition, alloc
    # `codl run` re-ran itself as one srun step of 2 tasks over both nodes, completed on both.
    steps = _sacct(env, [job], "JobID,NTasks,NNodes,NodeList,State", allocations=False)
    ranks_step = [r for r in steps if r["JobID"].split(".")[-1].isdigit() and r["NTasks"] == "2"]
    assert ranks_step, steps
    assert ranks_step[0]["NNodes"] == "2" and ranks_step[0]["State"] == "COMPLETED", steps
    with open_trace(paths.trace(rid)) as t:
        assert sorted(int(r) for r in t.table("events/app")["rank"].unique()) == [0, 1]
        assert sorted(int(r) for r in t.table("events/comm")["rank"].unique()) == [0, 1]
        ranks = t.attrs["ranks"]
        alignment = t.attrs["clock_alignment"]
    assert sorted(r["host"] for r in ranks) == ["codl-n1", "codl-n2"]
    # Namespaced nodes share one kernel and so one CLOCK_MONOTONIC: recognised, offset exactly 0,
    # while the exchange was still measured (its estimate lies within its bound of that 0).
    assert alignment["applied"] is True
    r1 = alignment["ranks"][1]
    assert r1["same_clock"] is True and r1["offset_ns"] == 0
    for when in ("start", "end"):
        sample = r1[when]
        assert abs(sample["offset_ns"]) <= sample["bound_ns"], yaml.safe_dump(r1)
    print(f"two namespaced nodes, rank 1's measured offsets against 0: {yaml.safe_dump(r1)}")
