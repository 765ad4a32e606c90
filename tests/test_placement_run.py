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
