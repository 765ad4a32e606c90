"""Steady state, tail statistics and the decomposition, on synthetic traces with planted answers.

Every planted quantity (an outlier step, a peer's late arrival per bucket, extra run-queue wait
of the launch roles, extra GPU kernel time) must be recovered within 5 %.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from codl.analysis import columns, steady
from codl.analysis import compare as cmp
from codl.analysis import decompose as dec
from codl.analysis import summarize as sm
from codl.figures import data as figdata
from codl.figures import draw as plots
from codl.trace.store import empty_frame
from test_analysis import SPEC, frame

BASE = 7_000_000_000_000  # a realistic CLOCK_MONOTONIC origin, in ns
MS = 1_000_000
WARMUP = 2
STEPS = 40
LAUNCH, AUTOGRAD, WORKER = 100, 101, 200
REL = 0.05


# --- steady state -------------------------------------------------------------------------


def step_table(step_ms: np.ndarray, *, run_id: str = "r", rank: int = 0) -> pd.DataFrame:
    n = len(step_ms)
    return pd.DataFrame(
        {
            "run_id": run_id,
            "rank": rank,
            "step": np.arange(WARMUP, WARMUP + n),
            "step_ms": step_ms,
            "forward_ms": np.full(n, 10.0),
            "optimizer_ms": step_ms - 10.0,
        }
    )


def noisy(n: int, seed: int = 0) -> np.ndarray:
    return 30.0 + np.random.default_rng(seed).normal(0, 0.3, n)


def test_a_planted_outlier_is_flagged_with_its_phase() -> None:
    x = noisy(STEPS)
    x[17] = 180.0  # one GC-like pause, inside the optimizer
    out = steady.flag_outliers(step_table(x))
    assert out["outlier"].sum() == 1
    row = out[out["outlier"]].iloc[0]
    assert row["step"] == WARMUP + 17
    assert row["outlier_reason"].startswith(f"step {WARMUP + 17}; optimizer +")
    assert not out["tail_step"].any()


def test_the_first_measured_step_is_named_and_always_flagged() -> None:
    x = noisy(STEPS)
    x[0] = 90.0
    # Two more slow steps exceed the 1 % allowance of 40 steps: they are a tail, kept.
    x[[10, 30]] = 95.0
    out = steady.flag_outliers(step_table(x))
    assert list(out.loc[out["outlier"], "step"]) == [WARMUP]
    assert out.loc[out["outlier"], "outlier_reason"].iloc[0].startswith("first measured step")
    assert list(out.loc[out["tail_step"], "step"]) == [WARMUP + 10, WARMUP + 30]


def test_an_interference_tail_is_kept_not_flagged() -> None:
    x = noisy(200)
    x[5::10] = 70.0  # 10 % of steps slowed: a tail of the distribution, the effect itself
    out = steady.flag_outliers(step_table(x))
    assert not out["outlier"].any()
    assert out["tail_step"].sum() == 20


def test_flags_are_per_rank_and_run() -> None:
    a = noisy(STEPS)
    b = noisy(STEPS, seed=1)
    b[5] = 200.0
    both = pd.concat(
        [step_table(a, rank=0), step_table(b, rank=1), step_table(a, run_id="other")],
        ignore_index=True,
    )
    out = steady.flag_outliers(both)
    flagged = out[out["outlier"]]
    assert list(zip(flagged["run_id"], flagged["rank"], flagged["step"], strict=True)) == [
        ("r", 1, WARMUP + 5)
    ]


def test_steady_threshold_floor_when_steps_are_identical() -> None:
    x = np.full(STEPS, 30.0)
    x[3] = 31.0  # 3 % slower: with MAD = 0 only the relative floor stops this being flagged
    assert not steady.flag_outliers(step_table(x))["outlier"].any()
    assert steady.outlier_threshold(x) == pytest.approx(30.0 * (1 + steady.OUTLIER_MIN_EXCESS))


# --- tail statistics ----------------------------------------------------------------------

# The spec columns every synthetic run carries: test_analysis's, so both suites mean one run.


def run(run_id: str, mode: str, values: dict[str, np.ndarray], **spec: Any) -> pd.DataFrame:
    n = len(next(iter(values.values())))
    return pd.DataFrame(
        {"run_id": run_id, "mode": mode, "rank": 0, "step": np.arange(n), **values}
    ).assign(**{k: v for k, v in {**SPEC, **spec}.items() if k not in values})


def summaries(*steps: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for s in steps:
        r = s.iloc[0]
        loads = r["mode"] in columns.LOADING_MODES
        rows.append(
            {
                "run_id": r["run_id"],
                "mode": r["mode"],
                **SPEC,
                "workers": 4 if loads else 0,
                "prefetch_factor": 2 if loads else None,
                "pin_memory": True if loads else None,
            }
        )
    return pd.DataFrame(rows)


def stat_row(out: pd.DataFrame, metric: str, stat: str) -> pd.Series:
    r = out[(out["metric"] == metric) & (out["stat"] == stat)]
    assert len(r) == 1, r
    return r.iloc[0]


def test_tail_statistics_recover_a_planted_tail_and_ignore_the_twin_outlier() -> None:
    n = 400
    rng = np.random.default_rng(3)
    alone = 30.0 + rng.normal(0, 0.2, n)
    alone[100] = 180.0  # the twin's one anomalous step: must not decide any statistic
    comb = 30.0 + rng.normal(0, 0.2, n)
    slow = np.arange(n) % 10 == 5  # 10 % of combined steps 20 ms slower: the tail
    comb[slow] += 20.0
    a = steady.flag_outliers(run("a", "compute", {"compute_eff_ms": alone, "step_ms": alone}))
    c = steady.flag_outliers(run("c", "data+compute", {"compute_eff_ms": comb, "step_ms": comb}))
    out = cmp.compare(pd.concat([a, c], ignore_index=True), summaries(a, c))
    p50 = stat_row(out, "compute_eff_ms", "p50")
    assert p50["ratio"] == pytest.approx(1.0, rel=0.01)
    assert p50["isolation_flagged"] == 1
    assert p50["flagged"] == 0
    assert p50["isolation_steps"] == n - 1
    p95 = stat_row(out, "compute_eff_ms", "p95")
    assert p95["ratio"] == pytest.approx(50.0 / 30.0, rel=REL)
    assert p95["ci_low"] <= p95["ratio"] <= p95["ci_high"]
    mean = stat_row(out, "compute_eff_ms", "mean")
    # The twin's 180 ms step is left out: the mean ratio is the planted 1 + 0.1 * 20 / 30.
    assert mean["ratio"] == pytest.approx(1 + 0.1 * 20 / 30, rel=0.01)
    above = stat_row(out, "compute_eff_ms", "above_p99")
    # The planted 10 %, plus the 1 % of the other 90 % that lie above the twin's p99 by design.
    assert above["combined"] == pytest.approx(0.1 + 0.9 * 0.01, rel=REL)
    assert above["isolation"] == pytest.approx(0.01, abs=0.005)
    share = stat_row(out, "compute_eff_ms", "excess_share")
    # Lost: 2 ms per step on average, of a 32 ms mean combined step.
    assert share["combined"] == pytest.approx(2.0 / 32.0, rel=REL)
    assert share["effect"] == "difference"
    assert share["diff_ci_low"] <= share["diff"] <= share["diff_ci_high"]


def test_a_zero_twin_gives_a_difference_not_an_undefined_ratio() -> None:
    n = 60
    a = run("a", "compute", {"launch_wait_ms": np.zeros(n)})
    c = run("c", "data+compute", {"launch_wait_ms": np.full(n, 5.0)})
    out = cmp.compare(pd.concat([a, c], ignore_index=True), summaries(a, c))
    r = stat_row(out, "launch_wait_ms", "p50")
    assert r["status"] == "ok"
    assert r["effect"] == "difference"
    assert np.isnan(r["ratio"])
    assert r["diff"] == pytest.approx(5.0)
    assert r["diff_ci_low"] == pytest.approx(5.0)


def test_headline_puts_p50_beside_p95() -> None:
    n = 100
    a = run("a", "compute", {"compute_eff_ms": np.linspace(10, 20, n)})
    c = run("c", "data+compute", {"compute_eff_ms": np.linspace(10, 40, n)})
    out = cmp.compare(pd.concat([a, c], ignore_index=True), summaries(a, c))
    h = cmp.headline(out)
    r = h[h["metric"] == "compute_eff_ms"].iloc[0]
    assert r["stat"] == "p95"
    assert r["p50_ratio"] == pytest.approx(25.0 / 15.0)
    assert r["ratio"] == pytest.approx((10 + 30 * 0.95) / (10 + 10 * 0.95))


def test_quantile_interval_narrows_with_steps() -> None:
    x = np.random.default_rng(0).lognormal(3.4, 0.2, 5000)
    w = cmp.quantile_interval_width(x, [20, 2000], n=300, repeats=5)
    wide, narrow = w["rel_half_width"]
    # 100 times the steps: several times narrower (1/sqrt(n) for large n; the p95 of 20 steps
    # is nearly their maximum, whose bootstrap is lumpy, so no exact factor is asserted).
    assert wide > 2 * narrow


# --- decomposition: peer wait -------------------------------------------------------------

BUCKETS = 3
LATE_MS = 4.0  # rank 1 enqueues every bucket this much after rank 0
TRANSFER_MS = 1.5


def comm_rows(steps: range, late: float = LATE_MS) -> list[dict[str, Any]]:
    rows = []
    for step in steps:
        for b in range(BUCKETS):
            t0 = BASE + step * 100 * MS + b * 10 * MS
            last = t0 + int(late * MS)
            for rank, start in ((0, t0), (1, last)):
                rows.append(
                    {
                        "rank": rank,
                        "step": step,
                        "bucket": b,
                        "op": "allreduce",
                        "bytes": 1 << 20,
                        "start_ns": start,
                        "end_ns": last + int(TRANSFER_MS * MS),
                        "gpu_ns": -1,
                    }
                )
    return rows


def test_peer_wait_per_bucket_on_two_ranks() -> None:
    comm = frame("events/comm", comm_rows(range(6)))
    b = dec.bucket_waits(comm, warmup=WARMUP, ranks_per_node=2)
    r0 = b[b["rank"] == 0]
    r1 = b[b["rank"] == 1]
    assert len(r0) == 4 * BUCKETS
    assert r0["peer_wait_ms"].to_numpy() == pytest.approx(np.full(len(r0), LATE_MS), rel=REL)
    assert r0["transfer_ms"].to_numpy() == pytest.approx(np.full(len(r0), TRANSFER_MS), rel=REL)
    assert (r1["peer_wait_ms"] == 0).all()
    assert (r0["last_rank"] == 1).all()
    parts = dec.comm_parts(comm, warmup=WARMUP, ranks_per_node=2).set_index(["rank", "step"])
    assert parts.loc[(0, 3), "bucket_peer_wait_ms"] == pytest.approx(BUCKETS * LATE_MS, rel=REL)
    # Exposed (after rank 0's own last bucket): the peer's lateness once, not once per bucket.
    assert parts.loc[(0, 3), "peer_wait_ms"] == pytest.approx(LATE_MS, rel=REL)
    assert parts.loc[(0, 3), "transfer_ms"] == pytest.approx(TRANSFER_MS, rel=REL)
    assert parts.loc[(0, 3), "straggler_rank"] == 1
    assert parts.loc[(0, 3), "arrival_clock"] == "host"
    assert np.isnan(parts.loc[(1, 3), "straggler_rank"])
    # The per-bucket parts add up to the step's AllReduce time as summarize computes it.
    steps = sm.step_metrics(app_table(range(6), ranks=(0, 1)), comm, warmup=WARMUP)
    ar = steps.set_index(["rank", "step"])["allreduce_ms"]
    total = parts["bucket_peer_wait_ms"] + parts["bucket_transfer_ms"]
    assert total.to_numpy() == pytest.approx(ar.reindex(total.index).to_numpy())


def test_peer_wait_needs_one_clock() -> None:
    # One rank per node: the enqueue times are on two unrelated clocks, so no peer wait.
    comm = frame("events/comm", comm_rows(range(4)))
    b = dec.bucket_waits(comm, warmup=WARMUP, ranks_per_node=1)
    assert b["peer_wait_ms"].isna().all()


# --- decomposition: host launch delay and GPU slowdown ------------------------------------

RUN_MS, AUTOGRAD_MS, KERNEL_MS = 10.0, 5.0, 20.0
EXTRA_WAIT_MS, EXTRA_AUTOGRAD_WAIT_MS, EXTRA_KERNEL_MS = 6.0, 2.0, 3.0


def app_table(steps: range, *, ranks: tuple[int, ...] = (0,), compute_ms: float = 25.0) -> Any:
    rows = []
    for rank in ranks:
        for step in steps:
            t0 = BASE + step * 100 * MS
            for phase, a, b in (("step", 0, 40), ("compute", 2, 2 + compute_ms)):
                rows.append(
                    {
                        "rank": rank,
                        "step": step,
                        "phase": phase,
                        "tid": LAUNCH,
                        "start_ns": t0 + int(a * MS),
                        "end_ns": t0 + int(b * MS),
                    }
                )
    return frame("events/app", rows)


def traced_run(*, loaded: bool, steps: range = range(WARMUP + 30)) -> dict[str, pd.DataFrame]:
    """A launch and an autograd thread with known per-step CPU time and run-queue wait, and
    two kernels per step (overlapping, so the union counts), plus one NCCL kernel that is not
    compute. ``loaded`` adds the planted extra waits and kernel time."""
    threads = frame(
        "threads",
        [
            {"rank": 0, "pid": 1, "tid": LAUNCH, "role": "launch", "name": "python"},
            {"rank": 0, "pid": 1, "tid": AUTOGRAD, "role": "autograd", "name": "pt_autograd_0"},
            {"rank": 0, "pid": WORKER, "tid": WORKER, "role": "loader", "name": "worker"},
        ],
    )
    cum = {LAUNCH: [0, 0], AUTOGRAD: [0, 0], WORKER: [0, 0]}
    sched, cuda = [], []
    for step in [-1, *steps]:
        if step >= 0:
            cum[LAUNCH][0] += int(RUN_MS * MS)
            cum[AUTOGRAD][0] += int(AUTOGRAD_MS * MS)
            cum[WORKER][0] += 30 * MS  # loader CPU time is not a launch role's: never counted
            if loaded:
                cum[LAUNCH][1] += int(EXTRA_WAIT_MS * MS)
                cum[AUTOGRAD][1] += int(EXTRA_AUTOGRAD_WAIT_MS * MS)
            t0 = BASE + step * 100 * MS
            k = KERNEL_MS + (EXTRA_KERNEL_MS if loaded else 0.0)
            for name, a, b in (
                ("gemm", 0.0, k * 0.6),
                ("conv", k * 0.5, k),  # overlaps gemm: busy time is the union, k
                ("ncclDevKernel_AllReduce", 0.0, 50.0),
            ):
                cuda.append(
                    {
                        "rank": 0,
                        "step": step,
                        "kind": "kernel",
                        "name": name,
                        "start_ns": t0 + int(a * MS),
                        "end_ns": t0 + int(b * MS),
                    }
                )
        for tid, (run_ns, wait_ns) in cum.items():
            sched.append(
                {
                    "t_ns": BASE + (step + 1) * 100 * MS,
                    "rank": 0,
                    "pid": 1 if tid != WORKER else WORKER,
                    "tid": tid,
                    "step": step,
                    "run_ns": run_ns,
                    "wait_ns": wait_ns,
                }
            )
    extra_ms = EXTRA_WAIT_MS + EXTRA_AUTOGRAD_WAIT_MS + EXTRA_KERNEL_MS if loaded else 0.0
    return {
        "events/app": app_table(steps, compute_ms=25.0 + extra_ms),
        "events/comm": empty_frame("events/comm"),
        "events/cuda": frame("events/cuda", cuda),
        "samples/sched": frame("samples/sched", sched),
        "threads": threads,
    }


def test_step_parts_recover_host_time_and_kernel_busy_time() -> None:
    parts = dec.step_parts(traced_run(loaded=True), warmup=WARMUP).set_index(["rank", "step"])
    p = parts.loc[(0, 5)]
    assert p["launch_run_ms"] == pytest.approx(RUN_MS)
    assert p["launch_wait_ms"] == pytest.approx(EXTRA_WAIT_MS)
    assert p["autograd_run_ms"] == pytest.approx(AUTOGRAD_MS)
    assert p["autograd_wait_ms"] == pytest.approx(EXTRA_AUTOGRAD_WAIT_MS)
    assert p["host_ms"] == pytest.approx(RUN_MS + AUTOGRAD_MS + EXTRA_WAIT_MS + 2.0)
    assert p["gpu_kernel_ms"] == pytest.approx(KERNEL_MS + EXTRA_KERNEL_MS)
    assert np.isnan(p["peer_wait_ms"])
    # No phase-boundary counters in this trace: the host part is the whole step's, and says so.
    assert p["host_source"] == "whole step"
    assert sorted(parts.index.get_level_values("step")) == list(range(WARMUP, WARMUP + 30))


def summarized(run_id: str, mode: str, tables: dict[str, pd.DataFrame]) -> tuple[Any, ...]:
    attrs = {
        "run_id": run_id,
        "warmup_steps": WARMUP,
        "spec": {
            "mode": mode,
            "device": "cuda",
            "workload": {"model": "resnet50", "batch_size": 128},
            "pinning": {"policy": "none"},
            "loader": {"workers": 2},
            "layout": {"nodes": 1, "ranks_per_node": 1},
            "trace": {"cupti": True},
        },
    }
    parts = dec.step_parts(tables, warmup=WARMUP)
    parts.insert(0, "run_id", run_id)
    steps, summary, _ = sm.summarize_tables(tables, attrs, parts=parts)
    return steps, summary, parts


def test_decomposition_recovers_host_launch_delay_and_gpu_slowdown() -> None:
    a_steps, a_sum, a_parts = summarized("alone", "compute", traced_run(loaded=False))
    c_steps, c_sum, c_parts = summarized("loaded", "data+compute", traced_run(loaded=True))
    d = dec.decompose(
        pd.concat([a_steps, c_steps], ignore_index=True),
        pd.concat([a_parts, c_parts], ignore_index=True),
        pd.concat([a_sum, c_sum], ignore_index=True),
    )
    assert set(d["run_id"]) == {"loaded"}
    assert (d["twin_mode"] == "compute").all()
    host = EXTRA_WAIT_MS + EXTRA_AUTOGRAD_WAIT_MS
    assert d["host_launch_delay_ms"].to_numpy() == pytest.approx(np.full(len(d), host), rel=REL)
    assert d["gpu_slowdown_ms"].to_numpy() == pytest.approx(
        np.full(len(d), EXTRA_KERNEL_MS), rel=REL
    )
    # The planted compute inflation is exactly host + GPU: nothing is left unattributed.
    assert d["compute_inflation_ms"].to_numpy() == pytest.approx(
        np.full(len(d), host + EXTRA_KERNEL_MS), rel=REL
    )
    assert d["unattributed_ms"].abs().max() < REL * (host + EXTRA_KERNEL_MS)
    means = dec.decomposition_means(d)
    assert set(means["view"]) == {"all steps", "slowest 5 %"}
    allsteps = means[means["view"] == "all steps"].iloc[0]
    assert allsteps["host_launch_delay_ms"] == pytest.approx(host, rel=REL)


PIN, COMM, BLOCK_MS, GIL_TIMEOUT_MS = 300, 400, 3.0, 5.0


def with_gil_sleeps(tables: dict[str, pd.DataFrame], *, block_ms: float) -> dict[str, pd.DataFrame]:
    """``tables`` plus the kernel's scheduler record: in each step's compute span the launch
    thread sleeps ``block_ms`` until the pin-memory thread wakes it, the autograd thread sleeps
    through the second half of that (the same lost time: counted once), then (loaded only) the
    autograd thread's GIL wait times out after 5 ms (a timer wakes it: counted), and the launch
    thread sleeps 5 ms until a comm thread wakes it (a collective: the peer-wait parts' time,
    not counted)."""
    threads = pd.concat(
        [
            tables["threads"],
            frame(
                "threads",
                [
                    {"rank": 0, "pid": 1, "tid": PIN, "role": "pin_memory", "name": "pt_data_pin"},
                    {"rank": 0, "pid": 1, "tid": COMM, "role": "comm", "name": "pt_nccl_watchdg"},
                ],
            ),
        ],
        ignore_index=True,
    )
    app = tables["events/app"]
    switch: list[dict[str, Any]] = []
    waking: list[dict[str, Any]] = []

    def sleep(tid: int, a: int, b: int, waker: int) -> None:
        switch.append({"rank": 0, "t_ns": a, "cpu": 0, "prev_tid": tid, "prev_state": "S"})
        switch[-1]["next_tid"] = 0
        waking.append(
            {"rank": 0, "t_ns": b, "cpu": 1, "tid": tid, "waker_tid": waker, "target_cpu": 0}
        )
        switch.append(
            {"rank": 0, "t_ns": b + 1000, "cpu": 0, "prev_tid": 0, "prev_state": "R"}
            | {"next_tid": tid}
        )

    block = int(block_ms * MS)
    for t0 in app.loc[app["phase"] == "compute", "start_ns"].astype("int64"):
        t = int(t0) + MS
        if block:
            sleep(LAUNCH, t, t + block, PIN)
            sleep(AUTOGRAD, t + block // 2, t + block, PIN)
            timeout = int(GIL_TIMEOUT_MS * MS)
            sleep(AUTOGRAD, t + block + MS, t + block + MS + timeout, 0)
        sleep(LAUNCH, t + block + 7 * MS, t + block + 12 * MS, COMM)
    switch.sort(key=lambda r: r["t_ns"])
    waking.sort(key=lambda r: r["t_ns"])
    return tables | {
        "threads": threads,
        "events/sched_switch": frame("events/sched_switch", switch),
        "events/sched_waking": frame("events/sched_waking", waking),
    }


def test_sleeps_ended_by_a_lock_holder_are_the_host_blocked_part() -> None:
    loaded = traced_run(loaded=True)
    extra = EXTRA_WAIT_MS + EXTRA_AUTOGRAD_WAIT_MS + EXTRA_KERNEL_MS
    blocked = BLOCK_MS + GIL_TIMEOUT_MS
    loaded["events/app"] = app_table(range(WARMUP + 30), compute_ms=25.0 + extra + blocked)
    loaded = with_gil_sleeps(loaded, block_ms=BLOCK_MS)
    alone = with_gil_sleeps(traced_run(loaded=False), block_ms=0.0)
    parts = dec.step_parts(loaded, warmup=WARMUP)
    assert parts["blocked_ms"].to_numpy() == pytest.approx(np.full(len(parts), blocked))
    assert (dec.step_parts(alone, warmup=WARMUP)["blocked_ms"] == 0).all()
    a_steps, a_sum, a_parts = summarized("alone", "compute", alone)
    c_steps, c_sum, c_parts = summarized("loaded", "data+compute", loaded)
    d = dec.decompose(
        pd.concat([a_steps, c_steps], ignore_index=True),
        pd.concat([a_parts, c_parts], ignore_index=True),
        pd.concat([a_sum, c_sum], ignore_index=True),
    )
    assert d["host_blocked_ms"].to_numpy() == pytest.approx(np.full(len(d), blocked), rel=REL)
    # The planted inflation is host + GPU + the sleeps: with the new part the budget closes.
    assert d["unattributed_ms"].abs().max() < REL * (extra + blocked)
    # Without the scheduler record the part is unmeasured (NaN), not zero.
    plain = dec.step_parts(traced_run(loaded=True), warmup=WARMUP)
    assert plain["blocked_ms"].isna().all()


def test_parts_from_a_steps_table_keep_what_it_has() -> None:
    steps = pd.DataFrame(
        {
            "run_id": "r",
            "rank": 0,
            "step": [2, 3],
            "launch_run_ms": [10.0, 11.0],
            "launch_wait_ms": [0.0, 2.0],
        }
    )
    p = dec.parts_from_steps(steps)
    assert list(p["host_ms"]) == [10.0, 13.0]
    assert p["peer_wait_ms"].isna().all()
    assert p["gpu_kernel_ms"].isna().all()


# --- decomposition as a budget: two DDP ranks, counters at the compute phase's boundaries ----

DDP_BUCKETS = 4
BUCKET_GAP_MS = 5.0  # a rank reaches bucket b at compute start + (b + 1) * 5 ms + its delay
OPTIMIZER_MS = 3.0
HANDOFF_MS = 8.0  # extra main-thread CPU time outside the compute span (the batch hand-off)
MAIN_SHARE = 0.7  # of a rank's launch delay: the main thread's run-queue wait; rest autograd's


def ddp_run(
    run_id: str, mode: str, delay: np.ndarray | None, *, gpu_clock: bool = False
) -> dict[str, pd.DataFrame]:
    """Two ranks of one node. ``delay[step]`` ms of run-queue wait of rank 1's launch roles
    inside its compute span delays its bucket arrivals; rank 0 then waits for rank 1 at the end
    of its backward pass. With ``gpu_clock`` the arrivals are GPU starts (events/comm_gpu) and
    the host enqueued every bucket early, at the same time on both ranks (host runs ahead)."""
    app, comm, comm_gpu, phase, sched, threads = [], [], [], [], [], []
    cum = {0: 0, 1: 0}
    for step in range(len(delay) if delay is not None else STEPS):
        t0 = BASE + step * 100 * MS
        c0 = t0 + 2 * MS
        d = {0: 0.0, 1: float(delay[step]) if delay is not None else 0.0}
        arrive = {
            (r, b): c0 + int((d[r] + BUCKET_GAP_MS * (b + 1)) * MS)
            for r in (0, 1)
            for b in range(DDP_BUCKETS)
        }
        ends = {b: max(arrive[0, b], arrive[1, b]) + int(TRANSFER_MS * MS) for b in range(4)}
        c1 = max(ends.values()) + int(OPTIMIZER_MS * MS)
        for r in (0, 1):
            for ph, a, e in (("step", t0, t0 + 60 * MS), ("compute", c0, c1)):
                app.append({"rank": r, "step": step, "phase": ph, "start_ns": a, "end_ns": e})
            for b in range(DDP_BUCKETS):
                host = c0 + (b + 1) * MS // 5 if gpu_clock else arrive[r, b]
                gpu = ends[b] - arrive[r, b] if gpu_clock else -1
                row = {"rank": r, "step": step, "bucket": b, "op": "allreduce", "bytes": 1 << 20}
                comm.append({**row, "start_ns": host, "end_ns": ends[b], "gpu_ns": gpu})
                comm_gpu.append(
                    {**row, "start_ns": arrive[r, b], "end_ns": ends[b]} if gpu_clock else {}
                )
            for tid, run, share in ((LAUNCH, RUN_MS, MAIN_SHARE), (AUTOGRAD, 5.0, 1 - MAIN_SHARE)):
                wait = d[r] * share
                phase.append(
                    {"rank": r, "step": step, "phase": "compute", "tid": tid + r * 10}
                    | {"start_ns": c0, "end_ns": c1, "run_ns": int(run * MS)}
                    | {"wait_ns": int(wait * MS)}
                )
            # Whole-step samples: the hand-off's CPU time lies outside the compute span.
            cum[r] += int((RUN_MS + (HANDOFF_MS if mode == "combined" else 0.0)) * MS)
            sched.append(
                {"t_ns": t0 + 61 * MS, "rank": r, "pid": r + 1, "tid": LAUNCH + r * 10}
                | {"step": step, "run_ns": cum[r]}
            )
    for r in (0, 1):
        for tid, role in ((LAUNCH, "launch"), (AUTOGRAD, "autograd")):
            threads.append({"rank": r, "pid": r + 1, "tid": tid + r * 10, "role": role})
    tables = {
        "events/app": frame("events/app", app),
        "events/comm": frame("events/comm", comm),
        "events/comm_gpu": frame("events/comm_gpu", [g for g in comm_gpu if g]),
        "events/phase_sched": frame("events/phase_sched", phase),
        "samples/sched": frame("samples/sched", sched),
        "threads": frame("threads", threads),
    }
    return {n: tables.get(n, empty_frame(n)) for n in columns.SUMMARY_TABLES}


def ddp_decomposition(
    delay: np.ndarray, *, gpu_clock: bool = False, drop: tuple[str, ...] = ()
) -> pd.DataFrame:
    frames, parts, sums = [], [], []
    for run_id, mode, d in (("ddp", "compute+comm", None), ("full", "combined", delay)):
        tables = ddp_run(run_id, mode, d, gpu_clock=gpu_clock)
        for name in drop:
            tables[name] = empty_frame(name)
        attrs = {
            "run_id": run_id,
            "warmup_steps": WARMUP,
            "world_size": 2,
            "spec": {
                "mode": mode,
                "device": "cpu",
                "workload": {"model": "resnet_tiny", "batch_size": 16},
                "pinning": {"policy": "none"},
                "loader": {"workers": 2},
                "layout": {"nodes": 1, "ranks_per_node": 2, "backend": "gloo"},
            },
        }
        p = dec.step_parts(tables, warmup=WARMUP, ranks_per_node=2)
        p.insert(0, "run_id", run_id)
        st, su, _ = sm.summarize_tables(tables, attrs, parts=p)
        frames.append(st)
        parts.append(p)
        sums.append(su)
    return dec.decompose(
        pd.concat(frames, ignore_index=True),
        pd.concat(parts, ignore_index=True),
        pd.concat(sums, ignore_index=True),
    )


def planted_delays(n: int = 30) -> np.ndarray:
    return np.random.default_rng(7).uniform(2.0, 9.0, WARMUP + n)


@pytest.mark.parametrize("gpu_clock", [False, True])
def test_the_budget_recovers_a_launch_delay_and_the_peer_wait_it_causes(gpu_clock: bool) -> None:
    """Rank 1 is preempted inside its compute span (a known delay per step); rank 0 waits for
    it in its exposed AllReduce. Each rank's inflation is recovered as the right part, the
    batch hand-off outside the compute span is not counted, and the budget closes within 5 %."""
    delay = planted_delays()
    d = ddp_decomposition(delay, gpu_clock=gpu_clock).set_index(["rank", "step"])
    assert (d["twin_mode"] == "compute+comm").all()
    assert (d["host_source"] == "compute span").all()
    assert (d["arrival_clock"] == ("gpu" if gpu_clock else "host")).all()
    steps = d.index.get_level_values("step").unique()
    planted = pd.Series(delay[steps], index=steps)
    for rank, cause, other in (
        (1, "host_launch_delay_ms", "peer_wait_ms"),
        (0, "peer_wait_ms", "host_launch_delay_ms"),
    ):
        r = d.loc[rank]
        assert r["compute_inflation_ms"].to_numpy() == pytest.approx(planted.to_numpy(), rel=REL)
        assert r[cause].to_numpy() == pytest.approx(planted.to_numpy(), rel=REL)
        assert r[other].abs().max() < REL * planted.min()
        assert r["transfer_ms"].abs().max() < REL * planted.min()
        budget = r[list(dec.PARTS)].sum(axis=1, min_count=0) + r["unattributed_ms"]
        assert budget.to_numpy() == pytest.approx(r["compute_inflation_ms"].to_numpy())
        assert (r["unattributed_ms"].abs() <= REL * r["compute_inflation_ms"].abs()).all()
    assert (d.loc[0, "straggler_rank"] == 1).all()
    # Per bucket, rank 0 waited the delay at every one of the 4 buckets: the AllReduce view.
    r0 = d.loc[0]
    assert r0["allreduce_peer_wait_ms"].to_numpy() == pytest.approx(
        DDP_BUCKETS * planted.to_numpy(), rel=REL
    )


def test_without_gpu_arrivals_the_host_clock_is_used_and_named() -> None:
    # The host enqueued every bucket at once on both ranks: its clock sees no peer wait at all,
    # and the table says the arrivals were host times.
    d = ddp_decomposition(planted_delays(), gpu_clock=True, drop=("events/comm_gpu",))
    assert (d["arrival_clock"] == "host").all()
    assert d.loc[d["rank"] == 0, "peer_wait_ms"].abs().max() < REL


def test_without_phase_counters_the_whole_step_host_part_is_named() -> None:
    # An older trace: per-step samples only. The hand-off lands in the host part, and the
    # table says the part covers the whole step (not a budget).
    d = ddp_decomposition(planted_delays(), drop=("events/phase_sched",))
    assert (d["host_source"] == "whole step").all()
    assert d["host_launch_delay_ms"].to_numpy() == pytest.approx(
        np.full(len(d), HANDOFF_MS), rel=REL
    )


class FakeEvent:
    """A CUDA event stand-in: its GPU time in ms, and elapsed_time as CUDA defines it."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.ms - self.ms


