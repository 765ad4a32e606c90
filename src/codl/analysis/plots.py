"""Figures. Each function draws one figure from prepared DataFrames and saves it; nothing here
computes a statistic (that is summarize/compare/figdata) or reads a trace.

A panel whose data cannot exist on this run set (CUDA-only metrics on a CPU run) says so in
the figure instead of staying blank.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

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
METRIC_LABELS = {
    "compute_eff_ms": "compute duration (ms/step)",
    "launch_wait_ms": "launch-thread run-queue wait (ms/step)",
    "allreduce_ms": "AllReduce (ms/step)",
    "data_wait_ms": "data wait (ms/step)",
    "launch_kernel_us_mean": "cudaLaunchKernel latency (us)",
    "step_ms": "step time (ms)",
    "loader_items_per_step_ms": "loader time per item (ms)",
}


def _save(fig: Any, outputs: Sequence[Path]) -> None:
    for out in outputs:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _note(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def component_durations(
    comparison: pd.DataFrame, outputs: Sequence[Path], *, metrics: Sequence[str] | None = None
) -> None:
    """Fig. 1: isolation vs combined per policy, bars with 95 % CI and % change labels."""
    metrics = list(metrics or ("compute_eff_ms", "launch_wait_ms", "allreduce_ms", "data_wait_ms"))
    ok = comparison[comparison["status"] == "ok"] if len(comparison) else comparison
    present = [m for m in metrics if len(ok) and m in set(ok["metric"])]
    fig, axes = plt.subplots(1, max(1, len(present)), figsize=(4.2 * max(1, len(present)), 3.8))
    axes = np.atleast_1d(axes)
    if not present:
        _note(axes[0], "no isolation/combined pairs in this run set\n(add isolation modes)")
        _save(fig, outputs)
        return
    for ax, metric in zip(axes, present, strict=True):
        d = ok[ok["metric"] == metric].copy()
        d["label"] = (
            d["policy"].astype(str)
            + "\nw="
            + d["workers"].astype(str)
            + ("\n" + d["mode"].astype(str) if d["mode"].nunique() > 1 else "")
        )
        d = d.sort_values(["policy", "workers", "mode"])
        x = np.arange(len(d))
        iso = d["isolation"].to_numpy()
        comb = d["combined"].to_numpy()
        lo = iso * d["ci_low"].to_numpy()
        hi = iso * d["ci_high"].to_numpy()
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
        for xi, c, r in zip(x, comb, d["ratio"].to_numpy(), strict=True):
            if np.isfinite(r):
                ax.text(xi + 0.2, c, f"{(r - 1) * 100:+.0f}%", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, d["label"], fontsize=7)
        ax.set_ylabel(METRIC_LABELS.get(metric, metric))
        ax.set_title(METRIC_LABELS.get(metric, metric).split(" (")[0], fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle("Isolation vs combined, per CPU-set policy (95 % bootstrap CI)", fontsize=10)
    _save(fig, outputs)


def api_latency_cdf(api: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 2: CDF of CUDA runtime API call latency, isolation vs combined."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    if api.empty:
        _note(
            ax,
            "CUDA runtime API latency needs the CUPTI level (trace.cupti: true)\n"
            "on a CUDA run; none of these runs has it.",
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
    d = steps.dropna(subset=["launch_wait_ms", "compute_eff_ms"]) if len(steps) else steps
    if "compute_eff_ms" in d:
        d = d[d["compute_eff_ms"] > 0]
    if d.empty:
        _note(ax, "no steps with both compute and launch-thread samples")
        _save(fig, outputs)
        return
    markers = dict(zip(sorted(d["policy"].astype(str).unique()), "osD^v<>", strict=False))
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
    """Fig. 4: one combined step, every track (threads, workers, GPU) on one time axis."""
    tracks = list(dict.fromkeys(timeline["track"])) if len(timeline) else []
    fig, ax = plt.subplots(figsize=(10, 0.35 * max(4, len(tracks)) + 1.2))
    if not tracks:
        _note(ax, "no combined run with a loader in this run set")
        _save(fig, outputs)
        return
    ypos = {t: i for i, t in enumerate(tracks)}
    for _, r in timeline.iterrows():
        color = ROLE_COLORS.get(str(r["role"]), "#8c8c8c")
        alpha = 0.35 if r["kind"] == "wait" else 0.9
        ax.barh(
            ypos[r["track"]],
            r["end_ms"] - r["start_ms"],
            left=r["start_ms"],
            height=0.7,
            color=color,
            alpha=alpha,
            hatch="//" if r["kind"] == "wait" else None,
            edgecolor="none",
        )
        if r["end_ms"] - r["start_ms"] > 0.04 * float(timeline["end_ms"].max()) and r["label"]:
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
    _save(fig, outputs)


def policy_heatmap(table: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 5: policy x workers: throughput, and compute inflation (combined / isolation)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = (("throughput_samples_s", "throughput (samples/s)"), ("ratio", "compute inflation"))
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


def step_time_distributions(steps: pd.DataFrame, outputs: Sequence[Path]) -> None:
    """Fig. 6: step-time distribution per mode (and policy)."""
    fig, ax = plt.subplots(
        figsize=(
            max(5, 0.7 * max(1, len(steps.groupby(["mode", "policy"])) if len(steps) else 1)),
            4,
        )
    )
    if steps.empty:
        _note(ax, "no measured steps")
        _save(fig, outputs)
        return
    groups = [
        (f"{m}\n{p}", g["step_ms"].dropna().to_numpy())
        for (m, p), g in steps.groupby(["mode", "policy"])
    ]
    ax.boxplot([g for _, g in groups], showfliers=True)
    ax.set_xticks(range(1, len(groups) + 1), [n for n, _ in groups], fontsize=7, rotation=45)
    ax.set_ylabel("step time (ms)")
    ax.set_title("Step-time distributions per mode and policy", fontsize=10)
    _save(fig, outputs)
