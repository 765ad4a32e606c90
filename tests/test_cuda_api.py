"""The `cuda_api` level without a GPU: the C shim driven as CUPTI would drive it, its build cache,
and the conversion of its records into events/cuda rows. (tests/test_cuda.py runs it under real
CUPTI on a GPU and checks the shim's struct against cupti_callbacks.h.)"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from codl.analysis import calls as calls_analysis
from codl.errors import CodlError
from codl.trace import cuda_api

ENTER, EXIT = 0, 1
LAUNCH, SYNC = 211, 165  # arbitrary callback ids; names come from the map passed to to_rows


class CallbackData(ctypes.Structure):
    """CUpti_CallbackData, as CUPTI hands it to the callback."""

    _fields_ = (
        ("callback_site", ctypes.c_int32),
        ("function_name", ctypes.c_char_p),
        ("function_params", ctypes.c_void_p),
        ("function_return_value", ctypes.c_void_p),
        ("symbol_name", ctypes.c_char_p),
        ("context", ctypes.c_void_p),
        ("context_uid", ctypes.c_uint32),
        ("correlation_data", ctypes.POINTER(ctypes.c_uint64)),
        ("correlation_id", ctypes.c_uint32),
    )


class Shim:
    """The compiled shim, called the way CUPTI calls it (one shared library per process)."""

    def __init__(self, capacity: int) -> None:
        self.lib = ctypes.CDLL(str(cuda_api.build_shim()))
        self.lib.codl_init.argtypes = [ctypes.c_uint64]
        self.lib.codl_arm.argtypes = [ctypes.c_int]
        self.lib.codl_set_sched.argtypes = [ctypes.c_int]
        self.lib.codl_set_baseline_age.argtypes = [ctypes.c_int64]
        self.lib.codl_claimed.restype = ctypes.c_uint64
        self.lib.codl_written.restype = ctypes.c_uint64
        self.lib.codl_records.restype = ctypes.c_void_p
        self.lib.codl_cupti_callback.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int32,
            ctypes.c_uint32,
            ctypes.c_void_p,
        ]
        assert self.lib.codl_init(capacity) == 0
        self.capacity = capacity
        # The library is shared by every Shim of this process: reset its settings.
        self.lib.codl_set_sched(0)
        self.lib.codl_set_baseline_age(1_000_000)
        self.lib.codl_arm(1)

    def call(self, domain: int, cbid: int, correlation: int, inner: Any = None) -> None:
        """One API call: entry, optionally something nested inside, exit."""
        slot = ctypes.c_uint64(0)
        data = CallbackData(correlation_data=ctypes.pointer(slot), correlation_id=correlation)
        data.callback_site = ENTER
        self.lib.codl_cupti_callback(None, domain, cbid, ctypes.byref(data))
        if inner is not None:
            inner()
        data.callback_site = EXIT
        self.lib.codl_cupti_callback(None, domain, cbid, ctypes.byref(data))

    def records(self) -> np.ndarray[Any, np.dtype[Any]]:
        n = min(int(self.lib.codl_written()), self.capacity)
        if n == 0:
            return np.zeros(0, dtype=cuda_api.RECORD)
        buf = (ctypes.c_char * (n * cuda_api.RECORD.itemsize)).from_address(self.lib.codl_records())
        return np.frombuffer(bytes(buf), dtype=cuda_api.RECORD)


def in_thread(fn: Any) -> None:
    # Nesting depth is per thread: each scenario gets a thread of its own.
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def test_an_api_call_is_stamped_on_entry_and_exit_by_its_thread() -> None:
    shim = Shim(16)
    tids: list[int] = []

    def run() -> None:
        tids.append(threading.get_native_id())
        shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 7)

    in_thread(run)
    (rec,) = shim.records()
    assert rec["tid"] == tids[0]
    assert rec["domain"] == cuda_api.DOMAIN_RUNTIME
    assert rec["cbid"] == LAUNCH
    assert rec["correlation"] == 7
    assert 0 < rec["start_ns"] <= rec["end_ns"]


def test_a_driver_launch_inside_a_runtime_call_is_not_counted_twice() -> None:
    shim = Shim(16)

    def run() -> None:
        nested = lambda: shim.call(cuda_api.DOMAIN_DRIVER, 17, 2)  # noqa: E731
        shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 1, inner=nested)
        shim.call(cuda_api.DOMAIN_DRIVER, 17, 3)  # cuDNN-style direct driver launch

    in_thread(run)
    rec = shim.records()
    assert rec["correlation"].tolist() == [1, 3]
    assert rec["domain"].tolist() == [cuda_api.DOMAIN_RUNTIME, cuda_api.DOMAIN_DRIVER]


def test_an_exit_without_entry_does_not_hide_later_driver_launches() -> None:
    shim = Shim(16)

    def run() -> None:
        data = CallbackData(correlation_data=ctypes.pointer(ctypes.c_uint64(0)))
        data.callback_site = EXIT  # the call began before the subscription
        shim.lib.codl_cupti_callback(None, cuda_api.DOMAIN_RUNTIME, LAUNCH, ctypes.byref(data))
        shim.call(cuda_api.DOMAIN_DRIVER, 17, 9)

    in_thread(run)
    rec = shim.records()
    assert 9 in rec["correlation"].tolist()
    # The orphan exit carries no entry stamp; to_rows drops it (start before arming).
    rows = cuda_api.to_rows(rec, {}, _Spans([]), armed_at=1)
    assert rows["correlation"] == [9]


def test_disarmed_records_nothing_and_a_full_buffer_counts_drops() -> None:
    shim = Shim(3)
    shim.lib.codl_arm(0)
    in_thread(lambda: shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 1))
    assert shim.lib.codl_claimed() == 0
    shim.lib.codl_arm(1)
    in_thread(lambda: [shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, i) for i in range(5)])
    assert shim.lib.codl_claimed() == 5
    assert shim.records()["correlation"].tolist() == [0, 1, 2]


def test_threads_record_concurrently_without_losing_or_mixing_calls() -> None:
    shim = Shim(1 << 16)
    per_thread = 3000
    tids: dict[int, int] = {}

    def run(k: int) -> None:
        tids[k] = threading.get_native_id()
        for i in range(per_thread):
            shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, k * per_thread + i)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec = shim.records()
    assert len(rec) == 4 * per_thread
    assert sorted(rec["correlation"].tolist()) == list(range(4 * per_thread))
    for k, tid in tids.items():
        mine = rec[rec["tid"] == tid]["correlation"]
        # Each thread's calls are its own, in its own order.
        assert mine.tolist() == list(range(k * per_thread, (k + 1) * per_thread))


class _Spans:
    def __init__(self, steps: list[tuple[int, int, int]]) -> None:
        self.rows: dict[str, list[Any]] = {
            "rank": [3] * len(steps),
            "step": [s for s, _, _ in steps],
            "phase": ["step"] * len(steps),
            "start_ns": [a for _, a, _ in steps],
            "end_ns": [b for _, _, b in steps],
        }


def test_records_become_runtime_rows_in_their_steps() -> None:
    rec = np.zeros(4, dtype=cuda_api.RECORD)
    rec["start_ns"] = [50, 150, 250, 320]
    rec["end_ns"] = [60, 160, 290, 330]
    rec["tid"] = [11, 11, 12, 11]
    rec["domain"] = cuda_api.DOMAIN_RUNTIME
    rec["cbid"] = [LAUNCH, LAUNCH, SYNC, 999]
    rec["correlation"] = [1, 2, 3, 4]
    names = {
        (cuda_api.DOMAIN_RUNTIME, LAUNCH): "cudaLaunchKernel",
        (cuda_api.DOMAIN_RUNTIME, SYNC): "cudaStreamSynchronize",
    }
    spans = _Spans([(0, 100, 200), (1, 200, 300)])
    rows = cuda_api.to_rows(rec, names, spans)
    assert rows["step"] == [-1, 0, 1, -1]  # before the first step, steps 0 and 1, after the last
    assert rows["kind"] == ["runtime", "runtime", "sync", "runtime"]
    assert rows["name"] == [
        "cudaLaunchKernel",
        "cudaLaunchKernel",
        "cudaStreamSynchronize",
        "cbid999",
    ]
    assert rows["rank"] == [3] * 4
    assert rows["stream"] == [-1] * 4
    assert rows["end_ns"] == [60, 160, 290, 330]


def test_wanted_functions() -> None:
    for name in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync"):
        assert cuda_api.wanted(cuda_api.DOMAIN_RUNTIME, name)
    for name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
        assert cuda_api.wanted(cuda_api.DOMAIN_RUNTIME, name)
    for name in ("cudaGetDevice", "cudaEventRecord", "cudaMalloc", "cudaStreamIsCapturing"):
        assert not cuda_api.wanted(cuda_api.DOMAIN_RUNTIME, name)
    assert cuda_api.wanted(cuda_api.DOMAIN_DRIVER, "cuLaunchKernelEx")
    assert not cuda_api.wanted(cuda_api.DOMAIN_DRIVER, "cuMemcpyHtoDAsync")


def test_the_shim_is_built_once_per_source_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = cuda_api.build_shim(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert cuda_api.build_shim(tmp_path) == first
    assert first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind
    monkeypatch.setenv("CC", "no-such-compiler")
    assert cuda_api.build_shim(tmp_path) == first  # cached: no compiler needed


def test_a_missing_compiler_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(CodlError, match="'no-such-compiler' is not on PATH"):
        cuda_api.build_shim(tmp_path)


def test_a_compiler_error_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "cc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'shim.c:1: error: broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(CodlError, match=r"shim\.c:1: error: broken"):
        cuda_api.build_shim(tmp_path / "cache")


def test_an_unloadable_libcupti_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODL_LIBCUPTI", os.devnull)
    assert cuda_api.find_cupti() == os.devnull
    with pytest.raises(CodlError, match=f"cannot load libcupti {os.devnull}"):
        cuda_api.ApiTracer(capacity=8)


def test_without_sched_evidence_the_evidence_columns_say_not_measured() -> None:
    shim = Shim(4)
    in_thread(lambda: shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 1))
    (rec,) = shim.records()
    assert rec["thread_cpu_ns"] == -1
    assert (rec["voluntary"], rec["involuntary"]) == (-1, -1)
    assert (rec["cpu_entry"], rec["cpu_exit"]) == (-1, -1)


def test_sched_evidence_covers_the_call_and_not_what_lies_between_calls() -> None:
    shim = Shim(4)
    shim.lib.codl_set_sched(1)
    cpu_ns = 20_000_000

    def run() -> None:
        shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 1, inner=lambda: spin_cpu(cpu_ns))
        time.sleep(0.03)  # between calls: off CPU, but in no call
        shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 2)

    in_thread(run)
    spun, short = shim.records()
    wall = int(spun["end_ns"] - spun["start_ns"])
    assert cpu_ns <= spun["thread_cpu_ns"] <= wall + 2_000_000
    if wall - spun["thread_cpu_ns"] > 1_000_000:  # off CPU for a while: it must say why
        assert spun["voluntary"] + spun["involuntary"] >= 1
    # The sleep between the calls is not charged to the second call.
    assert short["voluntary"] == 0
    assert 0 <= short["thread_cpu_ns"] < 5_000_000
    assert 0 <= short["cpu_entry"] < os.cpu_count()  # type: ignore[operator]
    assert 0 <= short["cpu_exit"] < os.cpu_count()  # type: ignore[operator]


def until_quiet(
    attempt: Callable[[], tuple[np.ndarray[Any, np.dtype[Any]], bool]],
) -> np.ndarray[Any, np.dtype[Any]]:
    """The records of the first of 20 attempts whose planted spin nothing preempted."""
    for _ in range(20):
        rec, quiet = attempt()
        if quiet:
            return rec
    raise AssertionError("every spin was preempted: the machine is too busy to plant this")


def test_cpu_time_at_entry_is_carried_from_the_last_clock_read_while_nothing_switched() -> None:
    """The shim reads the CPU clock only after a switch; in between, CPU time advances with
    wall time. A call that sleeps after 1.5 ms of switch-free spinning must be charged ~0 CPU."""

    def attempt() -> tuple[np.ndarray[Any, np.dtype[Any]], bool]:
        shim = Shim(64)
        shim.lib.codl_set_sched(1)
        shim.lib.codl_set_baseline_age(10_000_000)  # carry across the spin (default: 1 ms)
        quiet: list[bool] = []

        def run() -> None:
            for i in range(20):  # fast calls: CPU time == duration when they did not switch
                shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, i)
            before = switches()
            spin_cpu(1_500_000)  # under the 10 ms baseline age: carried, not re-read
            quiet.append(switches() == before)
            shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 99, inner=lambda: time.sleep(0.02))

        in_thread(run)
        return shim.records(), quiet[0]

    # The carried path needs a spin that nothing preempted (2 CPUs shared with other jobs):
    # a preempted spin makes the shim re-read the clock, which is right but not this test.
    rec = until_quiet(attempt)
    fast, slept = rec[:-1], rec[-1]
    still = fast[(fast["voluntary"] == 0) & (fast["involuntary"] == 0)]
    assert still.size >= 10  # most of them, on a busy machine
    assert (still["thread_cpu_ns"] == still["end_ns"] - still["start_ns"]).all()
    assert slept["voluntary"] >= 1
    # Not the 1.5 ms spun before the call; 0 when steal carried in exceeded its CPU time.
    assert 0 <= slept["thread_cpu_ns"] < 1_000_000


def test_a_call_that_outlasts_a_nested_switching_call_is_charged_its_later_cpu_time() -> None:
    """An inner call that slept leaves a fresh baseline with the new switch counts; the outer
    call's exit sees the same counts, yet must read the clock, not carry the inner's baseline
    back to before its own 1 ms of spinning."""

    def attempt() -> tuple[np.ndarray[Any, np.dtype[Any]], bool]:
        shim = Shim(8)
        shim.lib.codl_set_sched(1)
        shim.lib.codl_set_baseline_age(10_000_000)  # the spin must not age the baseline out
        quiet: list[bool] = []

        def body() -> None:
            shim.call(cuda_api.DOMAIN_RUNTIME, SYNC, 2, inner=lambda: time.sleep(0.01))
            before = switches()
            spin_cpu(1_000_000)
            quiet.append(switches() == before)

        in_thread(lambda: shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 1, inner=body))
        return shim.records(), quiet[0]

    # Only a spin that nothing preempted leaves the counts where the inner call left them.
    rec = until_quiet(attempt)
    inner, outer = rec  # exits in order: the inner call first
    assert (inner["correlation"], outer["correlation"]) == (2, 1)
    assert inner["voluntary"] >= 1 and outer["voluntary"] >= inner["voluntary"]
    assert outer["thread_cpu_ns"] >= 1_000_000
    assert outer["thread_cpu_ns"] <= outer["end_ns"] - outer["start_ns"] + 1_000_000


def switches() -> tuple[int, int]:
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return ru.ru_nvcsw, ru.ru_nivcsw


def spin_cpu(ns: int) -> None:
    # Until the thread itself has used `ns` of CPU, however long the machine makes that take.
    end = time.thread_time_ns() + ns
    while time.thread_time_ns() < end:
        pass


def spin(ns: int) -> None:
    # Busy in Python without a syscall (monotonic is vDSO): runnable for the whole interval.
    end = time.monotonic_ns() + ns
    while time.monotonic_ns() < end:
        pass


@contextlib.contextmanager
def cpu_hog(cpu: int) -> Iterator[None]:
    """A separate process spinning on ``cpu``: it competes for the CPU without the GIL."""
    code = (
        f"import os, sys\nos.sched_setaffinity(0, {{{cpu}}})\nprint('ready', flush=True)\n"
        "while True:\n    pass\n"
    )
    hog = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout is not None and hog.stdout.readline().strip() == "ready"
        yield
    finally:
        hog.kill()
        hog.wait()


def planted_calls(shim: Shim) -> dict[str, np.ndarray[Any, np.dtype[Any]]]:
    """Calls on one thread: fast ones, one spinning while a hog shares its only CPU
    (preempted) and one sleeping (blocked). Returns the records by what was planted."""
    cpu = sorted(os.sched_getaffinity(0))[0]

    def preempted() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        with cpu_hog(cpu):
            # Niceness 19 for this thread alone (unprivileged), set after the hog started (a
            # child inherits its parent thread's niceness): the hog, at the default, then takes
            # nearly all of the CPU, so the call's time is mostly run-queue wait whatever else
            # the machine runs. At equal priority the split is a coin flip around one half, and
            # the call's class (the largest part) flipped between preempted and on_cpu with it.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 1, inner=lambda: spin(150_000_000))

    def blocked() -> None:
        shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 2, inner=lambda: time.sleep(0.06))

    def fast() -> None:
        for i in range(20):
            shim.call(cuda_api.DOMAIN_RUNTIME, LAUNCH, 100 + i)

    shim.lib.codl_set_sched(1)
    in_thread(fast)
    in_thread(preempted)
    # A stray preemption around the sleep (2 CPUs shared with other jobs) would plant a mixed
    # call, not a blocked one: that is the machine, not the shim; try the planting again.
    for _ in range(3):
        in_thread(blocked)
        rec = shim.records()
        if rec[-1]["involuntary"] == 0:
            break
    return {"fast": rec[:20], "preempted": rec[20:21], "blocked": rec[-1:]}


def test_a_call_preempted_by_a_hog_on_its_cpu_and_a_sleeping_call_leave_their_evidence() -> None:
    rec = planted_calls(Shim(32))
    (pre,), (blk,) = rec["preempted"], rec["blocked"]
    pre_wall = int(pre["end_ns"] - pre["start_ns"])
    pre_off = pre_wall - int(pre["thread_cpu_ns"])
    assert pre["involuntary"] >= 1 and pre["voluntary"] == 0
    assert pre_off >= 0.2 * pre_wall  # the hog had about half of the CPU
    assert pre["cpu_entry"] == pre["cpu_exit"] == sorted(os.sched_getaffinity(0))[0]
    blk_wall = int(blk["end_ns"] - blk["start_ns"])
    assert blk["voluntary"] >= 1 and blk["involuntary"] == 0
    assert blk_wall - int(blk["thread_cpu_ns"]) >= 50_000_000
    assert int(blk["thread_cpu_ns"]) < 5_000_000


def test_the_planted_calls_are_classed_preempted_and_blocked() -> None:
    planted = planted_calls(Shim(32))
    rec = np.concatenate([planted["fast"], planted["preempted"], planted["blocked"]])
    names = {(cuda_api.DOMAIN_RUNTIME, LAUNCH): "cudaLaunchKernel"}
    calls = pd.DataFrame(cuda_api.to_rows(rec, names, _Spans([])))
    evidence = pd.DataFrame(cuda_api.sched_rows(rec, 0))  # rank 0: no step spans
    table = calls_analysis.attribute_calls(
        calls,
        evidence,
        run="planted",
        rule=calls_analysis.SlowCallRule(threshold_ns=10_000_000),
    )
    assert len(table) == 2  # the fast calls are not slow
    by_start = table.set_index("start_ns")
    pre = by_start.loc[int(planted["preempted"][0]["start_ns"])]
    blk = by_start.loc[int(planted["blocked"][0]["start_ns"])]
    assert pre["class"] == "preempted" and blk["class"] == "blocked"
    assert pre["preempted_ns"] >= 0.2 * pre["duration_ns"] and pre["blocked_ns"] == 0
    assert blk["blocked_ns"] >= 50_000_000 and blk["preempted_ns"] == 0
    assert pre["cpu"] == sorted(os.sched_getaffinity(0))[0]


def test_evidence_rows_match_the_call_rows_one_for_one() -> None:
    rec = np.zeros(4, dtype=cuda_api.RECORD)
    rec["start_ns"] = [0, 150, 250, 320]  # the first began before arming: dropped from both
    rec["end_ns"] = [60, 160, 290, 330]
    rec["tid"] = [11, 11, 12, 11]
    rec["domain"] = cuda_api.DOMAIN_RUNTIME
    rec["cbid"] = LAUNCH
    rec["correlation"] = [1, 2, 3, 4]
    rec["thread_cpu_ns"] = [-1, 10, 5, 10]
    rec["voluntary"] = [-1, 0, 1, 0]
    rec["involuntary"] = [-1, 0, 0, 2]
    rec["cpu_entry"] = [-1, 3, 1, 0]
    rec["cpu_exit"] = [-1, 3, 2, 0]
    calls = cuda_api.to_rows(rec, {}, _Spans([(0, 100, 400)]), armed_at=100)
    ev = cuda_api.sched_rows(rec, 3, armed_at=100)
    for key in ("tid", "correlation", "start_ns", "end_ns", "rank"):
        assert ev[key] == calls[key], key
    assert ev["thread_cpu_ns"] == [10, 5, 10]
    assert (ev["voluntary"], ev["involuntary"]) == ([0, 1, 0], [0, 0, 2])
    assert (ev["cpu_entry"], ev["cpu_exit"]) == ([3, 1, 0], [3, 2, 0])
