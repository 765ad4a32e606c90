"""Off-CPU intervals of threads from exact scheduler events (``events/sched_switch`` and
``events/sched_waking``, trace level ``sched_events``): pure functions, DataFrames in and out.

A thread leaves its CPU at a switch and returns at the next switch that names it as ``next``.
Left *runnable* (``prev_state`` R, R+) it was preempted: the whole interval is run-queue wait and
the thread that took the CPU is the preempter. Left *sleeping* (S, D, ...) it blocked: the
interval splits at its wake-up into time blocked (until ``sched_waking``, whose issuer is the
waker) and run-queue wait (wake-up to switch-in). These are the exact counterparts of the
per-step schedstat totals and the per-call switch counters, placed at their real times.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.analysis.intervals import interval_union

COLUMNS = (
    "tid",
    "start_ns",
    "end_ns",
    "state",
    "runnable_ns",
    "blocked_ns",
    "cpu_out",
    "cpu_in",
    "preempted_by",
    "waker_tid",
)


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in COLUMNS}).astype({"state": object})


def offcpu_intervals(
    switch: pd.DataFrame, waking: pd.DataFrame, tids: Iterable[int] | None = None
) -> pd.DataFrame:
    """One row per interval a thread spent off its CPU (switched out, then in again).

    ``state`` is ``preempted`` or ``blocked``; ``runnable_ns`` is the time it was runnable but not
    running (the whole interval when preempted; wake-up to switch-in when blocked);
    ``blocked_ns`` the time asleep (0 when preempted); ``preempted_by`` the task that held its
    CPU longest while it was preempted (-1 otherwise); ``waker_tid`` the thread that woke it
    (-1 when preempted or when the wake-up was not recorded). Intervals still open at the end
    are left out.
    """
    if switch.empty:
        return _empty()
    wanted = set(switch["prev_tid"]) - {0} if tids is None else set(tids)
    frames = [_one_thread(tid, switch, waking) for tid in sorted(wanted)]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return _empty()
    out = pd.concat(frames, ignore_index=True).sort_values(["start_ns", "tid"], ignore_index=True)
    out["preempted_by"] = _longest_occupants(out, switch)
    return out


def _longest_occupants(iv: pd.DataFrame, switch: pd.DataFrame) -> np.ndarray:
    """For each preempted interval, the task that held its CPU longest meanwhile, from that
    CPU's recorded switches (the task switched in runs until the CPU's next switch). The task
    switched in first is often a short-lived one (a kworker, a woken thread) that then yields
    to the real preempter; only switches that involve a followed task are recorded, so time
    between two unrecorded tasks counts for the last recorded one."""
    by = iv["preempted_by"].to_numpy(np.int64).copy()
    pre = np.flatnonzero(iv["state"].to_numpy() == "preempted")
    ordered = switch.sort_values("t_ns")
    cpu_col = ordered["cpu"].to_numpy(np.int64)
    per_cpu = {
        int(c): (
            ordered["t_ns"].to_numpy(np.int64)[cpu_col == c],
            ordered["next_tid"].to_numpy(np.int64)[cpu_col == c],
        )
        for c in np.unique(cpu_col)
    }
    starts = iv["start_ns"].to_numpy(np.int64)
    ends = iv["end_ns"].to_numpy(np.int64)
    cpus = iv["cpu_out"].to_numpy(np.int64)
    tids = iv["tid"].to_numpy(np.int64)
    for i in pre:
        t, who = per_cpu[int(cpus[i])]
        lo = np.searchsorted(t, starts[i], side="right") - 1
        hi = np.searchsorted(t, ends[i], side="left")
        if hi <= lo:
            continue
        seg_t = np.clip(np.append(t[lo:hi], ends[i]), starts[i], ends[i])
        occupant, held = who[lo:hi], np.diff(seg_t)
        keep = (occupant != 0) & (occupant != tids[i]) & (held > 0)
        if keep.any():
            tasks, index = np.unique(occupant[keep], return_inverse=True)
            by[i] = int(tasks[np.argmax(np.bincount(index, weights=held[keep]))])
    return by


def _one_thread(tid: int, switch: pd.DataFrame, waking: pd.DataFrame) -> pd.DataFrame:
    out = switch[switch["prev_tid"] == tid].sort_values("t_ns")
    if out.empty:
        return _empty()
    back = switch[switch["next_tid"] == tid].sort_values("t_ns")
    t_out = out["t_ns"].to_numpy(np.int64)
    # A sentinel switch-in after everything keeps the indexing simple; it never matches.
    never = np.iinfo(np.int64).max
    t_back = np.append(back["t_ns"].to_numpy(np.int64), never)
    cpu_back = np.append(back["cpu"].to_numpy(np.int64), -1)
    nxt = np.searchsorted(t_back, t_out, side="left")
    next_out = np.append(t_out[1:], never)
    # A switch-in missing from the record (it happens: ftrace.missing_switch_ins) must not join two
    # off-CPU intervals into one that spans time the thread ran. Such an interval ends at the
    # thread's wake-up when one was recorded before its next switch-out (the time asleep and
    # the waker are still exact; the run-queue wait after it is unknown and counted 0), and
    # is dropped otherwise.
    found = (t_back[nxt] < never) & (t_back[nxt] <= next_out)
    preempted = out["prev_state"].astype(str).str.startswith("R").to_numpy()
    wake_t, waker = _wakeups(tid, waking, t_out, np.where(found, t_back[nxt], next_out))
    woke = ~preempted & (wake_t >= 0)
    keep = found | woke
    end = np.where(found, t_back[nxt], wake_t)
    blocked = np.where(preempted, 0, np.where(woke, wake_t - t_out, end - t_out))
    frame = pd.DataFrame(
        {
            "tid": tid,
            "start_ns": t_out,
            "end_ns": end,
            "state": np.where(preempted, "preempted", "blocked"),
            "runnable_ns": (end - t_out) - blocked,
            "blocked_ns": blocked,
            "cpu_out": out["cpu"].to_numpy(np.int64),
            "cpu_in": np.where(found, cpu_back[nxt], -1),
            "preempted_by": np.where(preempted, out["next_tid"].to_numpy(np.int64), -1),
            "waker_tid": np.where(woke, waker, -1),
        }
    )
    return frame[keep].reset_index(drop=True)


def _wakeups(
    tid: int, waking: pd.DataFrame, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The first wake-up of ``tid`` inside each [start, end]: its time and waker (-1, -1 none)."""
    w = waking[waking["tid"] == tid].sort_values("t_ns")
    t_w = w["t_ns"].to_numpy(np.int64)
    if len(t_w) == 0:
        return np.full(len(start), -1, np.int64), np.full(len(start), -1, np.int64)
    i = np.searchsorted(t_w, start, side="left")
    inside = i < len(t_w)
    inside[inside] &= t_w[i[inside]] <= end[inside]
    when = np.where(inside, t_w[np.minimum(i, len(t_w) - 1)], -1)
    who = np.where(inside, w["waker_tid"].to_numpy(np.int64)[np.minimum(i, len(t_w) - 1)], -1)
    return when, who


