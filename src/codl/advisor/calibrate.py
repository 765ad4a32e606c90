"""Calibration of a fitted model on a new machine from a short probe, pure (docs/advisor.md,
"Calibration on a new machine").

A model fitted on one machine has parameters of the workload and the software (``kappa`` and
its exponent, the interference ``k0``/``k``, the hand-off) and parameters of the machine: how
fast its CPU runs a loader worker and the launch roles, and how fast its GPU computes. The
calibration keeps the first and re-fits the second from a few runs measured on the new machine:

- ``compute`` (and ``compute_ms``) per policy: the probe's compute-twin runs measure it; a
  fitted policy without one is scaled by the mean factor of those with one.
- a CPU factor ``a``: the loader's per-worker rate ``r`` and its ceiling ``M`` times ``a``,
  the launch roles' CPU time per sample divided by ``a`` (a CPU ``a`` times as fast does the
  same work in ``1/a`` the time); fitted by least squares in log space over the probe's
  ``data`` and combined runs, with the compute factors fixed.

The bootstrap replicates are scaled alike, so the intervals are the fit's (the probe's own
scatter is not in them). ``probe_settings`` chooses the probe's runs (the rule is in its
docstring).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from codl.advisor import advise as adv
from codl.advisor import model as mdl
from codl.spec import Policy

#: The CPU factor is searched on a log grid over this range, then refined.
_FACTOR_RANGE = (0.25, 4.0)
_FACTOR_GRID = 161
#: The step of the numerical sensitivity d log X / d log a.
_SENSITIVITY_STEP = 1.1
#: The probe's seed: the fitted runs' plus this, apart from the verification's (their seed plus
#: ``advise.VERIFY_SEED_OFFSET``, the next ones a verification may take), so that no verification
#: run has a probe run's spec, whose run id the workflow would reuse instead of measuring again:
#: the calibration was fitted on the probe's runs, the verification must not score them.
PROBE_SEED_OFFSET = 1000


class CalibrationError(mdl.ModelError):
    """The probe cannot calibrate the model (no compute twin, nothing for the CPU factor)."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    fit: mdl.Fit  # the calibrated model
    cpu_factor: float  # a: the new machine's loader and launch CPU speed over the fit's
    compute_factor: Mapping[str, float]  # policy -> C_p(new) / C_p(fit)
    table: pd.DataFrame  # per probe configuration: measured, before, after, errors
    notes: tuple[str, ...]


def scaled(params: mdl.Params, a: float, b: Mapping[str, float]) -> mdl.Params:
    """``params`` on a machine whose CPU is ``a`` times as fast and whose compute per policy is
    ``b[p]`` times as fast."""
    return replace(
        params,
        rate=params.rate * a,
        ceiling=params.ceiling * a,
        occupancy={m: (t / a, h / a) for m, (t, h) in params.occupancy.items()},
        compute={p: v * b[p] for p, v in params.compute.items()},
        compute_ms={p: v / b[p] for p, v in params.compute_ms.items()},
    )


def _with(fit: mdl.Fit, params: mdl.Params) -> mdl.Fit:
    return replace(fit, params=params, boot=())


def _predicted(fit: mdl.Fit, rows: pd.DataFrame) -> np.ndarray:
    """Per probe row (``mode``, ``policy``, ``workers``, ``launch_cores``, ``cores``): the
    model's throughput per rank (a data run's loader capacity, a compute run's capacity)."""
    out = np.full(len(rows), np.nan)
    settings = rows.reset_index(drop=True)
    comb = settings["mode"] == fit.node.combined_mode
    data = settings["mode"] == mdl.LOADER_MODE
    twin = settings["mode"] == mdl.COMPUTE_TWIN[fit.node.combined_mode]
    if comb.any():
        out[comb.to_numpy()] = mdl.predict(fit, settings[comb])["throughput"].to_numpy()
    if data.any():
        loader = mdl.predict_loader(fit, settings[data])["loader_capacity"].to_numpy()
        out[data.to_numpy()] = loader
    if twin.any():
        out[twin.to_numpy()] = settings.loc[twin, "policy"].map(fit.params.compute).to_numpy()
    return out


def probe_rows(probe: mdl.RunData, *, cores: int) -> pd.DataFrame:
    """The probe's configurations with their measured throughput per rank (``measured``)."""
    g = mdl.group_stats(probe)
    g["cores"] = g["cores"].fillna(cores).astype(int)
    g["launch_cores"] = g["launch_cores"].astype(object)
    return g.rename(columns={"throughput": "measured"})[
        ["mode", "policy", "workers", "launch_cores", "cores", "runs", "measured"]
    ]


