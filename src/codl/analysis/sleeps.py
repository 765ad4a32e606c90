"""The launch roles' sleeps and what ended each: the evidence for (or against) GIL waits.

With the kernel's scheduler record (``trace.sched_events``) every time the main thread or the
autograd thread slept inside a measured compute span is an interval with a waker: a timer
(waker 0: CPython's timed GIL wait runs out after the switch interval, and the waiter then asks
the holder to let go), the pin-memory thread, a loader worker, another thread of the launch path,
or a thread we did not record. If the timer-ended sleeps are GIL waits, their length follows
``sys.setswitchinterval`` (``runtime.switch_interval_ms``): that is the intervention test of
issue 31, and :func:`run_sleeps` is its per-run statistic.

Pure: trace tables in, DataFrames out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from codl.analysis.decompose import TIMER_WAKER, launch_offcpu
from codl.pinning import Role
from codl.trace.schema import Table

#: What ended a sleep: the waker's role, ``timer`` (waker 0) or ``unknown`` (no wake-up seen or
#: a thread outside the rank's thread table).
TIMER = "timer"
UNKNOWN = "unknown"
SLEEP_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "role": "str",
    "start_ns": "int64",
    "blocked_ms": "float64",
    "ended_by": "str",
}


def launch_sleeps(tables: Mapping[str, pd.DataFrame], *, warmup: int) -> pd.DataFrame:
    """One row per sleep of a launch role that began inside a measured compute span, with the
    step it fell in and what ended it (:data:`SLEEP_COLUMNS`). Empty without the record."""
    switch, waking = tables.get(Table.SCHED_SWITCH), tables.get(Table.SCHED_WAKING)
    threads, app = tables[Table.THREADS], tables[Table.APP]
    if switch is None or waking is None or switch.empty or threads.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in SLEEP_COLUMNS.items()})
    frames = [
        _rank_sleeps(rank, win, roles, iv)
        for rank, win, roles, iv in launch_offcpu(app, threads, switch, waking, warmup=warmup)
    ]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in SLEEP_COLUMNS.items()})
    return pd.concat(frames, ignore_index=True).astype(SLEEP_COLUMNS)


def _rank_sleeps(
    rank: int, windows: pd.DataFrame, roles: pd.DataFrame, iv: pd.DataFrame
) -> pd.DataFrame:
    role_of = dict(zip(roles["tid"].to_numpy(), roles["role"], strict=True))
    iv = iv[iv["state"] == "blocked"]
    if iv.empty:
        return pd.DataFrame()
    w = windows.sort_values("start_ns")
    lo, hi = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
    start = iv["start_ns"].to_numpy(np.int64)
    # The span each sleep began in: the last span starting at or before it, if it has not ended.
    k = np.searchsorted(lo, start, side="right") - 1
    inside = (k >= 0) & (start < hi[np.clip(k, 0, None)])
    iv, k = iv[inside], k[inside]
    waker = iv["waker_tid"].to_numpy(np.int64)
    ended = [TIMER if t == TIMER_WAKER else str(role_of.get(t, UNKNOWN)) for t in waker]
    return pd.DataFrame(
        {
            "rank": rank,
            "step": w["step"].to_numpy(np.int64)[k],
            "role": [str(role_of[t]) for t in iv["tid"].to_numpy(np.int64)],
            "start_ns": iv["start_ns"].to_numpy(np.int64),
            "blocked_ms": iv["blocked_ns"].to_numpy(np.float64) / 1e6,
            "ended_by": ended,
        }
    )


def run_sleeps(sleeps: pd.DataFrame, steps: int) -> dict[str, float]:
    """Per run: the launch roles' timer-ended sleeps per measured (rank, step) and their length
    (median and the 10-90 % range), and the time per step they slept until a timer, the
    pin-memory thread or a loader worker woke them. ``steps``: the measured (rank, step)s."""
    if steps <= 0:
        raise ValueError(f"steps: got {steps}, expected the number of measured (rank, step)s > 0")
    timer = sleeps.loc[sleeps["ended_by"] == TIMER, "blocked_ms"].to_numpy(np.float64)
    q = np.percentile(timer, [10, 50, 90]) if len(timer) else np.full(3, np.nan)
    out = {
        "timer_sleeps_per_step": len(timer) / steps,
        "timer_sleep_ms_p10": float(q[0]),
        "timer_sleep_ms_p50": float(q[1]),
        "timer_sleep_ms_p90": float(q[2]),
        "timer_sleep_ms_per_step": float(timer.sum()) / steps,
    }
    for role in (Role.PIN_MEMORY.value, Role.LOADER.value):
        mine = sleeps.loc[sleeps["ended_by"] == role, "blocked_ms"]
        out[f"{role}_sleeps_per_step"] = len(mine) / steps
        out[f"{role}_sleep_ms_per_step"] = float(mine.sum()) / steps
    return out
