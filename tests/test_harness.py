"""Real runs on CPU: every mode does exactly its components, and the trace says so truthfully."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import pytest

from codl.datasets import generate
from codl.harness.launch import launch
from codl.pinning import parse_cpulist
from codl.spec import DatasetSpec, RunSpec
from codl.trace.store import open_trace

pytestmark = pytest.mark.slow

LEVEL_TABLES = ("events/app", "samples/sched", "samples/cpu", "threads")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data set with spaces ü") / "jpeg"
    generate(DatasetSpec(samples=48, height=40, width=48), out)
    return out


def tiny(mode: str, **over: Any) -> RunSpec:
    d: dict[str, Any] = {
        "mode": mode,
        "workload": {"batch_size": 4, "image_size": 32},
        "dataset": {"samples": 48, "height": 40, "width": 48},
        "loader": {"workers": 2},
        "steps": {"warmup": 2, "measured": 4},
    }
    for k, v in over.items():
        node = d
        *parents, leaf = k.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return RunSpec.from_dict(d)


def run(spec: RunSpec, tmp_path: Path, dataset: Path) -> dict[str, Any]:
    trace = tmp_path / spec.run_id / "trace.h5"
    launch(spec, trace_path=trace, dataset_dir=dataset if spec.mode.loads else None)
    with open_trace(trace) as t:
        t.verify()
        tables = {name: t.table(name) for name in (*LEVEL_TABLES, "events/loader", "events/comm")}
        return {"attrs": dict(t.attrs), "tables": tables, "path": trace}


def phases(app: pd.DataFrame, *, measured_from: int = 0) -> set[str]:
    return set(app[app["step"] >= measured_from]["phase"].astype(str))


@pytest.mark.parametrize(
    ("mode", "loads", "computes"),
    [
        ("data", True, False),
        ("compute", False, True),
        ("combined", True, True),
        ("data+compute", True, True),
    ],
)
def test_single_rank_modes_run_exactly_their_components(
    mode: str, loads: bool, computes: bool, tmp_path: Path, dataset: Path
) -> None:
    spec = tiny(mode)
    out = run(spec, tmp_path, dataset)
    attrs, t = out["attrs"], out["tables"]
    app, loader = t["events/app"], t["events/loader"]
    got = phases(app)
    assert ("forward" in got) is computes
    assert ("backward" in got) is computes
    assert ("data_wait" in got) is loads
    assert (len(loader) > 0) is loads
    assert attrs["complete"] is True
    assert attrs["run_id"] == spec.run_id
    # One step span per step, in order, each inside the run.
    steps = app[app["phase"].astype(str) == "step"].sort_values("step")
    assert steps["step"].tolist() == list(range(spec.steps.total))
    assert (steps["start_ns"].diff().dropna() > 0).all()
    assert (app["end_ns"] >= app["start_ns"]).all()
    # Every phase of a step lies inside that step's span.
    bounds = steps.set_index("step")
    inner = app[app["phase"].astype(str) != "step"]
    assert (inner["start_ns"].to_numpy() >= bounds.loc[inner["step"], "start_ns"].to_numpy()).all()
    assert (inner["end_ns"].to_numpy() <= bounds.loc[inner["step"], "end_ns"].to_numpy()).all()


def test_every_cpu_level_is_on_one_clock_inside_the_anchors(tmp_path: Path, dataset: Path) -> None:
    spec = tiny("combined")
    out = run(spec, tmp_path, dataset)
    attrs, t = out["attrs"], out["tables"]
    t0, t1 = int(attrs["t_begin_ns"]), int(attrs["t_end_ns"])
    a0 = attrs["anchors_start"]
    assert a0["monotonic_ns"] <= t0 + 1_000_000
    assert a0["error_ns"] < 1_000_000
    for name in (*LEVEL_TABLES, "events/loader"):
        df = t[name]
        assert len(df) > 0, f"{name} is empty on a CPU combined run"
        for col in ("start_ns", "end_ns", "t_ns"):
            if col in df:
                assert df[col].min() >= t0, (name, col)
                assert df[col].max() <= t1, (name, col)
    # Loader events come from the worker processes, as many as configured.
    loader = t["events/loader"]
    pids = set(loader["pid"].unique())
    assert len(pids) == spec.loader.workers
    assert os.getpid() not in pids
    threads = t["threads"]
    loader_pids = set(threads[threads["role"].astype(str) == "loader"]["pid"])
    assert pids <= loader_pids
    # Each item went through fetch -> decode -> transform in order, on one thread.
    items = loader[loader["item"] >= 0].pivot_table(
        index=["step", "item"], columns="stage", values=["start_ns", "end_ns"], observed=True
    )
    assert (items[("end_ns", "fetch")] <= items[("start_ns", "decode")]).all()
    assert (items[("end_ns", "decode")] <= items[("start_ns", "transform")]).all()
    # The launch thread's cumulative run-queue wait never decreases.
    launch_tid = int(threads[threads["role"].astype(str) == "launch"]["tid"].iloc[0])
    sched = t["samples/sched"]
    lw = sched[sched["tid"] == launch_tid].sort_values("t_ns")
    assert len(lw) == spec.steps.total + 1
    assert (np.diff(lw["wait_ns"].to_numpy()) >= 0).all()
    assert (np.diff(lw["run_ns"].to_numpy()) > 0).all()


def test_data_sleep_replaces_compute_by_its_measured_duration(
    tmp_path: Path, dataset: Path
) -> None:
    spec = tiny("data+sleep", steps__warmup=3)
    out = run(spec, tmp_path, dataset)
    app = out["tables"]["events/app"]
    warm = spec.steps.warmup
    assert "forward" in phases(app[app["step"] < warm])
    measured = phases(app, measured_from=warm)
    assert "forward" not in measured
    assert "sleep" in measured
    compute = app[(app["phase"].astype(str) == "compute") & (app["step"] < warm)]
    expected = float(np.median((compute["end_ns"] - compute["start_ns"]).to_numpy()[1:]))
    assert out["attrs"]["sleep_ns"] == pytest.approx(expected, rel=1e-6)
    sleeps = app[app["phase"].astype(str) == "sleep"]
    assert ((sleeps["end_ns"] - sleeps["start_ns"]) >= expected).all()


@pytest.mark.parametrize("policy", ["isolated", "shared"])
def test_policy_places_launch_thread_and_workers_where_planned(
    policy: str, tmp_path: Path, dataset: Path
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs 2 CPUs")
    spec = tiny("combined", pinning__policy=policy)
    out = run(spec, tmp_path, dataset)
    attrs, t = out["attrs"], out["tables"]
    placement = attrs["placement"]
    launch_cpus = parse_cpulist(placement["launch"])
    assert launch_cpus == {allowed[0]}
    threads = t["threads"]
    assert attrs["placement_mismatches"] == []
    launch_rows = threads[threads["role"].astype(str) == "launch"]
    assert {parse_cpulist(c) for c in launch_rows["cpus_actual"].astype(str)} == {launch_cpus}
    workers = threads[threads["role"].astype(str) == "loader"]
    worker_masks = {parse_cpulist(c) for c in workers["cpus_actual"].astype(str)}
    if policy == "isolated":
        assert all(not (m & launch_cpus) for m in worker_masks)
    else:
        assert all(launch_cpus <= m for m in worker_masks)
    # What actually ran where: the CPU each loader stage ended on, and the launch thread's
    # last CPU at every sample, stay inside the planned sets.
    loader = t["events/loader"]
    worker_union = set().union(*worker_masks)
    assert set(loader["cpu"].unique()) <= worker_union
    sched = t["samples/sched"]
    launch_tid = int(launch_rows["tid"].iloc[0])
    assert set(sched[sched["tid"] == launch_tid]["cpu"].unique()) <= launch_cpus


def test_impossible_policy_fails_before_the_run_with_the_numbers(
    tmp_path: Path, dataset: Path
) -> None:
    n = len(os.sched_getaffinity(0))
    spec = tiny("combined", pinning__policy="isolated", pinning__launch_cores=n)
    from codl.errors import PlacementError

    with pytest.raises(PlacementError, match=f"launch_cores={n}"):
        launch(spec, trace_path=tmp_path / "t.h5", dataset_dir=dataset)
    assert not (tmp_path / "t.h5").exists()


def test_cosmoflow_reads_hdf5_volumes(tmp_path: Path) -> None:
    volumes = tmp_path / "volumes"
    generate(DatasetSpec(kind="volume", samples=8, height=16, width=16, depth=16), volumes)
    spec = RunSpec.from_dict(
        {
            "mode": "data+compute",
            "workload": {"model": "cosmoflow", "batch_size": 2, "image_size": 16},
            "dataset": {"kind": "volume", "samples": 8, "height": 16, "width": 16, "depth": 16},
            "loader": {"workers": 1},
            "steps": {"warmup": 1, "measured": 2},
        }
    )
    out = run(spec, tmp_path, volumes)
    loader = out["tables"]["events/loader"]
    assert set(loader["stage"].astype(str)) == {"fetch", "decode", "transform", "collate"}
    assert "forward" in phases(out["tables"]["events/app"])


def test_app_level_off_keeps_only_step_spans(tmp_path: Path, dataset: Path) -> None:
    spec = tiny(
        "combined",
        trace__app=False,
        trace__sched=False,
        trace__loader=False,
        trace__compression="gzip",  # and the run's codec reaches its file
    )
    out = run(spec, tmp_path, dataset)
    t = out["tables"]
    assert phases(t["events/app"]) == {"step"}
    assert len(t["events/loader"]) == 0
    assert len(t["samples/sched"]) == 0
    with h5py.File(out["path"], "r") as f:
        assert f["events/app/start_ns"].compression == "gzip"


def test_too_small_data_set_fails_with_a_clear_message(tmp_path: Path) -> None:
    small = tmp_path / "small"
    generate(DatasetSpec(samples=2, height=40, width=48), small)
    spec = tiny("data")
    from codl.errors import CodlError

    with pytest.raises(CodlError, match="fewer than one batch"):
        launch(spec, trace_path=tmp_path / "t.h5", dataset_dir=small)
    assert not (tmp_path / "t.h5").exists()
    assert (tmp_path / "t.incomplete.h5").exists()


def test_rows_streamed_during_the_run_make_the_same_trace(
    tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the recorder handing its rows to the writer after every step, the trace holds every
    step's loader events and schedstat samples exactly once, in step order."""
    from codl.harness import runner

    monkeypatch.setattr(runner, "DRAIN_EVERY_STEPS", 1)
    spec = tiny("data")
    t = run(spec, tmp_path, dataset)["tables"]
    loader, sched = t["events/loader"], t["samples/sched"]
    batch = spec.workload.batch_size
    per_step = loader.groupby("step", observed=True)["stage"].value_counts().unstack()
    assert per_step.index.tolist() == list(range(spec.steps.total))
    assert (per_step[["fetch", "decode", "transform"]] == batch).all().all()
    assert (per_step["collate"] == 1).all()
    assert loader["step"].is_monotonic_increasing
    assert sorted(set(sched["step"])) == list(range(-1, spec.steps.total))
    assert not sched.duplicated(["tid", "step"]).any()
    assert set(loader["pid"]) <= set(t["threads"]["pid"])


