"""Background load: how much of a run's own CPUs other processes used while it was measured.

A run on a machine that other jobs keep busy measures that machine's load, not the pipeline:
its compute-alone time and its ratios to its twins move with the neighbours. The trace holds
what tells the two apart: per-core busy ticks (``samples/cpu``, from /proc/stat) and the CPU
time of every thread of the run (``samples/sched``), both sampled at step boundaries.

Over the measured window (from the sample that closes the last warm-up step to the last one),
on each node the run's cores are the union of its threads' affinity masks (``threads``
``cpus_actual``; the trace's ``allowed_cpus`` when that is empty). Then::

    outside_cpu_share = max(0, busy - own) / (cores * window)

``busy`` the cores' user + system + other (nice, irq, softirq, steal) time, ``own`` the run's
threads' on-CPU time on that node (schedstat field 1, every rank on the node), ``window`` the
wall time between the samples. It is the fraction of the run's cores that something other than
the run kept busy; the largest over the run's nodes is reported. Steal counts: a hypervisor's
other guests take the CPUs as surely as a neighbour process. /proc/stat counts in ticks
(``os.sysconf('SC_CLK_TCK')``, 10 ms at 100 Hz), so a window of a few seconds on one core is
known to a few percent; a quiet run reads near 0, one core of a busy loop per run core near 1.
It counts what others used, not what the run was denied: a run that leaves its cores idle
(sleeps, data waits) reads high when others fill them, whether or not that slowed it.

``OUTSIDE_LOAD_FLAG`` marks a run (``background_load`` in the runs table): a fifth of its cores
taken by others is well above what the sampling itself and the tick granularity read on a quiet
machine, and well below what moves a CPU run's step time by a visible amount.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.pinning import parse_cpulist

#: A run whose cores were this busy with other processes (fraction of its cores over the
#: measured window) is flagged ``background_load``.
OUTSIDE_LOAD_FLAG = 0.2
#: The flag of a run, and of a comparison row whose run or twin is flagged (codl.figures
#: marks these runs).
FLAG_COLUMN = "background_load"
SHARE_COLUMN = "outside_cpu_share"
#: How the figures label a flagged run or comparison.
LOAD_MARK = "busy CPUs!"
_TICK_S = 1.0 / float(os.sysconf("SC_CLK_TCK"))


def _cpus(text: Any) -> frozenset[int]:
    try:
        return parse_cpulist(text) if isinstance(text, str) and text.strip() else frozenset()
    except ValueError:
        return frozenset()


def outside_cpu_share(
    cpu: pd.DataFrame,
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    attrs: Mapping[str, Any],
    *,
    warmup: int,
    ranks_per_node: int = 1,
) -> dict[str, Any]:
    """``{outside_cpu_share, background_load}`` of one run's tables (NaN and False when the
    trace has no per-core samples over a measured window: a level that did not sample them)."""
    none = {SHARE_COLUMN: np.nan, FLAG_COLUMN: False}
    if not len(cpu) or not len(sched):
        return none
    shares = []
    for ranks in _nodes(cpu, ranks_per_node):
        share = _node_share(cpu, sched, threads, attrs, ranks, warmup)
        if share is not None:
            shares.append(share)
    if not shares:
        return none
    share = float(max(shares))
    return {SHARE_COLUMN: share, FLAG_COLUMN: bool(share >= OUTSIDE_LOAD_FLAG)}


def core_sample_rows(cpu: pd.DataFrame, *, warmup: int) -> npt.NDArray[np.bool_]:
    """The rows of ``samples/cpu`` that ``outside_cpu_share`` reads: ``outside_cpu_share`` of
    those rows alone is that of the whole table. A long run has one row per core, rank and step
    (~5 x 10^6 at 10^9 events on 16 cores), of which the share needs each core's first and last
    sample of the measured window (all rows at those instants, whichever cores the run's
    masks then pick), its latest step there, and each rank's presence (ranks are grouped into
    nodes by position). The selection is idempotent, so a table read block by block can be
    reduced per block and once more at the end (``chunked.read_summary``)."""
    keep = np.zeros(len(cpu), dtype=np.bool_)
    if not len(cpu):
        return keep
    pos = np.arange(len(cpu))
    # Each rank's first row, whatever its step.
    keep[pos[~cpu["rank"].duplicated().to_numpy()]] = True
    measured = (cpu["step"] >= warmup - 1).to_numpy()
    m = cpu[measured]
    if len(m):
        by = m.groupby(["rank", "cpu"], sort=False)
        t = m["t_ns"]
        edge = (t == by["t_ns"].transform("min")) | (t == by["t_ns"].transform("max"))
        at = pos[measured]
        keep[at[edge.to_numpy()]] = True
        # A row of each core's latest step (its first, if several).
        latest = np.flatnonzero(by["step"].transform("max").to_numpy() == m["step"].to_numpy())
        again = m[["rank", "cpu"]].iloc[latest].duplicated().to_numpy()
        keep[at[latest[~again]]] = True
    return keep


def sched_sample_rows(
    cpu: pd.DataFrame,
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    attrs: Mapping[str, Any],
    *,
    warmup: int,
    ranks_per_node: int = 1,
) -> npt.NDArray[np.bool_]:
    """The rows of ``samples/sched`` that ``outside_cpu_share`` reads: its share of these
    rows alone is that of the whole table. Of a node's threads' samples inside its cores'
    window (``_thread_window``) it takes each thread's least and greatest on-CPU time, so
    those rows (all that hold either value) are kept, and the table's first row, as the
    share reads whether the table is empty. A long run holds ~4 x 10^6 samples per 10^9
    events (~0.3 GiB); ``steps.analysis.summarize_to`` keeps these once their per-step
    differences are made."""
    keep = np.zeros(len(sched), dtype=np.bool_)
    if not len(sched):
        return keep
    keep[0] = True
    if not len(cpu):
        return keep
    run = sched["run_ns"].to_numpy(np.int64)
    for ranks in _nodes(cpu, ranks_per_node):
        window = _core_window(cpu, threads, attrs, ranks, warmup)
        if window is None:
            continue
        at = np.flatnonzero(_thread_window(sched, ranks, warmup, int(window[0]["step"].max())))
        by = pd.Series(run[at]).groupby(sched["tid"].to_numpy()[at])
        ends = (run[at] == by.transform("min").to_numpy()) | (
            run[at] == by.transform("max").to_numpy()
        )
        keep[at[ends]] = True
    return keep


def _nodes(cpu: pd.DataFrame, ranks_per_node: int) -> list[set[int]]:
    """The ranks of each node that has core samples (ranks grouped by position)."""
    per_node = max(1, int(ranks_per_node))
    ranks = pd.Series(sorted(set(cpu["rank"])))
    return [{int(r) for r in group} for _, group in ranks.groupby(lambda i: i // per_node)]


def _core_window(
    cpu: pd.DataFrame,
    threads: pd.DataFrame,
    attrs: Mapping[str, Any],
    ranks: set[int],
    warmup: int,
) -> tuple[pd.DataFrame, npt.NDArray[np.int64]] | None:
    """A node's core samples that its share reads, and their distinct instants (None when
    fewer than two): those of one rank of the node (all ranks see the same /proc/stat), of
    the run's cores, from the one that closes the last warm-up step (step warmup - 1; -1 is
    before step 0) to the last."""
    th = threads[threads["rank"].isin(ranks)]
    cores: frozenset[int] = frozenset().union(*(_cpus(a) for a in th["cpus_actual"].unique()))
    cores = cores or _cpus(attrs.get("allowed_cpus"))
    rank = min(ranks)
    c = cpu[(cpu["rank"] == rank) & (cpu["step"] >= warmup - 1)]
    if cores:
        c = c[c["cpu"].isin(cores)]
    times = np.unique(c["t_ns"].to_numpy())
    return None if len(times) < 2 else (c, times)


def _thread_window(
    sched: pd.DataFrame, ranks: set[int], warmup: int, last_step: int
) -> npt.NDArray[np.bool_]:
    """The node's threads' samples of the cores' window: the same step boundaries (taken in
    the same call as the cores')."""
    step = sched["step"].to_numpy()
    return sched["rank"].isin(ranks).to_numpy() & (step >= warmup - 1) & (step <= last_step)


