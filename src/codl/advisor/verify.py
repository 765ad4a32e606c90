"""The advisor's verification, pure: the model's prediction for every setting of a verification
config, and predictions against what the verification runs measured (docs/advisor.md).

The loop around it (fit, advise, write the verification config, run it, compare) is the
workflow's: ``codl.steps.advisor`` reads and writes the files and calls these functions.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.advisor import advise as adv
from codl.advisor import model as mdl
from codl.analysis import compare as cmp
from codl.analysis.compare import arm_interval
from codl.config import Plan
from codl.spec import AUTO, Policy

PREDICTION_COLUMNS = (
    "policy",
    "workers",
    "launch_cores",
    "throughput",
    "throughput_lo",
    "throughput_hi",
    "pred_lo",
    "pred_hi",
    "bound",
    "inflation",
    "advised",
)


def _launch_key(policy: str, launch_cores: Any) -> str:
    """One spelling of a setting's launch cores in specs, tables and predictions: ``-`` where
    the policy reads none (``none`` stores 1 in its normalized spec), ``auto`` or a number."""
    if policy == Policy.NONE.value:
        return "-"
    if launch_cores is None or launch_cores == AUTO or pd.isna(launch_cores):
        return AUTO
    return str(int(float(launch_cores)))


def verification_predictions(fit: mdl.Fit, advice: adv.Advice, plan: Plan) -> pd.DataFrame:
    """The model's prediction for every combined setting of the verification ``plan``."""
    settings = {
        (
            s.pinning.policy.value,
            s.loader.workers,
            _launch_key(s.pinning.policy, s.pinning.launch_cores),
        )
        for s in plan.specs.values()
        if s.mode.value == fit.node.combined_mode
    }
    rows = pd.DataFrame(sorted(settings), columns=["policy", "workers", "launch_cores"])
    grid = rows.copy()
    grid["launch_cores"] = pd.Series(
        [None if k in ("-", AUTO) else int(k) for k in rows["launch_cores"]], dtype=object
    )
    out = mdl.predict(fit, grid)
    out["launch_cores"] = rows["launch_cores"]
    advised = (advice.policy, advice.workers, _launch_key(advice.policy, advice.launch_cores))
    out["advised"] = [
        (p, int(w), k) == advised
        for p, w, k in zip(out["policy"], out["workers"], out["launch_cores"], strict=True)
    ]
    return out[list(PREDICTION_COLUMNS)]


def score_predictions(
    predictions: pd.DataFrame,
    runs: pd.DataFrame,
    steps: pd.DataFrame | None = None,
    *,
    boot: int = cmp.BOOTSTRAP,
    seed: int = 0,
) -> pd.DataFrame:
    """Each predicted setting with its measured per-rank throughput (mean over its runs):
    ``error`` = predicted / measured - 1, ``inside`` = the one-run interval holds the mean,
    ``vs_best`` = measured / best measured - 1 (the advised row says how far the advice is from
    the best verification setting). Settings without a run keep NaN.

    With ``steps`` (the runs' per-step table), 95 % two-level bootstrap intervals (runs, then
    steps within runs, as ``compare``): ``measured_lo``/``_hi``, and ``advice_ratio`` (+ ``_lo``,
    ``_hi``): the advised setting's throughput over this setting's, so that "within x % of the
    best" is a statement with an interval, not a difference of two means."""
    r = runs[runs["mode"].isin(mdl.COMBINED_MODES)].copy()
    world = r["world_size"].fillna(1) if "world_size" in r else 1
    r["measured"] = r["throughput_samples_s"] / world
    p = predictions.copy()
    # Runs at several core budgets (pinning.cpus) are told apart by the CPUs they had; a table
    # of one budget matches on the setting alone, whatever budget the prediction was for.
    budgets = "cpus" in r and "cores" in p and r["cpus"].nunique() > 1
    r["key"] = _setting_keys(r, r["cpus"] if budgets else None)
    by_key = r.groupby("key")["measured"].agg(["mean", "count"])
    keys = _setting_keys(p, p["cores"] if budgets else None)
    p["measured"] = [by_key["mean"].get(k, np.nan) for k in keys]
    p["n_runs"] = [int(by_key["count"].get(k, 0)) for k in keys]
    p["error"] = p["throughput"] / p["measured"] - 1
    p["inside"] = (p["measured"] >= p["pred_lo"]) & (p["measured"] <= p["pred_hi"])
    p["vs_best"] = p["measured"] / p["measured"].max() - 1
    if steps is not None:
        ids = r.groupby("key")["run_id"].agg(list)
        batch = r.groupby("key")["batch_size"].first()
        per_run = {
            str(k): g["step_ms"].dropna().to_numpy(np.float64) for k, g in steps.groupby("run_id")
        }
        runs_of = [[per_run[str(i)] for i in ids.get(k, []) if str(i) in per_run] for k in keys]
        batches = np.array([batch.get(k, np.nan) for k in keys], dtype=np.float64)
        p = p.assign(**_measured_intervals(p, runs_of, batches, boot=boot, seed=seed))
    return p


