"""Why a step got slower: per step and rank, compute and AllReduce inflation split into causes.

Two halves, both pure (DataFrames in, DataFrames out):

* ``step_parts`` (per run, in the summarize job): absolute per-(rank, step) costs from the trace -
  the launch roles' on-CPU time and run-queue wait (main and autograd threads, from schedstat),
  each AllReduce bucket's *peer wait* and *transfer* (from the ranks' enqueue times of the same
  bucket), and GPU kernel busy time (CUPTI kernels, where traced).
* ``decompose`` (in compare): each part minus its isolation twin's steady-state mean, next to the
  inflation of compute (and AllReduce) against the same twin:

  ===================  =======================================================================
  host_launch_delay    launch + autograd threads' on-CPU time and run-queue wait beyond twin
  peer_wait            waiting in a bucket's AllReduce for the last rank to arrive
  transfer             the collective's time from the last arrival (its own work)
  gpu_slowdown         GPU kernel busy time beyond the twin's (CUPTI runs only, else NaN)
  unattributed         inflation minus the parts above (negative: parts overlap in time)
  ===================  =======================================================================

Baselines are the twin's *means* over its steady-state steps, not medians: means add up, so the
baselines of the parts sum to the baseline of their sum and ``unattributed`` is exact arithmetic.
The parts are costs measured on their own resources; they can overlap in time (DDP reduces
buckets during the backward pass; a launch thread delayed while the GPU still has queued work
costs the GPU nothing), which is why ``unattributed`` may be negative and is always shown.

Peer wait needs the ranks' enqueue times on one clock: ranks of one node share
CLOCK_MONOTONIC; across nodes the merge put every rank on rank 0's clock through a measured
offset (``codl.trace.clock``), and ``peer_wait_bound_ms`` bounds what that offset's error can do
to ``peer_wait_ms`` (0 on one node; NaN parts for traces without a measured offset). The
arrival is the host's enqueue of the bucket (the DDP comm hook); on CUDA the GPU reaches the
bucket later than the host enqueues it, so there it is the host-side view of the wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.analysis import compare as cmp
from codl.analysis.steady import steady
from codl.analysis.summarize import KEYS, interval_union, sched_deltas

# Threads whose delay delays the GPU work of a step: the main thread launches the forward and
# optimizer kernels, the autograd engine's device thread launches the backward.
LAUNCH_ROLES = ("launch", "autograd")
PARTS = ("host_launch_delay_ms", "peer_wait_ms", "transfer_ms", "gpu_slowdown_ms")
# A twin without the data component: what the loader added is what the parts measure. A
# `combined` run's best twin still reduces its gradients (compute+comm); without one, the
# compute twin does, and the AllReduce then counts in full as inflation.
DECOMPOSITION_TWINS: dict[str, tuple[str, ...]] = {
    "combined": ("compute+comm", "compute"),
    "data+compute": ("compute",),
    "compute+comm": ("compute",),
}
# Collective kernels are the AllReduce (peer wait + transfer), not compute.
COLLECTIVE_KERNEL = "nccl"

PART_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "launch_run_ms": "float64",
    "launch_wait_ms": "float64",
    "autograd_run_ms": "float64",
    "autograd_wait_ms": "float64",
    "host_ms": "float64",
    "peer_wait_ms": "float64",
    "transfer_ms": "float64",
    "straggler_rank": "float64",
    "gpu_kernel_ms": "float64",
    # Bound on peer_wait_ms's error from the clock alignment of the ranks compared.
    "peer_wait_bound_ms": "float64",
}


def _empty(columns: Mapping[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in columns.items()})


def _ms(x: Any) -> npt.NDArray[np.float64]:
    return np.asarray(x, dtype=np.float64) / 1e6


def host_parts(sched: pd.DataFrame, threads: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    """Per (rank, step): on-CPU time and run-queue wait of the launch and autograd threads.

    ``host_ms`` is their sum: the host time the step's kernel launches took. Roles come from the
    threads table (latest row per thread); a rank without an autograd thread (no backward, or
    CPU autograd on the main thread) has 0 there, not NaN: the role did no work.
    """
    cols = ["launch_run_ms", "launch_wait_ms", "autograd_run_ms", "autograd_wait_ms", "host_ms"]
    d = sched_deltas(sched)
    d = d[d["step"] >= warmup]
    if d.empty or threads.empty:
        return _empty({"rank": "int64", "step": "int64", **dict.fromkeys(cols, "float64")})
    roles = threads.drop_duplicates(["rank", "tid"], keep="last").assign(
        rank=lambda t: t["rank"].astype("int64"),
        tid=lambda t: t["tid"].astype("int64"),
        role=lambda t: t["role"].astype(str),
    )[["rank", "tid", "role"]]
    d = d.merge(roles, on=["rank", "tid"], how="inner")
    d = d[d["role"].isin(LAUNCH_ROLES)]
    if d.empty:
        return _empty({"rank": "int64", "step": "int64", **dict.fromkeys(cols, "float64")})
    per = d.groupby([*KEYS, "role"])[["run_ns", "wait_ns"]].sum().unstack("role", fill_value=0)
    out = pd.DataFrame(index=per.index)
    for role in LAUNCH_ROLES:
        for kind in ("run", "wait"):
            col = (f"{kind}_ns", role)
            out[f"{role}_{kind}_ms"] = _ms(per[col]) if col in per else 0.0
    out["host_ms"] = out[cols[:4]].sum(axis=1)
    return out.reset_index().astype({"rank": "int64", "step": "int64"})


BUCKET_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "bucket": "int64",
    "duration_ms": "float64",
    "peer_wait_ms": "float64",
    "transfer_ms": "float64",
    "last_rank": "int64",
    "peer_wait_bound_ms": "float64",
}


def bucket_waits(
    comm: pd.DataFrame,
    *,
    warmup: int,
    ranks_per_node: int,
    clock_bound_ns: Mapping[int, int] | None = None,
) -> pd.DataFrame:
    """Per (rank, step, bucket): the collective's duration split at the last rank's arrival.

    A bucket's collective cannot start before every rank has enqueued it, so rank r's
    ``peer_wait`` is (last arrival - r's arrival), at most its duration, and ``transfer`` the
    rest. ``duration`` is the GPU time when CUDA events measured it, host wall otherwise (as
    ``allreduce_ms``), so the parts of a step add up to its ``allreduce_ms``. Only ranks of one
    node (one clock) are compared, unless ``clock_bound_ns`` (``clock.rank_bounds``) says the
    trace put all ranks on one clock, each rank's times true to within its bound; then the
    bucket's ``peer_wait_bound_ms`` is this rank's bound plus the last rank's. Without it the
    buckets of a multi-node run get NaN parts.
    """
    c = comm[comm["step"] >= warmup]
    if c.empty:
        return _empty(BUCKET_COLUMNS)
    c = c.assign(
        rank=c["rank"].astype("int64"),
        step=c["step"].astype("int64"),
        bucket=c["bucket"].astype("int64"),
        node=0
        if clock_bound_ns is not None
        else c["rank"].astype("int64") // max(1, ranks_per_node),
        duration_ns=np.where(c["gpu_ns"] >= 0, c["gpu_ns"], c["end_ns"] - c["start_ns"]),
    )
    key = ["step", "bucket"]
    g = c.groupby(key)
    last = g["start_ns"].transform("max")
    one_clock = g["node"].transform("nunique") == 1
    first_last = g["start_ns"].idxmax()
    last_rank = pd.Series(c.loc[first_last.to_numpy(), "rank"].to_numpy(), index=first_last.index)
    c["last_rank"] = last_rank.reindex(pd.MultiIndex.from_frame(c[key])).to_numpy()
    wait = np.minimum(np.clip(last - c["start_ns"], 0, None), c["duration_ns"])
    c["peer_wait_ms"] = np.where(one_clock, _ms(wait), np.nan)
    c["duration_ms"] = _ms(c["duration_ns"])
    c["transfer_ms"] = c["duration_ms"] - c["peer_wait_ms"]
    c["peer_wait_bound_ms"] = np.where(one_clock, _ms(_wait_bound(c, clock_bound_ns)), np.nan)
    return c.astype(BUCKET_COLUMNS)[list(BUCKET_COLUMNS)].reset_index(drop=True)


def _wait_bound(c: pd.DataFrame, clock_bound_ns: Mapping[int, int] | None) -> pd.Series:
    """Per row, the bound (ns) on its peer wait's clock error: the wait is the largest
    (arrival_k - arrival_r) over the other ranks k, each term off by at most b_k + b_r."""
    b = c["rank"].map(pd.Series(clock_bound_ns or {}, dtype="float64")).fillna(0.0)
    g = b.groupby([c["step"], c["bucket"]])
    top = g.transform("max")
    at_top = b == top
    n_top = at_top.groupby([c["step"], c["bucket"]]).transform("sum")
    second = b.where(~at_top).groupby([c["step"], c["bucket"]]).transform("max").fillna(0.0)
    others = np.where(at_top & (n_top == 1), second, top)
    return b + others


def comm_parts(
    comm: pd.DataFrame,
    *,
    warmup: int,
    ranks_per_node: int,
    clock_bound_ns: Mapping[int, int] | None = None,
) -> pd.DataFrame:
    """Per (rank, step): peer wait and transfer summed over buckets, and ``straggler_rank``,
    the rank that arrived last at the bucket this rank waited longest in (NaN without waits).
    ``peer_wait_bound_ms`` is the sum of the buckets' bounds (see ``bucket_waits``)."""
    b = bucket_waits(
        comm, warmup=warmup, ranks_per_node=ranks_per_node, clock_bound_ns=clock_bound_ns
    )
    cols = {"rank": "int64", "step": "int64", "peer_wait_ms": "float64", "transfer_ms": "float64"}
    cols["peer_wait_bound_ms"] = "float64"
    if b.empty:
        return _empty({**cols, "straggler_rank": "float64"})
    summed = ["peer_wait_ms", "transfer_ms", "peer_wait_bound_ms"]
    out = b.groupby(KEYS)[summed].sum(min_count=1)
    waited = b[b["peer_wait_ms"] > 0]
    rows = waited.loc[waited.groupby(KEYS)["peer_wait_ms"].idxmax()]
    worst = rows.set_index(KEYS)["last_rank"]
    out["straggler_rank"] = worst.reindex(out.index).astype("float64")
    return out.reset_index().astype(cols)


def gpu_parts(cuda: pd.DataFrame, *, warmup: int) -> pd.DataFrame:
    """Per (rank, step): GPU busy time of compute kernels, memcpy and memset (union of their
    intervals, so concurrent streams count once). Collective kernels are left out: they are
    the AllReduce. Steps without a traced GPU activity do not appear (not measured)."""
    cols = {"rank": "int64", "step": "int64", "gpu_kernel_ms": "float64"}
    if cuda.empty:
        return _empty(cols)
    k = cuda[
        cuda["kind"].astype(str).isin(["kernel", "memcpy", "memset"])
        & (cuda["step"] >= warmup)
        & ~cuda["name"].astype(str).str.lower().str.contains(COLLECTIVE_KERNEL, regex=False)
    ]
    if k.empty:
        return _empty(cols)
    rows = []
    for (rank, step), g in k.groupby(KEYS):
        u = interval_union(g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
        rows.append((rank, step, float((u[:, 1] - u[:, 0]).sum()) / 1e6))
    return pd.DataFrame(rows, columns=list(cols)).astype(cols)


def step_parts(
    tables: Mapping[str, pd.DataFrame],
    *,
    warmup: int,
    ranks_per_node: int = 1,
    clock_bound_ns: Mapping[int, int] | None = None,
) -> pd.DataFrame:
    """The per-run decomposition inputs: one row per measured (rank, step) with a step span.
    ``clock_bound_ns``: the trace's per-rank alignment bounds (``clock.rank_bounds``)."""
    app = tables["events/app"]
    st = app[(app["phase"].astype(str) == "step") & (app["step"] >= warmup)]
    base = (
        pd.DataFrame({"rank": st["rank"].astype("int64"), "step": st["step"].astype("int64")})
        .drop_duplicates()
        .sort_values(KEYS)
    )
    for part in (
        host_parts(tables["samples/sched"], tables["threads"], warmup=warmup),
        comm_parts(
            tables["events/comm"],
            warmup=warmup,
            ranks_per_node=ranks_per_node,
            clock_bound_ns=clock_bound_ns,
        ),
        gpu_parts(tables["events/cuda"], warmup=warmup),
    ):
        base = base.merge(part, on=KEYS, how="left")
    for col in PART_COLUMNS:
        if col not in base:
            base[col] = np.nan
    return base.astype(PART_COLUMNS)[list(PART_COLUMNS)].reset_index(drop=True)


def parts_from_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Decomposition inputs recoverable from a per-step table alone (tables summarised before
    ``step_parts`` existed): the main thread's schedstat columns. Autograd threads, bucket
    arrivals and kernels need the trace, so those stay NaN."""
    out = steps[["run_id", *KEYS]].copy()
    for col in PART_COLUMNS:
        if col in KEYS:
            continue
        out[col] = steps.get(col, np.nan)
    out["host_ms"] = steps["launch_run_ms"] + steps["launch_wait_ms"]
    return out


DECOMPOSITION_COLUMNS = (
    "run_id",
    "mode",
    "policy",
    "workers",
    "cupti",
    "cuda_api",
    "world_size",
    "twin_mode",
    "twin_runs",
    "rank",
    "step",
    "outlier",
    "compute_eff_ms",
    "twin_compute_eff_ms",
    "compute_inflation_ms",
    "allreduce_inflation_ms",
    *PARTS,
    "unattributed_ms",
    "straggler_rank",
    "peer_wait_bound_ms",
)
# Absolute inputs whose twin means are the baselines of the parts.
_BASE = {
    "host_launch_delay_ms": "host_ms",
    "peer_wait_ms": "peer_wait_ms",
    "transfer_ms": "transfer_ms",
    "gpu_slowdown_ms": "gpu_kernel_ms",
}


def _twin(
    row: pd.Series, groups: Mapping[tuple[Any, ...], list[str]]
) -> tuple[str, list[str]] | None:
    for mode in DECOMPOSITION_TWINS.get(str(row["mode"]), ()):
        runs = groups.get(cmp.twin_key(row, mode), [])
        if runs:
            return mode, runs
    return None


def _baseline(twin: pd.DataFrame, col: str) -> float:
    """The twin's steady-state mean of ``col``. A twin that never reduces has spent 0 ms in
    peer wait and transfer (a measured zero); other parts it did not measure stay NaN."""
    vals = pd.to_numeric(twin[col], errors="coerce") if col in twin else pd.Series(dtype=float)
    if vals.notna().any():
        return float(vals.mean())
    if col in ("peer_wait_ms", "transfer_ms", "allreduce_ms"):
        return 0.0
    return float("nan")


def decompose(steps: pd.DataFrame, parts: pd.DataFrame, summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, rank, step) of every run that has a twin without the loader (or
    without the collective): inflation against the twin and its parts (module docstring)."""
    if steps.empty or summaries.empty or "mode" not in summaries:
        return pd.DataFrame(columns=list(DECOMPOSITION_COLUMNS))
    groups = cmp.run_groups(summaries)
    extra = [c for c in PART_COLUMNS if c not in KEYS]
    if len(parts) and "peer_wait_bound_ms" not in parts:
        # Parts written before clock alignment: their peer waits were one-clock or NaN.
        known = parts["peer_wait_ms"].notna()
        parts = parts.assign(peer_wait_bound_ms=np.where(known, 0.0, np.nan))
    st = steps.drop(columns=[c for c in extra if c in steps])
    merged = (
        st.merge(parts[["run_id", *KEYS, *extra]], on=["run_id", *KEYS], how="left")
        if len(parts)
        else st.assign(**dict.fromkeys(extra, np.nan))
    )
    by_run = {str(r): g for r, g in merged.groupby("run_id")}
    out = []
    for _, r in summaries.iterrows():
        twin = _twin(r, groups)
        rid = str(r["run_id"])
        if twin is None or rid not in by_run:
            continue
        mode, runs = twin
        tw = steady(pd.concat([by_run[t] for t in runs if t in by_run], ignore_index=True))
        if tw.empty:
            continue
        g = by_run[rid].copy()
        base_compute = _baseline(tw, "compute_eff_ms")
        g["twin_mode"] = mode
        g["twin_runs"] = " ".join(runs)
        g["twin_compute_eff_ms"] = base_compute
        g["compute_inflation_ms"] = g["compute_eff_ms"] - base_compute
        allreduce = g.get("allreduce_ms", np.nan)
        g["allreduce_inflation_ms"] = allreduce - _baseline(tw, "allreduce_ms")
        for part, col in _BASE.items():
            g[part] = g[col] - _baseline(tw, col)
        # Both the run's and the twin's peer waits carry their clocks' error.
        g["peer_wait_bound_ms"] += np.nan_to_num(_baseline(tw, "peer_wait_bound_ms"))
        # A part that was not measured (NaN) explains nothing; it does not void the others.
        g["unattributed_ms"] = g["compute_inflation_ms"] - g[list(PARTS)].sum(axis=1, min_count=0)
        if "outlier" not in g:
            g["outlier"] = False
        for col in ("world_size", "cuda_api", "cupti", "workers", "policy"):
            if col not in g:
                g[col] = r.get(col)
        out.append(g[list(DECOMPOSITION_COLUMNS)])
    if not out:
        return pd.DataFrame(columns=list(DECOMPOSITION_COLUMNS))
    return pd.concat(out, ignore_index=True)


def decomposition_means(decomp: pd.DataFrame, *, tail: float = 0.95) -> pd.DataFrame:
    """Per (mode, policy, workers, world size, cupti, cuda_api) and view: the mean of the
    inflation and of each part over the steady-state steps (``view`` = "all steps") and over
    the steps whose compute inflation is at or above the group's ``tail`` quantile (``view`` =
    "slowest 5 %"): what the average step and what the slow steps are made of."""
    cols = ["compute_inflation_ms", *PARTS, "unattributed_ms"]
    keys = ["mode", "policy", "workers", "world_size", "cupti", "cuda_api"]
    if decomp.empty:
        return pd.DataFrame(columns=[*keys, "view", "steps", *cols])
    d = steady(decomp)
    rows = []
    for k, g in d.groupby(keys, dropna=False):
        cut = g["compute_inflation_ms"].quantile(tail)
        label = f"slowest {round((1 - tail) * 100)} %"
        for view, sel in (("all steps", g), (label, g[g["compute_inflation_ms"] >= cut])):
            means = sel[cols].mean(numeric_only=True)
            rows.append(
                {**dict(zip(keys, k, strict=True)), "view": view, "steps": len(sel)}
                | {c: float(means[c]) for c in cols}
            )
    return pd.DataFrame(rows)
