"""OS-level sampler: per-thread scheduler counters and per-core utilisation from /proc.

Sampling happens on the launch thread at step boundaries, outside the timed step span. A
background sampling thread would compete for the GIL with the very thread we observe, so the
instrument would cause the preemption it is meant to reveal. File descriptors stay open and are
re-read with ``pread(fd, ..., 0)``: procfs regenerates the text on every read from offset 0, and
one syscall per file is a few microseconds.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from codl.trace.clock import now_ns
from codl.trace.schema import Table, empty_columns

_READ = 4096


@dataclass
class _Task:
    pid: int
    tid: int
    schedstat: int
    status: int
    stat: int

    def close(self) -> None:
        for fd in (self.schedstat, self.status, self.stat):
            with contextlib.suppress(OSError):
                os.close(fd)


def _parse_status(text: bytes) -> tuple[int, int]:
    vol = invol = 0
    for line in text.splitlines():
        if line.startswith(b"voluntary_ctxt_switches:"):
            vol = int(line.split()[1])
        elif line.startswith(b"nonvoluntary_ctxt_switches:"):
            invol = int(line.split()[1])
    return vol, invol


def _parse_stat_cpu(text: bytes) -> int:
    # comm (field 2) may hold spaces and parentheses: split after the last ')'. Fields after it
    # start at field 3 (state); `processor` is field 39.
    rest = text[text.rfind(b")") + 2 :].split()
    return int(rest[36])


@dataclass
class SchedSampler:
    """Samples every thread of the tracked processes; rows accumulate in column lists."""

    rank: int = 0
    per_thread: bool = True
    per_core: bool = True
    _tasks: dict[int, _Task] = field(default_factory=dict)
    _pids: set[int] = field(default_factory=set)
    _proc_stat: int | None = None
    rows: dict[str, list[Any]] = field(default_factory=lambda: empty_columns(Table.SCHED))
    cpu_rows: dict[str, list[Any]] = field(default_factory=lambda: empty_columns(Table.CPU))

    def track(self, pid: int) -> None:
        self._pids.add(pid)

    def untrack(self, pid: int) -> None:
        self._pids.discard(pid)
        for tid in [t for t, task in self._tasks.items() if task.pid == pid]:
            self._tasks.pop(tid).close()

    @property
    def pids(self) -> frozenset[int]:
        return frozenset(self._pids)

    def _discover(self) -> None:
        # Threads appear after start (autograd, pin_memory, NCCL, OpenMP): list tasks each sample.
        for pid in list(self._pids):
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except (FileNotFoundError, ProcessLookupError):
                self.untrack(pid)
                continue
            for tid in tids:
                if tid in self._tasks:
                    continue
                base = f"/proc/{pid}/task/{tid}"
                try:
                    fds = [os.open(f"{base}/{n}", os.O_RDONLY) for n in ("schedstat", "status")]
                    fds.append(os.open(f"{base}/stat", os.O_RDONLY))
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    continue
                self._tasks[tid] = _Task(pid, tid, fds[0], fds[1], fds[2])

    def sample(self, step: int) -> None:
        if not self.per_thread:
            if self.per_core:
                self._sample_cores(now_ns(), step)
            return
        self._discover()
        t = now_ns()
        rows = self.rows
        gone: list[int] = []
        for tid, task in self._tasks.items():
            try:
                run_ns, wait_ns, slices = (
                    int(x) for x in os.pread(task.schedstat, _READ, 0).split()
                )
                vol, invol = _parse_status(os.pread(task.status, _READ, 0))
                cpu = _parse_stat_cpu(os.pread(task.stat, _READ, 0))
            except (OSError, ValueError, IndexError):
                # ESRCH once the thread has exited; its earlier samples stay valid.
                gone.append(tid)
                continue
            rows["t_ns"].append(t)
            rows["rank"].append(self.rank)
            rows["step"].append(step)
            rows["pid"].append(task.pid)
            rows["tid"].append(tid)
            rows["run_ns"].append(run_ns)
            rows["wait_ns"].append(wait_ns)
            rows["timeslices"].append(slices)
            rows["voluntary"].append(vol)
            rows["involuntary"].append(invol)
            rows["cpu"].append(cpu)
        for tid in gone:
            self._tasks.pop(tid).close()
        if self.per_core:
            self._sample_cores(t, step)

    def _sample_cores(self, t: int, step: int) -> None:
        """One ``samples/cpu`` row per ``cpuN`` line of ``/proc/stat``, in ticks.

        Hand-written instead of ``psutil.cpu_times(percpu=True)``, for a measured reason:
        ``benchmarks/proc_stat_cost.py`` times psutil at 2.1x this reader's cost per sample (174
        vs 82 us on the 2-core CI machine, load ~13; the same ticks), since psutil reopens and
        parses the file as text and returns seconds that must be turned back into ticks. And
        this keeps each line's own CPU number, where psutil numbers the lines in order (another
        CPU's row once a CPU is offline).
        """
        if self._proc_stat is None:
            self._proc_stat = os.open("/proc/stat", os.O_RDONLY)
        # /proc/stat grows with the core count; 64 KiB holds ~500 cores' lines.
        text = os.pread(self._proc_stat, 65536, 0)
        rows = self.cpu_rows
        for line in text.splitlines():
            if not line.startswith(b"cpu") or line.startswith(b"cpu "):
                continue
            parts = line.split()
            vals = [int(v) for v in parts[1:9]]
            user, nice, system, idle, iowait, irq, softirq, steal = vals
            rows["t_ns"].append(t)
            rows["rank"].append(self.rank)
            rows["step"].append(step)
            rows["cpu"].append(int(parts[0][3:]))
            rows["user"].append(user)
            rows["system"].append(system)
            rows["idle"].append(idle)
            rows["iowait"].append(iowait)
            rows["other"].append(nice + irq + softirq + steal)

    def close(self) -> None:
        for task in self._tasks.values():
            task.close()
        self._tasks.clear()
        if self._proc_stat is not None:
            with contextlib.suppress(OSError):
                os.close(self._proc_stat)
            self._proc_stat = None


@dataclass
class PhaseSched:
    """The launch roles' scheduler counters at phase boundaries, as ``events/phase_sched`` rows.

    Per-step samples (``SchedSampler``) cover the whole step, the batch hand-off included, so
    they cannot say how much of a *compute span* the launch path spent preempted. This reads
    the counters just before a phase opens and just after it closes. Cost per boundary: one
    ``clock_gettime(CLOCK_THREAD_CPUTIME_ID)`` for the calling (main) thread, whose schedstat
    run time lags by up to a tick while it runs, and one ``pread`` of schedstat per launch-role
    thread (main + autograd: 3 syscalls; benchmarks/harness_overhead.py measures them). The
    harness reads inside the span, so the counters never cover time outside it.
    """

    rank: int = 0
    main_tid: int = field(default_factory=threading.get_native_id)
    _fds: dict[int, int] = field(default_factory=dict)
    rows: dict[str, list[Any]] = field(default_factory=lambda: empty_columns(Table.PHASE_SCHED))

    def __post_init__(self) -> None:
        self.set_threads([])

    def set_threads(self, tids: list[int]) -> None:
        """Read the main thread and ``tids`` (the other launch roles, e.g. autograd) from now on;
        threads not among them any more are closed."""
        want = {self.main_tid, *tids}
        for tid in [t for t in self._fds if t not in want]:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop(tid))
        for tid in sorted(want - set(self._fds)):
            try:
                self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue

    @property
    def tids(self) -> frozenset[int]:
        return frozenset(self._fds)

    def read(self) -> dict[int, tuple[int, int, int]]:
        """tid -> (on-CPU ns, run-queue ns, timeslices) now; a thread that has exited is left
        out (its span gets no row rather than a made-up one)."""
        out: dict[int, tuple[int, int, int]] = {}
        for tid, fd in self._fds.items():
            try:
                run_ns, wait_ns, slices = (int(x) for x in os.pread(fd, 256, 0).split())
            except (OSError, ValueError):
                continue
            out[tid] = (run_ns, wait_ns, slices)
        if self.main_tid in out:
            _, wait_ns, slices = out[self.main_tid]
            out[self.main_tid] = (time.thread_time_ns(), wait_ns, slices)
        return out

    def record(
        self,
        step: int,
        phase: str,
        span: tuple[int, int],
        before: dict[int, tuple[int, int, int]],
        after: dict[int, tuple[int, int, int]],
    ) -> None:
        r = self.rows
        for tid in sorted(before.keys() & after.keys()):
            (r0, w0, s0), (r1, w1, s1) = before[tid], after[tid]
            r["rank"].append(self.rank)
            r["step"].append(step)
            r["phase"].append(phase)
            r["tid"].append(tid)
            r["start_ns"].append(span[0])
            r["end_ns"].append(span[1])
            r["run_ns"].append(r1 - r0)
            r["wait_ns"].append(w1 - w0)
            r["timeslices"].append(s1 - s0)

    def close(self) -> None:
        self.set_threads([])
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