def calibrate(fit: mdl.Fit, probe: mdl.RunData, *, cores: int) -> Calibration:
    """Re-fit ``fit``'s machine parameters on ``probe`` (runs on the new machine; ``cores``
    per rank for runs whose table does not say)."""
    rows = probe_rows(probe, cores=cores)
    twin_mode = mdl.COMPUTE_TWIN[fit.node.combined_mode]
    twins = rows[(rows["mode"] == twin_mode) & rows["policy"].isin(list(fit.params.compute))]
    measured_b = {
        str(p): float(g["measured"].mean()) / fit.params.compute[str(p)]
        for p, g in twins.groupby("policy")
    }
    # Without a compute run the new machine's compute is taken to be the fit's (noted).
    mean_b = float(np.exp(np.mean(np.log(list(measured_b.values()))))) if measured_b else 1.0
    b = {p: float(measured_b.get(p, mean_b)) for p in fit.params.compute}
    # A data run's loader capacity is predicted under any policy; a combined run's only under
    # a fitted one.
    loader = rows["mode"] == mdl.LOADER_MODE
    fitted = (rows["mode"] == fit.node.combined_mode) & rows["policy"].isin(fit.policies)
    cpu_rows = rows[loader | fitted]
    if cpu_rows.empty:
        raise CalibrationError(
            f"probe: no {mdl.LOADER_MODE} or {fit.node.combined_mode} run: the loader's CPU "
            "speed on the new machine is fitted from them"
        )
    y = np.log(cpu_rows["measured"].to_numpy(np.float64))

    def loss(a: float) -> float:
        pred = _predicted(_with(fit, scaled(fit.params, a, b)), cpu_rows)
        ok = np.isfinite(pred) & (pred > 0)
        if not ok.any():
            return math.inf
        return float(np.sum((np.log(pred[ok]) - y[ok]) ** 2) + 1e3 * np.sum(~ok))

    grid = np.geomspace(*_FACTOR_RANGE, _FACTOR_GRID)
    losses = [loss(float(a)) for a in grid]
    i = int(np.argmin(losses))
    fine = np.geomspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 41)
    a = float(min(fine, key=lambda v: loss(float(v))))
    notes = [
        f"calibrated on {len(rows)} probe configuration(s): CPU factor {a:.3f} (loader rate, "
        "ceiling, launch roles' CPU time), compute factor "
        + ", ".join(f"{p} {v:.3f}" for p, v in sorted(b.items()))
        + (
            f" ({sorted(set(b) - set(measured_b))} by the mean factor: no compute run)"
            if measured_b and set(b) - set(measured_b)
            else " (no compute run in the probe: the fit's compute kept)"
            if not measured_b
            else ""
        )
        + "; kappa, interference and hand-off kept from the fit"
    ]
    if a in (fine[0], fine[-1]) and a in _FACTOR_RANGE:
        notes.append(f"CPU factor at the end of its range {_FACTOR_RANGE}: the probe is far off")
    new = replace(
        fit,
        params=scaled(fit.params, a, b),
        boot=tuple(scaled(p, a, b) for p in fit.boot),
        notes=(*fit.notes, *notes),
    )
    table = rows.copy()
    table["before"] = _predicted(_with(fit, fit.params), rows)
    table["after"] = _predicted(_with(new, new.params), rows)
    table["error_before"] = table["before"] / table["measured"] - 1
    table["error_after"] = table["after"] / table["measured"] - 1
    return Calibration(fit=new, cpu_factor=a, compute_factor=b, table=table, notes=tuple(notes))


def _sensitivity(fit: mdl.Fit, rows: pd.DataFrame) -> np.ndarray:
    """``d log X / d log a`` of each row: how much its prediction moves with the CPU factor."""
    ones = dict.fromkeys(fit.params.compute, 1.0)
    up = _predicted(_with(fit, scaled(fit.params, _SENSITIVITY_STEP, ones)), rows)
    down = _predicted(_with(fit, scaled(fit.params, 1 / _SENSITIVITY_STEP, ones)), rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(up / down) / (2 * math.log(_SENSITIVITY_STEP)))


