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

Times are microseconds (floats, so nanoseconds survive) relative to the earliest exported
timestamp; ``otherData`` records that base as CLOCK_MONOTONIC ns, and as Unix ns when the trace
has clock anchors, so absolute times can be recovered.

The JSON holds one dict per event: export a time window (``t0``/``t1``) of long runs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from codl.errors import CodlError, TraceFormatError
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


def _time_base(trace: Trace, tables: dict[str, pd.DataFrame]) -> int:
    lows: list[int] = []
    for name, df in tables.items():
        if df.empty:
            continue
        col = "start_ns" if name in _EVENT_TABLES else "t_ns"
        lows.append(int(df[col].min()))
    if lows:
        return min(lows)
    t_begin = trace.attrs.get("t_begin_ns")
    return int(t_begin) if isinstance(t_begin, int) else 0


def _unix_base(trace: Trace, base_ns: int) -> int | None:
    anchor = trace.attrs.get("anchors_start")
    if not isinstance(anchor, dict):
        return None
    real, mono = anchor.get("realtime_ns"), anchor.get("monotonic_ns")
    if not isinstance(real, int) or not isinstance(mono, int):
        return None
    return base_ns - mono + real


def to_chrome_trace(
    trace: Trace, *, t0: int | None = None, t1: int | None = None
) -> dict[str, Any]:
    """The Chrome trace-event JSON object of ``trace`` (optionally only the window [t0, t1))."""
    tables: dict[str, pd.DataFrame] = {
        name: trace.table(name, t0=t0, t1=t1) for name in _EVENT_TABLES + _SAMPLE_TABLES
    }
    threads = trace.table(Table.THREADS).drop_duplicates(subset=["pid", "tid"], keep="last")
    b = _Builder(_time_base(trace, tables))
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
        "time_base_monotonic_ns": str(b.base_ns),
    }
    unix = _unix_base(trace, b.base_ns)
    if unix is not None:
        other["time_base_unix_ns"] = str(unix)
    # No "displayTimeUnit": Perfetto's JSON importer reads "ns" there as the unit of `ts` itself
    # (not just of the display, as in Chrome's spec), which would shrink every span 1000x.
    return {"traceEvents": b.meta + b.events, "otherData": other}


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
    t0: int | None = None,
    t1: int | None = None,
    from_s: float | None = None,
    to_s: float | None = None,
    option: str = "output",
) -> Path:
    """Write the Chrome trace JSON of the trace at ``trace_path`` to ``out_path``; returns it.

    The window is ``[t0, t1)`` in trace nanoseconds, or ``[from_s, to_s)`` in seconds since
    the run began (root attribute ``t_begin_ns``); with a chunk index only the chunks that
    overlap it are read. A window that holds no event is an error, not an empty file. The
    output is written as a unit (``codl.outputs``; ``option`` names it in errors):
    a viewer never opens a half-written file, a device or pipe is streamed to.
    """
    out = Path(out_path)
    with (
        output_unit({option: out}, inputs=(Path(trace_path),)) as unit,
        open_trace(trace_path, allow_incomplete=allow_incomplete) as trace,
    ):
        if from_s is not None or to_s is not None:
            t0, t1 = seconds_window(trace, from_s, to_s)
        doc = to_chrome_trace(trace, t0=t0, t1=t1)
        if (t0 is not None or t1 is not None) and not any(
            e["ph"] != "M" for e in doc["traceEvents"]
        ):
            raise CodlError(
                f"{trace.path}: no event in the window {_window_text(trace, t0, t1)}; "
                f"the run spans {_span_text(trace)}"
            )
        with unit.path(out).open("w", encoding="utf-8") as fh:
            json.dump(doc, fh, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    return out


def _seconds(trace: Trace, t_ns: int | None) -> str:
    begin = trace.attrs.get("t_begin_ns")
    if t_ns is None or not isinstance(begin, int):
        return "..." if t_ns is None else f"{t_ns} ns"
    return f"{(t_ns - begin) / 1e9:g} s"


def _window_text(trace: Trace, t0: int | None, t1: int | None) -> str:
    return f"[{_seconds(trace, t0)}, {_seconds(trace, t1)})"


def _span_text(trace: Trace) -> str:
    end = trace.attrs.get("t_end_ns")
    return f"0 s to {_seconds(trace, end if isinstance(end, int) else None)}"


# The largest --from/--to: far beyond any run (115 days), and in nanoseconds far inside int64.
MAX_WINDOW_S: Final = 1e7


def seconds_window(
    trace: Trace, from_s: float | None, to_s: float | None
) -> tuple[int | None, int | None]:
    """``[from_s, to_s)`` seconds since the run began as trace nanoseconds (``t_begin_ns``).

    Each bound finite and in [0, MAX_WINDOW_S], ``to_s`` after ``from_s``: CodlError otherwise
    (the command line checks the same before it opens the trace)."""
    begin = trace.attrs.get("t_begin_ns")
    if not isinstance(begin, int):
        raise TraceFormatError(
            f"{trace.path}: no integer root attribute 't_begin_ns' to count --from/--to from"
        )
    for name, value in (("--from", from_s), ("--to", to_s)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_WINDOW_S):
            raise CodlError(f"{name}: got {value}, expected seconds in [0, {MAX_WINDOW_S:g}]")
    if from_s is not None and to_s is not None and to_s <= from_s:
        raise CodlError(f"--to {to_s} must be after --from {from_s}")
    return (
        None if from_s is None else begin + round(from_s * 1e9),
        None if to_s is None else begin + round(to_s * 1e9),
    )
