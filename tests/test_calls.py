"""codl.analysis.calls on synthetic traces with planted answers: slow calls, their excess split
into preempted / blocked / on-CPU time, the per-run summary and the CPU peers.
(tests/test_cuda_api.py plants a real preempted and a real blocked call through the shim.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from codl.analysis import calls
from codl.analysis.calls import CallClass, SlowCallRule, split_excess
from codl.trace.store import TraceWriter

US = 1_000
LAUNCH_TID, AUTOGRAD_TID = 11, 12


@pytest.mark.parametrize(
    ("dur", "excess", "cpu", "vol", "invol", "expected"),
    [
        # Preempted: 900 us off CPU with involuntary switches only, 90 us more on CPU.
        (1000 * US, 990 * US, 100 * US, 0, 3, (900 * US, 0, 90 * US, CallClass.PREEMPTED)),
        # Blocked: slept 1.95 ms.
        (2000 * US, 1990 * US, 50 * US, 1, 0, (0, 1950 * US, 40 * US, CallClass.BLOCKED)),
        # On CPU the whole time.
        (500 * US, 490 * US, 500 * US, 0, 0, (0, 0, 490 * US, CallClass.ON_CPU)),
        # Both kinds: off-CPU time split by switch counts (3 of 4 involuntary), flagged mixed.
        (1000 * US, 990 * US, 190 * US, 1, 3, (607_500, 202_500, 180 * US, CallClass.MIXED)),
        # A sync call that normally sleeps: only the excess is attributed.
        (1200 * US, 200 * US, 100 * US, 1, 0, (0, 200 * US, 0, CallClass.BLOCKED)),
        # Off CPU without a switch (interrupts, steal): the scheduler saw it on CPU.
        (1000 * US, 990 * US, 700 * US, 0, 0, (0, 0, 990 * US, CallClass.ON_CPU)),
        # More CPU time than wall time (the clock reads lie outside the stamps): no off time.
        (100 * US, 90 * US, 100 * US + 300, 0, 0, (0, 0, 90 * US, CallClass.ON_CPU)),
        # No evidence.
        (1000 * US, 990 * US, -1, -1, -1, (0, 0, 0, CallClass.UNKNOWN)),
    ],
)
def test_the_split_rule(
    dur: int, excess: int, cpu: int, vol: int, invol: int, expected: tuple[Any, ...]
) -> None:
    sp = split_excess(
        duration_ns=dur, excess_ns=excess, thread_cpu_ns=cpu, voluntary=vol, involuntary=invol
    )
    assert (sp.preempted_ns, sp.blocked_ns, sp.on_cpu_ns, sp.cls) == expected
    if sp.cls is not CallClass.UNKNOWN:
        assert sp.preempted_ns + sp.blocked_ns + sp.on_cpu_ns == excess


def test_a_call_over_an_absolute_threshold_but_within_its_baseline_is_classed_whole() -> None:
    sp = split_excess(
        duration_ns=60 * US, excess_ns=0, thread_cpu_ns=5 * US, voluntary=1, involuntary=0
    )
    assert sp.cls is CallClass.BLOCKED
    assert (sp.preempted_ns, sp.blocked_ns, sp.on_cpu_ns) == (0, 0, 0)


# One planted slow call: its thread, the API, and the parts of its time beyond a normal call.
PLANTED = [
    # tid, name, preempted, blocked, extra on-CPU, voluntary, involuntary
    (LAUNCH_TID, "cudaLaunchKernel", 800 * US, 0, 20 * US, 0, 2),
    (LAUNCH_TID, "cudaLaunchKernel", 0, 3000 * US, 10 * US, 1, 0),
    (LAUNCH_TID, "cudaLaunchKernel", 0, 0, 300 * US, 0, 0),
    (AUTOGRAD_TID, "cudaLaunchKernel", 1500 * US, 0, 0, 0, 5),
    (AUTOGRAD_TID, "cudaMemcpyAsync", 0, 40_000 * US, 50 * US, 2, 0),
    (AUTOGRAD_TID, "cudaMemcpyAsync", 600 * US, 200 * US, 0, 1, 3),
]
NORMAL = {"cudaLaunchKernel": 6 * US, "cudaMemcpyAsync": 12 * US}


def synthetic_run(rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A run's events/cuda and events/cuda_sched, and its twin's events/cuda: normal calls
    around NORMAL (all on CPU), plus the PLANTED slow calls between them."""

    def normal_calls(n: int, t0: int) -> list[dict[str, Any]]:
        out = []
        for i in range(n):
            name = "cudaLaunchKernel" if i % 3 else "cudaMemcpyAsync"
            dur = int(NORMAL[name] * rng.uniform(0.9, 1.1))
            tid = LAUNCH_TID if i % 2 else AUTOGRAD_TID
            start = t0 + i * 100 * US
            out.append(dict(tid=tid, name=name, start_ns=start, dur=dur, cpu=dur, v=0, i=0))
        return out

    rows = normal_calls(600, 1_000_000_000)
    for k, (tid, name, pre, blk, extra, v, i) in enumerate(PLANTED):
        on_cpu = NORMAL[name] + extra
        rows.append(
            dict(
                tid=tid,
                name=name,
                start_ns=2_000_000_000 + k * 100_000 * US,
                dur=on_cpu + pre + blk,
                cpu=on_cpu,
                v=v,
                i=i,
            )
        )
    twin = normal_calls(300, 5_000_000_000)

    def cuda(rs: list[dict[str, Any]]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "rank": 1,
                "step": 0,
                "kind": "runtime",
                "name": [r["name"] for r in rs],
                "tid": [r["tid"] for r in rs],
                "stream": -1,
                "correlation": range(len(rs)),
                "start_ns": [r["start_ns"] for r in rs],
                "end_ns": [r["start_ns"] + r["dur"] for r in rs],
            }
        )

    run = cuda(rows)
    evidence = run[["rank", "tid", "correlation", "start_ns", "end_ns"]].assign(
        thread_cpu_ns=[r["cpu"] for r in rows],
        voluntary=[r["v"] for r in rows],
        involuntary=[r["i"] for r in rows],
        cpu_entry=2,
        cpu_exit=2,
    )
    return run, evidence, cuda(twin)


