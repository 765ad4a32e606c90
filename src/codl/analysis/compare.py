"""Isolation vs combined: match every multi-component run with its single-component twins.

Twins are found by spec identity, once, when a run is summarized (``twin_ids``): a run's group is
the id of its spec with the repeat set aside, and its twin in mode m is ``spec.with_mode(m)``,
normalised as run ids are (the `compute` twin of a `combined` run has no loader, so its loader
settings do not matter). The runs table carries, per twin mode, the run id of the twin of the
run's own block (same repeat, ``TWIN_COLUMNS``) and the group of that twin's repeats
(``TWIN_GROUP_COLUMNS``); pairing runs is a join on the groups, then on the block
(``with_twin_ids`` derives the ids from the spec columns for runs tables written before
summarize wrote them). ``own_block_twins`` checks the runs table's twins against its runs: a
twin its block lacks is left empty, never taken silently from another block, and ``TWIN_NOTE``
says so.

Interference lives in the tail, so every (run group, component, metric) gets one row per
statistic (``STATS``): p50, mean, p90, p95 and p99 of the steps, each as the mean over runs of the
per-run statistic; ``above_p99``, the fraction of steps above the twin's p99; and
``excess_share``, the share of the combined run's step time lost against its twin.

The headline interval is over runs (``RUN_LEVEL_COLUMNS``, design in codl.analysis.runlevel):
runs are paired with their twins inside a *block* (the runs of one repeat made back to back on
one machine in one invocation, ``runlevel.block_id``), each block gives one ratio of the
per-run statistics' means, and ``run_ratio`` with ``run_ci_low``/``run_ci_high`` is the
geometric mean of the block ratios with a Student-t interval on their logs (``run_diff``
likewise for differences); ``n_blocks`` counts the blocks.
Where no block holds both a run and its twins the row is kept, its ``status`` says the pair
crosses blocks, and its run-level values are unpaired (Welch on the logs): it is not a headline.
``ratio``/``ci_low``/``ci_high`` keep the older two-level bootstrap (runs, then steps within
runs), step-level detail that treats steps as independent and is too narrow when runs scatter
(tests/test_runlevel.py measures its coverage). Steps flagged as anomalous
(``steady.flag_outliers``) are left out on both sides by default and counted. Where the twin's
statistic is exactly 0 (the launch thread never waits alone) a ratio is undefined: ``effect``
then says ``difference`` and ``diff`` carries it - a measured zero is not "not measured".
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.analysis.columns import LOADING_MODES
from codl.analysis.runlevel import log_ratio_interval, mean_interval, runs_blocks, welch_interval
from codl.errors import ConfigError
from codl.spec import Mode, RunSpec

log = logging.getLogger(__name__)

# What each component is judged by; every metric is "larger is worse".
COMPONENT_METRICS: dict[str, tuple[str, ...]] = {
    "compute": ("compute_eff_ms", "launch_wait_ms", "launch_kernel_us_mean", "step_ms"),
    # Per-item worker service time, not data_wait_ms: in isolation `data` mode the whole step is
    # data wait, so its data wait measures loader capacity while a combined run's measures
    # how far the loader falls behind compute; the two are not the same quantity.
    "data": ("loader_item_ms",),
    "comm": ("allreduce_ms",),
    # The training step without its input pipeline: the twin of a multi-rank `combined` run that
    # differs from it only by the loader, so that compute and AllReduce inflation are measured
    # against the same DDP overlap (compute alone has no AllReduce hidden in its backward).
    "compute+comm": ("compute_eff_ms", "allreduce_ms", "launch_wait_ms", "step_ms"),
}


def twin_modes(mode: Mode) -> tuple[Mode, ...]:
    """The modes of a ``mode`` run's isolation twins: its spec components and, for a run that
    loads, computes and communicates, compute+comm. None for an isolation run."""
    if mode.is_isolation:
        return ()
    twins = list(mode.components)
    if mode.loads and mode.computes and mode.communicates:
        # Not a spec component: compute+comm is the twin of a multi-rank combined run without its
        # loader (see COMPONENT_METRICS), compared on top of the single-component twins.
        twins.append(Mode.COMPUTE_COMM)
    return tuple(twins)


def _compared_components(mode: Mode) -> tuple[str, ...]:
    """The components a run of ``mode`` is compared on, each named by its twin's mode."""
    if mode.is_isolation:
        return tuple(m.value for m in mode.components)
    # data+sleep sleeps where compute would run: spec.Mode lists compute among its components
    # because the sleep stands in for it, but there is no compute to compare with a twin.
    return tuple(m.value for m in twin_modes(mode) if not (m is Mode.COMPUTE and mode.sleeps))


