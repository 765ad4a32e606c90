"""Intervals over runs: the run (or the block of runs made back to back) is the sample.

Steps of one run share its placement, its machine state and its loader's phase, so they are not
independent draws; a comparison's headline interval is over per-run statistics. With 2-10 runs
a bootstrap over runs is degenerate (three runs have ten distinct resamples), so the interval is
Student's t on the logs of per-run (or per-block) ratios: a ratio's log is near-normal, the
interval is exact for log-normal ratios, and it widens as it must when n is small.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True, kw_only=True)
class RatioInterval:
    """A ratio (geometric mean of per-run ratios) with its interval over ``n`` runs."""

    ratio: float
    lo: float
    hi: float
    n: int

    def as_percent(self) -> str:
        """``+31 % [+4, +60] (n=3)``: the ratio as a change, for tables and logs."""
        if not math.isfinite(self.ratio):
            return f"n/a (n={self.n})"
        pct = [100 * (v - 1) for v in (self.ratio, self.lo, self.hi)]
        if not all(math.isfinite(v) for v in pct[1:]):
            return f"{pct[0]:+.0f} % [no interval] (n={self.n})"
        return f"{pct[0]:+.0f} % [{pct[1]:+.0f}, {pct[2]:+.0f}] (n={self.n})"


def log_ratio_interval(ratios: Sequence[float], *, level: float = 0.95) -> RatioInterval:
    """Geometric mean of ``ratios`` (one per run or per block, each > 0) with a two-sided
    Student-t interval on their logs (n - 1 degrees of freedom); no interval below 2 ratios."""
    r = np.asarray([x for x in ratios if math.isfinite(x)], dtype=np.float64)
    if (r <= 0).any():
        raise ValueError(f"ratios: got {r[r <= 0].tolist()}, expected positive ratios")
    logs = mean_interval(np.log(r).tolist(), level=level)
    return RatioInterval(
        ratio=math.exp(logs.mean), lo=math.exp(logs.lo), hi=math.exp(logs.hi), n=logs.n
    )


@dataclass(frozen=True, kw_only=True)
class MeanInterval:
    """A mean over ``n`` runs with its interval."""

    mean: float
    lo: float
    hi: float
    n: int


def mean_interval(values: Sequence[float], *, level: float = 0.95) -> MeanInterval:
    """The mean of per-run ``values`` with a two-sided Student-t interval (n - 1 degrees of
    freedom); no interval below 2 values. For quantities that add (ms per step, samples/s)."""
    if not 0 < level < 1:
        raise ValueError(f"level: got {level}, expected a probability in (0, 1)")
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64)
    n = len(v)
    if n == 0:
        return MeanInterval(mean=math.nan, lo=math.nan, hi=math.nan, n=0)
    mean = float(v.mean())
    if n < 2:
        return MeanInterval(mean=mean, lo=math.nan, hi=math.nan, n=n)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(v.std(ddof=1)) / math.sqrt(n)
    return MeanInterval(mean=mean, lo=mean - half, hi=mean + half, n=n)
