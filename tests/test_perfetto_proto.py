"""Perfetto protobuf export: read back with Perfetto's own message definitions.

The parser is the protobuf runtime with the ``perfetto`` package's generated descriptors
(``perfetto_trace_pb2``): Perfetto's trace processor is a native binary the package downloads
on first use, which no test here can. The reader below rebuilds what the trace processor
would: interned names resolved in packet order (an id used before its definition fails),
slices from BEGIN/END pairs as a per-track stack over packets sorted by time (ties in file
order, as the trace processor's sorter breaks them: by timestamp, then position), flows from
``flow_ids``/``terminating_flow_ids``, counters per counter track.
"""

from __future__ import annotations

import io
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pb = pytest.importorskip(
    "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
    reason="the perfetto package (codl[perfetto]) is not installed",
)

from codl.errors import CodlError  # noqa: E402
from codl.trace import perfetto_proto  # noqa: E402
from codl.trace.export import TimePoint, comm_pid, gpu_pid, to_chrome_trace  # noqa: E402
from codl.trace.perfetto_proto import export_perfetto, write_perfetto  # noqa: E402
from codl.trace.store import TraceWriter, open_trace  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_export import APP, BASE, CUDA, LOADER, MAIN, WORKER0, WORKER1, write_trace  # noqa: E402


@dataclass
class Track:
    uuid: int
    name: str
    pid: int | None = None
    tid: int | None = None
    parent: int | None = None
    order: int | None = None
    counter: bool = False
    labels: list[str] = field(default_factory=list)


@dataclass
class Slice:
    track: int
    name: str
    cat: str
    start: int
    end: int
    args: dict[str, Any]
    flows: list[int]
    ends_flow: list[int]


@dataclass
class Parsed:
    packets: int
    root: Any
    clock: Any
    tracks: dict[int, Track]
    slices: list[Slice]
    counters: dict[int, list[tuple[int, int]]]
    instants: list[Slice] = field(default_factory=list)

    def track_named(self, name: str) -> Track:
        (t,) = [t for t in self.tracks.values() if t.name == name]
        return t

    def zero_monotonic(self) -> int:
        """The CLOCK_MONOTONIC ns of the time axis's 0, from its instant there."""
        (mark,) = [i for i in self.instants if i.cat == "axis"]
        assert mark.start == 0
        return int(mark.args["monotonic_ns"])

    def where(self, s: Slice) -> str:
        return self.where_track(s.track)

    def where_track(self, uuid: int) -> str:
        t = self.tracks[uuid]
        return t.name if t.parent is None else f"{self.tracks[t.parent].name}/{t.name}"

    def flow_pairs(self) -> list[tuple[Slice, Slice]]:
        starts = {f: s for s in self.slices for f in s.flows}
        return [(starts[f], s) for s in self.slices for f in s.ends_flow]