def test_a_run_with_sched_events_holds_every_switch_of_its_launch_thread(
    tmp_path: Path, dataset: Path
) -> None:
    """trace.sched_events on a real run (root and tracefs; skipped with the reason elsewhere):
    both tables are written on the run's clock, the launch thread's off-CPU time per measured
    step is at least the run-queue wait its schedstat counters saw (the events miss nothing the
    counters count), and the loader workers - forked before the recorder started - are named."""
    from codl.analysis.offcpu import offcpu_intervals
    from codl.trace import ftrace

    probe = ftrace.SchedEventRecorder(pids=(os.getpid(),), buffer_kb=256)
    try:
        probe.start()
    except ftrace.SchedEventsUnavailableError as exc:
        pytest.skip(str(exc))
    finally:
        probe.close()
    spec = tiny("data+compute", trace__sched_events=True)
    r = run(spec, tmp_path, dataset)
    with open_trace(r["path"]) as t:
        switch, waking = t.table("events/sched_switch"), t.table("events/sched_waking")
        attrs = t.attrs["sched_events"]
    assert attrs["events_lost"] == 0 and 0 <= attrs["clock_offset_bound_ns"] < 1_000_000
    threads = r["tables"]["threads"]
    launch_tid = int(threads[threads["role"] == "launch"]["tid"].iloc[0])
    app = r["tables"]["events/app"]
    steps = app[(app["phase"] == "step") & (app["step"] >= spec.steps.warmup)]
    t0, t1 = int(steps["start_ns"].min()), int(steps["end_ns"].max())
    assert switch["t_ns"].between(t0 - 5_000_000_000, t1 + 5_000_000_000).all()
    iv = offcpu_intervals(switch, waking, tids=[launch_tid])
    inside = iv[(iv["start_ns"] >= t0) & (iv["end_ns"] <= t1)]
    samples = r["tables"]["samples/sched"]
    mine = samples[samples["tid"] == launch_tid].sort_values("t_ns")
    bracket = mine[(mine["t_ns"] >= t0) & (mine["t_ns"] <= t1)]
    counted_wait = int(bracket["wait_ns"].iloc[-1] - bracket["wait_ns"].iloc[0])
    # Interval ends are microsecond stamps: allow 2 us per interval of rounding.
    assert int(inside["runnable_ns"].sum()) + 2_000 * len(inside) >= counted_wait
    workers = set(r["tables"]["events/loader"]["tid"])
    assert workers & (set(switch["prev_tid"]) | set(switch["next_tid"]))


def test_the_runtime_settings_are_applied_recorded_and_given_back(
    tmp_path: Path, dataset: Path
) -> None:
    import sys

    import torch.multiprocessing as tmp

    before = (sys.getswitchinterval(), tmp.get_sharing_strategy())
    spec = tiny(
        "data+compute", runtime__switch_interval_ms=20.0, loader__sharing_strategy="file_system"
    )
    got = run(spec, tmp_path, dataset)
    assert got["attrs"]["switch_interval_s"] == pytest.approx(0.020)
    assert got["attrs"]["sharing_strategy"] == "file_system"
    assert len(got["tables"]["events/loader"])  # the workers handed their batches over
    # One process runs runs one after another (launch of one rank): the next starts clean.
    assert (sys.getswitchinterval(), tmp.get_sharing_strategy()) == before
    default = run(tiny("compute"), tmp_path, dataset)
    assert default["attrs"]["switch_interval_s"] == pytest.approx(before[0])