THREADS = pd.DataFrame(
    {
        "t_ns": 0,
        "rank": 1,
        "pid": 100,
        "tid": [LAUNCH_TID, AUTOGRAD_TID],
        "role": ["launch", "autograd"],
        "name": ["python", "pt_autograd_0"],
        "cpus_planned": "",
        "cpus_actual": "0-3",
    }
)


def within(got: float, want: float, rel: float = 0.05) -> bool:
    return abs(got - want) <= rel * abs(want)


def test_the_planted_split_is_recovered_within_5_percent() -> None:
    run, evidence, twin = synthetic_run(np.random.default_rng(0))
    table = calls.attribute_calls(run, evidence, run="r1", twin=twin, threads=THREADS)
    assert list(table.columns) == list(calls.CALL_COLUMNS)
    assert len(table) == len(PLANTED)  # no normal call is 5x its twin's p50
    table = table.sort_values("start_ns").reset_index(drop=True)
    for (tid, name, pre, blk, extra, _, _), got in zip(PLANTED, table.itertuples(), strict=True):
        assert (got.tid, got.name, got.baseline_source) == (tid, name, "twin")
        assert got.role == ("launch" if tid == LAUNCH_TID else "autograd")
        assert within(got.excess_ns, pre + blk + extra)
        assert within(got.preempted_ns, pre) and within(got.blocked_ns, blk)
        # The extra on-CPU time is small: judge it against the whole excess.
        assert abs(got.on_cpu_ns - extra) <= 0.05 * got.excess_ns
    assert table["class"].tolist() == [
        "preempted",
        "blocked",
        "on_cpu",
        "preempted",
        "blocked",
        "mixed",
    ]