def parse(data: bytes) -> Parsed:
    trace = pb.Trace()
    trace.ParseFromString(data)
    interned: dict[str, dict[int, str]] = {}
    tracks: dict[int, Track] = {}
    root = clock = None
    timed: list[tuple[int, int, Any, dict[str, dict[int, str]]]] = []
    state_ok = False
    for n, p in enumerate(trace.packet):
        assert p.trusted_packet_sequence_id == 1
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            state_ok = True
            assert p.trace_packet_defaults.timestamp_clock_id == pb.BUILTIN_CLOCK_MONOTONIC
        for kind in ("event_names", "event_categories", "debug_annotation_names"):
            for e in getattr(p.interned_data, kind):
                assert e.iid not in interned.setdefault(kind, {}), "iid defined twice"
                interned[kind][e.iid] = e.name
        if p.HasField("clock_snapshot"):
            clock = p.clock_snapshot
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.uuid == 0:
                root = d
                continue
            assert d.uuid not in tracks, "track described twice"
            t = Track(d.uuid, d.name, order=d.sibling_order_rank)
            if d.HasField("process"):
                t.name, t.pid = d.process.process_name, d.process.pid
                t.labels = list(d.process.process_labels)
            if d.HasField("thread"):
                t.name, t.pid, t.tid = d.thread.thread_name, d.thread.pid, d.thread.tid
            if d.HasField("parent_uuid"):
                assert d.parent_uuid in tracks, "parent described after its child"
                t.parent = d.parent_uuid
            t.counter = d.HasField("counter")
            tracks[d.uuid] = t
        if p.HasField("track_event"):
            assert state_ok and p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            assert p.track_event.track_uuid in tracks, "event before its track's descriptor"
            # Names resolved now, in packet order, as the trace processor's tokenizer does.
            timed.append((p.timestamp, n, p.track_event, {k: dict(v) for k, v in interned.items()}))
    slices: list[Slice] = []
    instants: list[Slice] = []
    counters: dict[int, list[tuple[int, int]]] = {}
    stacks: dict[int, list[tuple[int, Any, dict[str, dict[int, str]]]]] = {}
    for ts, _, ev, names in sorted(timed, key=lambda x: (x[0], x[1])):
        if ev.type == pb.TrackEvent.TYPE_COUNTER:
            assert tracks[ev.track_uuid].counter
            counters.setdefault(ev.track_uuid, []).append((ts, ev.counter_value))
        elif ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks.setdefault(ev.track_uuid, []).append((ts, ev, names))
        elif ev.type == pb.TrackEvent.TYPE_INSTANT:
            args = {names["debug_annotation_names"][a.name_iid]: a.int_value
                    for a in ev.debug_annotations}  # fmt: skip
            (cat,) = [names["event_categories"][c] for c in ev.category_iids]
            name = names["event_names"][ev.name_iid]
            instants.append(Slice(ev.track_uuid, name, cat, ts, ts, args, [], []))
        else:
            assert ev.type == pb.TrackEvent.TYPE_SLICE_END
            start, b, nm = stacks[ev.track_uuid].pop()
            args = {
                nm["debug_annotation_names"][a.name_iid]: (
                    a.string_value if a.HasField("string_value") else a.int_value
                )
                for a in b.debug_annotations
            }
            (cat,) = [nm["event_categories"][c] for c in b.category_iids]
            slices.append(
                Slice(
                    ev.track_uuid, nm["event_names"][b.name_iid], cat, start, ts, args,
                    list(b.flow_ids), list(b.terminating_flow_ids),
                )
            )  # fmt: skip
    assert not any(stacks.values()), "a slice never ended"
    return Parsed(len(trace.packet), root, clock, tracks, slices, counters, instants)


@pytest.fixture
def exported(tmp_path: Path) -> Parsed:
    out = export_perfetto(write_trace(tmp_path / "trace.h5"), tmp_path / "trace.pftrace")
    return parse(out.read_bytes())


def test_clock_root_ordering_and_process_names(exported: Parsed) -> None:
    assert exported.clock.primary_trace_clock == pb.BUILTIN_CLOCK_MONOTONIC
    clocks = {c.clock_id: c.timestamp for c in exported.clock.clocks}
    # The axis's 0 (the trace's earliest event, BASE: it has no t_begin_ns) in Unix time.
    assert clocks == {pb.BUILTIN_CLOCK_MONOTONIC: 0, pb.BUILTIN_CLOCK_REALTIME: 1_700 * 10**15}
    assert exported.root.process_ordering == pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
    assert exported.root.thread_ordering == pb.TrackDescriptor.THREAD_ORDERING_EXPLICIT
    procs = {t.pid: t for t in exported.tracks.values() if t.tid is None and t.pid is not None}
    assert procs[MAIN].name == "rank 0"
    assert procs[WORKER0].name == "rank 0 loader worker 0" and procs[WORKER0].labels == ["rank 0"]
    assert procs[WORKER1].name == "rank 0 loader worker 1"
    assert procs[gpu_pid(0)].name == "GPU rank 0" and procs[comm_pid(0)].name == "comm rank 0"
    threads = {(t.pid, t.tid): t.name for t in exported.tracks.values() if t.tid is not None}
    assert threads[(MAIN, 4252)] == "comm: nccl ✓"
    assert threads[(WORKER0, WORKER0)] == "loader: pt_data_worker"  # /threads names it


