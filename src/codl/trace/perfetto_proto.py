"""Perfetto protobuf trace from a codl trace, streamed: whole long runs in bounded memory.

The same picture as :mod:`codl.trace.export`'s Chrome JSON (processes ``rank N``, ``rank N
loader worker W``, ``GPU rank N`` with one track per CUDA stream, ``comm rank N``; threads
named ``role: comm``; flows from each CUDA launch call to the kernels and copies it launched;
run-queue wait and NVML counters), written as Perfetto ``TracePacket`` messages
(``perfetto.protos.perfetto.trace.perfetto_trace_pb2`` of the ``perfetto`` package, extra
``codl[perfetto]``) that the Perfetto UI and trace processor open natively:

- every table is read block by block (``Trace.iter_blocks``) and turned into packets
  ``_BATCH_ROWS`` rows at a time; a batch is serialised as one ``Trace`` message and written
  out before the next is built (``Trace`` messages concatenate into one trace on disk). The
  package's ``StreamingTraceProtoBuilder`` streams too, but wraps and serialises a ``Trace``
  per packet: 6.7 us a packet against 4.4 us batched (100 k slice packets, this machine),
  so the batching is ours and the messages are the package's;
- what is kept across blocks is bounded by the run's shape, not its length: the track
  descriptors (threads, processes, streams), the interned names, the last scheduler sample of
  each thread, and for the launch flows the keys of the kernels and copies that CUPTI
  recorded (24 bytes each; the ``cupti`` level records one short window, the ``cuda_api``
  level none);
- times are on the export's time axis (``codl.trace.export.TimeAxis``), as in the JSON export
  but in ns: ns since the run began (``t_begin_ns``), whatever window is exported, so a time
  read off the file or Perfetto's UI is a ``codl export --from/--to`` bound. They are written
  as the trace's MONOTONIC clock moved to that zero (``trace_packet_defaults`` sets the clock;
  a clock snapshot makes it the trace's clock and maps its 0 to CLOCK_REALTIME from the run's
  start anchor, so Perfetto's UTC display stays true); the ``time axis`` track's ``run begin``
  instant at 0 carries the zero's CLOCK_MONOTONIC and Unix ns, and makes 0 the trace's first
  timestamp, where Perfetto's timecode counts from; a window is a slice on that track;
- order: the root track (uuid 0) asks for explicit process and thread order, and every
  process and thread track carries the JSON export's sort index as ``sibling_order_rank``;
  child tracks of a process (streams, counters) are ordered explicitly too;
- a slice is a ``TYPE_SLICE_BEGIN``/``TYPE_SLICE_END`` pair on its track (Perfetto nests the
  slices of a track as a stack), its arguments are debug annotations, its name, category and
  argument names interned (``SEQ_NEEDS_INCREMENTAL_STATE``). Within a batch slices are
  written by start, the longer first at equal starts, so a phase encloses what starts with it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import numpy.typing as npt

from codl.errors import CodlError
from codl.outputs import output_unit
from codl.trace.export import (
    _DEVICE_COUNTERS,
    _FLOW_RANK_SHIFT,
    AXIS_PID,
    AXIS_SORT_INDEX,
    TimeAxis,
    TimePoint,
    _thread_order,
    comm_pid,
    empty_window,
    gpu_pid,
    time_axis,
    verified_trace,
    window_bounds,
)
from codl.trace.schema import TABLES, Table
from codl.trace.store import Trace

# Rows turned into packets and serialised at a time: large enough that a Trace message's
# overhead vanishes, small enough that the Python objects of a batch stay a few MB.
_BATCH_ROWS: Final = 16_384
# Rows read from the trace at a time (adjacent chunk-index blocks merged up to it): a store
# block of 1 Mi rows decodes to over 100 MiB of arrays, this to a few MiB.
_READ_ROWS: Final = 65_536
_SEQ: Final = 1  # the one packet sequence this writer emits
_SEQ_CLEARED: Final = 1  # TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_SEQ_NEEDS: Final = 2  # TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_CLOCK_REALTIME: Final = 1
_CLOCK_MONOTONIC: Final = 3


def _pb() -> Any:
    """The ``perfetto`` package's generated messages, or a one-line error naming the extra."""
    try:
        return importlib.import_module("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    except ImportError as e:
        raise CodlError(
            f"--format perfetto-proto needs the 'perfetto' package ({e}); install it with "
            "pip install 'codl[perfetto]'"
        ) from None


@dataclass
class ExportStats:
    """What was written, for the caller's checks and the empty-window error."""

    slices: int = 0
    counter_values: int = 0
    flows: int = 0
    tracks: int = 0
    packets: int = 0
    bytes: int = 0


class _Writer:
    """Packets of one sequence into ``fh``: batching, interning and track descriptors."""

    def __init__(self, fh: IO[bytes], pb: Any, zero_ns: int = 0) -> None:
        self.fh, self.pb = fh, pb
        self.zero_ns = zero_ns  # the time axis's 0 (CLOCK_MONOTONIC): every timestamp from it
        self.trace = pb.Trace()
        self.stats = ExportStats()
        self._iids: dict[tuple[str, str], int] = {}
        self._tracks: dict[tuple[Any, ...], int] = {}

    def packet(self, flags: int = _SEQ_NEEDS) -> Any:
        p = self.trace.packet.add()
        p.trusted_packet_sequence_id = _SEQ
        p.sequence_flags = flags
        self.stats.packets += 1
        return p

    def flush(self) -> None:
        if len(self.trace.packet):
            data = self.trace.SerializeToString()
            self.fh.write(data)
            self.stats.bytes += len(data)
            self.trace = self.pb.Trace()

    def iid(self, p: Any, kind: str, name: str) -> int:
        """The interned id of ``name`` in table ``kind`` (event_names, event_categories,
        debug_annotation_names), defined in packet ``p`` the first time it is used."""
        key = (kind, name)
        got = self._iids.get(key)
        if got is None:
            got = self._iids[key] = len(self._iids) + 1
            entry = getattr(p.interned_data, kind).add()
            entry.iid, entry.name = got, name
        return got

    def track(self, key: tuple[Any, ...], describe: Any) -> int:
        """The uuid of track ``key``; its descriptor packet (``describe(descriptor)`` fills
        it) is written the first time."""
        uuid = self._tracks.get(key)
        if uuid is None:
            uuid = self._tracks[key] = len(self._tracks) + 1
            desc = self.packet().track_descriptor
            desc.uuid = uuid
            describe(desc)
            self.stats.tracks += 1
        return uuid

    def start(self, axis: TimeAxis | None) -> None:
        """Sequence start, clock and the root track's explicit ordering."""
        pb = self.pb
        first = self.packet(_SEQ_CLEARED)
        first.trace_packet_defaults.timestamp_clock_id = _CLOCK_MONOTONIC
        if axis is not None:
            snap = self.packet(0).clock_snapshot
            snap.primary_trace_clock = _CLOCK_MONOTONIC
            clocks = [(_CLOCK_MONOTONIC, 0)]
            if axis.unix_zero_ns is not None:
                clocks.append((_CLOCK_REALTIME, axis.unix_zero_ns))
            for clock_id, ts in clocks:
                c = snap.clocks.add()
                c.clock_id, c.timestamp = clock_id, ts
        root = self.packet().track_descriptor
        root.uuid = 0
        root.process_ordering = pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
        root.thread_ordering = pb.TrackDescriptor.THREAD_ORDERING_EXPLICIT

    # --- tracks ---------------------------------------------------------------------------

    def process(
        self, pid: int, name: str | None = None, order: int | None = None, label: str | None = None
    ) -> int:
        explicit = self.pb.TrackDescriptor.EXPLICIT

        def describe(d: Any) -> None:
            d.process.pid = pid
            if name is not None:
                d.process.process_name = name
            if label:
                d.process.process_labels.append(label)
            if order is not None:
                d.sibling_order_rank = order
            d.child_ordering = explicit

        return self.track(("process", pid), describe)

    def thread(self, pid: int, tid: int, name: str | None = None, order: int | None = None) -> int:
        def describe(d: Any) -> None:
            d.thread.pid, d.thread.tid = pid, tid
            if name is not None:
                d.thread.thread_name = name
            if order is not None:
                d.sibling_order_rank = order

        return self.track(("thread", pid, tid), describe)

    def child(
        self,
        parent: int,
        key: tuple[Any, ...],
        name: str,
        order: int,
        counter_unit: str | None = None,
    ) -> int:
        """A named track under the process track ``parent`` (a stream, the collectives, a
        counter when ``counter_unit`` is given)."""

        def describe(d: Any) -> None:
            d.parent_uuid, d.name, d.sibling_order_rank = parent, name, order
            if counter_unit is not None:
                d.counter.unit_name = counter_unit

        return self.track(("child", parent, *key), describe)

    # --- events ---------------------------------------------------------------------------

    def slices(
        self,
        cat: str,
        tracks: Sequence[int],
        names: Sequence[str],
        start: npt.NDArray[np.int64],
        end: npt.NDArray[np.int64],
        args: Mapping[str, Sequence[int | str | None]],
        flows: Mapping[int, list[int]] | None = None,
        ends_flow: Mapping[int, int] | None = None,
        *,
        counted: bool = True,
    ) -> None:
        """One BEGIN/END pair per row (``start``/``end``: CLOCK_MONOTONIC ns); ``args`` values
        None are left out; ``flows`` (row -> flow ids it starts) and ``ends_flow`` (row -> flow
        id it terminates); ``counted``: an event of the trace (not the axis's own)."""
        te_type = self.pb.TrackEvent
        end = np.maximum(end, start)
        order = np.lexsort((-(end - start), start))
        starts, ends = (start - self.zero_ns).tolist(), (end - self.zero_ns).tolist()
        for i in order.tolist():
            p = self.packet()
            p.timestamp = starts[i]
            ev = p.track_event
            ev.type = te_type.TYPE_SLICE_BEGIN
            ev.track_uuid = tracks[i]
            ev.name_iid = self.iid(p, "event_names", names[i])
            ev.category_iids.append(self.iid(p, "event_categories", cat))
            for key, values in args.items():
                v = values[i]
                if v is None:
                    continue
                a = ev.debug_annotations.add()
                a.name_iid = self.iid(p, "debug_annotation_names", key)
                if isinstance(v, str):
                    a.string_value = v
                else:
                    a.int_value = v
            if flows is not None and (ids := flows.get(i)):
                ev.flow_ids.extend(ids)
                self.stats.flows += len(ids)
            if ends_flow is not None and (fid := ends_flow.get(i)) is not None:
                ev.terminating_flow_ids.append(fid)
            q = self.packet()
            q.timestamp = ends[i]
            q.track_event.type = te_type.TYPE_SLICE_END
            q.track_event.track_uuid = tracks[i]
        if counted:
            self.stats.slices += len(starts)
        self.flush()

    def instant(self, track: int, ts: int, name: str, cat: str, args: Mapping[str, int]) -> None:
        """A TYPE_INSTANT event at ``ts`` (CLOCK_MONOTONIC ns), not counted as the trace's."""
        p = self.packet()
        p.timestamp = ts - self.zero_ns
        ev = p.track_event
        ev.type = self.pb.TrackEvent.TYPE_INSTANT
        ev.track_uuid = track
        ev.name_iid = self.iid(p, "event_names", name)
        ev.category_iids.append(self.iid(p, "event_categories", cat))
        for key, value in args.items():
            a = ev.debug_annotations.add()
            a.name_iid = self.iid(p, "debug_annotation_names", key)
            a.int_value = value

    def counter(self, track: int, ts: int, value: int) -> None:
        p = self.packet()
        p.timestamp = ts - self.zero_ns
        p.track_event.type = self.pb.TrackEvent.TYPE_COUNTER
        p.track_event.track_uuid = track
        p.track_event.counter_value = value
        self.stats.counter_values += 1


def _batches(
    trace: Trace, table: str, t0: int | None, t1: int | None, columns: list[str] | None = None
) -> Iterator[dict[str, Any]]:
    """The table's rows in batches of at most ``_BATCH_ROWS``, block by block."""
    for block in trace.iter_blocks(table, columns, t0=t0, t1=t1, rows=_READ_ROWS):
        n = len(next(iter(block.values()))) if block else 0
        for lo in range(0, n, _BATCH_ROWS):
            yield {k: v[lo : lo + _BATCH_ROWS] for k, v in block.items()}


def _ints(a: Any) -> list[int]:
    return np.asarray(a, dtype=np.int64).tolist()  # type: ignore[no-any-return]


def _strs(a: Any) -> list[str]:
    return [str(v) for v in np.asarray(a, dtype=object).tolist()]


@dataclass
class _Hosts:
    """Which process each host thread is drawn in (as in the JSON export)."""

    worker_of: dict[int, int] = field(default_factory=dict)
    pid_of_tid: dict[int, int] = field(default_factory=dict)
    main_pid_of_rank: dict[int, int] = field(default_factory=dict)
    label_of_tid: dict[int, str] = field(default_factory=dict)

    def pid(self, rank: int, tid: int) -> int:
        return self.pid_of_tid.get(tid, self.main_pid_of_rank.get(rank, tid))


def _hosts(w: _Writer, trace: Trace, t0: int | None, t1: int | None) -> _Hosts:
    """Describe every rank's main process, its loader workers and their threads; the loader
    table is read for its (pid, worker, rank) alone, block by block."""
    h = _Hosts()
    rank_of_pid: dict[int, int] = {}
    for b in _batches(trace, Table.LOADER, t0, t1, ["pid", "worker", "rank"]):
        for pid, worker, rank in zip(
            _ints(b["pid"]), _ints(b["worker"]), _ints(b["rank"]), strict=True
        ):
            h.worker_of[pid] = worker
            rank_of_pid[pid] = rank
    threads = trace.table(Table.THREADS).drop_duplicates(subset=["pid", "tid"], keep="last")
    pids, tids = _ints(threads["pid"]), _ints(threads["tid"])
    roles, names, ranks = _strs(threads["role"]), _strs(threads["name"]), _ints(threads["rank"])
    rank_of_pid.update(zip(pids, ranks, strict=True))
    roles_of_pid: dict[int, set[str]] = {}
    for pid, role in zip(pids, roles, strict=True):
        roles_of_pid.setdefault(pid, set()).add(role)
    loader_pids = set(h.worker_of) | {p for p, r in roles_of_pid.items() if r == {"loader"}}
    for pid, rank in sorted(rank_of_pid.items()):
        if pid in loader_pids:
            name = f"rank {rank} loader worker {h.worker_of.get(pid, '?')}"
            w.process(pid, name, 4 * rank + 1, f"rank {rank}")
        else:
            h.main_pid_of_rank.setdefault(rank, pid)
            w.process(pid, f"rank {rank}", 4 * rank)
    for pid, tid, role, name in zip(pids, tids, roles, names, strict=True):
        h.pid_of_tid[tid] = pid
        h.label_of_tid[tid] = f"{role}: {name}"
        w.thread(pid, tid, f"{role}: {name}", _thread_order(role, pid == tid))
    return h


def _host_track(w: _Writer, pid: int, tid: int) -> int:
    w.process(pid)  # a pid the thread table missed still gets its process
    return w.thread(pid, tid)


def _app(w: _Writer, trace: Trace, h: _Hosts, t0: int | None, t1: int | None) -> None:
    for b in _batches(trace, Table.APP, t0, t1):
        ranks, tids, gpu = _ints(b["rank"]), _ints(b["tid"]), _ints(b["gpu_ns"])
        tracks = [_host_track(w, h.pid(r, t), t) for r, t in zip(ranks, tids, strict=True)]
        w.slices(
            "app",
            tracks,
            _strs(b["phase"]),
            b["start_ns"],
            b["end_ns"],
            {
                "step": _ints(b["step"]),
                "rank": ranks,
                "gpu_ns": [g if g >= 0 else None for g in gpu],
            },
        )


def _loader(w: _Writer, trace: Trace, h: _Hosts, t0: int | None, t1: int | None) -> None:
    for b in _batches(trace, Table.LOADER, t0, t1):
        pids, tids = _ints(b["pid"]), _ints(b["tid"])
        tracks = [
            w.thread(
                p, t, f"loader: worker {h.worker_of.get(p, '?')}", _thread_order("loader", True)
            )
            for p, t in zip(pids, tids, strict=True)
        ]
        w.slices(
            "loader",
            tracks,
            _strs(b["stage"]),
            b["start_ns"],
            b["end_ns"],
            {
                "item": _ints(b["item"]),
                "step": _ints(b["step"]),
                "cpu": _ints(b["cpu"]),
                "worker": _ints(b["worker"]),
            },
        )


@dataclass(frozen=True)
class _Flows:
    """The launch -> device flows of the cuda table, from a first pass over its key columns:
    ``keys`` (sorted flow keys, ``flow_id(rank, correlation)``) that have both a runtime call
    and device rows, the row of the call that starts them (the last one, as in the JSON
    export), how many device rows each has and the first flow id of each."""

    keys: npt.NDArray[np.int64]
    launch_row: npt.NDArray[np.int64]
    count: npt.NDArray[np.int64]
    first_id: npt.NDArray[np.int64]


def _flow_keys(b: Mapping[str, Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    rank = np.asarray(b["rank"], dtype=np.int64)
    corr = np.asarray(b["correlation"], dtype=np.int64)
    return (rank << _FLOW_RANK_SHIFT) + corr, np.asarray(b["stream"], dtype=np.int64) >= 0


def _plan_flows(trace: Trace, t0: int | None, t1: int | None) -> _Flows:
    cols = ["rank", "stream", "correlation"]
    device: list[npt.NDArray[np.int64]] = []
    for b in _batches(trace, Table.CUDA, t0, t1, cols):
        keys, dev = _flow_keys(b)
        device.append(keys[dev])
    dev_keys, dev_count = np.unique(
        np.concatenate(device) if device else np.zeros(0, np.int64), return_counts=True
    )
    launch_keys: list[npt.NDArray[np.int64]] = []
    launch_rows: list[npt.NDArray[np.int64]] = []
    row = 0
    if dev_keys.size:
        for b in _batches(trace, Table.CUDA, t0, t1, cols):
            keys, dev = _flow_keys(b)
            corr = np.asarray(b["correlation"], dtype=np.int64)
            hit = ~dev & (corr > 0) & np.isin(keys, dev_keys)
            launch_keys.append(keys[hit])
            launch_rows.append(row + np.nonzero(hit)[0])
            row += len(keys)
    if not launch_keys:
        empty = np.zeros(0, np.int64)
        return _Flows(empty, empty, empty, empty)
    lk, lr = np.concatenate(launch_keys), np.concatenate(launch_rows)
    # The last call of each key: unique over the reversed arrays keeps the first seen there.
    keys, idx = np.unique(lk[::-1], return_index=True)
    last_row = lr[::-1][idx]
    count = dev_count[np.searchsorted(dev_keys, keys)]
    first = np.concatenate(([1], 1 + np.cumsum(count)[:-1])).astype(np.int64)
    return _Flows(keys, last_row, count, first)


def _cuda(w: _Writer, trace: Trace, h: _Hosts, t0: int | None, t1: int | None) -> None:
    plan = _plan_flows(trace, t0, t1)
    launch_of_row = dict(zip(plan.launch_row.tolist(), range(len(plan.keys)), strict=True))
    used = np.zeros(len(plan.keys), dtype=np.int64)
    row = 0
    for b in _batches(trace, Table.CUDA, t0, t1):
        ranks, tids, streams = _ints(b["rank"]), _ints(b["tid"]), _ints(b["stream"])
        tracks: list[int] = []
        for rank, tid, stream in zip(ranks, tids, streams, strict=True):
            if stream < 0:  # a runtime API call, on the host thread that made it
                tracks.append(_host_track(w, h.pid(rank, tid), tid))
            else:
                parent = w.process(gpu_pid(rank), f"GPU rank {rank}", 4 * rank + 2)
                tracks.append(w.child(parent, ("stream", stream), f"stream {stream}", stream))
        flows: dict[int, list[int]] = {}
        ends: dict[int, int] = {}
        if plan.keys.size:
            keys, dev = _flow_keys(b)
            pos = np.searchsorted(plan.keys, keys).clip(0, len(plan.keys) - 1)
            known = plan.keys[pos] == keys
            for i in np.nonzero(known & dev)[0].tolist():
                k = int(pos[i])
                ends[i] = int(plan.first_id[k] + used[k])
                used[k] += 1
            for i in range(len(keys)):
                launch = launch_of_row.get(row + i)
                if launch is not None:
                    first = int(plan.first_id[launch])
                    flows[i] = list(range(first, first + int(plan.count[launch])))
        row += len(ranks)
        w.slices(
            "cuda",
            tracks,
            _strs(b["name"]),
            b["start_ns"],
            b["end_ns"],
            {
                "kind": _strs(b["kind"]),
                "step": _ints(b["step"]),
                "correlation": _ints(b["correlation"]),
            },
            flows,
            ends,
        )


def _comm(w: _Writer, trace: Trace, t0: int | None, t1: int | None) -> None:
    for b in _batches(trace, Table.COMM, t0, t1):
        ranks = _ints(b["rank"])
        tracks = [
            w.child(
                w.process(comm_pid(r), f"comm rank {r}", 4 * r + 3), ("comm",), "collectives", 0
            )
            for r in ranks
        ]
        w.slices(
            "comm",
            tracks,
            _strs(b["op"]),
            b["start_ns"],
            b["end_ns"],
            {
                "bucket": _ints(b["bucket"]),
                "bytes": _ints(b["bytes"]),
                "step": _ints(b["step"]),
                "gpu_ns": _ints(b["gpu_ns"]),
            },
        )


def _sched(w: _Writer, trace: Trace, h: _Hosts, t0: int | None, t1: int | None) -> None:
    """Run-queue wait per sampling interval: each sample's value is the wait until the same
    thread's next sample (held back until that sample arrives), the last one 0, as in the
    JSON export."""
    pending: dict[tuple[int, int], tuple[int, int, int]] = {}  # (pid, tid) -> track, t, wait

    for b in _batches(trace, Table.SCHED, t0, t1, ["t_ns", "pid", "tid", "wait_ns"]):
        for t, pid, tid, wait in zip(
            _ints(b["t_ns"]), _ints(b["pid"]), _ints(b["tid"]), _ints(b["wait_ns"]), strict=True
        ):
            prev = pending.get((pid, tid))
            if prev is None:
                name = f"run-queue wait {h.label_of_tid.get(tid, 'thread')} [{tid}]"
                track = w.child(w.process(pid), ("sched", tid), name, 1000 + len(pending), "ns")
            else:
                track = prev[0]
                # A negative delta means the tid was reused and its counter restarted.
                w.counter(track, prev[1], max(0, wait - prev[2]))
            pending[(pid, tid)] = (track, t, wait)
        w.flush()
    for track, t, _ in pending.values():
        w.counter(track, t, 0)
    w.flush()


def _device(w: _Writer, trace: Trace, t0: int | None, t1: int | None) -> None:
    for b in _batches(trace, Table.DEVICE, t0, t1):
        values = {k: _ints(b[k]) for k in _DEVICE_COUNTERS}
        units = {c.name: c.unit for c in TABLES[Table.DEVICE]}
        for i, (t, rank, gpu) in enumerate(
            zip(_ints(b["t_ns"]), _ints(b["rank"]), _ints(b["gpu"]), strict=True)
        ):
            parent = w.process(gpu_pid(rank), f"GPU rank {rank}", 4 * rank + 2)
            for j, k in enumerate(_DEVICE_COUNTERS):
                track = w.child(parent, ("device", gpu, k), f"GPU {gpu} {k}", 1000 + j, units[k])
                w.counter(track, t, values[k][i])
        w.flush()


def _axis(w: _Writer, axis: TimeAxis, t0: int | None, t1: int | None) -> None:
    """The ``time axis`` track, as in the JSON export: the instant at 0 and the window."""
    track = w.child(w.process(AXIS_PID, "time axis", AXIS_SORT_INDEX), ("axis",), "codl export", 0)
    args = {"monotonic_ns": axis.zero_ns}
    if axis.unix_zero_ns is not None:
        args["unix_ns"] = axis.unix_zero_ns
    w.instant(track, axis.zero_ns, axis.marker, "axis", args)
    lo = axis.zero_ns if t0 is None else t0
    hi = (None if axis.end_ns is None else axis.zero_ns + axis.end_ns) if t1 is None else t1
    if (t0 is not None or t1 is not None) and hi is not None and hi > lo:
        w.slices(
            "axis",
            [track],
            ["window"],
            np.array([lo], dtype=np.int64),
            np.array([hi], dtype=np.int64),
            {"from": [f"{axis.ns(lo) / 1e9:.9g} s"], "to": [f"{axis.ns(hi) / 1e9:.9g} s"]},
            counted=False,
        )
    w.flush()


def write_perfetto(
    trace: Trace, fh: IO[bytes], *, t0: int | None = None, t1: int | None = None
) -> ExportStats:
    """Stream the Perfetto protobuf trace of ``trace`` (optionally the window [t0, t1) of
    CLOCK_MONOTONIC ns) into ``fh``, its times on the trace's ``time_axis``; returns what was
    written."""
    axis = time_axis(trace)
    w = _Writer(fh, _pb(), axis.zero_ns if axis is not None else 0)
    w.start(axis)
    if axis is not None:
        _axis(w, axis, t0, t1)
    hosts = _hosts(w, trace, t0, t1)
    w.flush()
    _app(w, trace, hosts, t0, t1)
    _loader(w, trace, hosts, t0, t1)
    _cuda(w, trace, hosts, t0, t1)
    _comm(w, trace, t0, t1)
    _sched(w, trace, hosts, t0, t1)
    _device(w, trace, t0, t1)
    w.flush()
    return w.stats


def export_perfetto(
    trace_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    allow_incomplete: bool = False,
    start: TimePoint | None = None,
    end: TimePoint | None = None,
    option: str = "output",
) -> Path:
    """Write the Perfetto protobuf trace of the trace at ``trace_path`` to ``out_path`` as a
    unit (``codl.outputs``), streamed; the trace verified and the window taken as in
    ``export_chrome``. A window that holds no event is an error, and the unit then leaves
    nothing behind."""
    out = Path(out_path)
    _pb()  # a missing package is said before any output exists
    with (
        output_unit({option: out}, inputs=(Path(trace_path),)) as unit,
        verified_trace(trace_path, allow_incomplete=allow_incomplete) as trace,
    ):
        axis = time_axis(trace)
        t0, t1 = window_bounds(axis, start, end)
        with unit.path(out).open("wb") as fh:
            stats = write_perfetto(trace, fh, t0=t0, t1=t1)
        if (t0 is not None or t1 is not None) and not (stats.slices or stats.counter_values):
            raise empty_window(trace, axis, t0, t1)
    return out
