"""Pure preparation of figure data: trace tables -> the frames ``figures.draw`` draws."""

from __future__ import annotations

import numpy as np
import pandas as pd

from codl.analysis import decompose as dec
from codl.analysis import offcpu
from codl.analysis.compare import HEADLINE_STAT, QUANTILES, arm_interval
from codl.analysis.load import FLAG_COLUMN, LOAD_MARK
from codl.analysis.runlevel import runs_blocks
from codl.analysis.summarize import sched_deltas
from codl.spec import Mode, Policy
from codl.trace.schema import Phase, Table

# The isolation modes: one component each, so no interference inside the run.
COMPONENT_MODES = (Mode.DATA.value, Mode.COMPUTE.value, Mode.COMM.value)
TIMELINE_COLUMNS = ["track", "role", "kind", "label", "phase", "start_ms", "end_ms"]


def api_latencies(cuda: pd.DataFrame, label: str, *, warmup: int, run_id: str = "") -> pd.DataFrame:
    """Every measured CUDA runtime API call as (label, run_id, name, us), for the latency CDF."""
    if cuda.empty:
        return pd.DataFrame(columns=["label", "run_id", "name", "us"])
    rt = cuda[(cuda["kind"].astype(str) == "runtime") & (cuda["step"] >= warmup)]
    return pd.DataFrame(
        {
            "label": label,
            "run_id": run_id,
            "name": rt["name"].astype(str).to_numpy(),
            "us": ((rt["end_ns"] - rt["start_ns"]) / 1e3).to_numpy(),
        }
    )


# One step-timeline row, keyed by TIMELINE_COLUMNS.
Row = dict[str, object]


def timeline_bars(tables: dict[str, pd.DataFrame], *, step: int, rank: int = 0) -> pd.DataFrame:
    """Bars of one step: app phases on the launch track, loader stages per worker, GPU phase
    durations (CUDA events) on a GPU track, AllReduce buckets, and the threads with the most
    run-queue wait during the step (``kind`` "wait").

    schedstat gives a thread's wait as a per-step total, not where in the step it fell, so a
    wait row is a duration (``start_ms`` 0, ``end_ms`` the total), never a position on the
    step's time axis; the plot draws it apart from the spans. Where the trace has the kernel's
    scheduler record (``trace.sched_events``), the launch roles' time off their CPU is drawn
    where it fell instead (``kind`` "offcpu", ``label`` its cause: see ``_offcpu_spans``).

    ``phase`` names the app phase (or loader stage) of a span so the plot can colour phases
    apart; it is empty for collectives and waits."""
    app = tables[Table.APP]
    app = app[(app["rank"] == rank)]
    st = app[(app["step"] == step) & (app["phase"] == Phase.STEP.value)]
    if st.empty:
        return pd.DataFrame(columns=TIMELINE_COLUMNS)
    window = (int(st["start_ns"].iloc[0]), int(st["end_ns"].iloc[0]))
    # Row order matters: the plot stacks tracks in order of first appearance.
    rows = [
        *_phase_spans(app, step, window),
        *_offcpu_spans(tables, rank, window),
        *_loader_spans(tables[Table.LOADER], rank, window),
        *_comm_spans(tables[Table.COMM], rank, step, window),
        *_wait_rows(tables[Table.SCHED], tables[Table.THREADS], rank, step),
    ]
    return pd.DataFrame(rows, columns=TIMELINE_COLUMNS)


def _span(
    track: str, role: str, label: str, a: int, b: int, window: tuple[int, int], phase: str = ""
) -> list[Row]:
    """One span row clipped to the step's window [t0, t1], in ms from t0; none if nothing of
    it falls inside (a list, so callers can splice it in)."""
    t0, t1 = window
    a, b = max(a, t0), min(b, t1)
    if b <= a:
        return []
    return [
        {
            "track": track,
            "role": role,
            "kind": "span",
            "label": label,
            "phase": phase,
            "start_ms": (a - t0) / 1e6,
            "end_ms": (b - t0) / 1e6,
        }
    ]


