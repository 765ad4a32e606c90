"""Chrome / Perfetto trace JSON from a codl trace, for looking at one run by eye.

Open the output in https://ui.perfetto.dev (or chrome://tracing). Layout:

- one process per OS process: ``rank N`` (the training process of rank N) and ``rank N loader
  worker W`` (its DataLoader worker processes), one track per thread named ``role: comm`` from
  ``/threads``;
- synthetic processes ``GPU rank N`` (one track per CUDA stream: kernels, memcpy, memset) and
  ``comm rank N`` (one track of AllReduce buckets); their tracks have tids of their own, unique
  across ranks (Perfetto's JSON importer tells threads apart by tid alone, like OS tids);
- flows (``ph`` ``s``/``f``, category ``launch``) from each CUDA runtime call to the kernel or
  copy it launched, matched by the rank's CUPTI ``correlation`` id, drawn as arrows;
- a sort order: ``process_sort_index`` (rank by rank: main, loader workers, GPU, comm) and
  ``thread_sort_index`` (main thread first, then by role, loader threads by worker, streams by
  id), in metadata events that Chrome's viewer honours; Perfetto's JSON importer reads names
  only, so the pids and tids Perfetto sorts by are kept as they are (real OS ids);
- counters: per-thread run-queue wait per sampling interval (``samples/sched``) in the thread's
  process, and NVML utilisation, memory, clock and power in ``GPU rank N``.

Times are on the export's time axis (:class:`TimeAxis`): microseconds (floats, so nanoseconds
survive) since the run began (root attribute ``t_begin_ns``; a trace without it counts from its
earliest event), whatever window is exported, so a time read off one export selects the same
instant in the next (``codl export --from/--to`` take this axis). ``otherData`` records the
zero as CLOCK_MONOTONIC ns, and as Unix ns when the trace has clock anchors. A ``time axis``
process holds a ``run begin`` instant at 0 and, for a window, a ``window`` slice over it:
Perfetto counts its timecode from a trace's first event, which the instant makes the axis's 0.

The JSON holds one dict per event: export a time window (``t0``/``t1``) of long runs.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

import numpy as np
import pandas as pd

from codl.errors import CodlError
from codl.outputs import output_unit
from codl.trace.schema import SCHEMA_VERSION, Table
from codl.trace.store import Trace, open_trace

# Linux pids stay below 2**22 (pid_max limit), so synthetic pids above 2**30 never collide with a
# real process and stay inside int32 for viewers that parse pids as int.
GPU_PID_BASE: Final = 1 << 30
COMM_PID_BASE: Final = (1 << 30) + (1 << 20)
# Synthetic tids of the GPU stream and collectives tracks: above 2**31, where Linux tids never
# are, and distinct for every (rank, stream) and rank.
STREAM_TID_BASE: Final = 1 << 31
COMM_TID_BASE: Final = (1 << 31) + (1 << 30)
# The "time axis" process and its one track (the run-begin instant, the window's slice): a pid
# and a tid that no process, stream or collectives track has, first in sort order.
AXIS_PID: Final = GPU_PID_BASE - 1
AXIS_TID: Final = (1 << 32) - 1
AXIS_SORT_INDEX: Final = -1
# The largest --from/--to on the axis: far beyond any run (115 days), in ns far inside int64;
# and on CLOCK_MONOTONIC (mono:NS), what int64 holds.
MAX_WINDOW_S: Final = 1e7
MAX_MONOTONIC_NS: Final = 2**63 - 1
# A flow's id: the rank above the CUPTI correlation id (a per-process counter), below 2**53 so
# that JSON readers parsing numbers as doubles keep it exact.
_FLOW_RANK_SHIFT: Final = 32
# Thread order within a rank's process (thread_sort_index), by role; unknown roles go last.
_ROLE_ORDER: Final = ("launch", "autograd", "pin_memory", "comm", "loader")

_EVENT_TABLES: Final = (Table.APP, Table.LOADER, Table.CUDA, Table.COMM)
_SAMPLE_TABLES: Final = (Table.SCHED, Table.DEVICE)
_DEVICE_COUNTERS: Final = ("util_pct", "mem_util_pct", "mem_used", "sm_clock", "power")


def gpu_pid(rank: int) -> int:
    """Synthetic pid of the ``GPU rank N`` process."""
    return GPU_PID_BASE + rank


def comm_pid(rank: int) -> int:
    """Synthetic pid of the ``comm rank N`` process."""
    return COMM_PID_BASE + rank


def stream_tid(rank: int, stream: int) -> int:
    """Synthetic tid of CUDA stream ``stream``'s track in ``GPU rank N`` (stream ids are CUPTI's
    small per-context numbers; 20 bits of them and 10 of the rank are kept)."""
    return STREAM_TID_BASE + ((rank & 0x3FF) << 20) + (stream & 0xFFFFF)


def comm_tid(rank: int) -> int:
    """Synthetic tid of the collectives track in ``comm rank N``."""
    return COMM_TID_BASE + rank


def flow_id(rank: int, correlation: int) -> int:
    """The id of the launch -> kernel flow of ``correlation`` on ``rank``."""
    return (rank << _FLOW_RANK_SHIFT) + correlation


def _ints(s: pd.Series[Any]) -> list[int]:
    return [int(v) for v in s.to_numpy(dtype=np.int64)]


def _strs(s: pd.Series[Any]) -> list[str]:
    return [str(v) for v in s.tolist()]


class _Builder:
    def __init__(self, base_ns: int) -> None:
        self.base_ns = base_ns
        self.meta: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._named_threads: set[tuple[int, int]] = set()
        self._named_processes: set[int] = set()

    def us(self, ns: pd.Series[Any]) -> list[float]:
        # Subtract in int64 first: absolute monotonic ns do not fit a double exactly.
        rel = ns.to_numpy(dtype=np.int64) - np.int64(self.base_ns)
        return (rel / 1e3).tolist()  # type: ignore[no-any-return]

    def process(self, pid: int, name: str, sort_index: int, label: str | None = None) -> None:
        if pid in self._named_processes:
            return
        self._named_processes.add(pid)
        self.meta.append(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
        )
        self.meta.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": sort_index},
            }
        )
        if label:
            self.meta.append(
                {
                    "ph": "M",
                    "name": "process_labels",
                    "pid": pid,
                    "tid": 0,
                    "args": {"labels": label},
                }
            )

    def thread(self, pid: int, tid: int, name: str, sort_index: int) -> None:
        if (pid, tid) in self._named_threads:
            return
        self._named_threads.add((pid, tid))
        self.meta.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        )
        self.meta.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": sort_index},
            }
        )

    def flow(self, fid: int, ph: str, pid: int, tid: int, ts_us: float) -> None:
        # "f" binds to the slice enclosing its time on its track (bp "e"), here the kernel that
        # starts there; "s" binds to the launch call it starts in, as Kineto's flows do.
        e: dict[str, Any] = {"name": "launch", "cat": "launch", "ph": ph, "id": fid}
        e.update({"pid": pid, "tid": tid, "ts": ts_us})
        if ph == "f":
            e["bp"] = "e"
        self.events.append(e)

    def complete(
        self,
        cat: str,
        *,
        names: Iterable[str],
        pids: Iterable[int],
        tids: Iterable[int],
        start_ns: pd.Series[Any],
        end_ns: pd.Series[Any],
        args: Iterable[dict[str, Any]],
    ) -> None:
        ts = self.us(start_ns)
        dur = ((end_ns - start_ns).clip(lower=0).to_numpy(dtype=np.int64) / 1e3).tolist()
        for name, pid, tid, t, d, a in zip(names, pids, tids, ts, dur, args, strict=True):
            self.events.append(
                {
                    "name": name,
                    "cat": cat,
                    "ph": "X",
                    "ts": t,
                    "dur": d,
                    "pid": pid,
                    "tid": tid,
                    "args": a,
                }
            )

    def counter(self, pid: int, name: str, ts_us: float, values: dict[str, float]) -> None:
        self.events.append({"name": name, "ph": "C", "ts": ts_us, "pid": pid, "args": values})


class TimePoint(NamedTuple):
    """One bound of an export's window: ``ns`` on the export's time axis (since the run began),
    or CLOCK_MONOTONIC ns as the trace stores them when ``monotonic``."""

    ns: int
    monotonic: bool = False

    def text(self) -> str:
        """As a user gives it: ``1.27 s`` on the axis, ``mono:NS`` on CLOCK_MONOTONIC."""
        return f"mono:{self.ns}" if self.monotonic else f"{self.ns / 1e9:.9g} s"


@dataclass(frozen=True)
class TimeAxis:
    """The time axis every export of a trace writes, in either format: ns since ``zero_ns``
    (CLOCK_MONOTONIC), the run's start (``t_begin_ns``) or, in a trace without one, its
    earliest event (``zero_is`` says which). The zero is the trace's, never the window's."""

    zero_ns: int
    zero_is: str
    unix_zero_ns: int | None = None
    end_ns: int | None = None  # the run's end (``t_end_ns``) on the axis, where known

    def ns(self, monotonic_ns: int) -> int:
        return monotonic_ns - self.zero_ns

    def monotonic(self, point: TimePoint) -> int:
        return point.ns if point.monotonic else self.zero_ns + point.ns

    def text(self, monotonic_ns: int | None) -> str:
        """A trace time as the axis's seconds (``1.27 s``), ``...`` for an open bound."""
        return "..." if monotonic_ns is None else f"{self.ns(monotonic_ns) / 1e9:.9g} s"

    @property
    def marker(self) -> str:
        """The name of the instant at the axis's 0."""
        return "run begin" if self.zero_is == "t_begin_ns" else "time zero (earliest event)"


