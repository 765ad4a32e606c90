"""Two gloo ranks on CPU: local launcher, submitit's local executor, and AllReduce numerics."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from codl.datasets import generate
from codl.harness import workloads
from codl.harness.comm import (
    CommRecorder,
    comm_group,
    prepare_tensors,
    run_comm_step,
    subgroups,
)
from codl.harness.launch import launch
from codl.spec import CommPattern, DatasetSpec, RunSpec
from codl.trace.store import open_trace

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "jpeg"
    generate(DatasetSpec(samples=32, height=40, width=48), out)
    return out


def two_ranks(mode: str, **layout: Any) -> RunSpec:
    return RunSpec.from_dict(
        {
            "mode": mode,
            "workload": {"batch_size": 4, "image_size": 32},
            "dataset": {"samples": 32, "height": 40, "width": 48},
            "loader": {"workers": 1},
            "layout": {"ranks_per_node": 2, **layout},
            "steps": {"warmup": 1, "measured": 2},
        }
    )


def read(path: Path) -> dict[str, Any]:
    with open_trace(path) as t:
        names = ("events/app", "events/loader", "events/comm", "events/phase_sched", "threads")
        return {n: t.table(n) for n in names} | {"attrs": dict(t.attrs)}


@pytest.mark.parametrize(
    ("mode", "forward", "loader", "comm"),
    [
        ("data", False, True, False),
        ("compute", True, False, False),
        ("comm", False, False, True),
        ("compute+comm", True, False, True),
        ("data+compute", True, True, False),
        ("combined", True, True, True),
        ("data+sleep", True, True, False),  # forward only in the warm-up step
    ],
)
def test_two_rank_modes_do_exactly_their_components(
    mode: str, forward: bool, loader: bool, comm: bool, tmp_path: Path, dataset: Path
) -> None:
    spec = two_ranks(mode)
    trace = tmp_path / "trace.h5"
    launch(spec, trace_path=trace, dataset_dir=dataset if spec.mode.loads else None)
    t = read(trace)
    app = t["events/app"]
    assert set(app["rank"].unique()) == {0, 1}
    assert ("forward" in set(app["phase"].astype(str))) is forward
    assert (len(t["events/loader"]) > 0) is loader
    c = t["events/comm"]
    assert (len(c) > 0) is comm
    if comm:
        # Every rank reduced the same buckets in every step, and together they are the model.
        per_rank = c.groupby("rank")["bytes"].apply(list)
        assert per_rank[0] == per_rank[1]
        step0 = c[(c["rank"] == 0) & (c["step"] == 0)]
        model = workloads.get("resnet_tiny").build_model(spec.workload)
        n_params = sum(p.numel() for p in model.parameters())
        assert step0["bytes"].sum() == 4 * n_params
    assert len(t["attrs"]["ranks"]) == 2
    # Locally spawned ranks share the launcher's set; the merged trace keeps it per rank.
    assert [r["cpus_split"] for r in t["attrs"]["ranks"]] == [2, 2]
    assert t["attrs"]["cpus_split"] == 2
    assert not list(tmp_path.glob("trace.rank*"))
    check_phase_counters(app, t["events/phase_sched"], t["threads"])


def check_phase_counters(app: Any, phase: Any, threads: Any) -> None:
    """Every compute, data_wait and allreduce span has its launch thread's counters across
    exactly that span, and they fit in it: on-CPU time + run-queue wait <= its wall time (plus
    the few microseconds of the reads just outside it)."""
    spans = app[app["phase"].astype(str).isin(["compute", "data_wait", "allreduce"])]
    launch = threads[threads["role"].astype(str) == "launch"][["rank", "tid"]].drop_duplicates()
    mine = phase.merge(launch, on=["rank", "tid"])
    key = ["rank", "step", "start_ns", "end_ns"]
    got = mine.assign(phase=mine["phase"].astype(str))[[*key, "phase"]]
    want = spans.assign(phase=spans["phase"].astype(str))[[*key, "phase"]]
    assert sorted(map(tuple, got.to_numpy().tolist())) == sorted(
        map(tuple, want.to_numpy().tolist())
    )
    assert (mine["run_ns"] >= 0).all() and (mine["wait_ns"] >= 0).all()
    slack = 1_000_000
    assert (mine["run_ns"] + mine["wait_ns"] <= mine["end_ns"] - mine["start_ns"] + slack).all()


def _reduce_worker(rank: int, port: int, pattern: str, out: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    spec = two_ranks("comm", comm_pattern=pattern)
    group = comm_group(spec)
    tensors = prepare_tensors([5, 7, 11, 13, 17], spec, torch.device("cpu"))
    rec = CommRecorder(rank=rank)
    run_comm_step(tensors, spec, rec, cuda=False, group=group)
    out.put((rank, [t.tolist() for t in tensors], rec.ops))
    dist.destroy_process_group()


@pytest.mark.parametrize("pattern", [p.value for p in CommPattern])
def test_allreduce_patterns_are_numerically_right(pattern: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_reduce_worker, args=(r, port, pattern, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (vals, ops)) for r, vals, ops in (q.get(timeout=60) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    groups = subgroups(2) if pattern == "subgroups" else [[0, 1]]
    for rank, (vals, ops) in results.items():
        members = next(g for g in groups if rank in g)
        expected = float(sum(m + 1 for m in members))
        assert all(v == expected for tensor in vals for v in tensor)
        total = sum(len(t) for t in vals)
        assert total == 5 + 7 + 11 + 13 + 17
        if pattern == "segmented":
            assert len(vals) < 5
        assert len(ops) == len(vals)


def test_submitit_local_executor_runs_both_ranks(tmp_path: Path, dataset: Path) -> None:
    import submitit

    spec = two_ranks("compute+comm")
    trace = tmp_path / "trace.h5"
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(tasks_per_node=2, nodes=1, timeout_min=5)
    job = executor.submit(launch, spec, trace_path=trace, dataset_dir=None)
    job.results()
    t = read(trace)
    assert set(t["events/app"]["rank"].unique()) == {0, 1}
    assert set(t["events/comm"]["rank"].unique()) == {0, 1}
    assert t["attrs"]["world_size"] == 2
    # The local executor's tasks are one process's children: they share its set.
    assert [r["cpus_split"] for r in t["attrs"]["ranks"]] == [2, 2]