def _phase_spans(app: pd.DataFrame, step: int, window: tuple[int, int]) -> list[Row]:
    """App phases on the launch track, each followed by its GPU duration where measured.

    ``app`` is already one rank's; "step" is the window itself and "compute" spans the phases.
    """
    rows: list[Row] = []
    phases = app[(app["step"] == step) & ~app["phase"].astype(str).isin(["step", "compute"])]
    for _, r in phases.iterrows():
        phase = str(r["phase"])
        start = int(r["start_ns"])
        rows += _span("launch thread", "launch", phase, start, int(r["end_ns"]), window, phase)
        if r["gpu_ns"] >= 0:
            # The GPU view: duration from CUDA events, drawn from the phase's host start.
            rows += _span(
                "GPU (events)", "gpu", phase, start, start + int(r["gpu_ns"]), window, phase
            )
    return rows


def _loader_spans(loader: pd.DataFrame, rank: int, window: tuple[int, int]) -> list[Row]:
    """Loader stages overlapping the step in time, one track per worker (picked by time, not by
    step tag: workers prepare later batches while this step runs)."""
    t0, t1 = window
    ld = loader[(loader["rank"] == rank) & (loader["end_ns"] > t0) & (loader["start_ns"] < t1)]
    rows: list[Row] = []
    for _, r in ld.iterrows():
        stage = str(r["stage"])
        track = f"loader worker {int(r['worker'])}"
        rows += _span(track, "loader", stage, int(r["start_ns"]), int(r["end_ns"]), window, stage)
    return rows


def _comm_spans(comm: pd.DataFrame, rank: int, step: int, window: tuple[int, int]) -> list[Row]:
    """AllReduce buckets of the step on one collectives track, labelled by bucket."""
    comm = comm[(comm["rank"] == rank) & (comm["step"] == step)]
    rows: list[Row] = []
    for _, r in comm.iterrows():
        label = f"b{int(r['bucket'])}"
        rows += _span("collectives", "comm", label, int(r["start_ns"]), int(r["end_ns"]), window)
    return rows


# The causes of a launch role's time off its CPU, as the step timeline labels them.
OFFCPU_CAUSES = {
    "gil": "asleep: GIL or lock (woken by a thread off the launch path, or a timer)",
    "launch": "asleep: waiting for the other launch role",
    "comm": "asleep: waiting for a collective",
    "other": "asleep: other",
    "runnable": "runnable, not running (run queue)",
}
LAUNCH_TRACKS = {"launch": "launch thread", "autograd": "autograd thread"}


def _offcpu_spans(tables: dict[str, pd.DataFrame], rank: int, window: tuple[int, int]) -> list[Row]:
    """The launch roles' time off their CPU inside the step, at its real times, from the
    kernel's scheduler record: each sleep by what ended it, each run-queue wait as such."""
    switch, waking = tables.get(Table.SCHED_SWITCH), tables.get(Table.SCHED_WAKING)
    if switch is None or waking is None or switch.empty:
        return []
    threads = tables[Table.THREADS]
    mine = threads[threads["rank"] == rank].drop_duplicates("tid", keep="last")
    role = dict(zip(mine["tid"].astype("int64"), mine["role"].astype(str), strict=True))
    launch = [t for t, r in role.items() if r in LAUNCH_TRACKS]
    iv = offcpu.offcpu_intervals(
        switch[switch["rank"] == rank], waking[waking["rank"] == rank], launch
    )
    t0, t1 = window
    iv = iv[(iv["end_ns"] > t0) & (iv["start_ns"] < t1)]
    rows: list[Row] = []
    for _, r in iv.iterrows():
        track = LAUNCH_TRACKS[role[int(r["tid"])]]
        start, wake = int(r["start_ns"]), int(r["start_ns"]) + int(r["blocked_ns"])
        if r["blocked_ns"] > 0:
            cause = _sleep_cause(int(r["waker_tid"]), role)
            rows += _offcpu(track, role[int(r["tid"])], cause, start, wake, window)
        rows += _offcpu(track, role[int(r["tid"])], "runnable", wake, int(r["end_ns"]), window)
    return rows


