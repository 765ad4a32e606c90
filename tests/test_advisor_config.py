"""The `advisor` config section and the analysis side of the closed loop on planted runs:
verification predictions, and predicted vs measured with known errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.advisor import advise as adv
from codl.advisor import model as mdl
from codl.advisor import verify
from codl.advisor.settings import AdvisorSettings, advisor_settings
from codl.config import build_plan, schema
from codl.paths import ResultPaths
from codl.steps.workflow import advisor_targets
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
    table = verify.verification_predictions(fit, advice, plan)
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
    out = verify.score_predictions(pred, runs)
    assert out["error"].iloc[0] == pytest.approx(0.1)
    assert out["error"].iloc[1] == pytest.approx(0.0)
    assert out["n_runs"].tolist() == [2, 2, 0] and np.isnan(out["measured"].iloc[2])
    summary = verify.prediction_summary(out)
    assert summary["settings"] == 2
    assert summary["median_abs_error"] == pytest.approx(0.05)
    assert summary["worst_abs_error"] == pytest.approx(0.1)
    expected = (
        pred["throughput"].iloc[1]
        / max(pred["throughput"].iloc[0] / 1.1, pred["throughput"].iloc[1])
    ) - 1
    assert summary["advised_vs_best"] == pytest.approx(expected)


def test_settings_at_two_core_budgets_are_matched_by_their_cpus(
    planted: tuple[mdl.Fit, adv.Advice, pd.DataFrame],
) -> None:
    fit = planted[0]
    pred = mdl.predict(
        fit, pd.DataFrame({"policy": ["none"] * 2, "workers": [8, 8], "cores": [8, 16]})
    )
    pred["launch_cores"] = "-"
    pred["advised"] = [False, True]
    runs = pd.DataFrame(
        {
            "mode": "data+compute",
            "policy": "none",
            "workers": 8,
            "launch_cores": "1",
            "world_size": 1,
            "cpus": [8, 16],
            "throughput_samples_s": [1000.0, 3000.0],
        }
    )
    out = verify.score_predictions(pred, runs)
    assert out["measured"].tolist() == [1000.0, 3000.0] and out["n_runs"].tolist() == [1, 1]
    # One budget in the table: the setting alone matches, as before the column.
    one = verify.score_predictions(pred.iloc[[1]], runs.iloc[[1]].assign(cpus=4))
    assert one["measured"].tolist() == [3000.0]


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


def test_the_advice_ratio_has_a_bootstrap_interval_around_the_planted_one() -> None:
    # Two settings, 3 runs of 200 steps each: the advised one's steps 40 ms, the other's 44 ms
    # (+-2 % noise per step, +-1 % per run): the advice is 1.10x the other's throughput.
    rng = np.random.default_rng(7)
    pred = pd.DataFrame(
        {
            "policy": ["none", "none"],
            "workers": [13, 5],
            "launch_cores": ["-", "-"],
            "throughput": [3000.0, 3000.0],
            "pred_lo": [2500.0, 2500.0],
            "pred_hi": [3500.0, 3500.0],
            "advised": [True, False],
        }
    )
    run_rows, step_rows = [], []
    by_workers: dict[int, list[np.ndarray]] = {13: [], 5: []}
    for workers, step_ms in ((13, 40.0), (5, 44.0)):
        for rep in range(3):
            rid = f"w{workers}r{rep}"
            steps = step_ms * rng.normal(1, 0.01) * rng.normal(1, 0.02, size=200)
            by_workers[workers].append(steps)
            step_rows.append(pd.DataFrame({"run_id": rid, "step_ms": steps}))
            run_rows.append(
                {
                    "run_id": rid,
                    "mode": "data+compute",
                    "policy": "none",
                    "workers": workers,
                    "launch_cores": "1",
                    "world_size": 1,
                    "batch_size": 128,
                    "throughput_samples_s": 128 * 1000 / steps.mean(),
                }
            )
    out = verify.score_predictions(
        pred, pd.DataFrame(run_rows), pd.concat(step_rows), boot=400, seed=1
    )
    mine, other = out.iloc[0], out.iloc[1]
    assert np.isnan(mine["advice_ratio"])  # the advice against itself is not a comparison
    # The point is the ratio of the mean step times over runs; the truth (1.10) within the
    # planted run-to-run noise.
    means = {w: np.mean([s.mean() for s in ss]) for w, ss in by_workers.items()}
    assert other["advice_ratio"] == pytest.approx(means[5] / means[13], rel=1e-9)
    assert other["advice_ratio"] == pytest.approx(1.10, rel=0.03)
    assert other["advice_ratio_lo"] < other["advice_ratio"] < other["advice_ratio_hi"]
    assert other["advice_ratio_hi"] - other["advice_ratio_lo"] < 0.08
    for _, r in out.iterrows():
        assert r["measured_lo"] < r["measured"] < r["measured_hi"]
        assert r["measured"] == pytest.approx((r["measured_lo"] + r["measured_hi"]) / 2, rel=0.03)
    summary = verify.prediction_summary(out)
    assert summary["advised_vs_best"] == 0.0
    assert summary["advised_vs_other"] == pytest.approx(other["advice_ratio"])
    assert summary["advised_vs_other_lo"] == pytest.approx(other["advice_ratio_lo"])


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("{cores: .nan}", "advisor.cores"),
        ("{cores: many}", "advisor.cores"),
        ("{repeats: .inf}", "advisor.repeats"),
        ("3", "advisor"),
    ],
)
def test_a_bad_advisor_value_is_one_line_naming_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, key: str
) -> None:
    # advisor_settings reads the section before the plan checks the config (common.smk and
    # `codl plan`): its own check, not an int() traceback.
    from codl.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(
        f"advisor: {section}\nexperiments: [{{name: e, factors: {{mode: [compute]}}}}]\n"
    )
    assert main(["plan", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"  - {key}: got " in err and "Traceback" not in err, err
