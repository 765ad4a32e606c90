"""Figures. Each function draws one figure from prepared DataFrames and saves it; nothing here
computes a statistic (that is summarize/compare/figdata) or reads a trace.

A figure whose data no run of the set records is not drawn at all (``codl.figures.NEEDS_TRACE``);
a panel without data for this run set says why instead of staying blank. No text is smaller than
``SMALL`` (8 pt at the figure's own size, which is its print size: ``_save`` keeps it) and none
is cut or printed over another: figures grow until their labels fit (``_grow_until``). A title
claims an interval only where one is drawn, and names n beside it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.advisor import interference_map as imap
from codl.advisor.interference_map import REGIME_MARKS
from codl.analysis import decompose as dec
from codl.analysis.load import LOAD_MARK
from codl.figures import data as figdata
from codl.figures.data import OFFCPU_CAUSES

ISO_COLOR = "#4c72b0"
COMB_COLOR = "#dd8452"
ROLE_COLORS = {
    "launch": "#c44e52",
    "autograd": "#8172b3",
    "pin_memory": "#937860",
    "comm": "#55a868",
    "loader": "#4c72b0",
    "other": "#8c8c8c",
    "gpu": "#dd8452",
}
# Launch-thread (and GPU) phases get their own colours so a timeline shows where the step goes;
# data_wait is grey-ish on purpose: it is time the launch thread spends idle, not working.
PHASE_COLORS = {
    "data_wait": "#b0b0b0",
    "h2d": "#937860",
    "forward": "#c44e52",
    "backward": "#8172b3",
    "optimizer": "#da8bc3",
    "sleep": "#ccb974",
    "allreduce": "#55a868",
}
WAIT_COLOR = "#8c8c8c"
# A launch role's time off its CPU (figdata.OFFCPU_CAUSES), drawn over its track where it fell.
OFFCPU_COLORS = {
    "gil": "#937860",
    "launch": "#c7c7c7",
    "comm": "#8172b3",
    "other": "#8c8c8c",
    "runnable": "#d62728",
}
METRIC_LABELS = {
    "compute_eff_ms": "compute duration (ms/step)",
    "launch_wait_ms": "launch-thread run-queue wait (ms/step)",
    "allreduce_ms": "AllReduce (ms/step)",
    "data_wait_ms": "data wait (ms/step)",
    "launch_kernel_us_mean": "cudaLaunchKernel latency (us)",
    "step_ms": "step time (ms)",
    "loader_item_ms": "loader service time per item (ms)",
}
DEFAULT_COMPONENT_METRICS = ("compute_eff_ms", "launch_wait_ms", "allreduce_ms", "loader_item_ms")


def _save(fig: Any, outputs: Sequence[Path]) -> None:
    # bbox_inches="tight" crops or pads the canvas, never scales it: a figure prints at its size.
    for out in outputs:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=130, bbox_inches="tight")
    plt.close(fig)


# The smallest type any figure prints, in points at the figure's size (its print size): tick
# labels, annotations, legends and cell texts alike.
SMALL = 8
# Room around a label in its slot (a pair of bars, a box, a heatmap cell), in points.
LABEL_PAD = 4.0
# A bar group or a box needs this many runs for an interval over runs: with one, the bootstrap
# resamples that run's steps only, which says nothing of how runs scatter (STYLE: the run is
# the sample).
MIN_INTERVAL_RUNS = 2


def _grow_until(fig: Any, shortfall: Callable[[Any], tuple[float, float]], tries: int = 4) -> None:
    """Enlarge ``fig`` until its text fits: ``shortfall(renderer)`` says how many times wider
    and taller the figure's slots must be (1 where they suffice); the figure grows by that much,
    a margin beside it, until nothing falls short. Axes only grow with their figure, so a slot
    grows by at least the figure's factor and a few tries suffice."""
    for _ in range(tries):
        fig.draw_without_rendering()
        gx, gy = shortfall(fig.canvas.get_renderer())
        if gx <= 1.0 and gy <= 1.0:
            return
        w, h = fig.get_size_inches()
        fig.set_size_inches(w * max(gx * 1.03, 1.0), h * max(gy * 1.03, 1.0))


def _xtick_shortfall(axes: Sequence[Any]) -> Callable[[Any], tuple[float, float]]:
    """How much wider the x tick slots of ``axes`` must be for each label to fit its own: half
    the distance to its neighbours on either side, and no further than the axes' edge (a
    categorical axis: a label past it prints under the next panel's)."""

    def shortfall(renderer: Any) -> tuple[float, float]:
        need = 1.0
        pad = LABEL_PAD * renderer.points_to_pixels(1.0)
        for ax in axes:
            box = ax.get_window_extent(renderer)
            ticks = [
                (float(ax.transData.transform((t, 0))[0]), label)
                for t, label in zip(ax.get_xticks(), ax.get_xticklabels(), strict=False)
                if label.get_text()
            ]
            xs = [x for x, _ in ticks]
            for i, (x, label) in enumerate(ticks):
                left = x - xs[i - 1] if i else 2 * (x - box.x0)
                right = xs[i + 1] - x if i + 1 < len(xs) else 2 * (box.x1 - x)
                slot = min(left, right)
                width = label.get_window_extent(renderer).width + pad
                if slot > 0:
                    need = max(need, width / slot)
        return need, 1.0

    return shortfall


# A placeholder's font size, and the average width of one of its characters in font sizes: lines
# are wrapped to the panel's width (less a margin), so the text stays clear of the frame.
NOTE_FONTSIZE = SMALL
NOTE_CHAR_WIDTH = 0.6
NOTE_MARGIN = 0.8


def _note(ax: Any, text: str) -> None:
    """A panel that cannot show data says why, wrapped to stay inside its frame."""
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    chars = max(12, int(NOTE_MARGIN * width_pt / (NOTE_CHAR_WIDTH * NOTE_FONTSIZE)))
    wrapped = "\n".join(
        textwrap.fill(line, chars) if line.strip() else "" for line in text.splitlines()
    )
    ax.text(
        0.5,
        0.5,
        wrapped,
        ha="center",
        va="center",
        fontsize=NOTE_FONTSIZE,
        transform=ax.transAxes,
        clip_on=True,
    )
    ax.set_xticks([])
    ax.set_yticks([])


# Beyond this ratio the twin is next to zero and a percentage says nothing readable.
MAX_LABEL_RATIO = 10.0
# A twin whose bar is shorter than this fraction of its panel's tallest is next to zero too
# (a run-queue wait of microseconds): the label gives the difference, not a percentage.
MIN_LABEL_BASE = 0.02


def _effect_label(
    ratio: float,
    diff: float,
    p50_ratio: float,
    unit: str = "ms",
    *,
    base: float = np.nan,
    scale: float = np.nan,
) -> str:
    """'+44%' (or '+0.36 ms' when the twin is ~0 and the difference carries it), p50 beside.
    ``base`` is the twin's value and ``scale`` the panel's tallest bar: a twin next to zero on
    that scale gets the difference, however moderate the ratio."""
    tiny = np.isfinite(base) and np.isfinite(scale) and scale > 0 and base < MIN_LABEL_BASE * scale
    readable = np.isfinite(ratio) and ratio <= MAX_LABEL_RATIO and not tiny
    main = f"{(ratio - 1) * 100:+.0f}%" if readable else f"{diff:+.2g} {unit}"
    readable50 = readable and np.isfinite(p50_ratio) and p50_ratio <= MAX_LABEL_RATIO
    side = f"\n(p50 {(p50_ratio - 1) * 100:+.0f}%)" if readable50 else ""
    return main + side


