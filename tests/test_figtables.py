"""Figures from tables: summarize writes each run's figure tables, the figures are drawn from
tables alone (the traces deleted first), every figure is one registered (prepare, draw) pair,
and the step timeline shows the same bars as the run's trace gives directly."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from codl.analysis.summarize import spec_columns
from codl.config import build_plan, load_plan
from codl.figures import RUN_FIGURES, FigureName, plan_figures, run_tables
from codl.figures import data as figdata
from codl.figures.registry import FIGURES, FigureInputs, draw_figure, drawn_figures
from codl.figures.run_tables import TIMELINE_KEYS, timeline_title
from codl.paths import FIGURE_FORMATS, RunFiles
from codl.steps.analysis import compare_to, figures_to, summarize_to
from codl.trace.schema import Table
from codl.trace.store import open_trace

TRACES = Path(__file__).resolve().parent / "golden" / "traces"
REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "config" / "smoke.yaml"
API = FigureName.API_LATENCY_CDF


def _unpack(packed: Path, to: Path) -> Path:
    to.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(packed, "rb") as src, to.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return to


def test_every_figure_is_registered_once() -> None:
    # The advisor's figures too: the registry is the one way any figure is drawn.
    assert sorted(f.name for f in FIGURES) == sorted(FigureName)
    assert set(RUN_FIGURES) < set(FigureName)


def test_figures_come_from_tables_alone(tmp_path: Path) -> None:
    runs = sorted(TRACES.glob("*.h5.gz"))
    files = [RunFiles(tmp_path / "runs" / p.name.removesuffix(".h5.gz")) for p in runs]
    for packed, f in zip(runs, files, strict=True):
        summarize_to(_unpack(packed, f.trace), **f.tables())
        f.trace.unlink()  # from here on nothing can read a trace
    tables = tmp_path / "tables"
    merged = {
        "runs_table": tables / "runs.csv",
        "steps_table": tables / "steps.csv",
        "comparison_table": tables / "comparison.csv",
        "decomposition_table": tables / "decomposition.csv",
    }
    compare_to(
        summaries=[f.summary for f in files],
        steps=[f.steps for f in files],
        attributions=[f.attribution for f in files],
        parts=[f.parts for f in files],
        attribution_table=tables / "attribution.csv",
        **merged,
    )
    figdir = tmp_path / "figures"
    figures_to(
        **merged,
        api_calls=[f.api_calls for f in files],
        timelines=[f.timeline for f in files],
        figdir=figdir,
    )
    # CPU runs: none records CUDA API calls, and no API-latency figure is drawn, not even one
    # that says so; every other run figure is.
    want = drawn_figures(pd.read_csv(merged["runs_table"]))
    assert want == [n for n in RUN_FIGURES if n != API]
    assert sorted(p.name for p in figdir.iterdir()) == sorted(
        f"{name}.{fmt}" for name in want for fmt in FIGURE_FORMATS
    )
    for name in want:
        for fmt in FIGURE_FORMATS:
            assert (figdir / f"{name}.{fmt}").stat().st_size > 1000, name

    # The timeline drawn is, of the chosen run's steps in which a loader worker ran, the one
    # closest to its median step time, bar for bar as its trace gives it.
    summary = pd.read_csv(merged["runs_table"])
    chosen = figdata.timeline_run(summary)
    assert chosen
    inputs = FigureInputs(
        runs=summary,
        steps=pd.DataFrame(),
        comparison=pd.DataFrame(),
        decomposition=pd.DataFrame(),
        timelines=pd.concat([pd.read_parquet(f.timeline) for f in files], ignore_index=True),
    )
    shown = next(f for f in FIGURES if f.name == "step_timeline").prepare(inputs)
    assert set(shown["run_id"]) == {chosen}
    by_id = {
        str(pd.read_parquet(f.summary)["run_id"].iloc[0]): p
        for p, f in zip(runs, files, strict=True)
    }
    packed = by_id[chosen]
    with open_trace(_unpack(packed, tmp_path / "again.h5")) as t:
        names = (Table.APP, Table.LOADER, Table.COMM, Table.CUDA, Table.SCHED, Table.THREADS)
        raw = {n: t.table(n) for n in names}
        warm = int(t.attrs["warmup_steps"])
    app = raw[Table.APP]
    st = app[(app["phase"].astype(str) == "step") & (app["step"] >= warm) & (app["rank"] == 0)]
    dur = (st["end_ns"] - st["start_ns"]).to_numpy()
    ld = raw[Table.LOADER]
    ld = ld[ld["rank"] == 0]
    loaded = [
        ((ld["end_ns"] > a) & (ld["start_ns"] < b)).any()
        for a, b in zip(st["start_ns"], st["end_ns"], strict=True)
    ]
    off = np.where(loaded, np.abs(dur - np.median(dur)), np.inf)
    step = int(st["step"].to_numpy()[np.argmin(off)])
    want = figdata.timeline_bars(raw, step=step)
    got = shown[figdata.TIMELINE_COLUMNS]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert (shown["role"] == "loader").any()
    assert set(TIMELINE_KEYS) <= set(shown)
    title = timeline_title(shown)
    assert f"Run {chosen} " in title and f"step {step} of {len(st)} measured" in title
    assert "in which a loader worker ran" in title or f"step {step} " in title


def test_the_step_timeline_shows_a_step_in_which_the_loader_worked(tmp_path: Path) -> None:
    # r1_combined's one worker made the run's few batches ahead of time: nothing of the
    # loader ran in its median step (the timeline had no loader row, as in the demo), while
    # earlier measured steps have the worker's rows.
    f = RunFiles(tmp_path / "run")
    trace = _unpack(TRACES / "r1_combined.h5.gz", f.trace)
    with open_trace(trace) as t:
        warm, ld = int(t.attrs["warmup_steps"]), t.table(Table.LOADER)
        app = t.table(Table.APP)
    st = app[(app["phase"].astype(str) == "step") & (app["step"] >= warm) & (app["rank"] == 0)]
    dur = (st["end_ns"] - st["start_ns"]).to_numpy()
    median = st.iloc[int(np.argmin(np.abs(dur - np.median(dur))))]
    assert not ((ld["end_ns"] > median["start_ns"]) & (ld["start_ns"] < median["end_ns"])).any()
    summarize_to(trace, **f.tables())
    shown = pd.read_parquet(f.timeline)
    assert set(shown["pick"]) == {run_tables.WITH_LOADER}
    assert int(shown["step"].iloc[0]) != int(median["step"])
    workers = shown.loc[shown["role"] == "loader", "track"]
    assert workers.str.startswith("loader worker").any()
    assert "of the steps in which a loader worker ran" in timeline_title(shown)


def _cuda_config(level: str) -> dict[str, Any]:
    """The smoke config on CUDA, its isolation-vs-combined runs with trace level ``level``."""
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["defaults"]["device"] = "cuda"
    experiment = cfg["experiments"][0]
    experiment["factors"] = {"mode": ["compute", "combined"], "pinning.policy": ["none"]}
    experiment["base"] = {"trace": {level: True}}
    cfg["experiments"] = [experiment]
    return cfg


def _runs_table(specs: Any) -> pd.DataFrame:
    """The spec columns of a runs table, as summarize writes them from each run's spec."""
    return pd.DataFrame([spec_columns(s.to_dict()) for s in specs])