def overlap_by_window(
    intervals: pd.DataFrame, windows: pd.DataFrame, key: str = "window"
) -> pd.DataFrame:
    """Runnable and blocked time of each window's thread inside the window.

    ``windows`` has ``tid``, ``start_ns``, ``end_ns`` and a ``key`` column (a call's index, a
    phase's step). Returns one row per window: ``key``, ``runnable_ns``, ``blocked_ns``,
    ``preempted_by`` (the thread that took the CPU for the longest preemption, -1 none) and
    ``waker_tid`` (the waker of the longest block, -1 none). Parts of an interval outside the
    window are cut off; for a blocked interval the wake-up splits it as in ``offcpu_intervals``.
    """
    rows = []
    iv_tid = intervals["tid"].to_numpy(np.int64)
    by_tid = {int(t): intervals[iv_tid == t] for t in np.unique(iv_tid)}
    cols_in = zip(
        windows["tid"].to_numpy(np.int64),
        windows["start_ns"].to_numpy(np.int64),
        windows["end_ns"].to_numpy(np.int64),
        windows[key].tolist(),
        strict=True,
    )
    for tid, lo, hi, label in cols_in:
        rows.append(_window(by_tid.get(int(tid)), int(lo), int(hi), label))
    cols = [key, "runnable_ns", "blocked_ns", "preempted_by", "waker_tid"]
    return pd.DataFrame(rows, columns=cols)


def _window(g: pd.DataFrame | None, lo: int, hi: int, label: object) -> tuple[object, ...]:
    if g is None:
        return (label, 0, 0, -1, -1)
    g = g[(g["end_ns"] > lo) & (g["start_ns"] < hi)]
    if g.empty:
        return (label, 0, 0, -1, -1)
    start = g["start_ns"].to_numpy(np.int64)
    end = g["end_ns"].to_numpy(np.int64)
    wake = start + g["blocked_ns"].to_numpy(np.int64)  # = start for preempted intervals
    blocked = np.clip(np.minimum(wake, hi) - np.maximum(start, lo), 0, None)
    runnable = np.clip(np.minimum(end, hi) - np.maximum(wake, lo), 0, None)
    pre = g["state"].to_numpy() == "preempted"
    by = int(g["preempted_by"].to_numpy()[pre][np.argmax(runnable[pre])]) if pre.any() else -1
    blk = ~pre
    waker = int(g["waker_tid"].to_numpy()[blk][np.argmax(blocked[blk])]) if blk.any() else -1
    return (label, int(runnable.sum()), int(blocked.sum()), by, waker)


def blocked_by_in_windows(
    intervals: pd.DataFrame, windows: pd.DataFrame, wakers: Iterable[int]
) -> npt.NDArray[np.int64]:
    """Per window (rows of ``windows``: ``start_ns``, ``end_ns``), the time (ns) in which at
    least one of the intervals' threads slept until one of ``wakers`` woke it, inside the window.

    The union over threads, so two threads asleep on the same holder at once count once. This is
    time lost to a lock or the GIL held by a thread off the launch path: its waker is the thread
    that let go of it (a CPython thread that drops the GIL signals the one waiting for it), or
    a timer (waker 0) where the waiter's timed wait ran out first.
    """
    lo = windows["start_ns"].to_numpy(np.int64)
    hi = windows["end_ns"].to_numpy(np.int64)
    out = np.zeros(len(windows), np.int64)
    b = intervals[(intervals["state"] == "blocked") & intervals["waker_tid"].isin(set(wakers))]
    if b.empty or not len(windows):
        return out
    s = b["start_ns"].to_numpy(np.int64)
    sleeps = interval_union(s, s + b["blocked_ns"].to_numpy(np.int64))
    # Disjoint sorted sleeps: each window sums those that overlap it (two binary searches),
    # clipped to its bounds.
    for i in range(len(windows)):
        a = np.searchsorted(sleeps[:, 1], lo[i], side="right")
        z = np.searchsorted(sleeps[:, 0], hi[i], side="left")
        if z > a:
            seg = sleeps[a:z]
            out[i] = int((np.minimum(seg[:, 1], hi[i]) - np.maximum(seg[:, 0], lo[i])).sum())
    return out