def _count(v: Any) -> str:
    return str(int(v)) if pd.notna(v) else "?"


def _n(v: Any, noun: str) -> str:
    """'1 run', '3 runs', '? runs' (count unknown)."""
    one = pd.notna(v) and int(v) == 1
    return f"{_count(v)} {noun}" + ("" if one else "s")


def _yerr(value: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Error-bar lengths below/above each bar; 0 where the interval is unknown."""
    below = np.nan_to_num(np.clip(value - lo, 0, None))
    above = np.nan_to_num(np.clip(hi - value, 0, None))
    return np.vstack([below, above])


def _column(d: pd.DataFrame, col: str) -> np.ndarray:
    if col not in d:
        return np.full(len(d), np.nan)
    return d[col].to_numpy(dtype=float)


MAX_PAIRS_PER_ROW = 10


def component_durations(
    headline: pd.DataFrame, outputs: Sequence[Path], *, metrics: Sequence[str] | None = None
) -> None:
    """Fig. 1: isolation vs combined per policy at the headline statistic (one row per
    comparison, as ``compare.headline`` gives: p95, p50 change beside it), n (runs, steps) under
    each pair. A bar of ``MIN_INTERVAL_RUNS`` runs or more has its own 95 % CI
    (``figdata.with_arm_intervals``); a bar of one run has none, and the title says which and
    how many runs and steps the bars rest on.

    The data component is shown as per-item loader service time, not data wait: an isolation
    `data` run waits for data all step long, so its data wait is not comparable.
    """
    metrics = list(metrics or DEFAULT_COMPONENT_METRICS)
    usable = bool(len(headline) and {"status", "metric"} <= set(headline))
    ok = headline[headline["status"] == "ok"] if usable else pd.DataFrame()
    present = [m for m in metrics if len(ok) and m in set(ok["metric"])]
    fig, axes = _component_figure([max(2, int((ok["metric"] == m).sum())) for m in present])
    if not present:
        _note(axes[0], _no_pairs_reason(headline, usable))
        _save(fig, outputs)
        return
    stat = str(ok["stat"].iloc[0]) if "stat" in ok else "median"
    for ax, metric in zip(axes, present, strict=True):
        _component_panel(ax, _labelled_pairs(ok[ok["metric"] == metric].copy()), metric, stat)
    # One legend beside the panels: inside one it covered the first pair's change label.
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=SMALL, loc="outside right upper", frameon=False)
    fig.suptitle(_component_title(ok[ok["metric"].isin(present)], stat), fontsize=9)
    _grow_until(fig, _xtick_shortfall(list(axes)))
    _save(fig, outputs)


def _span(values: np.ndarray, noun: str) -> str:
    """'1 run', '3-5 runs', '? runs' (none known): the range of counts of ``values``."""
    known = values[np.isfinite(values)]
    if not len(known):
        return _n(np.nan, noun)
    lo, hi = int(known.min()), int(known.max())
    return _n(lo, noun) if lo == hi else f"{lo}-{hi} {noun}s"


def _component_title(d: pd.DataFrame, stat: str) -> str:
    """The figure's claim, as the bars drawn bear it: runs and steps per bar, and an interval
    only on bars of ``MIN_INTERVAL_RUNS`` runs or more."""
    runs = np.concatenate([_column(d, "n_isolation_runs"), _column(d, "n_runs")])
    steps = np.concatenate([_column(d, "isolation_steps"), _column(d, "steps")])
    many = runs >= MIN_INTERVAL_RUNS
    ci = "95 % two-level bootstrap CI (runs, then steps)"
    if many.all():
        claim = f"bars with {ci}"
    elif many.any():
        claim = f"{ci} on bars of >= {MIN_INTERVAL_RUNS} runs, none on the others"
    else:
        claim = f"no interval (an interval over runs needs >= {MIN_INTERVAL_RUNS})"
    return (
        f"Isolation vs combined at the {stat} of the steady-state steps, "
        f"{_span(runs, 'run')} and {_span(steps, 'step')} per bar: {claim};\n"
        f"label: change at the {stat} (p50 change in parentheses); "
        "under each pair: runs and steps, isolation+combined"
    )


def _component_figure(pairs: list[int]) -> tuple[Any, np.ndarray]:
    """The figure and its panels, one per metric with ``pairs`` bar pairs each (empty: one
    two-pair panel for the note). A first size: ``_grow_until`` widens it to its labels."""
    pairs = pairs or [2]
    # Panels as wide as their number of bar pairs, so tick labels of a crowded panel fit; past
    # MAX_PAIRS_PER_ROW pairs in all, one panel per row (a page is not 30 inches wide).
    if sum(pairs) > MAX_PAIRS_PER_ROW:
        fig, axes = plt.subplots(
            len(pairs),
            1,
            figsize=(1.45 * max(pairs) + 1.5, 3.9 * len(pairs) + 0.6),
            layout="constrained",
        )
    else:
        fig, axes = plt.subplots(
            1,
            len(pairs),
            figsize=(max(6.0, 1.45 * sum(pairs) + 0.9 * len(pairs)), 4.6),
            gridspec_kw={"width_ratios": pairs},
            layout="constrained",
        )
    return fig, np.atleast_1d(axes)


def _no_pairs_reason(headline: pd.DataFrame, usable: bool) -> str:
    """Why no pair is drawn, with the first comparison's own status when there is one."""
    why = "no isolation/combined pairs in this run set\n(add isolation modes)"
    if usable:
        missing = headline.loc[headline["status"] != "ok", "status"].astype(str)
        if len(missing):
            why += "\n\n" + "\n".join(textwrap.wrap(missing.iloc[0], 70))
    return why


# A tick label's run marks take a new line past this many characters, a mark never split: the
# marks of a 2-rank unpinned run on a busy machine made one label as wide as three pairs.
MARKS_WIDTH = 16


def _marks_lines(marks: list[str]) -> str:
    lines: list[str] = []
    for mark in marks:
        if lines and len(lines[-1]) + 1 + len(mark) <= MARKS_WIDTH:
            lines[-1] += " " + mark
        else:
            lines.append(mark)
    return "\n".join(lines)


def _labelled_pairs(d: pd.DataFrame) -> pd.DataFrame:
    """One metric's comparisons with a tick label each (policy, workers, mode where several,
    instrumentation marks, n), in study order."""
    many = d["mode"].nunique() > 1
    d["label"] = (
        d["policy"].astype(str)
        + " w="
        + d["workers"].astype(str)
        + ("\n" + d["mode"].astype(str) if many else "")
    )
    marks = [_marks_lines(_run_marks(r)) for _, r in d.iterrows()]
    d["label"] += [f"\n{m}" if m else "" for m in marks]
    d["label"] += [
        f"\nruns {_count(ni)}+{_count(nc)}\nsteps {_count(si)}+{_count(sc)}"
        for ni, nc, si, sc in zip(
            _column(d, "n_isolation_runs"),
            _column(d, "n_runs"),
            _column(d, "isolation_steps"),
            _column(d, "steps"),
            strict=True,
        )
    ]
    keys = [
        (*figdata.order_key(m, p), float(w))
        for m, p, w in zip(d["mode"], d["policy"], d["workers"], strict=True)
    ]
    return d.iloc[sorted(range(len(d)), key=keys.__getitem__)]


def _component_panel(ax: Any, d: pd.DataFrame, metric: str, stat: str) -> None:
    """One metric's panel: the bar pairs, each pair's change label, axes and title."""
    x = np.arange(len(d))
    tops = _arm_bars(ax, x, d)
    p50 = _column(d, "p50_ratio")
    unit = "us" if metric.endswith("_us_mean") else "ms"
    scale = float(np.nanmax(tops)) if np.isfinite(tops).any() else np.nan
    base = _column(d, "isolation")
    for xi, top, r, df_, r50, b in zip(x, tops, d["ratio"], d["diff"], p50, base, strict=True):
        if np.isfinite(top):
            ax.annotate(
                _effect_label(r, df_, r50, unit, base=b, scale=scale),
                (xi, top),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=SMALL,
            )
    ymax = np.nanmax(tops) if np.isfinite(tops).any() else 1.0
    # Head room for the two-line change label above the highest bar.
    ax.set_ylim(0, ymax * 1.3)
    ax.set_xticks(x, d["label"], fontsize=SMALL, rotation=0)
    ax.set_ylabel(f"{stat} of {METRIC_LABELS.get(metric, metric)}", fontsize=SMALL + 1)
    ax.set_title(METRIC_LABELS.get(metric, metric).split(" (")[0], fontsize=9)


def _arm_interval(
    ok: np.ndarray, value: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(high ends, whisker lengths below/above) of the bars where ``ok``; NaN elsewhere, which
    draws no whisker and no cap."""
    lo, hi = np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)
    return hi, np.vstack([np.clip(value - lo, 0, None), np.clip(hi - value, 0, None)])


def _arm_bars(ax: Any, x: np.ndarray, d: pd.DataFrame) -> np.ndarray:
    """The isolation and combined bars, with error bars on those of ``MIN_INTERVAL_RUNS`` runs
    or more; returns each pair's top (the higher of its bars and error bars) so the change
    label can sit clear of both."""
    iso = d["isolation"].to_numpy(dtype=float)
    comb = d["combined"].to_numpy(dtype=float)
    iso_ok = _column(d, "n_isolation_runs") >= MIN_INTERVAL_RUNS
    comb_ok = _column(d, "n_runs") >= MIN_INTERVAL_RUNS
    comb_lo, comb_hi = _column(d, "combined_ci_low"), _column(d, "combined_ci_high")
    # Without an arm's own interval, the interval of the difference still places the
    # combined bar's error bar (it exists even where the twin is 0 and a ratio does not); it
    # rests on the runs of both arms.
    fallback = ~np.isfinite(comb_lo)
    comb_lo = np.where(fallback, iso + _column(d, "diff_ci_low"), comb_lo)
    comb_hi = np.where(fallback, iso + _column(d, "diff_ci_high"), comb_hi)
    comb_ok &= ~fallback | iso_ok
    iso_hi, iso_err = _arm_interval(
        iso_ok, iso, _column(d, "isolation_ci_low"), _column(d, "isolation_ci_high")
    )
    comb_hi, comb_err = _arm_interval(comb_ok, comb, comb_lo, comb_hi)
    err = {"capsize": 3, "error_kw": {"elinewidth": 1}}
    for dx, v, yerr, color, name in (
        (-0.2, iso, iso_err, ISO_COLOR, "isolation"),
        (0.2, comb, comb_err, COMB_COLOR, "combined"),
    ):
        ax.bar(x + dx, v, 0.4, color=color, label=name, yerr=yerr, **err)
    # The change label sits above the higher of the pair's bars and error bars, centred on
    # the pair, so it never overlaps a whisker.
    tops: np.ndarray = np.nanmax(np.vstack([iso, comb, iso_hi, comb_hi]), axis=0)
    return tops


def api_latency_cdf(api: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 2: CDF of CUDA runtime API call latency, isolation vs combined. Drawn only for a
    run set with a run that records the calls (``codl.figures.NEEDS_TRACE``): no calls here means
    that level recorded none, and the figure says so rather than show an empty axis."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    # A log axis cannot show zero-length calls (clock granularity); they are left out.
    api = api[api["us"] > 0] if {"label", "us"} <= set(api) else pd.DataFrame()
    if api.empty:
        _note(
            ax,
            "trace.cuda_api or trace.cupti was on, yet no CUDA runtime API call of a measured "
            "step was recorded: a recorder that was lost says why in its run's trace attributes "
            "(codl inspect).",
        )
        _save(fig, outputs)
        return
    for label, group in api.groupby("label"):
        # A row is one call, or (summarize's tables) a latency bucket's upper edge and its
        # calls: the CDF steps at each, exact at every edge.
        g = group.sort_values("us", kind="stable")
        calls = g["calls"].fillna(1).to_numpy() if "calls" in g else np.ones(len(g))
        cum = np.cumsum(calls)
        runs = g["run_id"].nunique() if "run_id" in g else np.nan
        ax.plot(
            g["us"].to_numpy(),
            cum / cum[-1],
            label=f"{label} ({_n(runs, 'run')}, {_n(int(cum[-1]), 'call')})",
        )
    ax.set_xscale("log")
    if np.log10(api["us"].max() / api["us"].min()) <= 2:
        # Over a decade or two the log axis labelled its minor ticks too, "3x10^0" printed
        # over "4x10^0": plain numbers at 1, 2 and 5 of each decade instead.
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("runtime API call duration (us, log scale)")
    ax.set_ylabel("fraction of calls at or below")
    ax.legend(fontsize=SMALL)
    ax.set_title("CUDA runtime API call latency, measured steps (empirical CDF)", fontsize=10)
    _save(fig, outputs)


def _group_n(g: pd.DataFrame) -> str:
    runs = g["run_id"].nunique() if "run_id" in g else np.nan
    return f"{_n(runs, 'run')}, {_n(len(g), 'step')}"


def launch_wait_vs_compute(steps: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 3: per step, launch-thread run-queue wait against compute duration."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    need = {"launch_wait_ms", "compute_eff_ms", "mode", "policy"}
    d = steps.dropna(subset=["launch_wait_ms", "compute_eff_ms"]) if need <= set(steps) else None
    if d is not None:
        d = d[d["compute_eff_ms"] > 0]
    if d is None or d.empty:
        _note(ax, "no steps with both compute and launch-thread samples")
        _save(fig, outputs)
        return
    markers = dict(zip(sorted(d["policy"].astype(str).unique()), "osD^v<>", strict=False))
    flagged = _flagged(d)
    if flagged.any():
        ax.scatter(
            d.loc[flagged, "launch_wait_ms"],
            d.loc[flagged, "compute_eff_ms"],
            s=60,
            marker="x",
            color="k",
            label=f"flagged anomalous step (n={int(flagged.sum())})",
            zorder=3,
        )
    groups = sorted(
        _with_marks(d).groupby(["mode", "policy", "_marks"]),
        key=lambda kv: (*figdata.order_key(kv[0][0], kv[0][1]), kv[0][2]),
    )
    # One colour per group (tab20 past ten): two groups never share colour and marker.
    cmap = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    colors = [cmap(i) for i in range(cmap.N)]
    for k, ((mode, policy, marks), g) in enumerate(groups):
        ax.scatter(
            g["launch_wait_ms"],
            g["compute_eff_ms"],
            s=12,
            color=colors[k % len(colors)],
            marker=markers.get(str(policy), "o"),
            label=f"{mode} / {policy}{f' {marks}' if marks else ''} ({_group_n(g)})",
            alpha=0.6,
        )
    ax.set_xlabel("launch-thread run-queue wait during the step (ms)")
    ax.set_ylabel("compute duration of the step (ms)")
    # A scatter shows association only: both can grow with a third load on the same CPUs.
    ax.set_title(
        "Per step: launch-thread run-queue wait and compute duration (association)", fontsize=10
    )
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _save(fig, outputs)


# The average width of a character in font sizes (DejaVu Sans, mixed case).
CHAR_WIDTH = 0.6


def _fits(label: str, width_ms: float, span_ms: float, axis_pt: float) -> bool:
    """Whether a ``SMALL`` label fits inside a bar ``width_ms`` wide on an axis ``span_ms``
    long and ``axis_pt`` points wide, a character's width to spare."""
    need = CHAR_WIDTH * SMALL * (len(label) + 1)
    return bool(label) and span_ms > 0 and width_ms / span_ms * axis_pt > need


def step_timeline(timeline: pd.DataFrame, outputs: Sequence[Path], *, title: str = "") -> None:
    """Fig. 4: one combined step, every track (threads, workers, GPU) on one time axis, and
    below it the threads' run-queue wait in that step as per-step totals.

    Launch-thread and GPU spans are coloured by phase, other tracks by thread role. Waits get
    a panel of their own: schedstat gives their total per step, not their position in it. With
    the kernel's scheduler record, the launch roles' time off their CPU is drawn under their
    tracks where it fell (hatched), coloured by what ended it (``figdata.OFFCPU_CAUSES``).
    """
    kind = timeline["kind"] if "kind" in timeline else pd.Series(dtype=str)
    spans = timeline[kind != "wait"] if len(timeline) else timeline
    waits = timeline[kind == "wait"] if len(timeline) else timeline
    tracks = list(dict.fromkeys(spans["track"])) if len(spans) else []
    if not tracks:
        fig, ax = plt.subplots(figsize=(10, 3))
        _note(ax, "no combined run with a loader in this run set")
        _save(fig, outputs)
        return
    heights = [max(3, len(tracks)), max(1.5, len(waits))]
    fig, (ax, wax) = plt.subplots(
        2,
        1,
        figsize=(10, 0.32 * sum(heights) + 2.4),
        gridspec_kw={"height_ratios": heights, "hspace": 0.55},
    )
    _timeline_spans(ax, spans, tracks, title)
    if waits.empty:
        _note(wax, "no thread waited in the run queue during this step")
    else:
        _timeline_waits(wax, waits)
    _save(fig, outputs)


def _span_color(role: str, phase: str) -> tuple[str, str]:
    """(colour, legend key) of a span: launch and GPU spans by phase, the rest by role."""
    if role in {"launch", "gpu"} and phase in PHASE_COLORS:
        return PHASE_COLORS[phase], phase
    return ROLE_COLORS.get(role, WAIT_COLOR), role


def _timeline_spans(ax: Any, spans: pd.DataFrame, tracks: list[str], title: str) -> None:
    """The spans panel: one row per track on the step's time axis, labels inside bars that
    fit them, and a legend of phases and roles."""
    ypos = {t: i for i, t in enumerate(tracks)}
    span_ms = float(spans["end_ms"].max())
    legend: dict[str, Any] = {}
    axis_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    for _, r in spans.iterrows():
        width = float(r["end_ms"] - r["start_ms"])
        if r.get("kind") == "offcpu":
            _offcpu_bar(ax, r, ypos, width, legend)
            continue
        color, key = _span_color(str(r["role"]), str(r.get("phase", "")))
        bar = ax.barh(
            ypos[r["track"]],
            width,
            left=r["start_ms"],
            height=0.7,
            color=color,
            alpha=0.9,
            edgecolor="white" if r["role"] == "loader" else "none",
            linewidth=0.5,
        )
        legend.setdefault(key, bar)
        if _fits(str(r["label"]), width, span_ms, axis_pt):
            ax.text(
                float(r["start_ms"]) + width / 2,
                ypos[r["track"]],
                str(r["label"]),
                ha="center",
                va="center",
                fontsize=SMALL,
            )
    ax.set_yticks(range(len(tracks)), tracks, fontsize=SMALL)
    ax.invert_yaxis()
    ax.set_xlim(0, span_ms)
    ax.set_xlabel("time since step start (ms)", fontsize=SMALL + 1)
    ax.set_title(title or "One combined step", fontsize=9)
    # Phases first, in step order, then roles: the legend reads like the step.
    order = [p for p in PHASE_COLORS if p in legend] + [k for k in legend if k not in PHASE_COLORS]
    ax.legend(
        [legend[k] for k in order],
        order,
        fontsize=SMALL,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )


def _offcpu_bar(
    ax: Any, r: pd.Series, ypos: dict[str, int], width: float, legend: dict[str, Any]
) -> None:
    """A thin hatched bar under the track's spans: where its thread was off its CPU, and why."""

    cause = str(r["label"])
    bar = ax.barh(
        ypos[r["track"]] + 0.3,
        width,
        left=r["start_ms"],
        height=0.25,
        color=OFFCPU_COLORS.get(cause, WAIT_COLOR),
        hatch="////",
        edgecolor="white",
        linewidth=0.0,
    )
    legend.setdefault(OFFCPU_CAUSES.get(cause, cause), bar)


def _timeline_waits(wax: Any, waits: pd.DataFrame) -> None:
    """The waits panel: each thread's run-queue wait total as a bar from 0, most first."""
    w = waits.sort_values("end_ms", ascending=False)
    y = np.arange(len(w))
    total = (w["end_ms"] - w["start_ms"]).to_numpy(dtype=float)
    colors = [ROLE_COLORS.get(str(r), WAIT_COLOR) for r in w["role"]]
    wax.barh(y, total, height=0.6, color=colors, hatch="//", alpha=0.5, edgecolor="k")
    for yi, t, lab in zip(y, total, w["label"], strict=True):
        wax.annotate(
            str(lab),
            (t, yi),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=SMALL,
        )
    wax.set_yticks(y, list(w["track"]), fontsize=SMALL)
    wax.invert_yaxis()
    wax.set_xlim(0, total.max() * 1.25)
    wax.set_xlabel(
        "run-queue wait in this step, total per thread (ms; schedstat gives no position)",
        fontsize=SMALL + 1,
    )
    wax.set_title("Threads waiting for a CPU during this step (most first)", fontsize=9)


def _text_color(cmap: Any, norm: Any, v: float) -> str:
    """Black on light cells, white on dark ones (relative luminance of the cell colour)."""
    r, g, b, _ = cmap(norm(v))
    return "k" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "w"


def _heat_cells(
    table: pd.DataFrame, col: str, policies: list[str], workers: list[Any]
) -> npt.NDArray[np.float64]:
    """One value per (policy, workers) cell on the shared grid; NaN where not run."""
    if col not in table:
        return np.full((len(policies), len(workers)), np.nan)
    grid = table.assign(policy=table["policy"].astype(str)).pivot_table(
        index="policy", columns="workers", values=col, aggfunc="first"
    )
    return grid.reindex(index=policies, columns=workers).to_numpy(dtype=float)


def _both_arms_many(n_runs: Any, n_isolation_runs: Any) -> bool:
    """Whether a ratio rests on ``MIN_INTERVAL_RUNS`` runs or more on either side (NaN: no)."""
    return bool(
        pd.notna(n_runs)
        and pd.notna(n_isolation_runs)
        and min(n_runs, n_isolation_runs) >= MIN_INTERVAL_RUNS
    )


def _heat_texts(table: pd.DataFrame, col: str, policies: list[str], workers: list[Any]) -> Any:
    """Cell texts: throughput, its mode (where cells differ) and its runs; a ratio, its 95 % CI
    where both arms have ``MIN_INTERVAL_RUNS`` runs or more, and its runs (comb./iso.). One
    short item a line, so that a cell is as narrow as its number allows."""
    v = _heat_cells(table, col, policies, workers)
    if col == "ratio":
        lo, hi, nr, ni = (
            _heat_cells(table, c, policies, workers)
            for c in ("ci_low", "ci_high", "n_runs", "n_isolation_runs")
        )
        busy = np.nan_to_num(
            _heat_cells(table.assign(busy=_truthy(table, "busy")), "busy", policies, workers)
        )
        return np.vectorize(
            lambda x, a, b, c, d, f: (
                f"{x:.2f}"
                + (f"\n[{a:.2f}, {b:.2f}]" if _both_arms_many(c, d) else "")
                + f"\n({_count(c)}/{_count(d)} runs)"
                + (f"\n{LOAD_MARK}" if f > 0 else "")
            )
        )(v, lo, hi, nr, ni, busy)
    runs = _heat_cells(table, "runs", policies, workers)
    busy_runs = np.nan_to_num(_heat_cells(table, "busy_runs", policies, workers))
    # The cells' mode, where they are not all of one (figdata.THROUGHPUT_MODES).
    modes: npt.NDArray[Any] = np.full(v.shape, "", dtype=object)
    if "mode" in table and table["mode"].nunique() > 1:
        grid = table.assign(policy=table["policy"].astype(str)).pivot_table(
            index="policy", columns="workers", values="mode", aggfunc="first"
        )
        modes = grid.reindex(index=policies, columns=workers).fillna("").to_numpy(dtype=object)
    return np.vectorize(
        lambda x, r, b, m: (
            f"{x:,.0f}"
            + (f"\n{m}" if m else "")
            + f"\n({_n(r, 'run')})"
            + (f"\n{_count(b)} {LOAD_MARK}" if b > 0 else "")
        )
    )(v, runs, busy_runs, modes)


def _truthy(table: pd.DataFrame, col: str) -> pd.Series:
    if col not in table:
        return pd.Series(0.0, index=table.index)
    return (table[col].astype(str).str.lower() == "true").astype(float)


def _ratio_title(d: pd.DataFrame) -> str:
    """The inflation panel's title: the interval it claims as its cells bear it, n beside."""
    many = [
        _both_arms_many(r, i)
        for r, i in zip(_column(d, "n_runs"), _column(d, "n_isolation_runs"), strict=True)
    ]
    head = "compute inflation: combined / isolation at p95\n"
    ci = "95 % two-level bootstrap CI (runs, then steps)"
    if all(many):
        return head + f"[{ci}] (runs comb./iso.)"
    if any(many):
        return head + f"[{ci}, both arms >= {MIN_INTERVAL_RUNS} runs] (runs comb./iso.)"
    return head + f"(runs comb./iso.); no interval, which needs >= {MIN_INTERVAL_RUNS} runs an arm"


def _cell_shortfall(panels: list[Any]) -> Callable[[Any], tuple[float, float]]:
    """How much wider and taller the heatmap cells of ``panels`` must be for each cell's text
    to fit inside its cell, ``LABEL_PAD`` to spare on every side."""

    def shortfall(renderer: Any) -> tuple[float, float]:
        gx = gy = 1.0
        pad = 2 * LABEL_PAD * renderer.points_to_pixels(1.0)
        for ax in panels:
            (x0, y0), (x1, y1) = ax.transData.transform([(-0.5, -0.5), (0.5, 0.5)])
            cell_w, cell_h = abs(x1 - x0), abs(y1 - y0)
            for t in ax.texts:
                box = t.get_window_extent(renderer)
                gx = max(gx, (box.width + pad) / cell_w)
                gy = max(gy, (box.height + pad) / cell_h)
        return gx, gy

    return shortfall


def policy_heatmap(table: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 5: policy x workers: throughput (sequential colours), and compute inflation
    (combined / isolation at p95; diverging colours centred at 1) with its runs and, where both
    arms have ``MIN_INTERVAL_RUNS`` runs or more, its 95 % CI. Both panels share one grid, so a
    cell means the same (policy, workers) in each; the figure grows until every cell's text
    fits inside its cell."""
    have = {"policy", "workers"} <= set(table) and len(table) > 0
    if have and "row" in table:
        # A row per policy and marks (figdata.heatmap_table): in the policy's order, its
        # plain row first.
        order = {
            str(row): (figdata.order_key("", pol), len(str(row)), str(row))
            for row, pol in zip(table["row"], table["policy"], strict=True)
        }
        table = table.assign(policy=table["row"].astype(str))
    else:
        order = {}
    policies = (
        sorted(
            table["policy"].astype(str).unique(),
            key=lambda p: order.get(p, (figdata.order_key("", p), 0, p)),
        )
        if have
        else []
    )
    workers = sorted(table["workers"].dropna().unique()) if have else []
    fig, axes = plt.subplots(
        1, 2, figsize=(11, 0.7 * max(3, len(policies)) + 2.2), layout="constrained"
    )
    panels = (
        (
            "throughput_samples_s",
            "median throughput (samples/s) of a cell's multi-component runs\n(runs in parentheses)",
        ),
        ("ratio", ""),
    )
    drawn = []
    for k, (ax, (col, title)) in enumerate(zip(axes, panels, strict=True)):
        d = table.dropna(subset=[col]) if have and col in table else pd.DataFrame()
        if d.empty:
            _note(ax, "no data for " + ("throughput" if col != "ratio" else "compute inflation"))
            continue
        _heat_panel(fig, ax, d, col, policies, workers)
        if k == 0:
            ax.set_ylabel("CPU-set policy")
        ax.set_title(title or _ratio_title(d), fontsize=9)
        drawn.append(ax)
    _grow_until(fig, _cell_shortfall(drawn))
    _save(fig, outputs)


def _heat_panel(
    fig: Any, ax: Any, d: pd.DataFrame, col: str, policies: list[str], workers: list[Any]
) -> None:
    """One heatmap panel of ``col`` on the shared grid: cells, their texts, axes and colour
    bar."""
    grid = _heat_cells(d, col, policies, workers)
    texts = _heat_texts(d, col, policies, workers)
    norm: Any
    if col == "ratio":
        # A ratio lives around 1: diverging colours, white at 1, on a log scale so that
        # x2 and x0.5 are equally far from white.
        cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#eeeeee")
        reach = float(np.nanmax(np.abs(np.log(grid[grid > 0])))) if (grid > 0).any() else 0
        r = float(np.exp(max(reach, 0.05)))
        norm = matplotlib.colors.LogNorm(vmin=1 / r, vmax=r)
        label, missing = "ratio (1 = no change)", "no pair"
    else:
        cmap = plt.get_cmap("Blues").with_extremes(bad="#eeeeee")
        norm = matplotlib.colors.Normalize(np.nanmin(grid) * 0.9, np.nanmax(grid))
        label, missing = "samples/s", "not run"
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, norm=norm)
    ax.set_xticks(range(len(workers)), [str(int(w)) for w in workers])
    ax.set_yticks(range(len(policies)), policies)
    ax.set_xlabel("loader workers" + (" (0: no loader)" if 0 in workers else ""))
    for (i, j), v in np.ndenumerate(grid):
        finite = np.isfinite(v)
        ax.text(
            j,
            i,
            texts[i, j] if finite else missing,
            ha="center",
            va="center",
            color=_text_color(cmap, norm, v) if finite else "#777777",
            fontsize=SMALL,
        )
    bar = fig.colorbar(im, ax=ax, label=label, shrink=0.9)
    if col == "ratio":
        # Plain ratio ticks, not a log axis's powers of ten.
        ticks = np.unique(np.round(np.geomspace(norm.vmin, norm.vmax, 5), 2))
        bar.set_ticks(ticks.tolist(), labels=[f"{t:.2f}" for t in ticks])
        bar.ax.minorticks_off()


def _flagged(steps: pd.DataFrame) -> pd.Series:
    if "outlier" not in steps:
        return pd.Series(False, index=steps.index)
    return steps["outlier"].astype(str).str.lower() == "true"


def step_time_distributions(steps: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 6: step-time distribution per mode and policy (runs with a costly tracing level or
    without pinned memory apart, marked as in the other figures):
    boxes of the steady-state steps in study order (modes as ``spec.Mode``, then policies),
    n (runs, steps) under each box, flagged anomalous steps drawn apart as crosses."""
    groups: list[tuple[str, Any, Any]] = []
    if len(steps) and {"mode", "policy", "step_ms"} <= set(steps):
        keyed = sorted(
            _with_marks(steps).groupby(["mode", "policy", "_marks"]),
            key=lambda kv: (*figdata.order_key(kv[0][0], kv[0][1]), kv[0][2]),
        )
        for (m, p, marks), grp in keyed:
            g = grp.dropna(subset=["step_ms"])
            flag = _flagged(g)
            kept = g.loc[~flag]
            n_out = int(flag.sum())
            runs = kept["run_id"].nunique() if "run_id" in kept else np.nan
            label = f"{m}\n{p}" + (f"\n{_marks_lines(_run_marks(grp.iloc[0]))}" if marks else "")
            label += f"\n{_n(runs, 'run')}\n{_n(len(kept), 'step')}"
            label += f"\n+{n_out} flagged" if n_out else ""
            groups.append((label, kept["step_ms"].to_numpy(), g.loc[flag, "step_ms"]))
        groups = [(n, v, o) for n, v, o in groups if len(v)]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.95 * len(groups) + 1.5), 4.6))
    if not groups:
        _note(ax, "no measured steps")
        _save(fig, outputs)
        return
    ax.boxplot(
        [g for _, g, _ in groups],
        showfliers=True,
        whis=(1, 99),
        flierprops={"marker": ".", "markersize": 3, "alpha": 0.5},
    )
    for i, (_, _, out) in enumerate(groups, start=1):
        if len(out):
            ax.scatter(np.full(len(out), i), out, marker="x", color="#c44e52", s=40, zorder=3)
    ax.set_xticks(range(1, len(groups) + 1), [n for n, _, _ in groups], fontsize=SMALL)
    # Loader-bound groups have tails 20x their median: on a linear axis every other box is a
    # flat line at the bottom. A log axis keeps both readable.
    medians = [float(np.median(v)) for _, v, _ in groups]
    tails = [float(np.percentile(v, 99)) for _, v, _ in groups]
    log = min(medians) > 0 and max(tails) / min(medians) > 20
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("step time (ms" + (", log scale)" if log else ")"))
    ax.set_title(
        "Step time per mode and policy: box = quartiles, line = median, whiskers = p1-p99,\n"
        "dots = steps beyond; x = flagged anomalous steps (left out of the statistics)",
        fontsize=9,
    )
    _grow_until(fig, _xtick_shortfall([ax]))
    _save(fig, outputs)