def test_a_plan_has_the_api_latency_figure_only_with_a_run_that_records_calls() -> None:
    cpu = list(load_plan(SMOKE).specs.values())
    assert not any(s.trace.cuda_api or s.trace.cupti for s in cpu)
    assert plan_figures(cpu) == [n for n in RUN_FIGURES if n != API]
    # The figures rule draws what the plan declared: the runs table tells the same.
    assert drawn_figures(_runs_table(cpu)) == plan_figures(cpu)
    for level in ("cuda_api", "cupti"):
        specs = list(build_plan(_cuda_config(level)).specs.values())
        assert plan_figures(specs) == list(RUN_FIGURES), level
        assert drawn_figures(_runs_table(specs)) == plan_figures(specs), level
        # One traced run among plain ones is enough.
        plain = list(build_plan(yaml.safe_load(SMOKE.read_text())).specs.values())
        assert API in plan_figures([*plain, specs[0]])


def test_the_api_latency_figure_is_drawn_only_for_runs_that_record_calls(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    calls = pd.DataFrame(
        {"label": "combined / none / callbacks", "run_id": "r", "us": rng.lognormal(1.5, 0.3, 50)}
    )
    outputs = [tmp_path / f"api.{fmt}" for fmt in FIGURE_FORMATS]
    cpu = pd.DataFrame({"run_id": ["r"], "cuda_api": [False], "cupti": [False]})
    draw_figure(API, FigureInputs(runs=cpu, api_calls=calls), outputs)
    assert not any(p.exists() for p in outputs)
    traced = cpu.assign(cuda_api=True)
    draw_figure(API, FigureInputs(runs=traced, api_calls=calls), outputs)
    assert all(p.stat().st_size > 1000 for p in outputs)


def _figures_rule_outputs(config: Path, workdir: Path) -> list[str]:
    """The file names of the `figures` rule's outputs in a dry run of ``config``."""
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "snakemake"),
            "--dry-run",
            "--cores",
            "1",
            "--configfile",
            str(config),
            "--directory",
            str(workdir),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    rule = re.search(r"^rule figures:\n(?:.*\n)*?\s+output: (.*)$", out, re.MULTILINE)
    assert rule, out[-3000:]
    return sorted(Path(p.strip()).name for p in rule.group(1).split(","))


@pytest.mark.parametrize("level", ["", "cuda_api"])
def test_the_figures_rule_declares_the_plans_figures(level: str, tmp_path: Path) -> None:
    config = SMOKE
    if level:
        config = tmp_path / "cuda.yaml"
        config.write_text(yaml.safe_dump(_cuda_config(level)))
    specs = load_plan(config).specs.values()
    names = _figures_rule_outputs(config, tmp_path / "work")
    assert names == sorted(f"{n}.{fmt}" for n in plan_figures(specs) for fmt in FIGURE_FORMATS)
    assert (f"{API}.png" in names) == bool(level)
