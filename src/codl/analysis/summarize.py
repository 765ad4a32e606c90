"""Per-run analysis: trace tables -> per-step metrics, one-row run summary, mechanism attribution.

Pure functions take the trace's DataFrames and return DataFrames; ``summarize_trace`` is the only
one that reads a file. Warm-up steps are dropped everywhere. Every per-step table is keyed by
(rank, step): ranks may run on different nodes, whose CLOCK_MONOTONIC timelines are unrelated, so
nothing here compares timestamps across ranks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa  # type: ignore[import-untyped]

from codl.analysis import chunked
from codl.analysis.columns import (
    API_STEP_COLUMNS,
    APP_ALLREDUCE,
    HELPER_ROLES,
    KEYS,
    LOADER_STAGES,
    LOADING_MODES,
    STEP_PHASES,
    SUMMARY_TABLES,
    warmup_steps,
)
from codl.analysis.compare import twin_ids
from codl.analysis.intervals import interval_union, overlap_ns
from codl.analysis.load import outside_cpu_share
from codl.analysis.runlevel import block_columns
from codl.analysis.steady import flag_outliers, steady
from codl.pinning import parse_cpulist
from codl.trace.schema import LOADER_ITEM_STAGES, Phase, Table
from codl.trace.store import empty_frame, open_trace

SPEC_COLUMNS = {
    "mode": ("mode",),
    "device": ("device",),
    "model": ("workload", "model"),
    "batch_size": ("workload", "batch_size"),
    "image_size": ("workload", "image_size"),
    "precision": ("workload", "precision"),
    "policy": ("pinning", "policy"),
    "launch_cores": ("pinning", "launch_cores"),
    "pinning_cpus": ("pinning", "cpus"),
    "workers": ("loader", "workers"),
    "prefetch_factor": ("loader", "prefetch_factor"),
    "pin_memory": ("loader", "pin_memory"),
    "handoff": ("loader", "handoff"),
    "worker_nice": ("loader", "worker_nice"),
    "nodes": ("layout", "nodes"),
    "ranks_per_node": ("layout", "ranks_per_node"),
    "backend": ("layout", "backend"),
    "comm_pattern": ("layout", "comm_pattern"),
    "tier": ("dataset", "tier"),
    "cupti": ("trace", "cupti"),
    "cuda_api": ("trace", "cuda_api"),
    "sched_events": ("trace", "sched_events"),
    "repeat": ("repeat",),
}
SCHED_COUNTERS = ("run_ns", "wait_ns", "timeslices", "voluntary", "involuntary")


def spec_columns(spec: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col, path in SPEC_COLUMNS.items():
        node: Any = spec
        for p in path:
            node = node.get(p) if isinstance(node, Mapping) else None
        out[col] = node
    # Traces written before the level existed ran without it.
    out["cuda_api"] = bool(out["cuda_api"])
    out["sched_events"] = bool(out["sched_events"])
    # The core budget: 0 (the whole allowed set) for traces written before it existed.
    out["pinning_cpus"] = int(out["pinning_cpus"] or 0)
    if out["mode"] not in LOADING_MODES:
        # A mode without a loader never reads these settings; zeroing them is what lets
        # compare.py match a `compute` run with the `combined` runs of every worker count.
        out["workers"] = 0
        out["prefetch_factor"] = None
        out["pin_memory"] = None
        out["handoff"] = None
        out["worker_nice"] = None
    else:
        # Traces written before the keys ran torch's DataLoader, its workers at the rank's nice.
        out["handoff"] = out["handoff"] or "torch"
        out["worker_nice"] = int(out["worker_nice"] or 0)
    return out


def _ms(ns: pd.Series | npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    return np.asarray(ns, dtype=np.float64) / 1e6


def _empty(columns: Mapping[str, str]) -> pd.DataFrame:
    """A zero-row frame with real dtypes, so that merges on rank/step never meet `object`."""
    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in columns.items()})


def _keys_int64(df: pd.DataFrame) -> pd.DataFrame:
    # Trace columns are i2/i4; per-step tables from different sources must merge on one dtype.
    return df.astype({k: "int64" for k in KEYS if k in df})


def _measured(df: pd.DataFrame, warmup: int) -> pd.DataFrame:
    return df[df["step"] >= warmup]


def _phase_columns() -> dict[str, str]:
    cols: dict[str, str] = {}
    for phase in (*STEP_PHASES, APP_ALLREDUCE):
        cols[f"{phase}_ms"] = "float64"
        cols[f"{phase}_gpu_ms"] = "float64"
    return cols


STEP_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    **_phase_columns(),
    "start_ns": "int64",
    "end_ns": "int64",
    "compute_eff_ms": "float64",
    "allreduce_ms": "float64",
    "allreduce_bytes": "float64",
    "buckets": "int64",
}


def step_metrics(app: pd.DataFrame, comm: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    """One row per (rank, step) after warm-up: wall and GPU ms of every phase, AllReduce ms.

    Phase ``*_gpu_ms`` is NaN where CUDA events did not measure it (``gpu_ns == -1``).
    ``allreduce_ms`` sums the step's buckets (GPU duration when measured, host wall otherwise).
    """
    app = _measured(app, warmup)
    if app.empty:
        return _empty(STEP_COLUMNS)
    phase = app["phase"].astype(str).replace({"allreduce": APP_ALLREDUCE})
    app = app.assign(
        phase=phase,
        wall_ms=_ms(app["end_ns"] - app["start_ns"]),
        gpu_ms=np.where(app["gpu_ns"] >= 0, _ms(app["gpu_ns"]), np.nan),
    )
    keys = [*KEYS, "phase"]
    # min_count=1 keeps "not measured" as NaN instead of summing it to 0.
    wall = app.groupby(keys)["wall_ms"].sum(min_count=1).unstack("phase")
    gpu = app.groupby(keys)["gpu_ms"].sum(min_count=1).unstack("phase")
    out = pd.DataFrame(index=wall.index)
    for name in (*STEP_PHASES, APP_ALLREDUCE):
        out[f"{name}_ms"] = wall.get(name, np.nan)
        out[f"{name}_gpu_ms"] = gpu.get(name, np.nan)
    # A step without its `step` span never finished (the run stopped inside it): drop it, so
    # that start/end stay exact int64 nanoseconds and step_ms is never missing.
    step_span = (
        app[app["phase"] == Phase.STEP.value].drop_duplicates(KEYS, keep="last").set_index(KEYS)
    )
    out = out[out.index.isin(step_span.index)]
    step_span = step_span.reindex(out.index)
    out["start_ns"] = step_span["start_ns"].astype("int64")
    out["end_ns"] = step_span["end_ns"].astype("int64")
    # The compute figure of merit: GPU time from first forward launch to optimizer end when
    # CUDA events exist (it includes the GPU idling on late launches), host wall time otherwise.
    out["compute_eff_ms"] = out["compute_gpu_ms"].fillna(out["compute_ms"])
    comm = _measured(comm, warmup)
    if len(comm):
        dur = np.where(comm["gpu_ns"] >= 0, comm["gpu_ns"], comm["end_ns"] - comm["start_ns"])
        c = (
            comm.assign(ms=_ms(dur), nbytes=comm["bytes"].astype(np.float64))
            .groupby(KEYS)
            .agg(
                allreduce_ms=("ms", "sum"),
                allreduce_bytes=("nbytes", "sum"),
                buckets=("ms", "size"),
            )
        )
        out = out.join(c)
        # A step without a bucket row did no collective; its time stays NaN (not measured).
        out["buckets"] = out["buckets"].fillna(0)
    else:
        out["allreduce_ms"] = np.nan
        out["allreduce_bytes"] = np.nan
        out["buckets"] = 0
    out = out.reset_index()
    out.columns.name = None
    return out.astype({"buckets": "int64"}).pipe(_keys_int64)[list(STEP_COLUMNS)]


def launch_tids(threads: pd.DataFrame) -> dict[int, int]:
    """rank -> TID of its launch (main) thread (the latest row wins if it was captured twice)."""
    t = threads[threads["role"].astype(str) == "launch"]
    return {int(r): int(tid) for r, tid in zip(t["rank"], t["tid"], strict=True)}


SCHED_DELTA_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "pid": "int64",
    "tid": "int64",
    "step": "int64",
    "cpu": "int64",
    **dict.fromkeys(SCHED_COUNTERS, "int64"),
}


def sched_deltas(sched: pd.DataFrame, *, step: int | None = None) -> pd.DataFrame:
    """Per-thread, per-step differences of the cumulative scheduler counters.

    A sample tagged step s is taken right after step s ends, so the difference to the thread's
    previous sample is what happened during step s (plus the few microseconds of sampling). A
    thread's first sample has no predecessor: its counters cover its whole life so far, which
    cannot be placed in a step, so it yields no row. Threads are keyed by (rank, pid, tid)
    because TIDs of different nodes can coincide. ``step``: only that step's rows (those of
    the whole table), without the other steps' counter work.
    """
    if sched.empty:
        return _empty(SCHED_DELTA_COLUMNS)
    # In index arrays and one column at a time: a long run has ~10^6 samples, and each
    # full-length temporary costs 8 bytes a sample (the frame-wide copies once took ~40).
    thread = [sched[k].to_numpy(np.int64) for k in ("rank", "pid", "tid")]
    cur, prev = _predecessors(sched["t_ns"].to_numpy(), thread)
    if step is not None:
        one = sched["step"].to_numpy()[cur] == step
        cur, prev = cur[one], prev[one]
    # A negative difference means the TID was reused by a new thread: not a measurement.
    ok = _counter_delta(sched, "run_ns", cur, prev) >= 0
    ok &= _counter_delta(sched, "wait_ns", cur, prev) >= 0
    if not ok.any():
        return _empty(SCHED_DELTA_COLUMNS)
    cur, prev = cur[ok], prev[ok]
    steps = sched["step"].to_numpy(np.int64)[cur]
    # Two samples tagged with one step (e.g. a final flush) add up to that step; its cpu is
    # the later sample's. Rows are in time order per thread; where a thread's steps are too
    # (always, but for a tag out of time order), the sort by step would change nothing.
    new_thread = _thread_starts(thread, cur)
    if (np.diff(steps) < 0)[~new_thread[1:]].any():
        by = np.lexsort((steps, *(k[cur] for k in thread[::-1])))
        cur, prev, steps = cur[by], prev[by], steps[by]
        del by
        new_thread = _thread_starts(thread, cur)
    change = new_thread
    change[1:] |= steps[1:] != steps[:-1]
    starts = np.flatnonzero(change)
    last = np.append(starts[1:], len(cur)) - 1
    first = cur[starts]
    out: dict[str, npt.NDArray[np.int64]] = {
        "rank": thread[0][first],
        "pid": thread[1][first],
        "tid": thread[2][first],
        "step": steps[starts],
        "cpu": sched["cpu"].to_numpy(np.int64)[cur[last]],
    }
    for col in SCHED_COUNTERS:
        out[col] = np.add.reduceat(_counter_delta(sched, col, cur, prev), starts)
    # The arrays as they are (in SCHED_DELTA_COLUMNS' order and dtypes): no frame-wide copy.
    return pd.DataFrame(out, copy=False)


def _predecessors(
    t_ns: npt.NDArray[Any], thread: list[npt.NDArray[np.int64]]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """(samples with a predecessor of their thread, that predecessor), as positions: threads
    keyed by the arrays ``thread``, samples ordered by thread, then time (stable, as the
    samples of one instant keep their order)."""
    order = np.lexsort((t_ns, *thread[::-1]))
    same = np.ones(max(len(order) - 1, 0), dtype=np.bool_)
    for k in thread:
        sorted_k = k[order]
        same &= sorted_k[1:] == sorted_k[:-1]
        del sorted_k
    return order[1:][same], order[:-1][same]


def step_sample_rows(sched: pd.DataFrame, *, rank: int, step: int) -> npt.NDArray[np.bool_]:
    """The rows of ``sched`` that ``sched_deltas(sched[sched["rank"] == rank], step=step)``
    reads: the rank's samples tagged ``step`` and each one's predecessor of its thread (that
    of the sample before it, by time). Those rows alone give the same deltas."""
    keep = np.zeros(len(sched), dtype=np.bool_)
    mine = np.flatnonzero(sched["rank"].to_numpy() == rank)
    if not len(mine):
        return keep
    thread = [sched[k].to_numpy(np.int64)[mine] for k in ("pid", "tid")]
    cur, prev = _predecessors(sched["t_ns"].to_numpy()[mine], thread)
    at_step = sched["step"].to_numpy()[mine] == step
    keep[mine[at_step]] = True
    keep[mine[prev[at_step[cur]]]] = True
    return keep


def _thread_starts(
    thread: list[npt.NDArray[np.int64]], rows: npt.NDArray[np.intp]
) -> npt.NDArray[np.bool_]:
    """For ``rows`` in thread order, whether each starts a thread (its key columns ``thread``
    differ from the row before's); the first row does."""
    starts = np.zeros(len(rows), dtype=np.bool_)
    starts[0] = True
    for k in thread:
        at = k[rows]
        starts[1:] |= at[1:] != at[:-1]
    return starts


def _counter_delta(
    sched: pd.DataFrame, col: str, cur: npt.NDArray[np.intp], prev: npt.NDArray[np.intp]
) -> npt.NDArray[np.int64]:
    """Counter ``col`` of samples ``cur`` less that of their predecessors ``prev``."""
    values: npt.NDArray[np.int64] = sched[col].to_numpy(np.int64)
    diff: npt.NDArray[np.int64] = values[cur] - values[prev]
    return diff


LAUNCH_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "launch_wait_ms": "float64",
    "launch_run_ms": "float64",
    "launch_involuntary": "int64",
    "launch_timeslices": "int64",
}


