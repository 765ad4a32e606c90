"""Per-run analysis: trace tables -> per-step metrics, one-row run summary, mechanism attribution.

Pure functions take the trace's DataFrames and return DataFrames; ``summarize_trace`` is the only
one that reads a file. Warm-up steps are dropped everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from codl.trace.store import open_trace

PHASES = ("step", "data_wait", "h2d", "forward", "backward", "optimizer", "compute", "sleep")
SPEC_COLUMNS = {
    "mode": ("mode",),
    "device": ("device",),
    "model": ("workload", "model"),
    "batch_size": ("workload", "batch_size"),
    "image_size": ("workload", "image_size"),
    "precision": ("workload", "precision"),
    "policy": ("pinning", "policy"),
    "launch_cores": ("pinning", "launch_cores"),
    "workers": ("loader", "workers"),
    "prefetch_factor": ("loader", "prefetch_factor"),
    "pin_memory": ("loader", "pin_memory"),
    "nodes": ("layout", "nodes"),
    "ranks_per_node": ("layout", "ranks_per_node"),
    "backend": ("layout", "backend"),
    "comm_pattern": ("layout", "comm_pattern"),
    "tier": ("dataset", "tier"),
    "cupti": ("trace", "cupti"),
    "repeat": ("repeat",),
}


def spec_columns(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col, path in SPEC_COLUMNS.items():
        node: Any = spec
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        out[col] = node
    if out["mode"] not in {"data", "data+compute", "combined", "data+sleep"}:
        out["workers"] = 0
    return out


def _ms(ns: pd.Series | np.ndarray) -> Any:
    return np.asarray(ns, dtype=float) / 1e6


def step_metrics(app: pd.DataFrame, comm: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    """One row per (rank, step) after warm-up: wall and GPU ms of every phase, AllReduce ms."""
    app = app[app["step"] >= warmup].copy()
    app["phase"] = app["phase"].astype(str)
    app["wall_ms"] = _ms(app["end_ns"] - app["start_ns"])
    app["gpu_ms"] = np.where(app["gpu_ns"] >= 0, _ms(app["gpu_ns"]), np.nan)
    keys = ["rank", "step", "phase"]
    # min_count=1 keeps "not measured" as NaN instead of summing it to 0.
    wall = app.groupby(keys)["wall_ms"].sum(min_count=1).unstack("phase")
    gpu = app.groupby(keys)["gpu_ms"].sum(min_count=1).unstack("phase")
    out = pd.DataFrame(index=wall.index)
    for phase in PHASES:
        out[f"{phase}_ms"] = wall[phase] if phase in wall else np.nan
        out[f"{phase}_gpu_ms"] = gpu[phase] if phase in gpu else np.nan
    step_start = app[app["phase"] == "step"].set_index(["rank", "step"])
    out["start_ns"] = step_start["start_ns"]
    out["end_ns"] = step_start["end_ns"]
    # The compute figure of merit: GPU time from first forward launch to optimizer end when
    # CUDA events exist (it includes the GPU idling on late launches), host wall time otherwise.
    out["compute_eff_ms"] = out["compute_gpu_ms"].fillna(out["compute_ms"])
    comm = comm[comm["step"] >= warmup]
    if len(comm):
        dur = np.where(comm["gpu_ns"] >= 0, comm["gpu_ns"], comm["end_ns"] - comm["start_ns"])
        c = (
            comm.assign(ms=_ms(dur))
            .groupby(["rank", "step"])
            .agg(
                allreduce_ms=("ms", "sum"), allreduce_bytes=("bytes", "sum"), buckets=("ms", "size")
            )
        )
        out = out.join(c)
    else:
        out["allreduce_ms"] = np.nan
        out["allreduce_bytes"] = np.nan
        out["buckets"] = 0
    return out.reset_index()


def launch_tids(threads: pd.DataFrame) -> dict[int, int]:
    """rank -> TID of its launch (main) thread."""
    t = threads[threads["role"].astype(str) == "launch"]
    return {int(r): int(tid) for r, tid in zip(t["rank"], t["tid"], strict=True)}


def sched_deltas(sched: pd.DataFrame) -> pd.DataFrame:
    """Per-thread, per-step differences of the cumulative scheduler counters.

    A sample tagged step s is taken right after step s ends, so the difference to the thread's
    previous sample is what happened during step s (plus the few microseconds of sampling).
    """
    if sched.empty:
        return pd.DataFrame(
            columns=["rank", "pid", "tid", "step", "run_ns", "wait_ns", "involuntary", "cpu"]
        )
    s = sched.sort_values(["tid", "t_ns"])
    g = s.groupby("tid")
    out = s[["rank", "pid", "tid", "step", "cpu"]].copy()
    for col in ("run_ns", "wait_ns", "timeslices", "voluntary", "involuntary"):
        out[col] = g[col].diff()
    return out.dropna(subset=["run_ns"]).astype({"run_ns": "int64", "wait_ns": "int64"})


def launch_metrics(sched: pd.DataFrame, threads: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    tids = launch_tids(threads)
    d = sched_deltas(sched)
    rows = []
    for rank, tid in tids.items():
        x = d[(d["tid"] == tid) & (d["step"] >= warmup)]
        rows.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "step": x["step"].to_numpy(),
                    "launch_wait_ms": _ms(x["wait_ns"]),
                    "launch_run_ms": _ms(x["run_ns"]),
                    "launch_involuntary": x["involuntary"].to_numpy(),
                    "launch_timeslices": x["timeslices"].to_numpy(),
                }
            )
        )
    if not rows:
        return pd.DataFrame(columns=["rank", "step", "launch_wait_ms", "launch_run_ms"])
    return pd.concat(rows, ignore_index=True)


def api_metrics(cuda: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    """Per-step CUDA runtime API latency (all runtime calls, and cudaLaunchKernel alone)."""
    if cuda.empty:
        return pd.DataFrame(columns=["rank", "step"])
    rt = cuda[(cuda["kind"].astype(str) == "runtime") & (cuda["step"] >= warmup)].copy()
    rt["us"] = (rt["end_ns"] - rt["start_ns"]) / 1e3
    rt["name"] = rt["name"].astype(str)
    allc = rt.groupby(["rank", "step"])["us"].agg(api_us_mean="mean", api_calls="size")
    lk = rt[rt["name"].str.contains("LaunchKernel")]
    launch = lk.groupby(["rank", "step"])["us"].agg(launch_kernel_us_mean="mean")
    return allc.join(launch).reset_index()


def loader_metrics(loader: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    if loader.empty:
        return pd.DataFrame(columns=["rank", "step"])
    x = loader[loader["step"] >= warmup].copy()
    x["stage"] = x["stage"].astype(str)
    x["ms"] = _ms(x["end_ns"] - x["start_ns"])
    per = x.pivot_table(index=["rank", "step"], columns="stage", values="ms", aggfunc="sum")
    per.columns = [f"loader_{c}_ms" for c in per.columns]
    items = x[x["item"] >= 0].groupby(["rank", "step"])["item"].nunique().rename("loader_items")
    return per.join(items).reset_index()


def interval_union(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Merge intervals; returns an (n, 2) array of disjoint sorted intervals."""
    if len(starts) == 0:
        return np.empty((0, 2), dtype=np.int64)
    order = np.argsort(starts)
    s, e = np.asarray(starts)[order], np.asarray(ends)[order]
    merged: list[list[int]] = [[int(s[0]), int(e[0])]]
    for a, b in zip(s[1:], e[1:], strict=True):
        if a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], int(b))
        else:
            merged.append([int(a), int(b)])
    return np.asarray(merged, dtype=np.int64)