def time_axis(trace: Trace) -> TimeAxis | None:
    """The export's time axis of ``trace``: zero at ``t_begin_ns``, else at its earliest event
    (of the event and sample tables, the whole trace: a chunk index gives it, else one column is
    read); None for a trace that has neither."""
    begin, end = trace.attrs.get("t_begin_ns"), trace.attrs.get("t_end_ns")
    if isinstance(begin, int):
        zero, zero_is = begin, "t_begin_ns"
    else:
        earliest = _earliest(trace)
        if earliest is None:
            return None
        zero, zero_is = earliest, "earliest event"
    return TimeAxis(
        zero,
        zero_is,
        unix_zero_ns=_unix_base(trace, zero),
        end_ns=end - zero if isinstance(end, int) else None,
    )


def _earliest(trace: Trace) -> int | None:
    lows: list[int] = []
    present = set(trace.tables())
    for name in (*_EVENT_TABLES, *_SAMPLE_TABLES):
        if name not in present:
            continue
        index = trace.chunk_index(name)
        if index is not None:
            if len(index):
                lows.append(int(index[:, 2].min()))
            continue
        col = "start_ns" if name in _EVENT_TABLES else "t_ns"
        lows += [int(b[col].min()) for b in trace.iter_blocks(name, [col]) if len(b[col])]
    return min(lows) if lows else None