def probe_settings(fit: mdl.Fit, advice: adv.Advice) -> pd.DataFrame:
    """The probe's runs (one each; ``mode``, ``policy``, ``workers``, ``launch_cores``,
    ``cores``, ``why``), one per machine parameter, each where it tells the most:

    1. the advised policy's compute twin: measures its compute capacity directly;
    2. the ``data`` run (policy ``none``, as the fit's) whose loader capacity moves most with
       the CPU factor (``d log X / d log a``; ties: the worker count nearest the advice's):
       pins the loader's rate;
    3. the advised combined setting: the prediction the advice rests on, which moves with both.
    """
    twin = mdl.COMPUTE_TWIN[fit.node.combined_mode]
    lc = advice.launch_cores
    compute = {
        "mode": twin,
        "policy": advice.policy,
        "workers": 0,
        "launch_cores": lc,
        "cores": advice.cores,
        "why": "compute capacity of the advised policy",
    }
    workers = np.arange(1, 2 * advice.cores + 1)
    data = pd.DataFrame(
        {
            "mode": mdl.LOADER_MODE,
            "policy": Policy.NONE.value,
            "workers": workers,
            "launch_cores": None,
            "cores": advice.cores,
        }
    )
    s = np.nan_to_num(_sensitivity(fit, data), nan=-1.0)
    top = s.max()
    near = np.flatnonzero(s >= top - 1e-3)
    pick = int(near[np.argmin(np.abs(workers[near] - advice.workers))])
    loader = {
        **data.iloc[pick].to_dict(),
        "why": f"loader rate: d log X / d log a = {s[pick]:.2f}",
    }
    combined = {
        "mode": fit.node.combined_mode,
        "policy": advice.policy,
        "workers": advice.workers,
        "launch_cores": lc,
        "cores": advice.cores,
        "why": "the advised setting",
    }
    return pd.DataFrame([compute, loader, combined])


def probe_config(
    fit: mdl.Fit,
    advice: adv.Advice,
    *,
    defaults: Mapping[str, Any],
    slurm: Mapping[str, Any] | None = None,
    measured_steps: int | None = None,
) -> dict[str, Any]:
    """A config (config/README.md format) of ``probe_settings``'s runs, one repeat each, the
    fitted runs' defaults with a seed of its own (``PROBE_SEED_OFFSET``) and the advice's
    hand-off."""
    # The verification's defaults (the advice's hand-off, pinning left to the runs), with the
    # probe's own seed.
    d = adv._verify_defaults(defaults, advice, measured_steps)
    d["seed"] = int(defaults.get("seed", 0)) + PROBE_SEED_OFFSET
    experiments = []
    for i, (_, r) in enumerate(probe_settings(fit, advice).iterrows()):
        lc = r["launch_cores"]
        base: dict[str, Any] = {
            "mode": r["mode"],
            "pinning": adv._pinning(
                str(r["policy"]), None if lc is None or pd.isna(lc) else int(lc)
            ),
        }
        if int(r["workers"]) > 0:
            base["loader"] = {"workers": int(r["workers"])}
        experiments.append({"name": f"probe-{i + 1}", "base": base, "repeats": 1})
    s = dict(slurm or {})
    s["cpus_per_rank"] = advice.cores
    return {"defaults": d, "experiments": experiments, "slurm": s}


def leave_one_out(
    fit: mdl.Fit, runs: pd.DataFrame, steps: pd.DataFrame, *, cores: int
) -> pd.DataFrame:
    """Each combined run of a new machine's tables predicted by ``fit`` calibrated on the
    others (held out in turn): ``run_id``, ``policy``, ``workers``, ``cores``, ``measured``,
    ``before`` / ``after`` (uncalibrated / calibrated prediction), their errors and the
    ``cpu_factor`` of that calibration."""
    data = mdl.run_data(runs, steps, combined_mode=fit.node.combined_mode)
    comb = data.runs[data.runs["mode"] == fit.node.combined_mode]
    rows = []
    for _, r in comb.iterrows():
        run_id = str(r["run_id"])
        keep = runs[runs["run_id"].astype(str) != run_id]
        c = calibrate(
            fit,
            mdl.run_data(keep, steps[steps["run_id"].isin(keep["run_id"])]),
            cores=cores,
        )
        c_run = int(r["cores"]) if pd.notna(r["cores"]) else cores
        setting = pd.DataFrame(
            {
                "policy": [r["policy"]],
                "workers": [int(r["workers"])],
                "launch_cores": [mdl._launch_cores(r["launch_cores"])],
                "cores": [c_run],
            }
        )
        measured = mdl.measured_throughput(data, run_id)
        before = float(mdl.predict(_with(fit, fit.params), setting)["throughput"].iloc[0])
        after = float(mdl.predict(_with(c.fit, c.fit.params), setting)["throughput"].iloc[0])
        rows.append(
            {
                "run_id": run_id,
                "policy": r["policy"],
                "workers": int(r["workers"]),
                "cores": c_run,
                "measured": measured,
                "before": before,
                "after": after,
                "error_before": before / measured - 1,
                "error_after": after / measured - 1,
                "cpu_factor": c.cpu_factor,
            }
        )
    return pd.DataFrame(rows)
