"""Analysis on small hand-built traces whose answers are known by construction.

Every table is built with the trace schema's dtypes (int16 ranks, categorical ``sym`` columns),
as ``Trace.table`` returns them, so dtype handling is exercised too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from codl.analysis import columns, intervals
from codl.analysis import compare as cmp
from codl.analysis import summarize as sm
from codl.spec import Mode, RunSpec
from codl.trace.schema import TABLES
from codl.trace.store import empty_frame

BASE = 7_000_000_000_000  # a realistic CLOCK_MONOTONIC origin (days of uptime), in ns
MS = 1_000_000
WARMUP = 2
LAUNCH, AUTOGRAD, WORKER_A, WORKER_B = 100, 101, 200, 300


def frame(table: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A table with the schema's columns and dtypes; unspecified cells default to 0 / ''."""
    if not rows:
        return empty_frame(table)
    data: dict[str, Any] = {}
    for c in TABLES[table]:
        if c.is_symbol:
            data[c.name] = pd.Categorical([str(r.get(c.name, "")) for r in rows])
        else:
            default = -1 if c.name == "gpu_ns" else 0
            data[c.name] = np.array([r.get(c.name, default) for r in rows], dtype=c.dtype)
    return pd.DataFrame(data)


def app_rows(
    rank: int, step: int, t0: int, phases: dict[str, tuple[float, float, float]]
) -> list[dict[str, Any]]:
    """phases: name -> (start ms, end ms, gpu ms or -1) relative to t0."""
    return [
        {
            "rank": rank,
            "step": step,
            "phase": name,
            "tid": LAUNCH,
            "start_ns": t0 + int(a * MS),
            "end_ns": t0 + int(b * MS),
            "gpu_ns": int(g * MS) if g >= 0 else -1,
        }
        for name, (a, b, g) in phases.items()
    ]


def training_step(rank: int, step: int, *, gpu: bool = False) -> list[dict[str, Any]]:
    """A 20 ms step at BASE + step * 100 ms: 2 ms data wait, 15 ms compute."""
    t0 = BASE + step * 100 * MS
    g = 1.0 if gpu else -1.0
    return app_rows(
        rank,
        step,
        t0,
        {
            "step": (0, 20, -1),
            "data_wait": (0, 2, -1),
            "h2d": (2, 3, 0.5 if gpu else -1),
            "forward": (3, 8, 6 * g if gpu else -1),
            "backward": (8, 16, 9 * g if gpu else -1),
            "optimizer": (16, 18, 1 * g if gpu else -1),
            "compute": (3, 18, 17 * g if gpu else -1),
        },
    )


# --- step_metrics -------------------------------------------------------------------------


def test_step_metrics_phases_gpu_warmup_and_allreduce() -> None:
    rows = [r for s in range(5) for r in training_step(0, s, gpu=(s == 3))]
    app = frame("events/app", rows)
    comm = frame(
        "events/comm",
        [
            # Step 3: two buckets, one timed by CUDA events (gpu_ns) and one by host wall time.
            {"rank": 0, "step": 3, "bucket": 0, "bytes": 1000, "start_ns": BASE, "end_ns": BASE}
            | {"gpu_ns": 4 * MS},
            {"rank": 0, "step": 3, "bucket": 1, "bytes": 500, "start_ns": BASE}
            | {"end_ns": BASE + 2 * MS, "gpu_ns": -1},
            # A warm-up bucket that must not count.
            {"rank": 0, "step": 1, "bucket": 0, "bytes": 9, "start_ns": 0, "end_ns": 9 * MS},
        ],
    )
    out = sm.step_metrics(app, comm, warmup=WARMUP)
    assert list(out["step"]) == [2, 3, 4]
    assert out["rank"].dtype == np.int64
    s3 = out.set_index("step").loc[3]
    assert s3["step_ms"] == pytest.approx(20.0)
    assert s3["data_wait_ms"] == pytest.approx(2.0)
    assert s3["forward_ms"] == pytest.approx(5.0)
    assert s3["backward_ms"] == pytest.approx(8.0)
    assert s3["compute_ms"] == pytest.approx(15.0)
    assert s3["compute_gpu_ms"] == pytest.approx(17.0)
    # GPU time wins over host time when measured.
    assert s3["compute_eff_ms"] == pytest.approx(17.0)
    assert s3["allreduce_ms"] == pytest.approx(6.0)
    assert s3["allreduce_bytes"] == 1500
    assert s3["buckets"] == 2
    s2 = out.set_index("step").loc[2]
    # gpu_ns == -1 means "not measured": NaN, never 0.
    assert np.isnan(s2["compute_gpu_ms"])
    assert np.isnan(s2["forward_gpu_ms"])
    assert s2["compute_eff_ms"] == pytest.approx(15.0)
    assert np.isnan(s2["allreduce_ms"])
    assert s2["buckets"] == 0
    assert np.isnan(s2["sleep_ms"])
    assert s2["start_ns"] == BASE + 200 * MS
    assert s2["end_ns"] == BASE + 220 * MS


def test_step_metrics_is_per_rank_and_step() -> None:
    rows = [r for rank in (0, 1) for s in range(4) for r in training_step(rank, s)]
    # Rank 1 waits 5 ms longer for data in step 3; rank 0 must not see it.
    for r in rows:
        if r["rank"] == 1 and r["step"] == 3 and r["phase"] in {"data_wait", "step"}:
            r["end_ns"] += 5 * MS
    out = sm.step_metrics(frame("events/app", rows), empty_frame("events/comm"), warmup=WARMUP)
    assert len(out) == 4
    by = out.set_index(["rank", "step"])
    assert by.loc[(0, 3), "data_wait_ms"] == pytest.approx(2.0)
    assert by.loc[(1, 3), "data_wait_ms"] == pytest.approx(7.0)
    assert by.loc[(1, 3), "step_ms"] == pytest.approx(25.0)


def test_step_metrics_empty() -> None:
    out = sm.step_metrics(empty_frame("events/app"), empty_frame("events/comm"), warmup=0)
    assert out.empty
    assert {"rank", "step", "step_ms", "compute_eff_ms", "allreduce_ms"} <= set(out)
    assert out["step"].dtype == np.int64


# --- scheduler counters -------------------------------------------------------------------


def sched_row(rank: int, pid: int, tid: int, step: int, **counters: int) -> dict[str, Any]:
    return {
        "t_ns": BASE + (step + 1) * 100 * MS,
        "rank": rank,
        "pid": pid,
        "tid": tid,
        "step": step,
        **counters,
    }