def _unix_base(trace: Trace, base_ns: int) -> int | None:
    anchor = trace.attrs.get("anchors_start")
    if not isinstance(anchor, dict):
        return None
    real, mono = anchor.get("realtime_ns"), anchor.get("monotonic_ns")
    if not isinstance(real, int) or not isinstance(mono, int):
        return None
    return base_ns - mono + real


def window_bounds(
    axis: TimeAxis | None, start: TimePoint | None, end: TimePoint | None
) -> tuple[int | None, int | None]:
    """``[start, end)`` as CLOCK_MONOTONIC ns ``(t0, t1)``, the trace reader's window; CodlError
    for a bound out of range or an end not after the start (the command line checks the same
    before it opens the trace)."""
    for name, point in (("--from", start), ("--to", end)):
        if point is None:
            continue
        hi = MAX_MONOTONIC_NS if point.monotonic else round(MAX_WINDOW_S * 1e9)
        if not 0 <= point.ns <= hi:
            raise CodlError(f"{name}: got {point.ns} ns, expected a time in [0, {hi}] ns")
    t0 = None if start is None else _monotonic(axis, start)
    t1 = None if end is None else _monotonic(axis, end)
    if start is not None and end is not None and t0 is not None and t1 is not None and t1 <= t0:
        raise CodlError(empty_window_text(start, end))
    return t0, t1


def empty_window_text(start: TimePoint, end: TimePoint) -> str:
    """The error for ``--to`` not after ``--from``, the bounds as the user gave them."""
    return f"--to must be after --from: the window [{start.text()}, {end.text()}) is empty"


