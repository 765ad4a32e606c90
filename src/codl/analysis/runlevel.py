"""Intervals over runs: the run (or the block of runs made back to back) is the sample.

Steps of one run share its placement, its machine state and its loader's phase, so they are not
independent draws; a comparison's headline interval is over per-run statistics. With 2-10 runs
a bootstrap over runs is degenerate (three runs have ten distinct resamples), so the interval is
Student's t on the logs of per-run (or per-block) ratios: a ratio's log is near-normal, the
interval is exact for log-normal ratios, and it widens as it must when n is small.

A *block* is a set of runs made back to back on one machine: one repeat of one invocation (a
Slurm allocation, or one workflow run), ``block_id`` of the host, its boot, the invocation token
a trace records and the repeat. The workflow's ``blocks`` section runs repeat b as one block
(one Slurm job, its runs interleaved). Runs are paired with their twins inside a block, so
drift between machines and over time cancels in the per-block ratio.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


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


def _t_ppf(q: float, df: float) -> float:
    """Student's t quantile. scipy.stats is imported here, not with the module: it costs
    ~0.8 s, and ``codl summarize`` imports this module (through compare) without needing it."""
    from scipy import stats

    return float(stats.t.ppf(q, df))


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
    half = _t_ppf(0.5 + level / 2, n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
    return MeanInterval(mean=mean, lo=mean - half, hi=mean + half, n=n)


# The runs-table columns a block is derived from, and the block's own.
BLOCK_SOURCE_COLUMNS = ("host", "boot_id", "invocation", "repeat")
BLOCK = "block"


def block_id(host: Any, boot_id: Any = "", invocation: Any = "", repeat: Any = None) -> str:
    """The block of a run: ``host/boot/invocation#repeat`` (boot id shortened to 8 characters),
    with what is unknown left out. Traces written before boot ids and tokens were recorded get
    ``host#repeat`` (same machine, invocation unknown); "" when the host is unknown."""

    def text(v: Any) -> str:
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        return str(v).strip()

    parts = [text(host), text(boot_id)[:8], text(invocation)]
    if not parts[0]:
        return ""
    rep = text(repeat)
    return "/".join(p for p in parts if p) + (f"#{rep}" if rep else "")


def block_columns(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The runs-table columns of where and when a run ran, from its trace's root attributes:
    ``boot_id``, ``gpu_uuids`` (space-separated), ``invocation``, ``start_time`` (UTC, ISO 8601)
    and ``block`` (``block_id``). Empty strings where the trace predates them."""
    start = attrs.get("start_unix_ns")
    when = (
        datetime.datetime.fromtimestamp(int(start) / 1e9, tz=datetime.UTC).isoformat()
        if isinstance(start, int | np.integer)
        else ""
    )
    uuids = attrs.get("gpu_uuids") or []
    out = {
        "boot_id": str(attrs.get("boot_id", "") or ""),
        "gpu_uuids": " ".join(str(u) for u in uuids) if isinstance(uuids, list | tuple) else "",
        "invocation": str(attrs.get("invocation", "") or ""),
        "start_time": when,
    }
    spec = attrs.get("spec")
    if isinstance(spec, str):
        spec = json.loads(spec)
    repeat = spec.get("repeat") if isinstance(spec, Mapping) else None
    out[BLOCK] = block_id(attrs.get("host", ""), out["boot_id"], out["invocation"], repeat)
    return out


def runs_blocks(runs: Any) -> dict[str, str]:
    """run id -> block of a runs table: its ``block`` column where summarize wrote one, else
    derived from whichever of ``BLOCK_SOURCE_COLUMNS`` it has (older tables: the host)."""
    out: dict[str, str] = {}
    if "run_id" not in runs:
        return out
    for _, row in runs.iterrows():
        b = row.get(BLOCK)
        if not isinstance(b, str) or not b:
            b = block_id(*(row.get(c, "") for c in BLOCK_SOURCE_COLUMNS))
        out[str(row["run_id"])] = b
    return out


def welch_interval(a: Sequence[float], b: Sequence[float], *, level: float = 0.95) -> MeanInterval:
    """mean(a) - mean(b) with a two-sided Welch interval (Satterthwaite degrees of freedom):
    for two sets of runs that share no block, so that no pair can be formed. ``n`` counts
    both sets; no interval unless each has 2 values."""
    x = np.asarray([v for v in a if math.isfinite(v)], dtype=np.float64)
    y = np.asarray([v for v in b if math.isfinite(v)], dtype=np.float64)
    n = len(x) + len(y)
    if not len(x) or not len(y):
        return MeanInterval(mean=math.nan, lo=math.nan, hi=math.nan, n=n)
    diff = float(x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return MeanInterval(mean=diff, lo=math.nan, hi=math.nan, n=n)
    vx, vy = float(x.var(ddof=1)) / len(x), float(y.var(ddof=1)) / len(y)
    se = math.sqrt(vx + vy)
    if se == 0:
        return MeanInterval(mean=diff, lo=diff, hi=diff, n=n)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = _t_ppf(0.5 + level / 2, df) * se
    return MeanInterval(mean=diff, lo=diff - half, hi=diff + half, n=n)