def test_sched_deltas() -> None:
    rows = [
        sched_row(0, 1, LAUNCH, -1, run_ns=1000, wait_ns=10, involuntary=1, timeslices=5),
        sched_row(0, 1, LAUNCH, 0, run_ns=1500, wait_ns=30, involuntary=4, timeslices=9),
        sched_row(0, 1, LAUNCH, 1, run_ns=1600, wait_ns=30, involuntary=4, timeslices=10),
        # Same TID on another rank (another node): a separate thread.
        sched_row(1, 1, LAUNCH, -1, run_ns=0, wait_ns=0),
        sched_row(1, 1, LAUNCH, 0, run_ns=7, wait_ns=3),
        # TID reused by a new thread: counters restart, the negative step is no measurement.
        sched_row(0, 1, WORKER_A, 0, run_ns=900, wait_ns=90),
        sched_row(0, 1, WORKER_A, 1, run_ns=50, wait_ns=5),
    ]
    # Shuffle: the function must sort by time itself.
    d = sm.sched_deltas(frame("samples/sched", rows[::-1]))
    launch0 = d[(d["rank"] == 0) & (d["tid"] == LAUNCH)].set_index("step")
    assert list(launch0.index) == [0, 1]
    assert launch0.loc[0, "run_ns"] == 500
    assert launch0.loc[0, "wait_ns"] == 20
    assert launch0.loc[0, "involuntary"] == 3
    assert launch0.loc[1, "wait_ns"] == 0
    assert launch0.loc[1, "timeslices"] == 1
    launch1 = d[(d["rank"] == 1) & (d["tid"] == LAUNCH)]
    assert list(launch1["run_ns"]) == [7]
    assert d[d["tid"] == WORKER_A].empty
    assert sm.sched_deltas(empty_frame("samples/sched")).empty


def _deltas_by_pandas(sched: pd.DataFrame) -> pd.DataFrame:
    """sched_deltas as its docstring says it, in plain pandas: each thread's samples in time
    order (stable), differences to the one before, negative ones (a reused TID) dropped, those
    of one step added up, the cpu of the step's last sample."""
    s = sched.astype({"rank": "int64", "step": "int64", "cpu": "int64"}).reset_index(drop=True)
    s = s.sort_values(["rank", "pid", "tid", "t_ns"], kind="stable")
    counters = list(sm.SCHED_COUNTERS)
    diff = s.groupby(["rank", "pid", "tid"])[counters].diff()
    d = s[["rank", "pid", "tid", "step", "cpu"]].join(diff).dropna()
    d = d[(d["run_ns"] >= 0) & (d["wait_ns"] >= 0)].astype({c: "int64" for c in counters})
    g = d.groupby(["rank", "pid", "tid", "step"], sort=True)
    out = g[counters].sum().join(g["cpu"].last()).reset_index()
    return out[list(sm.SCHED_DELTA_COLUMNS)]


def test_sched_deltas_equal_their_definition_on_a_long_shuffled_table() -> None:
    # Steps tagged out of time order (a thread's sort by step is then needed), two samples in
    # one step, reused TIDs, samples of one instant, rows in any order.
    rng = np.random.default_rng(11)
    rows = []
    for rank in range(3):
        for tid in range(20):
            run = wait = 0
            for i in range(60):
                if rng.random() < 0.03:
                    run = wait = 0
                run += int(rng.integers(0, 9))
                wait += int(rng.integers(0, 4))
                step = i // 2 if tid % 4 == 0 else i - int(rng.random() < 0.05) * 3
                t = BASE + i * MS - int(tid == 7 and i == 30) * MS  # one instant twice
                rows.append(
                    sched_row(
                        rank,
                        1 + tid % 3,
                        tid,
                        step,
                        run_ns=run,
                        wait_ns=wait,
                        timeslices=i,
                        voluntary=2 * i,
                        involuntary=i // 3,
                    )
                    | {"t_ns": t, "cpu": int(rng.integers(0, 8))}
                )
    sched = frame("samples/sched", [rows[i] for i in rng.permutation(len(rows))])
    got = sm.sched_deltas(sched)
    pd.testing.assert_frame_equal(
        got.reset_index(drop=True), _deltas_by_pandas(sched), check_exact=True
    )


def thread_row(
    rank: int, pid: int, tid: int, role: str, cpus: str, name: str = ""
) -> dict[str, Any]:
    return {
        "rank": rank,
        "pid": pid,
        "tid": tid,
        "role": role,
        "name": name or role,
        "cpus_planned": cpus,
        "cpus_actual": cpus,
    }


def test_launch_metrics_uses_each_ranks_launch_thread() -> None:
    # Rank 1's launch thread has the TID of a rank-0 worker: only rank 1's rows may be used.
    threads = frame(
        "threads",
        [
            thread_row(0, 1, LAUNCH, "launch", "0"),
            thread_row(0, WORKER_A, WORKER_A, "loader", "0-1"),
            thread_row(1, 2, WORKER_A, "launch", "2"),
        ],
    )
    rows = []
    for step in range(-1, 5):
        k = step + 1
        rows.append(sched_row(0, 1, LAUNCH, step, run_ns=k * 10 * MS, wait_ns=k * MS))
        rows.append(sched_row(0, WORKER_A, WORKER_A, step, run_ns=k * MS, wait_ns=k * 7 * MS))
        rows.append(sched_row(1, 2, WORKER_A, step, run_ns=k * MS, wait_ns=k * 3 * MS))
    rows.append(sched_row(0, 1, LAUNCH, 5, run_ns=70 * MS, wait_ns=6 * MS, involuntary=4))
    out = sm.launch_metrics(frame("samples/sched", rows), threads, warmup=WARMUP)
    by = out.set_index(["rank", "step"])
    assert sorted(by.index) == [(0, 2), (0, 3), (0, 4), (0, 5), (1, 2), (1, 3), (1, 4)]
    assert by.loc[(0, 3), "launch_wait_ms"] == pytest.approx(1.0)
    assert by.loc[(0, 3), "launch_run_ms"] == pytest.approx(10.0)
    assert by.loc[(1, 3), "launch_wait_ms"] == pytest.approx(3.0)
    assert by.loc[(0, 5), "launch_involuntary"] == 4


def test_helper_metrics_sum_each_roles_threads_per_rank() -> None:
    # Two comm threads of rank 0 add up; rank 1 has no pin-memory thread: 0 there, not NaN; a
    # loader worker's time is nobody's helper time; rank 1's comm thread reuses rank 0's TID.
    threads = frame(
        "threads",
        [
            thread_row(0, 1, LAUNCH, "launch", "0"),
            thread_row(0, 1, 11, "autograd", "1"),
            thread_row(0, 1, 12, "pin_memory", "1"),
            thread_row(0, 1, 13, "comm", "2"),
            thread_row(0, 1, 14, "comm", "2"),
            thread_row(0, WORKER_A, WORKER_A, "loader", "3"),
            thread_row(1, 2, 13, "comm", "4"),
        ],
    )
    rows = []
    for step in range(-1, 5):
        k = step + 1
        rows.append(sched_row(0, 1, LAUNCH, step, run_ns=k * 10 * MS, wait_ns=0))
        rows.append(sched_row(0, 1, 11, step, run_ns=k * 4 * MS, wait_ns=0))
        rows.append(sched_row(0, 1, 12, step, run_ns=k * 3 * MS, wait_ns=0))
        rows.append(sched_row(0, 1, 13, step, run_ns=k * 2 * MS, wait_ns=0))
        rows.append(sched_row(0, 1, 14, step, run_ns=k * 1 * MS, wait_ns=0))
        rows.append(sched_row(0, WORKER_A, WORKER_A, step, run_ns=k * 50 * MS, wait_ns=0))
        rows.append(sched_row(1, 2, 13, step, run_ns=k * 5 * MS, wait_ns=0))
    out = sm.helper_metrics(frame("samples/sched", rows), threads, warmup=WARMUP)
    by = out.set_index(["rank", "step"])
    assert sorted(by.index) == [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]
    assert by.loc[(0, 3), "autograd_run_ms"] == pytest.approx(4.0)
    assert by.loc[(0, 3), "pin_memory_run_ms"] == pytest.approx(3.0)
    assert by.loc[(0, 3), "comm_run_ms"] == pytest.approx(3.0)
    assert by.loc[(1, 3), "comm_run_ms"] == pytest.approx(5.0)
    assert by.loc[(1, 3), "pin_memory_run_ms"] == 0.0
    assert by.loc[(1, 3), "autograd_run_ms"] == 0.0