def overlap_ns(a: np.ndarray, b: np.ndarray) -> int:
    """Total overlap of two disjoint sorted interval sets."""
    i = j = 0
    total = 0
    while i < len(a) and j < len(b):
        lo = max(a[i, 0], b[j, 0])
        hi = min(a[i, 1], b[j, 1])
        if hi > lo:
            total += int(hi - lo)
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


def overlaps(
    app: pd.DataFrame, loader: pd.DataFrame, cuda: pd.DataFrame, *, warmup: int
) -> dict[str, float]:
    """Fractions of compute (host spans) and of GPU kernel time during which a worker was busy."""
    out = {"loader_compute_overlap": np.nan, "kernel_loader_overlap": np.nan}
    if loader.empty:
        return out
    ld = loader[(loader["step"] >= warmup) & (loader["item"] >= 0)]
    busy = interval_union(ld["start_ns"].to_numpy(), ld["end_ns"].to_numpy())
    comp = app[(app["phase"].astype(str) == "compute") & (app["step"] >= warmup)]
    if len(comp):
        cu = interval_union(comp["start_ns"].to_numpy(), comp["end_ns"].to_numpy())
        total = int((cu[:, 1] - cu[:, 0]).sum())
        out["loader_compute_overlap"] = overlap_ns(cu, busy) / total if total else np.nan
    if not cuda.empty:
        k = cuda[(cuda["kind"].astype(str) == "kernel") & (cuda["step"] >= warmup)]
        if len(k):
            ku = interval_union(k["start_ns"].to_numpy(), k["end_ns"].to_numpy())
            total = int((ku[:, 1] - ku[:, 0]).sum())
            out["kernel_loader_overlap"] = overlap_ns(ku, busy) / total if total else np.nan
    return out