# The modes' vocabulary comes from spec.Mode; the analysis reads modes as the strings stored in
# the tables, so these are its string views.
MODE_COMPONENTS: dict[str, tuple[str, ...]] = {m.value: _compared_components(m) for m in Mode}
ISOLATION_MODES = frozenset(m.value for m in Mode if m.is_isolation)
# Spec columns that identify a group of repeats.
GROUP_COLUMNS = (
    "device",
    "model",
    "batch_size",
    "image_size",
    "precision",
    "policy",
    "launch_cores",
    "nodes",
    "ranks_per_node",
    "backend",
    "comm_pattern",
    "tier",
    "cupti",
    "cuda_api",
    # The kernel's scheduler record costs ~0.6-1.3 us per context switch (benchmarks/results/
    # sched_events_cost*.csv): its runs are compared with each other only.
    "sched_events",
)
# The runs table's id of a run's group of repeats, and of its twins' groups, one column per mode
# that is some mode's twin (None where the run has no twin of that mode).
GROUP_ID = "group_id"
TWIN_MODES: tuple[Mode, ...] = tuple(m for m in Mode if any(m in twin_modes(x) for x in Mode))


def twin_column(mode: Mode | str) -> str:
    """The runs-table column holding the run id of a run's twin in ``mode`` in its own block."""
    return f"twin_{Mode(mode).value}"


def twin_group_column(mode: Mode | str) -> str:
    """The runs-table column holding the group id of a run's twin in ``mode`` (its repeats)."""
    return f"twin_group_{Mode(mode).value}"


TWIN_COLUMNS = tuple(twin_column(m) for m in TWIN_MODES)
TWIN_GROUP_COLUMNS = tuple(twin_group_column(m) for m in TWIN_MODES)
# Why a run's twin column is empty, or names a twin of another block ("" when all is well).
TWIN_NOTE = "twin_note"
# Read only by modes that load; replaced by NO_LOADER for the others (the normalisation).
LOADER_COLUMNS = ("workers", "prefetch_factor", "pin_memory", "handoff", "worker_nice")
NO_LOADER: tuple[Any, ...] = (0, None, None, None, None)
BOOTSTRAP = 2000
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
# Distribution statistics, each a mean over runs of the per-run statistic of the steps.
DISTRIBUTION_STATS = ("p50", "mean", "p90", "p95", "p99")
STATS = (*DISTRIBUTION_STATS, "above_p99", "excess_share")
# The statistic that carries an interference effect: it lives in the tail (docs/results-h200.md).
HEADLINE_STAT = "p95"
# Per-step times of the step's critical path, whose excess is time the run lost. Latencies of
# single calls (us) and per-item times are not, so they get no excess share.
STEP_TIME_METRICS = frozenset({"compute_eff_ms", "launch_wait_ms", "allreduce_ms", "step_ms"})
VALUE_COLUMNS = (
    "isolation",
    "combined",
    "ratio",
    "ci_low",
    "ci_high",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "effect",
    "run_ratio",
    "run_ci_low",
    "run_ci_high",
    "run_diff",
    "run_diff_ci_low",
    "run_diff_ci_high",
)
# The run-level (headline) values: over blocks of paired runs (see the module docstring).
RUN_LEVEL_COLUMNS = VALUE_COLUMNS[-6:]
# The status of a row whose runs and twins share no block (prefix; the blocks follow).
ACROSS_BLOCKS = "across blocks"
PER_STAT_COLUMNS = ("stat", "status", "steps", "isolation_steps")
RESULT_COLUMNS = (
    "mode",
    *GROUP_COLUMNS,
    *LOADER_COLUMNS,
    "component",
    "metric",
    "stat",
    "runs",
    "isolation_runs",
    "n_runs",
    "n_isolation_runs",
    "n_blocks",
    "steps",
    "isolation_steps",
    "flagged",
    "isolation_flagged",
    "status",
    *VALUE_COLUMNS,
)


def _norm(value: Any) -> Any:
    """A hashable, comparable form of a spec cell.

    Tables come back from parquet or CSV: a missing value may be None, NaN or pd.NA, and an
    integer column with a gap turns into floats. NaN != NaN would make two identical specs
    never match, so every missing value becomes None and integral floats become ints.
    """
    if value is None or value is pd.NA:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    return value


#: What a loader column is in a table written before it (the spec's default then).
LOADER_DEFAULTS: dict[str, Any] = {"handoff": "torch", "worker_nice": 0}


def _key(row: pd.Series, mode: str) -> tuple[Any, ...]:
    loader = (
        tuple(
            _norm(row.get(c)) if _norm(row.get(c)) is not None else LOADER_DEFAULTS.get(c)
            for c in LOADER_COLUMNS
        )
        if mode in LOADING_MODES
        else NO_LOADER
    )
    return (mode, *(_norm(row.get(c)) for c in GROUP_COLUMNS), *loader)


# One step-index resample of one run inside the replicates that picked it: (pick slot, run,
# replicate ids, an index matrix of shape (len(replicates), steps of the run)).
Draw = tuple[int, int, npt.NDArray[np.intp], npt.NDArray[np.intp]]


def draw_indices(lengths: Sequence[int], n: int, rng: np.random.Generator) -> list[Draw]:
    """n two-level bootstrap replicates of a set of runs with ``lengths`` steps each.

    Level 1 resamples runs with replacement; level 2 resamples the steps of every picked run
    independently (a run picked twice gets two different step resamples). Indices, not values,
    so that several columns of one run are resampled together (a metric and its step time).
    """
    g = len(lengths)
    picks = rng.integers(0, g, size=(n, g))
    draws: list[Draw] = []
    for j in range(g):
        for k, m in enumerate(lengths):
            sel = np.flatnonzero(picks[:, j] == k)
            if sel.size:
                draws.append((j, k, sel, rng.integers(0, m, size=(sel.size, m))))
    return draws


