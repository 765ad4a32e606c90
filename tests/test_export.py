"""Chrome / Perfetto export: valid JSON, one named track per thread, times faithful to the input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from codl.trace.export import (
    comm_pid,
    comm_tid,
    export_chrome,
    flow_id,
    gpu_pid,
    stream_tid,
    to_chrome_trace,
)
from codl.trace.store import TraceWriter, open_trace

BASE = 7_000_000_000_000  # a realistic CLOCK_MONOTONIC origin: days of uptime, in ns
MAIN, WORKER0, WORKER1 = 4242, 5000, 5001

THREADS = [
    # pid, tid, role, name
    (MAIN, MAIN, "launch", "python3"),
    (MAIN, 4250, "autograd", "pt_autograd_0"),
    (MAIN, 4251, "pin_memory", "pt_pin_memory"),
    (MAIN, 4252, "comm", "nccl ✓"),
    (WORKER0, WORKER0, "loader", "pt_data_worker"),
    (WORKER1, WORKER1, "loader", "pt_data_worker"),
]
# Deliberately not in time order: the exporter must keep each event's own time.
APP = [  # phase, tid, start, end, step
    ("forward", MAIN, 1_000, 6_500, 0),
    ("data_wait", MAIN, 0, 1_000, 0),
    ("backward", 4250, 6_500, 20_001, 0),
    ("forward", MAIN, 30_000, 35_000, 1),
]
LOADER = [  # worker, pid, stage, item, start, end
    (0, WORKER0, "fetch", 17, 100, 400),
    (0, WORKER0, "decode", 17, 400, 900),
    (1, WORKER1, "fetch", 18, 150, 300),
    (1, WORKER1, "collate", -1, 950, 990),
]
CUDA = [  # kind, name, tid, stream, start, end
    ("runtime", "cudaLaunchKernel", MAIN, -1, 1_100, 1_105),
    ("kernel", "gemm", 0, 7, 1_200, 3_000),
    ("memcpy", "Memcpy HtoD", 0, 13, 900, 1_000),
]
SCHED = [  # t_ns, tid, wait_ns (cumulative)
    (0, MAIN, 1_000),
    (10_000, MAIN, 1_600),
    (20_000, MAIN, 4_600),
]


def write_trace(path: Path, **attrs: Any) -> Path:
    with TraceWriter(path) as w:
        w.set_attrs(
            **attrs,
            run_id="exp0rt",
            anchors_start={
                "realtime_ns": 1_700_000_000 * 10**9,
                "monotonic_ns": BASE,
                "error_ns": 50,
            },
        )
        w.append(
            "threads",
            {
                "t_ns": [BASE] * len(THREADS),
                "rank": [0] * len(THREADS),
                "pid": [t[0] for t in THREADS],
                "tid": [t[1] for t in THREADS],
                "role": [t[2] for t in THREADS],
                "name": [t[3] for t in THREADS],
                "cpus_planned": [""] * len(THREADS),
                "cpus_actual": ["0-7"] * len(THREADS),
            },
        )
        w.append(
            "events/app",
            {
                "rank": [0] * len(APP),
                "step": [a[4] for a in APP],
                "phase": [a[0] for a in APP],
                "tid": [a[1] for a in APP],
                "start_ns": [BASE + a[2] for a in APP],
                "end_ns": [BASE + a[3] for a in APP],
                "gpu_ns": [5_000, -1, 13_000, 4_900],
            },
        )
        w.append(
            "events/loader",
            {
                "rank": [0] * len(LOADER),
                "step": [0] * len(LOADER),
                "worker": [r[0] for r in LOADER],
                "pid": [r[1] for r in LOADER],
                "tid": [r[1] for r in LOADER],
                "cpu": [10, 10, 11, 11],
                "item": [r[3] for r in LOADER],
                "stage": [r[2] for r in LOADER],
                "start_ns": [BASE + r[4] for r in LOADER],
                "end_ns": [BASE + r[5] for r in LOADER],
            },
        )
        w.append(
            "events/cuda",
            {
                "rank": [0] * len(CUDA),
                "step": [0] * len(CUDA),
                "kind": [c[0] for c in CUDA],
                "name": [c[1] for c in CUDA],
                "tid": [c[2] for c in CUDA],
                "stream": [c[3] for c in CUDA],
                "correlation": [1, 1, 2],
                "start_ns": [BASE + c[4] for c in CUDA],
                "end_ns": [BASE + c[5] for c in CUDA],
            },
        )
        w.append(
            "events/comm",
            {
                "rank": [0],
                "step": [0],
                "bucket": [3],
                "op": ["allreduce"],
                "bytes": [25 << 20],
                "start_ns": [BASE + 20_000],
                "end_ns": [BASE + 26_000],
                "gpu_ns": [5_500],
            },
        )
        w.append(
            "samples/sched",
            {
                "t_ns": [BASE + s[0] for s in SCHED],
                "rank": [0] * len(SCHED),
                "step": [-1, 0, 1],
                "pid": [MAIN] * len(SCHED),
                "tid": [s[1] for s in SCHED],
                "run_ns": [0, 8_000, 17_000],
                "wait_ns": [s[2] for s in SCHED],
                "timeslices": [1, 5, 9],
                "voluntary": [0, 1, 2],
                "involuntary": [0, 0, 1],
                "cpu": [0, 0, 1],
            },
        )
        w.append(
            "samples/device",
            {
                "t_ns": [BASE, BASE + 20_000],
                "rank": [0, 0],
                "step": [-1, 0],
                "gpu": [0, 0],
                "util_pct": [0, 97],
                "mem_util_pct": [0, 40],
                "mem_used": [1 << 30, 30 << 30],
                "sm_clock": [1980, 1980],
                "power": [90_000, 650_000],
            },
        )
        return w.finish()


@pytest.fixture(params=["plain", "with space", "ünïcødé ✓"])
def exported(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    d = tmp_path / str(request.param)
    d.mkdir()
    out = export_chrome(write_trace(d / "trace.h5"), d / "trace perfetto.json")
    assert out == d / "trace perfetto.json"
    assert not (d / "trace perfetto.json.partial").exists()
    # Strict JSON: no NaN or Infinity, which Perfetto's parser rejects.
    doc: dict[str, Any] = json.loads(
        out.read_text(encoding="utf-8"),
        parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"),
    )
    return doc


def events(doc: dict[str, Any], ph: str, cat: str | None = None) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph and (cat is None or e.get("cat") == cat)]


def test_document_shape(exported: dict[str, Any]) -> None:
    assert isinstance(exported["traceEvents"], list)
    # Perfetto takes displayTimeUnit "ns" as the unit of ts; ours is the default, microseconds.
    assert "displayTimeUnit" not in exported
    other = exported["otherData"]
    assert other["run_id"] == "exp0rt"
    assert int(other["time_base_monotonic_ns"]) == BASE  # the earliest timestamp of all tables
    assert int(other["time_base_unix_ns"]) == 1_700_000_000 * 10**9
    for e in exported["traceEvents"]:
        assert isinstance(e["pid"], int)
        assert e["ph"] in {"M", "X", "C", "s", "f", "i"}
        if e["ph"] != "M":
            assert isinstance(e["ts"], float)
        if e["ph"] in {"X", "M", "s", "f"}:
            assert isinstance(e["tid"], int)


def test_one_thread_name_per_thread(exported: dict[str, Any]) -> None:
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events(exported, "M")
             if e["name"] == "thread_name"}  # fmt: skip
    counts = Counter(
        (e["pid"], e["tid"]) for e in events(exported, "M") if e["name"] == "thread_name"
    )
    assert max(counts.values()) == 1
    for pid, tid, role, name in THREADS:
        assert names[(pid, tid)] == f"{role}: {name}"


def test_processes_are_named_by_rank_worker_gpu_and_comm(exported: dict[str, Any]) -> None:
    procs = {
        e["pid"]: e["args"]["name"] for e in events(exported, "M") if e["name"] == "process_name"
    }
    assert procs[MAIN] == "rank 0"
    assert procs[WORKER0] == "rank 0 loader worker 0"
    assert procs[WORKER1] == "rank 0 loader worker 1"
    assert procs[gpu_pid(0)] == "GPU rank 0"
    assert procs[comm_pid(0)] == "comm rank 0"
    assert len(set(procs.values())) == len(procs)


def _check_times(xs: list[dict[str, Any]], spans: list[tuple[int, int]]) -> None:
    """Exported X events match input spans one to one, with ts/dur exact to the ns."""
    got = sorted((round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in xs)
    assert got == sorted((s, e - s) for s, e in spans)
    # Time order of the output agrees with the input's start times.
    ts = [e["ts"] for e in xs]
    assert ts == sorted(ts)


def test_app_events(exported: dict[str, Any]) -> None:
    xs = events(exported, "X", "app")
    _check_times(xs, [(a[2], a[3]) for a in APP])
    by_start = {round(e["ts"] * 1000): e for e in xs}
    for phase, tid, start, _, step in APP:
        e = by_start[start]
        assert (e["name"], e["tid"], e["pid"], e["args"]["step"]) == (phase, tid, MAIN, step)
    assert "gpu_ns" not in by_start[0]["args"]  # -1 means not measured
    assert by_start[6_500]["args"]["gpu_ns"] == 13_000


def test_loader_events(exported: dict[str, Any]) -> None:
    xs = events(exported, "X", "loader")
    _check_times(xs, [(r[4], r[5]) for r in LOADER])
    by_start = {round(e["ts"] * 1000): e for e in xs}
    for worker, pid, stage, item, start, _ in LOADER:
        e = by_start[start]
        assert (e["name"], e["pid"], e["tid"]) == (stage, pid, pid)
        assert (e["args"]["item"], e["args"]["worker"]) == (item, worker)


def test_cuda_runtime_on_host_thread_and_kernels_on_gpu_streams(exported: dict[str, Any]) -> None:
    xs = events(exported, "X", "cuda")
    _check_times(xs, [(c[4], c[5]) for c in CUDA])
    where = {e["name"]: (e["pid"], e["tid"]) for e in xs}
    assert where["cudaLaunchKernel"] == (MAIN, MAIN)
    assert where["gemm"] == (gpu_pid(0), stream_tid(0, 7))
    assert where["Memcpy HtoD"] == (gpu_pid(0), stream_tid(0, 13))
    stream_names = {e["tid"]: e["args"]["name"] for e in events(exported, "M")
                    if e["name"] == "thread_name" and e["pid"] == gpu_pid(0)}  # fmt: skip
    assert stream_names == {stream_tid(0, 7): "stream 7", stream_tid(0, 13): "stream 13"}


def test_comm_events(exported: dict[str, Any]) -> None:
    (x,) = events(exported, "X", "comm")
    assert x["tid"] == comm_tid(0)
    assert (x["pid"], x["name"], x["args"]["bucket"], x["args"]["bytes"]) == (
        comm_pid(0),
        "allreduce",
        3,
        25 << 20,
    )
    assert (x["ts"], x["dur"]) == (20.0, 6.0)


def test_counters(exported: dict[str, Any]) -> None:
    waits = [(e["ts"], e["args"]["wait_ns"]) for e in events(exported, "C")
             if e["name"].startswith("run-queue wait")]  # fmt: skip
    # Deltas of the cumulative counter, each placed at the start of the interval it covers.
    assert waits == [(0.0, 600.0), (10.0, 3000.0), (20.0, 0.0)]
    assert {e["pid"] for e in events(exported, "C") if e["name"].startswith("run-queue")} == {MAIN}
    util = [(e["ts"], e["args"]["util_pct"]) for e in events(exported, "C")
            if e["name"] == "GPU 0 util_pct"]  # fmt: skip
    assert util == [(0.0, 0.0), (20.0, 97.0)]


def test_all_events_sorted_after_metadata(exported: dict[str, Any]) -> None:
    phs = [e["ph"] for e in exported["traceEvents"]]
    first_non_meta = next(i for i, p in enumerate(phs) if p != "M")
    assert all(p != "M" for p in phs[first_non_meta:])
    ts = [e["ts"] for e in exported["traceEvents"][first_non_meta:]]
    assert ts == sorted(ts)


def test_window_exports_only_overlapping_events(tmp_path: Path) -> None:
    with open_trace(write_trace(tmp_path / "t.h5")) as t:
        doc = to_chrome_trace(t, t0=BASE + 25_000, t1=BASE + 40_000)
    xs = [e for e in events(doc, "X") if e["cat"] != "axis"]
    assert sorted(e["name"] for e in xs) == ["allreduce", "forward"]
    # The time axis is the trace's, not the window's: here its earliest event (no t_begin_ns).
    assert int(doc["otherData"]["time_base_monotonic_ns"]) == BASE
    assert doc["otherData"]["time_base"] == "earliest event"
    (window,) = [e for e in events(doc, "X") if e["cat"] == "axis"]
    assert (window["ts"], window["dur"]) == (25.0, 15.0)
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc


def test_empty_trace_exports(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.h5") as w:
        w.finish()
    out = export_chrome(tmp_path / "t.h5", tmp_path / "t.json")
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["traceEvents"] == []


def test_cli_export_window_in_seconds_since_the_run_began(tmp_path: Path) -> None:
    from codl.cli import main

    begin = BASE - 3_000
    trace = write_trace(tmp_path / "t.h5", t_begin_ns=begin)
    with open_trace(trace) as t:
        whole = to_chrome_trace(t, t0=BASE + 25_000, t1=BASE + 40_000)
    out = tmp_path / "w.json"
    frm, to = (BASE + 25_000 - begin) / 1e9, (BASE + 40_000 - begin) / 1e9
    assert main(["export", str(trace), "-o", str(out), "--from", repr(frm), "--to", repr(to)]) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert sorted(e["name"] for e in events(doc, "X", "app") + events(doc, "X", "comm")) == [
        "allreduce",
        "forward",
    ]
    assert doc["traceEvents"] == whole["traceEvents"]


def _innermost(doc: dict[str, Any], pid: int, tid: int, ts: float) -> dict[str, Any]:
    """The innermost X event on the track (pid, tid) whose span holds ``ts``: the slice a flow
    event there binds to (the top of the track's slice stack)."""
    holding = [
        e
        for e in events(doc, "X")
        if (e["pid"], e["tid"]) == (pid, tid) and e["ts"] <= ts <= e["ts"] + e["dur"]
    ]
    assert holding, (pid, tid, ts)
    return max(holding, key=lambda e: (e["ts"], -e["dur"]))


def test_flows_go_from_each_launch_to_its_kernel(exported: dict[str, Any]) -> None:
    starts, ends = events(exported, "s", "launch"), events(exported, "f", "launch")
    # Correlation 1: cudaLaunchKernel -> gemm; correlation 2 has device work but no runtime call
    # (the memcpy was not launched through the traced API): no flow.
    assert [e["id"] for e in starts] == [e["id"] for e in ends] == [flow_id(0, 1)]
    (s,), (f,) = starts, ends
    assert f["bp"] == "e"
    # Each end binds to exactly the slice it names, by Perfetto's rules: "s" to the slice open on
    # its thread at its time, "f" with bp "e" to the slice enclosing its time.
    launch = _innermost(exported, s["pid"], s["tid"], s["ts"])
    kernel = _innermost(exported, f["pid"], f["tid"], f["ts"])
    assert (launch["name"], kernel["name"]) == ("cudaLaunchKernel", "gemm")
    assert launch["args"]["correlation"] == kernel["args"]["correlation"] == 1
    assert s["ts"] == launch["ts"] and f["ts"] == kernel["ts"]


def test_every_track_has_a_sort_index_in_role_order(exported: dict[str, Any]) -> None:
    meta = events(exported, "M")
    named = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    order = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in meta
             if e["name"] == "thread_sort_index"}  # fmt: skip
    assert set(order) == named
    assert all(isinstance(v, int) for v in order.values())
    # In the rank's process: the main (launch) thread, autograd, pin_memory, comm.
    host = [order[(MAIN, t)] for t in (MAIN, 4250, 4251, 4252)]
    assert host == sorted(host) and len(set(host)) == len(host)
    procs = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
    assert procs[MAIN] < procs[WORKER0] == procs[WORKER1] < procs[gpu_pid(0)] < procs[comm_pid(0)]
    assert order[(gpu_pid(0), stream_tid(0, 7))] < order[(gpu_pid(0), stream_tid(0, 13))]