def attribute_launch_wait(
    sched: pd.DataFrame, threads: pd.DataFrame, *, warmup: int
) -> pd.DataFrame:
    """Which threads ran on the launch thread's CPUs while it waited, per step.

    For step s, every other thread's on-CPU time during s is weighted by the fraction of its CPU
    mask that lies inside the launch thread's mask (a thread confined to the launch cores counts
    fully; one spread over 16 cores including 1 launch core counts 1/16), and the launch
    thread's run-queue wait is split in proportion. Threads whose mask misses the launch cores
    get nothing: under `isolated` the loader workers can never be blamed.
    """
    cols = ["rank", "step", "tid", "pid", "role", "name", "share_ns", "attributed_wait_ns"]
    d = sched_deltas(sched)
    d = d[d["step"] >= warmup]
    if d.empty or threads.empty:
        return pd.DataFrame(columns=cols)
    info = threads.drop_duplicates("tid", keep="last").set_index("tid")
    masks = {int(t): _cpuset(str(m)) for t, m in info["cpus_actual"].items()}
    out = []
    for rank, ltid in launch_tids(threads).items():
        lmask = masks.get(ltid, set())
        lw = d[d["tid"] == ltid].set_index("step")["wait_ns"]
        others = d[(d["tid"] != ltid) & (d["rank"] == rank)].copy()
        if others.empty or not lmask:
            continue
        frac = {t: (len(m & lmask) / len(m) if m else 0.0) for t, m in masks.items() if t != ltid}
        others["share_ns"] = others["run_ns"] * others["tid"].map(frac).fillna(0.0)
        others = others[others["share_ns"] > 0]
        tot = others.groupby("step")["share_ns"].transform("sum")
        others["attributed_wait_ns"] = others["step"].map(lw).fillna(0) * others["share_ns"] / tot
        others["role"] = others["tid"].map(info["role"].astype(str)).fillna("other")
        others["name"] = others["tid"].map(info["name"].astype(str)).fillna("")
        others["rank"] = rank
        out.append(others[cols])
    if not out:
        return pd.DataFrame(columns=cols)
    return pd.concat(out, ignore_index=True)


def _cpuset(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-")
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return cpus


def summarize_tables(
    tables: dict[str, pd.DataFrame], attrs: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(steps, summary, attribution) from a trace's tables and root attributes."""
    warm = int(attrs.get("warmup_steps", 0))
    spec = attrs["spec"] if isinstance(attrs["spec"], dict) else {}
    run_id = str(attrs.get("run_id", ""))
    steps = step_metrics(tables["events/app"], tables["events/comm"], warmup=warm)
    for extra in (
        launch_metrics(tables["samples/sched"], tables["threads"], warmup=warm),
        api_metrics(tables["events/cuda"], warmup=warm),
        loader_metrics(tables["events/loader"], warmup=warm),
    ):
        if len(extra.columns) > 2:
            steps = steps.merge(extra, on=["rank", "step"], how="left")
    ident = {"run_id": run_id, **spec_columns(spec)}
    for k, v in reversed(ident.items()):
        steps.insert(0, k, v)
    attribution = attribute_launch_wait(tables["samples/sched"], tables["threads"], warmup=warm)
    attribution.insert(0, "run_id", run_id)

    st = steps["step_ms"].dropna()
    world = int(attrs.get("world_size", 1))
    batch = int(ident["batch_size"] or 0)
    span_s = (steps["end_ns"].max() - steps["start_ns"].min()) / 1e9 if len(steps) else np.nan
    row: dict[str, Any] = dict(ident)
    row.update(
        {
            "world_size": world,
            "host": attrs.get("host", ""),
            "steps": int(steps["step"].nunique()),
            "step_ms_p50": st.median(),
            "step_ms_p95": st.quantile(0.95),
            "step_ms_p99": st.quantile(0.99),
            "step_ms_mean": st.mean(),
            "step_ms_cv": st.std(ddof=1) / st.mean() if len(st) > 1 else np.nan,
            "throughput_samples_s": batch * world * 1000.0 / st.median() if len(st) else np.nan,
            "sleep_ns": attrs.get("sleep_ns", np.nan),
        }
    )
    for col in (
        "compute_eff_ms",
        "compute_ms",
        "compute_gpu_ms",
        "forward_ms",
        "backward_ms",
        "optimizer_ms",
        "data_wait_ms",
        "h2d_ms",
        "allreduce_ms",
        "launch_wait_ms",
        "launch_involuntary",
        "api_us_mean",
        "launch_kernel_us_mean",
    ):
        vals = steps[col].dropna() if col in steps else pd.Series(dtype=float)
        row[f"{col}_p50"] = vals.median() if len(vals) else np.nan
        row[f"{col}_mean"] = vals.mean() if len(vals) else np.nan
    cuda = tables["events/cuda"]
    if not cuda.empty:
        rt = cuda[(cuda["kind"].astype(str) == "runtime") & (cuda["step"] >= warm)]
        us = (rt["end_ns"] - rt["start_ns"]) / 1e3
        row["api_us_p99"] = us.quantile(0.99) if len(us) else np.nan
    else:
        row["api_us_p99"] = np.nan
    items = steps["loader_items"].sum() if "loader_items" in steps else 0
    row["loader_items_per_s"] = items / span_s if items and span_s else np.nan
    row.update(overlaps(tables["events/app"], tables["events/loader"], cuda, warmup=warm))
    summary = pd.DataFrame([row])
    return steps, summary, attribution


def summarize_trace(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    names = (
        "events/app",
        "events/comm",
        "events/loader",
        "events/cuda",
        "samples/sched",
        "threads",
    )
    with open_trace(path) as t:
        t.verify()
        tables = {n: t.table(n) for n in names}
        attrs = dict(t.attrs)
    return summarize_tables(tables, attrs)