RunStat = Callable[[npt.NDArray[np.float64], npt.NDArray[np.intp]], npt.NDArray[np.float64]]


def replicate(
    groups: Sequence[npt.NDArray[np.float64]], draws: list[Draw], n: int, f: RunStat
) -> npt.NDArray[np.float64]:
    """Per replicate: the mean over the picked runs of ``f`` (per-run statistic of a 2-D array of
    resampled steps, one row per replicate; it also gets the replicate ids)."""
    total = np.zeros(n)
    for _, k, sel, idx in draws:
        total[sel] += f(groups[k][idx], sel)
    return total / len(groups)


def pooled_quantile(
    groups: Sequence[npt.NDArray[np.float64]], draws: list[Draw], n: int, q: float
) -> npt.NDArray[np.float64]:
    """Per replicate: the q-quantile of all resampled steps of the picked runs pooled."""
    width = max(len(a) for a in groups)
    pooled = np.full((n, width * len(groups)), np.nan)
    for j, k, sel, idx in draws:
        pooled[sel, j * width : j * width + idx.shape[1]] = groups[k][idx]
    return np.asarray(np.nanquantile(pooled, q, axis=1), dtype=np.float64)


def run_statistic(stat: str) -> Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]:
    """The per-run statistic of a quantile/mean ``stat`` along the last axis."""
    if stat == "mean":
        return lambda a: np.mean(a, axis=-1)
    q = QUANTILES[stat]
    return lambda a: np.quantile(a, q, axis=-1)


def _ignore_replicates(
    f: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
) -> RunStat:
    return lambda a, _s: f(a)


def point(groups: Sequence[npt.NDArray[np.float64]], stat: str) -> float:
    """Mean over runs of the per-run ``stat``."""
    f = run_statistic(stat)
    return float(np.mean([f(a) for a in groups]))


def _clean(runs: Sequence[npt.ArrayLike]) -> list[npt.NDArray[np.float64]]:
    arrays = [np.asarray(x, dtype=np.float64) for x in runs]
    return [a[~np.isnan(a)] for a in arrays if len(a[~np.isnan(a)])]


def _interval(draws: npt.NDArray[np.float64]) -> tuple[float, float]:
    d = draws[np.isfinite(draws)]
    if not len(d):
        return (np.nan, np.nan)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return (float(lo), float(hi))


def bootstrap_ratio(
    num: Sequence[npt.ArrayLike],
    den: Sequence[npt.ArrayLike],
    *,
    n: int = BOOTSTRAP,
    seed: int = 0,
    stat: str = "p50",
) -> tuple[float, float, float]:
    """Ratio of means of a per-run statistic (default: median), and its 95 % two-level
    bootstrap interval.

    ``num``/``den`` hold one array of per-step values per run; NaN steps and empty runs are
    dropped. NaN when the denominator is 0 (use ``compare_stats`` for the difference).
    Deterministic for a given seed.
    """
    r = compare_stats(num, den, n=n, seed=seed).get(stat)
    if r is None or not np.isfinite(r["ratio"]):
        return (np.nan, np.nan, np.nan)
    return (r["ratio"], r["ci_low"], r["ci_high"])


def arm_interval(
    groups: list[np.ndarray],
    stat: str | Callable[[np.ndarray], np.ndarray],
    *,
    n: int = BOOTSTRAP,
    seed: int = 0,
) -> tuple[float, float]:
    """95 % two-level bootstrap interval (runs, then steps) of the mean over runs of a per-run
    statistic (a ``compare`` statistic's name, or a function of the steps along the last axis):
    the same resampling ``compare`` uses for the ratio, applied to one arm."""
    if not groups:
        return (np.nan, np.nan)
    rng = np.random.default_rng(seed)
    f = run_statistic(stat) if isinstance(stat, str) else stat
    draws = draw_indices([len(a) for a in groups], n, rng)
    reps = replicate(groups, draws, n, lambda a, _sel: f(a))
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return (float(lo), float(hi))


