"""The efficiency figure of a block experiment (the `pooled` rule): per loading setting its
throughput over the roofline of its block (min of data alone and compute alone), a point per
block beside the geometric mean and its interval over blocks, and the time lost per step
against the roofline with its parts stacked. ``efficiency_points`` and ``lost_parts`` prepare
the data (pure, from ``codl.analysis.pooled.efficiency``'s table); ``draw_efficiency`` draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from codl.analysis.efficiency import LOST_COLUMNS, PARTS
from codl.figures.intervention import SETTING_KEYS, block_strip, setting_label

PART_COLORS = {
    "data_wait": "#dd8452",
    "copy": "#937860",
    "compute": "#4c72b0",
    "launch_delay": "#c44e52",
    "unattributed": "#b0b0b0",
}
POINT_COLUMNS = (
    "setting",
    "handoff",
    "block_efficiency",
    "efficiency",
    "lo",
    "hi",
    "n_blocks",
    "limiting_part",
)


def efficiency_points(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, block): the block's efficiency, with the setting's geometric mean,
    interval, block count and limiting part, from the table's ``per_block`` column."""
    keys = [k for k in SETTING_KEYS if k in table]
    rows = []
    for _, r in table.iterrows():
        for text in str(r["per_block"]).split():
            rows.append(
                {
                    "setting": setting_label(r, keys),
                    "handoff": r.get("handoff", "torch"),
                    "block_efficiency": float(text),
                    "efficiency": float(r["efficiency"]),
                    "lo": float(r["efficiency_lo"]),
                    "hi": float(r["efficiency_hi"]),
                    "n_blocks": int(r["n_blocks"]),
                    "limiting_part": str(r["limiting_part"]),
                }
            )
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS))


def lost_parts(table: pd.DataFrame) -> pd.DataFrame:
    """Per setting with an efficiency: the lost time per step and its parts (ms, means over
    blocks), one column per part of ``codl.analysis.efficiency.PARTS``; an unmeasured part is 0
    (its share is in unattributed)."""
    keys = [k for k in SETTING_KEYS if k in table]
    ok = table[np.isfinite(table["efficiency"].astype(float))]
    out = pd.DataFrame({"setting": [setting_label(r, keys) for _, r in ok.iterrows()]})
    out["lost_ms"] = ok["lost_ms"].astype(float).to_numpy()
    for part, col in zip(PARTS, LOST_COLUMNS, strict=True):
        out[part] = ok[col].astype(float).fillna(0.0).to_numpy()
    return out


def draw_efficiency(
    points: pd.DataFrame, outputs: Sequence[Path], *, parts: pd.DataFrame, title: str = ""
) -> None:
    """``efficiency_points`` on the left, ``lost_parts`` stacked on the right."""
    heading = title or "pipeline efficiency: throughput over min(data alone, compute alone)"
    if points.empty:
        _draw_nothing(outputs, heading)
        return
    settings = list(dict.fromkeys(points["setting"]))
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(14, 0.8 * len(settings) + 3.0), sharey=True, width_ratios=[3, 2]
    )

    def label(first: pd.Series, s: str) -> str:
        mean, lo, hi = first["efficiency"], first["lo"], first["hi"]
        interval = f"[{lo:.2f}, {hi:.2f}]" if np.isfinite([lo, hi]).all() else "[no interval]"
        return (
            f"{s}\n{mean:.2f} {interval}, {first['n_blocks']} blocks\n"
            f"roofline: {first['limiting_part']}"
        )

    y = block_strip(
        ax, points, value="block_efficiency", mean="efficiency", lo="lo", hi="hi", label=label
    )
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("throughput / roofline of the same block (1 = a perfect pipeline)")
    _draw_parts(bx, parts, y)
    fig.suptitle(heading, fontsize=11)
    fig.tight_layout()
    for out in outputs:
        fig.savefig(out, dpi=110)
    plt.close(fig)


def _draw_parts(bx: Axes, parts: pd.DataFrame, y: dict[str, int]) -> None:
    """The lost time's parts stacked from 0, positive ones rightwards and negative ones (time a
    part gave back) leftwards, so that the bars' net is the lost time, marked by a tick."""
    for _, r in parts.iterrows():
        if r["setting"] not in y:
            continue
        right = left = 0.0
        for part in PARTS:
            v = float(r[part])
            start = right if v >= 0 else left
            bx.barh(y[r["setting"]], v, left=start, color=PART_COLORS[part], height=0.6)
            right, left = (right + v, left) if v >= 0 else (right, left + v)
        bx.plot([r["lost_ms"]] * 2, [y[r["setting"]] - 0.35, y[r["setting"]] + 0.35], "k-")
    bx.axvline(0, color="grey", lw=0.8)
    bx.set_xlabel("time lost per step against the roofline, ms (mean over blocks)")
    bx.set_title("its parts; black tick: the lost time", fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, color=PART_COLORS[p]) for p in PARTS]
    # Below the axes: inside, it would cover the bars of the last setting.
    bx.legend(
        handles,
        [p.replace("_", " ") for p in PARTS],
        fontsize=7.5,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=3,
        frameon=False,
    )


def _draw_nothing(outputs: Sequence[Path], heading: str) -> None:
    """A figure that says why it is empty: no loading run had both twins in its own block."""
    fig, ax = plt.subplots(figsize=(8, 2.5))
    ax.axis("off")
    ax.text(
        0.5,
        0.5,
        "no loading run has both a data-alone and a compute-alone twin in its own block:\n"
        "no roofline to compare with (add mode `data` to the experiment)",
        ha="center",
        va="center",
    )
    fig.suptitle(heading, fontsize=11)
    for out in outputs:
        fig.savefig(out, dpi=110)
    plt.close(fig)
