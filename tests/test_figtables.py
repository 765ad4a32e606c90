"""Figures from tables: summarize writes each run's figure tables, the figures are drawn from
tables alone (the traces deleted first), every figure is one registered (prepare, draw) pair,
and the step timeline shows the same bars as the run's trace gives directly."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from codl.figures import RUN_FIGURES, FigureName, run_tables
from codl.figures import data as figdata
from codl.figures.registry import FIGURES, FigureInputs
from codl.figures.run_tables import TIMELINE_KEYS, timeline_title
from codl.paths import FIGURE_FORMATS, RunFiles
from codl.steps.analysis import compare_to, figures_to, summarize_to
from codl.trace.schema import Table
from codl.trace.store import open_trace

TRACES = Path(__file__).resolve().parent / "golden" / "traces"


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
    for name in RUN_FIGURES:
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
