"""Pure preparation of figure data: trace tables -> the frames plots.py draws."""

from __future__ import annotations

import numpy as np
import pandas as pd

from codl.analysis.compare import HEADLINE_STAT
from codl.analysis.summarize import sched_deltas

TIMELINE_COLUMNS = ["track", "role", "kind", "label", "phase", "start_ms", "end_ms"]


def api_latencies(cuda: pd.DataFrame, label: str, *, warmup: int) -> pd.DataFrame:
    """Every measured CUDA runtime API call as (label, name, us), for the latency CDF."""
    if cuda.empty:
        return pd.DataFrame(columns=["label", "name", "us"])
    rt = cuda[(cuda["kind"].astype(str) == "runtime") & (cuda["step"] >= warmup)]
    return pd.DataFrame(
        {
            "label": label,
            "name": rt["name"].astype(str).to_numpy(),
            "us": ((rt["end_ns"] - rt["start_ns"]) / 1e3).to_numpy(),
        }
    )


def step_timeline(tables: dict[str, pd.DataFrame], *, step: int, rank: int = 0) -> pd.DataFrame:
    """Bars of one step: app phases on the launch track, loader stages per worker, GPU phase
    durations (CUDA events) on a GPU track, AllReduce buckets, and each thread's run-queue wait
    during the step as a hatched bar at the step's end (schedstat gives totals, not positions).

    ``phase`` names the app phase (or loader stage) of a span so the plot can colour phases
    apart; it is empty for collectives and waits."""
    app = tables["events/app"]
    app = app[(app["rank"] == rank)]
    st = app[(app["step"] == step) & (app["phase"].astype(str) == "step")]
    if st.empty:
        return pd.DataFrame(columns=TIMELINE_COLUMNS)
    t0, t1 = int(st["start_ns"].iloc[0]), int(st["end_ns"].iloc[0])
    rows: list[dict[str, object]] = []

    def add(track: str, role: str, kind: str, label: str, a: int, b: int, phase: str = "") -> None:
        a, b = max(a, t0), min(b, t1)
        if b > a:
            rows.append(
                {
                    "track": track,
                    "role": role,
                    "kind": kind,
                    "label": label,
                    "phase": phase,
                    "start_ms": (a - t0) / 1e6,
                    "end_ms": (b - t0) / 1e6,
                }
            )

    phases = app[(app["step"] == step) & ~app["phase"].astype(str).isin(["step", "compute"])]
    for _, r in phases.iterrows():
        phase = str(r["phase"])
        add("launch thread", "launch", "span", phase, int(r["start_ns"]), int(r["end_ns"]), phase)
        if r["gpu_ns"] >= 0:
            # The GPU view: duration from CUDA events, drawn from the phase's host start.
            add(
                "GPU (events)",
                "gpu",
                "span",
                str(r["phase"]),
                int(r["start_ns"]),
                int(r["start_ns"]) + int(r["gpu_ns"]),
                phase,
            )
    ld = tables["events/loader"]
    ld = ld[(ld["rank"] == rank) & (ld["end_ns"] > t0) & (ld["start_ns"] < t1)]
    for _, r in ld.iterrows():
        add(
            f"loader worker {int(r['worker'])}",
            "loader",
            "span",
            str(r["stage"])[:1],
            int(r["start_ns"]),
            int(r["end_ns"]),
            str(r["stage"]),
        )
    comm = tables["events/comm"]
    comm = comm[(comm["rank"] == rank) & (comm["step"] == step)]
    for _, r in comm.iterrows():
        add(
            "collectives",
            "comm",
            "span",
            f"b{int(r['bucket'])}",
            int(r["start_ns"]),
            int(r["end_ns"]),
        )
    d = sched_deltas(tables["samples/sched"])
    d = d[(d["step"] == step) & (d["rank"] == rank) & (d["wait_ns"] > 0)]
    th = tables["threads"]
    # TIDs are per node: look threads up within this rank only.
    threads = th[th["rank"] == rank].drop_duplicates("tid", keep="last").set_index("tid")
    for _, r in d.sort_values("wait_ns", ascending=False).head(8).iterrows():
        tid = int(r["tid"])
        role = str(threads["role"].get(tid, "other")) if len(threads) else "other"
        name = str(threads["name"].get(tid, "")) if len(threads) else ""
        add(
            f"{role} {name} ({tid}) wait",
            role,
            "wait",
            f"{r['wait_ns'] / 1e6:.1f} ms",
            t1 - int(r["wait_ns"]),
            t1,
        )
    return pd.DataFrame(rows, columns=TIMELINE_COLUMNS)


def heatmap_table(summary: pd.DataFrame, comparison: pd.DataFrame) -> pd.DataFrame:
    """policy, workers, throughput of the combined-like runs, compute inflation ratio at the
    headline statistic (p95: the effect lives in the tail)."""
    cols = ["policy", "workers", "throughput_samples_s", "ratio"]
    if summary.empty or not {"mode", "policy", "workers", "throughput_samples_s"} <= set(summary):
        return pd.DataFrame(columns=cols)
    multi = summary[~summary["mode"].isin(["data", "compute", "comm"])]
    thr = multi.groupby(["policy", "workers"])["throughput_samples_s"].median()
    out = thr.reset_index()
    if len(comparison) and {"metric", "status", "ratio"} <= set(comparison):
        c = comparison[(comparison["metric"] == "compute_eff_ms") & (comparison["status"] == "ok")]
        if "stat" in c:
            c = c[c["stat"] == HEADLINE_STAT]
        ratio = c.groupby(["policy", "workers"])["ratio"].median()
        out = out.merge(ratio.reset_index(), on=["policy", "workers"], how="outer")
    else:
        out["ratio"] = np.nan
    return out