def test_sort_order_is_the_json_exports(tmp_path: Path, exported: Parsed) -> None:
    """Every process and thread track's sibling_order_rank is the sort index the Chrome JSON
    gives it, and streams sort by id under their GPU process."""
    with open_trace(write_trace(tmp_path / "j.h5")) as t:
        meta = [e for e in to_chrome_trace(t)["traceEvents"] if e["ph"] == "M"]
    json_procs = {e["pid"]: e["args"]["sort_index"] for e in meta
                  if e["name"] == "process_sort_index"}  # fmt: skip
    json_threads = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in meta
                    if e["name"] == "thread_sort_index" and e["tid"] < 2**31}  # fmt: skip
    tracks = exported.tracks.values()
    procs = {t.pid: t.order for t in tracks if t.tid is None and t.pid is not None}
    threads = {(t.pid, t.tid): t.order for t in tracks if t.tid is not None}
    assert procs == json_procs
    assert threads == json_threads
    gpu = next(t for t in tracks if t.pid == gpu_pid(0))
    streams = {t.name: t.order for t in tracks if t.parent == gpu.uuid and not t.counter}
    assert streams == {"stream 7": 7, "stream 13": 13}


def test_every_event_exact_in_ns_on_its_track(exported: Parsed) -> None:
    by_cat = Counter(s.cat for s in exported.slices)
    assert by_cat == {"app": len(APP), "loader": len(LOADER), "cuda": len(CUDA), "comm": 1}
    app = sorted((exported.where(s), s.name, s.start, s.end, s.args["step"])
                 for s in exported.slices if s.cat == "app")  # fmt: skip
    names = {MAIN: "launch: python3", 4250: "autograd: pt_autograd_0"}
    assert app == sorted((names[a[1]], a[0], a[2], a[3], a[4]) for a in APP)
    gpu_ns = {s.name + str(s.start): s.args.get("gpu_ns") for s in exported.slices
              if s.cat == "app"}  # fmt: skip
    assert gpu_ns["data_wait0"] is None and gpu_ns["forward1000"] == 5_000
    loader = sorted((exported.where(s), s.name, s.start, s.end, s.args["item"])
                    for s in exported.slices if s.cat == "loader")  # fmt: skip
    assert loader == sorted(("loader: pt_data_worker", r[2], r[4], r[5], r[3]) for r in LOADER)
    cuda = {s.name: (exported.where(s), s.args["kind"]) for s in exported.slices
            if s.cat == "cuda"}  # fmt: skip
    assert cuda == {
        "cudaLaunchKernel": ("launch: python3", "runtime"),
        "gemm": ("GPU rank 0/stream 7", "kernel"),
        "Memcpy HtoD": ("GPU rank 0/stream 13", "memcpy"),
    }
    (comm,) = [s for s in exported.slices if s.cat == "comm"]
    assert exported.where(comm) == "comm rank 0/collectives"
    assert (comm.start, comm.end, comm.args["bytes"]) == (20_000, 26_000, 25 << 20)


def test_flow_from_launch_to_kernel_only(exported: Parsed) -> None:
    pairs = [(a.name, b.name) for a, b in exported.flow_pairs()]
    assert pairs == [("cudaLaunchKernel", "gemm")]  # the memcpy's correlation has no call
    assert sum(len(s.flows) for s in exported.slices) == 1


def test_counters_match_the_json_export(exported: Parsed) -> None:
    wait = exported.track_named("run-queue wait launch: python3 [4242]")
    assert exported.tracks[wait.parent or 0].pid == MAIN
    # Cumulative waits 1000, 1600, 4600 -> per-interval 600, 3000, and 0 closing the track.
    assert exported.counters[wait.uuid] == [(0, 600), (10_000, 3_000), (20_000, 0)]
    power = exported.track_named("GPU 0 power")
    assert exported.counters[power.uuid] == [(0, 90_000), (20_000, 650_000)]