def _monotonic(axis: TimeAxis | None, point: TimePoint) -> int:
    # No axis: a trace with no event and no t_begin_ns, where every window is empty (the
    # caller's error then says so).
    return point.ns if axis is None else axis.monotonic(point)


def to_chrome_trace(
    trace: Trace, *, t0: int | None = None, t1: int | None = None
) -> dict[str, Any]:
    """The Chrome trace-event JSON object of ``trace`` (optionally only the window [t0, t1) of
    CLOCK_MONOTONIC ns), its times on the trace's :func:`time_axis`."""
    tables: dict[str, pd.DataFrame] = {
        name: trace.table(name, t0=t0, t1=t1) for name in _EVENT_TABLES + _SAMPLE_TABLES
    }
    threads = trace.table(Table.THREADS).drop_duplicates(subset=["pid", "tid"], keep="last")
    axis = time_axis(trace)
    b = _Builder(axis.zero_ns if axis is not None else 0)
    if axis is not None:
        _axis_events(b, axis, t0, t1)
    # Events are added in this order, which is also the order of the metadata events.
    hosts = _host_processes(b, tables[Table.LOADER], threads)
    _app_events(b, tables[Table.APP], hosts)
    _loader_events(b, tables[Table.LOADER], hosts)
    _cuda_events(b, tables[Table.CUDA], hosts)
    _comm_events(b, tables[Table.COMM])
    _sched_counters(b, tables[Table.SCHED], hosts.label_of_tid)
    _device_counters(b, tables[Table.DEVICE])

    # Metadata first, then time order: viewers do not need it, but diffs and tests read better.
    b.events.sort(key=lambda e: float(e["ts"]))
    other: dict[str, str] = {
        "producer": "codl.trace.export",
        "schema_version": str(SCHEMA_VERSION),
        "run_id": str(trace.attrs.get("run_id", "")),
        "complete": str(trace.complete).lower(),
    }
    if axis is not None:
        other.update(_axis_data(axis, t0, t1))
    # No "displayTimeUnit": Perfetto's JSON importer reads "ns" there as the unit of `ts` itself
    # (not just of the display, as in Chrome's spec), which would shrink every span 1000x.
    return {"traceEvents": b.meta + b.events, "otherData": other}


def _axis_data(axis: TimeAxis, t0: int | None, t1: int | None) -> dict[str, str]:
    """``otherData``'s account of the time axis (strings: Unix ns do not fit a double)."""
    zero = (
        "the run began (root attribute t_begin_ns)"
        if axis.zero_is == "t_begin_ns"
        else "the trace's earliest event (it has no root attribute t_begin_ns)"
    )
    out = {
        "time_axis": f"ts in microseconds since {zero}; codl export --from/--to take this axis",
        "time_base": axis.zero_is,
        "time_base_monotonic_ns": str(axis.zero_ns),
    }
    if axis.unix_zero_ns is not None:
        out["time_base_unix_ns"] = str(axis.unix_zero_ns)
    if t0 is not None or t1 is not None:
        out["window"] = f"[{axis.text(t0)}, {axis.text(t1)})"
    return out


def _axis_events(b: _Builder, axis: TimeAxis, t0: int | None, t1: int | None) -> None:
    """The ``time axis`` track: an instant at 0, which makes the axis's 0 the trace's first
    timestamp (Perfetto's timecode counts from there), and the exported window as a slice
    (select it and press F in Perfetto to zoom to it)."""
    b.process(AXIS_PID, "time axis", AXIS_SORT_INDEX)
    b.thread(AXIS_PID, AXIS_TID, "codl export", 0)
    args = {"monotonic_ns": str(axis.zero_ns)}
    if axis.unix_zero_ns is not None:
        args["unix_ns"] = str(axis.unix_zero_ns)
    b.events.append(
        {"name": axis.marker, "cat": "axis", "ph": "i", "s": "t", "ts": 0.0}
        | {"pid": AXIS_PID, "tid": AXIS_TID, "args": args}
    )
    lo = 0 if t0 is None else axis.ns(t0)
    hi = axis.end_ns if t1 is None else axis.ns(t1)
    if (t0 is not None or t1 is not None) and hi is not None and hi > lo:
        b.events.append(
            {"name": "window", "cat": "axis", "ph": "X", "ts": lo / 1e3, "dur": (hi - lo) / 1e3}
            | {"pid": AXIS_PID, "tid": AXIS_TID}
            | {"args": {"from": f"{lo / 1e9:.9g} s", "to": f"{hi / 1e9:.9g} s"}}
        )