def _sleep_cause(waker: int, role: dict[int, str]) -> str:
    if waker == dec.TIMER_WAKER or role.get(waker) in dec.HOLDER_ROLES:
        return "gil"
    return {"launch": "launch", "autograd": "launch", "comm": "comm"}.get(
        role.get(waker, ""), "other"
    )


def _offcpu(
    track: str, role: str, cause: str, a: int, b: int, window: tuple[int, int]
) -> list[Row]:
    return [
        r | {"kind": "offcpu", "label": cause, "phase": ""}
        for r in _span(track, role, cause, a, b, window)
    ]


def _wait_rows(sched: pd.DataFrame, threads: pd.DataFrame, rank: int, step: int) -> list[Row]:
    """The 8 threads with the most run-queue wait in the step, as per-step totals from 0."""
    d = sched_deltas(sched[sched["rank"] == rank], step=step)
    d = d[d["wait_ns"] > 0]
    # TIDs are per node: look threads up within this rank only.
    known = threads[threads["rank"] == rank].drop_duplicates("tid", keep="last").set_index("tid")
    rows: list[Row] = []
    for _, r in d.sort_values("wait_ns", ascending=False).head(8).iterrows():
        tid = int(r["tid"])
        role = str(known["role"].get(tid, "other")) if len(known) else "other"
        name = str(known["name"].get(tid, "")) if len(known) else ""
        rows.append(
            {
                "track": f"{role} {name} ({tid})",
                "role": role,
                "kind": "wait",
                "label": f"{r['wait_ns'] / 1e6:.2f} ms",
                "phase": "",
                "start_ms": 0.0,
                "end_ms": r["wait_ns"] / 1e6,
            }
        )
    return rows


#: Which multi-component mode's runs give a heat-map cell its throughput when several ran there.
THROUGHPUT_MODES = (
    Mode.COMBINED.value,
    Mode.DATA_COMPUTE.value,
    Mode.COMPUTE_COMM.value,
    Mode.DATA_SLEEP.value,
)


def heatmap_table(summary: pd.DataFrame, comparison: pd.DataFrame) -> pd.DataFrame:
    """Per (row, workers): median throughput of the multi-component runs and their count, and
    the compute inflation ratio at the headline statistic (p95: the effect lives in the tail)
    with its 95 % CI and run counts. ``row`` is the policy with the marks of ``run_marks``
    other than background load (``x2 ranks``, ``+API``, ``no pin``): runs of another rank
    count or tracing level get a row of their own, never a cell of the plain runs.

    Runs with CUDA tracing are left out where plain runs exist (tracing slows a run by itself),
    and where several modes fill one cell, ``combined`` wins: one comparison per cell, never a
    median of unlike ones (the throughput's mode: ``THROUGHPUT_MODES``, first present; ``mode``
    says which). ``busy_runs`` counts a cell's runs flagged ``background_load``,
    ``busy`` says its comparison is flagged."""
    cols = [
        "row",
        "policy",
        "workers",
        "mode",
        "throughput_samples_s",
        "runs",
        "busy_runs",
        "ratio",
        "ci_low",
        "ci_high",
        "n_runs",
        "n_isolation_runs",
        "busy",
    ]
    if summary.empty or not {"mode", "policy", "workers", "throughput_samples_s"} <= set(summary):
        return pd.DataFrame(columns=cols)
    multi = summary[~summary["mode"].isin(list(COMPONENT_MODES))]
    plain = multi[~instrumented(multi)]
    multi = plain if len(plain) else multi
    multi = multi.assign(row=_rows(multi), _busy=_flag(multi).astype(int))
    keys = ["row", "policy", "workers"]
    # One mode per cell, as for the ratio: a `data+sleep` run (a sleep in place of compute)
    # is another experiment than `data+compute`, and its throughput is not pooled with it.
    pref = {m: i for i, m in enumerate(THROUGHPUT_MODES)}
    multi = multi.assign(_pref=multi["mode"].astype(str).map(pref).fillna(len(pref)))
    multi = multi[multi["_pref"] == multi.groupby(keys)["_pref"].transform("min")]
    out = (
        multi.groupby(keys)
        .agg(
            throughput_samples_s=("throughput_samples_s", "median"),
            runs=("throughput_samples_s", "size"),
            busy_runs=("_busy", "sum"),
            mode=("mode", "first"),
        )
        .reset_index()
    )
    need = {"metric", "status", "ratio", "ci_low", "ci_high", "mode"}
    if len(comparison) and need <= set(comparison):
        c = comparison[(comparison["metric"] == "compute_eff_ms") & (comparison["status"] == "ok")]
        if "stat" in c:
            c = c[c["stat"] == HEADLINE_STAT]
        plain_c = c[~instrumented(c)]
        c = plain_c if len(plain_c) else c
        c = c.assign(
            _o=(c["mode"] == Mode.COMBINED.value).astype(int), row=_rows(c), busy=_flag(c)
        ).sort_values("_o", kind="stable")
        keep = ["ratio", "ci_low", "ci_high", "n_runs", "n_isolation_runs", "busy"]
        c = c.reindex(columns=[*keys, *keep])
        # tail(1), not last(): last() takes each column's last non-null, mixing rows.
        best = c.groupby(keys).tail(1)
        out = out.merge(best, on=keys, how="outer")
    return out.reindex(columns=cols)