def compare_stats(
    num: Sequence[npt.ArrayLike],
    den: Sequence[npt.ArrayLike],
    *,
    step_ms: Sequence[npt.ArrayLike] | None = None,
    n: int = BOOTSTRAP,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Every statistic of ``STATS`` for combined runs ``num`` against twin runs ``den``.

    Per statistic: ``isolation``, ``combined``, ``ratio`` with ``ci_low``/``ci_high``, and
    ``diff`` (combined - isolation) with ``diff_ci_low``/``diff_ci_high``. ``step_ms`` (aligned
    with ``num``, same NaN steps) enables ``excess_share``: (mean combined - mean twin) / mean
    combined step time. Empty dict when either side has no measured step.
    """
    numc, steps_c = _clean_with_steps(num, step_ms)
    denc = _clean(den)
    if not numc or not denc:
        return {}
    rng = np.random.default_rng(seed)
    dn = draw_indices([len(a) for a in numc], n, rng)
    dd = draw_indices([len(a) for a in denc], n, rng)
    out: dict[str, dict[str, float]] = {}
    for stat in DISTRIBUTION_STATS:
        f = run_statistic(stat)
        out[stat] = _stat_row(
            point(denc, stat),
            point(numc, stat),
            replicate(denc, dd, n, _ignore_replicates(f)),
            replicate(numc, dn, n, _ignore_replicates(f)),
        )
    # Tail weight: how often a combined step is slower than 99 % of the twin's steps (pooled
    # over its repeats, so that one slower repeat does not move the bar below the others).
    # The twin's own fraction (about 1 % by construction) is the reference it is compared with.
    thr = float(np.quantile(np.concatenate(denc), QUANTILES["p99"]))
    thr_d = pooled_quantile(denc, dd, n, QUANTILES["p99"])
    out["above_p99"] = _stat_row(
        float(np.mean([np.mean(a > thr) for a in denc])),
        float(np.mean([np.mean(a > thr) for a in numc])),
        replicate(denc, dd, n, lambda a, s: np.mean(a > thr_d[s, None], axis=-1)),
        replicate(numc, dn, n, lambda a, s: np.mean(a > thr_d[s, None], axis=-1)),
    )
    if steps_c is not None:
        out["excess_share"] = _excess_share(numc, denc, steps_c, dn, dd, n)
    return out


def _clean_with_steps(
    num: Sequence[npt.ArrayLike], step_ms: Sequence[npt.ArrayLike] | None
) -> tuple[list[npt.NDArray[np.float64]], list[npt.NDArray[np.float64]] | None]:
    """``num`` without NaN (and, with ``step_ms``, without the steps NaN in either) and empty
    runs; the step times aligned with it, or ``None`` without ``step_ms``."""
    if step_ms is None:
        return _clean(num), None
    pairs = [
        (np.asarray(a, dtype=np.float64), np.asarray(t, dtype=np.float64))
        for a, t in zip(num, step_ms, strict=True)
    ]
    keep = [(a[~np.isnan(a) & ~np.isnan(t)], t[~np.isnan(a) & ~np.isnan(t)]) for a, t in pairs]
    keep = [(a, t) for a, t in keep if len(a)]
    return [a for a, _ in keep], [t for _, t in keep]


def _stat_row(
    iso: float,
    comb: float,
    iso_d: npt.NDArray[np.float64],
    comb_d: npt.NDArray[np.float64],
    *,
    ratio: bool = True,
) -> dict[str, float]:
    """One statistic: both values, their ratio and difference, with bootstrap intervals."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = comb / iso if ratio and iso != 0 else np.nan
        lo, hi = _interval(comb_d / iso_d) if np.isfinite(r) else (np.nan, np.nan)
    dlo, dhi = _interval(comb_d - iso_d)
    return {
        "isolation": iso,
        "combined": comb,
        "ratio": float(r),
        "ci_low": lo,
        "ci_high": hi,
        "diff": comb - iso,
        "diff_ci_low": dlo,
        "diff_ci_high": dhi,
    }


def _excess_share(
    numc: Sequence[npt.NDArray[np.float64]],
    denc: Sequence[npt.NDArray[np.float64]],
    steps_c: Sequence[npt.NDArray[np.float64]],
    dn: list[Draw],
    dd: list[Draw],
    n: int,
) -> dict[str, float]:
    """(mean combined - mean twin) / mean combined step time, with its bootstrap interval."""
    total = point(steps_c, "mean")
    lost = point(numc, "mean") - point(denc, "mean")
    total_d = replicate(steps_c, dn, n, lambda a, _s: np.mean(a, axis=-1))
    lost_d = replicate(numc, dn, n, lambda a, _s: np.mean(a, axis=-1)) - replicate(
        denc, dd, n, lambda a, _s: np.mean(a, axis=-1)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        share_d = lost_d / total_d
    share = lost / total if total else np.nan
    # A share has no twin value of its own: isolation is 0 and the difference carries it.
    return _stat_row(0.0, share, np.zeros(n), share_d, ratio=False)


def _describe_missing(row: pd.Series, comp: str) -> str:
    loader = "" if comp not in LOADING_MODES else f", workers={_norm(row.get('workers'))}"
    return (
        f"missing isolation run: mode={comp} with model={row.get('model')}, "
        f"batch_size={_norm(row.get('batch_size'))}, policy={row.get('policy')}{loader}, "
        f"layout {_norm(row.get('nodes'))}x{_norm(row.get('ranks_per_node'))} "
        f"({row.get('backend')}), cupti={row.get('cupti')}, "
        f"cuda_api={row.get('cuda_api')} is not in the run set"
    )


def group_id(spec: RunSpec) -> str:
    """The id the repeats of ``spec`` share: the run id of its repeat 0."""
    return dataclasses.replace(spec, repeat=0).run_id


def twin_ids(spec: Mapping[str, Any]) -> dict[str, str | None]:
    """``GROUP_ID`` and every ``TWIN_COLUMNS`` entry of the run whose spec is ``spec`` (plain data,
    as a trace stores it). All None when there is no spec or it is not a valid one (a runs table
    with such a row is paired by its spec columns, ``with_twin_ids``)."""
    out: dict[str, str | None] = {
        GROUP_ID: None,
        **dict.fromkeys(TWIN_COLUMNS),
        **dict.fromkeys(TWIN_GROUP_COLUMNS),
    }
    if not spec:
        return out
    try:
        run = RunSpec.from_dict(spec)
    except ConfigError:
        return out
    out[GROUP_ID] = group_id(run)
    for mode in twin_modes(run.mode):
        # Same repeat, so the same block: the twin the run is paired with.
        out[twin_column(mode)] = run.with_mode(mode).run_id
        out[twin_group_column(mode)] = group_id(run.with_mode(mode))
    return out


def _legacy_id(key: tuple[Any, ...]) -> str:
    return repr(key)


def _legacy_twin_ids(summaries: pd.DataFrame) -> pd.DataFrame:
    """Group and twin ids from the spec columns, by the rule runs were paired by before the runs
    table carried ids: equal ``GROUP_COLUMNS`` (and ``LOADER_COLUMNS`` for modes that load).
    The twin run of each run is then the one of its twin group in its block, where there is one
    (``own_block_twins``)."""
    ids: dict[str, list[Any]] = {c: [] for c in (GROUP_ID, *TWIN_GROUP_COLUMNS)}
    for _, row in summaries.iterrows():
        mode = str(row["mode"])
        ids[GROUP_ID].append(_legacy_id(_key(row, mode)))
        twins = twin_modes(Mode(mode)) if mode in MODE_COMPONENTS else ()
        for m in TWIN_MODES:
            ids[twin_group_column(m)].append(_legacy_id(_key(row, m.value)) if m in twins else None)
    # copy(): one block per dtype; a wide table read from CSV and assigned to column by column
    # would fragment (pandas' PerformanceWarning).
    return summaries.copy().assign(**ids, **dict.fromkeys(TWIN_COLUMNS)).pipe(_twins_of_blocks)


def with_twin_ids(summaries: pd.DataFrame) -> pd.DataFrame:
    """The runs table with ``GROUP_ID``, ``TWIN_COLUMNS`` and ``TWIN_GROUP_COLUMNS``: as summarize
    wrote them, or, for a table written before it did (or with a run whose trace held no valid
    spec), derived for every run from its spec columns. Tables written before the group columns
    held group ids in ``TWIN_COLUMNS``: these become the groups, and the twin of the run's block
    is looked up among their runs."""
    written = GROUP_ID in summaries and set(TWIN_COLUMNS) <= set(summaries)
    if not (written and summaries[GROUP_ID].notna().all()):
        return _legacy_twin_ids(summaries)
    if set(TWIN_GROUP_COLUMNS) <= set(summaries):
        return summaries
    groups = {twin_group_column(m): summaries[twin_column(m)] for m in TWIN_MODES}
    return summaries.assign(**groups).pipe(_twins_of_blocks)


def _twins_of_blocks(ids: pd.DataFrame) -> pd.DataFrame:
    """``TWIN_COLUMNS`` set, where empty or naming a run of another block, to the run of the twin
    group in the run's own block, if the table has one."""
    groups = groups_by_id(ids)
    blocks = runs_blocks(ids)
    out = ids.copy()
    for m in TWIN_MODES:
        col = twin_column(m)
        values = []
        for _, row in ids.iterrows():
            own = blocks.get(str(row["run_id"]), "")
            now = _norm(row.get(col))
            if now is not None and str(now) in blocks and blocks[str(now)] == own:
                values.append(str(now))
                continue
            same = [t for t in twin_runs(row, m, groups) if blocks.get(t, "") == own]
            values.append(same[0] if same else now)
        out[col] = pd.Series(values, index=ids.index, dtype=object)
    return out


def own_block_twins(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs table as written: ids (``with_twin_ids``), every ``TWIN_COLUMNS`` entry the twin
    run of the run's own block, and ``TWIN_NOTE`` naming each twin that is not: one its block
    lacks is left empty (with the blocks that hold that twin's repeats, if any), one that ran in
    another block is named with that block. Each note is logged as a warning too: a pair across
    blocks is never silent."""
    if runs.empty or "run_id" not in runs or "mode" not in runs:
        return runs
    ids = with_twin_ids(runs)
    groups = groups_by_id(ids)
    blocks = runs_blocks(ids)
    twins: dict[str, list[Any]] = {c: [] for c in TWIN_COLUMNS}
    notes = []
    for _, row in ids.iterrows():
        rid = str(row["run_id"])
        own = blocks.get(rid, "")
        said = []
        world = _norm(row.get("world_size")) or 1
        for m in TWIN_MODES:
            twin = _norm(row.get(twin_column(m)))
            if twin is not None and m.communicates and world < 2 and str(twin) not in blocks:
                # A single rank does no collective: compare has no comm twin to pair it with.
                twin = None
            elif twin is not None and str(twin) not in blocks:
                where = sorted({blocks.get(t, "") or "?" for t in twin_runs(row, m, groups)})
                held = f"; its repeats ran in {' '.join(where)}" if where else ""
                said.append(f"no {m.value} twin in block {own or '?'} ({twin} did not run){held}")
                twin = None
            elif twin is not None and blocks[str(twin)] != own:
                said.append(f"{m.value} twin {twin} ran in block {blocks[str(twin)] or '?'}")
            twins[twin_column(m)].append(None if twin is None else str(twin))
        notes.append("; ".join(said))
        if said:
            log.warning("run %s: %s", rid, "; ".join(said))
    out = ids.assign(**{c: pd.Series(v, index=ids.index, dtype=object) for c, v in twins.items()})
    return out.assign(**{TWIN_NOTE: notes})


def groups_by_id(ids: pd.DataFrame) -> dict[str, list[str]]:
    """Group id -> run ids of its repeats, of a table with ``GROUP_ID`` (``with_twin_ids``)."""
    by_id: dict[str, list[str]] = {}
    for gid, rid in zip(ids[GROUP_ID], ids["run_id"], strict=True):
        by_id.setdefault(str(gid), []).append(str(rid))
    return by_id


def twin_runs(row: pd.Series, mode: Mode | str, groups: Mapping[str, list[str]]) -> list[str]:
    """The run ids of ``row``'s twin in ``mode``, every repeat (a join on the twin's group id;
    a row without it, as summaries written before ``TWIN_GROUP_COLUMNS`` have, joins on the
    group id its ``TWIN_COLUMNS`` entry then held: summarize writes both or neither)."""
    gid = _norm(row.get(twin_group_column(mode)))
    if gid is None:
        gid = _norm(row.get(twin_column(mode)))
    return list(groups.get(str(gid), [])) if gid is not None else []


def column_key(row: pd.Series, mode: str) -> tuple[Any, ...]:
    """The key of ``row``'s spec columns in ``mode`` (``GROUP_COLUMNS``, and ``LOADER_COLUMNS``
    for a mode that loads): how runs tables without ids are paired (``with_twin_ids``)."""
    return _key(row, mode)


def compare(steps: pd.DataFrame, summaries: pd.DataFrame, *, steady: bool = True) -> pd.DataFrame:
    """One row per (multi-component run group, component, metric, statistic) with the isolation
    and combined values, ratio and difference, and their 95 % bootstrap intervals.

    With ``steady`` (the default), steps flagged ``outlier`` are left out on both sides;
    ``flagged``/``isolation_flagged`` count them. Groups whose isolation twin is missing get
    a row with ``status`` naming what is missing rather than silently disappearing. Repeats (and
    nothing else) of one spec form a group.
    """
    if summaries.empty or "mode" not in summaries:
        return pd.DataFrame(columns=list(RESULT_COLUMNS))
    ids = with_twin_ids(summaries)
    groups = groups_by_id(ids)
    blocks = runs_blocks(ids)
    values: dict[str, pd.DataFrame] = (
        {str(rid): g for rid, g in steps.groupby("run_id")} if "run_id" in steps else {}
    )
    rows: list[dict[str, Any]] = []
    done: set[str] = set()
    for _, r in ids.iterrows():
        mode = str(r["mode"])
        gid = str(r[GROUP_ID])
        if mode in ISOLATION_MODES or mode not in MODE_COMPONENTS or gid in done:
            continue
        done.add(gid)
        runs = groups[gid]
        world = _norm(r.get("world_size"))
        # Single-rank runs do no collective, so there is no comm component to compare.
        comps = [
            c
            for c in MODE_COMPONENTS[mode]
            if not (c in ("comm", "compute+comm") and (world or 1) < 2)
        ]
        for comp in comps:
            twins = twin_runs(r, comp, groups)
            for metric in COMPONENT_METRICS[comp]:
                base: dict[str, Any] = {
                    "mode": mode,
                    **{c: r.get(c) for c in GROUP_COLUMNS},
                    **{c: r.get(c) for c in LOADER_COLUMNS},
                    "component": comp,
                    "metric": metric,
                    "runs": " ".join(runs),
                    "isolation_runs": " ".join(twins),
                    "n_runs": len(runs),
                    "n_isolation_runs": len(twins),
                    "flagged": _flagged(values, runs),
                    "isolation_flagged": _flagged(values, twins),
                }
                rows += _metric_rows(
                    base, values, (runs, twins, blocks), metric, r, comp, steady=steady
                )
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


def _metric_rows(
    base: dict[str, Any],
    values: dict[str, pd.DataFrame],
    pairing: tuple[list[str], list[str], Mapping[str, str]],
    metric: str,
    row: pd.Series,
    comp: str,
    *,
    steady: bool,
) -> list[dict[str, Any]]:
    runs, twins, blocks = pairing
    empty = dict.fromkeys(VALUE_COLUMNS, np.nan)
    if not twins:
        # One row per statistic whatever the status: filtering on `stat` never hides a gap.
        missing = _describe_missing(row, comp)
        return [base | empty | {"stat": st, "status": missing, "n_blocks": 0} for st in STATS]
    num = [_col(values, rid, metric, steady) for rid in runs]
    den = [_col(values, rid, metric, steady) for rid in twins]
    step_ms = None
    if metric in STEP_TIME_METRICS:
        step_ms = [_col(values, rid, "step_ms", steady) for rid in runs]
        if any(len(t) != len(a) for t, a in zip(step_ms, num, strict=True)):
            step_ms = None
    stats = compare_stats(num, den, step_ms=step_ms)
    counts = {
        "steps": int(sum(np.isfinite(a).sum() for a in num)),
        "isolation_steps": int(sum(np.isfinite(a).sum() for a in den)),
    }
    if not stats:
        return [
            base | empty | counts | {"stat": st, "status": "metric not measured", "n_blocks": 0}
            for st in STATS
        ]
    level, n_blocks, status = run_level_stats(
        [(blocks.get(r, ""), a) for r, a in zip(runs, num, strict=True)],
        [(blocks.get(r, ""), a) for r, a in zip(twins, den, strict=True)],
        step_ms,
    )
    out = []
    for stat, v in stats.items():
        effect = "ratio" if np.isfinite(v["ratio"]) else "difference"
        extra = {"stat": stat, "status": status, "effect": effect, "n_blocks": n_blocks}
        out.append(base | counts | v | level.get(stat, {}) | extra)
    return out


BlockRuns = Sequence[tuple[str, npt.NDArray[np.float64]]]


def _per_run_values(
    num: BlockRuns, den: BlockRuns, step_ms: Sequence[npt.NDArray[np.float64]] | None
) -> dict[str, tuple[list[tuple[str, float]], list[tuple[str, float]]]]:
    """Per statistic: (block, value) of every combined run and of every twin run. ``above_p99``
    counts steps above the p99 of the twins of the run's own block (all twins where the block
    has none); ``excess_share`` is per combined run against the twins' mean of its block."""
    c = [(b, a[np.isfinite(a)]) for b, a in num]
    d = [(b, a[np.isfinite(a)]) for b, a in den]
    c = [(b, a) for b, a in c if len(a)]
    d = [(b, a) for b, a in d if len(a)]
    out: dict[str, tuple[list[tuple[str, float]], list[tuple[str, float]]]] = {}
    for stat in DISTRIBUTION_STATS:
        f = run_statistic(stat)
        out[stat] = ([(b, float(f(a))) for b, a in c], [(b, float(f(a))) for b, a in d])
    pooled = np.concatenate([a for _, a in d])
    thr = {
        b: float(np.quantile(np.concatenate([a for bb, a in d if bb == b]), QUANTILES["p99"]))
        for b in {b for b, _ in d}
    }
    p99 = float(np.quantile(pooled, QUANTILES["p99"]))
    out["above_p99"] = (
        [(b, float(np.mean(a > thr.get(b, p99)))) for b, a in c],
        [(b, float(np.mean(a > thr[b]))) for b, a in d],
    )
    if step_ms is not None:
        all_twins = float(np.mean([a.mean() for _, a in d]))
        twin_mean = {b: float(np.mean([a.mean() for bb, a in d if bb == b])) for b in thr}
        shares = []
        for (b, a), t in zip(num, step_ms, strict=True):
            ok = np.isfinite(a) & np.isfinite(t)
            if ok.any() and t[ok].mean():
                share = (a[ok].mean() - twin_mean.get(b, all_twins)) / t[ok].mean()
                shares.append((b, float(share)))
        out["excess_share"] = (shares, [(b, 0.0) for b, _ in d])
    return out


def run_level_stats(
    num: BlockRuns, den: BlockRuns, step_ms: Sequence[npt.NDArray[np.float64]] | None = None
) -> tuple[dict[str, dict[str, float]], int, str]:
    """The run-level values (``RUN_LEVEL_COLUMNS``) of every statistic, the number of blocks
    that pair runs with twins, and the status: "ok", or ``ACROSS_BLOCKS`` naming the blocks
    when none pairs (then the values are unpaired: Welch on the logs of the per-run values).

    ``num``/``den``: (block, per-step values) of each combined and each twin run. Per paired
    block, the ratio of the means of the per-run statistic; Student's t over blocks on the logs
    (``runlevel.log_ratio_interval``) and, for the difference, on the values.
    """
    per_run = _per_run_values(num, den, step_ms)
    both = sorted({b for b, _ in per_run["mean"][0]} & {b for b, _ in per_run["mean"][1]})
    out: dict[str, dict[str, float]] = {}
    for stat, (c, d) in per_run.items():
        out[stat] = (
            _paired_values(c, d, both, ratio=stat != "excess_share")
            if both
            else _unpaired_values(c, d, ratio=stat != "excess_share")
        )
    if both:
        return out, len(both), "ok"
    where = sorted({b or "?" for b, _ in num}), sorted({b or "?" for b, _ in den})
    status = f"{ACROSS_BLOCKS}: runs in {' '.join(where[0])}, twins in {' '.join(where[1])}"
    return out, 0, status


def _block_means(values: list[tuple[str, float]], blocks: Sequence[str]) -> list[float]:
    return [float(np.mean([v for b, v in values if b == blk])) for blk in blocks]


def _paired_values(
    c: list[tuple[str, float]], d: list[tuple[str, float]], blocks: Sequence[str], *, ratio: bool
) -> dict[str, float]:
    cm, dm = _block_means(c, blocks), _block_means(d, blocks)
    diff = mean_interval([x - y for x, y in zip(cm, dm, strict=True)])
    out = {"run_diff": diff.mean, "run_diff_ci_low": diff.lo, "run_diff_ci_high": diff.hi}
    ratios = [x / y for x, y in zip(cm, dm, strict=True) if y > 0 and x > 0]
    if ratio and len(ratios) == len(blocks):
        r = log_ratio_interval(ratios)
        return out | {"run_ratio": r.ratio, "run_ci_low": r.lo, "run_ci_high": r.hi}
    return out | {"run_ratio": np.nan, "run_ci_low": np.nan, "run_ci_high": np.nan}


def _unpaired_values(
    c: list[tuple[str, float]], d: list[tuple[str, float]], *, ratio: bool
) -> dict[str, float]:
    cv, dv = [v for _, v in c], [v for _, v in d]
    diff = welch_interval(cv, dv)
    out = {"run_diff": diff.mean, "run_diff_ci_low": diff.lo, "run_diff_ci_high": diff.hi}
    if ratio and all(v > 0 for v in (*cv, *dv)):
        lr = welch_interval(np.log(cv).tolist(), np.log(dv).tolist())
        return out | {
            "run_ratio": math.exp(lr.mean),
            "run_ci_low": math.exp(lr.lo),
            "run_ci_high": math.exp(lr.hi),
        }
    return out | {"run_ratio": np.nan, "run_ci_low": np.nan, "run_ci_high": np.nan}


def _flagged(values: dict[str, pd.DataFrame], runs: list[str]) -> int:
    return int(
        sum(
            values[r]["outlier"].fillna(False).astype(bool).sum()
            for r in runs
            if r in values and "outlier" in values[r]
        )
    )


def _col(
    values: dict[str, pd.DataFrame], rid: str, metric: str, steady: bool = False
) -> npt.NDArray[np.float64]:
    g = values.get(rid)
    if g is None or metric not in g:
        return np.array([], dtype=np.float64)
    if steady and "outlier" in g:
        g = g[~g["outlier"].fillna(False).astype(bool)]
    return pd.to_numeric(g[metric], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _row_keys(df: pd.DataFrame) -> list[str]:
    return ["|".join(str(_norm(v)) for v in row) for row in df.itertuples(index=False)]


def headline(comparison: pd.DataFrame, stat: str = HEADLINE_STAT) -> pd.DataFrame:
    """The rows of one statistic (default: the headline p95), with the p50 ratio beside it."""
    if comparison.empty or "stat" not in comparison:
        return comparison
    keys = [c for c in RESULT_COLUMNS if c not in VALUE_COLUMNS and c not in PER_STAT_COLUMNS]
    main = comparison[comparison["stat"] == stat]
    p50 = comparison[comparison["stat"] == "p50"][[*keys, "ratio", "ci_low", "ci_high"]]
    p50 = p50.rename(
        columns={"ratio": "p50_ratio", "ci_low": "p50_ci_low", "ci_high": "p50_ci_high"}
    )
    # Missing-twin rows have no p50 row; a left merge keeps them. Keys may hold NaN (None
    # after CSV): merge on a normalised string form.
    left = main.assign(_k=_row_keys(main[keys]))
    right = p50.assign(_k=_row_keys(p50[keys]))[["_k", "p50_ratio", "p50_ci_low", "p50_ci_high"]]
    return left.merge(right, on="_k", how="left").drop(columns="_k")


def quantile_interval_width(
    values: npt.ArrayLike,
    sizes: Sequence[int],
    *,
    q: float = 0.95,
    n: int = BOOTSTRAP,
    repeats: int = 20,
    seed: int = 0,
) -> pd.DataFrame:
    """How the 95 % bootstrap interval of the q-quantile narrows with the number of steps.

    For each size m in ``sizes``, ``repeats`` times: draw m steps from ``values`` (a group's
    steady-state steps, taken as the population), bootstrap their q-quantile ``n`` times and
    take the interval's half-width relative to the quantile. Reports the median over repeats
    (one draw of m steps is itself noisy). Answers "how many measured steps does a usable p95
    need" from steps already measured.
    """
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    rng = np.random.default_rng(seed)
    rows = []
    for m in sizes:
        widths = []
        for _ in range(repeats):
            sample = x[rng.integers(0, len(x), size=m)]
            boots = np.quantile(sample[rng.integers(0, m, size=(n, m))], q, axis=1)
            lo, hi = np.percentile(boots, [2.5, 97.5])
            est = float(np.quantile(sample, q))
            widths.append((hi - lo) / 2 / est if est else np.nan)
        rows.append({"steps": m, "rel_half_width": float(np.nanmedian(widths))})
    return pd.DataFrame(rows)


def _mean_median(groups: Sequence[npt.NDArray[np.float64]]) -> float:
    meds = [float(np.nanmedian(a)) for a in groups if len(a) and not np.all(np.isnan(a))]
    return float(np.mean(meds)) if meds else np.nan
