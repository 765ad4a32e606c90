"""Why a step got slower: per step and rank, compute inflation as a budget of causes.

Two halves, both pure (DataFrames in, DataFrames out):

* ``step_parts`` (per run, in the summarize job): absolute per-(rank, step) costs from the trace,
  each measured *inside the compute span* so that they add up: the launch roles' on-CPU time and
  run-queue wait across the compute phase (``events/phase_sched``, read at the phase's
  boundaries), the *exposed* peer wait and transfer of the step's AllReduce buckets (the part
  after the rank's own last bucket was ready, when nothing of its own is left to overlap them),
  and GPU kernel busy time (CUPTI kernels, where traced).
* ``decompose`` (in compare): each part minus its isolation twin's steady-state mean, next to the
  compute inflation against the same twin, as a budget::

      compute inflation = host_launch_delay + host_blocked + peer_wait + transfer
                          + gpu_slowdown + unattributed

  ===================  =======================================================================
  host_launch_delay    main + autograd threads' on-CPU time and run-queue wait in the compute
                       span, beyond the twin's
  host_blocked         time in the compute span in which a launch role slept until a thread off
                       the launch path (the pin-memory thread, a loader, another Python thread:
                       the GIL or a lock it held) or a timer woke it (CPython's timed GIL wait:
                       5 ms, then it asks the holder to drop it), beyond the twin's; from the
                       kernel's scheduler record (trace.sched_events), else NaN
  peer_wait            exposed wait in the compute span for the last rank to reach a bucket
  transfer             exposed collective time from the last arrival on (its own work)
  gpu_slowdown         GPU kernel busy time beyond the twin's (CUPTI runs only, else NaN)
  unattributed         inflation minus the parts above, signed
  ===================  =======================================================================

Why these add up (host clock, CPU and gloo): the main thread's wall time in the compute span
is its on-CPU time + run-queue wait + time blocked; it blocks at the end of the backward pass
for the buckets still in flight, which is the exposed peer wait + transfer. What is left
unattributed is the rest of its blocked time (intra-op pool threads, allocator; with
the kernel's scheduler record, the sleeps that a thread off the launch path or a timer
ended are host_blocked) and the counters' read cost. On a GPU the compute span is GPU time: a launch
delay while the GPU still has queued work costs it nothing, and CUPTI kernel time overlaps the
host parts, so there ``unattributed`` goes negative by what the GPU hid; it is always shown,
never spread.

Baselines are the twin's *means* over its steady-state steps, not medians: means add up, so the
baselines of the parts sum to the baseline of their sum and ``unattributed`` is exact arithmetic.
The twins are those of the run's own *block* (``runlevel.runs_blocks``, the key compare pairs
by), so that drift between machines and over time is not counted as inflation; a run whose
block holds none of its twins is decomposed against all of them and its ``twin_status`` says
so (``compare.ACROSS_BLOCKS``), as compare's rows do. Runs without any block information share
the block "" and so keep all their twins, as before blocks existed.

Arrivals: a bucket's arrival is, on CUDA ranks with ``events/comm_gpu``, the GPU start of its
collective (the CUDA event before it, placed on the host clock by the step's start event);
otherwise the host's enqueue of the bucket (the DDP comm hook), which on CUDA runs ahead of the
GPU. ``arrival_clock`` ("gpu" or "host") says which a step used. Ranks of one node share
CLOCK_MONOTONIC; across nodes the merge put every rank on rank 0's clock through a measured
offset (``codl.trace.clock``), and ``peer_wait_bound_ms`` bounds what that offset's error can do
to the peer wait (0 on one node; NaN parts for traces without a measured offset).
Traces without ``events/phase_sched`` (recorded before it existed) fall back to the per-step
schedstat samples, which cover the whole step (the batch hand-off included);
``host_source`` ("compute span" or "whole step") says which, and only the first is a budget.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.analysis import compare as cmp
from codl.analysis import offcpu
from codl.analysis.columns import KEYS
from codl.analysis.intervals import interval_union
from codl.analysis.runlevel import mean_interval, runs_blocks
from codl.analysis.steady import steady
from codl.analysis.summarize import role_rows, role_times, sched_deltas, thread_roles
from codl.spec import Mode
from codl.trace.schema import Phase, Table

# Threads whose delay delays the GPU work of a step: the main thread launches the forward and
# optimizer kernels, the autograd engine's device thread launches the backward.
LAUNCH_ROLES = ("launch", "autograd")
# Threads of a rank off the launch path whose wake-up of a sleeping launch role hands back what
# it held: CPython's GIL (a thread that wants it sleeps until the holder drops it and signals)
# or another lock. Comm threads are left out: their wake-ups end the exposed peer wait and
# transfer, which have their own parts.
HOLDER_ROLES = ("pin_memory", "loader", "other")
# Waker 0: an interrupt on an idle CPU, i.e. a timer. A thread that wants the GIL sleeps at most
# the switch interval (5 ms), then asks the holder to drop it: on two H200s with pinned memory
# the launch roles' timer-ended sleeps were 5.06 ms at the median, 2-3 per step, and absent
# without the pin-memory thread. The harness waits for the GPU by spinning, not by sleeping
# until its interrupt, so a timer here is not the device.
TIMER_WAKER = 0
PARTS = (
    "host_launch_delay_ms",
    "host_blocked_ms",
    "peer_wait_ms",
    "transfer_ms",
    "gpu_slowdown_ms",
)
# A twin without the data component: what the loader added is what the parts measure. A
# `combined` run's best twin still reduces its gradients (compute+comm); without one, the
# compute twin does, and the AllReduce then counts in full as inflation.
DECOMPOSITION_TWINS: dict[Mode, tuple[Mode, ...]] = {
    Mode.COMBINED: (Mode.COMPUTE_COMM, Mode.COMPUTE),
    Mode.DATA_COMPUTE: (Mode.COMPUTE,),
    Mode.COMPUTE_COMM: (Mode.COMPUTE,),
}
MODES = frozenset(m.value for m in Mode)
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
    "host_source": "object",
    "blocked_ms": "float64",
    "peer_wait_ms": "float64",
    "transfer_ms": "float64",
    "bucket_peer_wait_ms": "float64",
    "bucket_transfer_ms": "float64",
    "arrival_clock": "object",
    "straggler_rank": "float64",
    "gpu_kernel_ms": "float64",
    # Bound on peer_wait_ms's error from the clock alignment of the ranks compared.
    "peer_wait_bound_ms": "float64",
}
# Where the host part was measured (host_source) and which clock placed arrivals.
COMPUTE_SPAN, WHOLE_STEP = "compute span", "whole step"
GPU_CLOCK, HOST_CLOCK = "gpu", "host"
HOST_COLUMNS = ["launch_run_ms", "launch_wait_ms", "autograd_run_ms", "autograd_wait_ms"]


def _empty(columns: Mapping[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in columns.items()})


def _ms(x: Any) -> npt.NDArray[np.float64]:
    return np.asarray(x, dtype=np.float64) / 1e6


def _host_columns(d: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step) from per-thread (run_ns, wait_ns) rows with a ``role``: the launch
    roles' columns and their sum ``host_ms``. A role that did no work (no autograd thread: no
    backward, or CPU autograd on the main thread) has 0 there, not NaN."""
    out = role_times(d, LAUNCH_ROLES, ("run", "wait"))
    if out.empty:
        cols = [*HOST_COLUMNS, "host_ms"]
        return _empty({"rank": "int64", "step": "int64", **dict.fromkeys(cols, "float64")})
    out["host_ms"] = out[HOST_COLUMNS].sum(axis=1)
    return out.reset_index().astype({"rank": "int64", "step": "int64"})