# Runs with a costly tracing level are slower by themselves, runs without the loader's pinned
# memory are another experiment, runs of several ranks another job, and runs whose CPUs other
# processes kept busy (analysis.load) measured the machine: a label says so, so that no one
# compares across and no group pools them with the others.
TRACING_MARKS = (("cupti", "+CUPTI"), ("cuda_api", "+API"), ("sched_events", "+ftrace"))


def world_size(r: pd.Series) -> int | None:
    """The ranks of a row's run: ``world_size``, else ``nodes x ranks_per_node``."""
    for value in (r.get("world_size"), None):
        if value is not None and pd.notna(value):
            return int(value)
    try:
        return int(r.get("nodes")) * int(r.get("ranks_per_node"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def run_marks(r: pd.Series, *, ranks: bool = True, load: bool = True) -> list[str]:
    """The marks of a run's (or comparison's) row: ``x2 ranks``, tracing levels, ``no pin``,
    ``LOAD_MARK``; a figure groups rows by them, so no label pools unlike runs."""
    n = world_size(r) if ranks else None
    marks = [f"x{n} ranks"] if n is not None and n > 1 else []
    marks += [mark for col, mark in TRACING_MARKS if str(r.get(col)).lower() == "true"]
    # pin_memory is empty for modes without a loader (the normalisation of summarize).
    if str(r.get("pin_memory")).lower() == "false":
        marks.append("no pin")
    if load and str(r.get(FLAG_COLUMN)).lower() == "true":
        marks.append(LOAD_MARK)
    return marks


def _rows(df: pd.DataFrame) -> list[str]:
    return [" ".join([str(r["policy"]), *run_marks(r, load=False)]) for _, r in df.iterrows()]


def _flag(df: pd.DataFrame) -> pd.Series:
    if FLAG_COLUMN not in df:
        return pd.Series(False, index=df.index)
    return df[FLAG_COLUMN].astype(str).str.lower() == "true"


def with_run_flags(steps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with its runs' ``background_load`` (the runs table's), for the per-step figures
    that mark loaded runs; unchanged when either table lacks the columns."""
    if "run_id" not in steps or "run_id" not in runs or FLAG_COLUMN not in runs:
        return steps
    r = runs.drop_duplicates("run_id")
    flag = pd.Series(_flag(r).to_numpy(), index=r["run_id"].astype(str))
    return steps.assign(**{FLAG_COLUMN: steps["run_id"].astype(str).map(flag).fillna(False)})


# Instrumented runs (CUPTI, API callbacks, the kernel's scheduler record) are slower by
# themselves: a figure never pools them with plain runs, and a per-cell summary prefers the
# plain ones.
CUDA_TRACING_COLUMNS = ("cupti", "cuda_api")
INSTRUMENT_COLUMNS = (*CUDA_TRACING_COLUMNS, "sched_events")


def _truthy(s: pd.Series) -> pd.Series:
    return s.astype(str).str.lower() == "true"


def instrumented(df: pd.DataFrame, columns: tuple[str, ...] = INSTRUMENT_COLUMNS) -> pd.Series:
    """True where a row comes from a run with a costly tracing level (of ``columns``) on."""
    on = pd.Series(False, index=df.index)
    for col in columns:
        if col in df:
            on |= _truthy(df[col])
    return on


def order_key(mode: object, policy: object) -> tuple[int, int, str, str]:
    """Sort key in the order the study reads: modes as ``spec.Mode`` declares them (isolation
    first, then the pairs, then combined), policies as ``spec.Policy`` does (none first)."""
    modes = [m.value for m in Mode]
    policies = [p.value for p in Policy]
    m, p = str(mode), str(policy)
    mi = modes.index(m) if m in modes else len(modes)
    pi = policies.index(p) if p in policies else len(policies)
    return (mi, pi, m, p)


def _run_lists(col: pd.Series) -> list[list[str]]:
    return [str(v).split() if isinstance(v, str) else [] for v in col]


def _steady_values(steps: pd.DataFrame, run_ids: list[str], metric: str) -> list[np.ndarray]:
    out = []
    for rid in run_ids:
        g = steps[steps["run_id"] == rid]
        if "outlier" in g:
            g = g[~_truthy(g["outlier"])]
        v = pd.to_numeric(g[metric], errors="coerce").to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        if len(v):
            out.append(v)
    return out


def with_arm_intervals(headline: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``compare.headline`` rows plus ``isolation_ci_low/high`` and ``combined_ci_low/high``:
    the interval of each bar on its own (the comparison table has the interval of the ratio
    and of the difference, not of each arm). NaN where the steps table lacks the runs."""
    out = headline.copy()
    cols = ("isolation_ci_low", "isolation_ci_high", "combined_ci_low", "combined_ci_high")
    for c in cols:
        out[c] = np.nan
    need = {"runs", "isolation_runs", "metric", "stat", "status"}
    if out.empty or not need <= set(out) or steps.empty or "run_id" not in steps:
        return out
    for i, row in out.iterrows():
        metric = str(row["metric"])
        if row["status"] != "ok" or metric not in steps or row["stat"] not in QUANTILES:
            continue
        for arm, col in (("isolation", "isolation_runs"), ("combined", "runs")):
            ids = _run_lists(pd.Series([row[col]]))[0]
            lo, hi = arm_interval(_steady_values(steps, ids, metric), str(row["stat"]))
            out.loc[i, [f"{arm}_ci_low", f"{arm}_ci_high"]] = (lo, hi)
    return out


def timeline_run(summary: pd.DataFrame) -> str:
    """The run the step-timeline figure shows: among the combined runs (else data+compute),
    the one whose median step time is closest to the median of those runs' medians - a typical
    run, chosen by a rule rather than by file order. Runs with the kernel's scheduler record
    come first (their timeline places the launch roles' waits where they fell), then runs
    without any costly tracing; the loader's default pinned memory before runs without it.
    '' if none."""
    need = {"run_id", "mode", "step_ms_p50"}
    if summary.empty or not need <= set(summary):
        return ""
    for mode in (Mode.COMBINED.value, Mode.DATA_COMPUTE.value):
        runs = summary[(summary["mode"] == mode) & summary["step_ms_p50"].notna()]
        if runs.empty:
            continue
        none = pd.Series(False, index=runs.index)
        cuda = instrumented(runs, CUDA_TRACING_COLUMNS)
        record = instrumented(runs, ("sched_events",))
        unpinned = (
            runs["pin_memory"].astype(str).str.lower() == "false" if "pin_memory" in runs else none
        )
        for tier in (record & ~cuda & ~unpinned, record & ~cuda, ~instrumented(runs), ~none):
            if tier.any():
                runs = runs[tier]
                break
        med = runs["step_ms_p50"].median()
        ordered = runs.assign(_d=(runs["step_ms_p50"] - med).abs()).sort_values(["_d", "run_id"])
        return str(ordered["run_id"].iloc[0])
    return ""


def decomposition_runs(
    means: pd.DataFrame, decomposition: pd.DataFrame, runs: pd.DataFrame | None = None
) -> pd.DataFrame:
    """``decompose.decomposition_means`` plus ``runs``: how many runs each bar group pools; with
    the runs table, ``background_load`` where one of them is flagged (``analysis.load``)."""
    keys = [k for k in dec.DECOMPOSITION_KEYS if k in means and k in decomposition]
    if means.empty or "run_id" not in decomposition or not set(keys) <= set(decomposition):
        return means.assign(runs=np.nan) if not means.empty else means
    loaded = set()
    if runs is not None and FLAG_COLUMN in runs and "run_id" in runs:
        loaded = set(runs.loc[_flag(runs), "run_id"].astype(str))
    grouped = decomposition.assign(_busy=decomposition["run_id"].astype(str).isin(loaded))
    counts = (
        grouped.groupby(keys, dropna=False)
        .agg(run_id=("run_id", "nunique"), busy=("_busy", "any"))
        .reset_index()
    )

    def joined(df: pd.DataFrame) -> list[str]:
        # NaN keys (world_size of an old table) do not merge; their string form does.
        return ["|".join(map(str, row)) for row in df[keys].itertuples(index=False)]

    n_runs = dict(zip(joined(counts), counts["run_id"], strict=True))
    busy = dict(zip(joined(counts), counts["busy"], strict=True))
    out = means.assign(runs=[n_runs.get(k, np.nan) for k in joined(means)])
    if runs is not None and FLAG_COLUMN in runs:
        out[FLAG_COLUMN] = [bool(busy.get(k, False)) for k in joined(means)]
    return out


# The decomposition figure's rows: a bar group's (run-level mean and interval) or one run's.
GROUP_ROW, RUN_ROW = "group", "run"


def _with_twin_status(decomposition: pd.DataFrame, blocks: dict[str, str]) -> pd.DataFrame:
    """Tables written before decompose paired within blocks have no ``twin_status``: a run's
    twins crossed blocks where any twin's block (from the runs table) differs from its own."""
    if "twin_status" in decomposition or "twin_runs" not in decomposition or not blocks:
        return decomposition
    status = {}
    for rid, twins in decomposition.drop_duplicates("run_id")[["run_id", "twin_runs"]].values:
        own = blocks.get(str(rid), "")
        where = {blocks.get(t, "") for t in str(twins).split()}
        status[str(rid)] = "ok" if where == {own} else "across blocks"
    return decomposition.assign(twin_status=decomposition["run_id"].astype(str).map(status))


def decomposition_frame(decomposition: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The decomposition figure's frame: one ``GROUP_ROW`` per bar group and view
    (``decompose.decomposition_means`` at run level, blocks from the runs table where the
    decomposition table has none, plus ``decomposition_runs``' columns) and one ``RUN_ROW``
    per run of it (``decompose.decomposition_run_means``), told apart by ``row``."""
    blocks = runs_blocks(runs) if len(runs) else {}
    d = _with_twin_status(decomposition, blocks)
    means = dec.decomposition_means(d, blocks=blocks)
    groups = decomposition_runs(means, d, runs).assign(row=GROUP_ROW)
    per_run = dec.decomposition_run_means(d, blocks=blocks).assign(row=RUN_ROW)
    frames = [f for f in (groups, per_run) if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else groups