@dataclass(frozen=True)
class _Hosts:
    """Which process each host thread is drawn in, and its label."""

    worker_of: dict[int, int]  # loader worker pid -> worker id
    pid_of_tid: dict[int, int]
    main_pid_of_rank: dict[int, int]
    label_of_tid: dict[int, str]

    def pid(self, rank: int, tid: int) -> int:
        # Threads missing from /threads (captured late or exited early) go to their rank's main
        # process; the main thread's tid equals its pid as a last resort.
        return self.pid_of_tid.get(tid, self.main_pid_of_rank.get(rank, tid))


def _host_processes(b: _Builder, loader: pd.DataFrame, threads: pd.DataFrame) -> _Hosts:
    """Name every rank's main process, its loader workers and their threads."""
    worker_of: dict[int, int] = dict(
        zip(_ints(loader["pid"]), _ints(loader["worker"]), strict=True)
    )
    rank_of_pid: dict[int, int] = dict(
        zip(_ints(loader["pid"]), _ints(loader["rank"]), strict=True)
    )
    rank_of_pid.update(zip(_ints(threads["pid"]), _ints(threads["rank"]), strict=True))
    roles_of_pid: dict[int, set[str]] = {}
    for pid, role in zip(_ints(threads["pid"]), _strs(threads["role"]), strict=True):
        roles_of_pid.setdefault(pid, set()).add(role)
    # A worker process runs only loader threads; the rank's main process runs everything else.
    loader_pids = set(worker_of) | {p for p, roles in roles_of_pid.items() if roles == {"loader"}}
    main_pid_of_rank: dict[int, int] = {}
    for pid, rank in sorted(rank_of_pid.items()):
        if pid in loader_pids:
            name = f"rank {rank} loader worker {worker_of.get(pid, '?')}"
            b.process(pid, name, 4 * rank + 1, f"rank {rank}")
        else:
            main_pid_of_rank.setdefault(rank, pid)
            b.process(pid, f"rank {rank}", 4 * rank, None)

    pid_of_tid: dict[int, int] = {}
    for pid, tid, role, name in zip(
        _ints(threads["pid"]),
        _ints(threads["tid"]),
        _strs(threads["role"]),
        _strs(threads["name"]),
        strict=True,
    ):
        pid_of_tid[tid] = pid
        b.thread(pid, tid, f"{role}: {name}", _thread_order(role, pid == tid))
    label_of_tid = {
        tid: f"{role}: {name}"
        for tid, role, name in zip(
            _ints(threads["tid"]), _strs(threads["role"]), _strs(threads["name"]), strict=True
        )
    }
    return _Hosts(worker_of, pid_of_tid, main_pid_of_rank, label_of_tid)


def _thread_order(role: str, main: bool) -> int:
    """thread_sort_index of a host thread: the process's main thread first, then by role."""
    if main:
        return 0
    rank = _ROLE_ORDER.index(role) if role in _ROLE_ORDER else len(_ROLE_ORDER)
    return 1 + rank


def _app_events(b: _Builder, app: pd.DataFrame, hosts: _Hosts) -> None:
    if app.empty:
        return
    ranks, tids = _ints(app["rank"]), _ints(app["tid"])
    gpu = _ints(app["gpu_ns"])
    b.complete(
        "app",
        names=_strs(app["phase"]),
        pids=(hosts.pid(r, t) for r, t in zip(ranks, tids, strict=True)),
        tids=tids,
        start_ns=app["start_ns"],
        end_ns=app["end_ns"],
        args=(
            {"step": s, "rank": r, **({"gpu_ns": g} if g >= 0 else {})}
            for s, r, g in zip(_ints(app["step"]), ranks, gpu, strict=True)
        ),
    )


