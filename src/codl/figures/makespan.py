"""The makespan figure (``codl makespan``, docs/advisor.md "Makespan"): each plan's
makespan, predicted and trace-driven simulated, and the simulated schedule of each plan (cores
per job over time). The data are ``codl.advisor.makespan.plan_table``'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle


def draw_makespan(table: pd.DataFrame, segments: pd.DataFrame, paths: Sequence[Path]) -> None:
    plans = list(table["plan"])
    kinds = [k for k in ("predicted", "simulated") if f"{k}_s" in table]
    fig, axes = plt.subplots(
        1 + len(plans),
        1,
        figsize=(8, 2.2 + 1.4 * len(plans)),
        squeeze=False,
        gridspec_kw={"height_ratios": [1.4] + [1] * len(plans)},
    )
    ax = axes[0][0]
    y = np.arange(len(plans))
    height = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        ax.barh(y + i * height, table[f"{kind}_s"], height=height, label=kind)
    # Each plan's share of simulated job-time at a measured core budget: the rest ran at rates
    # interpolated between budgets, which the title may not pass off as measured.
    labels = (
        [
            f"{p}\n({share:.0%} measured)"
            for p, share in zip(plans, table["measured_share"], strict=True)
        ]
        if "measured_share" in table
        else plans
    )
    ax.set_yticks(y + height * (len(kinds) - 1) / 2, labels)
    ax.set_xlabel("makespan (s)")
    # Room on the right for the legend, clear of the longest bar.
    ax.set_xlim(0, float(table[[f"{k}_s" for k in kinds]].max().max()) * 1.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(
        "queue makespan per plan: predicted (model) and simulated\n"
        "(% measured: its simulated job-time at measured core budgets; the rest interpolated)",
        fontsize=10,
    )
    jobs = list(dict.fromkeys(segments["job"]))
    colors = {j: plt.get_cmap("tab10")(i % 10) for i, j in enumerate(jobs)}
    kind = kinds[-1]
    for row, plan in enumerate(plans, start=1):
        ax = axes[row][0]
        s = segments[(segments["plan"] == plan) & (segments["kind"] == kind)]
        # Jobs stacked by their cores in each segment: a step's height is the node's split.
        for start, seg in s.groupby("start", sort=True):
            bottom = 0
            for _, r in seg.iterrows():
                ax.bar(
                    start,
                    r["cores"],
                    width=r["end"] - start,
                    bottom=bottom,
                    align="edge",
                    color=colors[r["job"]],
                    edgecolor="white",
                    linewidth=0.5,
                )
                bottom += r["cores"]
        ax.set_ylabel(f"{plan}\ncores", fontsize=8)
        ax.set_xlim(0, float(segments.loc[segments["kind"] == kind, "end"].max()) * 1.02)
    axes[-1][0].set_xlabel(f"time (s), {kind} schedule")
    handles = [Rectangle((0, 0), 1, 1, color=colors[j]) for j in jobs]
    fig.legend(handles, jobs, fontsize=8, ncol=len(jobs), loc="lower center")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    for path in paths:
        fig.savefig(path)
    plt.close(fig)
