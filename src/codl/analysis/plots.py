"""Figures. Each function draws one figure from prepared DataFrames and saves it; nothing here
computes a statistic (that is summarize/compare/figdata) or reads a trace.

A panel whose data cannot exist on this run set (CUDA-only metrics on a CPU run) says so in
the figure instead of staying blank.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

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
    for out in outputs:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _note(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


# Beyond this ratio the twin is next to zero and a percentage says nothing readable.
MAX_LABEL_RATIO = 10.0


def _effect_label(ratio: float, diff: float, p50_ratio: float) -> str:
    """'+44%' (or '+0.36' when the twin is ~0 and the difference carries it), with p50 beside."""
    readable = np.isfinite(ratio) and ratio <= MAX_LABEL_RATIO
    main = f"{(ratio - 1) * 100:+.0f}%" if readable else f"{diff:+.2g}"
    readable50 = np.isfinite(p50_ratio) and p50_ratio <= MAX_LABEL_RATIO
    side = f"\n(p50 {(p50_ratio - 1) * 100:+.0f}%)" if readable50 else ""
    return main + side


def component_durations(
    headline: pd.DataFrame, outputs: Sequence[Path], *, metrics: Sequence[str] | None = None
) -> None:
    """Fig. 1: isolation vs combined per policy at the headline statistic (one row per
    comparison, as ``compare.headline`` gives: p95 with its 95 % CI, p50 change beside it).

    The data component is shown as per-item loader service time, not data wait: an isolation
    `data` run waits for data all step long, so its data wait is not comparable.
    """
    metrics = list(metrics or DEFAULT_COMPONENT_METRICS)
    usable = len(headline) and {"status", "metric"} <= set(headline)
    ok = headline[headline["status"] == "ok"] if usable else pd.DataFrame()
    present = [m for m in metrics if len(ok) and m in set(ok["metric"])]
    fig, axes = plt.subplots(1, max(1, len(present)), figsize=(4.2 * max(1, len(present)), 3.8))
    axes = np.atleast_1d(axes)
    if not present:
        why = "no isolation/combined pairs in this run set\n(add isolation modes)"
        if usable:
            missing = headline.loc[headline["status"] != "ok", "status"].astype(str)
            if len(missing):
                why += "\n\n" + "\n".join(textwrap.wrap(missing.iloc[0], 70))
        _note(axes[0], why)
        _save(fig, outputs)
        return
    stat = str(ok["stat"].iloc[0]) if "stat" in ok else "median"
    for ax, metric in zip(axes, present, strict=True):
        d = ok[ok["metric"] == metric].copy()
        d["label"] = (
            d["policy"].astype(str)
            + "\nw="
            + d["workers"].astype(str)
            + ("\n" + d["mode"].astype(str) if d["mode"].nunique() > 1 else "")
        )
        # Runs with a CUPTI level are slower by themselves: mark them so no one compares across.
        for col, mark in (("cupti", "\n+CUPTI"), ("cuda_api", "\n+API")):
            if col in d:
                on = d[col].astype(str).str.lower() == "true"
                d.loc[on, "label"] = d.loc[on, "label"] + mark
        d = d.sort_values(["policy", "workers", "mode"])
        x = np.arange(len(d))
        iso = d["isolation"].to_numpy(dtype=float)
        comb = d["combined"].to_numpy(dtype=float)
        # The interval of the difference places the combined bar's error bar on the value
        # axis; it exists even where the twin is 0 and a ratio does not.
        lo = iso + d["diff_ci_low"].to_numpy(dtype=float)
        hi = iso + d["diff_ci_high"].to_numpy(dtype=float)
        ax.bar(x - 0.2, iso, 0.4, color=ISO_COLOR, label="isolation")
        ax.bar(
            x + 0.2,
            comb,
            0.4,
            color=COMB_COLOR,
            label="combined",
            yerr=np.vstack([np.clip(comb - lo, 0, None), np.clip(hi - comb, 0, None)]),
            capsize=3,
        )
        p50 = d["p50_ratio"] if "p50_ratio" in d else pd.Series(np.nan, index=d.index)
        for xi, c, r, df_, r50 in zip(
            x, comb, d["ratio"], d["diff"], p50.to_numpy(dtype=float), strict=True
        ):
            if np.isfinite(c):
                ax.text(
                    xi + 0.2, c, _effect_label(r, df_, r50), ha="center", va="bottom", fontsize=6
                )
        # Labels carry the mode too when modes are mixed: tilt them so they do not collide.
        many = d["mode"].nunique() > 1
        ax.set_xticks(x, d["label"], fontsize=6 if many else 7, rotation=35 if many else 0)
        ax.set_ylabel(f"{stat} of {METRIC_LABELS.get(metric, metric)}")
        ax.set_title(METRIC_LABELS.get(metric, metric).split(" (")[0], fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"Isolation vs combined at the {stat} of the steady-state steps (95 % bootstrap CI;"
        " p50 change in brackets)",
        fontsize=10,
    )
    _save(fig, outputs)


def api_latency_cdf(api: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 2: CDF of CUDA runtime API call latency, isolation vs combined."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    # A log axis cannot show zero-length calls (clock granularity); they are left out.
    api = api[api["us"] > 0] if {"label", "us"} <= set(api) else pd.DataFrame()
    if api.empty:
        _note(
            ax,
            "CUDA runtime API latency needs trace.cuda_api or trace.cupti\n"
            "on a CUDA run; none of these runs has either.",
        )
        _save(fig, outputs)
        return
    for label, g in api.groupby("label"):
        us = np.sort(g["us"].to_numpy())
        ax.plot(us, np.arange(1, len(us) + 1) / len(us), label=f"{label} (n={len(us)})")
    ax.set_xscale("log")
    ax.set_xlabel("runtime API call duration (us)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=7)
    ax.set_title("CUDA runtime API latency", fontsize=10)
    _save(fig, outputs)


def launch_wait_vs_compute(steps: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 3: per step, launch-thread run-queue wait against compute duration."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
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
    for (mode, policy), g in d.groupby(["mode", "policy"]):
        ax.scatter(
            g["launch_wait_ms"],
            g["compute_eff_ms"],
            s=14,
            marker=markers.get(str(policy), "o"),
            label=f"{mode} / {policy}",
            alpha=0.75,
        )
    ax.set_xlabel("launch-thread run-queue wait during the step (ms)")
    ax.set_ylabel("compute duration (ms)")
    ax.set_title("Mechanism: waiting launch thread -> longer compute", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    _save(fig, outputs)


def step_timeline(timeline: pd.DataFrame, outputs: Sequence[Path], *, title: str = "") -> None:
    """Fig. 4: one combined step, every track (threads, workers, GPU) on one time axis.

    Launch-thread and GPU spans are coloured by phase, other tracks by thread role; run-queue
    waits are hatched (schedstat gives their total, so they are drawn ending at the step end).
    """
    tracks = list(dict.fromkeys(timeline["track"])) if len(timeline) else []
    fig, ax = plt.subplots(figsize=(10, 0.35 * max(4, len(tracks)) + 1.6))
    if not tracks:
        _note(ax, "no combined run with a loader in this run set")
        _save(fig, outputs)
        return
    ypos = {t: i for i, t in enumerate(tracks)}
    span_ms = float(timeline["end_ms"].max())
    phases = timeline["phase"] if "phase" in timeline else pd.Series("", index=timeline.index)
    legend: dict[str, Any] = {}
    for (_, r), phase in zip(timeline.iterrows(), phases.astype(str), strict=True):
        wait = r["kind"] == "wait"
        by_phase = r["role"] in {"launch", "gpu"} and phase in PHASE_COLORS
        if by_phase:
            color, key = PHASE_COLORS[phase], phase
        else:
            color = ROLE_COLORS.get(str(r["role"]), WAIT_COLOR)
            key = f"{r['role']} (run-queue wait)" if wait else str(r["role"])
        bar = ax.barh(
            ypos[r["track"]],
            r["end_ms"] - r["start_ms"],
            left=r["start_ms"],
            height=0.7,
            color=color,
            alpha=0.35 if wait else 0.9,
            hatch="//" if wait else None,
            edgecolor="none",
        )
        legend.setdefault(key, bar)
        if r["end_ms"] - r["start_ms"] > 0.04 * span_ms and r["label"]:
            ax.text(
                (r["start_ms"] + r["end_ms"]) / 2,
                ypos[r["track"]],
                str(r["label"]),
                ha="center",
                va="center",
                fontsize=6,
            )
    ax.set_yticks(range(len(tracks)), tracks, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time since step start (ms)")
    ax.set_title(title or "One combined step", fontsize=10)
    # Phases first, in step order, then roles: the legend reads like the step.
    order = [p for p in PHASE_COLORS if p in legend] + [k for k in legend if k not in PHASE_COLORS]
    ax.legend(
        [legend[k] for k in order],
        order,
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    _save(fig, outputs)


def policy_heatmap(table: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 5: policy x workers: throughput, and compute inflation (combined / isolation)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = (
        ("throughput_samples_s", "throughput (samples/s)"),
        ("ratio", "compute inflation (p95 ratio)"),
    )
    for ax, (col, title) in zip(axes, panels, strict=True):
        d = table.dropna(subset=[col]) if col in table else pd.DataFrame()
        if d.empty:
            _note(ax, f"no data for {title}")
            continue
        grid = d.pivot_table(index="policy", columns="workers", values=col, aggfunc="median")
        im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="viridis")
        ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
        ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index])
        ax.set_xlabel("loader workers")
        ax.set_ylabel("policy")
        for (i, j), v in np.ndenumerate(grid.to_numpy(dtype=float)):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", color="w", fontsize=8)
        fig.colorbar(im, ax=ax)
        ax.set_title(title, fontsize=10)
    _save(fig, outputs)


def _flagged(steps: pd.DataFrame) -> pd.Series:
    if "outlier" not in steps:
        return pd.Series(False, index=steps.index)
    return steps["outlier"].astype(str).str.lower() == "true"


def step_time_distributions(steps: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 6: step-time distribution per mode (and policy): boxes of the steady-state steps,
    flagged anomalous steps drawn apart as crosses and counted in the label."""
    groups: list[tuple[str, Any, Any]] = []
    if len(steps) and {"mode", "policy", "step_ms"} <= set(steps):
        for (m, p), grp in steps.groupby(["mode", "policy"]):
            g = grp.dropna(subset=["step_ms"])
            flag = _flagged(g)
            n_out = int(flag.sum())
            label = f"{m}\n{p}" + (f"\n{n_out} flagged" if n_out else "")
            groups.append((label, g.loc[~flag, "step_ms"].to_numpy(), g.loc[flag, "step_ms"]))
        groups = [(n, v, o) for n, v, o in groups if len(v)]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(groups)), 4))
    if not groups:
        _note(ax, "no measured steps")
        _save(fig, outputs)
        return
    ax.boxplot([g for _, g, _ in groups], showfliers=True)
    for i, (_, _, out) in enumerate(groups, start=1):
        if len(out):
            ax.scatter(np.full(len(out), i), out, marker="x", color="#c44e52", s=40, zorder=3)
    ax.set_xticks(range(1, len(groups) + 1), [n for n, _, _ in groups], fontsize=7, rotation=45)
    ax.set_ylabel("step time (ms)")
    ax.set_title(
        "Step-time distributions per mode and policy (x: flagged anomalous steps)", fontsize=10
    )
    _save(fig, outputs)