def test_role_rows_are_the_rows_a_merge_on_the_threads_roles_keeps() -> None:
    # role_rows picks rows by thread code instead of merging the deltas with the roles: the
    # rows, their order and their roles must be the merge's. A thread captured twice has its
    # latest role; a thread without a threads row has none; TID 13 is two threads (two ranks).
    threads = frame(
        "threads",
        [
            thread_row(0, 1, 11, "loader", "1"),
            thread_row(0, 1, 11, "autograd", "1"),  # re-captured: the latest row wins
            thread_row(0, 1, 13, "comm", "2"),
            thread_row(1, 2, 13, "pin_memory", "3"),
            thread_row(1, 2, LAUNCH, "launch", "0"),
        ],
    )
    rows = []
    for step in range(-1, 6):
        k = step + 1
        for rank, pid, tid in ((1, 2, 13), (0, 1, 11), (0, 1, 99), (0, 1, 13), (1, 2, LAUNCH)):
            rows.append(sched_row(rank, pid, tid, step, run_ns=k * tid * MS, wait_ns=k * MS))
    deltas = sm.sched_deltas(frame("samples/sched", rows))
    roles = ["autograd", "comm", "pin_memory"]
    got = sm.role_rows(deltas, threads, roles, ["run_ns", "wait_ns"], WARMUP)
    merged = deltas.merge(sm.thread_roles(threads), on=["rank", "tid"], how="left")
    want = merged[merged["role"].isin(roles) & (merged["step"] >= WARMUP)]
    want = want[["rank", "step", "role", "run_ns", "wait_ns"]].reset_index(drop=True)
    assert len(got) == 3 * (6 - WARMUP) and set(got["role"]) == set(roles)
    pd.testing.assert_frame_equal(got.astype({"role": str}), want.astype({"role": str}))


def _random_sched(rng: np.random.Generator) -> pd.DataFrame:
    """samples/sched of 1-3 ranks and a few threads each over steps -1..7: TIDs shared across
    ranks, a thread sampled twice for one step (a final flush), a sample tagged out of time
    order, a thread missing some steps, one TID reused (its counters start again)."""
    rows = []
    for rank in range(int(rng.integers(1, 4))):
        for tid in rng.choice([11, 12, 13, 14], size=int(rng.integers(1, 5)), replace=False):
            run = wait = 0
            for step in range(-1, 8):
                if rng.random() < 0.15:
                    continue
                for _ in range(2 if rng.random() < 0.1 else 1):
                    run, wait = run + int(rng.integers(0, 9)) * MS, wait + int(rng.integers(0, 5))
                    if rng.random() < 0.05:
                        run = wait = 0
                    tag = step + 1 if rng.random() < 0.05 else step
                    row = sched_row(rank, 1 + rank, int(tid), tag, run_ns=run, wait_ns=wait)
                    row["t_ns"] = BASE + (step + 1) * 100 * MS + int(rng.integers(0, 3))
                    rows.append(row)
    order = rng.permutation(len(rows))  # samples of several threads interleaved
    return frame("samples/sched", [rows[i] for i in order])


def test_a_steps_sample_rows_give_its_deltas_of_the_whole_table() -> None:
    # summarize_to keeps of the scheduler samples, for the step timeline, only rank 0's
    # samples of its step and their predecessors: the step's deltas must be the whole
    # table's, whatever the interleaving, repeated tags, gaps and TID reuse.
    rng = np.random.default_rng(11)
    compared = 0
    for case in range(60):
        sched = _random_sched(rng)
        step = int(rng.integers(-1, 9))
        rank = int(rng.integers(0, 3))
        keep = sm.step_sample_rows(sched, rank=rank, step=step)
        kept = sched[keep]
        want = sm.sched_deltas(sched[sched["rank"] == rank], step=step)
        got = sm.sched_deltas(kept[kept["rank"] == rank], step=step)
        pd.testing.assert_frame_equal(
            got.reset_index(drop=True), want.reset_index(drop=True), obj=f"case {case}"
        )
        compared += len(want) > 0
        # Neither more than the step's samples and one predecessor each, nor other ranks'.
        assert keep.sum() <= 2 * ((sched["rank"] == rank) & (sched["step"] == step)).sum()
        assert (kept["rank"] == rank).all()
    assert compared >= 30


def test_backfilled_cuda_helper_times_equal_the_summarized_ones() -> None:
    # scripts/backfill_role_cpu.py reads an unpinned run's autograd and pin-memory time off the
    # launch-wait attribution; it must be what helper_metrics measures from the same samples,
    # also where the launch thread never waited (share 0 weight: none; the threads still ran).
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "scripts" / "backfill_role_cpu.py"
    spec = importlib.util.spec_from_file_location("backfill_role_cpu", script)
    assert spec is not None and spec.loader is not None
    backfill = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backfill)
    every = "0-7"  # policy none: every thread's mask is the whole set
    threads = frame(
        "threads",
        [
            thread_row(0, 1, LAUNCH, "launch", every),
            thread_row(0, 1, AUTOGRAD, "autograd", every),
            thread_row(0, 1, 102, "pin_memory", every),
            thread_row(0, WORKER_A, WORKER_A, "loader", every),
        ],
    )
    rows = []
    for step in range(-1, 6):
        k = step + 1
        wait = (step % 2) * k * MS  # the launch thread waits in odd steps only
        rows.append(sched_row(0, 1, LAUNCH, step, run_ns=k * 20 * MS, wait_ns=wait))
        rows.append(sched_row(0, 1, AUTOGRAD, step, run_ns=k * 11 * MS, wait_ns=0))
        rows.append(sched_row(0, 1, 102, step, run_ns=k * k * MS, wait_ns=0))
        rows.append(sched_row(0, WORKER_A, WORKER_A, step, run_ns=k * 90 * MS, wait_ns=0))
    sched = frame("samples/sched", rows)
    attribution = sm.attribute_launch_wait(sched, threads, warmup=WARMUP).assign(run_id="r")
    runs = pd.DataFrame({"run_id": ["r"], "policy": ["none"]})
    got = backfill.helper_times(runs, attribution).set_index(["rank", "step"])
    want = sm.helper_metrics(sched, threads, warmup=WARMUP).set_index(["rank", "step"])
    columns = ["autograd_run_ms", "pin_memory_run_ms"]
    assert (want[columns] > 0).all().all()
    pd.testing.assert_frame_equal(got[columns], want[columns], check_exact=False)
    # A pinned run's attribution is weighted by the masks: it is not backfilled.
    pinned = backfill.helper_times(runs.assign(policy="isolated"), attribution)
    assert pinned.empty


# --- mechanism attribution ----------------------------------------------------------------


