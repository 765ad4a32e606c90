"""Exact scheduler events from the kernel's ftrace ring buffer: every context switch and wake-up
of the run's threads, on the run's clock (``trace.sched_events``; root only).

The default OS level (``trace.sched``) reads per-thread counters at step and phase boundaries:
cheap and unprivileged, but it gives totals per interval, so a wait can only be placed at the
end of its step and a preempter only guessed from sampled CPUs. Where the node allows it, the
kernel's own ``sched:sched_switch`` and ``sched:sched_waking`` tracepoints say when each thread
left its CPU, in which state (runnable = preempted, sleeping = blocked), who took the CPU, and who
woke it up again. Recording happens in the kernel's per-CPU ring buffers; nothing in the traced
processes runs for it, and the buffer is read only after the measured steps.

Design choices:

- A private ftrace *instance* (``instances/codl-<pid>-<n>``), so the recorder never touches the
  node's global tracing state or another user's instance, and is removed at the end.
- Every switch and wake-up on the node is recorded, with every fork, and the run's tasks are
  picked out afterwards: the given tasks, and every task forked from one of them (threads,
  loader workers) in fork order. The kernel's pid filter (``set_event_pid`` with
  ``event-fork``) would keep the buffer smaller, but whether it missed a task forked a moment
  earlier could not be told apart from the gaps below. The price is buffer space:
  ``buffer_kb`` per CPU must hold the node's switches for the run (16 MiB holds ~200,000 per
  CPU); what does not fit is counted in ``events_lost``.
- The record can lack single switch-ins: on the Firecracker test VM a few idle-to-task
  switches per second were absent with and without the pid filter, while ``events_lost``
  stayed 0. They are counted (``switch_ins_missing``: a thread switched out twice with no
  switch-in between), and ``codl.analysis.offcpu`` ends such an interval at the recorded
  wake-up instead of stretching it over time the thread ran.
- The buffer's clock is ``mono`` and the offset to this process's ``time.monotonic_ns()`` is
  measured, not assumed: a marker carrying the process's clock is written at start and stop and
  read back with the buffer's time stamp (this also holds inside a time namespace, where the two
  clocks differ). The text format has microsecond resolution, the timeline's own.
- Events lost to a full buffer are counted from the instance's per-CPU ``stats`` (``overrun``)
  and reported with the tables: an incomplete record is said to be incomplete.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codl.trace.schema import Table, empty_columns

if TYPE_CHECKING:
    import pandas as pd

SWITCH_TABLE = Table.SCHED_SWITCH
WAKING_TABLE = Table.SCHED_WAKING
_MARK = "codl-clock"
_counter = itertools.count()

# ``comm-pid [cpu] flags secs.usecs: event: fields``; comm may hold spaces and dashes, flags
# are absent when the irq-info option is off.
_LINE = re.compile(
    r"^\s*(?P<task>.*?)-(?P<pid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[(?P<cpu>\d+)\]\s+"
    r"(?:\S+\s+)?(?P<s>\d+)\.(?P<us>\d+): (?P<event>\w+): (?P<rest>.*)$"
)
_SWITCH = re.compile(
    r"prev_comm=.* prev_pid=(?P<prev>-?\d+) prev_prio=-?\d+ "
    r"prev_state=(?P<state>\S+) ==> next_comm=.* next_pid=(?P<next>-?\d+) "
)
_WAKING = re.compile(r"comm=.* pid=(?P<pid>\d+) prio=-?\d+ target_cpu=(?P<target>\d+)")
_FORK = re.compile(r"comm=.* pid=(?P<parent>\d+) child_comm=.* child_pid=(?P<child>\d+)")


class SchedEventsUnavailableError(RuntimeError):
    """The node does not let this process record scheduler events (the reason is the message)."""


def tasks_of(pids: tuple[int, ...]) -> tuple[int, ...]:
    """Every task (thread) of ``pids`` and of their descendant processes, as they are now: the
    recorder follows these and what they fork while it records, so the threads and workers
    that exist already are listed here."""
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except (OSError, ValueError):
            continue
        for tid in tids:
            if tid in seen:
                continue
            seen.add(tid)
            with contextlib.suppress(OSError, ValueError):
                text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
                todo.extend(int(c) for c in text.split())
    return tuple(sorted(seen))


def _tracefs_mount() -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "tracefs":
                return Path(parts[1])
    return None


def _write(path: Path, text: str, append: bool = False) -> None:
    # One write per call: tracefs files act on each write(2), not on the file's final content.
    fd = os.open(path, os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC))
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


@dataclass
class SchedEventRecorder:
    """One private ftrace instance following ``pids`` and every task they create afterwards."""

    pids: tuple[int, ...]
    buffer_kb: int = 16384
    _root: Path | None = None
    _instance: Path | None = None
    _mounted: Path | None = None
    _marks: dict[int, int] = field(default_factory=dict)

    def start(self) -> None:
        if os.geteuid() != 0:
            raise SchedEventsUnavailableError("scheduler events need root (tracefs instances)")
        self._root = _tracefs_mount() or self._mount()
        if not (self._root / "events" / "sched" / "sched_switch").is_dir():
            self.close()
            raise SchedEventsUnavailableError(f"{self._root} has no sched:sched_switch tracepoint")
        inst = self._root / "instances" / f"codl-{os.getpid()}-{next(_counter)}"
        try:
            inst.mkdir()
        except OSError as exc:
            self.close()
            raise SchedEventsUnavailableError(f"cannot create an ftrace instance: {exc}") from exc
        self._instance = inst
        try:
            _write(inst / "tracing_on", "0")
            _write(inst / "trace_clock", "mono")
            _write(inst / "buffer_size_kb", str(self.buffer_kb))
            for event in ("sched_switch", "sched_waking", "sched_process_fork"):
                _write(inst / "events" / "sched" / event / "enable", "1")
            _write(inst / "tracing_on", "1")
        except OSError as exc:
            self.close()
            raise SchedEventsUnavailableError(f"cannot configure {inst}: {exc}") from exc
        self.mark()

    def _mount(self) -> Path:
        where = Path(tempfile.mkdtemp(prefix="codl-tracefs-"))
        done = subprocess.run(
            ["mount", "-t", "tracefs", "nodev", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            where.rmdir()
            raise SchedEventsUnavailableError(
                f"tracefs is not mounted and cannot be: {done.stderr.strip()}"
            )
        self._mounted = where
        return where

    def mark(self, tries: int = 8) -> None:
        """Write the process's clock into the buffer, bracketed by reads before and after the
        write; read back, the narrowest bracket gives the clock offset and its error bound."""
        if self._instance is None:
            return
        marker = self._instance / "trace_marker"
        fd = os.open(marker, os.O_WRONLY)
        try:
            for _ in range(tries):
                before = time.monotonic_ns()
                os.write(fd, f"{_MARK} {before}\n".encode())
                self._marks[before] = time.monotonic_ns()
        finally:
            os.close(fd)

    def stop(self) -> None:
        if self._instance is not None:
            self.mark()
            _write(self._instance / "tracing_on", "0")

    def collect(self, rank: int = 0) -> tuple[dict[str, dict[str, list[Any]]], dict[str, Any]]:
        """The recorded events as trace tables on this process's clock, and what to store about
        them (clock offset and its spread, events lost to a full buffer)."""
        if self._instance is None:
            raise SchedEventsUnavailableError("the recorder was not started")
        text = (self._instance / "trace").read_text(errors="replace")
        tables, stamps, forks = parse(text)
        tables = only_tasks(tables, followed(self.pids, forks))
        offset, bound = clock_offset(stamps, self._marks)
        for table in tables.values():
            table["t_ns"] = [t + offset for t in table["t_ns"]]
            table["rank"] = [rank] * len(table["t_ns"])
        info = {
            "clock_offset_ns": offset,
            "clock_offset_bound_ns": bound,
            "events_lost": _overruns(self._instance),
            "switch_ins_missing": _missing(tables),
            "buffer_kb_per_cpu": self.buffer_kb,
        }
        return tables, info

    def close(self) -> None:
        if self._instance is not None:
            with contextlib.suppress(OSError):
                _write(self._instance / "tracing_on", "0")
            for _ in range(20):  # rmdir fails while a reader still holds the buffer open
                try:
                    self._instance.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
            self._instance = None
        if self._mounted is not None:
            subprocess.run(["umount", str(self._mounted)], capture_output=True, check=False)
            with contextlib.suppress(OSError):
                self._mounted.rmdir()
            self._mounted = None


def _overruns(instance: Path) -> int:
    lost = 0
    for stats in (instance / "per_cpu").glob("cpu*/stats"):
        with contextlib.suppress(OSError, ValueError):
            for line in stats.read_text().splitlines():
                if line.startswith("overrun:"):
                    lost += int(line.split()[1])
    return lost


def parse(
    text: str,
) -> tuple[dict[str, dict[str, list[Any]]], dict[int, int], list[tuple[int, int]]]:
    """Parse an instance's ``trace`` text: the switch and waking tables (time stamps still on
    the buffer's clock), the buffer's time stamp of every clock marker (by the process clock
    value the marker carries) and the (parent, child) task ids of every fork, in order."""
    switch = empty_columns(SWITCH_TABLE)
    waking = empty_columns(WAKING_TABLE)
    stamps: dict[int, int] = {}
    forks: list[tuple[int, int]] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        t_ns = int(m["s"]) * 1_000_000_000 + int(m["us"].ljust(9, "0")[:9])
        event, rest = m["event"], m["rest"]
        if event == "sched_switch":
            s = _SWITCH.match(rest + " ")
            if s is not None:
                _append(switch, t_ns, int(m["cpu"]), int(s["prev"]), s["state"], int(s["next"]))
        elif event == "sched_waking":
            w = _WAKING.match(rest)
            if w is not None:
                waking["rank"].append(0)
                waking["t_ns"].append(t_ns)
                waking["cpu"].append(int(m["cpu"]))
                waking["tid"].append(int(w["pid"]))
                waking["waker_tid"].append(int(m["pid"]))
                waking["target_cpu"].append(int(w["target"]))
        elif event == "sched_process_fork":
            f = _FORK.match(rest)
            if f is not None:
                forks.append((int(f["parent"]), int(f["child"])))
        elif event == "tracing_mark_write" and rest.startswith(_MARK):
            with contextlib.suppress(ValueError, IndexError):
                stamps[int(rest.split()[1])] = t_ns
    return {SWITCH_TABLE: switch, WAKING_TABLE: waking}, stamps, forks


def followed(tasks: tuple[int, ...], forks: list[tuple[int, int]]) -> set[int]:
    """``tasks`` and every task forked (in the order recorded) from one already followed."""
    out = set(tasks)
    for parent, child in forks:
        if parent in out:
            out.add(child)
    return out


def only_tasks(
    tables: dict[str, dict[str, list[Any]]], tasks: set[int]
) -> dict[str, dict[str, list[Any]]]:
    """The switches that involve one of ``tasks`` (either side) and the wake-ups of one."""
    sw, wk = tables[SWITCH_TABLE], tables[WAKING_TABLE]
    keep_sw = [
        p in tasks or n in tasks for p, n in zip(sw["prev_tid"], sw["next_tid"], strict=True)
    ]
    keep_wk = [t in tasks for t in wk["tid"]]
    return {
        SWITCH_TABLE: {
            c: [v for v, k in zip(col, keep_sw, strict=True) if k] for c, col in sw.items()
        },
        WAKING_TABLE: {
            c: [v for v, k in zip(col, keep_wk, strict=True) if k] for c, col in wk.items()
        },
    }


def clock_offset(stamps: dict[int, int], marks: dict[int, int]) -> tuple[int, int]:
    """(offset, bound): process clock - buffer clock, from the marker whose write was bracketed
    most tightly. The buffer stamped the marker between the reads before and after the write,
    so the offset lies within half the bracket (plus the text format's microsecond) of the
    bracket's midpoint. (0, -1) without a marker read back."""
    best: tuple[int, int] | None = None
    for before, stamp in stamps.items():
        after = marks.get(before)
        if after is None:
            continue
        half = (after - before) // 2
        if best is None or half + 1000 < best[1]:
            best = ((before + after) // 2 - stamp, half + 1000)
    return best if best is not None else (0, -1)


def _append(
    table: dict[str, list[Any]], t_ns: int, cpu: int, prev: int, state: str, nxt: int
) -> None:
    table["rank"].append(0)  # the recorder's rank is set by collect()
    table["t_ns"].append(t_ns)
    table["cpu"].append(cpu)
    table["prev_tid"].append(prev)
    # R / R+ : still runnable when switched out (preempted); anything else went to sleep.
    table["prev_state"].append(state)
    table["next_tid"].append(nxt)


def _missing(tables: dict[str, dict[str, list[Any]]]) -> int:
    import pandas as pd

    return missing_switch_ins(pd.DataFrame(tables[SWITCH_TABLE]))


def missing_switch_ins(switch: pd.DataFrame) -> int:
    """Switch-ins the record lacks: a thread switched out twice with no switch-in between.
    (On the Firecracker test VM the kernel's record lacked about one idle-to-task switch in
    ten runs of the planted test; intervals that span such a gap are dropped, not stretched.)"""
    # Imported here, as in _missing: the harness imports this module at every run's start.
    import numpy as np
    import pandas as pd

    if switch.empty:
        return 0
    outs = switch[["t_ns", "prev_tid"]].rename(columns={"prev_tid": "tid"}).assign(d=-1)
    ins = switch[["t_ns", "next_tid"]].rename(columns={"next_tid": "tid"}).assign(d=1)
    ev = pd.concat([outs, ins], ignore_index=True)
    ev = ev[ev["tid"] != 0].sort_values(["tid", "t_ns", "d"], kind="stable")
    same = ev["tid"].to_numpy() == np.roll(ev["tid"].to_numpy(), 1)
    same[0] = False  # np.roll wraps the last event round to the first
    twice_out = (ev["d"].to_numpy() == -1) & (np.roll(ev["d"].to_numpy(), 1) == -1) & same
    return int(twice_out.sum())