PART_COLORS = {
    "host_launch_delay_ms": ("host launch delay", "#c44e52"),
    "peer_wait_ms": ("peer wait", "#8172b3"),
    "transfer_ms": ("transfer", "#55a868"),
    "gpu_slowdown_ms": ("GPU slowdown", "#dd8452"),
    "unattributed_ms": ("unattributed", "#b0b0b0"),
}


def decomposition(means: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 7: per mode and policy, the mean compute inflation against the twin (black
    diamond) and its parts stacked (positive up, negative down), over all steady-state steps
    and over the slowest steps. Prepared by ``decompose.decomposition_means``."""
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * max(1, len(means))), 4.4))
    if means.empty:
        _note(
            ax,
            "no run with a twin to decompose against\n"
            "(needs e.g. combined with compute+comm, or data+compute with compute)",
        )
        _save(fig, outputs)
        return
    d = means.reset_index(drop=True)
    labels = []
    for _, r in d.iterrows():
        ranks = r.get("world_size")
        on_ranks = f" x{int(ranks)} ranks" if pd.notna(ranks) and int(ranks) > 1 else ""
        label = f"{r['mode']}{on_ranks}\n{r['policy']} w={r['workers']}\n{r['view']}"
        for col, mark in (("cupti", " +CUPTI"), ("cuda_api", " +API")):
            if str(r.get(col)).lower() == "true":
                label += mark
        labels.append(label)
    x = np.arange(len(d))
    up = np.zeros(len(d))
    down = np.zeros(len(d))
    for col, (name, color) in PART_COLORS.items():
        v = d[col].to_numpy(dtype=float) if col in d else np.zeros(len(d))
        v = np.nan_to_num(v)
        pos, neg = np.clip(v, 0, None), np.clip(v, None, 0)
        ax.bar(x, pos, 0.6, bottom=up, color=color, label=name)
        ax.bar(x, neg, 0.6, bottom=down, color=color)
        up += pos
        down += neg
    ax.scatter(
        x, d["compute_inflation_ms"], marker="D", color="k", zorder=3, label="compute inflation"
    )
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(x, labels, fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("ms per step beyond the twin (mean)")
    ax.set_title("Why compute got slower: inflation against the twin, by cause", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _save(fig, outputs)