def planted_trace() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Launch thread on CPU {0}; worker A may run on {0, 1}, worker B on {1} only.

    In step 3 the launch thread waits 10 ms and worker A runs 40 ms; B runs 40 ms every step.
    """
    threads = frame(
        "threads",
        [
            thread_row(0, 1, LAUNCH, "launch", "0", "python"),
            thread_row(0, WORKER_A, WORKER_A, "loader", "0-1", "pt_data_worker"),
            thread_row(0, WORKER_B, WORKER_B, "loader", "1", "pt_data_worker"),
        ],
    )
    cum = {LAUNCH: [0, 0], WORKER_A: [0, 0], WORKER_B: [0, 0]}  # run, wait
    pid = {LAUNCH: 1, WORKER_A: WORKER_A, WORKER_B: WORKER_B}
    rows = []
    for step in range(-1, 6):
        if step >= 0:
            cum[LAUNCH][0] += 15 * MS
            cum[WORKER_B][0] += 40 * MS
        if step == 3:
            cum[LAUNCH][1] += 10 * MS
            cum[WORKER_A][0] += 40 * MS
        for tid, (run, wait) in cum.items():
            rows.append(sched_row(0, pid[tid], tid, step, run_ns=run, wait_ns=wait))
    return frame("samples/sched", rows), threads


def test_attribution_blames_the_planted_worker() -> None:
    sched, threads = planted_trace()
    at = sm.attribute_launch_wait(sched, threads, warmup=WARMUP)
    s3 = at[at["step"] == 3]
    assert list(s3["tid"]) == [WORKER_A]
    row = s3.iloc[0]
    assert row["attributed_wait_ns"] == pytest.approx(10 * MS)
    assert row["launch_wait_ns"] == 10 * MS
    assert row["role"] == "loader"
    assert row["pid"] == WORKER_A
    assert row["name"] == "pt_data_worker"
    # Half of A's mask lies on the launch CPU: half of its on-CPU time competes there.
    assert row["share_ns"] == pytest.approx(20 * MS)
    # B's mask misses CPU 0: it can never be blamed, in any step.
    assert WORKER_B not in set(at["tid"])
    assert at["attributed_wait_ns"].sum() == pytest.approx(10 * MS)
    assert (at["step"] >= WARMUP).all()


def test_attribution_other_ranks_on_the_node() -> None:
    sched, threads = planted_trace()
    # A second rank on the same node whose loader also runs on CPU 0 in step 3.
    threads = pd.concat(
        [
            threads,
            frame(
                "threads",
                [
                    thread_row(1, 2, 900, "launch", "1"),
                    thread_row(1, 901, 901, "loader", "0"),
                ],
            ),
        ],
        ignore_index=True,
    )
    extra = [
        sched_row(1, 901, 901, s, run_ns=(40 * MS if s >= 3 else 0), wait_ns=0)
        for s in range(-1, 6)
    ]
    sched = pd.concat([sched, frame("samples/sched", extra)], ignore_index=True)
    same_rank = sm.attribute_launch_wait(sched, threads, warmup=WARMUP)
    assert 901 not in set(same_rank["tid"])
    node = sm.attribute_launch_wait(sched, threads, warmup=WARMUP, ranks_per_node=2)
    s3 = node[(node["rank"] == 0) & (node["step"] == 3)].set_index("tid")
    # Shares: A 40 ms x 1/2, rank 1's worker 40 ms x 1 -> the 10 ms split 1 : 2.
    assert s3.loc[WORKER_A, "attributed_wait_ns"] == pytest.approx(10 * MS / 3)
    assert s3.loc[901, "attributed_wait_ns"] == pytest.approx(20 * MS / 3)
    assert s3.loc[901, "thread_rank"] == 1


def node_trace() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two ranks on one node, each with a launch thread that waits, and loader workers on the
    launch CPUs in every step: attribution rows in every step of both ranks, ties included."""
    threads = frame(
        "threads",
        [
            thread_row(0, 1, LAUNCH, "launch", "0", "python"),
            thread_row(0, WORKER_A, WORKER_A, "loader", "0-1", "pt_data_worker"),
            thread_row(0, WORKER_B, WORKER_B, "loader", "0-1", "pt_data_worker"),
            thread_row(1, 2, 900, "launch", "1", "python"),
            thread_row(1, 901, 901, "loader", "0-1", "pt_data_worker"),
        ],
    )
    rows = []
    for step in range(-1, 40):
        k = step + 2
        rows += [
            sched_row(0, 1, LAUNCH, step, run_ns=k * 10 * MS, wait_ns=k * (step % 3) * MS),
            # A and B run alike: equal attributed waits, whose order the sort keeps.
            sched_row(0, WORKER_A, WORKER_A, step, run_ns=k * 30 * MS, wait_ns=0),
            sched_row(0, WORKER_B, WORKER_B, step, run_ns=k * 30 * MS, wait_ns=0),
            sched_row(1, 2, 900, step, run_ns=k * 10 * MS, wait_ns=k * (step % 2) * MS),
            sched_row(1, 901, 901, step, run_ns=k * (step % 5) * MS, wait_ns=0),
        ]
    return frame("samples/sched", rows), threads


@pytest.mark.parametrize("rows_per_piece", [1, 3, 10, 1000])
def test_attribution_pieces_are_whole_steps_of_one_rank_in_the_table_order(
    rows_per_piece: int,
) -> None:
    sched, threads = node_trace()
    whole = sm.attribute_launch_wait(sched, threads, warmup=WARMUP, ranks_per_node=2)
    pieces = list(
        sm.launch_wait_pieces(
            sched, threads, warmup=WARMUP, ranks_per_node=2, rows_per_piece=rows_per_piece
        )
    )
    assert set(whole["rank"]) == {0, 1} and whole["step"].nunique() > 30
    pd.testing.assert_frame_equal(pd.concat(pieces, ignore_index=True), whole, check_exact=True)
    seen: set[tuple[int, int]] = set()
    for piece in pieces:
        assert piece["rank"].nunique() == 1
        keys = set(zip(piece["rank"], piece["step"], strict=True))
        assert not keys & seen  # a (rank, step) lies in one piece only
        seen |= keys
        # Pieces stay near their size, one step's rows (here <= 3) over at most.
        assert len(piece) < rows_per_piece + 3
    if rows_per_piece == 1000:
        assert len(pieces) == 2  # one per rank


def test_attribution_pieces_refuse_a_size_below_one() -> None:
    sched, threads = node_trace()
    with pytest.raises(ValueError, match="rows_per_piece"):
        next(sm.launch_wait_pieces(sched, threads, warmup=WARMUP, rows_per_piece=0))


def test_attribution_empty_inputs() -> None:
    at = sm.attribute_launch_wait(empty_frame("samples/sched"), empty_frame("threads"), warmup=0)
    assert at.empty
    assert {"rank", "step", "tid", "pid", "role", "attributed_wait_ns"} <= set(at)


# --- intervals and overlaps ---------------------------------------------------------------


def test_interval_union_and_overlap() -> None:
    u = intervals.interval_union(np.array([10, 0, 5, 30, 40]), np.array([20, 5, 12, 35, 40]))
    # [0,5) and [5,12) touch -> merge; [10,20) overlaps; the empty [40,40) is dropped.
    assert u.tolist() == [[0, 20], [30, 35]]
    assert intervals.interval_union(np.array([]), np.array([])).shape == (0, 2)
    b = intervals.interval_union(np.array([15, 33]), np.array([31, 50]))
    assert intervals.overlap_ns(u, b) == 5 + 1 + 2
    assert intervals.overlap_ns(b, u) == 8
    assert intervals.overlap_ns(u, np.empty((0, 2), dtype=np.int64)) == 0


