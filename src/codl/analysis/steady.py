"""Steady state: flag the anomalous steps of a run instead of averaging them in.

The rule, per run and rank, on step time (``step_ms``) over the measured steps:

1. threshold = median + max(Z * 1.4826 * MAD, MIN_EXCESS * median), with ``Z`` = 5 and
   ``MIN_EXCESS`` = 0.5. 1.4826 * MAD estimates the standard deviation of normal noise without
   being moved by the outliers themselves; the relative floor keeps a run whose steps are
   identical to the microsecond (MAD = 0) from flagging every step 1 % slower.
2. Only slow steps count: a step cannot be faster than its work, and none of the causes looked
   for (warm-up leftovers, garbage collection, autotuning, a straggling rank) makes one faster.
3. Steps beyond the threshold are *anomalies* only while they are rare: at most
   ``max(1, floor(MAX_SHARE * n))`` of a rank's n steps (MAX_SHARE = 1 %). More of them are a
   tail of the run's distribution - what interference produces (loader bursts preempting the
   launch thread at every epoch start) - and are kept, counted as ``tail_steps``. Excluding them
   would remove the very effect the comparison looks for.
4. The first measured step is flagged whenever it is beyond the threshold, whatever the count:
   it is the known warm-up leftover (allocator growth, cuDNN autotuning of the first real shape).

Flagged steps carry a reason: their position and the phase whose time rose most above the
rank's median, and for a rank that waited on a peer in its AllReduce, the rank it waited for.
Comparisons use the steps that are not flagged (the steady state) and report the counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

OUTLIER_Z = 5.0
OUTLIER_MIN_EXCESS = 0.5
OUTLIER_MAX_SHARE = 0.01
# 1 / Phi^-1(3/4): scales the median absolute deviation to a standard deviation under normality.
MAD_TO_SD = 1.4826
# Wall-time columns whose excess names the cause of a flagged step.
REASON_PHASES = (
    "data_wait_ms",
    "h2d_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "allreduce_ms",
    "sleep_ms",
    "peer_wait_ms",
)


def outlier_threshold(values: npt.ArrayLike) -> float:
    """The step time above which a step is a candidate anomaly (rule step 1); NaN when empty."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not len(x):
        return float("nan")
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    return med + max(OUTLIER_Z * MAD_TO_SD * mad, OUTLIER_MIN_EXCESS * med)


def max_outliers(n: int) -> int:
    """How many candidates a rank of n steps may have before they count as a tail (step 3)."""
    return max(1, int(np.floor(OUTLIER_MAX_SHARE * n)))


def _reason(rows: pd.DataFrame, first: int, i: Any) -> str:
    row: dict[str, Any] = rows.loc[i].to_dict()
    step = int(row["step"])
    parts = ["first measured step" if step == first else f"step {step}"]
    excess = {
        c: float(row[c]) - float(rows[c].median())
        for c in REASON_PHASES
        if c in rows and pd.notna(row[c]) and rows[c].notna().any()
    }
    if excess:
        phase, ms = max(excess.items(), key=lambda kv: kv[1])
        if ms > 0:
            parts.append(f"{phase.removesuffix('_ms')} +{ms:.1f} ms over the rank's median")
            straggler = row.get("straggler_rank", np.nan)
            if phase == "peer_wait_ms" and pd.notna(straggler) and straggler != row["rank"]:
                parts.append(f"waits for rank {int(straggler)}")
    return "; ".join(parts)


def flag_outliers(steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with ``outlier`` (bool), ``outlier_reason`` (str, '' when not flagged) and
    ``tail_step`` (bool: beyond the threshold but part of a tail, so kept).

    Groups are (run_id, rank) when ``run_id`` is a column, else rank: the rule is applied to
    each rank of each run on its own.
    """
    out = steps.copy()
    out["outlier"] = False
    out["outlier_reason"] = ""
    out["tail_step"] = False
    if out.empty or "step_ms" not in out:
        return out
    keys = [k for k in ("run_id", "rank") if k in out]
    groups = out.groupby(keys, sort=False).groups.values() if keys else [out.index]
    for idx in groups:
        g = out.loc[idx]
        x = g["step_ms"]
        thr = outlier_threshold(x)
        beyond = g.index[(x > thr).to_numpy()]
        if not len(beyond):
            continue
        first = int(g["step"].min())
        is_first = g.loc[beyond, "step"].to_numpy() == first
        rest = beyond[~is_first]
        flagged = list(beyond[is_first])
        if len(rest) <= max_outliers(len(g)):
            flagged += list(rest)
        else:
            out.loc[rest, "tail_step"] = True
        for i in flagged:
            out.loc[i, "outlier"] = True
            out.loc[i, "outlier_reason"] = _reason(g, first, i)
    return out


def steady(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps that are not flagged (all of them when nothing was flagged yet)."""
    if "outlier" not in steps:
        return steps
    return steps[~steps["outlier"].fillna(False).astype(bool)]
