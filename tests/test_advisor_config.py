"""The `advisor` config section and the analysis side of the closed loop on planted runs:
verification predictions, and predicted vs measured with known errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.analysis import advise as adv
from codl.analysis import loop
from codl.analysis import model as mdl
from codl.analysis.advisor_config import AdvisorSettings, advisor_settings, advisor_targets
from codl.config import build_plan, schema
from codl.paths import ResultPaths
from test_model import CORES, planted_tables


def test_schema_defaults_are_the_settings_defaults() -> None:
    props = schema()["properties"]["advisor"]["properties"]
    defaults = AdvisorSettings()
    assert set(props) == {f.name for f in dataclasses.fields(AdvisorSettings)}
    for name, prop in props.items():
        assert prop["default"] == getattr(defaults, name), name
    assert advisor_settings({}) == defaults


def test_targets_follow_the_section(tmp_path: Path) -> None:
    paths = ResultPaths(root=tmp_path)
    assert advisor_targets({}, paths) == []
    on = advisor_targets({"advisor": {"map": True, "advise": True}}, paths)
    assert str(paths.map_table) in on and str(paths.verify_config) in on
    assert str(paths.predicted_vs_measured_table) not in on
    check = advisor_targets({"advisor": {"predictions": "p.csv"}}, paths)
    assert check[0] == str(paths.predicted_vs_measured_table) and len(check) == 3


@pytest.fixture(scope="module")
def planted() -> tuple[mdl.Fit, adv.Advice, pd.DataFrame]:
    runs, steps = planted_tables(repeats=2, steps=60)
    fit = mdl.fit(mdl.run_data(runs, steps), cores=CORES, boot=20, seed=1)
    return fit, adv.advise(fit, cores=CORES), runs


def test_predictions_cover_every_verification_setting(
    planted: tuple[mdl.Fit, adv.Advice, pd.DataFrame],
) -> None:
    fit, advice, _ = planted
    cfg = adv.verification_config(
        advice, fit, defaults={"device": "cuda", "workload": {"model": "resnet50"}}
    )
    plan = build_plan(cfg)
    table = loop.verification_predictions(fit, advice, plan)
    combined = {
        (s.pinning.policy.value, s.loader.workers)
        for s in plan.specs.values()
        if s.mode.value == "data+compute"
    }
    assert set(zip(table["policy"], table["workers"], strict=True)) == combined
    assert table["advised"].sum() == 1
    row = table[table["advised"]].iloc[0]
    assert (row["policy"], row["workers"]) == (advice.policy, advice.workers)
    assert row["throughput"] == pytest.approx(advice.throughput)


def test_predicted_vs_measured_gives_the_planted_errors(
    planted: tuple[mdl.Fit, adv.Advice, pd.DataFrame],
) -> None:
    fit = planted[0]
    settings = pd.DataFrame({"policy": ["none", "none", "isolated"], "workers": [4, 8, 8]})
    pred = mdl.predict(fit, settings)
    pred["launch_cores"] = ["-", "-", "auto"]
    pred["advised"] = [False, True, False]
    # Measured: 10 % below the prediction for the first, exact for the advised, two runs each.
    factor = np.array([1 / 1.1, 1.0, 1.0])
    runs = pd.DataFrame(
        {
            "mode": "data+compute",
            "policy": np.repeat(pred["policy"], 2),
            "workers": np.repeat(pred["workers"], 2),
            # policy none stores launch_cores 1 in its normalized spec: still the same setting
            "launch_cores": np.repeat(["1", "1", "auto"], 2),
            "world_size": 1,
            "throughput_samples_s": np.repeat(pred["throughput"] * factor, 2),
        }
    )
    runs = runs[~(runs["policy"] == "isolated")]  # one setting not run
    out = loop.predicted_vs_measured(pred, runs)
    assert out["error"].iloc[0] == pytest.approx(0.1)
    assert out["error"].iloc[1] == pytest.approx(0.0)
    assert out["n_runs"].tolist() == [2, 2, 0] and np.isnan(out["measured"].iloc[2])
    summary = loop.prediction_summary(out)
    assert summary["settings"] == 2
    assert summary["median_abs_error"] == pytest.approx(0.05)
    assert summary["worst_abs_error"] == pytest.approx(0.1)
    expected = (
        pred["throughput"].iloc[1]
        / max(pred["throughput"].iloc[0] / 1.1, pred["throughput"].iloc[1])
    ) - 1
    assert summary["advised_vs_best"] == pytest.approx(expected)


def test_the_verification_reruns_the_best_measured_setting_beside_the_advice() -> None:
    runs, steps = planted_tables(repeats=2, steps=40)
    data = mdl.run_data(runs, steps)
    fit = mdl.fit(data, cores=CORES, boot=4, seed=1)
    advice = adv.advise(fit, cores=CORES)
    combined = runs[runs["mode"] == "data+compute"]
    top = combined.groupby(["policy", "workers"])["throughput_samples_s"].mean().idxmax()
    best = adv.best_measured(data)
    assert (best.policy, best.workers) == top and best.runs == 2
    assert best.launch_cores is None  # the planted runs' launch_cores are `auto`
    cfg = adv.verification_config(advice, fit, defaults={"seed": 3}, best=best)
    assert cfg["defaults"]["seed"] == 3 + adv.VERIFY_SEED_OFFSET
    names = [e["name"] for e in cfg["experiments"]]
    near = best.policy == advice.policy and abs(best.workers - advice.workers) <= 2
    assert ("best" in names) == (not near)
    if not near:
        exp = cfg["experiments"][names.index("best")]
        assert exp["base"]["loader"]["workers"] == best.workers
        assert exp["base"]["pinning"]["policy"] == best.policy
    # The advice's own setting as the best: no extra experiment.
    same = dataclasses.replace(best, policy=advice.policy, workers=advice.workers)
    same = dataclasses.replace(same, launch_cores=advice.launch_cores)
    cfg = adv.verification_config(advice, fit, defaults={}, best=same)
    assert "best" not in [e["name"] for e in cfg["experiments"]]