def loader_item(
    rank: int, step: int, pid: int, item: int, t0: int, ms: tuple[float, ...]
) -> list[dict[str, Any]]:
    """One item: consecutive fetch, decode, transform of the given durations, from t0."""
    rows = []
    t = t0
    for stage, d in zip(("fetch", "decode", "transform"), ms, strict=True):
        rows.append(
            {
                "rank": rank,
                "step": step,
                "worker": 0,
                "pid": pid,
                "tid": pid,
                "item": item,
                "stage": stage,
                "start_ns": t,
                "end_ns": t + int(d * MS),
            }
        )
        t += int(d * MS)
    return rows


def test_overlaps_known_fractions() -> None:
    t0 = BASE + 300 * MS  # step 3 starts here; compute runs from 3 ms to 18 ms
    app = frame("events/app", training_step(0, 3))
    # The worker is busy 10..13 ms and 16..20 ms: 3 ms + 2 ms inside compute (3..18 ms).
    loader = frame(
        "events/loader",
        loader_item(0, 3, WORKER_A, 1, t0 + 10 * MS, (1, 1, 1))
        + loader_item(0, 3, WORKER_A, 2, t0 + 16 * MS, (1, 2, 1)),
    )
    cuda = frame(
        "events/cuda",
        [
            {"rank": 0, "step": 3, "kind": "kernel", "name": "k", "start_ns": t0 + 9 * MS}
            | {"end_ns": t0 + 11 * MS},
            {"rank": 0, "step": 3, "kind": "kernel", "name": "k", "start_ns": t0 + 14 * MS}
            | {"end_ns": t0 + 16 * MS},
        ],
    )
    ov = sm.overlaps(app, loader, cuda, warmup=WARMUP)
    assert ov["loader_compute_overlap"] == pytest.approx(5 / 15)
    assert ov["kernel_loader_overlap"] == pytest.approx(1 / 4)
    none = sm.overlaps(app, empty_frame("events/loader"), cuda, warmup=WARMUP)
    assert np.isnan(none["loader_compute_overlap"])
    assert np.isnan(none["kernel_loader_overlap"])


def test_overlaps_do_not_mix_ranks() -> None:
    t0 = BASE + 300 * MS
    app = frame("events/app", training_step(0, 3))
    # Rank 1's worker is busy during rank 0's compute on rank 1's (unrelated) clock.
    loader = frame("events/loader", loader_item(1, 3, WORKER_A, 1, t0 + 5 * MS, (5, 5, 5)))
    ov = sm.overlaps(app, loader, empty_frame("events/cuda"), warmup=WARMUP)
    assert not ov["loader_compute_overlap"] > 0


# --- loader and API metrics ---------------------------------------------------------------


def test_loader_metrics_item_service_time() -> None:
    rows = (
        loader_item(0, 3, WORKER_A, 1, BASE, (1, 2, 3))  # 6 ms
        + loader_item(0, 3, WORKER_B, 2, BASE, (1, 1, 0))  # 2 ms
        + loader_item(0, 4, WORKER_A, 1, BASE, (1, 1, 1))  # same index, next epoch: 3 ms
        + loader_item(0, 1, WORKER_A, 7, BASE, (50, 50, 50))  # warm-up
    )
    rows.append(
        {"rank": 0, "step": 3, "pid": WORKER_A, "item": -1, "stage": "collate"}
        | {"start_ns": BASE, "end_ns": BASE + 5 * MS}
    )
    out = sm.loader_metrics(frame("events/loader", rows), warmup=WARMUP).set_index("step")
    assert list(out.index) == [3, 4]
    assert out.loc[3, "loader_items"] == 2
    assert out.loc[3, "loader_item_ms"] == pytest.approx(4.0)
    assert out.loc[4, "loader_item_ms"] == pytest.approx(3.0)
    assert out.loc[3, "loader_collate_ms"] == pytest.approx(5.0)
    assert np.isnan(out.loc[4, "loader_collate_ms"])
    assert out.loc[3, "loader_decode_ms"] == pytest.approx(3.0)
    assert sm.loader_metrics(empty_frame("events/loader"), warmup=0).empty


def cuda_call(step: int, name: str, us: float, rank: int = 0) -> dict[str, Any]:
    return {
        "rank": rank,
        "step": step,
        "kind": "runtime",
        "name": name,
        "tid": LAUNCH,
        "stream": -1,
        "start_ns": BASE,
        "end_ns": BASE + int(us * 1000),
    }


def cuda_table() -> pd.DataFrame:
    rows = [cuda_call(3, "cudaLaunchKernel", us) for us in (4, 6, 8, 10)]
    rows += [cuda_call(3, "cudaMemcpyAsync", 20), cuda_call(4, "cudaLaunchKernel", 2)]
    rows += [cuda_call(1, "cudaLaunchKernel", 999), cuda_call(-1, "cudaMalloc", 999)]
    rows.append({"rank": 0, "step": 3, "kind": "kernel", "name": "gemm", "start_ns": BASE})
    return frame("events/cuda", rows)


def test_api_latency_table() -> None:
    t = sm.api_latency_table(cuda_table(), WARMUP)
    assert list(t.columns) == ["name", "calls", "mean_us", "p50_us", "p99_us"]
    lk = t.set_index("name").loc["cudaLaunchKernel"]
    assert lk["calls"] == 5
    assert lk["mean_us"] == pytest.approx(6.0)
    assert lk["p50_us"] == pytest.approx(6.0)
    assert lk["p99_us"] == pytest.approx(np.quantile([2, 4, 6, 8, 10], 0.99))
    # Warm-up and out-of-step calls (cudaMalloc at step -1) are not measured calls.
    assert set(t["name"]) == {"cudaLaunchKernel", "cudaMemcpyAsync"}
    # Sorted by total time: 30 us of launches before 20 us of copies.
    assert t["name"].iloc[0] == "cudaLaunchKernel"
    assert sm.api_latency_table(empty_frame("events/cuda"), 0).empty


def test_api_metrics_per_step() -> None:
    out = sm.api_metrics(cuda_table(), warmup=WARMUP).set_index("step")
    assert out.loc[3, "api_calls"] == 5
    assert out.loc[3, "api_us_mean"] == pytest.approx(48 / 5)
    assert out.loc[3, "launch_kernel_us_mean"] == pytest.approx(7.0)
    assert out.loc[4, "launch_kernel_calls"] == 1


# --- compare ------------------------------------------------------------------------------

SPEC = {
    "device": "cuda",
    "model": "resnet50",
    "batch_size": 128,
    "image_size": 224,
    "precision": "bf16",
    "policy": "none",
    "launch_cores": 1,
    "nodes": 1,
    "ranks_per_node": 1,
    "backend": "nccl",
    "comm_pattern": "buckets",
    "tier": "default",
    "cupti": False,
    "cuda_api": False,
    "world_size": 1,
}