def _node_share(
    cpu: pd.DataFrame,
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    attrs: Mapping[str, Any],
    ranks: set[int],
    warmup: int,
) -> float | None:
    window = _core_window(cpu, threads, attrs, ranks, warmup)
    if window is None:
        return None
    c, times = window
    first, last = c[c["t_ns"] == times[0]], c[c["t_ns"] == times[-1]]
    busy_cols = ["user", "system", "other"]
    busy_s = (
        float(
            (
                last.set_index("cpu")[busy_cols].sum(axis=1)
                - first.set_index("cpu")[busy_cols].sum(axis=1)
            )
            .dropna()
            .sum()
        )
        * _TICK_S
    )
    n_cores = len(set(first["cpu"]) & set(last["cpu"]))
    window_s = (int(times[-1]) - int(times[0])) / 1e9
    if n_cores == 0 or window_s <= 0:
        return None
    s = sched[_thread_window(sched, ranks, warmup, int(c["step"].max()))]
    # Each thread's on-CPU time across the window it was sampled in (a thread that came or went
    # inside the window counts its part).
    run = s.groupby("tid")["run_ns"].agg(["min", "max"])
    own_s = float((run["max"] - run["min"]).clip(lower=0).sum()) / 1e9
    # Ticks are counted to one either way: a share a hair past 1 is that rounding.
    return min(1.0, max(0.0, busy_s - own_s) / (n_cores * window_s))