def _setting_keys(t: pd.DataFrame, cores: pd.Series | None) -> list[tuple[Any, ...]]:
    """(policy, workers, launch key[, cores]) of each row of ``t``."""
    keys = [
        (str(p), int(w), _launch_key(str(p), lc))
        for p, w, lc in zip(t["policy"], t["workers"], t["launch_cores"], strict=True)
    ]
    if cores is None:
        return keys
    return [(*k, int(c)) for k, c in zip(keys, cores, strict=True)]


def _measured_intervals(
    table: pd.DataFrame,
    runs_of: Sequence[list[npt.NDArray[np.float64]]],
    batches: npt.NDArray[np.float64],
    *,
    boot: int,
    seed: int,
) -> dict[str, npt.NDArray[np.float64]]:
    """Bootstrap intervals of each setting's per-rank throughput (the mean over runs of
    batch x 1000 / mean step time, as ``summarize`` has it) and of the advice's throughput
    ratio to it: the inverse ratio of mean step times, ``compare_stats`` of this setting's
    steps over the advice's (a ratio of means over runs, not a mean of per-run ratios)."""
    cols = ("measured_lo", "measured_hi", "advice_ratio", "advice_ratio_lo", "advice_ratio_hi")
    out = {c: np.full(len(table), np.nan) for c in cols}
    for i, groups in enumerate(runs_of):
        # Per run batch x 1000 / mean step, averaged over the picked runs: summarize's throughput.
        per_run = functools.partial(_throughput, batch=float(batches[i]))
        out["measured_lo"][i], out["measured_hi"][i] = arm_interval(
            groups, per_run, n=boot, seed=seed
        )
    advised = np.flatnonzero(table["advised"].astype(bool).to_numpy())
    mine = runs_of[advised[0]] if len(advised) else []
    for i, groups in enumerate(runs_of):
        if i in advised or not mine:
            continue
        stats = cmp.compare_stats(groups, mine, n=boot, seed=seed).get("mean")
        if stats:
            out["advice_ratio"][i] = stats["ratio"]
            out["advice_ratio_lo"][i] = stats["ci_low"]
            out["advice_ratio_hi"][i] = stats["ci_high"]
    return out


def _throughput(steps_ms: npt.NDArray[np.float64], *, batch: float) -> npt.NDArray[np.float64]:
    return np.asarray(batch * 1000 / np.mean(steps_ms, axis=-1), dtype=np.float64)