def _loader_events(b: _Builder, loader: pd.DataFrame, hosts: _Hosts) -> None:
    if loader.empty:
        return
    pids, tids = _ints(loader["pid"]), _ints(loader["tid"])
    for pid, tid in zip(pids, tids, strict=True):
        name = f"loader: worker {hosts.worker_of.get(pid, '?')}"
        b.thread(pid, tid, name, _thread_order("loader", True))
    b.complete(
        "loader",
        names=_strs(loader["stage"]),
        pids=pids,
        tids=tids,
        start_ns=loader["start_ns"],
        end_ns=loader["end_ns"],
        args=(
            {"item": i, "step": s, "cpu": c, "worker": w}
            for i, s, c, w in zip(
                _ints(loader["item"]),
                _ints(loader["step"]),
                _ints(loader["cpu"]),
                _ints(loader["worker"]),
                strict=True,
            )
        ),
    )


def _cuda_events(b: _Builder, cuda: pd.DataFrame, hosts: _Hosts) -> None:
    if cuda.empty:
        return
    ranks, tids, streams = _ints(cuda["rank"]), _ints(cuda["tid"]), _ints(cuda["stream"])
    kinds = _strs(cuda["kind"])
    pids_out: list[int] = []
    tids_out: list[int] = []
    for rank, tid, stream in zip(ranks, tids, streams, strict=True):
        if stream < 0:  # a runtime API call, on the host thread that made it
            pids_out.append(hosts.pid(rank, tid))
            tids_out.append(tid)
        else:
            b.process(gpu_pid(rank), f"GPU rank {rank}", 4 * rank + 2, None)
            b.thread(gpu_pid(rank), stream_tid(rank, stream), f"stream {stream}", stream)
            pids_out.append(gpu_pid(rank))
            tids_out.append(stream_tid(rank, stream))
    b.complete(
        "cuda",
        names=_strs(cuda["name"]),
        pids=pids_out,
        tids=tids_out,
        start_ns=cuda["start_ns"],
        end_ns=cuda["end_ns"],
        args=(
            {"kind": k, "step": s, "correlation": c}
            for k, s, c in zip(kinds, _ints(cuda["step"]), _ints(cuda["correlation"]), strict=True)
        ),
    )
    _launch_flows(b, cuda, pids_out, tids_out)


def _launch_flows(b: _Builder, cuda: pd.DataFrame, pids: list[int], tids: list[int]) -> None:
    """One flow per correlation id that has both a runtime call and device work on its rank:
    from the call (the last one if CUPTI reported several) to each kernel or copy."""
    ranks, streams = _ints(cuda["rank"]), _ints(cuda["stream"])
    corrs, ts = _ints(cuda["correlation"]), b.us(cuda["start_ns"])
    launch: dict[tuple[int, int], int] = {}
    for i, (rank, stream, corr) in enumerate(zip(ranks, streams, corrs, strict=True)):
        if stream < 0 and corr > 0:
            launch[(rank, corr)] = i
    for i, (rank, stream, corr) in enumerate(zip(ranks, streams, corrs, strict=True)):
        j = launch.get((rank, corr)) if stream >= 0 else None
        if j is None:
            continue
        fid = flow_id(rank, corr)
        b.flow(fid, "s", pids[j], tids[j], ts[j])
        b.flow(fid, "f", pids[i], tids[i], ts[i])


def _comm_events(b: _Builder, comm: pd.DataFrame) -> None:
    if comm.empty:
        return
    ranks = _ints(comm["rank"])
    for rank in sorted(set(ranks)):
        b.process(comm_pid(rank), f"comm rank {rank}", 4 * rank + 3, None)
        b.thread(comm_pid(rank), comm_tid(rank), "collectives", 0)
    b.complete(
        "comm",
        names=_strs(comm["op"]),
        pids=(comm_pid(r) for r in ranks),
        tids=(comm_tid(r) for r in ranks),
        start_ns=comm["start_ns"],
        end_ns=comm["end_ns"],
        args=(
            {"bucket": k, "bytes": n, "step": s, "gpu_ns": g}
            for k, n, s, g in zip(
                _ints(comm["bucket"]),
                _ints(comm["bytes"]),
                _ints(comm["step"]),
                _ints(comm["gpu_ns"]),
                strict=True,
            )
        ),
    )