#: A twin whose step time varies this much (coefficient of variation over its steady-state
#: steps) is unstable, for the modes of ``STEADY_MODES``: compute alone reads 0.007-0.09 and
#: compute+comm 0.07-0.11 on the quiet H200 result sets (h200, h200x2, loop-h200). A loader's
#: steps vary by design, and so do AllReduce's alone (comm: 0.32 on those same quiet nodes).
UNSTABLE_CV = 0.25
STEADY_MODES = frozenset({"compute", "compute+comm"})


def unstable(runs: pd.DataFrame) -> pd.Series:
    """Per run (the runs table's rows): a mode of ``STEADY_MODES`` whose step time varies by
    ``UNSTABLE_CV`` or more."""
    steady = runs["mode"].astype(str).isin(STEADY_MODES) if "mode" in runs else False
    cv = pd.to_numeric(runs["step_ms_cv"], errors="coerce") if "step_ms_cv" in runs else np.nan
    return pd.Series(steady & (cv >= UNSTABLE_CV), index=runs.index, dtype=bool)


def flagged_runs(runs: pd.DataFrame) -> set[str]:
    """Run ids of the runs table flagged ``background_load`` (none for tables without it)."""
    if FLAG_COLUMN not in runs or "run_id" not in runs:
        return set()
    flag = runs[FLAG_COLUMN].astype(str).str.lower().isin({"true", "1"})
    return set(runs.loc[flag, "run_id"].astype(str))


def flag_comparison(comparison: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``comparison`` with ``background_load``: a row one of whose runs or twins had its cores
    busy with other processes, or whose twin is unstable (``unstable``)."""
    out = comparison.copy()
    if not len(out) or "runs" not in out:
        out[FLAG_COLUMN] = pd.Series(False, index=out.index, dtype=bool)
        return out
    loaded = flagged_runs(runs)
    shaky = set(runs.loc[unstable(runs), "run_id"].astype(str)) if "run_id" in runs else set()

    def ids(text: Any) -> set[str]:
        return set(str(text).split()) if isinstance(text, str) else set()

    twins = out["isolation_runs"] if "isolation_runs" in out else pd.Series("", index=out.index)
    out[FLAG_COLUMN] = [
        bool(ids(r) & loaded or ids(t) & (loaded | shaky))
        for r, t in zip(out["runs"], twins, strict=True)
    ]
    return out


def load_warnings(runs: pd.DataFrame, comparison: pd.DataFrame) -> list[str]:
    """What a results set's last lines say about background load: nothing when no run and no
    comparison row is flagged, else one line on the runs and one on the comparisons."""
    lines = []
    loaded = sorted(flagged_runs(runs))
    if loaded and SHARE_COLUMN in runs:
        share = pd.to_numeric(runs.loc[runs["run_id"].astype(str).isin(loaded), SHARE_COLUMN])
        lines.append(
            f"warning: {len(loaded)} of {runs['run_id'].nunique()} runs had their CPUs busy "
            f"with other processes ({SHARE_COLUMN} {share.min():.2f}-{share.max():.2f}, flag at "
            f">= {OUTSIDE_LOAD_FLAG:.2f}; column {FLAG_COLUMN} of runs.csv): their times "
            "measure this machine's load, not the pipeline; re-run them on a quiet machine"
        )
    if FLAG_COLUMN in comparison and len(comparison):
        flag = comparison[FLAG_COLUMN].astype(str).str.lower() == "true"
        if flag.any():
            lines.append(
                f"warning: {int(flag.sum())} of {len(comparison)} comparison rows rest on such "
                f"a run or on an unstable twin (step-time CV >= {UNSTABLE_CV:.2f}; column "
                f"{FLAG_COLUMN} of comparison.csv); figures mark them '{LOAD_MARK}'"
            )
    return lines