def test_two_ranks_get_distinct_tracks_and_names(tmp_path: Path) -> None:
    """A merged two-rank trace: every process and track of rank 1 is told apart from rank 0's
    by name and by tid (Perfetto's JSON importer keys threads by tid alone)."""
    path = tmp_path / "two.h5"
    with TraceWriter(path) as w:
        w.set_attrs(run_id="tw0rnk")
        threads = [(0, 100, 100, "launch"), (0, 200, 200, "loader"),
                   (1, 300, 300, "launch"), (1, 400, 400, "loader")]  # fmt: skip
        w.append(
            "threads",
            {
                "t_ns": [BASE] * 4,
                "rank": [t[0] for t in threads],
                "pid": [t[1] for t in threads],
                "tid": [t[2] for t in threads],
                "role": [t[3] for t in threads],
                "name": ["python3", "pt_data_worker"] * 2,
                "cpus_planned": [""] * 4,
                "cpus_actual": ["0"] * 4,
            },
        )
        w.append(
            "events/loader",
            {
                "rank": [0, 1],
                "worker": [0, 0],
                "pid": [200, 400],
                "tid": [200, 400],
                "stage": ["fetch", "fetch"],
                "item": [1, 2],
                "step": [0, 0],
                "cpu": [0, 1],
                "start_ns": [BASE, BASE + 10],
                "end_ns": [BASE + 5, BASE + 20],
            },
        )
        cuda = [(r, k, n, tid, st, c) for r, tid in ((0, 100), (1, 300))
                for k, n, st, c in (("runtime", "cudaLaunchKernel", -1, 5),
                                    ("kernel", "gemm", 7, 5))]  # fmt: skip
        w.append(
            "events/cuda",
            {
                "rank": [c[0] for c in cuda],
                "kind": [c[1] for c in cuda],
                "name": [c[2] for c in cuda],
                "tid": [c[3] for c in cuda],
                "stream": [c[4] for c in cuda],
                "correlation": [c[5] for c in cuda],
                "step": [0] * len(cuda),
                "start_ns": [BASE + 100, BASE + 200] * 2,
                "end_ns": [BASE + 110, BASE + 300] * 2,
            },
        )
        w.append(
            "events/comm",
            {
                "rank": [0, 1],
                "op": ["allreduce"] * 2,
                "bucket": [0, 0],
                "bytes": [8, 8],
                "step": [0, 0],
                "gpu_ns": [-1, -1],
                "start_ns": [BASE + 400] * 2,
                "end_ns": [BASE + 500] * 2,
            },
        )
        w.finish()
    with open_trace(path) as t:
        doc = json.loads(json.dumps(to_chrome_trace(t), allow_nan=False))
    procs = {e["pid"]: e["args"]["name"] for e in events(doc, "M") if e["name"] == "process_name"}
    assert procs[200] == "rank 0 loader worker 0" and procs[400] == "rank 1 loader worker 0"
    assert len(set(procs.values())) == len(procs)
    tracks = [(e["pid"], e["tid"]) for e in events(doc, "M") if e["name"] == "thread_name"]
    tids = [tid for _, tid in tracks]
    assert len(set(tids)) == len(tids), tracks  # no tid shared by two tracks
    assert all(0 <= tid < 2**32 for tid in tids)  # Perfetto coerces tids to uint32
    for x in events(doc, "X"):
        assert (x["pid"], x["tid"]) in tracks, x
    # One flow per rank, each from that rank's launch to that rank's kernel.
    ids = sorted(e["id"] for e in events(doc, "s"))
    assert ids == sorted(e["id"] for e in events(doc, "f")) == [flow_id(0, 5), flow_id(1, 5)]
    for f in events(doc, "f"):
        rank = f["id"] >> 32
        assert (f["pid"], f["tid"]) == (gpu_pid(rank), stream_tid(rank, 7))
        assert max(ids) < 2**53  # exact as a JSON double