def _flow_trace(path: Path, n: int) -> Path:
    """Two ranks, ``n`` launches each: a launch of one kernel, a graph launch of three kernels
    sharing its correlation, a correlation reported by two calls (the flow starts at the
    last), an event record with no device work, and a kernel whose call is not in the trace."""
    rows: list[tuple[int, str, str, int, int, int, int]] = []  # rank kind name tid stream corr t
    for rank in (0, 1):
        tid = 100 + rank
        for i in range(n):
            t = 10_000 * i
            c = 10 * i + 1
            rows += [
                (rank, "runtime", "cudaLaunchKernel", tid, -1, c, t),
                (rank, "runtime", "cudaGraphLaunch", tid, -1, c + 1, t + 10),
                (rank, "runtime", "cuLaunchKernel", tid, -1, c + 2, t + 20),
                (rank, "runtime", "cudaLaunchKernel", tid, -1, c + 2, t + 30),
                (rank, "runtime", "cudaEventRecord", tid, -1, c + 3, t + 40),
                (rank, "kernel", f"k{i}", 0, 7, c, t + 2_000),
                (rank, "kernel", f"g{i}a", 0, 7, c + 1, t + 3_000),
                (rank, "kernel", f"g{i}b", 0, 7, c + 1, t + 4_000),
                (rank, "kernel", f"g{i}c", 0, 7, c + 1, t + 5_000),
                (rank, "kernel", f"d{i}", 0, 9, c + 2, t + 6_000),
                (rank, "kernel", f"orphan{i}", 0, 9, c + 9, t + 7_000),
            ]
    rows.sort(key=lambda r: r[6])
    with TraceWriter(path) as w:
        w.set_attrs(run_id="fl0ws0")
        w.append(
            "events/cuda",
            {
                "rank": [r[0] for r in rows],
                "step": [0] * len(rows),
                "kind": [r[1] for r in rows],
                "name": [r[2] for r in rows],
                "tid": [r[3] for r in rows],
                "stream": [r[4] for r in rows],
                "correlation": [r[5] for r in rows],
                "start_ns": [BASE + r[6] for r in rows],
                "end_ns": [BASE + r[6] + 5 for r in rows],
            },
        )
        return w.finish()


@pytest.mark.parametrize("batch", [3, 7, perfetto_proto._BATCH_ROWS])
def test_flows_across_batches_match_the_json_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """Batches smaller than the distance from a launch to its kernels: the flows are still
    exactly the JSON export's (each launch to each of its kernels, from the last call that
    reported the correlation), whatever the batch size."""
    monkeypatch.setattr(perfetto_proto, "_BATCH_ROWS", batch)
    path = _flow_trace(tmp_path / "f.h5", 6)
    with open_trace(path) as t:
        doc = json.loads(json.dumps(to_chrome_trace(t)))
        got = parse(_write(t))
    # Both on the one time axis: ns (protobuf) and us (JSON) from the same zero.
    assert int(doc["otherData"]["time_base_monotonic_ns"]) == got.zero_monotonic()

    def ns(e: dict[str, Any]) -> int:
        return round(e["ts"] * 1000)

    starts = {e["id"]: ns(e) for e in doc["traceEvents"] if e["ph"] == "s"}
    want = sorted((starts[e["id"]], ns(e)) for e in doc["traceEvents"] if e["ph"] == "f")
    pairs = got.flow_pairs()
    assert sorted((a.start, b.start) for a, b in pairs) == want
    assert len(want) == 2 * 6 * 5  # per rank and round: 1 + 3 + 1 flows
    for a, b in pairs:
        assert a.args["correlation"] == b.args["correlation"]
        rank = got.tracks[got.tracks[b.track].parent or 0].pid - gpu_pid(0)  # type: ignore[operator]
        assert got.tracks[a.track].tid == 100 + rank  # the launch on its own rank's thread
    # The first of two calls sharing a correlation starts nothing; no flow id is reused.
    assert not [s for s in got.slices if s.name == "cuLaunchKernel" and s.flows]
    ids = [f for s in got.slices for f in s.flows]
    assert len(ids) == len(set(ids)) == len(want)