def test_bucket_gpu_starts_are_placed_on_the_host_clock_by_the_step_event() -> None:
    from codl.harness.comm import CommRecorder

    rec = CommRecorder(rank=1, step=7)
    step_event, t_step = FakeEvent(100.0), BASE
    # Two buckets: the GPU reaches them 12 and 20 ms after the step began; each takes 1.5 ms.
    for start_ms in (112.0, 120.0):
        rec.record(
            "allreduce", 1 << 20, BASE, BASE, (FakeEvent(start_ms), FakeEvent(start_ms + 1.5))
        )
    rec.flush(7, ref=(t_step, step_event))
    g = rec.gpu_rows
    assert g["bucket"] == [0, 1] and g["step"] == [7, 7] and g["rank"] == [1, 1]
    assert g["start_ns"] == [BASE + 12 * MS, BASE + 20 * MS]
    assert [e - s for s, e in zip(g["start_ns"], g["end_ns"], strict=True)] == [1.5 * MS] * 2
    assert rec.rows["gpu_ns"] == [1.5 * MS] * 2
    # Without a step event (no CUDA events on the step) nothing is placed.
    rec.record("allreduce", 1, BASE, BASE, (FakeEvent(0.0), FakeEvent(1.0)))
    rec.flush(8)
    assert len(g["bucket"]) == 2


