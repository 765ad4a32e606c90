"""Placement inside real runs: masks read back after pinning, crowding warned in trace and log."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from codl.harness import runner
from codl.harness.launch import launch
from codl.pinning import parse_cpulist, rank_share
from codl.spec import RunSpec
from codl.trace.store import open_trace


def test_nccl_threads_are_named_before_the_process_group_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    seen: dict[str, Any] = {}

    def init_process_group(**kwargs: Any) -> None:
        # NCCL reads the variable once, when it creates its first thread: it must be set by now
        seen["NCCL_SET_THREAD_NAME"] = os.environ.get("NCCL_SET_THREAD_NAME")

    monkeypatch.delenv("NCCL_SET_THREAD_NAME", raising=False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    spec = RunSpec.from_dict({"mode": "compute", "layout": {"ranks_per_node": 2}})
    assert runner._init_process_group(spec, runner.RankEnv(world_size=2, local_world_size=2))
    assert seen == {"NCCL_SET_THREAD_NAME": "1"}
    # somebody who asked otherwise keeps their setting
    monkeypatch.setenv("NCCL_SET_THREAD_NAME", "0")
    runner._init_process_group(spec, runner.RankEnv(world_size=2, local_world_size=2))
    assert seen == {"NCCL_SET_THREAD_NAME": "0"}


@pytest.mark.slow
def test_comm_beside_main_is_read_back_and_warned_in_trace_and_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two gloo ranks with their comm threads placed on the main thread's CPU, on request."""
    allowed = frozenset(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip(f"needs 2 allowed CPUs for two ranks, has {len(allowed)}")
    spec = RunSpec.from_dict(
        {
            "mode": "compute",
            "workload": {"batch_size": 4, "image_size": 32},
            "layout": {"ranks_per_node": 2},
            "pinning": {"policy": "isolated", "comm": "main"},
            "steps": {"warmup": 1, "measured": 2},
        }
    )
    trace = tmp_path / "trace.h5"
    launch(spec, trace_path=trace, dataset_dir=None)
    log = capfd.readouterr().err
    with open_trace(trace) as t:
        ranks = t.attrs["ranks"]
        threads = t.table("threads")
    assert len(ranks) == 2
    for rank in ranks:
        share = rank_share(allowed, 2, rank["rank"])
        main_cpu = min(share)
        placement = rank["placement"]
        assert placement["roles"]["launch"] == placement["roles"]["comm"] == str(main_cpu)
        assert placement["planned_roles"] == ["comm"]
        assert rank["placement_mismatches"] == []
        (line,) = placement["crowded"]
        assert line.startswith(f"isolated: launch and comm threads share CPU(s) {main_cpu}: ")
        assert f"codl run: placement warning: {line}" in log
        # the masks read back: every comm thread of the rank sits on its main thread's CPU
        mine = threads[threads["rank"] == rank["rank"]]
        comm = mine[mine["role"].astype(str) == "comm"]
        assert len(comm) > 0
        assert {parse_cpulist(c) for c in comm["cpus_actual"].astype(str)} == {
            frozenset({main_cpu})
        }


def _budget_spec(cpus: int) -> RunSpec:
    return RunSpec.from_dict(
        {
            "mode": "data",
            "workload": {"batch_size": 4, "image_size": 32},
            "dataset": {"samples": 32, "height": 40, "width": 48},
            "loader": {"workers": 2},
            "pinning": {"cpus": cpus},
            "steps": {"warmup": 1, "measured": 3},
        }
    )


@pytest.mark.slow
def test_core_budget_confines_the_run_and_gives_the_job_set_back(tmp_path: Path) -> None:
    """`pinning.cpus: 1` under policy `none` (which pins nothing itself): the trace says the run
    had one CPU, every loader item ran on it, runs.csv's `cpus` is 1, and afterwards the
    process has the job's whole set again."""
    from codl.analysis.summarize import read_tables, summarize_tables
    from codl.datasets import generate
    from codl.spec import DatasetSpec

    job = frozenset(os.sched_getaffinity(0))
    if len(job) < 2:
        pytest.skip(f"needs 2 allowed CPUs to cut the set to 1, has {len(job)}")
    dataset = tmp_path / "jpeg"
    generate(DatasetSpec(samples=32, height=40, width=48), dataset)
    trace = tmp_path / "trace.h5"
    launch(_budget_spec(1), trace_path=trace, dataset_dir=dataset)
    assert frozenset(os.sched_getaffinity(0)) == job
    tables, attrs = read_tables(trace)
    cut = frozenset({min(job)})
    assert parse_cpulist(attrs["allowed_cpus"]) == cut
    assert parse_cpulist(attrs["job_cpus"]) == job
    loader = tables["events/loader"]
    assert len(loader) > 0
    assert set(loader["cpu"].astype(int)) <= cut
    _, summary, _ = summarize_tables(tables, attrs)
    assert summary.loc[0, "cpus"] == 1
    assert summary.loc[0, "pinning_cpus"] == 1


def test_core_budget_larger_than_the_job_fails_before_measuring(tmp_path: Path) -> None:
    from codl.errors import CodlError

    job = frozenset(os.sched_getaffinity(0))
    spec = _budget_spec(len(job) + 1)
    trace = tmp_path / "trace.h5"
    with pytest.raises(CodlError, match=rf"pinning\.cpus: got {len(job) + 1} per rank .* only "):
        launch(spec, trace_path=trace, dataset_dir=tmp_path)
    assert not list(tmp_path.glob("*.h5"))
    assert frozenset(os.sched_getaffinity(0)) == job


# What srun sets in a task that Slurm's task/affinity bound (as on the project's test cluster) or
# did not bind (--cpu-bind=none); SLURM_NTASKS=1 keeps the launcher from reading a 2-task step.
def _slurm_task(monkeypatch: pytest.MonkeyPatch, bind_type: str) -> None:
    monkeypatch.delenv("CODL_TASK_BOUND", raising=False)
    for key, value in {
        "SLURM_STEP_ID": "0",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "1",
        "SLURM_CPU_BIND_TYPE": bind_type,
        "SLURM_CPU_BIND": f"quiet,{bind_type}",
    }.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize(
    ("bind_type", "spawned", "split"),
    [
        pytest.param("mask_cpu:", False, 1, id="bound-task"),
        pytest.param("none", False, 2, id="unbound-task"),
        # ranks the local launcher spawned from one bound task share that task's set
        pytest.param("mask_cpu:", True, 2, id="spawned-in-a-bound-task"),
    ],
)
def test_place_splits_the_set_only_between_ranks_that_share_it(
    monkeypatch: pytest.MonkeyPatch, bind_type: str, spawned: bool, split: int
) -> None:
    """Local rank 1 of 2 through the real `_place`: a bound task keeps its whole set and its core
    budget is counted in it (`pinning.cpus` = every CPU it has, which asked for twice as many
    before); otherwise the set is cut for and split between both ranks, as before."""
    job = frozenset(os.sched_getaffinity(0))
    if len(job) < 2:
        pytest.skip(f"needs 2 allowed CPUs for two ranks, has {len(job)}")
    _slurm_task(monkeypatch, bind_type)
    budget = len(job) // split
    spec = RunSpec.from_dict({"mode": "compute", "pinning": {"policy": "shared", "cpus": budget}})
    env = runner.RankEnv(rank=1, local_rank=1, world_size=2, local_world_size=2, spawned=spawned)
    placed = runner._place(spec, env)
    try:
        allowed = frozenset(sorted(job)[: budget * split])
        assert placed.job == job
        assert placed.allowed == allowed
        assert placed.cpus_split == split
        share = allowed if split == 1 else rank_share(allowed, 2, 1)
        assert placed.placement.rank_cpus == share
        # the main thread was really pinned, to the first CPU of that share
        assert os.sched_getaffinity(0) == {min(share)}
    finally:
        placed.release()
    assert frozenset(os.sched_getaffinity(0)) == job


def test_local_launcher_marks_its_ranks_spawned(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from codl.harness import launch as launch_mod

    seen: list[runner.RankEnv] = []
    monkeypatch.setattr(launch_mod, "execute", lambda spec, **kw: seen.append(kw["env"]))
    spec = RunSpec.from_dict({"mode": "compute", "layout": {"ranks_per_node": 2}})
    launch_mod._rank_main(1, spec, tmp_path / "trace.h5", None, 29500, None, os.getpid())
    (env,) = seen
    assert (env.local_rank, env.local_world_size, env.spawned) == (1, 2, True)


@pytest.mark.slow
def test_a_bound_tasks_trace_records_its_whole_set_as_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real run as local rank 1 of 2 in a Slurm task bound to its CPUs: the trace's root
    attributes say the rank had its task's whole set, shared by no other rank."""
    job = frozenset(os.sched_getaffinity(0))
    if len(job) < 2:
        pytest.skip(f"needs 2 allowed CPUs, has {len(job)}")
    _slurm_task(monkeypatch, "mask_cpu:")
    spec = RunSpec.from_dict(
        {
            "mode": "compute",
            "workload": {"batch_size": 4, "image_size": 32},
            "pinning": {"policy": "shared", "cpus": len(job)},
            "steps": {"warmup": 1, "measured": 2},
        }
    )
    # One rank of the process group's two is enough here, and needs no peer: world_size 1.
    env = runner.RankEnv(rank=0, local_rank=1, world_size=1, local_world_size=2)
    trace = runner.execute(spec, trace_path=tmp_path / "trace.h5", dataset_dir=None, env=env)
    with open_trace(trace) as t:
        attrs = dict(t.attrs)
    assert parse_cpulist(attrs["allowed_cpus"]) == job
    assert parse_cpulist(attrs["job_cpus"]) == job
    assert attrs["cpus_split"] == 1
    assert parse_cpulist(attrs["placement"]["rank_cpus"]) == job
    assert frozenset(os.sched_getaffinity(0)) == job


@pytest.mark.parametrize(
    ("task_env", "spawned"),
    [
        # task 1 of a 2-task srun step, read through submitit's Slurm environment
        pytest.param(
            {
                "SUBMITIT_EXECUTOR": "slurm",
                "SLURM_JOB_ID": "11",
                "SLURM_NTASKS": "2",
                "SLURM_JOB_NUM_NODES": "1",
                "SLURM_NODEID": "0",
                "SLURM_JOB_NODELIST": "vm",
                "SLURM_PROCID": "1",
                "SLURM_LOCALID": "1",
            },
            False,
            id="srun-task",
        ),
        # task 1 of submitit's local executor: a child of one process, sharing its set
        pytest.param(
            {
                "SUBMITIT_EXECUTOR": "local",
                "SUBMITIT_LOCAL_JOB_ID": "4242",
                "SUBMITIT_LOCAL_NTASKS": "2",
                "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
                "SUBMITIT_LOCAL_NODEID": "0",
                "SUBMITIT_LOCAL_GLOBALID": "1",
                "SUBMITIT_LOCAL_LOCALID": "1",
            },
            True,
            id="submitit-local",
        ),
    ],
)
def test_cluster_env_marks_only_the_local_executors_tasks_spawned(
    monkeypatch: pytest.MonkeyPatch, task_env: dict[str, str], spawned: bool
) -> None:
    from codl.harness.launch import cluster_env

    monkeypatch.setenv("MASTER_PORT", "29511")
    for key, value in task_env.items():
        monkeypatch.setenv(key, value)
    env = cluster_env()
    assert env is not None
    assert (env.rank, env.local_rank, env.local_world_size) == (1, 1, 2)
    assert env.spawned is spawned