def host_parts(
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    *,
    warmup: int,
    phase_sched: pd.DataFrame | None = None,
    deltas: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per (rank, step): on-CPU time and run-queue wait of the launch and autograd threads.

    From ``phase_sched`` (the counters at the compute phase's boundaries) where the trace has
    it: the host time inside the compute span (``host_source`` = "compute span"). Otherwise from
    the per-step samples, which cover the whole step (``host_source`` = "whole step");
    ``deltas``: their ``sched_deltas`` when the caller has them already.
    """
    empty = _empty(
        {"rank": "int64", "step": "int64", **dict.fromkeys([*HOST_COLUMNS, "host_ms"], "float64")}
    ).assign(host_source=pd.Series(dtype="object"))
    if threads.empty:
        return empty
    ps = phase_sched if phase_sched is not None else pd.DataFrame()
    if len(ps):
        ps = ps[(ps["phase"] == Phase.COMPUTE.value) & (ps["step"] >= warmup)]
    if len(ps):
        d = ps.assign(rank=ps["rank"].astype("int64"), tid=ps["tid"].astype("int64"))
        source = COMPUTE_SPAN
    else:
        d = sched_deltas(sched) if deltas is None else deltas
        source = WHOLE_STEP
    if not (d["step"].to_numpy() >= warmup).any():
        return empty
    out = _host_columns(role_rows(d, threads, LAUNCH_ROLES, ["run_ns", "wait_ns"], warmup))
    return out.assign(host_source=source) if len(out) else empty


BUCKET_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "bucket": "int64",
    "arrive_ns": "int64",
    "duration_ms": "float64",
    "peer_wait_ms": "float64",
    "transfer_ms": "float64",
    "last_rank": "int64",
    "arrival_clock": "object",
    "peer_wait_bound_ms": "float64",
}


def _arrivals(comm: pd.DataFrame, comm_gpu: pd.DataFrame | None) -> pd.DataFrame:
    """``comm`` with each bucket's arrival (``arrive_ns``) and collective duration
    (``duration_ns``) on one clock per (step, bucket): the GPU start of the collective when
    every rank has it (``events/comm_gpu``), the host enqueue otherwise."""
    c = comm.assign(
        rank=comm["rank"].astype("int64"),
        step=comm["step"].astype("int64"),
        bucket=comm["bucket"].astype("int64"),
    )
    key = ["rank", "step", "bucket"]
    host_dur = np.where(c["gpu_ns"] >= 0, c["gpu_ns"], c["end_ns"] - c["start_ns"])
    if comm_gpu is not None and len(comm_gpu):
        g = comm_gpu.astype({k: "int64" for k in key}).drop_duplicates(key, keep="last")
        g = g.rename(columns={"start_ns": "gpu_start_ns", "end_ns": "gpu_end_ns"})
        c = c.merge(g[[*key, "gpu_start_ns", "gpu_end_ns"]], on=key, how="left")
    else:
        c = c.assign(gpu_start_ns=np.nan, gpu_end_ns=np.nan)
    every = c["gpu_start_ns"].notna().groupby([c["step"], c["bucket"]]).transform("all")
    on_gpu = every.astype(bool).to_numpy()
    return c.assign(
        arrive_ns=np.where(on_gpu, c["gpu_start_ns"], c["start_ns"]).astype("int64"),
        duration_ns=np.where(on_gpu, c["gpu_end_ns"] - c["gpu_start_ns"], host_dur),
        arrival_clock=np.where(on_gpu, GPU_CLOCK, HOST_CLOCK),
    )


def bucket_waits(
    comm: pd.DataFrame,
    *,
    warmup: int,
    ranks_per_node: int,
    comm_gpu: pd.DataFrame | None = None,
    clock_bound_ns: Mapping[int, int] | None = None,
) -> pd.DataFrame:
    """Per (rank, step, bucket): the collective's duration split at the last rank's arrival.

    A bucket's collective cannot start before every rank has reached it, so rank r's
    ``peer_wait`` is (last arrival - r's arrival), at most its duration, and ``transfer`` the
    rest. Arrivals are GPU starts where measured, host enqueues otherwise (``arrival_clock``).
    ``duration`` is the GPU time when CUDA events measured it, host wall otherwise (as
    ``allreduce_ms``), so the parts of a step add up to its ``allreduce_ms``. Only ranks of one
    node (one clock) are compared, unless ``clock_bound_ns`` (``clock.rank_bounds``) says the
    trace put all ranks on one clock, each rank's times true to within its bound; then the
    bucket's ``peer_wait_bound_ms`` is this rank's bound plus the last rank's. Without it the
    buckets of a multi-node run get NaN parts.
    """
    c = comm[comm["step"] >= warmup]
    if c.empty:
        return _empty(BUCKET_COLUMNS)
    c = _arrivals(c, comm_gpu)
    c["node"] = 0 if clock_bound_ns is not None else c["rank"] // max(1, ranks_per_node)
    key = ["step", "bucket"]
    g = c.groupby(key)
    last = g["arrive_ns"].transform("max")
    one_clock = g["node"].transform("nunique") == 1
    first_last = g["arrive_ns"].idxmax()
    last_rank = pd.Series(c.loc[first_last.to_numpy(), "rank"].to_numpy(), index=first_last.index)
    c["last_rank"] = last_rank.reindex(pd.MultiIndex.from_frame(c[key])).to_numpy()
    wait = np.minimum(np.clip(last - c["arrive_ns"], 0, None), c["duration_ns"])
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


def exposed(b: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): the peer wait and transfer that lie *after* the rank's own last arrival.

    Until its last bucket is ready a rank still has backward work of its own, which hides a
    collective waiting meanwhile; from then on it can only wait, so the step's compute span
    grows by exactly the time a collective is still in flight. Both are unions over the buckets
    (a peer late for several buckets at once costs its lateness once, not once per bucket).
    Every bucket starts at or before the last arrival ``lo``, so each one's piece after ``lo``
    is [lo, its end) and their union is [lo, the latest end): one grouped max per step.
    """
    cols = {"rank": "int64", "step": "int64", "peer_wait_ms": "float64", "transfer_ms": "float64"}
    arrive = b["arrive_ns"].to_numpy(dtype=np.int64)
    wait_ms = b["peer_wait_ms"].to_numpy(dtype=np.float64)
    unknown = np.isnan(wait_ms)
    wait_end = arrive + np.round(np.where(unknown, 0.0, wait_ms) * 1e6).astype(np.int64)
    busy_end = arrive + np.round(b["duration_ms"].to_numpy(dtype=np.float64) * 1e6).astype(np.int64)
    g = pd.DataFrame(
        {
            "rank": b["rank"].to_numpy(),
            "step": b["step"].to_numpy(),
            "lo": arrive,
            "wait_end": wait_end,
            "busy_end": busy_end,
            "unknown": unknown,
        }
    ).groupby(KEYS)
    m = g.agg(
        lo=("lo", "max"),
        wait_end=("wait_end", "max"),
        busy_end=("busy_end", "max"),
        unknown=("unknown", "any"),
    )
    lo = m["lo"].to_numpy()
    wait = np.maximum(m["wait_end"].to_numpy() - lo, 0) / 1e6
    busy = np.maximum(m["busy_end"].to_numpy() - lo, 0) / 1e6
    transfer = np.maximum(busy - wait, 0.0)
    nan = m["unknown"].to_numpy()
    out = pd.DataFrame(
        {
            "rank": m.index.get_level_values("rank"),
            "step": m.index.get_level_values("step"),
            "peer_wait_ms": np.where(nan, np.nan, wait),
            "transfer_ms": np.where(nan, np.nan, transfer),
        }
    )
    return out.astype(cols)


def comm_parts(
    comm: pd.DataFrame,
    *,
    warmup: int,
    ranks_per_node: int,
    comm_gpu: pd.DataFrame | None = None,
    clock_bound_ns: Mapping[int, int] | None = None,
) -> pd.DataFrame:
    """Per (rank, step): the exposed peer wait and transfer (``exposed``: the parts of the
    compute span), their per-bucket sums (``bucket_*``: the parts of ``allreduce_ms``), the
    arrival clock, and ``straggler_rank``, the rank that arrived last at the bucket this rank
    waited longest in (NaN without waits). ``peer_wait_bound_ms`` is the sum of the buckets'
    bounds (see ``bucket_waits``): an upper bound for the exposed wait's clock error too."""
    b = bucket_waits(
        comm,
        warmup=warmup,
        ranks_per_node=ranks_per_node,
        comm_gpu=comm_gpu,
        clock_bound_ns=clock_bound_ns,
    )
    cols = {
        "rank": "int64",
        "step": "int64",
        "peer_wait_ms": "float64",
        "transfer_ms": "float64",
        "bucket_peer_wait_ms": "float64",
        "bucket_transfer_ms": "float64",
        "arrival_clock": "object",
        "straggler_rank": "float64",
        "peer_wait_bound_ms": "float64",
    }
    if b.empty:
        return _empty(cols)
    sums = b.groupby(KEYS)[["peer_wait_ms", "transfer_ms"]].sum(min_count=1)
    out = sums.rename(columns=lambda c: f"bucket_{c}")
    out["peer_wait_bound_ms"] = b.groupby(KEYS)["peer_wait_bound_ms"].sum(min_count=1)
    all_gpu = (b["arrival_clock"] == GPU_CLOCK).groupby([b["rank"], b["step"]]).all()
    out["arrival_clock"] = np.where(all_gpu.reindex(out.index), GPU_CLOCK, HOST_CLOCK)
    out = out.join(exposed(b).set_index(KEYS))
    waited = b[b["peer_wait_ms"] > 0]
    rows = waited.loc[waited.groupby(KEYS)["peer_wait_ms"].idxmax()]
    worst = rows.set_index(KEYS)["last_rank"]
    out["straggler_rank"] = worst.reindex(out.index).astype("float64")
    return out.reset_index().astype(cols)[list(cols)]


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


def launch_offcpu(
    app: pd.DataFrame,
    threads: pd.DataFrame,
    switch: pd.DataFrame,
    waking: pd.DataFrame,
    *,
    warmup: int,
) -> Iterator[tuple[int, pd.DataFrame, pd.DataFrame, pd.DataFrame]]:
    """Per rank with measured compute spans, from the kernel's scheduler record: (rank, its
    compute spans, its threads' roles, the off-CPU intervals of its launch roles)."""
    roles = thread_roles(threads)
    spans = app[(app["phase"] == Phase.COMPUTE.value) & (app["step"] >= warmup)]
    for rank, win in spans.groupby(spans["rank"].astype("int64")):
        mine = roles[roles["rank"] == rank]
        launch = mine.loc[mine["role"].isin(LAUNCH_ROLES), "tid"]
        on_rank = switch["rank"] == rank
        iv = offcpu.offcpu_intervals(switch[on_rank], waking[waking["rank"] == rank], launch)
        yield int(rank), win, mine, iv


def blocked_parts(
    app: pd.DataFrame,
    threads: pd.DataFrame,
    switch: pd.DataFrame | None,
    waking: pd.DataFrame | None,
    *,
    warmup: int,
) -> pd.DataFrame:
    """Per (rank, step): ``blocked_ms``, the time in the compute span in which the launch roles
    slept until a thread of ``HOLDER_ROLES`` or a timer woke them (union over the roles), from
    the kernel's scheduler record. Empty (the part NaN) for traces without it."""
    empty = _empty({"rank": "int64", "step": "int64", "blocked_ms": "float64"})
    if switch is None or waking is None or switch.empty or threads.empty:
        return empty
    frames = []
    for rank, win, mine, iv in launch_offcpu(app, threads, switch, waking, warmup=warmup):
        holders = mine.loc[mine["role"].isin(HOLDER_ROLES), "tid"]
        ns = offcpu.blocked_by_in_windows(iv, win, [*holders, TIMER_WAKER])
        frames.append(
            pd.DataFrame({"rank": rank, "step": win["step"].astype("int64"), "blocked_ms": _ms(ns)})
        )
    if not frames:
        return empty
    return pd.concat(frames, ignore_index=True)


def step_parts(
    tables: Mapping[str, pd.DataFrame],
    *,
    warmup: int,
    ranks_per_node: int = 1,
    clock_bound_ns: Mapping[int, int] | None = None,
    deltas: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The per-run decomposition inputs: one row per measured (rank, step) with a step span.
    ``events/phase_sched`` and ``events/comm_gpu`` are optional (older traces lack them);
    ``clock_bound_ns``: the trace's per-rank alignment bounds (``clock.rank_bounds``);
    ``deltas``: ``summarize.sched_deltas`` of ``samples/sched`` when the caller has them."""
    app = tables[Table.APP]
    st = app[(app["phase"] == Phase.STEP.value) & (app["step"] >= warmup)]
    base = (
        pd.DataFrame({"rank": st["rank"].astype("int64"), "step": st["step"].astype("int64")})
        .drop_duplicates()
        .sort_values(KEYS)
    )
    for part in (
        host_parts(
            tables[Table.SCHED],
            tables[Table.THREADS],
            warmup=warmup,
            phase_sched=tables.get(Table.PHASE_SCHED),
            deltas=deltas,
        ),
        comm_parts(
            tables[Table.COMM],
            warmup=warmup,
            ranks_per_node=ranks_per_node,
            comm_gpu=tables.get(Table.COMM_GPU),
            clock_bound_ns=clock_bound_ns,
        ),
        gpu_parts(tables[Table.CUDA], warmup=warmup),
        blocked_parts(
            tables[Table.APP],
            tables[Table.THREADS],
            tables.get(Table.SCHED_SWITCH),
            tables.get(Table.SCHED_WAKING),
            warmup=warmup,
        ),
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
    out["host_source"] = WHOLE_STEP
    return out


DECOMPOSITION_COLUMNS = (
    "run_id",
    "mode",
    "policy",
    "workers",
    "cupti",
    "cuda_api",
    "sched_events",
    "pin_memory",
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
    "allreduce_peer_wait_ms",
    "straggler_rank",
    "host_source",
    "arrival_clock",
    "peer_wait_bound_ms",
    # The run's block and whether its twins are of the same block ("ok") or not.
    "block",
    "twin_status",
)
# Absolute inputs whose twin means are the baselines of the parts.
_BASE = {
    "host_launch_delay_ms": "host_ms",
    "host_blocked_ms": "blocked_ms",
    "peer_wait_ms": "peer_wait_ms",
    "transfer_ms": "transfer_ms",
    "gpu_slowdown_ms": "gpu_kernel_ms",
}


_BUCKET_SUMS = ("bucket_peer_wait_ms", "bucket_transfer_ms")


def _twin(row: pd.Series, groups: Mapping[str, list[str]]) -> tuple[str, list[str]] | None:
    mode = str(row["mode"])
    twins = DECOMPOSITION_TWINS.get(Mode(mode), ()) if mode in MODES else ()
    for twin in twins:
        runs = cmp.twin_runs(row, twin, groups)
        if runs:
            return twin.value, runs
    return None


def block_twins(rid: str, twins: list[str], blocks: Mapping[str, str]) -> tuple[list[str], str]:
    """The twins of run ``rid`` to decompose against, and the status: those of its own block
    and "ok"; where its block has none, all of them and ``ACROSS_BLOCKS`` naming the blocks."""
    own = blocks.get(rid, "")
    same = [t for t in twins if blocks.get(t, "") == own]
    if same:
        return same, "ok"
    where = " ".join(sorted({blocks.get(t, "") or "?" for t in twins}))
    return twins, f"{cmp.ACROSS_BLOCKS}: run in {own or '?'}, twins in {where}"


def _baseline(twin: pd.DataFrame, col: str) -> float:
    """The twin's steady-state mean of ``col``. A twin that never reduces has spent 0 ms in
    peer wait and transfer (a measured zero); other parts it did not measure stay NaN."""
    vals = pd.to_numeric(twin[col], errors="coerce") if col in twin else pd.Series(dtype=float)
    if vals.notna().any():
        return float(vals.mean())
    if col in ("peer_wait_ms", "transfer_ms", "allreduce_ms", *_BUCKET_SUMS):
        return 0.0
    return float("nan")


def decompose(steps: pd.DataFrame, parts: pd.DataFrame, summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, rank, step) of every run that has a twin without the loader (or
    without the collective): inflation against the twin and its parts (module docstring)."""
    if steps.empty or summaries.empty or "mode" not in summaries:
        return pd.DataFrame(columns=list(DECOMPOSITION_COLUMNS))
    summaries = cmp.with_twin_ids(summaries)
    groups = cmp.groups_by_id(summaries)
    extra = [c for c in PART_COLUMNS if c not in KEYS]
    if len(parts) and "peer_wait_bound_ms" not in parts:
        # Parts written before clock alignment: their peer waits were one-clock or NaN.
        known = parts["peer_wait_ms"].notna()
        parts = parts.assign(peer_wait_bound_ms=np.where(known, 0.0, np.nan))
    # Parts written before a column existed (host_source, arrival_clock, ...): not measured.
    parts = parts.assign(**{c: np.nan for c in extra if c not in parts}) if len(parts) else parts
    st = steps.drop(columns=[c for c in extra if c in steps])
    merged = (
        st.merge(parts[["run_id", *KEYS, *extra]], on=["run_id", *KEYS], how="left")
        if len(parts)
        else st.assign(**dict.fromkeys(extra, np.nan))
    )
    by_run = {str(r): g for r, g in merged.groupby("run_id")}
    blocks = runs_blocks(summaries)
    out = []
    for _, r in summaries.iterrows():
        twin = _twin(r, groups)
        rid = str(r["run_id"])
        if twin is None or rid not in by_run:
            continue
        mode, every = twin
        runs, status = block_twins(rid, [t for t in every if t in by_run] or every, blocks)
        tw = steady(pd.concat([by_run[t] for t in runs if t in by_run], ignore_index=True))
        if tw.empty:
            continue
        g = by_run[rid].copy()
        base_compute = _baseline(tw, "compute_eff_ms")
        g["twin_mode"] = mode
        g["twin_runs"] = " ".join(runs)
        g["block"] = blocks.get(rid, "")
        g["twin_status"] = status
        g["twin_compute_eff_ms"] = base_compute
        g["compute_inflation_ms"] = g["compute_eff_ms"] - base_compute
        allreduce = g.get("allreduce_ms", np.nan)
        g["allreduce_inflation_ms"] = allreduce - _baseline(tw, "allreduce_ms")
        g["allreduce_peer_wait_ms"] = g["bucket_peer_wait_ms"] - _baseline(
            tw, "bucket_peer_wait_ms"
        )
        for part, col in _BASE.items():
            g[part] = g[col] - _baseline(tw, col)
        # Both the run's and the twin's peer waits carry their clocks' error.
        g["peer_wait_bound_ms"] += np.nan_to_num(_baseline(tw, "peer_wait_bound_ms"))
        # A host part measured over another span than the twin's is no difference of like
        # with like: the table says so instead of hiding it.
        sources = set(tw["host_source"].dropna()) | set(g["host_source"].dropna())
        if len(sources) > 1:
            g["host_source"] = "mixed: " + " / ".join(sorted(sources))
        # A part that was not measured (NaN) explains nothing; it does not void the others.
        g["unattributed_ms"] = g["compute_inflation_ms"] - g[list(PARTS)].sum(axis=1, min_count=0)
        if "outlier" not in g:
            g["outlier"] = False
        for col in (
            "world_size",
            "cuda_api",
            "cupti",
            "sched_events",
            "pin_memory",
            "workers",
            "policy",
        ):
            if col not in g:
                g[col] = r.get(col)
        out.append(g[list(DECOMPOSITION_COLUMNS)])
    if not out:
        return pd.DataFrame(columns=list(DECOMPOSITION_COLUMNS))
    return pd.concat(out, ignore_index=True)


def _sources(d: pd.DataFrame) -> str:
    """Where the rows' host part was measured; "whole step" for tables that predate the label."""
    got = sorted(set(d["host_source"].dropna().astype(str))) if "host_source" in d else []
    return " / ".join(got) or WHOLE_STEP


# A figure's bar groups: runs with the kernel's scheduler record or without pinned memory are
# other experiments (tables written before these columns existed group without them).
DECOMPOSITION_KEYS = (
    "mode",
    "policy",
    "workers",
    "world_size",
    "cupti",
    "cuda_api",
    "sched_events",
    "pin_memory",
)
OPTIONAL_KEYS = ("sched_events", "pin_memory")


# The fewest steps a "slowest 5 %" bar may rest on, pooled over the group's runs: below it the
# tail's mean is a handful of steps (one, in a short demo run) and its bar is not drawn.
MIN_TAIL_STEPS = 20
MEAN_COLUMNS = ("compute_inflation_ms", *PARTS, "unattributed_ms")
ACROSS = "across"


def _tail_label(tail: float) -> str:
    return f"slowest {round((1 - tail) * 100)} %"


def _group_keys(decomp: pd.DataFrame) -> list[str]:
    return [c for c in DECOMPOSITION_KEYS if c in decomp or c not in OPTIONAL_KEYS]


def decomposition_run_means(
    decomp: pd.DataFrame, *, tail: float = 0.95, blocks: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """Per ``DECOMPOSITION_KEYS`` group, view and run: the run's mean of the inflation and of
    each part over its steady-state steps ("all steps") and over its steps at or above the
    group's ``tail`` quantile of compute inflation (the group's slowest steps, pooled over its
    runs, so a run may have none). ``block``: the table's column where it has one, else
    ``blocks`` (run id -> block, ``runlevel.runs_blocks``), else ""; ``across``: whether the
    run's twins are not (all) of its block (``twin_status``)."""
    keys = _group_keys(decomp)
    cols = [*keys, "view", "run_id", "block", ACROSS, "steps", *MEAN_COLUMNS, "host_source"]
    if decomp.empty:
        return pd.DataFrame(columns=cols)
    # Parts a table has no column for were not measured (NaN), as decompose writes them.
    missing = [c for c in MEAN_COLUMNS if c not in decomp]
    d = steady(decomp).reindex(columns=[*decomp.columns, *missing])
    d["run_id"] = d["run_id"].astype(str)
    known = dict(blocks or {})
    mapped = d["run_id"].map(lambda r: known.get(r, ""))
    own = d["block"].fillna("").astype(str) if "block" in d else pd.Series("", index=d.index)
    d["block"] = own.where(own != "", mapped)
    status = d["twin_status"] if "twin_status" in d else pd.Series("ok", index=d.index)
    d[ACROSS] = status.fillna("ok").astype(str) != "ok"
    rows = []
    for k, g in d.groupby(keys, dropna=False):
        cut = g["compute_inflation_ms"].quantile(tail)
        for view, sel in (
            ("all steps", g),
            (_tail_label(tail), g[g["compute_inflation_ms"] >= cut]),
        ):
            for rid, r in sel.groupby("run_id"):
                means = r[list(MEAN_COLUMNS)].astype("float64").mean()
                rows.append(
                    {**dict(zip(keys, k, strict=True)), "view": view, "run_id": rid}
                    | {"block": str(r["block"].iloc[0]), ACROSS: bool(r[ACROSS].any())}
                    | {"steps": len(r)}
                    | {c: float(means.get(c, np.nan)) for c in MEAN_COLUMNS}
                    | {"host_source": _sources(r)}
                )
    return pd.DataFrame(rows, columns=cols)


def decomposition_means(
    decomp: pd.DataFrame,
    *,
    tail: float = 0.95,
    blocks: Mapping[str, str] | None = None,
    min_tail_steps: int = MIN_TAIL_STEPS,
) -> pd.DataFrame:
    """Per ``DECOMPOSITION_KEYS`` group and view ("all steps", and "slowest 5 %": the steps
    whose compute inflation is at or above the group's ``tail`` quantile): what the average
    step and what the slow steps are made of, at run level.

    Each value is the mean over blocks of the block's mean of its runs' means
    (``decomposition_run_means``), with a 95 % Student-t interval over blocks
    (``runlevel.mean_interval``; ``_ci_low``/``_ci_high``, NaN with one block); ``n_runs``,
    ``n_blocks``, ``steps`` (pooled) say what it rests on, ``across_blocks`` how many of the
    runs were decomposed against twins of other blocks. A tail of fewer than ``min_tail_steps``
    steps gets NaN values (``note`` says why): its mean would be one or two steps.
    ``host_source`` says where the group's host part was measured: only "compute span" makes
    a budget."""
    keys = _group_keys(decomp)
    ci = [f"{c}_{s}" for c in MEAN_COLUMNS for s in ("ci_low", "ci_high")]
    head = [*keys, "view", "steps", "n_runs", "n_blocks", ACROSS + "_blocks"]
    cols = [*head, *MEAN_COLUMNS, *ci, "host_source", "note"]
    if decomp.empty:
        return pd.DataFrame(columns=cols)
    per_run = decomposition_run_means(decomp, tail=tail, blocks=blocks)
    rows = []
    for k, g in per_run.groupby([*keys, "view"], dropna=False, sort=False):
        steps = int(g["steps"].sum())
        by_block = g.groupby("block")[list(MEAN_COLUMNS)].mean()
        row: dict[str, Any] = dict(zip([*keys, "view"], k, strict=True)) | {
            "steps": steps,
            "n_runs": g["run_id"].nunique(),
            "n_blocks": len(by_block),
            ACROSS + "_blocks": int(g[ACROSS].sum()),
            "host_source": " / ".join(
                sorted({p for s in g["host_source"] for p in str(s).split(" / ")})
            ),
            "note": "",
        }
        few = k[-1] != "all steps" and steps < min_tail_steps
        for c in MEAN_COLUMNS:
            m = mean_interval(by_block[c].dropna().tolist())
            row[c], row[f"{c}_ci_low"], row[f"{c}_ci_high"] = (
                (np.nan, np.nan, np.nan) if few else (m.mean, m.lo, m.hi)
            )
        if few:
            row["note"] = f"too few steps ({steps} < {min_tail_steps})"
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)