def test_step_timeline_draws_each_off_cpu_interval_where_it_fell(tmp_path: Path) -> None:
    def complete(t: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        return {n: empty_frame(n) for n in columns.SUMMARY_TABLES} | t

    tables = complete(with_gil_sleeps(traced_run(loaded=True), block_ms=BLOCK_MS))
    step = WARMUP + 3
    bars = figdata.timeline_bars(tables, step=step)
    off = bars[bars["kind"] == "offcpu"]
    t0 = BASE + step * 100 * MS
    start = (t0 + 2 * MS) + MS  # the compute span opens 2 ms into the step; sleeps 1 ms later
    gil = off[off["label"] == "gil"]
    # The launch thread's wait for the pin-memory thread, the autograd thread's (the second
    # half of it) and its timed-out GIL wait, each at its own time on its own track.
    got = sorted(zip(gil["track"], gil["start_ms"].round(3), gil["end_ms"].round(3), strict=True))
    ms = (start - t0) / MS
    assert got == [
        ("autograd thread", round(ms + BLOCK_MS / 2, 3), round(ms + BLOCK_MS, 3)),
        ("autograd thread", round(ms + BLOCK_MS + 1, 3), round(ms + BLOCK_MS + 6, 3)),
        ("launch thread", round(ms, 3), round(ms + BLOCK_MS, 3)),
    ]
    comm = off[off["label"] == "comm"]
    assert list(comm["track"]) == ["launch thread"]
    assert comm["end_ms"].iloc[0] - comm["start_ms"].iloc[0] == pytest.approx(5.0)
    # After each wake-up the thread queued 1 us before it ran: drawn as run-queue time.
    assert (off["label"] == "runnable").sum() == 4
    # Without the record nothing is placed (schedstat totals only).
    plain = figdata.timeline_bars(complete(traced_run(loaded=True)), step=step)
    assert not (plain["kind"] == "offcpu").any()
    out = [tmp_path / "timeline.png"]
    plots.step_timeline(bars, out)
    assert out[0].stat().st_size > 0


# --- decomposition within blocks ------------------------------------------------------------


def block_runs(blocks: dict[str, tuple[str, float, float | None]]) -> tuple[Any, ...]:
    """Steps and runs table of data+compute runs and their compute twins, per block key
    ``(host, compute ms of the twin, of the loaded run or None)``: repeat r is block r."""
    steps, rows = [], []
    for rep, (host, twin_ms, run_ms) in enumerate(blocks.values()):
        for mode, ms in (("compute", twin_ms), ("data+compute", run_ms)):
            if ms is None:
                continue
            rid = f"{mode[0]}{rep}"
            n = 30
            s = run(rid, mode, {"compute_eff_ms": np.full(n, ms), "step_ms": np.full(n, ms)})
            steps.append(s.assign(launch_run_ms=ms / 2, launch_wait_ms=0.0, repeat=rep))
            rows.append(summaries(s).assign(repeat=rep, host=host))
    return pd.concat(steps, ignore_index=True), pd.concat(rows, ignore_index=True)


def test_each_run_is_decomposed_against_the_twins_of_its_own_block() -> None:
    # The machine drifted by 10 ms between blocks 0 and 1; block 2 has no twin of its own.
    steps, runs = block_runs(
        {"b0": ("vm", 30.0, 33.0), "b1": ("vm", 40.0, 44.0), "b2": ("vm", 0.0, 36.0)}
    )
    steps = steps[~(steps["run_id"] == "c2")]
    runs = runs[runs["run_id"] != "c2"]
    d = dec.decompose(steps, dec.parts_from_steps(steps), runs)
    per_run = d.groupby("run_id").first()
    assert per_run.loc["d0", "compute_inflation_ms"] == pytest.approx(3.0)
    assert per_run.loc["d1", "compute_inflation_ms"] == pytest.approx(4.0)
    assert per_run.loc["d0", "twin_runs"] == "c0"
    assert per_run.loc["d1", "host_launch_delay_ms"] == pytest.approx(2.0)
    assert set(per_run.loc[["d0", "d1"], "twin_status"]) == {"ok"}
    assert per_run.loc["d0", "block"] == "vm#0"
    # No twin in its block: all twins (mean 35 ms), and the status says the pair crosses blocks.
    assert per_run.loc["d2", "compute_inflation_ms"] == pytest.approx(1.0)
    assert per_run.loc["d2", "twin_runs"] == "c0 c1"
    status = per_run.loc["d2", "twin_status"]
    assert status == f"{cmp.ACROSS_BLOCKS}: run in vm#2, twins in vm#0 vm#1"


def test_runs_without_block_information_keep_all_their_twins() -> None:
    # Runs tables without host (and so without blocks) decompose as before blocks existed.
    steps, runs = block_runs({"b0": ("", 30.0, 33.0), "b1": ("", 40.0, 44.0)})
    d = dec.decompose(steps, dec.parts_from_steps(steps), runs.drop(columns=["host"]))
    per_run = d.groupby("run_id").first()
    assert per_run["compute_inflation_ms"].to_dict() == pytest.approx({"d0": -2.0, "d1": 9.0})
    assert set(per_run["twin_runs"]) == {"c0 c1"}
    assert set(per_run["twin_status"]) == {"ok"}


def planted_decomposition(steps: int, inflation: dict[str, float]) -> pd.DataFrame:
    """Decomposition rows of one group: run r (block ``b<r>``) inflated by ``inflation[r]`` ms
    every step, all of it host launch delay."""
    frames = []
    for i, (rid, ms) in enumerate(inflation.items()):
        frames.append(
            pd.DataFrame(
                {
                    "run_id": rid,
                    "mode": "combined",
                    "policy": "none",
                    "workers": 4,
                    "world_size": 1,
                    "cupti": False,
                    "cuda_api": False,
                    "rank": 0,
                    "step": np.arange(steps),
                    "outlier": False,
                    "compute_inflation_ms": ms,
                    "host_launch_delay_ms": ms,
                    "peer_wait_ms": 0.0,
                    "unattributed_ms": 0.0,
                    "host_source": "compute span",
                    "block": f"b{i}",
                    "twin_status": "ok",
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def test_decomposition_means_carry_a_t_interval_over_blocks() -> None:
    means = dec.decomposition_means(planted_decomposition(100, {"a": 2.0, "b": 4.0, "c": 6.0}))
    row = means[means["view"] == "all steps"].iloc[0]
    half = 2.0 * scipy_t(2) / np.sqrt(3)  # sd of (2, 4, 6) is 2
    assert (row["n_runs"], row["n_blocks"], row["steps"]) == (3, 3, 300)
    assert row["host_launch_delay_ms"] == pytest.approx(4.0)
    assert row["host_launch_delay_ms_ci_low"] == pytest.approx(4.0 - half)
    assert row["compute_inflation_ms_ci_high"] == pytest.approx(4.0 + half)
    # The slowest 5 %: the 100 steps of run c alone, one block, so no interval.
    tail = means[means["view"] == "slowest 5 %"].iloc[0]
    assert (tail["steps"], tail["n_blocks"], tail["note"]) == (100, 1, "")
    assert tail["compute_inflation_ms"] == pytest.approx(6.0)
    assert np.isnan(tail["compute_inflation_ms_ci_low"])


def test_a_tail_of_too_few_steps_is_not_given_a_value() -> None:
    # 10 steps per run: the slowest 5 % are run c's 10 steps, fewer than MIN_TAIL_STEPS.
    means = dec.decomposition_means(planted_decomposition(10, {"a": 2.0, "b": 4.0, "c": 6.0}))
    tail = means[means["view"] == "slowest 5 %"].iloc[0]
    assert tail["steps"] == 10 < dec.MIN_TAIL_STEPS
    assert tail[list(dec.MEAN_COLUMNS)].isna().all()
    assert tail["note"] == f"too few steps (10 < {dec.MIN_TAIL_STEPS})"
    assert means.loc[means["view"] == "all steps", "compute_inflation_ms"].iloc[0] == 4.0


def scipy_t(df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, df))
