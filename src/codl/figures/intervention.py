"""The intervention figure of a block experiment (the `pooled` rule): compute inflation
per setting with each block's point beside the interval over blocks, and the decomposition's
host-blocked part per setting. ``inflation_points`` and ``host_blocked`` prepare the data
(pure); ``draw_intervention`` draws it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from codl.analysis.runlevel import mean_interval

#: The setting columns of a pooled inflation table that tell its rows apart, in label order.
SETTING_KEYS = ("handoff", "policy", "workers", "worker_nice", "pin_memory_place")
HANDOFF_COLORS = {"torch": "#dd8452", "ring": "#4c72b0"}


def setting_label(row: pd.Series, keys: Sequence[str]) -> str:
    """A setting's axis label: its ``keys`` that tell it apart, as a reader names them."""
    parts = []
    for k in keys:
        v = row[k]
        if k == "workers":
            parts.append(f"{v} w")
        elif k == "worker_nice":
            if int(v or 0):
                parts.append(f"nice {int(v)}")
        elif k == "pin_memory_place":
            # Read only by policy `isolated`, and only torch's loader has the thread.
            if row.get("handoff", "torch") == "torch" and row.get("policy") == "isolated":
                parts.append(f"pin thread: {v}")
        else:
            parts.append(str(v))
    return " | ".join(parts)


def inflation_points(pooled: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, block): the block's inflation (percent), with the setting's
    geometric mean and interval, from a pooled table's ``per_block`` column."""
    keys = [k for k in SETTING_KEYS if k in pooled]
    rows = []
    for _, r in pooled.iterrows():
        label = setting_label(r, keys)
        for text in str(r["per_block"]).split():
            rows.append(
                {
                    "setting": label,
                    "handoff": r.get("handoff", "torch"),
                    "block_pct": float(text),
                    "mean_pct": 100 * float(r["inflation"]),
                    "lo_pct": 100 * float(r["inflation_lo"]),
                    "hi_pct": 100 * float(r["inflation_hi"]),
                    "n_blocks": int(r["n_blocks"]),
                }
            )
    return pd.DataFrame(rows)


def host_blocked(decomposition: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per setting: the loading runs' mean host-blocked ms per measured step (decomposition),
    averaged over runs with a t interval; ``runs`` (gil_runs.csv) names each run's setting."""
    keys = [k for k in SETTING_KEYS if k in runs]
    per_run = (
        decomposition[~decomposition["outlier"].astype(bool)]
        .groupby("run_id")["host_blocked_ms"]
        .mean()
        .rename("host_blocked_ms")
        .reset_index()
    )
    d = per_run.merge(runs[["run_id", *keys]], on="run_id")
    out = []
    for key, g in d.groupby(keys):
        iv = mean_interval(g["host_blocked_ms"].tolist())
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        out.append(
            {
                "setting": setting_label(pd.Series(row), keys),
                "handoff": row.get("handoff", "torch"),
                "host_blocked_ms": iv.mean,
                "lo": iv.lo,
                "hi": iv.hi,
                "n_runs": iv.n,
            }
        )
    return pd.DataFrame(out)


def block_strip(
    ax: Any,
    points: pd.DataFrame,
    *,
    value: str,
    mean: str,
    lo: str,
    hi: str,
    label: Callable[[pd.Series, str], str],
) -> dict[str, int]:
    """One row per setting of ``points`` (in their order, the first at the top): a point per
    block (``value``), jittered, coloured by hand-off, and a diamond at the setting's ``mean``
    with its interval (``lo``, ``hi``; none where they are not finite), labelled
    ``label(first row, setting)``. Returns each setting's row."""
    y = {s: i for i, s in enumerate(dict.fromkeys(points["setting"]))}
    rng = np.random.default_rng(0)
    ticks = []
    for s, g in points.groupby("setting", sort=False):
        color = HANDOFF_COLORS.get(str(g["handoff"].iloc[0]), "#8c8c8c")
        jitter = rng.uniform(-0.15, 0.15, len(g))
        ax.scatter(g[value], y[s] + jitter, s=12, color=color, alpha=0.55, lw=0)
        first = g.iloc[0]
        m, low, high = float(first[mean]), float(first[lo]), float(first[hi])
        err = [[m - low], [high - m]] if np.isfinite([low, high]).all() else None
        ax.errorbar(m, y[s], xerr=err, fmt="D", color="black", ms=5, capsize=3)
        ticks.append((y[s], label(first, str(s))))
    ticks.sort()
    ax.set_yticks([t[0] for t in ticks], [t[1] for t in ticks], fontsize=7.5)
    ax.invert_yaxis()
    ax.set_title("points: one per block; diamond: geometric mean, 95 % t interval", fontsize=9)
    return y


def draw_intervention(
    points: pd.DataFrame, blocked: pd.DataFrame, outputs: Sequence[Path], *, title: str = ""
) -> None:
    if points.empty:
        _draw_nothing_paired(outputs, title=title)
        return
    settings = list(dict.fromkeys(points["setting"]))
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(14, 0.6 * len(settings) + 2.2), sharey=True, width_ratios=[3, 2]
    )
    y = block_strip(
        ax,
        points,
        value="block_pct",
        mean="mean_pct",
        lo="lo_pct",
        hi="hi_pct",
        label=lambda first, s: (
            f"{s}\n{first['mean_pct']:+.1f} % [{first['lo_pct']:+.1f}, "
            f"{first['hi_pct']:+.1f}], {first['n_blocks']} blocks"
        ),
    )
    lo, hi = points["block_pct"].min(), points["block_pct"].max()
    ax.set_xlim(min(lo, 0) - 5, hi + 5)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel("compute inflation vs the compute twin of the same block (%)")
    for _, r in blocked.iterrows():
        if r["setting"] not in y:
            continue
        color = HANDOFF_COLORS.get(str(r["handoff"]), "#8c8c8c")
        err: Any = [[r["host_blocked_ms"] - r["lo"]], [r["hi"] - r["host_blocked_ms"]]]
        bx.barh(y[r["setting"]], r["host_blocked_ms"], color=color, height=0.6)
        bx.errorbar(r["host_blocked_ms"], y[r["setting"]], xerr=err, color="black", capsize=3)
        bx.annotate(
            f"{r['host_blocked_ms']:.2f} ms ({r['n_runs']} runs)",
            (r["hi"], y[r["setting"]]),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=7.5,
        )
    bx.margins(x=0.3)
    bx.set_xlabel("host blocked, ms per step (mean over runs, 95 % t)")
    bx.set_title("the launch thread off its CPU during compute", fontsize=9)
    fig.suptitle(title or "compute inflation by hand-off and policy", fontsize=11)
    fig.tight_layout()
    for out in outputs:
        fig.savefig(out, dpi=110)
    plt.close(fig)


def _draw_nothing_paired(outputs: Sequence[Path], *, title: str) -> None:
    """A figure that says why it is empty: no loading run had a twin in its own block."""
    fig, ax = plt.subplots(figsize=(8, 2.5))
    ax.axis("off")
    ax.text(
        0.5,
        0.5,
        "no loading run has a compute twin in its own block:\nno inflation to show",
        ha="center",
        va="center",
    )
    fig.suptitle(title or "compute inflation by hand-off and policy", fontsize=11)
    for out in outputs:
        fig.savefig(out, dpi=110)
    plt.close(fig)