def prediction_summary(table: pd.DataFrame) -> dict[str, float]:
    """Median and worst |error| over the measured settings, the advice against the best
    measured setting, and (with ``score_predictions``'s intervals) the advice's throughput
    ratio to the best measured *other* setting with its 95 % interval (``advised_vs_other``)."""
    err = table["error"].abs().dropna()
    advised = table.loc[table["advised"].astype(bool), "vs_best"].dropna()
    out = {
        "settings": float(len(err)),
        "median_abs_error": float(err.median()) if len(err) else np.nan,
        "worst_abs_error": float(err.max()) if len(err) else np.nan,
        "advised_vs_best": float(advised.iloc[0]) if len(advised) else np.nan,
        "advised_vs_other": np.nan,
        "advised_vs_other_lo": np.nan,
        "advised_vs_other_hi": np.nan,
    }
    others = table[~table["advised"].astype(bool)].dropna(subset=["measured"])
    if "advice_ratio" in table and not others.empty and others["advice_ratio"].notna().any():
        best = others.iloc[int(np.argmax(others["measured"].to_numpy()))]
        out["advised_vs_other"] = float(best["advice_ratio"])
        out["advised_vs_other_lo"] = float(best["advice_ratio_lo"])
        out["advised_vs_other_hi"] = float(best["advice_ratio_hi"])
    return out


# ---------------------------------------------------------------------------------------------
# Predictions before measurements


class Order(enum.StrEnum):
    """What the verification table can prove about when a setting's prediction was made.

    ``predicted-first``: the predictions file is the one planned (its sha256 is the one the
    verification config recorded) and it was planned before every run of the setting started.
    ``changed-after-runs-started``: the file differs from the one planned and was modified
    after the setting's first run started (a prediction edited with the answer in view).
    ``changed``: the file differs from the one planned, modified before the runs (not the
    prediction the config recorded, but not written with the runs in view).
    ``planned-after-runs-started``: the recorded planning time is after a run of the setting
    started (e.g. runs reused from before the plan). ``unproven``: no hash or planning time
    recorded, or the runs have no ``start_time`` (tables summarized before the column)."""

    PREDICTED_FIRST = "predicted-first"
    CHANGED_AFTER_RUNS = "changed-after-runs-started"
    CHANGED = "changed"
    PLANNED_AFTER_RUNS = "planned-after-runs-started"
    UNPROVEN = "unproven"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _utc(values: pd.Series | Sequence[str | None]) -> pd.Series:
    return pd.to_datetime(pd.Series(values, dtype=object), utc=True, errors="coerce")


def prediction_order(
    table: pd.DataFrame,
    runs: pd.DataFrame,
    *,
    sha256: str,
    modified_at: str,
    planned_sha256: str = "",
    planned_at: str = "",
) -> pd.DataFrame:
    """``table`` (``score_predictions``'s) with the proof of order per setting: the predictions
    file's ``predictions_sha256`` as scored and ``modified_at`` (UTC, ISO 8601), what the
    verification config recorded at planning (``planned_sha256``, ``planned_at``), the setting's
    ``first_run_start`` (the earliest ``start_time`` of its runs in ``runs``) and ``order``
    (``Order``)."""
    r = runs[runs["mode"].isin(mdl.COMBINED_MODES)].copy()
    out = table.copy()
    budgets = "cpus" in r and "cores" in out and r["cpus"].nunique() > 1
    r["key"] = _setting_keys(r, r["cpus"] if budgets else None)
    starts = _utc(r["start_time"] if "start_time" in r else [None] * len(r))
    first = starts.groupby(r["key"].to_numpy()).min()
    keys = _setting_keys(out, out["cores"] if budgets else None)
    out["first_run_start"] = [first.get(k, pd.NaT) for k in keys]
    out["predictions_sha256"] = sha256
    out["modified_at"] = modified_at
    out["planned_sha256"] = planned_sha256
    out["planned_at"] = planned_at
    modified = _utc([modified_at]).iloc[0]
    planned = _utc([planned_at]).iloc[0] if planned_at else pd.NaT

    def order(start: pd.Timestamp) -> Order:
        if not planned_sha256 or pd.isna(start):
            return Order.UNPROVEN
        if planned_sha256 != sha256:
            after = pd.notna(modified) and modified >= start
            return Order.CHANGED_AFTER_RUNS if after else Order.CHANGED
        if pd.isna(planned):
            return Order.UNPROVEN
        return Order.PREDICTED_FIRST if planned < start else Order.PLANNED_AFTER_RUNS

    out["order"] = [order(s).value for s in out["first_run_start"]]
    out["first_run_start"] = ["" if pd.isna(s) else s.isoformat() for s in out["first_run_start"]]
    return out