def test_the_summary_counts_and_totals_excess_by_class_and_role() -> None:
    run, evidence, twin = synthetic_run(np.random.default_rng(1))
    table = calls.attribute_calls(run, evidence, run="r1", twin=twin, threads=THREADS)
    summary = calls.summarize_calls(table).set_index(["role", "class"])
    assert summary.loc[("launch", "preempted"), "calls"] == 1
    assert summary.loc[("autograd", "blocked"), "calls"] == 1
    assert within(summary.loc[("autograd", "blocked"), "blocked_ns"], 40_000 * US)
    launch_excess = summary.xs("launch", level="role")["excess_ns"].sum()
    assert within(launch_excess, (800 + 20 + 3000 + 10 + 300) * US)
    assert summary["calls"].sum() == len(PLANTED)
    assert set(summary.reset_index()["run"]) == {"r1"}


def test_without_a_twin_an_absolute_threshold_is_needed_and_the_own_p50_is_the_baseline() -> None:
    run, evidence, _ = synthetic_run(np.random.default_rng(2))
    with pytest.raises(ValueError, match="threshold_ns"):
        calls.attribute_calls(run, evidence, run="r1")
    table = calls.attribute_calls(run, evidence, run="r1", rule=SlowCallRule(threshold_ns=250 * US))
    assert len(table) == len(PLANTED)  # the smallest planted call is ~306 us
    assert set(table["baseline_source"]) == {"self"}
    blocked = table[table["class"] == "blocked"]
    assert within(blocked["blocked_ns"].sum(), 43_000 * US)


def test_a_name_the_twin_never_called_falls_back_to_the_runs_own_p50() -> None:
    run, evidence, twin = synthetic_run(np.random.default_rng(3))
    twin = twin[twin["name"] != "cudaMemcpyAsync"]
    table = calls.attribute_calls(run, evidence, run="r1", twin=twin)
    by_name = table.groupby("name")["baseline_source"].unique()
    assert by_name["cudaMemcpyAsync"].tolist() == ["self"]
    assert by_name["cudaLaunchKernel"].tolist() == ["twin"]


def test_calls_without_evidence_are_unknown() -> None:
    run, _, twin = synthetic_run(np.random.default_rng(4))
    table = calls.attribute_calls(run, None, run="r1", twin=twin)
    assert set(table["class"]) == {"unknown"}
    assert (table[["preempted_ns", "blocked_ns", "on_cpu_ns"]] == 0).all().all()
    assert (table["voluntary"] == -1).all()


def test_bad_rules_are_refused() -> None:
    with pytest.raises(ValueError, match="factor"):
        SlowCallRule(factor=1.0)
    with pytest.raises(ValueError, match="threshold_ns"):
        SlowCallRule(threshold_ns=0)


def sched_samples(rows: list[tuple[int, int, int, int]]) -> pd.DataFrame:
    """(t_ns, tid, run_ns, cpu) -> samples/sched rows."""
    return pd.DataFrame(
        {
            "t_ns": [r[0] for r in rows],
            "rank": 0,
            "step": 0,
            "pid": 100,
            "tid": [r[1] for r in rows],
            "run_ns": [r[2] for r in rows],
            "wait_ns": 0,
            "timeslices": 0,
            "voluntary": 0,
            "involuntary": 0,
            "cpu": [r[3] for r in rows],
        }
    )


