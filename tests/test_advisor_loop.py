"""The advisor's closed loop on CPU, end to end with real runs (config/loop-cpu.yaml):
runs -> fit -> advice -> verification runs -> predicted vs measured, and the map on the way."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import pandas as pd
import pytest

from codl import cli
from codl.advisor import model as mdl
from codl.advisor import verify
from codl.config import Plan, build_plan, load_yaml
from codl.datasets import generate
from codl.figures import FigureName
from codl.harness.launch import launch
from codl.paths import ResultPaths
from codl.steps import advisor as advisor_steps
from codl.steps.analysis import compare_to, summarize_to
from codl.steps.workflow import advisor_targets

CONFIG = Path(__file__).resolve().parents[1] / "config" / "loop-cpu.yaml"


def run_plan(plan: Plan, paths: ResultPaths) -> None:
    """What the workflow's dataset, run, summarize and compare rules do, in this process."""
    for (name, _tier), dataset in plan.datasets().items():
        if not paths.dataset_manifest(name).exists():
            generate(dataset, paths.dataset_dir(name))
    kinds = ("summary", "steps", "attribution", "parts")
    for run_id, spec in plan.specs.items():
        if not paths.trace(run_id).exists():  # a verification run the first plan had
            launch(
                spec,
                trace_path=paths.trace(run_id),
                dataset_dir=paths.dataset_dir(spec.dataset.name),
            )
            summarize_to(paths.trace(run_id), **{k: getattr(paths, k)(run_id) for k in kinds})
    ids = list(plan.specs)
    compare_to(
        summaries=[paths.summary(r) for r in ids],
        steps=[paths.steps(r) for r in ids],
        attributions=[paths.attribution(r) for r in ids],
        parts=[paths.parts(r) for r in ids],
        runs_table=paths.runs_table,
        steps_table=paths.steps_table,
        comparison_table=paths.comparison_table,
        attribution_table=paths.attribution_table,
        decomposition_table=paths.decomposition_table,
    )


# Data runs of one worker count further apart than this were slowed by the machine, not by
# their setting: on a quiet machine the two policies' runs lie within 1.6x of each other.
NOISE_FACTOR = 2.0


def skip_if_the_loader_did_not_scale(paths: ResultPaths, exc: mdl.ModelError) -> NoReturn:
    """The model refuses data runs that do not tell rate and per-core efficiency apart. On a
    2-core VM shared with other jobs, 4 workers can deliver no more than 1 (the machine gives
    the test's process group its share whatever the worker count), or one run is slowed by a
    factor (CI, 2026-12-04: 1 worker at 96 and 301 samples/s, so that 4 workers' 668-700 looked
    like linear scaling): skip with the numbers then, and only then; any other refusal fails."""
    runs = pd.read_csv(paths.runs_table)
    data = runs[runs["mode"] == "data"].groupby("workers")["throughput_samples_s"]
    mean = data.mean()
    flat = mean.loc[mean.index.max()] <= mean.loc[mean.index.min()] * 1.05
    noisy = bool((data.max() > data.min() * NOISE_FACTOR).any())
    if "cannot be told apart" in str(exc) and (flat or noisy):
        why = "did not scale" if flat else f"ran over {NOISE_FACTOR:g}x apart at one worker count"
        pytest.skip(
            f"the loader {why} on this machine (samples/s by workers: {data.apply(list).to_dict()})"
        )
    raise exc


@pytest.mark.slow
def test_the_loop_closes_on_cpu(tmp_path: Path) -> None:
    paths = ResultPaths(root=tmp_path)
    cfg = load_yaml(CONFIG)
    plan = build_plan(cfg)
    run_plan(plan, paths)
    assert set(advisor_targets(cfg, paths)) >= {str(paths.verify_config), str(paths.map_table)}

    # The map of the fitting runs: every data+compute setting, with a regime.
    fig = paths.figure(FigureName.INTERFERENCE_MAP)
    table = advisor_steps.map_to(
        runs=paths.runs_table,
        steps=paths.steps_table,
        cfg=cfg,
        table=paths.map_table,
        figures=[fig],
    )
    assert len(table) == 4 and set(table["regime"]) <= {"data-bound", "balanced", "launch-bound"}
    assert table["inflation_mean"].notna().all() and fig.stat().st_size > 0

    try:
        advice = advisor_steps.advise_to(
            runs=paths.runs_table,
            steps=paths.steps_table,
            cfg=cfg,
            text=paths.advice_text,
            verify=paths.verify_config,
            predictions=paths.predictions_table,
            boot=50,
        )
    except mdl.ModelError as exc:
        skip_if_the_loader_did_not_scale(paths, exc)
    assert f"{advice.workers} workers" in paths.advice_text.read_text()
    # `codl advise` as a user types it on these results, what `make demo-advise` ends with: no
    # config.yaml beside the tables here, so the cores per rank come from runs.csv's `cpus`.
    assert cli.main(["advise", str(paths.results), "--boot", "0"]) == 0
    verify_cfg = load_yaml(paths.verify_config)
    assert verify_cfg["advisor"]["predictions"] == str(paths.predictions_table)
    # The predictions' hash is in the config the runs start from (docs/advisor.md).
    recorded = verify_cfg["advisor"]["predictions_sha256"]
    assert recorded == verify.file_sha256(paths.predictions_table)
    predictions = pd.read_csv(paths.predictions_table)
    assert predictions["advised"].sum() == 1

    # The verification runs (new measurements: none is a fitting run again), then predicted
    # vs measured.
    verify_plan = build_plan(verify_cfg)
    assert not set(verify_plan.specs) & set(plan.specs)
    run_plan(verify_plan, paths)
    out = paths.figure(FigureName.PREDICTED_VS_MEASURED)
    result = advisor_steps.predicted_vs_measured_to(
        predictions=paths.predictions_table,
        runs=paths.runs_table,
        table=paths.predicted_vs_measured_table,
        figures=[out],
        steps=paths.steps_table,
        planned_sha256=recorded,
        planned_at=verify_cfg["advisor"]["predicted_at"],
    )
    assert out.stat().st_size > 0
    assert set(result["order"]) == {verify.Order.PREDICTED_FIRST.value}
    # Every predicted setting was run by the verification config, the advice among them.
    assert (result["n_runs"] >= 1).all() and result["measured"].gt(0).all()
    advised = result[result["advised"]].iloc[0]
    assert advised["error"] == pytest.approx(advised["throughput"] / advised["measured"] - 1)
    summary = verify.prediction_summary(result)
    assert summary["settings"] == len(result) and summary["worst_abs_error"] >= 0
    # Intervals from the runs' steps: around each measured mean, and the advice's ratio to
    # every other setting (not to itself).
    assert (result["measured_lo"] <= result["measured"]).all()
    assert (result["measured"] <= result["measured_hi"]).all()
    assert result["advice_ratio"].isna().tolist() == result["advised"].tolist()
