"""The launch roles' sleeps, classified by what ended them, on a planted scheduler record."""

from __future__ import annotations

import pandas as pd
import pytest

from codl.analysis.sleeps import launch_sleeps, run_sleeps
from codl.trace.schema import Table

MAIN, AUTOGRAD, PIN, WORKER = 100, 101, 102, 200
MS = 1_000_000


def _tables(sleeps: list[tuple[int, int, int, int]]) -> dict[str, pd.DataFrame]:
    """``sleeps``: (tid, start_ms, length_ms, waker) of each sleep; two compute spans of 20 ms
    (steps 0 = warm-up and 1), one rank."""
    switch, waking = [], []
    for tid, start, length, waker in sleeps:
        out, wake = start * MS, (start + length) * MS
        switch.append({"t_ns": out, "cpu": 1, "prev_tid": tid, "prev_state": "S", "next_tid": 0})
        waking.append({"t_ns": wake, "cpu": 1, "tid": tid, "waker_tid": waker, "target_cpu": 1})
        switch.append(
            {"t_ns": wake + 1000, "cpu": 1, "prev_tid": 0, "prev_state": "R", "next_tid": tid}
        )
    roles = {MAIN: "launch", AUTOGRAD: "autograd", PIN: "pin_memory", WORKER: "loader"}
    return {
        Table.APP: pd.DataFrame(
            {
                "rank": [0, 0],
                "step": [0, 1],
                "phase": ["compute", "compute"],
                "start_ns": [0, 100 * MS],
                "end_ns": [20 * MS, 120 * MS],
            }
        ),
        Table.THREADS: pd.DataFrame(
            {"rank": 0, "tid": list(roles), "role": list(roles.values()), "pid": 1}
        ),
        Table.SCHED_SWITCH: pd.DataFrame(switch).assign(rank=0),
        Table.SCHED_WAKING: pd.DataFrame(waking).assign(rank=0),
    }


def test_sleeps_are_classified_by_what_ended_them_in_measured_compute_spans() -> None:
    tables = _tables(
        [
            (MAIN, 5, 5, 0),  # warm-up step: left out
            (MAIN, 101, 5, 0),  # a timer: a timed GIL wait ran out
            (AUTOGRAD, 103, 5, 0),
            (MAIN, 107, 1, PIN),  # the pin-memory thread let go
            (AUTOGRAD, 110, 2, WORKER),
            (MAIN, 113, 1, 999),  # a thread the table does not know
            (MAIN, 150, 5, 0),  # after the span: not in a compute phase
            (PIN, 104, 3, 0),  # not a launch role
        ]
    )
    s = launch_sleeps(tables, warmup=1)
    assert list(s["ended_by"]) == ["timer", "timer", "pin_memory", "loader", "unknown"]
    assert list(s["role"]) == ["launch", "autograd", "launch", "autograd", "launch"]
    assert (s["step"] == 1).all()
    assert s["blocked_ms"].tolist() == pytest.approx([5, 5, 1, 2, 1])
    got = run_sleeps(s, steps=1)
    assert got["timer_sleeps_per_step"] == 2
    assert got["timer_sleep_ms_p50"] == pytest.approx(5)
    assert got["timer_sleep_ms_per_step"] == pytest.approx(10)
    assert got["pin_memory_sleep_ms_per_step"] == pytest.approx(1)
    assert got["loader_sleeps_per_step"] == 1


def test_without_the_record_there_is_nothing_to_classify() -> None:
    tables = _tables([])
    del tables[Table.SCHED_SWITCH]
    assert launch_sleeps(tables, warmup=0).empty
    with pytest.raises(ValueError, match="steps"):
        run_sleeps(launch_sleeps(tables, warmup=0), steps=0)