def test_threads_that_ran_on_the_callers_cpu_between_the_bracketing_samples_are_listed() -> None:
    before, after = 1000, 5000  # the call is [2000, 4000]
    samples = sched_samples(
        [
            (before, 11, 0, 2),
            (after, 11, 10, 2),  # the caller itself: never listed
            (before, 21, 0, 2),
            (after, 21, 50, 2),  # ran, last seen on CPU 2: listed
            (before, 22, 0, 3),
            (after, 22, 50, 3),  # ran on CPU 3
            (before, 23, 0, 0),
            (after, 23, 50, 0),  # pinned to CPU 2 alone (sample says otherwise): listed
            (before, 24, 0, 2),
            (after, 24, 50, 3),  # was on 2, but its mask excludes 2: not listed
            (before, 25, 7, 2),
            (after, 25, 7, 2),  # did not run
        ]
    )
    threads = pd.DataFrame(
        {
            "t_ns": 0,
            "rank": 0,
            "pid": 100,
            "tid": [11, 21, 22, 23, 24, 25],
            "role": ["launch", "loader", "loader", "pin_memory", "comm", "other"],
            "name": "t",
            "cpus_planned": "",
            "cpus_actual": ["0-3", "", "0-3", "2", "3", "0-3"],
        }
    )
    peers = calls.CpuPeers(samples, threads)
    assert peers.peers(2, 2000, 4000, caller=11) == ("21/loader,23/pin_memory", True)
    assert peers.caller_cpu(11, 4000) == 2
    # Outside the sampled span nothing can be judged.
    assert peers.peers(2, 6000, 7000, caller=11) == ("", False)
    assert calls.CpuPeers(None, None).peers(2, 2000, 4000, caller=11) == ("", False)
    assert peers.peers(-1, 2000, 4000, caller=11) == ("", False)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("", set()), ("3", {3}), ("0-2,5", {0, 1, 2, 5}), (" 1 , 4-5 ", {1, 4, 5})],
)
def test_cpulists(text: str, cpus: set[int]) -> None:
    assert calls.parse_cpulist(text) == cpus


def write_trace(path: Path, run_id: str, tables: dict[str, pd.DataFrame]) -> Path:
    with TraceWriter(path) as w:
        w.set_attrs(run_id=run_id, warmup_steps=1, spec="{}")
        for name, frame in tables.items():
            w.append(name, {c: frame[c].tolist() for c in frame.columns})
        return w.finish()


def test_traces_on_disk_give_the_same_table_measured_steps_only(tmp_path: Path) -> None:
    run, evidence, twin = synthetic_run(np.random.default_rng(5))
    warm = run.index[:30]  # warm-up calls, one of them very slow: never attributed
    run.loc[warm, "step"] = 0
    run.loc[warm[0], "end_ns"] += 50_000 * US
    run.loc[run.index[30:], "step"] = 1
    twin["step"] = 1
    threads = THREADS.assign(rank=1)
    path = write_trace(
        tmp_path / "run ü.h5",
        "r1",
        {"events/cuda": run, "events/cuda_sched": evidence, "threads": threads},
    )
    twin_path = write_trace(tmp_path / "twin.h5", "t1", {"events/cuda": twin})
    table = calls.attribute_trace(path, twin_path)
    expected = calls.attribute_calls(
        run[run["step"] >= 1], evidence, run="r1", twin=twin, threads=threads
    )
    assert len(table) == len(PLANTED)
    cols = ["start_ns", "excess_ns", "preempted_ns", "blocked_ns", "on_cpu_ns", "class", "role"]
    pd.testing.assert_frame_equal(
        table[cols].reset_index(drop=True), expected[cols].reset_index(drop=True)
    )


