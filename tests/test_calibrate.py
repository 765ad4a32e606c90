"""Calibration on a new machine: a model fitted on machine A, a three-run probe from machine B
whose workers and compute run at other speeds; the calibrated model predicts B within a few
per cent where the uncalibrated one is off by the planted difference."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.advisor import advise as adv
from codl.advisor import calibrate as cal
from codl.advisor import model as mdl
from codl.config import build_plan, load_yaml
from test_model import CORES, RATE, planted_tables, planted_throughput

REPO = Path(__file__).resolve().parent.parent
B_RATE, B_COMPUTE = 1.3 * RATE, 1.1  # machine B: workers 30 % faster, compute 10 % faster


@pytest.fixture(scope="module")
def fit_a() -> mdl.Fit:
    runs, steps = planted_tables()
    return mdl.fit(mdl.run_data(runs, steps), cores=CORES, boot=10, seed=0)


def probe_b(settings: pd.DataFrame) -> mdl.RunData:
    """Machine B's runs of the probe's settings (planted, 2 % step noise, one repeat)."""
    data_w = settings.loc[settings["mode"] == "data", "workers"].astype(int)
    comb = settings[settings["mode"] == "data+compute"]
    runs, steps = planted_tables(
        data_workers=tuple(data_w),
        combined_workers=tuple(comb["workers"].astype(int)),
        policies=tuple(comb["policy"]),
        rate=B_RATE,
        compute_scale=B_COMPUTE,
        repeats=1,
        seed=7,
    )
    return mdl.run_data(runs, steps)


def test_calibrated_predictions_hold_on_the_new_machine(fit_a: mdl.Fit) -> None:
    advice = adv.advise(fit_a, cores=CORES)
    settings = cal.probe_settings(fit_a, advice)
    # One run per machine parameter: the compute twin, one data run, the advised setting.
    assert list(settings["mode"]) == ["compute", "data", "data+compute"]
    assert settings.iloc[2]["workers"] == advice.workers
    c = cal.calibrate(fit_a, probe_b(settings), cores=CORES)
    assert c.cpu_factor == pytest.approx(B_RATE / RATE, rel=0.03)
    assert c.compute_factor["none"] == pytest.approx(B_COMPUTE, rel=0.02)
    # Every fitted setting on B, loader-bound and compute-bound, both policies.
    grid = [(p, w) for p in ("none", "isolated") for w in (4, 8, 13, 16, 24)]
    truth = np.array(
        [planted_throughput(w, p, rate=B_RATE, compute_scale=B_COMPUTE)[0] for p, w in grid]
    )
    s = pd.DataFrame(grid, columns=["policy", "workers"])
    before = mdl.predict(fit_a, s)["throughput"].to_numpy() / truth - 1
    after = mdl.predict(c.fit, s)["throughput"].to_numpy() / truth - 1
    assert np.abs(after).max() < 0.03
    # Uncalibrated, A's model is off by B's speed-up: ~-9 % compute-bound (1 / 1.1), ~-23 %
    # loader-bound (1 / 1.3).
    assert np.abs(before).max() > 0.2 and np.abs(before).min() > 0.07
    assert (c.table["error_after"].abs() < 0.03).all()
    # The interference and kappa are A's: kept.
    assert c.fit.params.kappa == fit_a.params.kappa and c.fit.params.k == fit_a.params.k
    assert any("calibrated on 3 probe" in n for n in c.fit.notes)


def test_a_probe_without_a_compute_run_keeps_the_fits_compute(fit_a: mdl.Fit) -> None:
    advice = adv.advise(fit_a, cores=CORES)
    settings = cal.probe_settings(fit_a, advice)
    data = probe_b(settings)
    runs = data.runs[data.runs["mode"] != "compute"]
    steps = pd.DataFrame(
        [{"run_id": r, "step_ms": v} for r in runs["run_id"] for v in data.step_ms[r]]
    )
    c = cal.calibrate(fit_a, mdl.run_data(runs, steps), cores=CORES)
    assert set(c.compute_factor.values()) == {1.0}
    assert any("no compute run in the probe" in n for n in c.notes)


def test_leave_one_out_predicts_each_run_of_the_new_machine(fit_a: mdl.Fit) -> None:
    # Machine B's loader-bound runs (few workers), compute twin and one data run: each held out
    # and predicted by A's model calibrated on the rest.
    runs, steps = planted_tables(
        data_workers=(8,),
        combined_workers=(4, 6, 8),
        policies=("none",),
        rate=B_RATE,
        compute_scale=B_COMPUTE,
        repeats=1,
        seed=3,
    )
    t = cal.leave_one_out(fit_a, runs, steps, cores=CORES)
    assert len(t) == 3
    # Loader-bound: off by up to 1 / 1.3 - 1; 8 workers are near the compute bound on B.
    assert t["error_before"].abs().min() > 0.15
    assert t["error_after"].abs().max() < 0.03
    assert t["cpu_factor"].to_numpy() == pytest.approx(B_RATE / RATE, rel=0.03)


def test_the_probe_config_is_a_plan_of_three_runs(fit_a: mdl.Fit) -> None:
    advice = adv.advise(fit_a, cores=CORES)
    defaults = load_yaml(REPO / "config" / "config.yaml")["defaults"]
    cfg = cal.probe_config(fit_a, advice, defaults=defaults, measured_steps=50)
    plan = build_plan(cfg, source="probe")
    modes = sorted(s.mode.value for s in plan.specs.values())
    assert modes == ["compute", "data", "data+compute"]
    assert {s.loader.workers for s in plan.specs.values() if s.mode.value != "compute"} >= {
        advice.workers
    }


def test_codl_advise_writes_the_probe_and_calibrates_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from codl.cli import advise as advise_cli
    from test_advise import _write_results

    runs, steps = planted_tables(repeats=2, steps=20)
    results = _write_results(tmp_path / "a", runs, steps, config=True)
    probe_yaml = tmp_path / "probe.yaml"
    assert advise_cli.main([str(results), "--boot", "0", "--probe-out", str(probe_yaml)]) == 0
    plan = build_plan(load_yaml(probe_yaml), source="probe")
    settings = pd.DataFrame(
        [
            {"mode": s.mode.value, "policy": s.pinning.policy.value, "workers": s.loader.workers}
            for s in plan.specs.values()
        ]
    )
    settings.loc[settings["mode"] == "compute", "workers"] = 0
    b = probe_b(settings)
    probe = _write_results(
        tmp_path / "b",
        b.runs,
        pd.DataFrame([{"run_id": r, "step_ms": v} for r in b.runs["run_id"] for v in b.step_ms[r]]),
        config=True,
    )
    capsys.readouterr()
    assert advise_cli.main([str(results), "--boot", "0", "--calibrate", str(probe)]) == 0
    printed = capsys.readouterr().out
    # The summary says it is calibrated, in words; the probe's table and the factors are the
    # details'.
    assert f"the model is calibrated on the probe in {probe}" in printed
    assert "loader 1.3" in printed and "calibration on" not in printed
    assert (
        advise_cli.main([str(results), "--boot", "0", "--calibrate", str(probe), "--details"]) == 0
    )
    details = capsys.readouterr().out
    assert "calibration on" in details and "CPU factor 1.3" in details
    # Machine B computes 10 % faster: the advice's prediction follows (3500 x 1.1 / inflation).
    uncal = adv.advise(mdl.fit(mdl.run_data(runs, steps), cores=CORES, boot=0), cores=CORES)
    got = re.search(r"predicted: (\d+) samples/s per rank", printed)
    assert got is not None
    assert float(got.group(1)) == pytest.approx(uncal.throughput * B_COMPUTE, rel=0.03)
    rc = advise_cli.main(
        [str(results), "--calibrate", str(probe), "--cross-validate", str(tmp_path / "cv.csv")]
    )
    assert rc == 2 and "--cross-validate with --calibrate" in capsys.readouterr().err
