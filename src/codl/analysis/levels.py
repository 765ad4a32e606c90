"""The invocation as a level: per-block ratios pooled over several invocations (results
directories, nodes, days) without treating their blocks as independent of the invocation.

Blocks of one invocation share its machine, its boot and its day; pooling 34 blocks from three
invocations as 34 independent draws narrows the interval by the blocks' count when the thing
that varies is the invocation. Three readings per setting, side by side:

- ``blocks``: every block a sample (the pooled table's interval), for comparison;
- ``invocation means``: each invocation's mean log ratio is one sample, Student t with
  n_invocations - 1 degrees of freedom (the headline: the unit that varies is the unit counted);
- ``random effects``: DerSimonian-Laird over the invocations' mean log ratios weighted by their
  within variances, with tau^2, I^2 and Cochran's Q; its interval is the usual normal one, which
  with a handful of invocations is narrower than it should be (read the invocation means').

and, per setting, Levene's test (median-centred: Brown-Forsythe) of equal block-to-block
variance across invocations. Pure: DataFrames in, DataFrames out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import numpy as np
import pandas as pd

from codl.analysis import pooled as pl
from codl.analysis.runlevel import log_ratio_interval

INVOCATION: Final = "invocation"
NODE: Final = "node"
#: What the value columns hold: the geometric mean of the blocks' ratios, as a change (-1).
STATISTIC: Final = "geomean_ratio"
METRIC: Final = "compute_inflation"
SINGLE_INVOCATION: Final = "single invocation"
LEVEL_COLUMNS: Final = (
    *pl.KNOBS,
    "metric",
    "statistic",
    "method",
    "value",
    "low",
    "high",
    "n_runs",
    "n_blocks",
    "n_invocations",
    "n_nodes",
    "note",
    "levene_p",
    "cochran_q",
    "cochran_q_p",
    "tau2",
    "i2",
)


class Method(StrEnum):
    BLOCKS = "blocks"
    INVOCATION_MEANS = "invocation means"
    RANDOM_EFFECTS = "random effects"


@dataclass(frozen=True, kw_only=True)
class Heterogeneity:
    """How much the invocations differ: Levene's p on the blocks' log ratios, and the random
    effects' Cochran Q (with its p), tau^2 (between-invocation variance of the mean log ratio)
    and I^2 (the share of the means' spread beyond the within-invocation noise). NaN where the
    invocations are too few or too small to say."""

    levene_p: float = math.nan
    cochran_q: float = math.nan
    cochran_q_p: float = math.nan
    tau2: float = math.nan
    i2: float = math.nan


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """One method's mean log ratio with its interval (NaN bounds: none)."""

    method: Method
    log_mean: float
    log_lo: float = math.nan
    log_hi: float = math.nan


def invocation_ratios(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Several pooled runs tables (``codl.analysis.pooled.run_row`` rows, one table per
    results directory, keyed by its name) as block-level ratios: ``codl.analysis.pooled.paired``
    of them pooled, with ``invocation`` naming the table each block came from, and within it the
    run's own ``invocation`` token where the table has one (a workflow run in several
    invocations, or under Slurm an allocation per block, writes one results directory)."""
    if not tables:
        raise ValueError("tables: none given, expected one pooled runs table per invocation")
    names = list(tables)
    runs = pl.pool_runs([tables[n] for n in names])
    out = pl.paired(runs)
    own = (
        out[INVOCATION].fillna("").astype(str)
        if INVOCATION in out
        else pd.Series("", index=out.index)
    )
    out[INVOCATION] = [
        f"{names[int(s)]}/{tok}" if tok else names[int(s)]
        for s, tok in zip(out["source"], own, strict=True)
    ]
    return out


def _t_ppf(q: float, df: float) -> float:
    # scipy.stats costs ~0.8 s to import: only where an interval is asked for.
    from scipy import stats

    return float(stats.t.ppf(q, df))


def _norm_ppf(q: float) -> float:
    from scipy import stats

    return float(stats.norm.ppf(q))


def _chi2_sf(x: float, df: float) -> float:
    from scipy import stats

    return float(stats.chi2.sf(x, df))


def levene_p(groups: Sequence[np.ndarray]) -> float:
    """Levene's test, median-centred (Brown-Forsythe: robust to the skew of a few slow blocks),
    over the groups of at least two values; NaN with fewer than two such groups."""
    from scipy import stats

    kept = [g for g in groups if len(g) >= 2]
    if len(kept) < 2:
        return math.nan
    # Each group's distances to its median all alike (two values always are): the statistic
    # is 0/0, and there is nothing to test.
    if all(float(np.ptp(np.abs(g - np.median(g)))) == 0 for g in kept):
        return math.nan
    return float(stats.levene(*kept, center="median").pvalue)


def invocation_means(groups: Sequence[np.ndarray], *, level: float = 0.95) -> Estimate:
    """The mean of the invocations' mean log ratios, Student t over invocations."""
    means = np.array([g.mean() for g in groups], dtype=np.float64)
    k = len(means)
    mean = float(means.mean())
    if k < 2:
        return Estimate(method=Method.INVOCATION_MEANS, log_mean=mean)
    half = _t_ppf(0.5 + level / 2, k - 1) * float(means.std(ddof=1)) / math.sqrt(k)
    return Estimate(
        method=Method.INVOCATION_MEANS, log_mean=mean, log_lo=mean - half, log_hi=mean + half
    )


def random_effects(
    groups: Sequence[np.ndarray], *, level: float = 0.95
) -> tuple[Estimate, Heterogeneity]:
    """DerSimonian-Laird over the invocations' mean log ratios, each with its within variance
    (sample variance over its block count). Needs two invocations of two blocks or more, each
    with some spread (a zero within variance would take all the weight)."""
    y = np.array([g.mean() for g in groups], dtype=np.float64)
    n = np.array([len(g) for g in groups], dtype=np.float64)
    k = len(y)
    if k < 2 or (n < 2).any():
        return Estimate(method=Method.RANDOM_EFFECTS, log_mean=math.nan), Heterogeneity()
    v = np.array([g.var(ddof=1) for g in groups], dtype=np.float64) / n
    if (v <= 0).any():
        return Estimate(method=Method.RANDOM_EFFECTS, log_mean=math.nan), Heterogeneity()
    w = 1 / v
    fixed = float((w * y).sum() / w.sum())
    q = float((w * (y - fixed) ** 2).sum())
    df = k - 1
    c = float(w.sum() - (w**2).sum() / w.sum())
    tau2 = max(0.0, (q - df) / c)
    i2 = max(0.0, (q - df) / q) if q > 0 else 0.0
    w_re = 1 / (v + tau2)
    mean = float((w_re * y).sum() / w_re.sum())
    half = _norm_ppf(0.5 + level / 2) * math.sqrt(1 / float(w_re.sum()))
    est = Estimate(
        method=Method.RANDOM_EFFECTS, log_mean=mean, log_lo=mean - half, log_hi=mean + half
    )
    het = Heterogeneity(cochran_q=q, cochran_q_p=_chi2_sf(q, df), tau2=tau2, i2=i2)
    return est, het


def _setting_rows(g: pd.DataFrame, *, level: float) -> list[dict[str, object]]:
    g = g[g["ratio"].notna()]
    unit = [c for c in (NODE, INVOCATION) if c in g]
    groups = [np.log(s["ratio"].to_numpy(dtype=np.float64)) for _, s in g.groupby(unit)]
    blocks = log_ratio_interval(g["ratio"].tolist(), level=level)
    means = invocation_means(groups, level=level)
    re, het = random_effects(groups, level=level)
    het = Heterogeneity(
        levene_p=levene_p(groups),
        cochran_q=het.cochran_q,
        cochran_q_p=het.cochran_q_p,
        tau2=het.tau2,
        i2=het.i2,
    )
    estimates = [
        Estimate(
            method=Method.BLOCKS,
            log_mean=math.log(blocks.ratio),
            log_lo=math.log(blocks.lo) if math.isfinite(blocks.lo) else math.nan,
            log_hi=math.log(blocks.hi) if math.isfinite(blocks.hi) else math.nan,
        ),
        means,
        re,
    ]
    common: dict[str, object] = {
        "metric": METRIC,
        "statistic": STATISTIC,
        "n_runs": len(g) + (g["twin_id"].nunique() if "twin_id" in g else 0),
        "n_blocks": len(g),
        "n_invocations": len(groups),
        "n_nodes": g[NODE].nunique() if NODE in g else math.nan,
        "note": SINGLE_INVOCATION if len(groups) == 1 else "",
        **vars(het),
    }
    return [
        {
            **common,
            "method": e.method.value,
            "value": math.expm1(e.log_mean),
            "low": math.expm1(e.log_lo),
            "high": math.expm1(e.log_hi),
        }
        for e in estimates
    ]


def level_intervals(ratios: pd.DataFrame, *, level: float = 0.95) -> pd.DataFrame:
    """Per loading setting (the ``KNOBS`` the frame has) of block-level ``ratios`` (columns
    ``ratio`` and ``invocation``, optionally ``node``, as from :func:`invocation_ratios`): a
    row per method (:class:`Method`) with its value and interval as a change (ratio - 1), the
    counts, and the setting's heterogeneity. A setting measured in one invocation is noted
    ``single invocation``. Columns: ``LEVEL_COLUMNS``."""
    missing = [c for c in ("ratio", INVOCATION) if c not in ratios]
    if missing:
        raise ValueError(f"ratios: no column {missing}, expected block ratios per invocation")
    frame = pl.with_knob_defaults(ratios)
    keys = [k for k in pl.KNOBS if k in frame]
    rows = []
    for key, g in frame.groupby(keys, sort=True):
        if g["ratio"].notna().sum() == 0:
            continue
        knobs = dict(zip(keys, key, strict=True))
        rows += [{**knobs, **r} for r in _setting_rows(g, level=level)]
    return pd.DataFrame(rows, columns=list(LEVEL_COLUMNS))