# The compute inflation's parts (analysis.decompose), drawn in this order beside it.
BUDGET_PARTS = {
    "host_launch_delay_ms": (
        "host launch delay\n(main + autograd CPU time and run-queue wait in the compute span)",
        "#c44e52",
    ),
    "host_blocked_ms": (
        "host blocked (launch roles asleep until a thread off the launch\n"
        "path or a timer woke them: the GIL or a lock; +ftrace runs)",
        "#937860",
    ),
    "peer_wait_ms": ("peer wait (exposed: after the rank's own last bucket)", "#8172b3"),
    "transfer_ms": ("transfer (exposed)", "#55a868"),
    "gpu_slowdown_ms": ("GPU slowdown (CUPTI runs)", "#dd8452"),
    "unattributed_ms": ("unattributed (signed)", "#bbbbbb"),
}


def _decomposition_split(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(bar groups, runs) of the decomposition frame; a frame without ``row`` is all groups."""
    if "row" not in frame:
        return frame.reset_index(drop=True), frame.iloc[0:0]
    rows = frame["row"].astype(str)
    return (
        frame[rows == figdata.GROUP_ROW].reset_index(drop=True),
        frame[rows == figdata.RUN_ROW].reset_index(drop=True),
    )


def _group_runs(runs: pd.DataFrame, group: pd.Series) -> pd.DataFrame:
    """The run rows of one bar group and view (NaN keys match NaN)."""
    keys = [k for k in (*dec.DECOMPOSITION_KEYS, "view") if k in runs and k in group]
    mine = pd.Series(True, index=runs.index)
    for k in keys:
        v = group[k]
        mine &= runs[k].isna() if pd.isna(v) else runs[k].astype(str) == str(v)
    return runs[mine]


def decomposition(frame: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 7: per bar group (mode, policy, ...) and view (all steady-state steps, the slowest
    5 %), the compute inflation against the twin (black bar) and each of its parts beside it
    (host launch delay, host blocked, peer wait, transfer, GPU slowdown, unattributed). Each bar
    is the mean over blocks of the runs' means, its whisker the 95 % Student-t interval over
    blocks (``runlevel.mean_interval``; none with one block), each dot one run. Where the host
    part was measured in the compute span the parts add up to the inflation; groups whose host
    part covers the whole step are labelled "not a budget". A tail of too few steps
    (``decompose.MIN_TAIL_STEPS``) is not drawn; its place says so. Prepared by
    ``figdata.decomposition_frame``."""
    d, runs = _decomposition_split(frame)
    shown = [c for c in ("compute_inflation_ms", *BUDGET_PARTS) if np.isfinite(_column(d, c)).any()]
    width = 0.8 / max(1, len(shown))
    fig, ax = plt.subplots(
        figsize=(max(7.0, max(1.45, 0.35 + 0.22 * len(shown)) * max(1, len(d)) + 4.5), 5.6)
    )
    if d.empty:
        _note(
            ax,
            "no run with a twin to decompose against\n"
            "(needs e.g. combined with compute+comm, or data+compute with compute)",
        )
        _save(fig, outputs)
        return
    x = np.arange(len(d))
    colors = {"compute_inflation_ms": ("compute inflation", "#222222")} | BUDGET_PARTS
    for j, col in enumerate(shown):
        name, color = colors[col]
        pos = x - 0.4 + width * (j + 0.5)
        v = _column(d, col)
        lo, hi = _column(d, f"{col}_ci_low"), _column(d, f"{col}_ci_high")
        hatch = "//" if col == "unattributed_ms" else None
        ax.bar(pos, np.nan_to_num(v), width * 0.6, color=color, label=name, hatch=hatch)
        ax.errorbar(pos, np.nan_to_num(v), yerr=_yerr(v, lo, hi), fmt="none", ecolor="k", lw=0.8)
        for i, (_, g) in enumerate(d.iterrows()):
            vals = pd.to_numeric(_group_runs(runs, g).get(col, pd.Series()), errors="coerce")
            vals = vals[np.isfinite(vals)]
            if len(vals) and np.isfinite(v[i]):
                ax.scatter(
                    # Beside the bar, not on it: a dot on a bar of its colour is lost.
                    np.full(len(vals), pos[i] + width * 0.4),
                    vals,
                    s=7,
                    color="k",
                    zorder=4,
                    linewidths=0,
                    label="one run (its mean)" if (i, j) == (0, 0) else None,
                )
    for i, (_, g) in enumerate(d.iterrows()):
        if str(g.get("note", "") or "") not in ("", "nan"):
            # Mid-height of the axes whatever the data's sign: never on the title or a label.
            ax.text(
                x[i],
                0.5,
                str(g["note"]).replace(" (", "\n("),
                ha="center",
                va="center",
                fontsize=SMALL,
                color="#555555",
                transform=ax.get_xaxis_transform(),
            )
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlim(-0.6, len(d) - 0.4)
    ax.set_xticks(x, _decomposition_labels(d), fontsize=SMALL)
    ax.set_ylabel("ms per step beyond the twin")
    budget = "host_source" not in d or (d["host_source"].astype(str) == "compute span").all()
    ax.set_title(
        "Compute inflation against the twin (black) and its measured parts, per step:\n"
        f"bars the mean over blocks, {_block_whiskers(d)}, dots one run each;\n"
        + (
            "the parts add up to the inflation"
            if budget
            else "groups marked 'not a budget' (host part over the whole step) need not add up"
        ),
        fontsize=9,
    )
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _grow_until(fig, _xtick_shortfall([ax]))
    _save(fig, outputs)


def _block_whiskers(d: pd.DataFrame) -> str:
    """What the decomposition's whiskers are, as the groups drawn have them (an interval over
    blocks: none for a group of one block)."""
    cols = ("compute_inflation_ms", *BUDGET_PARTS)
    drawn = np.isfinite(np.vstack([_column(d, c) for c in cols])).any(axis=0)
    has = np.isfinite(np.vstack([_column(d, f"{c}_ci_low") for c in cols])).any(axis=0)[drawn]
    ci = "whiskers a 95 % Student-t interval over blocks"
    if len(has) and has.all():
        return ci
    if has.any():
        return f"{ci} (none with one block)"
    return f"no whiskers (an interval over blocks needs >= {MIN_INTERVAL_RUNS} blocks a group)"


def _run_marks(r: pd.Series, *, ranks: bool = True) -> list[str]:
    return figdata.run_marks(r, ranks=ranks)


def _with_marks(steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with ``_marks``: its run's ``_run_marks`` joined, computed once per run, so
    that per-step figures keep traced and unpinned runs apart as the labelled ones do."""
    if "run_id" not in steps:
        return steps.assign(_marks="")
    runs = steps.drop_duplicates("run_id").set_index("run_id")
    marks = {rid: " ".join(_run_marks(r)) for rid, r in runs.iterrows()}
    return steps.assign(_marks=steps["run_id"].map(marks).fillna(""))


def _decomposition_labels(d: pd.DataFrame) -> list[str]:
    labels = []
    for _, r in d.iterrows():
        ranks = r.get("world_size")
        on_ranks = f" x{int(ranks)} ranks" if pd.notna(ranks) and int(ranks) > 1 else ""
        label = f"{r['mode']}{on_ranks}\n{r['policy']} w={r['workers']}"
        # The rank count is on the first line already.
        marks = _run_marks(r, ranks=False)
        if marks:
            label += "\n" + _marks_lines(marks)
        n_runs = r.get("n_runs", r.get("runs"))
        label += f"\n{r['view']}\n{_n(n_runs, 'run')}, {_n(r.get('n_blocks'), 'block')}"
        label += f"\n{_n(r.get('steps'), 'step')}"
        if pd.notna(r.get("across_blocks")) and int(r["across_blocks"]):
            label += f"\n{_n(r['across_blocks'], 'run')} vs twins\nof other blocks"
        if str(r.get("host_source", "compute span")) != "compute span":
            label += "\nhost part: whole step\n(not a budget)"
        labels.append(label)
    return labels


def interference_map(table: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """The interference map (issue 17): one row of panels per policy, one column per metric of
    ``interference_map.MAP_METRICS``; in a panel, loader workers across and (loader cost, batch
    size) down. Inflation is diverging around 1, lost throughput sequential. Cells carry the
    value and the regime's mark: D data-bound (dashed outline), L launch-bound (amber outline)."""

    policies = sorted(table["policy"].astype(str).unique()) if len(table) else []
    n_rows = max(1, len(policies))
    fig, axes = plt.subplots(
        n_rows,
        len(imap.MAP_METRICS),
        figsize=(15, 2.6 * n_rows + 1),
        layout="constrained",
        squeeze=False,
    )
    if not policies:
        for ax in axes.flat:
            _note(ax, "no combined runs to map")
    for i, policy in enumerate(policies):
        for j, (metric, title) in enumerate(imap.MAP_METRICS.items()):
            _map_panel(fig, axes[i, j], imap.map_grid(table, policy, metric), metric)
            axes[i, j].set_title(f"{title}\npolicy {policy}", fontsize=9)
    # How many runs each cell's numbers rest on: inflation intervals are in the table, not here.
    runs = ""
    if "n_runs" in table and len(table):
        lo, hi = int(table["n_runs"].min()), int(table["n_runs"].max())
        runs = f"; {lo if lo == hi else f'{lo}-{hi}'} run(s) per cell, means and p95 of their steps"
    fig.suptitle("Interference map: D = data-bound, L = launch-bound, unmarked = balanced" + runs)
    _save(fig, outputs)


def _map_panel(fig: Any, ax: Any, grid: Any, metric: str) -> None:

    finite = grid.values[np.isfinite(grid.values)]
    norm: Any
    if metric.startswith("inflation"):
        cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#eeeeee")
        reach = float(np.nanmax(np.abs(np.log(finite[finite > 0])))) if finite.size else 0.0
        r = float(np.exp(max(reach, 0.05)))
        norm = matplotlib.colors.LogNorm(vmin=1 / r, vmax=r)
    else:
        cmap = plt.get_cmap("Oranges").with_extremes(bad="#eeeeee")
        norm = matplotlib.colors.Normalize(0, max(float(finite.max()) if finite.size else 0, 0.05))
    im = ax.imshow(np.ma.masked_invalid(grid.values), aspect="auto", cmap=cmap, norm=norm)
    ax.set_xticks(range(len(grid.workers)), [str(w) for w in grid.workers])
    ax.set_yticks(range(len(grid.rows)), grid.rows)
    ax.set_xlabel("loader workers per rank")
    # Outlines visible on white and on the darkest red: dashed black, solid amber.
    edge = {"data-bound": ("#222222", "--"), "launch-bound": ("#ffb000", "-")}
    for (i, k), v in np.ndenumerate(grid.values):
        if not np.isfinite(v):
            ax.text(k, i, "n/a", ha="center", va="center", color="#777777", fontsize=SMALL)
            continue
        regime = str(grid.regimes[i, k])
        mark = REGIME_MARKS.get(regime, "")
        text = f"{v:.2f}" if metric.startswith("inflation") else f"{v * 100:.0f}%"
        color = _text_color(cmap, norm, v)
        ax.text(
            k, i, f"{text} {mark}".strip(), ha="center", va="center", color=color, fontsize=SMALL
        )
        if regime in edge:
            ax.add_patch(
                matplotlib.patches.Rectangle(
                    (k - 0.45, i - 0.45),
                    0.9,
                    0.9,
                    fill=False,
                    lw=2,
                    ec=edge[regime][0],
                    ls=edge[regime][1],
                )
            )
    bar = fig.colorbar(im, ax=ax, shrink=0.85)
    if metric.startswith("inflation"):
        ticks = np.unique(np.round(np.geomspace(norm.vmin, norm.vmax, 5), 2))
        bar.set_ticks(ticks.tolist(), labels=[f"{t:.2f}" for t in ticks])
        bar.ax.minorticks_off()
    else:
        # The cells print the fraction as a percentage; the bar speaks the same unit.
        bar.ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(xmax=1, decimals=0))


def predicted_vs_measured(
    table: pd.DataFrame, outputs: Sequence[Path], *, summary: dict[str, float]
) -> None:
    """The advisor's check (issue 17): predicted vs measured per-rank throughput of every
    verification setting, with the model's one-run interval; the diagonal and a +-10 % band;
    the advised setting as a star. ``summary`` is ``advisor.verify.prediction_summary`` of the
    table."""
    fig, ax = plt.subplots(figsize=(6.5, 5.5), layout="constrained")
    d = table.dropna(subset=["measured"])
    if d.empty:
        _note(ax, "no verification run measured yet")
        _save(fig, outputs)
        return
    edges = ["measured", "pred_hi", "throughput", "measured_hi"]
    top = float(np.nanmax([d[c].max() for c in edges if c in d]))
    line = np.array([0.0, top * 1.1])
    ax.fill_between(line, line * 0.9, line * 1.1, color="#dddddd", label="+-10 %")
    ax.plot(line, line, color="#777777", lw=1, label="predicted = measured")
    colors: dict[str, Any] = {}
    for policy, g in d.groupby("policy"):
        yerr = _yerr(_column(g, "throughput"), _column(g, "pred_lo"), _column(g, "pred_hi"))
        # 95 % bootstrap interval of the measured mean (advisor.verify.score_predictions), on
        # settings of MIN_INTERVAL_RUNS runs or more: of one run it resamples only its steps.
        _, xerr = _arm_interval(
            _column(g, "n_runs") >= MIN_INTERVAL_RUNS,
            _column(g, "measured"),
            _column(g, "measured_lo"),
            _column(g, "measured_hi"),
        )
        drawn = ax.errorbar(
            g["measured"], g["throughput"], xerr=xerr, yerr=yerr, fmt="o", capsize=3, label=policy
        )
        colors[str(policy)] = drawn[0].get_color()
    best = d[d["advised"].astype(bool)]
    if not best.empty:
        ax.plot(
            best["measured"], best["throughput"], "*", ms=16, mfc="none", mec="k", label="advised"
        )
    ax.set_xlim(0, top * 1.1)
    ax.set_ylim(0, top * 1.1)
    _point_labels(
        ax,
        d["measured"].to_numpy(dtype=float),
        d["throughput"].to_numpy(dtype=float),
        [f"{int(w)}w" for w in d["workers"]],
        # In its point's colour (the policy's), joined to it by a thin line.
        [colors.get(str(p), "k") for p in d["policy"]],
    )
    lo_n, hi_n = int(d["n_runs"].min()), int(d["n_runs"].max())
    many = np.isfinite(_column(d, "measured_lo")) & (_column(d, "n_runs") >= MIN_INTERVAL_RUNS)
    ci = "" if not many.any() else " [95 % CI]" if many.all() else " [95 % CI if >= 2 runs]"
    ax.set_xlabel(f"measured throughput per rank (samples/s, mean of runs{ci})")
    ax.set_ylabel("predicted (samples/s) [one-run interval]")
    versus = f"advised vs best measured {summary['advised_vs_best'] * 100:+.1f} %"
    if np.isfinite(summary.get("advised_vs_other", np.nan)):
        versus += f"; advised / best other {summary['advised_vs_other']:.2f}"
        if lo_n >= MIN_INTERVAL_RUNS:
            versus += (
                f" [{summary['advised_vs_other_lo']:.2f}, {summary['advised_vs_other_hi']:.2f}]"
            )
    runs = f"{lo_n}" if lo_n == hi_n else f"{lo_n}-{hi_n}"
    ax.set_title(
        f"{int(summary['settings'])} settings, {runs} runs each: |error| median "
        f"{summary['median_abs_error'] * 100:.0f} %, "
        f"worst {summary['worst_abs_error'] * 100:.0f} %;\n{versus}",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower right")
    _save(fig, outputs)


# Where a point's label may sit, in points from the point: right, left, above, below, then
# further out; the first that overlaps no label placed before is taken.
LABEL_OFFSETS = (
    (4, 3), (4, -10), (-16, 3), (-16, -10), (-6, 8), (-6, -15), (10, 12), (10, -18),
    (-22, 12), (-22, -18), (16, 20), (-28, 20), (16, -26), (-28, -26),
)  # fmt: skip


def _point_labels(
    ax: Any,
    x: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    labels: list[str],
    colors: list[Any],
) -> None:
    """Label each point with the first offset of ``LABEL_OFFSETS`` whose text box overlaps no
    label already placed: points a few pixels apart get labels that do not print over each
    other (the last candidate is taken when all collide). Boxes are measured, not guessed."""
    from matplotlib.text import Text

    fig = ax.figure
    fig.draw_without_rendering()  # the layout first: it moves the points
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    order = np.lexsort((x, -y))  # top first: its labels take the free places above
    for i in order:
        if not (np.isfinite(x[i]) and np.isfinite(y[i])):
            continue
        label = ax.annotate(
            labels[i],
            (x[i], y[i]),
            fontsize=SMALL,
            color=colors[i],
            xytext=LABEL_OFFSETS[0],
            textcoords="offset points",
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": colors[i]},
        )
        for offset in LABEL_OFFSETS:
            label.set_position(offset)
            label.update_positions(renderer)
            # The text's own box (an Annotation's includes its leader line).
            box = Text.get_window_extent(label, renderer)
            if not any(box.overlaps(b) for b in placed):
                break
        placed.append(box)


def share_throughput(report: pd.DataFrame, outputs: Sequence[Path], *, jobs: Sequence[str]) -> None:
    """Sharing a node: per split, each job's throughput (bars, samples/s per rank) and the
    jobs' sum (outlined bar), with the report's intervals; the CPUs each job had under the bar
    labels, the split that ran the advised shares marked."""
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * max(1, len(report)), 4.2), layout="constrained")
    if report.empty:
        _note(ax, "no shared-node runs")
        _save(fig, outputs)
        return
    x = np.arange(len(report))
    width = 0.8 / (len(jobs) + 1)
    for i, col in enumerate([*jobs, "total"]):
        err = None
        if f"{col}_lo" in report and report[f"{col}_lo"].notna().any():
            # 95 % bootstrap interval of the mean over repeats (share.share_report).
            err = np.vstack([report[col] - report[f"{col}_lo"], report[f"{col}_hi"] - report[col]])
        style: dict[str, Any] = {"label": col, "yerr": err, "capsize": 3}
        if col == "total":
            style |= {"fill": False, "ec": "k"}
        ax.bar(x + i * width, report[col], width, **style)
    advised = report["advised"] if "advised" in report else pd.Series(False, index=report.index)
    labels = [
        f"{s}{' (advised)' if a else ''}\n" + " / ".join(str(r[f"cpus_{j}"]) for j in jobs)
        for s, a, (_, r) in zip(report["split"], advised, report.iterrows(), strict=True)
    ]
    ax.set_xticks(x + 0.4 - width / 2, labels, fontsize=8)
    ax.set_ylabel("samples/s (a job: per rank; total: the jobs' sum)")
    lo, hi = (
        (int(report["repeats"].min()), int(report["repeats"].max()))
        if "repeats" in report
        else (1, 1)
    )
    reps = str(lo) if lo == hi else f"{lo}-{hi}"
    ax.set_title(
        "Jobs sharing a node: per job and total, per CPU split (CPUs per job below)\n"
        f"mean of {reps} repeats" + (", 95 % bootstrap interval" if hi > 1 else "")
    )
    ax.legend(fontsize=8)
    _save(fig, outputs)
