"""The advisor's verification, pure: the model's prediction for every setting of a verification
config, and predictions against what the verification runs measured (docs/advisor.md).

The loop around it (fit, advise, write the verification config, run it, compare) is the
workflow's: ``codl.steps.advisor`` reads and writes the files and calls these functions.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.advisor import advise as adv
from codl.advisor import model as mdl
from codl.analysis import compare as cmp
from codl.analysis import runlevel
from codl.analysis.compare import arm_interval
from codl.config import Plan
from codl.errors import CodlError
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


# ---------------------------------------------------------------------------------------------
# Out-of-sample checks of a fit (``codl check``): a check config's settings predicted before
# its runs, then scored against them

#: A check config's setting: what a prediction and its measured runs are matched on.
CHECK_KEY = ("experiment", "mode", "dataset", "policy", "workers", "cores")


def check_settings(plan: Plan, *, default_cores: int) -> pd.DataFrame:
    """One row per run of a check config's ``plan``: its ``run_id`` and setting
    (``CHECK_KEY``); a run without a core budget of its own (``pinning.cpus``) has
    ``default_cores`` (the config's ``slurm.cpus_per_rank``)."""
    rows = [
        {
            "run_id": run_id,
            "experiment": experiment,
            "mode": plan.specs[run_id].mode.value,
            "dataset": plan.specs[run_id].dataset.name,
            "policy": plan.specs[run_id].pinning.policy.value,
            "workers": plan.specs[run_id].loader.workers,
            "cores": plan.specs[run_id].pinning.cpus or default_cores,
        }
        for experiment, ids in plan.experiments().items()
        for run_id in ids
    ]
    return pd.DataFrame(rows, columns=["run_id", *CHECK_KEY])


#: The key of ``predict_check``'s ``fits`` for a fit that predicts every data set.
ANY_DATASET = "*"


def predict_check(settings: pd.DataFrame, fits: dict[str, mdl.Fit]) -> pd.DataFrame:
    """Each setting of ``check_settings`` predicted by the fit of its data set (``fits``: data
    set name -> fit, or ``ANY_DATASET`` -> the one fit of every data set): a ``data`` run's
    loader capacity, a combined run's throughput, as
    ``predicted`` with the model's 95 % interval (``lo``, ``hi``) and one run's
    (``pred_lo``, ``pred_hi``)."""
    settings = settings.drop(columns="run_id").drop_duplicates()
    rows = []
    for (dataset, mode), s in settings.groupby(["dataset", "mode"], sort=False):
        fit = fits.get(str(dataset), fits.get(ANY_DATASET))
        if fit is None:
            raise CodlError(f"data set {dataset!r}: no fit reads it; the fits read {sorted(fits)}")
        if mode == mdl.LOADER_MODE:
            p = mdl.predict_loader(fit, s)
            cols = ("loader_capacity", "loader_capacity_lo", "loader_capacity_hi")
        else:
            p = mdl.predict(fit, s)
            cols = ("throughput", "throughput_lo", "throughput_hi")
        p = p.assign(**{n: p[c] for n, c in zip(("predicted", "lo", "hi"), cols, strict=True)})
        rows.append(p[[*CHECK_KEY, "predicted", "lo", "hi", "pred_lo", "pred_hi"]])
    return pd.concat(rows)


def score_check(predicted: pd.DataFrame, settings: pd.DataFrame, data: mdl.RunData) -> pd.DataFrame:
    """``predict_check``'s table with its runs' per-rank throughput, mean over the setting's
    runs: ``delivered`` (what the window delivered) and ``measured`` (the model's reading: the
    workers' production where the window drained batches made before it), ``n_runs``,
    ``error`` (against ``measured``), ``error_vs_delivered`` and whether the model's and one
    run's intervals hold ``measured``. A setting without a run keeps NaN."""
    r = settings[settings["run_id"].isin(data.step_ms)].copy()
    batch = data.node.batch
    r["delivered"] = [batch * 1000.0 / float(data.step_ms[i].mean()) for i in r["run_id"]]
    r["measured"] = [mdl.measured_throughput(data, i) for i in r["run_id"]]
    key = list(CHECK_KEY)
    got = r.groupby(key)[["delivered", "measured"]].mean()
    got["n_runs"] = r.groupby(key).size()
    table = predicted.merge(got.reset_index(), on=key, how="left")
    table["error"] = table["predicted"] / table["measured"] - 1
    table["error_vs_delivered"] = table["predicted"] / table["delivered"] - 1
    table["inside_model_ci"] = table["measured"].between(table["lo"], table["hi"])
    table["inside_one_run"] = table["measured"].between(table["pred_lo"], table["pred_hi"])
    return table


def holdout_table(
    runs: pd.DataFrame, steps: pd.DataFrame, *, fit_cores: int, cores: int, boot: int, seed: int
) -> pd.DataFrame:
    """The combined runs on ``cores`` cores held out, predicted by the fit on every other run
    (the data runs at all their budgets) and by the fit on the data runs at the fit's budget
    ``fit_cores`` only (what a one-budget config would have had)."""
    held = runs[(runs["mode"] != mdl.LOADER_MODE) & (runs["cpus"] == cores) & (runs["workers"] > 0)]
    if held.empty:
        raise CodlError(f"cores {cores}: no combined run with loader workers on that budget")
    rest = runs[~runs["run_id"].isin(held["run_id"])]
    one = rest[(rest["mode"] != mdl.LOADER_MODE) | (rest["cpus"] == fit_cores)]
    data = mdl.run_data(runs, steps)
    measured = float(np.mean([mdl.measured_throughput(data, str(i)) for i in held["run_id"]]))
    rows = []
    for name, kept in (("data runs at every budget", rest), (f"data runs at {fit_cores}", one)):
        fit = mdl.fit(mdl.run_data(kept, steps), cores=fit_cores, boot=boot, seed=seed)
        params = fit.parameters().set_index("parameter")
        setting = held[["policy", "workers"]].assign(cores=cores).drop_duplicates()
        p = mdl.predict(fit, setting).iloc[0]
        rows.append(
            {
                "fit": name,
                "kappa": fit.params.kappa,
                "kappa_lo": params.loc["kappa", "lo"],
                "kappa_hi": params.loc["kappa", "hi"],
                "ceiling": fit.params.ceiling,
                "workers": int(p["workers"]),
                "cores": cores,
                "predicted": p["throughput"],
                "lo": p["throughput_lo"],
                "hi": p["throughput_hi"],
                "bound": p["bound"],
                "measured": measured,
                "n_runs": len(held),
                "error": p["throughput"] / measured - 1,
            }
        )
    return pd.DataFrame(rows)


def uncalibrated_predictions(
    fit: mdl.Fit, calibrated: pd.DataFrame, *, cores: int | None = None
) -> pd.DataFrame:
    """The uncalibrated ``fit``'s prediction of every setting of the calibrated model's
    predictions (``verification_predictions``' table, its ``advised`` flags kept), in its
    columns: the other half of a blind check, scored on the same runs. ``cores``: the budget
    the calibrated advice was for (default: the fit's)."""
    grid = calibrated[["policy", "workers"]].copy()
    if cores is not None:
        grid["cores"] = cores
    keys = calibrated["launch_cores"].astype(str)
    grid["launch_cores"] = pd.Series(
        [None if k in ("-", AUTO) else int(float(k)) for k in keys], dtype=object
    )
    out = mdl.predict(fit, grid)
    out["launch_cores"] = calibrated["launch_cores"].to_numpy()
    out["advised"] = calibrated["advised"].to_numpy()
    return out[list(calibrated.columns)]


#: The columns of the blind error table that do not depend on which predictions are scored.
_BLIND_COLUMNS = (
    "policy",
    "workers",
    "launch_cores",
    "advised",
    "n_runs",
    "measured",
    "measured_lo",
    "measured_hi",
    "vs_best",
    "advice_ratio",
    "advice_ratio_lo",
    "advice_ratio_hi",
    "first_run_start",
)


def blind_table(
    scored: dict[str, pd.DataFrame], *, measured_from: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The blind error table of a calibration check from its prediction tables scored on the
    verification runs (``scored``: label -> ``prediction_order``'s table, the same settings
    in the same order): per setting the measured columns of ``scored[measured_from]``, and
    per label its prediction, error, ``order`` and ``planned_at``. The summary: per label the
    runs, ``prediction_summary`` and whether every measured setting was predicted first."""
    table = scored[measured_from][list(_BLIND_COLUMNS)].copy()
    rows = []
    for label, t in scored.items():
        table[f"predicted_{label}"] = t["throughput"].to_numpy()
        table[f"error_{label}"] = t["error"].to_numpy()
        table[f"order_{label}"] = t["order"].to_numpy()
        table[f"planned_at_{label}"] = t["planned_at"].to_numpy()
        measured = t[t["n_runs"] > 0]
        s: dict[str, Any] = dict(prediction_summary(measured))
        s["all_predicted_first"] = bool(
            len(measured) and (measured["order"] == Order.PREDICTED_FIRST.value).all()
        )
        rows.append({"predictions": label, "runs": int(measured["n_runs"].sum()), **s})
    return table, pd.DataFrame(rows)


def runlevel_table(runs: pd.DataFrame, *, advice: str, combined_mode: str) -> pd.DataFrame:
    """The verification's headlines at run level (docs/advisor.md, "The verification"): per
    setting (``policy/workers``) of the ``combined_mode`` runs the ``throughput`` (samples/s,
    the mean of its blocks' means) with a Student-t interval, ``n_runs`` and ``n_blocks``, and
    ``advice_ratio``: the ``advice`` setting over this one, a t interval on the logs of
    per-block ratios over the blocks holding both (``pairing`` paired, ``ratio_n`` blocks),
    else Welch on the logs of the runs (unpaired, ``ratio_n`` runs).
    Settings are ordered by mean throughput, best first."""
    blocks = runlevel.runs_blocks(runs)
    r = runs[runs["mode"] == combined_mode]
    values: dict[str, list[tuple[str, float]]] = {}
    for run_id, policy, workers, tput in zip(
        r["run_id"], r["policy"], r["workers"], r["throughput_samples_s"], strict=True
    ):
        key = f"{policy}/{int(workers)}"
        values.setdefault(key, []).append((blocks[str(run_id)], float(tput)))
    if advice not in values:
        raise CodlError(
            f"advice {advice!r}: no {combined_mode} run of that setting; the runs have "
            f"{sorted(values)}"
        )
    rows = []
    for key, vals in values.items():
        m = runlevel.mean_interval(list(_block_means(vals).values()))
        row: dict[str, Any] = {
            "setting": key,
            "throughput": m.mean,
            "throughput_lo": m.lo,
            "throughput_hi": m.hi,
            "n_runs": len(vals),
            "n_blocks": len(_block_means(vals)),
            "advised": key == advice,
        }
        row.update(_advice_ratio(values[advice], vals) if key != advice else {})
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.sort_values("throughput", ascending=False, kind="stable").reset_index(drop=True)


def _block_means(vals: Sequence[tuple[str, float]]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for block, v in vals:
        by.setdefault(block, []).append(v)
    return {b: float(np.mean(by[b])) for b in sorted(by)}


def _advice_ratio(
    advice: Sequence[tuple[str, float]], other: Sequence[tuple[str, float]]
) -> dict[str, Any]:
    a, b = _block_means(advice), _block_means(other)
    both = sorted(set(a) & set(b))
    if both:
        r = runlevel.log_ratio_interval([a[k] / b[k] for k in both])
        return {
            "advice_ratio": r.ratio,
            "advice_ratio_lo": r.lo,
            "advice_ratio_hi": r.hi,
            "pairing": "paired",
            "ratio_n": r.n,
        }
    w = runlevel.welch_interval([math.log(v) for _, v in advice], [math.log(v) for _, v in other])
    return {
        "advice_ratio": math.exp(w.mean),
        "advice_ratio_lo": math.exp(w.lo),
        "advice_ratio_hi": math.exp(w.hi),
        "pairing": "unpaired",
        "ratio_n": w.n,
    }