def launch_metrics(
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    *,
    warmup: int,
    deltas: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per (rank, step): the launch thread's run-queue wait, on-CPU time, involuntary switches.
    ``deltas``: ``sched_deltas(sched)`` when the caller has it already."""
    d = sched_deltas(sched) if deltas is None else deltas
    # Each launch thread's rows picked by index: the measured deltas copied whole cost ~80
    # bytes a row (~0.3 GiB per 10^9 events) for the one thread in ~12 used here.
    rank_of, tid_of = d["rank"].to_numpy(), d["tid"].to_numpy()
    measured = d["step"].to_numpy() >= warmup
    rows = []
    for rank, tid in launch_tids(threads).items():
        at = np.flatnonzero(measured & (rank_of == rank) & (tid_of == tid))
        rows.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "step": d["step"].to_numpy()[at],
                    "launch_wait_ms": _ms(d["wait_ns"].to_numpy()[at]),
                    "launch_run_ms": _ms(d["run_ns"].to_numpy()[at]),
                    "launch_involuntary": d["involuntary"].to_numpy()[at],
                    "launch_timeslices": d["timeslices"].to_numpy()[at],
                }
            )
        )
    rows = [r for r in rows if len(r)]
    if not rows:
        return _empty(LAUNCH_COLUMNS)
    return pd.concat(rows, ignore_index=True).astype(LAUNCH_COLUMNS)


HELPER_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    **{f"{role}_run_ms": "float64" for role in HELPER_ROLES},
}


def thread_roles(threads: pd.DataFrame) -> pd.DataFrame:
    """(rank, tid, role) of every thread, the latest row per thread."""
    return threads.drop_duplicates(["rank", "tid"], keep="last").assign(
        rank=lambda t: t["rank"].astype("int64"),
        tid=lambda t: t["tid"].astype("int64"),
        role=lambda t: t["role"].astype(str),
    )[["rank", "tid", "role"]]


def role_times(
    d: pd.DataFrame, roles: Sequence[str], kinds: Sequence[str] = ("run",)
) -> pd.DataFrame:
    """Per (rank, step) of per-thread scheduler deltas ``d`` with a ``role``: each role's
    summed ``<kind>_ns`` as ``<role>_<kind>_ms``, over the (rank, step)s where one of ``roles``
    has a row; a role without a thread there did no work: 0, not NaN."""
    d = d[d["role"].isin(roles)]
    cols = [f"{role}_{kind}_ms" for role in roles for kind in kinds]
    if d.empty:
        index = pd.MultiIndex.from_arrays([[], []], names=KEYS)
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols}, index=index)
    per = d.groupby([*KEYS, "role"])[[f"{k}_ns" for k in kinds]].sum().unstack("role", fill_value=0)
    out = pd.DataFrame(index=per.index)
    for role in roles:
        for kind in kinds:
            col = (f"{kind}_ns", role)
            out[f"{role}_{kind}_ms"] = _ms(per[col]) if col in per else 0.0
    return out


def role_rows(
    d: pd.DataFrame,
    threads: pd.DataFrame,
    roles: Sequence[str],
    columns: Sequence[str],
    warmup: int,
) -> pd.DataFrame:
    """The rows of per-thread rows ``d`` (``rank``, ``tid``, ``step``, ...) of measured steps
    whose thread (``thread_roles``) has one of ``roles``: ``rank``, ``step``, ``role`` (str)
    and ``columns``, in ``d``'s order (what ``role_times`` takes). Picked by index, each
    row's role looked up by its thread's code: a merge would copy every row and column of a
    long run's deltas (~80 bytes a row) to keep the few of these roles."""
    rank = d["rank"].to_numpy(np.int64)
    tid = d["tid"].to_numpy(np.int64)
    t_rank, t_tid, thread = _thread_codes(rank, tid)
    named = thread_roles(threads).set_index(["rank", "tid"])["role"]
    # Each distinct thread's role ("" where it has none), then each row's.
    role = named.reindex(pd.MultiIndex.from_arrays([t_rank, t_tid])).fillna("").to_numpy(str)
    keep = np.isin(role, list(roles))[thread] & (d["step"].to_numpy() >= warmup)
    at = np.flatnonzero(keep)
    out = {"rank": rank[at], "step": d["step"].to_numpy()[at], "role": role[thread[at]]}
    return pd.DataFrame(out | {c: d[c].to_numpy()[at] for c in columns})


def helper_metrics(
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    *,
    warmup: int,
    deltas: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per (rank, step): the on-CPU time of each launch helper role, summed over its threads
    (a rank's NCCL/gloo threads are several). A role without threads in a rank that has
    scheduler samples did no work there: 0, not NaN (no pin-memory thread: 0 copies).
    ``deltas``: ``sched_deltas(sched)`` when the caller has it already."""
    d = sched_deltas(sched) if deltas is None else deltas
    measured = d["step"].to_numpy() >= warmup
    if not measured.any() or threads.empty:
        return _empty(HELPER_COLUMNS)
    keys = pd.DataFrame({k: d[k].to_numpy()[measured] for k in KEYS})
    every = pd.MultiIndex.from_frame(keys.drop_duplicates().sort_values(KEYS))
    helpers = role_rows(d, threads, HELPER_ROLES, ["run_ns"], warmup)
    out = role_times(helpers, HELPER_ROLES).reindex(every, fill_value=0.0)
    return out.reset_index().astype(HELPER_COLUMNS)[list(HELPER_COLUMNS)]


def _runtime_calls(cuda: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """Measured CUDA runtime API calls with their name as str and duration in microseconds."""
    rt = _measured(cuda[cuda["kind"].astype(str) == "runtime"], warmup)
    return rt.assign(
        name=rt["name"].astype(str),
        us=np.asarray(rt["end_ns"] - rt["start_ns"], dtype=np.float64) / 1e3,
    )


def _is_launch_kernel(names: pd.Series) -> pd.Series:
    # cudaLaunchKernel and its variants (cudaLaunchKernelExC, cuLaunchKernel).
    return names.str.contains("LaunchKernel", regex=False)


def api_metrics(cuda: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    """Per-step CUDA runtime API latency (all runtime calls, and cudaLaunchKernel alone)."""
    rt = _runtime_calls(cuda, warmup)
    if rt.empty:
        return _empty(API_STEP_COLUMNS)
    allc = rt.groupby(KEYS)["us"].agg(api_us_mean="mean", api_calls="size")
    lk = rt[_is_launch_kernel(rt["name"])]
    launch = lk.groupby(KEYS)["us"].agg(launch_kernel_us_mean="mean", launch_kernel_calls="size")
    out = allc.join(launch).reset_index()
    out["launch_kernel_calls"] = out["launch_kernel_calls"].fillna(0)
    return _keys_int64(out).astype(API_STEP_COLUMNS)[list(API_STEP_COLUMNS)]


API_TABLE_COLUMNS: dict[str, str] = {
    "name": "str",
    "calls": "int64",
    "mean_us": "float64",
    "p50_us": "float64",
    "p99_us": "float64",
}


def api_latency_table(cuda: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """Long form: one row per runtime API name over all measured calls of all ranks, sorted by
    total time spent in the API (the APIs that cost the launch thread most come first)."""
    rt = _runtime_calls(cuda, warmup)
    if rt.empty:
        return _empty(API_TABLE_COLUMNS)
    g = rt.groupby("name")["us"]
    out = pd.DataFrame(
        {
            "calls": g.size(),
            "mean_us": g.mean(),
            "p50_us": g.median(),
            "p99_us": g.quantile(0.99),
            "total": g.sum(),
        }
    )
    out = out.sort_values(["total", "calls"], ascending=False).drop(columns="total")
    return out.reset_index().astype(API_TABLE_COLUMNS)[list(API_TABLE_COLUMNS)]


LATENCY_COLUMNS = tuple(
    f"{p}_{s}" for p in ("api", "launch_kernel") for s in ("calls", "us_mean", "us_p50", "us_p99")
)


def _latency_stats(us: pd.Series, prefix: str) -> dict[str, float | int]:
    return {
        f"{prefix}_calls": len(us),
        f"{prefix}_us_mean": float(us.mean()) if len(us) else np.nan,
        f"{prefix}_us_p50": float(us.median()) if len(us) else np.nan,
        f"{prefix}_us_p99": float(us.quantile(0.99)) if len(us) else np.nan,
    }


LOADER_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    **{f"loader_{s}_ms": "float64" for s in LOADER_STAGES},
    "loader_items": "int64",
    "loader_item_ms": "float64",
}


def loader_metrics(loader: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    """Per (rank, step) of the consuming step: summed worker time per stage, items loaded, and
    ``loader_item_ms``, the mean per-item service time (fetch + decode + transform).

    The per-item service time is the data component's speed: it does not depend on how long
    the step's compute took (unlike items per step time), so isolation `data` runs and
    combined runs compare on it directly; it grows when workers are starved of CPU.
    """
    x = _measured(loader, warmup)
    if x.empty:
        return _empty(LOADER_COLUMNS)
    x = x.assign(stage=x["stage"].astype(str), ms=_ms(x["end_ns"] - x["start_ns"]))
    per = x.pivot_table(index=KEYS, columns="stage", values="ms", aggfunc="sum", observed=True)
    per.columns = [f"loader_{c}_ms" for c in per.columns]
    # An item is identified by its worker process and data-set index: two epochs can load the
    # same index, but only in different steps.
    items = x[(x["item"] >= 0) & x["stage"].isin(LOADER_ITEM_STAGES)]
    per_item = items.groupby([*KEYS, "pid", "item"])["ms"].sum()
    by_step = per_item.groupby(level=KEYS).agg(loader_items="size", loader_item_ms="mean")
    out = per.join(by_step, how="outer").reset_index()
    for col, dtype in LOADER_COLUMNS.items():
        if col not in out:
            out[col] = 0 if dtype == "int64" else np.nan
    out["loader_items"] = out["loader_items"].fillna(0)
    return _keys_int64(out).astype(LOADER_COLUMNS)[list(LOADER_COLUMNS)]


def _overlap_fraction(target: pd.DataFrame, busy: pd.DataFrame, ranks: npt.NDArray[Any]) -> float:
    """Fraction of `target`'s time (union over intervals) covered by `busy`, summed over ranks.

    Per rank, because the timestamps of ranks on different nodes are on different clocks.
    """
    covered = total = 0
    for rank in ranks:
        t = target[target["rank"] == rank]
        if t.empty:
            continue
        b = busy[busy["rank"] == rank]
        tu = interval_union(t["start_ns"].to_numpy(), t["end_ns"].to_numpy())
        bu = interval_union(b["start_ns"].to_numpy(), b["end_ns"].to_numpy())
        total += int((tu[:, 1] - tu[:, 0]).sum())
        covered += overlap_ns(tu, bu)
    return covered / total if total else np.nan


def overlaps(
    app: pd.DataFrame, loader: pd.DataFrame, cuda: pd.DataFrame, *, warmup: int
) -> dict[str, float]:
    """Fractions of compute (host spans) and of GPU kernel time during which a worker was busy.

    NaN when there is nothing to measure (no loader, no compute spans, no CUPTI kernels).
    """
    out = {"loader_compute_overlap": np.nan, "kernel_loader_overlap": np.nan}
    if loader.empty:
        return out
    busy = _measured(loader[loader["item"] >= 0], warmup)
    ranks = np.unique(np.asarray(busy["rank"]))
    comp = _measured(app[app["phase"] == Phase.COMPUTE.value], warmup)
    out["loader_compute_overlap"] = _overlap_fraction(comp, busy, ranks)
    if not cuda.empty:
        k = _measured(cuda[cuda["kind"] == "kernel"], warmup)
        out["kernel_loader_overlap"] = _overlap_fraction(k, busy, ranks)
    return out


ATTRIBUTION_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "thread_rank": "int64",
    "tid": "int64",
    "pid": "int64",
    "role": "str",
    "name": "str",
    "share_ns": "float64",
    "launch_wait_ns": "int64",
    "attributed_wait_ns": "float64",
}


def _thread_info(
    threads: pd.DataFrame,
) -> tuple[pd.DataFrame, dict[tuple[int, int], frozenset[int]]]:
    """Latest row per (rank, tid): role and name, and its CPU mask (actual, else planned)."""
    info = threads.drop_duplicates(["rank", "tid"], keep="last")
    actual = info["cpus_actual"].astype(str)
    planned = info["cpus_planned"].astype(str)
    masks = {
        (int(r), int(t)): parse_cpulist(a if a.strip() else p)
        for r, t, a, p in zip(info["rank"], info["tid"], actual, planned, strict=True)
    }
    idx = pd.MultiIndex.from_arrays(
        [info["rank"].astype("int64"), info["tid"].astype("int64")], names=["rank", "tid"]
    )
    named = pd.DataFrame(
        {"role": info["role"].astype(str).to_numpy(), "name": info["name"].astype(str).to_numpy()},
        index=idx,
    )
    return named, masks


def _thread_codes(
    rank: npt.NDArray[np.int64], tid: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """The distinct (rank, tid) threads (their ranks, their tids) and each row's thread code:
    one int64 key per row where ranks and TIDs fit (a TID is below 2^22 on Linux), else rows
    compared as pairs."""
    fits = len(rank) and rank.min() >= 0 and rank.max() < 1 << 22
    if fits and tid.min() >= 0 and tid.max() < 1 << 40:
        keys, code = np.unique((rank << 40) | tid, return_inverse=True)
        return keys >> 40, keys & ((1 << 40) - 1), code.ravel()
    pairs, code = np.unique(np.stack([rank, tid]), axis=1, return_inverse=True)
    return pairs[0], pairs[1], code.ravel()


def attribute_launch_wait(
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    *,
    warmup: int,
    ranks_per_node: int | None = None,
    deltas: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Which threads ran on the launch thread's CPUs while it waited, per (rank, step).

    For step s, every other thread's on-CPU time during s is weighted by the fraction of its CPU
    mask that lies inside the launch thread's mask (a thread confined to the launch cores counts
    fully; one spread over 16 cores including 1 launch core counts 1/16), and the launch
    thread's run-queue wait is split in proportion. Threads whose mask misses the launch cores
    get nothing: under `isolated` the loader workers can never be blamed.

    Candidates are the threads of the launch thread's own rank and, given ``ranks_per_node``,
    of the other ranks on its node (their workers share the node's cores; threads of other
    nodes cannot preempt it). Other ranks' steps are matched by index, which DDP keeps in step.
    ``launch_wait_ns`` repeats the launch thread's total wait of the step on each row.
    ``deltas``: ``sched_deltas(sched)`` when the caller has it already. Rows are sorted by
    rank, step, then the largest attributed wait first (ties in the deltas' order).
    """
    pieces = list(
        launch_wait_pieces(
            sched, threads, warmup=warmup, ranks_per_node=ranks_per_node, deltas=deltas
        )
    )
    return pd.concat(pieces, ignore_index=True) if pieces else _empty(ATTRIBUTION_COLUMNS)


# Rows per piece of the attribution (whole steps: one step's rows may make a piece larger).
# A long run's attribution has ~10^7 rows per 10^9 events; in pieces, its sort and string
# columns cost memory per piece, and a writer (``summarize_stream``) never holds the whole.
# At 10^8 events (1.07 M rows) pieces of 2^16 rows peak at 35 MiB beside the deltas' 32, 2^18
# at 76; each piece costs ~3 ms of pandas calls (0.17 s more than 2^18 there).
ATTRIBUTION_PIECE_ROWS = 1 << 16


def launch_wait_pieces(
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    *,
    warmup: int,
    ranks_per_node: int | None = None,
    deltas: pd.DataFrame | None = None,
    rows_per_piece: int | None = None,
) -> Iterator[pd.DataFrame]:
    """``attribute_launch_wait``'s table in consecutive pieces of whole steps of one rank (about
    ``rows_per_piece`` rows each, default ``ATTRIBUTION_PIECE_ROWS``), in its order: joined,
    they are that table."""
    if rows_per_piece is None:
        rows_per_piece = ATTRIBUTION_PIECE_ROWS
    if rows_per_piece <= 0:
        raise ValueError(f"rows_per_piece must be positive, got {rows_per_piece}")
    d = sched_deltas(sched) if deltas is None else deltas
    # The warm-up's rows masked, not dropped: a copy of the deltas is ~80 bytes a row.
    measured = d["step"].to_numpy() >= warmup
    if not measured.any() or threads.empty:
        return
    info, masks = _thread_info(threads)
    # Columns as numpy arrays and each row's thread as a code (~10^6 rows in a long run: the
    # per-rank work below is gathers by code, not MultiIndex lookups per row).
    col = {c: d[c].to_numpy(dtype=np.int64) for c in ("rank", "tid", "pid", "step", "run_ns")}
    wait_ns = d["wait_ns"].to_numpy(dtype=np.int64)
    t_rank, t_tid, thread = _thread_codes(col["rank"], col["tid"])
    # Each thread's row in ``info`` (-1: none, which picks the missing value below).
    t_info = info.index.get_indexer(pd.MultiIndex.from_arrays([t_rank, t_tid]))
    node = col["rank"] // ranks_per_node if ranks_per_node else col["rank"]
    categorical = _category_codes(info, t_info)
    for rank, ltid in sorted(launch_tids(threads).items()):
        lmask = masks.get((rank, ltid), frozenset())
        if not lmask:
            continue
        launch = (col["rank"] == rank) & (col["tid"] == ltid)
        lw_rows = launch & measured
        lw = pd.Series(wait_ns[lw_rows], index=col["step"][lw_rows])
        # The launch thread's wait of each step, and last 0 for steps it has no sample of.
        waits = np.append(lw.to_numpy(dtype=np.int64), 0)
        my_node = rank // ranks_per_node if ranks_per_node else rank
        rows = np.flatnonzero((node == my_node) & ~launch & measured)
        if not len(rows):
            continue
        # Each thread's fraction of its mask inside the launch mask, once per thread.
        frac = np.array(
            [
                len(m & lmask) / len(m) if (m := masks.get((int(r), int(t)), frozenset())) else 0.0
                for r, t in zip(t_rank, t_tid, strict=True)
            ],
            dtype=np.float64,
        )
        share = col["run_ns"][rows].astype(np.float64) * frac[thread[rows]]
        rows, share = rows[share > 0], share[share > 0]
        # By step, each step's rows in the deltas' order (stable): pieces of whole steps.
        by_step = np.argsort(col["step"][rows], kind="stable")
        rows, share = rows[by_step], share[by_step]
        step = col["step"][rows]
        for lo, hi in _step_windows(step, rows_per_piece):
            yield _attribution_piece(
                rank,
                col,
                rows[lo:hi],
                share[lo:hi],
                lw.index.get_indexer(pd.Index(step[lo:hi])),
                waits,
                {
                    name: (codes[thread[rows[lo:hi]]], values)
                    for name, (codes, values) in categorical.items()
                },
            )


def _step_windows(step: npt.NDArray[np.int64], size: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of sorted ``step`` that cut it only between steps, each starting at the
    last step start at or before a multiple of ``size``."""
    if not len(step):
        return []
    starts = np.flatnonzero(np.diff(step, prepend=step[0] - 1))
    at = np.searchsorted(starts, np.arange(0, len(step), size), side="right") - 1
    cuts = np.unique(starts[at]).tolist()
    return list(zip(cuts, [*cuts[1:], len(step)], strict=True))


def _attribution_piece(
    rank: int,
    col: Mapping[str, npt.NDArray[np.int64]],
    rows: npt.NDArray[np.intp],
    share: npt.NDArray[np.float64],
    at: npt.NDArray[np.intp],
    waits: npt.NDArray[np.int64],
    categorical: Mapping[str, tuple[npt.NDArray[np.int64], pd.Index]],
) -> pd.DataFrame:
    """One launch rank's attribution rows of whole steps, sorted as the table is: by step,
    then the largest attributed wait first (ties in their order: stable), role and name as
    strings."""
    step = col["step"][rows]
    tot = pd.Series(share).groupby(step).transform("sum").to_numpy(dtype=np.float64)
    wait = waits[np.where(at >= 0, at, len(waits) - 1)]
    piece: dict[str, Any] = {
        "rank": np.full(len(rows), rank, dtype=np.int64),
        "step": step,
        "thread_rank": col["rank"][rows],
        "tid": col["tid"][rows],
        "pid": col["pid"][rows],
    }
    for name, (codes, values) in categorical.items():
        piece[name] = pd.Categorical.from_codes(codes, categories=values)
    piece["share_ns"] = share
    piece["launch_wait_ns"] = wait
    piece["attributed_wait_ns"] = wait * share / tot
    out = pd.DataFrame(piece)[list(ATTRIBUTION_COLUMNS)]
    order = np.lexsort((-out["attributed_wait_ns"].to_numpy(dtype=np.float64), step))
    out = out.take(order).reset_index(drop=True)
    for name in ("role", "name"):
        out[name] = _str_column(out[name])
    return out.astype(ATTRIBUTION_COLUMNS)


def _category_codes(
    info: pd.DataFrame, t_info: npt.NDArray[np.intp]
) -> dict[str, tuple[npt.NDArray[np.int64], pd.Index]]:
    """Per text column of ``info`` (role, name): each thread code's category code, and the
    categories; a thread ``info`` lacks (``t_info`` -1) gets the missing value's."""
    categorical: dict[str, tuple[npt.NDArray[np.int64], pd.Index]] = {}
    for name, missing in (("role", "other"), ("name", "")):
        values = pd.Index([*info[name], missing]).unique()
        # Each thread's code, and last the missing value's (get_indexer's -1 picks it).
        codes = values.get_indexer(pd.Index([*info[name], missing])).astype(np.int64)
        categorical[name] = (codes[t_info], values)
    return categorical


def _str_column(values: pd.Series) -> pd.Series:
    """A categorical column as pandas' ``str`` dtype, its categories taken by code in Arrow
    (``astype(str)`` makes a Python string per row first: 0.37 s against 0.015 s for 1.6 M
    rows, the attribution table of a 10^8-event trace); other columns, and categoricals with
    missing values, through ``astype``."""
    if not isinstance(values.dtype, pd.CategoricalDtype):
        return values.astype("str")
    codes = values.cat.codes.to_numpy()
    if len(codes) and codes.min() < 0:
        return values.astype("str")
    # The Arrow type pandas' str dtype stores (large_string in pandas 3).
    kind = pa.array(pd.array(["x"], dtype="str")).type
    categories = pa.array([str(c) for c in values.cat.categories], type=kind)
    return pd.Series(
        pd.array(categories.take(pa.array(codes)), dtype="str"),
        index=values.index,
        name=values.name,
    )


# Per-step columns whose median and mean over measured steps go into the summary.
SUMMARY_STEP_COLUMNS = (
    "compute_eff_ms",
    "compute_ms",
    "compute_gpu_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "data_wait_ms",
    "h2d_ms",
    "sleep_ms",
    "allreduce_ms",
    "launch_wait_ms",
    "launch_involuntary",
    "loader_item_ms",
    "loader_items",
)


def _spec(attrs: Mapping[str, Any]) -> dict[str, Any]:
    spec = attrs.get("spec", {})
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            spec = {}
    return dict(spec) if isinstance(spec, Mapping) else {}


def _per_rank_rate(steps: pd.DataFrame, col: str) -> float:
    """Sum over ranks of (col summed over steps) / (that rank's measured wall span).

    Spans are taken per rank because ranks on different nodes have unrelated clocks.
    """
    if col not in steps or steps.empty:
        return np.nan
    rate = 0.0
    for _, g in steps.groupby("rank"):
        span = g["end_ns"].max() - g["start_ns"].min()
        if pd.isna(span) or span <= 0:
            continue
        rate += float(g[col].sum()) / (float(span) / 1e9)
    return rate if rate > 0 else np.nan


def ranks_per_node(attrs: Mapping[str, Any]) -> int:
    """Ranks sharing one node (one CLOCK_MONOTONIC); 1 when the spec does not say."""
    rpn = spec_columns(_spec(attrs))["ranks_per_node"]
    return int(rpn) if isinstance(rpn, int | np.integer) and rpn > 0 else 1


def cpus_per_rank(attrs: Mapping[str, Any]) -> float:
    """CPUs per rank the run had: the size of ``allowed_cpus`` (rank 0's: a merged trace's root
    attributes are rank 0's) over ``cpus_split``, the ranks that shared it (1 for a Slurm task
    bound to its own CPUs), or ``ranks_per_node`` for traces written before that attribute
    (which always split by it); at least 1; NaN when the trace does not say. ``allowed_cpus``
    is the set after the ``pinning.cpus`` cut, and traces written before the budget existed
    have it too."""
    text = attrs.get("allowed_cpus")
    try:
        cpus = parse_cpulist(text) if isinstance(text, str) else frozenset()
    except ValueError:
        cpus = frozenset()
    split = attrs.get("cpus_split")
    sharing = (
        int(split)
        if isinstance(split, int | np.integer) and not isinstance(split, bool) and split > 0
        else ranks_per_node(attrs)
    )
    return max(1, len(cpus) // sharing) if cpus else np.nan


def summarize_tables(
    tables: Mapping[str, pd.DataFrame],
    attrs: Mapping[str, Any],
    *,
    parts: pd.DataFrame | None = None,
    api: chunked.ApiReduction | None = None,
    loader: chunked.LoaderReduction | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(steps, summary, attribution) from a trace's tables and root attributes: those of
    ``summarize_stream``, the attribution's pieces joined."""
    pieces: list[pd.DataFrame] = []
    steps, summary = summarize_stream(
        tables, attrs, attribution=pieces.append, parts=parts, api=api, loader=loader
    )
    if pieces:
        return steps, summary, pd.concat(pieces, ignore_index=True)
    return steps, summary, empty_attribution(str(attrs.get("run_id", "")))


def empty_attribution(run_id: str) -> pd.DataFrame:
    """The attribution table of a run that has none (``summarize_stream`` gave no piece)."""
    attribution = _empty(ATTRIBUTION_COLUMNS)
    attribution.insert(0, "run_id", run_id)
    return attribution


def summarize_stream(
    tables: Mapping[str, pd.DataFrame],
    attrs: Mapping[str, Any],
    *,
    attribution: Callable[[pd.DataFrame], None],
    parts: pd.DataFrame | None = None,
    api: chunked.ApiReduction | None = None,
    loader: chunked.LoaderReduction | None = None,
    deltas: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps, summary) from a trace's tables and root attributes; the launch-wait attribution
    (``launch_wait_pieces``, with ``run_id``) is handed to ``attribution`` piece by piece, in
    its order, and never held whole (a long run's has ~10^7 rows per 10^9 events).

    ``api``: the runtime calls already reduced (``chunked.read_summary``), in place of those
    of ``tables["events/cuda"]``, which then need hold only the GPU activity rows; ``loader``:
    the loader's rows reduced, in place of ``tables["events/loader"]``; ``deltas``:
    ``sched_deltas(tables["samples/sched"])`` when the caller has them already.

    A table missing from ``tables`` counts as empty (a level that was not traced). Steps get
    the steady-state flags of ``steady.flag_outliers``; ``parts`` (``decompose.step_parts``),
    when given, lets a flagged step name the rank it waited for. The summary's statistics are
    over the steady-state steps; ``outlier_steps`` and ``tail_steps`` count the others.
    """
    t = {n: tables[n] if n in tables else empty_frame(n) for n in SUMMARY_TABLES}
    warm = warmup_steps(attrs)
    run_id = str(attrs.get("run_id", ""))
    ident = {"run_id": run_id, **spec_columns(_spec(attrs))}
    # The scheduler samples' per-step differences, which three of the metrics use: made once.
    deltas = sched_deltas(t[Table.SCHED]) if deltas is None else deltas
    steps = _flagged_steps(t, ident, warm, parts, api, loader, deltas)
    # The step metrics' freed temporaries handed back before the attribution's are made.
    chunked.release_free_heap()
    rpn = ident["ranks_per_node"]
    total_wait, loader_wait = _stream_attribution(
        t,
        attribution,
        run_id=run_id,
        warmup=warm,
        ranks_per_node=ranks_per_node(attrs) if isinstance(rpn, int | np.integer) else None,
        deltas=deltas,
    )
    row = _summary_row(t, attrs, ident, steps, total_wait, loader_wait, warm)
    if loader is None:
        row.update(overlaps(t[Table.APP], t[Table.LOADER], t[Table.CUDA], warmup=warm))
    else:
        row.update(loader.overlaps)
    row.update(
        outside_cpu_share(
            t[Table.CPU],
            t[Table.SCHED],
            t[Table.THREADS],
            attrs,
            warmup=warm,
            ranks_per_node=ranks_per_node(attrs),
        )
    )
    # Call-level latency (not a mean of per-step means): what the API CDF figure shows.
    if api is None:
        rt = _runtime_calls(t[Table.CUDA], warm)
        row.update(_latency_stats(rt["us"], "api"))
        row.update(_latency_stats(rt.loc[_is_launch_kernel(rt["name"]), "us"], "launch_kernel"))
    else:
        row.update(api.latency.stats("api"))
        row.update(api.latency.stats("launch_kernel", flagged=True))
    columns = list(row)
    # The latency columns sit where they always were: after launch_wait_ms_p99.
    at = columns.index("launch_wait_ms_p99") + 1
    order = [
        *columns[:at],
        *LATENCY_COLUMNS,
        *(c for c in columns[at:] if c not in LATENCY_COLUMNS),
    ]
    summary = pd.DataFrame([{c: row[c] for c in order}])
    # The ids compare and decompose pair runs by, derived once here from the spec (in the runs
    # table only: the per-step tables join it on run_id).
    at = list(summary.columns).index("repeat") + 1
    for i, (col, value) in enumerate(twin_ids(_spec(attrs)).items()):
        summary.insert(at + i, col, value)
    return steps, summary


def _stream_attribution(
    t: Mapping[str, pd.DataFrame],
    sink: Callable[[pd.DataFrame], None],
    *,
    run_id: str,
    warmup: int,
    ranks_per_node: int | None,
    deltas: pd.DataFrame,
) -> tuple[float, float]:
    """Hand the attribution's pieces (``launch_wait_pieces``, with ``run_id``) to ``sink``;
    returns the summary's two sums over it, taken piece by piece: the launch waits of its
    (rank, step)s (each in one piece) and the loader's attributed waits, summed at the end in
    the table's order (the sum the whole column would give, to the last bit)."""
    total_wait = 0
    loader_waits: list[npt.NDArray[np.float64]] = []
    for piece in launch_wait_pieces(
        t[Table.SCHED],
        t[Table.THREADS],
        warmup=warmup,
        ranks_per_node=ranks_per_node,
        deltas=deltas,
    ):
        total_wait += int(piece.drop_duplicates(["rank", "step"])["launch_wait_ns"].sum())
        is_loader = piece["role"] == "loader"
        loader_waits.append(piece.loc[is_loader, "attributed_wait_ns"].to_numpy(np.float64))
        piece.insert(0, "run_id", run_id)
        sink(piece)
        chunked.release_free_heap()
    loader_wait = float(
        pd.Series(np.concatenate(loader_waits) if loader_waits else np.empty(0)).sum()
    )
    return float(total_wait), loader_wait


def _flagged_steps(
    t: Mapping[str, pd.DataFrame],
    ident: dict[str, Any],
    warm: int,
    parts: pd.DataFrame | None,
    api: chunked.ApiReduction | None = None,
    loader: chunked.LoaderReduction | None = None,
    deltas: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (rank, step): the run's identity, every per-step metric, the outlier flags."""
    steps = step_metrics(t[Table.APP], t[Table.COMM], warmup=warm)
    for extra in (
        launch_metrics(t[Table.SCHED], t[Table.THREADS], warmup=warm, deltas=deltas),
        helper_metrics(t[Table.SCHED], t[Table.THREADS], warmup=warm, deltas=deltas),
        api_metrics(t[Table.CUDA], warmup=warm) if api is None else api.steps,
        loader_metrics(t[Table.LOADER], warmup=warm) if loader is None else loader.steps,
    ):
        steps = steps.merge(extra, on=KEYS, how="left")
    for k, v in reversed(ident.items()):
        steps.insert(0, k, v)
    waits = ["peer_wait_ms", "straggler_rank"]
    if parts is not None and len(parts) and set(waits) <= set(parts):
        with_waits = steps.merge(parts[[*KEYS, *waits]], on=KEYS, how="left")
        return flag_outliers(with_waits).drop(columns=waits)
    return flag_outliers(steps)


def _summary_row(
    t: Mapping[str, pd.DataFrame],
    attrs: Mapping[str, Any],
    ident: Mapping[str, Any],
    steps_all: pd.DataFrame,
    total_wait: float,
    loader_wait: float,
    warm: int,
) -> dict[str, Any]:
    """The run's one summary row: identity, step-time statistics over the steady-state steps,
    call latencies, loader rate, launch-wait attribution and overlaps."""
    steps = steady(steps_all)
    st = steps["step_ms"].dropna()
    wall = steps_all["step_ms"].dropna()
    world = int(attrs.get("world_size", 1))
    batch = int(ident["batch_size"] or 0)
    row: dict[str, Any] = dict(ident)
    row.update(
        {
            "world_size": world,
            "cpus": cpus_per_rank(attrs),
            "host": attrs.get("host", ""),
            **block_columns(attrs),
            "steps": int(steps_all["step"].nunique()),
            "outlier_steps": int(steps_all["outlier"].sum()),
            "tail_steps": int(steps_all["tail_step"].sum()),
            "step_ms_p50": st.median() if len(st) else np.nan,
            "step_ms_p95": st.quantile(0.95) if len(st) else np.nan,
            "step_ms_p99": st.quantile(0.99) if len(st) else np.nan,
            "step_ms_mean": st.mean() if len(st) else np.nan,
            "step_ms_cv": st.std(ddof=1) / st.mean() if len(st) > 1 and st.mean() else np.nan,
            # Samples over the measured wall time (mean step), not over the median step: a loader
            # delivers bursts from its prefetch buffer, so most steps are short and a few long,
            # and 1/median would overstate a data-bound pipeline's throughput many times over.
            # Over every measured step, flagged ones too: a GC pause costs the job wall time.
            "throughput_samples_s": (
                batch * world * 1000.0 / wall.mean() if len(wall) and batch else np.nan
            ),
            "sleep_ns": attrs.get("sleep_ns", np.nan),
        }
    )
    for col in SUMMARY_STEP_COLUMNS:
        vals = steps[col].dropna() if col in steps else pd.Series(dtype=float)
        row[f"{col}_p50"] = float(vals.median()) if len(vals) else np.nan
        row[f"{col}_mean"] = float(vals.mean()) if len(vals) else np.nan
        row[f"{col}_p95"] = float(vals.quantile(0.95)) if len(vals) else np.nan
    lw = steps["launch_wait_ms"].dropna()
    row["launch_wait_ms_p99"] = float(lw.quantile(0.99)) if len(lw) else np.nan
    row["loader_items_per_s"] = _per_rank_rate(steps_all, "loader_items")
    # Share of the launch thread's run-queue wait that the mechanism blames on loader workers.
    row["launch_wait_loader_share"] = loader_wait / total_wait if total_wait > 0 else np.nan
    return row


def read_tables(path: Path) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The tables ``summarize_tables`` reads, and the root attributes, of a verified trace."""
    with open_trace(path) as t:
        t.verify()
        tables = {n: t.table(n) for n in SUMMARY_TABLES}
        attrs = dict(t.attrs)
    return tables, attrs


def summarize_trace(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``summarize_tables`` of a trace, verified and reduced in one pass as ``codl summarize``
    reads it (``chunked.read_summary``): the big event tables block by block, never whole."""
    tables, attrs, api, loader = chunked.read_summary(path)
    return summarize_tables(tables, attrs, api=api, loader=loader)