class _Recorder(io.RawIOBase):
    def __init__(self) -> None:
        self.writes: list[int] = []
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.writes.append(len(b))
        self.data += bytes(b)
        return len(b)


def _write(trace: Any, **window: int | None) -> bytes:
    rec = _Recorder()
    write_perfetto(trace, rec, **window)  # type: ignore[arg-type]
    return bytes(rec.data)


def test_streams_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch is written before the next is built: many writes, none holding the
    trace, and the concatenated messages parse as one trace with every event."""
    monkeypatch.setattr(perfetto_proto, "_BATCH_ROWS", 4)
    path = _flow_trace(tmp_path / "f.h5", 20)
    rec = _Recorder()
    with open_trace(path) as t:
        stats = write_perfetto(t, rec)  # type: ignore[arg-type]
        rows = len(t.table("events/cuda"))
    assert stats.slices == rows == 2 * 20 * 11
    assert len(rec.writes) >= rows // 4 and max(rec.writes) < len(rec.data) / 20
    assert stats.bytes == len(rec.data)
    got = parse(bytes(rec.data))
    assert len(got.slices) == rows and got.packets == stats.packets


def test_nesting_survives_equal_starts(tmp_path: Path) -> None:
    """A phase and a call that start at the same ns on one thread: the longer encloses the
    shorter whatever their order in the table."""
    with TraceWriter(tmp_path / "n.h5") as w:
        w.set_attrs(run_id="n3st00")
        w.append(
            "events/app",
            {
                "rank": [0, 0, 0],
                "step": [0, 0, 0],
                "phase": ["forward", "step", "backward"],
                "tid": [MAIN] * 3,
                "start_ns": [BASE, BASE, BASE + 50],
                "end_ns": [BASE + 50, BASE + 100, BASE + 100],
                "gpu_ns": [-1] * 3,
            },
        )
        path = w.finish()
    with open_trace(path) as t:
        got = parse(_write(t))
    spans = sorted((s.name, s.start, s.end) for s in got.slices)
    assert spans == [("backward", 50, 100), ("forward", 0, 50), ("step", 0, 100)]


def test_window_and_empty_window(tmp_path: Path) -> None:
    from codl.cli import main

    begin = BASE - 3_000
    trace = write_trace(tmp_path / "trace.h5", t_begin_ns=begin)
    out = tmp_path / "w.pftrace"
    frm, to = (BASE + 25_000 - begin) / 1e9, (BASE + 40_000 - begin) / 1e9
    args = ["export", str(trace), "-o", str(out), "--format", "perfetto-proto"]
    assert main([*args, "--from", repr(frm), "--to", repr(to)]) == 0
    got = parse(out.read_bytes())
    assert sorted(s.name for s in got.slices if s.cat != "axis") == ["allreduce", "forward"]
    far = tmp_path / "far.pftrace"
    with pytest.raises(CodlError, match="no event in the window"):
        export_perfetto(trace, far, start=TimePoint(10**15), end=TimePoint(10**15 + 10**9))
    assert not far.exists() and not list(tmp_path.glob(".codl-unit.*"))


def test_missing_package_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "perfetto.protos.perfetto.trace.perfetto_trace_pb2", None)
    out = tmp_path / "x.pftrace"
    with pytest.raises(CodlError, match=r"codl\[perfetto\]"):
        export_perfetto(write_trace(tmp_path / "t.h5"), out)
    assert not out.exists()


def test_two_ranks_sort_rank_by_rank(tmp_path: Path) -> None:
    path = _flow_trace(tmp_path / "f.h5", 1)
    with open_trace(path) as t:
        got = parse(_write(t))
    order = {t.name: t.order for t in got.tracks.values() if t.name.startswith("GPU rank")}
    assert order == {"GPU rank 0": 2, "GPU rank 1": 6}
    streams = {(got.tracks[t.parent].name, t.name) for t in got.tracks.values() if t.parent}
    assert streams == {(f"GPU rank {r}", f"stream {s}") for r in (0, 1) for s in (7, 9)} | {
        ("time axis", "codl export")
    }