def run_frames(
    run_id: str, mode: str, values: dict[str, list[float]], **spec: Any
) -> tuple[pd.DataFrame, pd.DataFrame]:
    loads = mode in columns.LOADING_MODES
    summary = {
        "run_id": run_id,
        "mode": mode,
        **SPEC,
        "workers": 4 if loads else 0,
        "prefetch_factor": 2 if loads else None,
        "pin_memory": True if loads else None,
        **spec,
    }
    n = len(next(iter(values.values())))
    steps = pd.DataFrame({"run_id": run_id, "step": np.arange(n), **values})
    return steps, pd.DataFrame([summary])


def p50(comparison: pd.DataFrame) -> pd.DataFrame:
    """The median rows of a comparison: what these tests' hand-computed answers are."""
    return comparison[comparison["stat"] == "p50"]


def run_set(*runs: tuple[pd.DataFrame, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    return (
        pd.concat([s for s, _ in runs], ignore_index=True),
        pd.concat([m for _, m in runs], ignore_index=True),
    )


def test_compare_exact_ratio_and_loader_normalisation() -> None:
    c = {"compute_eff_ms": [10.0, 10.0, 10.0], "step_ms": [12.0, 12.0, 12.0]}
    x = {"compute_eff_ms": [20.0, 20.0, 20.0], "step_ms": [30.0, 30.0, 30.0]}
    steps, summaries = run_set(
        # The compute twins had prefetch settings in their spec: irrelevant without a loader.
        run_frames("c0", "compute", c, prefetch_factor=8),
        run_frames("c1", "compute", {"compute_eff_ms": [30.0] * 3, "step_ms": [36.0] * 3}),
        run_frames("x0", "combined", x, repeat=0),
        run_frames("x1", "combined", x, repeat=1),
    )
    out = p50(cmp.compare(steps, summaries))
    row = out[(out["component"] == "compute") & (out["metric"] == "compute_eff_ms")]
    assert len(row) == 1
    r = row.iloc[0]
    assert r["status"] == "ok"
    # Isolation: mean of per-run medians (10, 30) = 20; combined 20 -> ratio 1.
    assert r["isolation"] == pytest.approx(20.0)
    assert r["combined"] == pytest.approx(20.0)
    assert r["ratio"] == pytest.approx(1.0)
    assert r["n_runs"] == 2
    assert r["n_isolation_runs"] == 2
    assert set(r["isolation_runs"].split()) == {"c0", "c1"}
    assert r["workers"] == 4
    assert r["ci_low"] <= r["ratio"] <= r["ci_high"]
    step = out[out["metric"] == "step_ms"].iloc[0]
    assert step["ratio"] == pytest.approx(30.0 / 24.0)
    # No `data` isolation run: the data component says what is missing instead of vanishing.
    data = out[out["component"] == "data"]
    assert list(data["metric"]) == ["loader_item_ms"]
    assert "missing isolation run: mode=data" in data.iloc[0]["status"]
    assert "workers=4" in data.iloc[0]["status"]
    assert np.isnan(data.iloc[0]["ratio"])
    # Single rank: no comm component at all.
    assert "comm" not in set(out["component"])


def with_ids(
    summaries: pd.DataFrame, groups: dict[str, str], twins: dict[str, str]
) -> pd.DataFrame:
    """``summaries`` with group ids (run -> group) and compute-twin ids (run -> group)."""
    ids = summaries.assign(**{cmp.GROUP_ID: summaries["run_id"].map(groups)})
    ids = ids.assign(**dict.fromkeys(cmp.TWIN_COLUMNS))
    ids[cmp.twin_column(Mode.COMPUTE)] = summaries["run_id"].map(twins)
    return ids


def test_compare_pairs_runs_by_the_ids_summarize_wrote() -> None:
    # Equal spec columns throughout (as runs of two data sets of one tier are): the ids alone
    # say that x0/x1 are two groups and which compute run is whose twin.
    steps, summaries = run_set(
        run_frames("c0", "compute", {"compute_eff_ms": [10.0] * 3}),
        run_frames("c1", "compute", {"compute_eff_ms": [20.0] * 3}),
        run_frames("x0", "combined", {"compute_eff_ms": [30.0] * 3}),
        run_frames("x1", "combined", {"compute_eff_ms": [30.0] * 3}),
    )
    groups = {"c0": "gc0", "c1": "gc1", "x0": "gx0", "x1": "gx1"}
    out = p50(cmp.compare(steps, with_ids(summaries, groups, {"x0": "gc0", "x1": "gc1"})))
    r = out[out["metric"] == "compute_eff_ms"].set_index("runs")
    assert r.loc["x0", "isolation_runs"] == "c0"
    assert r.loc["x0", "ratio"] == pytest.approx(3.0)
    assert r.loc["x1", "isolation_runs"] == "c1"
    assert r.loc["x1", "ratio"] == pytest.approx(1.5)
    # Without the ids (a runs table from before summarize wrote them) the spec columns decide:
    # one group of two repeats against both compute runs.
    old = p50(cmp.compare(steps, summaries))
    row = old[old["metric"] == "compute_eff_ms"].iloc[0]
    assert (row["runs"], row["isolation_runs"]) == ("x0 x1", "c0 c1")


def test_compare_exact_ratio_with_constant_steps() -> None:
    steps, summaries = run_set(
        run_frames("c0", "compute", {"compute_eff_ms": [10.0] * 4}),
        run_frames("c1", "compute", {"compute_eff_ms": [10.0] * 4}),
        run_frames("x0", "combined", {"compute_eff_ms": [22.7] * 4}),
        run_frames("x1", "combined", {"compute_eff_ms": [22.7] * 4}),
        run_frames("d0", "data", {"loader_item_ms": [2.0, 2.0, 2.0, 2.0]}),
        run_frames("x2", "data+compute", {"loader_item_ms": [3.0] * 4, "compute_eff_ms": [11] * 4}),
    )
    out = p50(cmp.compare(steps, summaries))
    r = out[(out["mode"] == "combined") & (out["metric"] == "compute_eff_ms")].iloc[0]
    assert r["ratio"] == pytest.approx(2.27)
    assert r["ci_low"] == pytest.approx(2.27)
    assert r["ci_high"] == pytest.approx(2.27)
    d = out[(out["mode"] == "data+compute") & (out["component"] == "data")].iloc[0]
    assert d["status"] == "ok"
    assert d["isolation_runs"] == "d0"
    assert d["ratio"] == pytest.approx(1.5)
    # A metric the runs never measured is reported as such, not as a ratio.
    lk = out[(out["mode"] == "combined") & (out["metric"] == "launch_kernel_us_mean")].iloc[0]
    assert lk["status"] == "metric not measured"


def test_compare_policies_and_workers_do_not_cross() -> None:
    steps, summaries = run_set(
        run_frames("c0", "compute", {"compute_eff_ms": [10.0] * 3}, policy="shared"),
        run_frames("x0", "combined", {"compute_eff_ms": [20.0] * 3}, policy="isolated"),
    )
    out = p50(cmp.compare(steps, summaries))
    r = out[out["metric"] == "compute_eff_ms"].iloc[0]
    assert "missing isolation run: mode=compute" in r["status"]
    assert "policy=isolated" in r["status"]


def test_compare_pairs_launch_latency_only_within_one_cupti_level() -> None:
    lk = "launch_kernel_us_mean"
    steps, summaries = run_set(
        run_frames("k0", "compute", {lk: [7.0] * 3}, cupti=True),
        run_frames("a0", "compute", {lk: [5.0] * 3}, cuda_api=True),
        run_frames("a1", "combined", {lk: [6.0] * 3}, cuda_api=True),
        # Callbacks on the combined side only: no isolation twin with the same level.
        run_frames("a2", "data+compute", {lk: [6.0] * 3}, cuda_api=True),
        run_frames("p0", "data+compute", {lk: [9.0] * 3}),
    )
    out = p50(cmp.compare(steps, summaries))
    r = out[out["metric"] == lk].set_index("mode")
    assert r.loc["combined", "isolation_runs"] == "a0"
    assert r.loc["combined", "ratio"] == pytest.approx(1.2)
    both = out[(out["mode"] == "data+compute") & (out["metric"] == lk)]
    plain = both[~both["cuda_api"].astype(bool)].iloc[0]
    assert "missing isolation run: mode=compute" in plain["status"]
    assert "cuda_api=False" in plain["status"]
    assert both[both["cuda_api"].astype(bool)].iloc[0]["isolation_runs"] == "a0"


def test_compare_matches_after_csv_round_trip(tmp_path: Path) -> None:
    steps, summaries = run_set(
        run_frames("c0", "compute", {"compute_eff_ms": [10.0] * 3}, launch_cores=None),
        run_frames("x0", "combined", {"compute_eff_ms": [15.0] * 3}, launch_cores=None),
    )
    # After CSV, None turns into NaN (NaN != NaN) and ints may turn into floats.
    summaries.to_csv(tmp_path / "s.csv", index=False)
    back = pd.read_csv(tmp_path / "s.csv")
    out = p50(cmp.compare(steps, back))
    r = out[out["metric"] == "compute_eff_ms"].iloc[0]
    assert r["status"] == "ok"
    assert r["ratio"] == pytest.approx(1.5)


def test_compare_empty() -> None:
    out = cmp.compare(pd.DataFrame(), pd.DataFrame())
    assert out.empty
    assert {"component", "metric", "ratio", "status"} <= set(out)


def test_comm_component_needs_two_ranks() -> None:
    steps, summaries = run_set(
        run_frames("m0", "comm", {"allreduce_ms": [4.0] * 3}, world_size=4),
        run_frames("x0", "compute+comm", {"allreduce_ms": [10.0] * 3}, world_size=4),
    )
    out = p50(cmp.compare(steps, summaries))
    r = out[out["component"] == "comm"].iloc[0]
    assert r["ratio"] == pytest.approx(2.5)


def test_multi_rank_combined_is_compared_with_its_training_step_without_loader() -> None:
    # compute+comm differs from combined only by the loader: compute and AllReduce inflation
    # against it keep DDP's overlap of the AllReduce with the backward on both sides.
    steps, summaries = run_set(
        run_frames(
            "t0",
            "compute+comm",
            {"compute_eff_ms": [30.0] * 4, "allreduce_ms": [1.0] * 4},
            world_size=2,
        ),
        run_frames(
            "x0",
            "combined",
            {"compute_eff_ms": [45.0] * 4, "allreduce_ms": [4.0] * 4},
            world_size=2,
        ),
    )
    out = p50(cmp.compare(steps, summaries))
    twin = out[out["component"] == "compute+comm"].set_index("metric")
    assert twin.loc["compute_eff_ms", "ratio"] == pytest.approx(1.5)
    assert twin.loc["allreduce_ms", "ratio"] == pytest.approx(4.0)
    assert set(twin["isolation_runs"]) == {"t0"}
    # A single-rank combined run has no such twin row (no collective to keep).
    steps1, summaries1 = run_set(
        run_frames("y0", "combined", {"compute_eff_ms": [45.0] * 4}),
    )
    assert "compute+comm" not in set(cmp.compare(steps1, summaries1)["component"])


def test_bootstrap_ratio() -> None:
    rng = np.random.default_rng(1)
    num = [rng.normal(20, 2, 30), rng.normal(22, 2, 30)]
    den = [rng.normal(10, 1, 30), rng.normal(10, 1, 30), rng.normal(11, 1, 30)]
    point, lo, hi = cmp.bootstrap_ratio(num, den, n=500)
    expected = np.mean([np.median(a) for a in num]) / np.mean([np.median(a) for a in den])
    assert point == pytest.approx(expected)
    assert lo < point < hi
    # Deterministic for a seed.
    assert cmp.bootstrap_ratio(num, den, n=500) == (point, lo, hi)
    assert cmp.bootstrap_ratio(num, den, n=500, seed=7) != (point, lo, hi)
    # One run each: the interval comes from the step-to-step spread, and it is not degenerate.
    p1, lo1, hi1 = cmp.bootstrap_ratio(num[:1], den[:1], n=500)
    assert lo1 < p1 < hi1
    # NaN steps are ignored; a run with nothing measured gives no ratio.
    with_nan = [np.append(num[0], np.nan)]
    assert cmp.bootstrap_ratio(with_nan, den[:1], n=50)[0] == pytest.approx(
        np.median(num[0]) / np.median(den[0])
    )
    assert all(np.isnan(cmp.bootstrap_ratio([np.array([np.nan])], den, n=50)))
    assert all(np.isnan(cmp.bootstrap_ratio([], den, n=50)))


# --- end to end ---------------------------------------------------------------------------


def synthetic_tables() -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    sched, threads = planted_trace()
    app = [r for s in range(6) for r in training_step(0, s)]
    loader = []
    for s in range(6):
        loader += loader_item(0, s, WORKER_A, s, BASE + s * 100 * MS + 3 * MS, (1, 2, 1))
    tables = {
        "events/app": frame("events/app", app),
        "events/loader": frame("events/loader", loader),
        "events/cuda": cuda_table(),
        "samples/sched": sched,
        "threads": threads,
        # events/comm deliberately absent: an untraced level counts as empty.
    }
    attrs = {
        "run_id": "abc123",
        "warmup_steps": WARMUP,
        "world_size": 1,
        "host": "node1",
        "spec": {
            "mode": "combined",
            "device": "cuda",
            "workload": {"model": "resnet50", "batch_size": 128},
            "pinning": {"policy": "shared"},
            "loader": {"workers": 2, "prefetch_factor": 2, "pin_memory": True},
            "layout": {"nodes": 1, "ranks_per_node": 1},
            "repeat": 0,
        },
    }
    return tables, attrs


def test_summarize_tables_end_to_end() -> None:
    tables, attrs = synthetic_tables()
    steps, summary, attribution = sm.summarize_tables(tables, attrs)
    assert list(steps["step"]) == [2, 3, 4, 5]
    assert (steps["run_id"] == "abc123").all()
    assert (steps["policy"] == "shared").all()
    s3 = steps.set_index("step").loc[3]
    assert s3["launch_wait_ms"] == pytest.approx(10.0)
    assert s3["loader_item_ms"] == pytest.approx(4.0)
    assert s3["launch_kernel_us_mean"] == pytest.approx(7.0)
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["steps"] == 4
    # Identical steps: nothing anomalous, every step in the steady state.
    assert row["outlier_steps"] == 0
    assert not steps["outlier"].any()
    assert row["step_ms_p50"] == pytest.approx(20.0)
    assert row["step_ms_cv"] == pytest.approx(0.0)
    assert row["throughput_samples_s"] == pytest.approx(128 * 1000 / 20)
    assert row["compute_eff_ms_p50"] == pytest.approx(15.0)
    assert row["data_wait_ms_p50"] == pytest.approx(2.0)
    assert row["launch_wait_ms_mean"] == pytest.approx(2.5)
    # Measured runtime calls: 4, 6, 8, 10, 20 (step 3) and 2 (step 4) us.
    assert row["api_us_p50"] == pytest.approx(7.0)
    assert row["launch_kernel_us_mean"] == pytest.approx(6.0)
    assert row["launch_kernel_calls"] == 5
    assert row["loader_item_ms_p50"] == pytest.approx(4.0)
    # 4 items over 3 steps' span (step 2 start .. step 5 end = 320 ms).
    assert row["loader_items_per_s"] == pytest.approx(4 / 0.32)
    assert row["launch_wait_loader_share"] == pytest.approx(1.0)
    assert row["workers"] == 2
    assert np.isnan(row["allreduce_ms_p50"])
    assert list(attribution["tid"]) == [WORKER_A]
    assert (attribution["run_id"] == "abc123").all()


def test_summarize_tables_minimal_trace() -> None:
    """A compute-mode trace with no loader, CUDA, comm or sched levels still summarises."""
    tables = {"events/app": frame("events/app", [r for s in range(3) for r in training_step(0, s)])}
    attrs = {"run_id": "r", "warmup_steps": 1, "spec": {"mode": "compute"}}
    steps, summary, attribution = sm.summarize_tables(tables, attrs)
    assert len(steps) == 2
    assert summary.iloc[0]["workers"] == 0
    assert np.isnan(summary.iloc[0]["launch_wait_ms_p50"])
    assert np.isnan(summary.iloc[0]["loader_items_per_s"])
    assert attribution.empty


def test_summary_carries_the_group_and_twin_ids_of_its_spec() -> None:
    tables, attrs = synthetic_tables()
    spec = RunSpec.from_dict({**attrs["spec"], "layout": {"ranks_per_node": 2}, "repeat": 1})
    _, summary, _ = sm.summarize_tables(tables, {**attrs, "spec": spec.to_dict()})
    row = summary.iloc[0]
    first = dataclasses.replace(spec, repeat=0)
    # Repeats share one group: the run id of repeat 0.
    assert row[cmp.GROUP_ID] == first.run_id != spec.run_id
    for mode in (Mode.DATA, Mode.COMPUTE, Mode.COMM, Mode.COMPUTE_COMM):
        # The twin of the run's own block (its repeat), and the group of the twin's repeats.
        assert row[cmp.twin_column(mode)] == spec.with_mode(mode).run_id
        assert row[cmp.twin_group_column(mode)] == first.with_mode(mode).run_id
    # An isolation run has no twins; a trace without a spec has no ids (compare then pairs by
    # the spec columns).
    _, iso, _ = sm.summarize_tables(tables, {**attrs, "spec": spec.with_mode(Mode.DATA).to_dict()})
    assert iso.iloc[0][[*cmp.TWIN_COLUMNS, *cmp.TWIN_GROUP_COLUMNS]].isna().all()
    _, bare, _ = sm.summarize_tables(tables, {**attrs, "spec": {}})
    assert bare.iloc[0][[cmp.GROUP_ID, *cmp.TWIN_COLUMNS, *cmp.TWIN_GROUP_COLUMNS]].isna().all()


def test_summaries_round_trip_through_parquet(tmp_path: Path) -> None:
    tables, attrs = synthetic_tables()
    for df in sm.summarize_tables(tables, attrs):
        df.to_parquet(tmp_path / "x.parquet", index=False)
        back = pd.read_parquet(tmp_path / "x.parquet")
        assert back.shape == df.shape


REAL_TRACES = sorted(Path("/tmp/wf/results/runs").glob("*/trace.h5"))


@pytest.mark.skipif(not REAL_TRACES, reason="no smoke-run traces under /tmp/wf")
@pytest.mark.parametrize("trace", REAL_TRACES, ids=lambda p: p.parent.name)
def test_real_trace_invariants(trace: Path) -> None:
    steps, summary, attribution = sm.summarize_trace(trace)
    assert len(summary) == 1
    assert len(steps) == summary.iloc[0]["steps"] > 0
    assert not steps.duplicated(["rank", "step"]).any()
    eps = 1e-6
    for part in ("compute_ms", "data_wait_ms", "sleep_ms"):
        both = steps[["step_ms", part]].dropna()
        assert (both["step_ms"] + eps >= both[part]).all(), part
    phases = steps[["forward_ms", "backward_ms", "optimizer_ms"]].sum(axis=1, min_count=3)
    comp = steps["compute_ms"]
    ok = phases.notna() & comp.notna()
    assert (comp[ok] + eps >= phases[ok] * 0.999).all()
    assert (steps["launch_wait_ms"].dropna() >= 0).all()
    row = summary.iloc[0]
    assert row["step_ms_p50"] <= row["step_ms_p95"] <= row["step_ms_p99"]
    if row["mode"] in columns.LOADING_MODES:
        assert (steps["loader_item_ms"].dropna() > 0).all()
        assert row["loader_items_per_s"] > 0
    for frac in ("loader_compute_overlap", "kernel_loader_overlap"):
        assert np.isnan(row[frac]) or 0 <= row[frac] <= 1
    if len(attribution):
        per_step = attribution.groupby(["rank", "step"])
        assert (
            per_step["attributed_wait_ns"].sum() <= per_step["launch_wait_ns"].first() + 1
        ).all()


def test_cpus_per_rank_reads_rank_zeros_allowed_set_old_traces_included() -> None:
    """runs.csv `cpus`: rank 0's `allowed_cpus` over cpus_split (else ranks_per_node); a trace
    written before the core budget existed (no `job_cpus`, no `pinning.cpus` in its spec) has
    the set too."""
    old = {"allowed_cpus": "0-15", "spec": {"layout": {"ranks_per_node": 1}}}
    assert sm.cpus_per_rank(old) == 16
    assert sm.spec_columns(old["spec"])["pinning_cpus"] == 0
    merged = {
        "allowed_cpus": "0-7",
        "spec": {"layout": {"ranks_per_node": 2}, "pinning": {"cpus": 4}},
        "ranks": [{"rank": 0, "allowed_cpus": "0-7"}, {"rank": 1, "allowed_cpus": "0-7"}],
    }
    assert sm.cpus_per_rank(merged) == 4
    assert sm.spec_columns(merged["spec"])["pinning_cpus"] == 4
    # A Slurm task bound to its own CPUs recorded them unshared (cpus_split 1): all are its.
    bound = {"allowed_cpus": "0-7", "cpus_split": 1, "spec": {"layout": {"ranks_per_node": 2}}}
    assert sm.cpus_per_rank(bound) == 8
    assert sm.cpus_per_rank({**bound, "cpus_split": np.int64(2)}) == 4
    # more ranks than CPUs still counts one; a trace that does not say gives NaN
    assert sm.cpus_per_rank({"allowed_cpus": "3", "spec": {"layout": {"ranks_per_node": 2}}}) == 1
    assert np.isnan(sm.cpus_per_rank({"spec": {}}))