def test_per_name_medians_added_in_blocks_are_pandas_medians(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(calls, "_MERGE_AT", 1000)  # merged many times over
    rng = np.random.default_rng(3)
    # Four names, odd and even counts, many equal durations (ns ticks of a coarse clock).
    codes = rng.integers(0, 4, 10_001)
    ns = rng.integers(1, 400, len(codes)) * 1000 + codes * 7
    ns[codes == 3] = rng.integers(0, 5, int((codes == 3).sum()))
    m = calls._NameMedians()
    for lo in range(0, len(ns), 777):
        m.add(codes[lo : lo + 777], ns[lo : lo + 777])
    want = pd.Series(ns).groupby(codes).median()
    assert m.medians() == {int(k): float(v) for k, v in want.items()}


def big_run(rng: np.random.Generator, n: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """events/cuda, events/cuda_sched and a twin's events/cuda of ``n`` calls: three names,
    one of them (a sync call) never made by the twin, durations on a coarse grid (equal
    values, even and odd counts), ~0.1 % of the calls 3-50x their name's normal time with
    evidence, and the first two steps warm-up."""
    idx = np.arange(n)
    names = np.array(["cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize"])
    which = np.where(idx % 97 == 0, 2, idx % 2)
    dur = (NORMAL["cudaLaunchKernel"] * rng.integers(8, 13, n) // 10).astype(np.int64)
    slow = rng.random(n) < 0.001
    dur[slow] *= rng.integers(3, 50, int(slow.sum()))
    start = 1_000_000_000 + idx * 50 * US
    run = pd.DataFrame(
        {
            "rank": np.zeros(n, np.int16),
            "step": (idx // 20_000).astype(np.int32),
            "kind": np.where(which == 2, "sync", "runtime"),
            "name": names[which],
            "tid": np.where(idx % 2, LAUNCH_TID, AUTOGRAD_TID),
            "stream": -1,
            "correlation": idx,
            "start_ns": start,
            "end_ns": start + dur,
        }
    )
    cpu = np.where(slow, dur // 3, dur)
    evidence = run[["rank", "tid", "correlation", "start_ns", "end_ns"]].assign(
        thread_cpu_ns=cpu,
        voluntary=np.where(slow, idx % 3, 0),
        involuntary=np.where(slow, 1 + idx % 2, 0),
        cpu_entry=np.int16(2),
        cpu_exit=np.where(idx % 5 == 0, -1, 3).astype(np.int16),
    )
    twin = run[which != 2].iloc[: n // 3].assign(step=5)
    twin["end_ns"] = (
        twin["start_ns"] + NORMAL["cudaLaunchKernel"] * rng.integers(9, 12, len(twin)) // 10
    )
    return run, evidence, twin


def write_blocks(path: Path, run_id: str, tables: dict[str, pd.DataFrame]) -> Path:
    with TraceWriter(path) as w:
        w.set_attrs(run_id=run_id, warmup_steps=2, spec="{}")
        for name, frame in tables.items():
            w.append(name, {c: frame[c].to_numpy() for c in frame.columns})
        return w.finish()


@pytest.mark.parametrize("with_twin", [True, False])
def test_a_long_trace_is_attributed_block_by_block_as_its_frames_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_twin: bool
) -> None:
    # Over two of the writer's blocks (131,072 rows), read in blocks of those, medians merged
    # many times: the table attribute_calls makes of the whole frames, every column.
    monkeypatch.setattr(calls, "_BLOCK_ROWS", 1 << 17)
    monkeypatch.setattr(calls, "_MERGE_AT", 1 << 14)
    run, evidence, twin = big_run(np.random.default_rng(11), 300_000)
    threads = THREADS.assign(rank=0)
    path = write_blocks(
        tmp_path / "run.h5",
        "r1",
        {"events/cuda": run, "events/cuda_sched": evidence, "threads": threads},
    )
    rule = SlowCallRule() if with_twin else SlowCallRule(threshold_ns=20 * US)
    twin_path = write_blocks(tmp_path / "twin.h5", "t1", {"events/cuda": twin})
    got = calls.attribute_trace(path, twin_path if with_twin else None, rule=rule)
    want = calls.attribute_calls(
        run[run["step"] >= 2],
        evidence,
        run="r1",
        twin=twin if with_twin else None,
        threads=threads,
        rule=rule,
    )
    assert 100 < len(got) < 1000 and set(got["baseline_source"]) == (
        {"twin", "self"} if with_twin else {"self"}
    )
    pd.testing.assert_frame_equal(got, want)