def _sched_counters(b: _Builder, sched: pd.DataFrame, label_of_tid: dict[int, str]) -> None:
    if sched.empty:
        return
    sched = sched.sort_values(["pid", "tid", "t_ns"], kind="stable")
    pids, tids = _ints(sched["pid"]), _ints(sched["tid"])
    ts = b.us(sched["t_ns"])
    wait = _ints(sched["wait_ns"])
    for i in range(len(ts)):
        pid, tid = pids[i], tids[i]
        name = f"run-queue wait {label_of_tid.get(tid, 'thread')} [{tid}]"
        last = i + 1 == len(ts) or (pids[i + 1], tids[i + 1]) != (pid, tid)
        # Each value covers [this sample, next sample), so the step sits under the interval it
        # measured; the thread's last sample closes its track at 0. A negative delta means the
        # tid was reused and its counter restarted.
        delta = 0 if last else max(0, wait[i + 1] - wait[i])
        b.counter(pid, name, ts[i], {"wait_ns": float(delta)})


def _device_counters(b: _Builder, device: pd.DataFrame) -> None:
    if device.empty:
        return
    ts = b.us(device["t_ns"])
    ranks, gpus = _ints(device["rank"]), _ints(device["gpu"])
    values = {k: _ints(device[k]) for k in _DEVICE_COUNTERS}
    for i, (rank, gpu) in enumerate(zip(ranks, gpus, strict=True)):
        b.process(gpu_pid(rank), f"GPU rank {rank}", 4 * rank + 2, None)
        for k in _DEVICE_COUNTERS:
            b.counter(gpu_pid(rank), f"GPU {gpu} {k}", ts[i], {k: float(values[k][i])})


def export_chrome(
    trace_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    allow_incomplete: bool = False,
    start: TimePoint | None = None,
    end: TimePoint | None = None,
    option: str = "output",
) -> Path:
    """Write the Chrome trace JSON of the trace at ``trace_path`` to ``out_path``; returns it.

    The window is ``[start, end)`` on the export's time axis (:func:`time_axis`; a bound may
    be CLOCK_MONOTONIC instead, :class:`TimePoint`); with a chunk index only the chunks that
    overlap it are read. The trace is verified first (:func:`verified_trace`). A window that
    holds no event is an error, not an empty file. The output is written as a unit
    (``codl.outputs``; ``option`` names it in errors): a viewer never opens a half-written
    file, a device or pipe is streamed to.
    """
    out = Path(out_path)
    with (
        output_unit({option: out}, inputs=(Path(trace_path),)) as unit,
        verified_trace(trace_path, allow_incomplete=allow_incomplete) as trace,
    ):
        axis = time_axis(trace)
        t0, t1 = window_bounds(axis, start, end)
        doc = to_chrome_trace(trace, t0=t0, t1=t1)
        if (t0 is not None or t1 is not None) and not any(
            e["ph"] != "M" and e.get("cat") != "axis" for e in doc["traceEvents"]
        ):
            raise empty_window(trace, axis, t0, t1)
        with unit.path(out).open("w", encoding="utf-8") as fh:
            json.dump(doc, fh, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    return out


@contextlib.contextmanager
def verified_trace(
    trace_path: str | os.PathLike[str], *, allow_incomplete: bool = False
) -> Iterator[Trace]:
    """The open trace, after ``Trace.verify``: every column read against the digest its writer
    stored (one pass, as ``codl inspect`` and ``summarize`` check), so that a trace whose
    contents were changed or damaged is refused with one line naming it, never exported."""
    with open_trace(trace_path, allow_incomplete=allow_incomplete) as trace:
        trace.verify()
        yield trace


def empty_window(trace: Trace, axis: TimeAxis | None, t0: int | None, t1: int | None) -> CodlError:
    """The error for a window that holds no event, naming the run's span on the axis."""
    if axis is None:
        return CodlError(f"{trace.path}: no event in the window; the trace has no events")
    span = f"0 s to {axis.end_ns / 1e9:.9g} s" if axis.end_ns is not None else "from 0 s"
    return CodlError(
        f"{trace.path}: no event in the window [{axis.text(t0)}, {axis.text(t1)}) (seconds "
        f"since {'the run began' if axis.zero_is == 't_begin_ns' else 'its earliest event'}); "
        f"the run spans {span}"
    )
